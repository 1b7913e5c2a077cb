/* Tripwire viewer: the Keys page (agent keys, SPEC §9): create (the key is shown once), list, revoke.
   Uses app.js's `api`, `el` and `$`; app.js's showView calls keysView(active). */
'use strict';

function keysWhen(ts) {
  return ts == null ? '-' : new Date(ts * 1000).toLocaleString([], { year: 'numeric', month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit' });
}

function keysSection() {
  let section = $('view-keys');
  if (section) return section;
  section = el('div', { id: 'view-keys', class: 'layout keys-layout', hidden: true },
    el('main', { class: 'main' },
      el('h1', { text: 'Agent keys' }),
      el('p', { class: 'muted small', text: 'With auth.require_agent_key, every call to the proxy carries one of these keys as its API key; the key names its agent. Only a hash is kept: a new key is shown once.' }),
      el('form', { id: 'key-form', class: 'guard-form key-form', novalidate: true },
        el('label', {}, 'Agent ', el('input', { id: 'key-agent', required: true, autocomplete: 'off', placeholder: 'research-agent' })),
        el('label', {}, 'Expires ', el('input', { id: 'key-expires', autocomplete: 'off', placeholder: '30d (empty: never)' })),
        el('label', {}, 'Note ', el('input', { id: 'key-note', autocomplete: 'off' })),
        el('button', { type: 'submit', id: 'btn-create-key', class: 'btn btn-primary', text: 'Create key' })),
      el('div', { id: 'key-new', class: 'banner banner-override', role: 'status', hidden: true },
        el('div', { text: 'Copy this key now: it will not be shown again.' }),
        el('code', { id: 'key-new-value', class: 'mono' })),
      el('div', { id: 'key-error', class: 'error-box', role: 'alert', hidden: true }),
      el('table', { id: 'key-table', class: 'replay-table key-table' },
        el('thead', {}, el('tr', {}, ['Id', 'Agent', 'Status', 'Created', 'Expires', 'Note', ''].map((h) => el('th', { text: h })))),
        el('tbody', { id: 'key-rows' }))));
  document.querySelector('dialog').before(section);
  $('key-form').addEventListener('submit', (e) => { e.preventDefault(); createKey(); });
  return section;
}

function keyError(e) {
  const box = $('key-error');
  box.textContent = e ? (e.message || String(e)) : '';
  box.hidden = !e;
}

async function loadKeys() {
  try {
    const body = await api('/api/keys');
    const rows = (body.keys || []).slice().reverse().map((k) => el('tr', { 'data-key-id': k.id },
      el('td', { class: 'mono small', text: k.id }),
      el('td', { text: k.agent }),
      el('td', {}, el('span', { class: 'tag key-' + k.status, text: k.status })),
      el('td', { class: 'small', text: keysWhen(k.created) }),
      el('td', { class: 'small', text: keysWhen(k.expires) }),
      el('td', { class: 'small', text: k.note || '' }),
      el('td', {}, k.status === 'revoked' ? null
        : el('button', { type: 'button', class: 'btn btn-small btn-danger', text: 'Revoke', onclick: () => revokeKey(k.id) }))));
    $('key-rows').replaceChildren(...rows);
    keyError(null);
  } catch (e) { keyError(e); }
}

async function createKey() {
  const json = { agent: $('key-agent').value.trim() };
  const expires = $('key-expires').value.trim();
  const note = $('key-note').value.trim();
  if (expires) json.expires = expires;
  if (note) json.note = note;
  try {
    const made = await api('/api/keys', { method: 'POST', json });
    $('key-new-value').textContent = made.key;
    $('key-new').hidden = false;
    $('key-form').reset();
    keyError(null);
    await loadKeys();
  } catch (e) {
    $('key-new').hidden = true;
    keyError(e);
  }
}

async function revokeKey(id) {
  try {
    await api('/api/keys/' + encodeURIComponent(id), { method: 'DELETE' });
    await loadKeys();
  } catch (e) { keyError(e); }
}

/* called by app.js's showView: the Keys page is shown (or left) */
function keysView(active) {
  const section = keysSection();
  section.hidden = !active;
  $('nav-keys').classList.toggle('active', active);
  forgetNewKey(); // (a key just made is shown by createKey, until the page is left)
  if (active) loadKeys();
}

/* a key is shown once: gone from the page (not just hidden) as soon as the page is left */
function forgetNewKey() {
  $('key-new-value').textContent = '';
  $('key-new').hidden = true;
}
