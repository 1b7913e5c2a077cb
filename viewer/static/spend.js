/* Tripwire viewer: an agent's gateway policy beside its Guards (SPEC §9): its tool permissions, its
   rate limits, and a bar per budget window (spent, reserved by calls in flight, limit, reset time),
   from GET /api/agents/{name}/spend; a window's Reset button posts /spend/reset.
   Uses app.js's `api`, `el` and `$`; app.js calls `showAgentPolicy(name)` when it opens an agent. */
'use strict';

const SPEND_REFRESH_MS = 5000;
let spendAgent = null;
let spendTimer = null;

function spendStyles() {
  if (document.getElementById('spend-styles')) return;
  const css = `
#agent-policy .policy-grid { display: grid; grid-template-columns: max-content 1fr; gap: 4px 14px; margin-bottom: 10px; }
#agent-policy .policy-grid dt { color: var(--muted, #64748b); }
#agent-policy .policy-grid dd { margin: 0; }
#agent-policy .window { margin: 8px 0 12px; }
#agent-policy .window-head { display: flex; gap: 10px; align-items: baseline; }
#agent-policy .window-bar { position: relative; height: 12px; border-radius: 6px; background: #f1f5f9; overflow: hidden; border: 1px solid #e2e8f0; margin: 4px 0; }
#agent-policy .window-bar .spent { position: absolute; left: 0; top: 0; bottom: 0; background: #6366f1; }
#agent-policy .window-bar .reserved { position: absolute; top: 0; bottom: 0; background: #c7d2fe; }
#agent-policy .window.exceeded .window-bar .spent { background: #dc2626; }
`;
  document.head.append(el('style', { id: 'spend-styles', text: css }));
}

function usd(n) { return '$' + Number(n || 0).toFixed(n >= 1 || n === 0 ? 2 : 4); }

function localTime(iso) {
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toLocaleString(undefined, { dateStyle: 'medium', timeStyle: 'short' });
}

function patternList(items) {
  return items && items.length ? items.join(', ') : '—';
}

function renderTools(tools) {
  const allow = tools.allow == null ? 'everything' : patternList(tools.allow);
  return el('dl', { class: 'policy-grid', id: 'agent-tools' },
    el('dt', { text: 'Tools allowed' }), el('dd', { class: 'mono', text: allow }),
    el('dt', { text: 'Ask a person' }), el('dd', { class: 'mono', text: patternList(tools.ask) }),
    el('dt', { text: 'Denied' }), el('dd', { class: 'mono', text: patternList(tools.deny) }));
}

function renderRates(limits) {
  if (!limits.length) return el('div', { class: 'muted small', id: 'agent-rates', text: 'No rate limits.' });
  return el('ul', { id: 'agent-rates' }, ...limits.map((r) =>
    el('li', { class: 'rate-limit', text: `${r.match}: at most ${r.max_calls} calls per ${r.per_s} s` })));
}

function windowShare(w, spent, reserved) {
  // the cost limit when there is one, else the token limit
  if (w.max_cost_usd != null) return [spent / w.max_cost_usd, reserved / w.max_cost_usd];
  return [w.tokens / w.max_tokens, w.reserved.tokens / w.max_tokens];
}

function renderWindow(w) {
  const [spentShare, reservedShare] = windowShare(w, w.spent_usd, w.reserved.usd);
  const pct = (x) => Math.max(0, Math.min(100, x * 100)).toFixed(1) + '%';
  const limits = [];
  if (w.max_cost_usd != null) limits.push(`${usd(w.spent_usd)} spent + ${usd(w.reserved.usd)} reserved of ${usd(w.max_cost_usd)}`);
  if (w.max_tokens != null) limits.push(`${w.tokens} + ${w.reserved.tokens} reserved of ${w.max_tokens} tokens`);
  const exceeded = spentShare + reservedShare >= 1;
  const bar = el('div', { class: 'window-bar', role: 'meter', 'aria-label': `${w.period} budget`,
    'aria-valuemin': '0', 'aria-valuemax': '100', 'aria-valuenow': (Math.min(1, spentShare) * 100).toFixed(1) },
    el('span', { class: 'spent', style: `width: ${pct(spentShare)}` }),
    el('span', { class: 'reserved', style: `left: ${pct(spentShare)}; width: ${pct(reservedShare)}` }));
  return el('div', { class: 'window' + (exceeded ? ' exceeded' : ''), 'data-period': w.period },
    el('div', { class: 'window-head' },
      el('strong', { text: w.period }),
      el('span', { class: 'muted small mono', text: w.key }),
      w.soft_alerted ? el('span', { class: 'pill', text: 'soft alert' }) : null,
      el('span', { class: 'spacer' }),
      el('button', { type: 'button', class: 'btn btn-small btn-quiet', 'data-reset': w.period,
        onclick: () => resetWindow(w.period) }, 'Reset')),
    bar,
    el('div', { class: 'small window-text', text: limits.join(' · ') + ` · resets ${localTime(w.resets_at)}`,
      title: w.resets_at }));
}

function renderPolicy(body) {
  const windows = body.windows.length
    ? body.windows.map(renderWindow)
    : [el('div', { class: 'muted small', text: 'No budgets over time.' })];
  return [
    el('h2', { class: 'section-title', text: 'Tool permissions' }), renderTools(body.tools),
    el('h2', { class: 'section-title', text: 'Rate limits' }), renderRates(body.rate_limits),
    el('h2', { class: 'section-title' }, 'Spend per window ', el('span', { class: 'muted small', text: `(${body.timezone})` })),
    el('div', { id: 'agent-windows' }, ...windows),
  ];
}

function policySection() {
  let section = $('agent-policy');
  if (!section) {
    section = el('section', { id: 'agent-policy', 'aria-label': 'Gateway policy and spend' });
    const guards = document.querySelector('#agent-detail .section-title');
    guards.before(section);
  }
  return section;
}

async function loadPolicy() {
  const name = spendAgent;
  if (name == null) return;
  const section = policySection();
  try {
    const body = await api(`/api/agents/${encodeURIComponent(name)}/spend`);
    if (name !== spendAgent) return;  // another agent was opened meanwhile
    section.replaceChildren(...renderPolicy(body));
  } catch (e) {
    section.replaceChildren(el('div', { class: 'error-box', text: 'Cannot load spend: ' + e.message }));
  }
}

async function resetWindow(period) {
  const name = spendAgent;
  try {
    await api(`/api/agents/${encodeURIComponent(name)}/spend/reset`, { method: 'POST', json: { period } });
  } catch (e) {
    policySection().prepend(el('div', { class: 'error-box', text: 'Not reset: ' + e.message }));
    return;
  }
  await loadPolicy();
}

/* Called by app.js's openAgent; the project default has no spend of its own. */
function showAgentPolicy(name) {
  spendStyles();
  clearInterval(spendTimer);
  spendTimer = null;
  const project = typeof PROJECT !== 'undefined' && name === PROJECT;
  spendAgent = project ? null : name;
  const section = $('agent-policy');
  if (project) {
    if (section) section.replaceChildren();
    return;
  }
  loadPolicy();
  spendTimer = setInterval(() => {
    if (!$('agent-detail').hidden && !$('view-agents').hidden) loadPolicy();
  }, SPEND_REFRESH_MS);
}

// an agent opened from the URL while app.js loaded, before this script: show its policy now
if (typeof agentName !== 'undefined' && agentName != null) showAgentPolicy(agentName);
