/* Tripwire viewer: resume (SPEC §5.5a). On the run view, a run resumed from another or as another
   links to it; a run ended by a guard or the kill switch gets a Resume button with optional fields
   raising its budgets or limits (POST /api/runs/{id}/resume). Loaded after app.js, which calls
   renderResume(run) from renderRunHead. */
'use strict';

const RESUME_FIELDS = [
  ['budget', 'max_cost_usd', 'Max cost (USD)'],
  ['budget', 'max_tokens', 'Max tokens'],
  ['budget', 'max_wall_time_seconds', 'Max wall time (s)'],
  ['limits', 'max_llm_calls', 'Max LLM calls'],
  ['limits', 'max_tool_calls', 'Max tool calls'],
  ['limits', 'max_events', 'Max events'],
  ['limits', 'max_duration_s', 'Max duration (s)'],
  ['loop_detection', 'max_steps', 'Max steps'],
];

let resumeFor = null; // the run whose resume panel is shown (kept while its fields are edited)

function endedByGuard(tw) {
  const reason = tw.end_reason || '';
  return reason === 'terminated' || reason.startsWith('guard:');
}

function runLink(label, runId) {
  const a = el('a', { href: `/?run=${runId}`, class: 'mono', text: runId });
  a.addEventListener('click', (e) => { e.preventDefault(); openRun(runId, true); });
  return el('div', { class: 'callout small resume-link' }, label + ' ', a);
}

function renderResume(run) {
  const tw = run.tripwire || {};
  const box = $('run-callouts');
  if (tw.resumed_from) box.append(runLink('Resumed from', tw.resumed_from));
  if (tw.resumed_as) box.append(runLink('Resumed as', tw.resumed_as));
  let panel = $('resume-panel');
  const show = run.status !== 'running' && endedByGuard(tw) && !tw.resumed_as;
  if (!show) { if (panel) panel.remove(); resumeFor = null; return; }
  if (panel && resumeFor === run.run_id) { box.after(panel); return; }
  resumeFor = run.run_id;
  if (panel) panel.remove();
  const cfg = tw.guard_config || {};
  const inputs = RESUME_FIELDS.filter(([section, key]) => (cfg[section] || {})[key] != null).map(([section, key, label]) =>
    el('label', { class: 'small' }, label + ' ',
      el('input', { type: 'number', min: '0', step: 'any', 'data-key': key, placeholder: `now ${cfg[section][key]}`, 'aria-label': 'Raise ' + key })));
  panel = el('div', { id: 'resume-panel', class: 'callout' },
    el('div', { class: 'small muted', text: 'Ended by ' + tw.end_reason + '. Resume lets its next call through, in a new run; spend and counts carry over.' + (inputs.length ? ' Raise a budget or limit (optional):' : '') }),
    el('div', { class: 'form-actions' }, ...inputs,
      el('button', { type: 'button', id: 'btn-resume', class: 'btn btn-primary', text: 'Resume', onclick: resumeRun }),
      el('span', { id: 'resume-status', class: 'small', role: 'status' })),
    el('div', { id: 'resume-error', class: 'error-box', role: 'alert', hidden: true }));
  box.after(panel);
}

async function resumeRun() {
  const raised = {};
  for (const input of document.querySelectorAll('#resume-panel input[data-key]')) {
    if (input.value.trim() !== '') raised[input.dataset.key] = Number(input.value);
  }
  const err = $('resume-error');
  err.hidden = true;
  $('btn-resume').disabled = true;
  try {
    const body = await api(`/api/runs/${state.runId}/resume`, { method: 'POST', json: Object.keys(raised).length ? { raise: raised } : {} });
    resumeFor = null;
    loadRuns();
    await openRun(body.run_id, true);
  } catch (e) {
    err.textContent = 'Not resumed: ' + e.message;
    err.hidden = false;
    $('btn-resume').disabled = false;
  }
}
