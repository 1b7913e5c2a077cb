/* Tripwire viewer: run list, run timeline (paged), guard replay, agents and their Guards. Plain JS, no build. */
'use strict';

const $ = (id) => document.getElementById(id);
const PAGE_SIZE = 200;
const TOKEN_KEY = 'tripwire_admin_token';

/* ---------- URL state ---------- */

function pollSeconds(name, dflt) {
  const v = parseInt(new URL(location.href).searchParams.get(name) || '', 10);
  return Number.isNaN(v) ? dflt : Math.max(1, Math.min(60, v));
}
const POLL_RUNS_MS = pollSeconds('poll_runs', 3) * 1000;
const POLL_EVENTS_MS = pollSeconds('poll_events', 2) * 1000;

function param(name) { return new URL(location.href).searchParams.get(name); }
function setParams(updates, push) {
  const url = new URL(location.href);
  for (const [k, v] of Object.entries(updates)) {
    if (v == null || v === '') url.searchParams.delete(k); else url.searchParams.set(k, v);
  }
  history[push ? 'pushState' : 'replaceState'](null, '', url.toString());
}

/* ---------- API with the admin token ---------- */

let tokenPrompt = null;

function askToken() {
  if (tokenPrompt) return tokenPrompt;
  tokenPrompt = new Promise((resolve) => {
    const dlg = $('token-dialog');
    const input = $('token-input');
    input.value = '';
    dlg.addEventListener('close', () => {
      const t = input.value.trim();
      if (t) sessionStorage.setItem(TOKEN_KEY, t);
      tokenPrompt = null;
      resolve(!!t);
    }, { once: true });
    dlg.showModal();
    input.focus();
  });
  return tokenPrompt;
}

class ApiError extends Error {
  constructor(status, body) {
    super(typeof body?.message === 'string' ? body.message
      : typeof body?.detail === 'string' ? body.detail : `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

async function api(path, opts = {}) {
  for (let attempt = 0; attempt < 3; attempt++) {
    const headers = Object.assign({}, opts.headers || {});
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = 'Bearer ' + token;
    if (opts.json !== undefined) headers['Content-Type'] = 'application/json';
    const r = await fetch(path, {
      method: opts.method || 'GET',
      headers,
      body: opts.json !== undefined ? JSON.stringify(opts.json) : undefined,
    });
    if (r.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      if (await askToken()) continue;
    }
    if (r.status === 204) return null;
    let body = null;
    try { body = await r.json(); } catch (_) { /* not JSON */ }
    if (!r.ok) throw new ApiError(r.status, body);
    return body;
  }
  throw new ApiError(401, { detail: 'admin token required' });
}

/* ---------- formatting ---------- */

function el(tag, attrs, ...children) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === 'class') n.className = v;
    else if (k === 'text') n.textContent = v;
    else if (k.startsWith('on')) n.addEventListener(k.slice(2), v);
    else n.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c == null || c === false) continue;
    n.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return n;
}

function fmtCost(v) {
  const n = Number(v) || 0;
  if (n === 0) return '$0';
  if (n < 0.0001) return '$' + n.toFixed(6);
  if (n < 0.01) return '$' + n.toFixed(4);
  return '$' + n.toFixed(2);
}
function fmtInt(v) { return (Number(v) || 0).toLocaleString('en-US'); }
function fmtMs(ms) {
  if (ms == null) return '';
  if (ms < 1000) return ms + ' ms';
  if (ms < 60000) return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + ' s';
  if (ms < 3600000) return Math.floor(ms / 60000) + ' min ' + Math.round((ms % 60000) / 1000) + ' s';
  const h = Math.floor(ms / 3600000);
  return h.toLocaleString('en-US') + ' h ' + Math.floor((ms % 3600000) / 60000) + ' min';
}
function fmtTime(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  return d.toLocaleString([], { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit', second: '2-digit' });
}
function fmtClock(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso || '';
  return d.toLocaleTimeString([], { hour12: false }) + '.' + String(d.getMilliseconds()).padStart(3, '0');
}
function preview(v, max = 140) {
  let s = typeof v === 'string' ? v : JSON.stringify(v);
  if (s == null) return '';
  s = s.replace(/\s+/g, ' ');
  return s.length > max ? s.slice(0, max - 1) + '…' : s;
}
function tagChips(tags) {
  return (tags || []).map((t) => el('span', { class: 'tag tag-' + t, text: t }));
}

function sparkline(points, w = 120, h = 26) {
  const svgNS = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(svgNS, 'svg');
  svg.setAttribute('class', 'spark');
  svg.setAttribute('width', w);
  svg.setAttribute('height', h);
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  if (!points || points.length === 0) return svg;
  const ts = points.map((p) => Date.parse(p.ts) || 0);
  const t0 = Math.min(...ts), t1 = Math.max(...ts);
  const maxC = Math.max(...points.map((p) => p.cost_usd)) || 1;
  const xy = points.map((p, i) => {
    const x = t1 > t0 ? ((ts[i] - t0) / (t1 - t0)) * (w - 2) + 1 : (points.length > 1 ? (i / (points.length - 1)) * (w - 2) + 1 : w - 1);
    const y = h - 2 - (p.cost_usd / maxC) * (h - 4);
    return [x.toFixed(1), y.toFixed(1)];
  });
  if (xy.length === 1) xy.unshift(['1', String(h - 2)]);
  const area = document.createElementNS(svgNS, 'path');
  area.setAttribute('d', `M${xy[0][0]},${h - 1} ` + xy.map(([x, y]) => `L${x},${y}`).join(' ') + ` L${xy[xy.length - 1][0]},${h - 1} Z`);
  area.setAttribute('class', 'spark-area');
  const line = document.createElementNS(svgNS, 'polyline');
  line.setAttribute('points', xy.map((p) => p.join(',')).join(' '));
  line.setAttribute('class', 'spark-line');
  svg.append(area, line);
  const title = document.createElementNS(svgNS, 'title');
  title.textContent = 'Cost over time: ' + fmtCost(points[points.length - 1].cost_usd);
  svg.append(title);
  return svg;
}

/* ---------- polling (paused while the tab is hidden) ---------- */

const pollers = [];
function poller(fn, ms) {
  const p = { fn, ms, timer: null, active: false };
  p.tick = async () => {
    p.timer = null;
    if (!p.active || document.hidden) return;
    try { await p.fn(); } catch (e) { console.warn(e); }
    if (p.active && !document.hidden && p.timer == null) p.timer = setTimeout(p.tick, p.ms);
  };
  p.start = (now = true) => {
    p.active = true;
    if (p.timer) clearTimeout(p.timer);
    p.timer = now ? setTimeout(p.tick, 0) : setTimeout(p.tick, p.ms);
  };
  p.stop = () => { p.active = false; if (p.timer) clearTimeout(p.timer); p.timer = null; };
  pollers.push(p);
  return p;
}
document.addEventListener('visibilitychange', () => {
  for (const p of pollers) {
    if (!p.active) continue;
    if (document.hidden) { if (p.timer) clearTimeout(p.timer); p.timer = null; }
    else if (p.timer == null) p.timer = setTimeout(p.tick, 0);
  }
  renderPollState();
});
function renderPollState() {
  const s = $('poll-state');
  const live = pollers.some((p) => p.active);
  s.textContent = document.hidden ? 'paused' : live ? 'live' : '';
  s.className = 'poll-state' + (live && !document.hidden ? ' on' : '');
}

/* ---------- runs view ---------- */

const state = {
  runs: [],
  runId: null,
  run: null,
  offset: 0,
  total: 0,
  events: [],
  follow: false,
  expanded: new Set(),
  sparks: new Map(), // run_id -> {key, points}
  agentNames: new Set(),
  replay: null, // the open run's last guard replay (POST /api/runs/{id}/replay answer)
  replayBase: null, // the config the edited-config form was filled from
};

function runFilters() {
  return {
    agent: $('filter-agent').value,
    status: $('filter-status').value,
    tag: $('filter-tag').value,
  };
}

async function loadRuns() {
  const f = runFilters();
  const qs = new URLSearchParams({ limit: '100' });
  for (const [k, v] of Object.entries(f)) if (v) qs.set(k, v);
  try {
    const body = await api('/api/runs?' + qs);
    $('run-list-error').hidden = true;
    state.runs = body.runs || [];
    $('run-count').textContent = body.total > state.runs.length
      ? `${state.runs.length} of ${fmtInt(body.total)} runs` : `${fmtInt(state.runs.length)} runs`;
    renderRunList();
    syncOpenRun();
    updateSparks();
  } catch (e) {
    $('run-list-error').textContent = 'Cannot load runs: ' + e.message;
    $('run-list-error').hidden = false;
  }
}

/* The list poll also catches changes to the open run that its own poll missed: tags or cost written
   just after it ended (tripwire.json lands after run.json), or a finished run that was resumed. */
function syncOpenRun() {
  if (!state.runId || !state.run) return;
  const fresh = state.runs.find((r) => r.run_id === state.runId);
  if (!fresh || JSON.stringify(fresh) === JSON.stringify(state.run)) return;
  const moved = fresh.last_event_ts !== state.run.last_event_ts;
  state.run = fresh;
  renderRunHead();
  if (fresh.status === 'running' && !eventsPoller.active) { eventsPoller.start(); renderPollState(); }
  else if (moved) loadEvents().catch(() => {});
}

function runItem(run) {
  const tw = run.tripwire || {};
  const running = run.status === 'running';
  const c = run.counts || {};
  const li = el('li', {
    class: 'run-item' + (run.run_id === state.runId ? ' selected' : ''),
    'data-run-id': run.run_id,
    'data-status': run.status,
    tabindex: '0',
    onclick: () => openRun(run.run_id, true),
    onkeydown: (e) => { if (e.key === 'Enter') openRun(run.run_id, true); },
  },
  el('div', { class: 'run-line1' },
    el('span', { class: 'status-dot ' + (running ? 'running' : run.status), title: run.status }),
    el('span', { class: 'run-item-name', text: run.run_name || run.run_id.slice(0, 8), title: run.run_name || run.run_id }),
    el('span', { class: 'run-item-cost', text: fmtCost(tw.cost_usd) })),
  el('div', { class: 'run-line2 muted small' },
    el('span', { text: tw.agent_name || '—' }),
    el('span', { text: fmtTime(run.started_at) }),
    el('span', { text: fmtInt(tw.total_tokens) + ' tok' })),
  el('div', { class: 'run-line3' },
    el('span', { class: 'counts small muted' },
      `${c.llm_calls || 0} LLM · ${c.tool_calls || 0} tools`,
      c.errors ? el('span', { class: 'count-err', text: ` · ${c.errors} err` }) : null,
      c.loop_warnings ? el('span', { class: 'count-warn', text: ` · ${c.loop_warnings} loop` }) : null),
    el('span', { class: 'spark-slot', 'data-spark': run.run_id })),
  (tw.health_tags || []).length ? el('div', { class: 'tags' }, tagChips(tw.health_tags)) : null);
  const cached = state.sparks.get(run.run_id);
  if (cached) li.querySelector('.spark-slot').append(sparkline(cached.points));
  return li;
}

function renderRunList() {
  const list = $('run-list');
  list.replaceChildren(...state.runs.map(runItem));
  if (state.runs.length === 0) list.append(el('li', { class: 'empty small', text: 'No runs yet.' }));
  // agent names seen so far (kept while a filter narrows the list)
  const before = state.agentNames.size;
  for (const r of state.runs) if ((r.tripwire || {}).agent_name) state.agentNames.add(r.tripwire.agent_name);
  if (state.agentNames.size !== before) {
    const sel = $('filter-agent');
    const cur = sel.value;
    sel.replaceChildren(el('option', { value: '', text: 'All agents' }),
      ...[...state.agentNames].sort().map((n) => el('option', { value: n, text: n, selected: n === cur })));
  }
}

async function updateSparks() {
  // only runs whose events changed since the last fetch; the list shows at most 100
  for (const run of state.runs) {
    const key = (run.last_event_ts || '') + run.status + ((run.counts || {}).llm_calls || 0);
    const cached = state.sparks.get(run.run_id);
    if (cached && cached.key === key) continue;
    try {
      const body = await api(`/api/runs/${run.run_id}/cost-series`);
      state.sparks.set(run.run_id, { key, points: body.points });
      const slot = document.querySelector(`[data-spark="${run.run_id}"]`);
      if (slot) slot.replaceChildren(sparkline(body.points));
      // the open run's header drew its sparkline before the points came (a finished run is not re-polled)
      const head = run.run_id === state.runId && document.querySelector('#run-kpis .kpi-spark svg');
      if (head) head.replaceWith(sparkline(body.points, 160, 30));
    } catch (_) { /* deleted meanwhile */ }
  }
}

function kpi(label, value, cls) {
  return el('div', { class: 'kpi' + (cls ? ' ' + cls : '') }, el('div', { class: 'kpi-label', text: label }), el('div', { class: 'kpi-value', text: value }));
}

function renderRunHead() {
  const run = state.run;
  const tw = run.tripwire || {};
  const c = run.counts || {};
  const running = run.status === 'running';
  $('run-name').replaceChildren(
    el('span', { class: 'status-dot ' + (running ? 'running' : run.status) }),
    ' ', run.run_name || run.run_id);
  $('run-id').textContent = run.run_id + (tw.session_id ? '  ·  session ' + tw.session_id : '');
  const dur = run.duration_ms != null ? run.duration_ms : (Date.now() - Date.parse(run.started_at));
  $('run-kpis').replaceChildren(...[
    kpi('Status', run.status, 'status-' + run.status),
    kpi('Agent', tw.agent_name || '—'),
    kpi('Cost', fmtCost(tw.cost_usd)),
    kpi('Tokens', fmtInt(tw.total_tokens)),
    kpi('LLM calls', fmtInt(c.llm_calls)),
    kpi('Tool calls', fmtInt(c.tool_calls)),
    kpi('Errors', fmtInt(c.errors), c.errors ? 'bad' : ''),
    kpi('Loop warnings', fmtInt(c.loop_warnings), c.loop_warnings ? 'warn' : ''),
    kpi('Duration', fmtMs(dur)),
    tw.guard_config_source ? kpi('Guards', tw.guard_config_source === 'agent' ? 'agent override' : 'project default') : null,
    el('div', { class: 'kpi kpi-spark' }, el('div', { class: 'kpi-label', text: 'Cost over time' }),
      sparkline((state.sparks.get(run.run_id) || {}).points, 160, 30)),
  ].filter(Boolean));
  $('run-tags').replaceChildren(...tagChips(tw.health_tags));
  $('btn-terminate').hidden = !running;
  const reason = tw.end_reason || tw.reason;
  $('run-callouts').replaceChildren(
    reason && !running ? el('div', { class: 'callout muted small', text: 'Ended: ' + reason }) : '');
  if (typeof renderResume === 'function') renderResume(run); // resume.js
}

/* What repeated and why it counts as no progress: Tripwire's guards write it as the payload's
   message; a run AgentDbg wrote has only the pattern and its counts. */
function loopSentence(p) {
  if (p.message) return p.message;
  return `the pattern repeated ${p.repetitions} times within the last ${p.window_size} events`;
}

function eventSummary(ev) {
  const p = ev.payload || {};
  switch (ev.event_type) {
    case 'LLM_CALL': {
      const u = p.usage || {};
      return el('div', { class: 'ev-sum' },
        el('span', { class: 'chip', text: p.model || ev.name }),
        el('span', { text: `${fmtInt(u.prompt_tokens)} in / ${fmtInt(u.completion_tokens)} out` }),
        el('span', { text: fmtCost(p.cost_usd) }),
        ev.duration_ms != null ? el('span', { text: fmtMs(ev.duration_ms) }) : null,
        p.stream ? el('span', { class: 'chip chip-quiet', text: 'stream' }) : null,
        p.status === 'error' ? el('span', { class: 'chip chip-bad', text: 'error' }) : null,
        el('div', { class: 'ev-preview muted', text: preview((p.response || {}).text || (p.response || {}).tool_calls || '') }));
    }
    case 'TOOL_CALL':
      return el('div', { class: 'ev-sum' },
        el('span', { class: 'chip', text: p.tool_name || ev.name }),
        p.server ? el('span', { class: 'muted', text: (p.source || '') + ':' + p.server }) : null,
        ev.duration_ms != null ? el('span', { text: fmtMs(ev.duration_ms) }) : null,
        p.status && p.status !== 'ok' ? el('span', { class: 'chip chip-bad', text: p.status }) : null,
        el('div', { class: 'ev-preview' }, el('span', { class: 'muted', text: 'args ' }), preview(p.args)),
        el('div', { class: 'ev-preview' }, el('span', { class: 'muted', text: 'result ' }), preview(p.result)));
    case 'LOOP_WARNING':
      return el('div', { class: 'ev-sum' },
        el('strong', { text: 'Loop detected' }),
        p.kind ? el('span', { class: 'chip chip-warn', text: p.kind }) : null,
        p.action ? el('span', { class: 'muted', text: p.shadow ? `${p.action} (shadow)` : p.action }) : null,
        el('span', { class: 'muted', text: `×${p.repetitions} · window ${p.window_size}` }),
        el('div', { class: 'ev-sentence', text: loopSentence(p) }),
        el('div', { class: 'ev-preview mono muted', text: preview(p.pattern, 200) }));
    case 'ERROR':
      return el('div', { class: 'ev-sum' },
        el('strong', { text: p.guardrail ? 'Guard fired: ' + p.guardrail : (p.error_type || 'Error') }),
        p.guardrail && (p.threshold != null || p.actual != null) ? el('span', { class: 'gfacts' },
          el('span', {}, el('span', { class: 'muted', text: 'threshold ' }), preview(p.threshold, 40)),
          el('span', {}, el('span', { class: 'muted', text: 'actual ' }), preview(p.actual, 40))) : null,
        el('div', { class: 'ev-preview', text: p.message || '' }));
    case 'RUN_START':
      return el('div', { class: 'ev-sum' },
        p.agent_name ? el('span', {}, el('span', { class: 'muted', text: 'agent ' }), p.agent_name) : null,
        p.session_id ? el('span', {}, el('span', { class: 'muted', text: 'session ' }), p.session_id) : null,
        !p.agent_name && !p.session_id ? el('span', { class: 'ev-preview muted', text: preview(p) }) : null);
    case 'STATE_UPDATE':
      return el('div', { class: 'ev-sum' }, el('span', { class: 'ev-preview', text: preview(p.state || p.diff) }));
    case 'RUN_END':
      return el('div', { class: 'ev-sum' },
        el('span', { class: 'chip ' + (p.status === 'error' ? 'chip-bad' : ''), text: p.status || '' }),
        p.reason ? el('span', { class: 'muted', text: p.reason }) : null,
        p.summary && p.summary.cost_usd != null ? el('span', { text: fmtCost(p.summary.cost_usd) }) : null);
    default:
      return el('div', { class: 'ev-sum muted', text: preview(p) });
  }
}

function eventRow(ev, index) {
  const type = ev.event_type;
  const guard = type === 'ERROR' && (ev.payload || {}).guardrail;
  const cls = 'event ev-' + type.toLowerCase() + (guard ? ' ev-guard' : '');
  const open = state.expanded.has(ev.event_id);
  const li = el('li', { class: cls + (open ? ' open' : ''), 'data-event-id': ev.event_id, 'data-type': type },
    el('div', { class: 'ev-head', role: 'button', tabindex: '0', 'aria-expanded': String(open),
      onclick: () => toggleEvent(li, ev), onkeydown: (e) => { if (e.key === 'Enter') toggleEvent(li, ev); } },
    el('span', { class: 'ev-idx muted small', text: '#' + (index + 1) }),
    el('span', { class: 'ev-type', text: type.replace('_', ' ') }),
    el('span', { class: 'ev-name', text: ev.name }),
    el('span', { class: 'ev-time muted small', text: fmtClock(ev.ts) })),
    eventSummary(ev),
    replayMarks(ev));
  if (open) li.append(jsonBlock(ev));
  return li;
}

function jsonBlock(ev) {
  return el('pre', { class: 'ev-json', text: JSON.stringify(ev, null, 2) });
}

function toggleEvent(li, ev) {
  if (state.expanded.has(ev.event_id)) {
    state.expanded.delete(ev.event_id);
    li.classList.remove('open');
    li.querySelector('.ev-json')?.remove();
  } else {
    state.expanded.add(ev.event_id);
    li.classList.add('open');
    li.append(jsonBlock(ev));
  }
  li.querySelector('.ev-head').setAttribute('aria-expanded', String(li.classList.contains('open')));
}

function renderTimeline() {
  const tl = $('timeline');
  tl.replaceChildren(...state.events.map((ev, i) => eventRow(ev, state.offset + i)));
  if (state.events.length === 0) tl.append(el('li', { class: 'empty small', text: 'No events yet.' }));
  const last = Math.min(state.total, state.offset + state.events.length);
  $('page-info').textContent = state.total
    ? `Events ${fmtInt(state.offset + 1)}–${fmtInt(last)} of ${fmtInt(state.total)}` : 'No events';
  const pager = $('pager');
  pager.querySelector('[data-page=first]').disabled = state.offset === 0;
  pager.querySelector('[data-page=prev]').disabled = state.offset === 0;
  pager.querySelector('[data-page=next]').disabled = state.offset + PAGE_SIZE >= state.total;
  pager.querySelector('[data-page=last]').disabled = state.offset + PAGE_SIZE >= state.total;
  $('follow').checked = state.follow;
  $('follow').parentElement.hidden = !state.run || state.run.status !== 'running';
}

function lastPageOffset(total) { return Math.max(0, Math.floor((Math.max(total, 1) - 1) / PAGE_SIZE) * PAGE_SIZE); }

async function loadEvents() {
  const runId = state.runId;
  let body = await api(`/api/runs/${runId}/events?offset=${state.offset}&limit=${PAGE_SIZE}`);
  if (runId !== state.runId) return;
  if (state.follow && body.total > state.offset + PAGE_SIZE) {
    state.offset = lastPageOffset(body.total);
    body = await api(`/api/runs/${runId}/events?offset=${state.offset}&limit=${PAGE_SIZE}`);
    if (runId !== state.runId) return;
  }
  const changed = body.total !== state.total || body.events.length !== state.events.length
    || (body.events[0] || {}).event_id !== (state.events[0] || {}).event_id;
  state.total = body.total;
  state.events = body.events;
  if (changed) {
    const atBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
    renderTimeline();
    if (state.follow && atBottom) window.scrollTo(0, document.body.scrollHeight);
  }
  setParams({ offset: state.offset || null });
}

async function loadGuardState() {
  const box = $('guard-state');
  if (!state.run || state.run.status !== 'running') { box.hidden = true; return; }
  try {
    const body = await api(`/api/runs/${state.runId}/guard-stats`);
    box.hidden = !body.stats;
    if (body.stats) $('guard-state-json').textContent = JSON.stringify(body.stats, null, 2);
  } catch (_) { box.hidden = true; }
}

async function refreshRun() {
  const runId = state.runId;
  if (!runId) return;
  const run = await api(`/api/runs/${runId}`);
  if (runId !== state.runId) return;
  state.run = run;
  renderRunHead();
  loadGuardState();
  await loadEvents();
  if (run.status !== 'running') { eventsPoller.stop(); renderPollState(); }
}

const eventsPoller = poller(refreshRun, POLL_EVENTS_MS);
const runsPoller = poller(loadRuns, POLL_RUNS_MS);

async function openRun(runId, push) {
  const first = state.runId !== runId;
  state.runId = runId;
  if (first) {
    state.events = []; state.total = 0; state.expanded.clear();
    resetReplay();
    const off = parseInt(param('offset') || '', 10);
    state.offset = !push && !Number.isNaN(off) ? off : 0;
    state.follow = false;
  }
  if (push) setParams({ view: null, agent: null, run: runId, offset: null }, true);
  document.querySelectorAll('.run-item').forEach((n) => n.classList.toggle('selected', n.dataset.runId === runId));
  $('run-empty').hidden = true;
  $('run-detail').hidden = false;
  $('timeline-error').hidden = true;
  try {
    const run = await api(`/api/runs/${runId}`);
    state.run = run;
    if (first && run.status === 'running' && Number.isNaN(parseInt(param('offset') || '', 10))) {
      state.follow = true; // a live run opens at its newest events
    }
    renderRunHead();
    loadGuardState();
    $('replay-current-src').textContent = '(' + replayAgentLabel() + ')';
    if (first && state.follow) {
      const peek = await api(`/api/runs/${runId}/events?offset=0&limit=1`);
      state.offset = lastPageOffset(peek.total);
    }
    await loadEvents();
    if (run.status === 'running') eventsPoller.start(false); else eventsPoller.stop();
  } catch (e) {
    $('timeline-error').textContent = e.status === 404 ? 'Run not found (deleted?)' : 'Cannot load run: ' + e.message;
    $('timeline-error').hidden = false;
    eventsPoller.stop();
  }
  renderPollState();
}

function goPage(which) {
  const last = lastPageOffset(state.total);
  const to = { first: 0, prev: Math.max(0, state.offset - PAGE_SIZE), next: Math.min(last, state.offset + PAGE_SIZE), last }[which];
  state.follow = which === 'last' && state.run && state.run.status === 'running';
  if (to === state.offset) return;
  state.offset = to;
  state.events = [];
  loadEvents().then(() => window.scrollTo(0, which === 'last' ? document.body.scrollHeight : 0))
    .catch((e) => { $('timeline-error').textContent = e.message; $('timeline-error').hidden = false; });
}

async function terminateRun() {
  if (!state.run || !confirm('Terminate this session? Every later call of it will be refused.')) return;
  try {
    await api(`/api/runs/${state.runId}/terminate`, { method: 'POST' });
  } catch (e) { alert('Terminate failed: ' + e.message); }
  await refreshRun().catch(() => {});
  loadRuns();
}

async function renameRun() {
  const name = prompt('New name for this run (updates run.json)', (state.run || {}).run_name || '');
  if (name == null || !name.trim()) return;
  try {
    await api(`/api/runs/${state.runId}/rename`, { method: 'POST', json: { run_name: name.trim() } });
    await refreshRun();
    loadRuns();
  } catch (e) { alert('Rename failed: ' + e.message); }
}

async function deleteRun() {
  if (!confirm('Delete this run and its trace files? This cannot be undone.')) return;
  try {
    await api(`/api/runs/${state.runId}`, { method: 'DELETE' });
    state.runId = null; state.run = null;
    eventsPoller.stop();
    $('run-detail').hidden = true; $('run-empty').hidden = false;
    setParams({ run: null, offset: null }, true);
    loadRuns();
  } catch (e) { alert('Delete failed: ' + e.message); }
}

/* ---------- guard replay (POST /api/runs/{id}/replay, SPEC §5.7) ---------- */

const REPLAY_LABELS = { recorded: 'the recorded config', current: 'the current config', custom: 'the edited config' };

function replayAgent() { return ((state.run || {}).tripwire || {}).agent_name || null; }
function replayAgentLabel() {
  const a = replayAgent();
  return a ? `in force now for ${a}` : 'the project default in force now';
}
function firing(d) { return `${d.action} ${d.kind || d.guard}`; }
function firingKey(d) { return [d.call_index, d.guard, d.kind, d.action].join('|'); }

function mark(side, d) {
  const recordedOnly = d.replayed === false;
  return el('span', {
    class: `mark mark-${side} act-${d.action}`,
    title: (side === 'live' ? 'Live guards, before the call: ' : recordedOnly ? 'Recorded, not recomputed: ' : 'Replay: ')
      + d.guard + (d.kind ? ' / ' + d.kind : '') + (d.message ? ' — ' + d.message : ''),
    text: `${recordedOnly ? 'recorded' : side}: ${firing(d)}`,
  });
}

/* The replay's firings on the event they refer to; on a guarded call's own event, the live side too. */
function replayMarks(ev) {
  const r = state.replay;
  if (!r) return null;
  const p = ev.payload || {};
  const seq = Number.isInteger(p.call_seq) && p.guard_input ? p.call_seq : null;
  const replayed = r.decisions.filter((d) => d.event_id && d.event_id === ev.event_id);
  const live = seq == null ? [] : r.live.filter((d) => d.call_index === seq);
  if (!replayed.length && !live.length) return null;
  const none = (side) => el('span', { class: `mark mark-${side} mark-none`, text: `${side}: nothing` });
  const marks = [];
  if (seq != null) marks.push(...(live.length ? live.map((d) => mark('live', d)) : [none('live')]));
  marks.push(...(replayed.length ? replayed.map((d) => mark('replay', d)) : [none('replay')]));
  return el('div', { class: 'ev-marks', 'data-replay-marks': '' }, marks);
}

function replayRows(r) {
  const agentdbg = r.recorded_by === 'agentdbg';
  // what each call's check decided: live (recorded) vs replayed; an AgentDbg run has no live inputs
  const checks = agentdbg ? r.decisions.filter((d) => d.call_index != null) : r.checks;
  const rows = new Map();
  const row = (i) => { if (!rows.has(i)) rows.set(i, { live: [], replay: [] }); return rows.get(i); };
  for (const d of r.live) row(d.call_index).live.push(d);
  for (const d of checks) row(d.call_index).replay.push(d);
  // the other firings: after a call's answer, on an event, or recorded only (breaker, kill switch)
  const pending = new Map();
  for (const d of checks) pending.set(firingKey(d), (pending.get(firingKey(d)) || 0) + 1);
  const others = [];
  for (const d of r.decisions) {
    const n = pending.get(firingKey(d)) || 0;
    if (n > 0 && d.replayed !== false) pending.set(firingKey(d), n - 1); else others.push(d);
  }
  return { rows: [...rows.entries()].sort((a, b) => a[0] - b[0]), others, agentdbg };
}

function renderReplay() {
  const r = state.replay;
  const box = $('replay-result');
  $('btn-replay-clear').hidden = !r;
  if (!r) { box.hidden = true; box.replaceChildren(); return; }
  const { rows, others, agentdbg } = replayRows(r);
  const same = (a, b) => a.map(firing).join(',') === b.map(firing).join(',');
  const differing = rows.filter(([, x]) => !same(x.live, x.replay)).length;
  const n = r.decisions.length;
  const summary = `${fmtInt(r.calls)} call${r.calls === 1 ? '' : 's'} replayed under ${REPLAY_LABELS[r.config] || r.config}: `
    + `${n ? fmtInt(n) + ' firing' + (n === 1 ? '' : 's') : 'nothing fired'}. `
    + (agentdbg ? 'Recorded by AgentDbg\'s SDK: no live guard inputs, its calls were replayed one after the other.'
      : differing ? `${differing} call${differing === 1 ? '' : 's'} decided differently than live.`
        : 'Every call decided as live.');
  const cells = (list) => (list.length ? list.map((d) => el('span', { class: `mark mark-plain act-${d.action}`,
    title: d.message || '', text: `${d.action} ${d.guard}${d.kind ? ' · ' + d.kind : ''}` })) : el('span', { class: 'muted', text: '—' }));
  const table = el('table', { class: 'replay-table', id: 'replay-table' },
    el('caption', { class: 'small muted', text: 'Live vs replay: what the guards decided before each call was forwarded' }),
    el('thead', {}, el('tr', {},
      el('th', { scope: 'col', text: 'Call' }), el('th', { scope: 'col', text: 'Live' }), el('th', { scope: 'col', text: 'Replay' }))),
    el('tbody', {}, rows.length ? rows.map(([i, x]) => el('tr', {
      class: same(x.live, x.replay) ? '' : 'diff', 'data-call': String(i) },
    el('td', { class: 'mono', text: '#' + i }), el('td', {}, cells(x.live)), el('td', {}, cells(x.replay))))
      : el('tr', {}, el('td', { colspan: '3', class: 'muted', text: 'Nothing fired, live or in the replay.' }))));
  const other = others.length ? el('div', { class: 'replay-others' },
    el('div', { class: 'small muted', text: 'Other replay firings (after a call\'s answer, on an event, or recorded and not recomputed):' }),
    el('ul', { class: 'small' }, others.map((d) => el('li', {},
      el('span', { class: 'mono', text: d.call_index != null ? `call #${d.call_index} ` : '' }), mark('replay', d),
      d.message ? el('span', { class: 'muted', text: ' ' + d.message }) : null)))) : null;
  box.replaceChildren(...[el('p', { class: 'replay-summary', id: 'replay-summary', text: summary }), table, other].filter(Boolean));
  box.hidden = false;
}

async function loadReplayForm() {
  const runId = state.runId;
  const agent = replayAgent();
  const cfg = await api(configUrl(agent || PROJECT));
  if (runId !== state.runId) return;
  state.replayBase = cfg;
  renderGuardForm(cfg, $('replay-form'), 'r');
}

/* The edited form over the config it was filled from (fields the form does not show stay as they were). */
function editedConfig() {
  const base = state.replayBase || {};
  const out = Object.assign({}, base);
  for (const [section, values] of Object.entries(readGuardForm($('replay-form')))) {
    out[section] = Object.assign({}, base[section] || {}, values);
  }
  return out;
}

function replayChoice() { return document.querySelector('input[name="replay-config"]:checked').value; }

async function onReplayChoice() {
  const custom = replayChoice() === 'custom';
  $('replay-form').hidden = !custom;
  if (custom && !state.replayBase) {
    try { await loadReplayForm(); } catch (e) {
      $('replay-error').textContent = 'Cannot load the current config: ' + e.message;
      $('replay-error').hidden = false;
    }
  }
}

async function runReplay() {
  const runId = state.runId;
  if (!runId) return;
  const choice = replayChoice();
  const status = $('replay-status');
  $('replay-error').hidden = true;
  $('btn-replay').disabled = true;
  status.textContent = 'Replaying…';
  try {
    if (choice === 'custom' && !state.replayBase) await loadReplayForm();
    const json = choice === 'current' ? { config: 'current' } : choice === 'custom' ? { config: editedConfig() } : {};
    const body = await api(`/api/runs/${runId}/replay`, { method: 'POST', json });
    if (runId !== state.runId) return;
    state.replay = body;
    $('replay-form').querySelectorAll('.invalid').forEach((n) => n.classList.remove('invalid'));
    status.textContent = 'Replayed. Firings are marked on the timeline.';
    renderReplay();
    renderTimeline();
  } catch (e) {
    if (runId !== state.runId) return;
    status.textContent = '';
    $('replay-error').replaceChildren(el('strong', { text: 'Replay failed: ' }), e.message);
    markInvalid($('replay-form'), e, 1); // loc is ["config", section, field]
    $('replay-error').hidden = false;
  } finally {
    $('btn-replay').disabled = false;
  }
}

function clearReplay() {
  state.replay = null;
  $('replay-status').textContent = '';
  renderReplay();
  renderTimeline();
}

function resetReplay() {
  state.replay = null;
  state.replayBase = null;
  $('replay-recorded').checked = true;
  $('replay-form').replaceChildren();
  $('replay-form').hidden = true;
  $('replay-status').textContent = '';
  $('replay-error').hidden = true;
  renderReplay();
}

/* ---------- agents view and Guards ---------- */

const GUARD_FIELDS = {
  loop_detection: [
    ['enabled', 'bool', 'Enabled'],
    ['threshold', 'int', 'Threshold (repeats)'],
    ['action', ['warn', 'block', 'terminate'], 'Action'],
    ['max_steps', 'int?', 'Max tool calls per session'],
    ['window', 'int', 'Cycle window (events)'],
    ['repetitions', 'int', 'Cycle repetitions'],
    ['agentdbg_cycle', 'bool', 'AgentDbg name-only cycle (opt-in)'],
    ['stop_on_loop', 'bool', 'Stop on cycle'],
    ['stop_on_loop_min_repetitions', 'int', 'Stop on cycle: min repetitions'],
    ['no_progress_warn', 'int', 'No-progress polls: warn'],
    ['no_progress_halt', 'int', 'No-progress polls: halt'],
    ['per_tool_mode', ['progress', 'count'], 'Per-tool escalation counts'],
    ['idempotent', 'triple', 'Idempotent tools warn/block/halt'],
    ['mutating', 'triple', 'Mutating tools warn/block/halt'],
    ['idempotent_tools', 'list', 'Idempotent tools (comma separated)'],
    ['mutating_tools', 'list', 'Mutating tools (comma separated)'],
    ['max_time_per_turn', 'num?', 'Max time per turn (s)'],
    ['turn_gap_s', 'num', 'MCP turn gap (s)'],
    ['max_repeated_tool_steps', 'int', 'Identical tool steps'],
  ],
  budget: [
    ['max_cost_usd', 'num?', 'Max cost (USD)'],
    ['soft_alert_threshold_usd', 'num?', 'Soft alert (USD)'],
    ['max_wall_time_seconds', 'num?', 'Max wall time (s)'],
    ['max_tokens', 'int?', 'Max total tokens'],
  ],
  limits: [
    ['max_llm_calls', 'int?', 'Max LLM calls'],
    ['max_tool_calls', 'int?', 'Max tool calls'],
    ['max_events', 'int?', 'Max events'],
    ['max_duration_s', 'num?', 'Max duration (s)'],
  ],
  circuit_breaker: [
    ['enabled', 'bool', 'Enabled'],
    ['open_after_failures', 'int', 'Open after failures'],
    ['cooldown_seconds', 'num', 'Cooldown (s)'],
    ['half_open_max_calls', 'int', 'Half-open trial calls'],
  ],
  tool_pins: [ // docs/mcp.md "Changed tools"
    ['tool_changes', ['ask', 'block', 'warn', 'off'], 'A pinned MCP tool changed'],
    ['tool_added', ['ask', 'block', 'warn', 'off'], 'An MCP tool added later'],
    ['hidden_instructions', ['warn', 'block', 'off'], 'Hidden instructions'],
  ],
};
const SECTION_TITLES = { loop_detection: 'Loop detection', budget: 'Budget', limits: 'Limits', circuit_breaker: 'Circuit breaker', tool_pins: 'MCP tool pins' };
const PROJECT = '__project__';
let agentName = null;
let agentConfig = null;

function configUrl(name) {
  return name === PROJECT ? '/api/projects/prevention-config'
    : `/api/agents/${encodeURIComponent(name)}/prevention-config`;
}

async function loadAgents() {
  try {
    const body = await api('/api/agents');
    $('agent-list-error').hidden = true;
    const items = [el('li', {
      class: 'agent-item' + (agentName === PROJECT ? ' selected' : ''), 'data-agent': PROJECT, tabindex: '0',
      onclick: () => openAgent(PROJECT, true) },
    el('div', { class: 'run-line1' }, el('span', { class: 'run-item-name', text: 'Project default' })),
    el('div', { class: 'muted small', text: 'applies to every agent without an override' }))];
    for (const a of body.agents) {
      items.push(el('li', {
        class: 'agent-item' + (agentName === a.name ? ' selected' : ''), 'data-agent': a.name, tabindex: '0',
        onclick: () => openAgent(a.name, true),
        onkeydown: (e) => { if (e.key === 'Enter') openAgent(a.name, true); } },
      el('div', { class: 'run-line1' },
        a.running ? el('span', { class: 'status-dot running', title: 'running' }) : null,
        el('span', { class: 'run-item-name', text: a.name }),
        el('span', { class: 'run-item-cost', text: fmtCost(a.cost_usd) })),
      el('div', { class: 'run-line2 muted small' },
        el('span', { text: `${a.runs} run${a.runs === 1 ? '' : 's'}` }),
        el('span', { class: a.is_agent_override ? 'pill pill-override' : 'pill', text: a.is_agent_override ? 'override' : 'project default' }))));
    }
    $('agent-list').replaceChildren(...items);
  } catch (e) {
    $('agent-list-error').textContent = 'Cannot load agents: ' + e.message;
    $('agent-list-error').hidden = false;
  }
}

function fieldInput(section, [key, kind, label], value, prefix = 'f') {
  const id = `${prefix}-${section}-${key}`;
  let input;
  if (kind === 'bool') {
    input = el('input', { type: 'checkbox', id, name: `${section}.${key}`, checked: !!value });
  } else if (Array.isArray(kind)) {
    input = el('select', { id, name: `${section}.${key}` }, kind.map((o) => el('option', { value: o, selected: o === value, text: o })));
  } else if (kind === 'triple' || kind === 'list') {
    input = el('input', { type: 'text', id, name: `${section}.${key}`, value: (value || []).join(kind === 'list' ? ', ' : ' / ') });
  } else {
    input = el('input', { type: 'number', id, name: `${section}.${key}`, step: kind.startsWith('int') ? '1' : 'any',
      value: value == null ? '' : String(value), placeholder: kind.endsWith('?') ? 'no limit' : '' });
  }
  input.dataset.kind = Array.isArray(kind) ? 'choice' : kind;
  return el('label', { class: 'field' + (kind === 'bool' ? ' field-bool' : ''), for: id }, el('span', { text: label }), input);
}

function renderGuardForm(cfg, form = $('guard-form'), prefix = 'f') {
  form.replaceChildren(...Object.entries(GUARD_FIELDS).map(([section, fields]) =>
    el('fieldset', { class: 'guard-section', 'data-section': section },
      el('legend', { text: SECTION_TITLES[section] }),
      el('div', { class: 'fields' }, fields.map((f) => fieldInput(section, f, (cfg[section] || {})[f[0]], prefix))))));
}

function readGuardForm(form = $('guard-form')) {
  const out = {};
  for (const input of form.querySelectorAll('input, select')) {
    const [section, key] = input.name.split('.');
    out[section] = out[section] || {};
    const kind = input.dataset.kind;
    const raw = input.value.trim();
    let v;
    if (kind === 'bool') v = input.checked;
    else if (kind === 'choice') v = input.value;
    else if (kind === 'list') v = raw ? raw.split(',').map((s) => s.trim()).filter(Boolean) : [];
    else if (kind === 'triple') v = raw.split(/[\s/,]+/).filter(Boolean).map(Number);
    else if (raw === '') v = null;
    else v = Number(raw);
    out[section][key] = v;
  }
  return out;
}

function renderBanner(cfg) {
  const b = $('guard-banner');
  if (agentName === PROJECT) {
    b.className = 'banner banner-project';
    b.textContent = cfg.source === 'api' ? 'Project default (set through the API; reset returns to the static configuration)'
      : 'Project default (from the static configuration)';
    $('btn-reset-guards').textContent = 'Reset to static configuration';
    $('btn-reset-guards').disabled = cfg.source !== 'api';
  } else if (cfg.is_agent_override) {
    b.className = 'banner banner-override';
    b.textContent = 'Agent-specific config' + (cfg.source === 'static' ? ' (from the static configuration)' : '');
    $('btn-reset-guards').textContent = 'Reset to project default';
    $('btn-reset-guards').disabled = cfg.source !== 'api';
  } else {
    b.className = 'banner banner-default';
    b.textContent = 'Using project default';
    $('btn-reset-guards').textContent = 'Reset to project default';
    $('btn-reset-guards').disabled = true;
  }
}

async function openAgent(name, push) {
  agentName = name;
  if (push) setParams({ view: 'agents', agent: name, run: null, offset: null }, true);
  document.querySelectorAll('.agent-item').forEach((n) => n.classList.toggle('selected', n.dataset.agent === name));
  $('agent-empty').hidden = true;
  $('agent-detail').hidden = false;
  $('guard-error').hidden = true;
  $('guard-status').textContent = '';
  $('agent-title').textContent = name === PROJECT ? 'Project default' : name;
  $('agent-sub').textContent = name === PROJECT ? 'Guards for every agent that has no override of its own' : 'Agent';
  if (typeof showAgentPolicy === 'function') showAgentPolicy(name);  // spend.js: permissions, rate limits, windows
  try {
    agentConfig = await api(configUrl(name));
    renderBanner(agentConfig);
    renderGuardForm(agentConfig);
  } catch (e) {
    $('guard-error').textContent = 'Cannot load config: ' + e.message;
    $('guard-error').hidden = false;
  }
}

/* Mark the form fields a 422 names (`loc` [section, field], after `skip` leading parts). */
function markInvalid(form, e, skip = 0) {
  form.querySelectorAll('.invalid').forEach((n) => n.classList.remove('invalid'));
  const errs = Array.isArray(e.body?.detail) ? e.body.detail : [];
  for (const err of errs) {
    const loc = (err.loc || []).slice(skip).filter((p) => typeof p === 'string');
    const input = form.querySelector(`[name="${loc.slice(0, 2).join('.')}"]`);
    if (input) input.closest('.field').classList.add('invalid');
  }
}

function showGuardError(e) {
  const box = $('guard-error');
  box.replaceChildren(el('strong', { text: 'Not saved: ' }), e.message);
  markInvalid($('guard-form'), e);
  box.hidden = false;
}

async function saveGuards() {
  $('guard-error').hidden = true;
  try {
    agentConfig = await api(configUrl(agentName), { method: 'PUT', json: readGuardForm() });
    renderBanner(agentConfig);
    renderGuardForm(agentConfig);
    $('guard-status').textContent = 'Saved. Applies from the next call.';
    loadAgents();
  } catch (e) { showGuardError(e); }
}

async function resetGuards() {
  $('guard-error').hidden = true;
  try {
    agentConfig = await api(configUrl(agentName), { method: 'DELETE' });
    renderBanner(agentConfig);
    renderGuardForm(agentConfig);
    $('guard-status').textContent = agentName === PROJECT ? 'Back to the static configuration.' : 'Back to the project default.';
    loadAgents();
  } catch (e) { showGuardError(e); }
}

/* ---------- views and wiring ---------- */

function showView() {
  const agents = param('view') === 'agents';
  const keys = param('view') === 'keys'; // the Keys page: keys.js
  const pins = param('view') === 'pins'; // the Pins page: pins.js
  $('view-runs').hidden = agents || keys || pins;
  $('view-agents').hidden = !agents;
  $('nav-runs').classList.toggle('active', !agents && !keys && !pins);
  $('nav-agents').classList.toggle('active', agents);
  keysView(keys);
  pinsView(pins);
  if (keys || pins) {
    runsPoller.stop(); eventsPoller.stop();
  } else if (agents) {
    runsPoller.stop(); eventsPoller.stop();
    loadAgents();
    const a = param('agent');
    if (a) openAgent(a, false);
  } else {
    runsPoller.start();
    if (!param('run') && param('run_id')) setParams({ run: param('run_id'), run_id: null }, false); // AgentDbg's links
    const r = param('run');
    if (r) openRun(r, false);
  }
  renderPollState();
}

document.querySelectorAll('[data-nav]').forEach((a) => a.addEventListener('click', (e) => {
  e.preventDefault();
  const url = new URL(location.href);
  const keep = ['poll_runs', 'poll_events'];
  for (const k of [...url.searchParams.keys()]) if (!keep.includes(k)) url.searchParams.delete(k);
  if (a.dataset.nav !== 'runs') url.searchParams.set('view', a.dataset.nav);
  history.pushState(null, '', url.toString());
  showView();
}));
window.addEventListener('popstate', showView);
for (const id of ['filter-agent', 'filter-status', 'filter-tag']) {
  $(id).addEventListener('change', () => loadRuns());
}
$('pager').addEventListener('click', (e) => {
  const b = e.target.closest('[data-page]');
  if (b && !b.disabled) goPage(b.dataset.page);
});
$('follow').addEventListener('change', (e) => {
  state.follow = e.target.checked;
  if (state.follow) goPage('last');
});
$('btn-expand-all').addEventListener('click', () => {
  const all = state.events.every((ev) => state.expanded.has(ev.event_id));
  for (const ev of state.events) { if (all) state.expanded.delete(ev.event_id); else state.expanded.add(ev.event_id); }
  $('btn-expand-all').textContent = all ? 'Expand all' : 'Collapse all';
  renderTimeline();
});
$('btn-terminate').addEventListener('click', terminateRun);
$('btn-rename').addEventListener('click', renameRun);
$('btn-delete').addEventListener('click', deleteRun);
$('btn-replay').addEventListener('click', runReplay);
$('btn-replay-clear').addEventListener('click', clearReplay);
document.querySelectorAll('input[name="replay-config"]').forEach((i) => i.addEventListener('change', onReplayChoice));
$('replay-form').addEventListener('submit', (e) => { e.preventDefault(); runReplay(); });
$('btn-save-guards').addEventListener('click', saveGuards);
$('btn-reset-guards').addEventListener('click', resetGuards);
$('guard-form').addEventListener('submit', (e) => { e.preventDefault(); saveGuards(); });

showView();
