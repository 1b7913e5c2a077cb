/* Tripwire viewer: the Pins page (docs/mcp.md "Changed tools"): each MCP server's pinned tool
   definitions and the changes it offered since, each with its diff (pinned / offered), Approve
   (pins the offered definition) and Deny; Reset forgets a server's pins. Uses app.js's `api`,
   `el` and `$`; app.js's showView calls pinsView(active). */
'use strict';

const PINS_POLL_MS = 5000;
let pinsTimer = null;

function pinsWhen(ts) {
  return ts ? new Date(ts * 1000).toLocaleString([], { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit' }) : '-';
}

function pinsText(value) {
  if (value == null) return '(none)';
  return typeof value === 'string' ? value : JSON.stringify(value, null, 2);
}

function pinsSection() {
  let section = $('view-pins');
  if (section) return section;
  section = el('div', { id: 'view-pins', hidden: true },
    el('main', { class: 'main' },
      el('h1', { text: 'Pinned MCP tools' }),
      el('p', { class: 'muted small', text: "Each MCP server's tools as first listed. A tool whose definition changed since (or that appeared later) waits here for a person: Approve pins the offered definition, Deny keeps it out of lists and refuses its calls." }),
      el('div', { id: 'pins-error', class: 'error-box', role: 'alert', hidden: true }),
      el('div', { id: 'pins-servers' })));
  document.querySelector('dialog').before(section);
  return section;
}

function pinsError(e) {
  const box = $('pins-error');
  box.textContent = e ? (e.message || String(e)) : '';
  box.hidden = !e;
}

function pinsDiff(diff) {
  return el('table', { class: 'replay-table pin-diff' },
    el('thead', {}, el('tr', {}, ['Field', 'Pinned', 'Offered'].map((h) => el('th', { text: h })))),
    el('tbody', {}, ...Object.entries(diff || {}).map(([field, d]) => el('tr', { 'data-field': field },
      el('td', { class: 'mono small', text: field }),
      el('td', {}, el('pre', { class: 'ev-json pin-from', text: pinsText(d.from) })),
      el('td', {}, el('pre', { class: 'ev-json pin-to', text: pinsText(d.to) }))))));
}

function pinsChange(server, name, change) {
  return el('div', { class: 'banner banner-override pin-change', 'data-tool': name },
    el('div', {},
      el('b', { class: 'mono', text: name }), ' ',
      el('span', { class: 'tag', text: change.kind === 'added' ? 'added later' : 'changed' }), ' ',
      el('span', { class: 'tag pin-status-' + change.status, text: change.status }), ' ',
      el('span', { class: 'muted small', text: 'seen ' + pinsWhen(change.seen_at) + ' · ' + String(change.hash).slice(0, 12) })),
    pinsDiff(change.diff),
    el('div', { class: 'form-actions' },
      el('button', { type: 'button', class: 'btn btn-primary', text: 'Approve', onclick: () => decidePin(server, name, 'approve', change.hash) }),
      change.status === 'denied' ? null
        : el('button', { type: 'button', class: 'btn btn-danger', text: 'Deny', onclick: () => decidePin(server, name, 'deny', change.hash) })));
}

function pinsServer(s) {
  const changes = Object.entries(s.changes || {});
  const tools = Object.entries(s.tools || {});
  return el('section', { class: 'pin-server', 'data-server': s.server },
    el('div', { class: 'run-head' },
      el('h2', { class: 'section-title', text: s.server }),
      el('span', { class: 'muted small', text: `${tools.length} pinned` + (changes.length ? ` · ${changes.length} change(s)` : '') }),
      el('button', { type: 'button', class: 'btn btn-small btn-quiet', text: 'Reset pins', onclick: () => resetPins(s.server) })),
    ...changes.map(([name, c]) => pinsChange(s.server, name, c)),
    el('table', { class: 'replay-table pin-table' },
      el('thead', {}, el('tr', {}, ['Tool', 'Description', 'Hash', 'Pinned'].map((h) => el('th', { text: h })))),
      el('tbody', {}, ...tools.map(([name, p]) => el('tr', { 'data-tool': name },
        el('td', { class: 'mono', text: name }),
        el('td', { class: 'small', text: (p.definition || {}).description || '' }),
        el('td', { class: 'mono small', text: String(p.hash).slice(0, 12) }),
        el('td', { class: 'small', text: pinsWhen(p.pinned_at) }))))));
}

async function loadPins() {
  try {
    const body = await api('/api/pins');
    const servers = body.servers || [];
    $('pins-servers').replaceChildren(...(servers.length ? servers.map(pinsServer)
      : [el('div', { class: 'empty', text: 'No MCP server listed its tools yet.' })]));
    pinsError(null);
  } catch (e) { pinsError(e); }
}

async function decidePin(server, tool, decision, hash) {
  try {
    await api(`/api/pins/${encodeURIComponent(server)}/tools/${encodeURIComponent(tool)}`, { method: 'POST', json: { decision, hash } });
    await loadPins();
  } catch (e) { pinsError(e); }
}

async function resetPins(server) {
  if (!confirm(`Forget the pins of ${server}? Its next tools/list is pinned afresh.`)) return;
  try {
    await api(`/api/pins/${encodeURIComponent(server)}/reset`, { method: 'POST' });
    await loadPins();
  } catch (e) { pinsError(e); }
}

/* called by app.js's showView: the Pins page is shown (or left) */
function pinsView(active) {
  const section = pinsSection();
  section.hidden = !active;
  $('nav-pins').classList.toggle('active', active);
  clearInterval(pinsTimer);
  pinsTimer = null;
  if (active) {
    loadPins();
    pinsTimer = setInterval(() => { if (!document.hidden) loadPins(); }, PINS_POLL_MS);
  }
}
