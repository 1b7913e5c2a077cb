"""The Redis backend's Lua scripts: each check-and-update that replicas must not interleave is one
script, run atomically by Redis in one round trip (EVALSHA via redis-py's `register_script`).

Times come from Redis `TIME` (one clock for every replica) unless a test passes one. Floats are
returned as strings: Redis turns Lua numbers into integers. `MemoryBackend` implements the same
rules in Python; tests/test_state_backend.py runs one contract against both.
"""

from __future__ import annotations

# Put a run back after Redis lost its data, from a replica's copy: KEYS 1 log, 2 run hash, 3.. slot
# keys naming the run (set where missing); ARGV 1 header JSON {idle, logttl, mapttl, epoch (the
# copy's start stamp, '' unknown), term (terminated mark, '' none), lin (has lineage), run},
# 2.. stored entries. The copy goes into an empty log, or its tail after a log that holds only a
# shorter seed of the same epoch (every replica's copy is a prefix of one log: the longest wins;
# `seeded`, dropped by the next append, says the log is still only a seed). Returns the log's
# length when the copy went in, else 0.
SEED = r"""
local h = cjson.decode(ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 0 then
  local started = h.epoch
  if started == '' then
    local t = redis.call('TIME')
    started = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
  end
  redis.call('HSET', KEYS[2], 'started', started)
end
if h.term ~= '' and not redis.call('HGET', KEYS[2], 'term') then redis.call('HSET', KEYS[2], 'term', h.term) end
if h.lin then redis.call('HSET', KEYS[2], 'lin', '1') end
local n, len = #ARGV - 1, redis.call('LLEN', KEYS[1])
local seeded = tonumber(redis.call('HGET', KEYS[2], 'seeded') or '-1')
local same = h.epoch == '' or redis.call('HGET', KEYS[2], 'started') == h.epoch
local out = 0
if n > 0 and (len == 0 or (n > len and len == seeded and same)) then
  for i = len + 2, #ARGV do redis.call('RPUSH', KEYS[1], ARGV[i]) end
  redis.call('HSET', KEYS[2], 'seeded', n)
  out = n
end
for i = 3, #KEYS do
  local cur = redis.call('GET', KEYS[i])
  if not cur then
    redis.call('SET', KEYS[i], h.run, 'PX', h.mapttl)
  elseif cur == h.run then
    redis.call('PEXPIRE', KEYS[i], h.mapttl)
  end
end
redis.call('PEXPIRE', KEYS[2], h.idle)
redis.call('PEXPIRE', KEYS[1], h.logttl)
return out
"""

# The id of Redis's data set: KEYS 1 its key; ARGV 1 the id to set if there is none.
DATASET = r"""
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
"""

# The run of a call (SPEC §3), found or created in one step so two replicas never start two runs
# for one session. ARGV: 1 key prefix of the agent, 2 mode, 3 new run id, 4 idle ms, 5 slot ms,
# 6 explicit session id or announced episode id, 7 previous_response_id, 8.. lineage keys (the
# answer the history carries, whole-history digests longest first; mode 'first': the one to attach,
# never looked up). Returns {outcome, run id, started}.
RESOLVE = r"""
local p, mode, new, idle, slot_ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local name, prev = ARGV[6], ARGV[7]
local function run_key(r) return p .. 'run:' .. r end
local function live(r)
  if r and redis.call('EXISTS', run_key(r)) == 1 then return r end
  return false
end
local found = false
if mode == 'explicit' then
  if redis.call('EXISTS', p .. 'xterm:' .. name) == 1 then
    return {'terminated', redis.call('GET', p .. 'x:' .. name) or '', '0'}
  end
  found = live(redis.call('GET', p .. 'x:' .. name))
elseif mode == 'episode' then
  found = live(redis.call('GET', p .. 'ep:' .. name))
elseif mode == 'lineage' or mode == 'first' then
  if prev ~= '' then found = live(redis.call('GET', p .. 'resp:' .. prev)) end
  local i = 8
  if mode == 'first' then i = #ARGV + 1 end  -- a first request continues no conversation
  while not found and i <= #ARGV do
    found = live(redis.call('GET', p .. 'h:' .. ARGV[i]))
    i = i + 1
  end
  if not found then
    -- a new conversation: the agent's latest run is its episode if it has seen none yet
    local latest = live(redis.call('GET', p .. 'latest'))
    if latest and not redis.call('HGET', run_key(latest), 'term')
        and not redis.call('HGET', run_key(latest), 'lin') then
      found = latest
    end
  end
else
  found = live(redis.call('GET', p .. 'latest'))
end
local function attach(r)
  if mode == 'explicit' then return end
  redis.call('SET', p .. 'latest', r, 'PX', slot_ttl)
  if #ARGV >= 8 then
    redis.call('SET', p .. 'h:' .. ARGV[8], r, 'PX', slot_ttl)
    redis.call('HSET', run_key(r), 'lin', '1')
  end
end
if found then
  -- a call restarts the idle clock, a refused retry of a terminated episode too
  redis.call('PEXPIRE', run_key(found), idle)
  local started = redis.call('HGET', run_key(found), 'started') or '0'
  if redis.call('HGET', run_key(found), 'term') then return {'terminated', found, started} end
  attach(found)
  return {'existing', found, started}
end
local t = redis.call('TIME')
local started = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
redis.call('HSET', run_key(new), 'started', started)
redis.call('PEXPIRE', run_key(new), idle)
if mode == 'explicit' then
  redis.call('SET', p .. 'x:' .. name, new, 'PX', slot_ttl)
elseif mode == 'episode' then
  redis.call('SET', p .. 'ep:' .. name, new, 'PX', slot_ttl)
  redis.call('HSET', run_key(new), 'lin', '1')
end
attach(new)
return {'created', new, started}
"""

# Terminate a run: KEYS 1 run hash, 2 the explicit session's mark (or an unused key); ARGV 1 reason,
# 2 mark ms (0: none).
TERMINATE = r"""
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'term', ARGV[1]) end
if tonumber(ARGV[2]) > 0 then redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2]) end
return 1
"""

# Prevention configs: KEYS 1 revision, ARGV 1 snapshot key prefix, 2 snapshot, 3 ms to keep old ones,
# 4 the newest revision the publisher knows (revisions never repeat, even if Redis lost them).
PUBLISH_CONFIG = r"""
if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[4]) then redis.call('SET', KEYS[1], ARGV[4]) end
local rev = redis.call('INCR', KEYS[1])
redis.call('SET', ARGV[1] .. rev, ARGV[2])
if rev > 1 then redis.call('PEXPIRE', ARGV[1] .. (rev - 1), ARGV[3]) end
return rev
"""

# Responses chains. KEYS 1 the agent's chain key prefix; ARGV 1 newest response id, 2 limit, 3 idle
# seconds (each link read is kept that much longer). Returns id, blob, id, blob, ... newest first.
CHAIN = r"""
local out = {}
local id = ARGV[1]
for i = 1, tonumber(ARGV[2]) do
  local key = KEYS[1] .. id
  local v = redis.call('HMGET', key, 'b', 'p')
  if not v[1] then break end
  redis.call('EXPIRE', key, ARGV[3])
  out[#out + 1] = id
  out[#out + 1] = v[1]
  if not v[2] or v[2] == '' then break end
  id = v[2]
end
return out
"""

# KEYS 1 revision; ARGV 1 snapshot key prefix, 2 wanted revision ('' = current).
CONFIG_SNAPSHOT = r"""
local rev = ARGV[2]
if rev == '' then rev = redis.call('GET', KEYS[1]) or '0' end
return {rev, redis.call('GET', ARGV[1] .. rev) or ''}
"""

# A run's guard log. KEYS: 1 log list, 2 run hash (its expiry is the run's idle clock), 3 config
# revision, 4 pending function-calling tool calls, 5 MCP signatures recorded, 6.. slot keys kept
# alive, then slot keys linked to the run. ARGV[1]: header JSON {since, idle, logttl, mapttl,
# sigs (MCP signatures recorded), put (tool_call_id -> pending call JSON), take (tool_call_ids whose
# results arrived), take_at (the body before which their TOOL_CALL entries go; 0: none), alive (how
# many keep-alive keys), run (this run's id, for them), links (run id per link key), checks (what the
# admission's checks ask, proxy/admission/: {name, its check's position among the bodies, args,
# gate 1/0}, in admission order for each body)}; ARGV[2..]: entry bodies.
# A log that is not the one the replica followed (`since` beyond its end, or another `epoch`:
# the run hash's start stamp) appends nothing and returns first = 0.
# Stored entry: "<time> <config revision> <body>". Returns {seq of the first entry added, entries
# after `since`, {tool_call_id, detail, ...} of the calls taken, terminated mark or '', was live, epoch,
# per check its twin's reply ({'skip'}: its check was refused by an earlier gate, never asked), the
# positions a gate refused}.

# The time in a script: Redis TIME unless a test passes one (also the checks' own scripts).
CLOCK = r"""
local function clock(given)
  local now = tonumber(given)
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  end
  return now
end
"""
# Shared by the fragments: the clock, and the table of checks each fragment adds its function to
# (`CHECKS.<name> = function(args, now) return refused, reply end`).
PRELUDE = CLOCK + "local CHECKS = {}\n"

_APPEND = r"""
local h = cjson.decode(ARGV[1])
local epoch = redis.call('HGET', KEYS[2], 'started') or ''
if h.since > 0 and (redis.call('LLEN', KEYS[1]) < h.since or (h.epoch ~= '' and h.epoch ~= epoch)) then
  -- the log is not the one this replica has followed (Redis restarted without its data, or the
  -- run expired and started again): append nothing; the replica seeds it again or rebuilds (SEED)
  return {0, {}, {}, '', 0, epoch, {}, {}}
end
-- the gates (concurrent calls, rate limits) before anything is appended: a check one refuses is
-- not appended, and no later check is asked about it
local refused, answers = {}, {}
local gate_now = clock('')
for i, c in ipairs(h.checks) do
  if c[4] == 1 then
    if refused[c[2]] then
      answers[i] = {'skip'}
    else
      local no, reply = CHECKS[c[1]](c[3], gate_now)
      if no then refused[c[2]] = true end
      answers[i] = reply
    end
  end
end
local t = redis.call('TIME')
local now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
local stamp = now .. ' ' .. (redis.call('GET', KEYS[3]) or '0') .. ' '
local was_live = redis.call('EXISTS', KEYS[2])
redis.call('HDEL', KEYS[2], 'seeded')  -- entries appended after a seed: no longer only a seed
if was_live == 0 then
  redis.call('HSET', KEYS[2], 'started', now)
  epoch = now
end
local first = redis.call('LLEN', KEYS[1]) + 1
for _, sig in ipairs(h.sigs) do redis.call('HINCRBY', KEYS[5], sig, 1) end
for id, raw in pairs(h.put) do redis.call('HSET', KEYS[4], id, raw) end
local taken = {}
local function take()
  for _, id in ipairs(h.take) do
    local raw = redis.call('HGET', KEYS[4], id)
    if raw then
      redis.call('HDEL', KEYS[4], id)
      local p = cjson.decode(raw)
      local recorded = false
      for _, sig in ipairs(p.sigs) do
        if tonumber(redis.call('HGET', KEYS[5], sig) or '0') > 0 then
          redis.call('HINCRBY', KEYS[5], sig, -1)
          recorded = true
          break
        end
      end
      if not recorded then
        redis.call('RPUSH', KEYS[1], stamp .. p.ev)
        table.insert(taken, id)
        table.insert(taken, p.detail)
      end
    end
  end
end
for i = 2, #ARGV do
  if not refused[i - 1] then
    if i - 1 == h.take_at then take() end
    redis.call('RPUSH', KEYS[1], stamp .. ARGV[i])
  end
end
redis.call('PEXPIRE', KEYS[1], h.logttl)
redis.call('PEXPIRE', KEYS[2], h.idle)
redis.call('PEXPIRE', KEYS[4], h.idle)
redis.call('PEXPIRE', KEYS[5], h.idle)
for i = 1, h.alive do
  -- a slot naming this run lives as long as it can be live (set again if Redis lost it)
  local cur = redis.call('GET', KEYS[5 + i])
  if not cur then
    redis.call('SET', KEYS[5 + i], h.run, 'PX', h.mapttl)
  elseif cur == h.run then
    redis.call('PEXPIRE', KEYS[5 + i], h.mapttl)
  end
end
for j, run in ipairs(h.links) do redis.call('SET', KEYS[5 + h.alive + j], run, 'PX', h.mapttl) end
if #h.links > 0 then redis.call('HSET', KEYS[2], 'lin', '1') end
local term = redis.call('HGET', KEYS[2], 'term') or ''
-- the other checks of the checks appended (budget windows, the circuit), in the same step
local after_now = clock('')
for i, c in ipairs(h.checks) do
  if c[4] ~= 1 then
    if refused[c[2]] then
      answers[i] = {'skip'}  -- never goes upstream: nothing reserved, no trial taken
    else
      local _, reply = CHECKS[c[1]](c[3], after_now)
      answers[i] = reply
    end
  end
end
local no = {}
for at in pairs(refused) do table.insert(no, at) end
return {first, redis.call('LRANGE', KEYS[1], h.since, -1), taken, term, was_live, epoch, answers, no}
"""

# --- budgets over time (SPEC §9; proxy/state/windows.py) -----------------------------------------
# One hash per agent and window, `tripwire:window:<agent>:<period key>`: spent (USD), tokens,
# alerted (the soft alert fired), r:<hold id> = "<usd> <tokens> <reserved at>" per call in flight.
# A window Redis lost (restart, FLUSHALL) is put back from what the calling replica last saw of it
# (`w.spent`, `w.tokens`, `w.alerted`) before anything else: the replica writes back what it knows,
# as runs' logs are (SEED); until a reset, a replica that saw more raises it (`seeded`). `window_reserve(keys, h)` also runs inside APPEND (proxy/admission/budget_window/twin.py).
WINDOW_FUNCS = r"""
local function window_seed(k, w)
  if redis.call('EXISTS', k) == 0 then
    redis.call('HSET', k, 'spent', string.format('%.17g', w.spent), 'tokens', w.tokens,
      'alerted', w.alerted and '1' or '0', 'seeded', '1')
  elseif redis.call('HGET', k, 'seeded') == '1' then
    -- put back by a replica: one that saw more raises it (the most any replica saw wins, until a reset)
    if w.spent > tonumber(redis.call('HGET', k, 'spent')) then
      redis.call('HSET', k, 'spent', string.format('%.17g', w.spent))
    end
    if w.tokens > tonumber(redis.call('HGET', k, 'tokens')) then redis.call('HSET', k, 'tokens', w.tokens) end
    if w.alerted then redis.call('HSET', k, 'alerted', '1') end
  end
end
local function window_load(k, now, stale)
  local v = redis.call('HGETALL', k)
  local s = {spent = 0, tokens = 0, rusd = 0, rtok = 0, alerted = '0'}
  for j = 1, #v, 2 do
    local f, val = v[j], v[j + 1]
    if f == 'spent' then s.spent = tonumber(val)
    elseif f == 'tokens' then s.tokens = tonumber(val)
    elseif f == 'alerted' then s.alerted = val
    elseif string.sub(f, 1, 2) == 'r:' then
      local u, t, at = string.match(val, '^(%S+) (%S+) (%S+)$')
      if tonumber(at) < now - stale then
        redis.call('HDEL', k, f)  -- a reservation of a replica that died with the call in flight
      else
        s.rusd = s.rusd + tonumber(u)
        s.rtok = s.rtok + tonumber(t)
      end
    end
  end
  return s
end
-- h: {id, usd, tok, now, stale (s), place (reserve when admitted), force (shadow: reserve even when
-- refused), w: [{max_usd, max_tok (-1: none), ttl (ms), spent, tokens, alerted}]}. Returns {index of
-- the window that refuses (0: none), {spent, tokens, reserved usd, reserved tokens, alerted} per
-- window, as they were before this call's reservation}.
local function window_reserve(ks, h)
  local refused, rows = 0, {}
  for i, k in ipairs(ks) do
    local w = h.w[i]
    window_seed(k, w)
    local s = window_load(k, h.now, h.stale)
    if refused == 0 and ((w.max_usd >= 0 and s.spent + s.rusd >= w.max_usd)
        or (w.max_tok >= 0 and s.tokens + s.rtok >= w.max_tok)) then
      refused = i
    end
    rows[i] = {string.format('%.17g', s.spent), tostring(s.tokens), string.format('%.17g', s.rusd),
      tostring(s.rtok), s.alerted}
  end
  if h.place and (refused == 0 or h.force) then
    local hold = string.format('%.17g %d %.6f', h.usd, h.tok, h.now)
    for i, k in ipairs(ks) do
      redis.call('HSET', k, 'r:' .. h.id, hold)
      redis.call('PEXPIRE', k, h.w[i].ttl)
    end
  end
  return {refused, rows}
end
"""

# KEYS: the agent's windows; ARGV 1 the header of `window_reserve` (the API's read: place false).
WINDOW_RESERVE = (
    WINDOW_FUNCS
    + r"""
return window_reserve(KEYS, cjson.decode(ARGV[1]))
"""
)

# KEYS: the windows the call was admitted in. ARGV 1 {id, usd, tok, w: [{ttl, alert_usd, alert_tok
# (-1: none), spent, tokens, alerted}]}. Returns per window {spent, tokens, 1 if this settle crossed
# the soft alert first}.
WINDOW_SETTLE = (
    WINDOW_FUNCS
    + r"""
local h = cjson.decode(ARGV[1])
local out = {}
for i, k in ipairs(KEYS) do
  local w = h.w[i]
  window_seed(k, w)
  redis.call('HDEL', k, 'r:' .. h.id)
  local spent = tonumber(redis.call('HINCRBYFLOAT', k, 'spent', string.format('%.17g', h.usd)))
  local tokens = redis.call('HINCRBY', k, 'tokens', h.tok)
  local crossed = 0
  if (w.alert_usd >= 0 and spent >= w.alert_usd) or (w.alert_tok >= 0 and tokens >= w.alert_tok) then
    if redis.call('HGET', k, 'alerted') ~= '1' then
      redis.call('HSET', k, 'alerted', '1')
      crossed = 1
    end
  end
  redis.call('PEXPIRE', k, w.ttl)
  out[i] = {string.format('%.17g', spent), tostring(tokens), crossed}
end
return out
"""
)

# KEYS: windows. ARGV 1 {id}: a call never forwarded gives its reservations back.
WINDOW_RELEASE = r"""
local h = cjson.decode(ARGV[1])
for _, k in ipairs(KEYS) do redis.call('HDEL', k, 'r:' .. h.id) end
return 1
"""

# KEYS: windows. ARGV 1 {w: [{ttl}]}: spend back to zero; calls in flight keep their reservations.
WINDOW_RESET = r"""
local h = cjson.decode(ARGV[1])
for i, k in ipairs(KEYS) do
  redis.call('HSET', k, 'spent', '0', 'tokens', '0', 'alerted', '0')
  redis.call('HDEL', k, 'seeded')
  redis.call('PEXPIRE', k, h.w[i].ttl)
end
return 1
"""


def append_script(fragments: list[str]) -> str:
    """The APPEND script: the prelude, each check's fragment (proxy/admission/, in the list's
    order), then the log's own step, which asks them."""
    return PRELUDE + "".join(fragments) + _APPEND
