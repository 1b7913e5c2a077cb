/* Tripwire viewer: pending approvals on every page (SPEC §5.5a). A count badge in the top bar, a
   queue at the top of the page (each held call: tool and arguments or model, guard, threshold and
   actual, the run's last events), Approve / Deny with a note, and for a budget or limit a field to
   raise it. Polled like the run list; while the tab is hidden it polls only when the browser may
   notify (slower), and a new approval then shows a notification. Loaded after app.js: uses its
   api(), el(), fmtTime() and POLL_RUNS_MS. */
'use strict';

(() => {
  // budget and limit keys a person may raise (proxy/guards/raises.py RAISABLE)
  const RAISABLE = ['max_cost_usd', 'max_tokens', 'max_wall_time_seconds', 'max_llm_calls',
    'max_tool_calls', 'max_events', 'max_duration_s', 'max_steps'];
  const HIDDEN_POLL_MS = Math.max(POLL_RUNS_MS, 10000);
  const LAST_EVENTS = 5;

  const ui = { pending: [], seen: new Set(), events: new Map(), drafts: new Map(), open: true,
    timer: null, absent: false, first: true };

  // a stylesheet of its own ('self' only: the admin app's CSP refuses inline styles)
  document.head.append(el('link', { rel: 'stylesheet', href: '/static/approvals.css' }));

  const badge = el('button', { type: 'button', id: 'approvals-badge', class: 'approvals-badge', title: 'Pending approvals', hidden: true },
    'Approvals ', el('span', { class: 'count', id: 'approvals-count', text: '0' }));
  const notifyBtn = el('button', { type: 'button', id: 'approvals-notify', class: 'btn btn-small', hidden: true,
    text: 'Notify me when hidden' });
  const list = el('div', { id: 'approvals-list' });
  const panel = el('section', { id: 'approvals', class: 'approvals', 'aria-label': 'Pending approvals', hidden: true },
    el('h2', {}, el('span', { id: 'approvals-title', text: 'Pending approvals' }), notifyBtn), list);
  document.querySelector('.topbar').insertBefore(badge, $('poll-state'));
  document.querySelector('.topbar').after(panel);

  function canNotify() { return 'Notification' in window && Notification.permission === 'granted'; }
  function askNotify() { // only from a user gesture (browsers refuse otherwise)
    if (!('Notification' in window) || Notification.permission !== 'default') return;
    Notification.requestPermission().then(renderNotifyBtn).catch(() => {});
  }
  function renderNotifyBtn() {
    notifyBtn.hidden = !('Notification' in window) || Notification.permission !== 'default';
  }
  badge.addEventListener('click', () => { askNotify(); ui.open = !ui.open; render(); });
  notifyBtn.addEventListener('click', askNotify);

  // the API shape, read loosely: the call may be flat (tool/arguments/model) or under `call`
  const callOf = (a) => a.call || {};
  const toolOf = (a) => a.tool ?? callOf(a).tool ?? null;
  const argsOf = (a) => a.arguments ?? callOf(a).arguments;
  const modelOf = (a) => a.model ?? callOf(a).model ?? null;
  const toolCallsOf = (a) => callOf(a).tool_calls || []; // an LLM call: the step it goes on from
  const sessionOf = (a) => a.session ?? a.session_id ?? null;
  function when(v) { // epoch seconds or ISO
    if (v == null) return null;
    const ms = typeof v === 'number' ? v * 1000 : Date.parse(v);
    return Number.isNaN(ms) ? null : ms;
  }
  function raiseKey(a) {
    if (RAISABLE.includes(a.guard)) return a.guard;
    return a.kind === 'budget' || a.kind === 'limit' ? '' : null;
  }
  function fmtValue(v) { return v == null ? '—' : typeof v === 'object' ? JSON.stringify(v) : String(v); }

  function notify(fresh) {
    if (!document.hidden || !canNotify() || !fresh.length) return;
    const a = fresh[0];
    const what = toolOf(a) ? `tool ${toolOf(a)}` : modelOf(a) ? `model ${modelOf(a)}` : 'a call';
    try {
      const n = new Notification(fresh.length > 1 ? `${fresh.length} calls wait for approval` : 'A call waits for approval', {
        body: `${a.agent || 'agent'}: ${what} (${a.guard})`, tag: 'tripwire-approvals' });
      n.onclick = () => { window.focus(); n.close(); };
    } catch (e) { console.warn(e); }
  }

  async function loadApprovals() {
    let body;
    try { body = await api('/api/approvals'); } catch (e) {
      if (e.status === 404) { ui.absent = true; badge.hidden = true; panel.hidden = true; return; }
      throw e;
    }
    const all = Array.isArray(body) ? body : (body && body.approvals) || [];
    const pending = all.filter((a) => !a.status || a.status === 'pending');
    const fresh = pending.filter((a) => !ui.seen.has(a.id));
    for (const a of fresh) ui.seen.add(a.id);
    if (!ui.first) notify(fresh);
    ui.first = false;
    ui.pending = pending;
    const ids = new Set(pending.map((a) => a.id));
    for (const id of [...ui.events.keys()]) if (!ids.has(id)) { ui.events.delete(id); ui.drafts.delete(id); }
    await Promise.all(pending.filter((a) => a.run_id && !ui.events.has(a.id)).map(loadEvents));
    render();
  }

  async function loadEvents(a) {
    try {
      const peek = await api(`/api/runs/${a.run_id}/events?offset=0&limit=1`);
      const offset = Math.max(0, (peek.total || 0) - LAST_EVENTS);
      const page = await api(`/api/runs/${a.run_id}/events?offset=${offset}&limit=${LAST_EVENTS}`);
      ui.events.set(a.id, page.events || []);
    } catch (_) { ui.events.set(a.id, []); }
  }

  function eventLine(ev) {
    const p = ev.payload || {};
    const detail = p.guardrail || p.tool_name || p.model || p.message || '';
    return el('li', {}, el('span', { class: 'mono', text: ev.event_type }), ' ', ev.name || '',
      detail && detail !== ev.name ? el('span', { class: 'muted', text: ' · ' + String(detail).slice(0, 120) }) : '');
  }

  function draft(id) {
    if (!ui.drafts.has(id)) ui.drafts.set(id, { note: '', key: null, value: '', error: '', busy: false });
    return ui.drafts.get(id);
  }

  function item(a) {
    const d = draft(a.id);
    const tool = toolOf(a);
    const model = modelOf(a);
    const key = raiseKey(a);
    if (d.key == null && key != null) d.key = key;
    const expires = when(a.expires_at);
    const created = when(a.created_at ?? a.requested_at);
    const events = ui.events.get(a.id) || [];
    const note = el('textarea', { 'aria-label': 'Note', placeholder: 'Note (the agent reads it on a deny)', rows: 1 });
    note.value = d.note;
    note.addEventListener('input', () => { d.note = note.value; });
    const raise = [];
    if (key != null) {
      const k = el('input', { 'aria-label': 'Raise which limit', placeholder: 'budget or limit key', list: 'approvals-raisable' });
      k.value = d.key || '';
      k.addEventListener('input', () => { d.key = k.value.trim(); });
      const v = el('input', { type: 'number', min: '0', step: 'any', 'aria-label': 'Raise to', placeholder: `above ${fmtValue(a.threshold)}` });
      v.value = d.value;
      v.addEventListener('input', () => { d.value = v.value; });
      raise.push(el('label', { class: 'small' }, 'Raise ', k), el('label', { class: 'small' }, ' to ', v));
    }
    const decide = (decision) => () => decideOne(a, decision);
    return el('div', { class: 'approval', 'data-approval-id': a.id },
      el('div', { class: 'approval-head' },
        el('span', { class: 'approval-guard', text: a.guard + (a.kind && !['loop', 'budget', 'limit', 'tool'].includes(a.kind) ? ' · ' + a.kind : '') }),
        el('span', { class: 'small' }, 'agent ', el('b', { text: a.agent || '—' })),
        sessionOf(a) ? el('span', { class: 'small muted', text: 'session ' + sessionOf(a) }) : '',
        el('span', { class: 'small' }, 'threshold ', el('b', { text: fmtValue(a.threshold) }), ' · actual ', el('b', { text: fmtValue(a.actual) })),
        a.run_id ? el('a', { class: 'small', href: `/?run=${a.run_id}`, text: 'open run' }) : '',
        created ? el('span', { class: 'small muted', text: 'asked ' + fmtTime(new Date(created).toISOString()) }) : '',
        expires ? el('span', { class: 'small muted approval-expires', 'data-expires': String(expires) }) : ''),
      a.message ? el('div', { class: 'small', text: a.message }) : '',
      tool ? el('div', { class: 'small' }, 'Tool ', el('b', { class: 'mono', text: tool }), ' with') : '',
      tool ? el('pre', { class: 'approval-args', text: JSON.stringify(argsOf(a) ?? {}, null, 2) }) : '',
      !tool && model ? el('div', { class: 'small' }, 'LLM call to ', el('b', { class: 'mono', text: model })) : '',
      ...heldStep(a),
      ...evidenceOf(a),
      a.approving ? el('div', { class: 'small muted', text: 'Approving: ' + a.approving }) : '',
      events.length ? el('div', { class: 'small muted', text: 'The run\'s last events' }) : '',
      events.length ? el('ol', { class: 'approval-events' }, events.map(eventLine)) : '',
      el('div', { class: 'approval-form' }, note, ...raise,
        el('button', { type: 'button', class: 'btn btn-primary', disabled: d.busy, onclick: decide('approve'), text: 'Approve' }),
        el('button', { type: 'button', class: 'btn btn-danger', disabled: d.busy, onclick: decide('deny'), text: 'Deny' })),
      d.error ? el('div', { class: 'approval-error', role: 'alert', text: d.error }) : '');
  }

  // what the held LLM call repeats: the tool calls of the model's last step (arguments redacted by the API)
  function heldStep(a) {
    const calls = toolCallsOf(a);
    if (!calls.length) return [];
    const more = callOf(a).tool_calls_not_listed;
    return [
      el('div', { class: 'small' }, calls.length > 1 ? `after a step of ${calls.length} tool calls:` : 'after the tool call'),
      el('ul', { class: 'approval-tool-calls' }, calls.map((c) => el('li', {},
        el('b', { class: 'mono', text: c.name }),
        el('pre', { class: 'approval-args', text: JSON.stringify(c.arguments ?? {}, null, 2) })))),
      more ? el('div', { class: 'small muted', text: `and ${more} more` }) : '',
    ];
  }

  // a loop's evidence: the pattern repeated, how often, the calls' TOOL_CALL events (each links to the run)
  function evidenceOf(a) {
    const ev = a.evidence || {};
    if (!ev.pattern && !(ev.event_ids || []).length) return [];
    const ids = ev.event_ids || [];
    return [el('div', { class: 'small approval-evidence' },
      'Evidence: ', el('span', { class: 'mono', text: ev.pattern || '' }),
      ev.repetitions ? ` · ${ev.repetitions} times` : '',
      ids.length ? ' · events ' : '',
      ...ids.slice(-10).map((id) => el('a', { href: `/?run=${a.run_id}`, class: 'mono', title: id, text: id.slice(0, 8) })))];
  }

  async function decideOne(a, decision) {
    const d = draft(a.id);
    const body = { decision, note: d.note };
    if (decision === 'approve' && d.key && String(d.value).trim() !== '') {
      body.raise = { [d.key]: Number(d.value) };
    }
    d.busy = true; d.error = ''; render(true);
    try {
      await api(`/api/approvals/${a.id}`, { method: 'POST', json: body });
      ui.pending = ui.pending.filter((p) => p.id !== a.id);
      ui.drafts.delete(a.id);
    } catch (e) {
      d.error = (e.status === 409 || e.status === 404 ? 'Already gone: ' : 'Not decided: ') + e.message;
      if (e.status === 409 || e.status === 404) setTimeout(() => tick(), 1500);
    }
    d.busy = false;
    render(true);
  }

  function renderCountdowns() {
    for (const n of list.querySelectorAll('.approval-expires')) {
      const left = Math.max(0, Math.round((Number(n.dataset.expires) - Date.now()) / 1000));
      n.textContent = `falls back in ${left}s`;
    }
  }

  function render(force = false) {
    if (ui.absent) return;
    const n = ui.pending.length;
    badge.hidden = false;
    badge.classList.toggle('has', n > 0);
    $('approvals-count').textContent = String(n);
    badge.title = n ? `${n} call(s) wait for a decision` : 'No pending approvals';
    $('approvals-title').textContent = n === 1 ? '1 call waits for a decision' : `${n} calls wait for a decision`;
    renderNotifyBtn();
    panel.hidden = n === 0 || !ui.open;
    // keep a note being typed: rebuild only what changed
    const want = ui.pending.map((a) => a.id);
    const have = [...list.children].map((c) => c.dataset.approvalId);
    const active = document.activeElement;
    const typing = active && list.contains(active) && ['INPUT', 'TEXTAREA'].includes(active.tagName);
    if (!force && typing && want.join() === have.join()) { renderCountdowns(); return; }
    list.replaceChildren(...ui.pending.map(item));
    renderCountdowns();
  }

  const datalist = el('datalist', { id: 'approvals-raisable' }, RAISABLE.map((k) => el('option', { value: k })));
  document.body.append(datalist);

  async function tick() {
    if (ui.timer) clearTimeout(ui.timer);
    ui.timer = null;
    if (ui.absent) return;
    if (!document.hidden || canNotify()) {
      try { await loadApprovals(); } catch (e) { console.warn(e); }
    }
    schedule();
  }
  function schedule() {
    if (ui.absent || ui.timer) return;
    if (document.hidden && !canNotify()) return; // paused, like the run list
    ui.timer = setTimeout(tick, document.hidden ? HIDDEN_POLL_MS : POLL_RUNS_MS);
  }
  document.addEventListener('visibilitychange', () => {
    if (!document.hidden) tick(); else { if (ui.timer) clearTimeout(ui.timer); ui.timer = null; schedule(); }
  });
  setInterval(renderCountdowns, 1000);
  window.tripwireApprovals = { refresh: tick };
  tick();
})();
