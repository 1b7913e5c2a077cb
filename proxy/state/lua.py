"""The Redis backend's Lua scripts: each check-and-update that replicas must not interleave is one
script, run atomically by Redis in one round trip (EVALSHA via redis-py's `register_script`).

Times come from Redis `TIME` (one clock for every replica) unless a test passes one. Floats are
returned as strings: Redis turns Lua numbers into integers. `MemoryBackend` implements the same
rules in Python; tests/test_state_backend.py runs one contract against both.
"""

from __future__ import annotations

# A run's guard log. KEYS: 1 log list, 2 run hash (its expiry is the run's idle clock), 3 config
# revision, 4 pending function-calling tool calls, 5 MCP signatures recorded, 6.. slot keys kept
# alive, then slot keys linked to the run. ARGV[1]: header JSON {since, idle, logttl, mapttl,
# sigs (MCP signatures recorded), put (tool_call_id -> pending call JSON), take (tool_call_ids whose
# results arrived), take_at (the body before which their TOOL_CALL entries go; 0: none), alive (how
# many keep-alive keys), run (this run's id, for them), links (run id per link key)}; ARGV[2..]: entry
# bodies. A log that is not the one the replica followed (`since` beyond its end, or another `epoch`:
# the run hash's start stamp) appends nothing and returns first = 0.
# Stored entry: "<time> <config revision> <body>". Returns {seq of the first entry added, entries
# after `since`, {tool_call_id, detail, ...} of the calls taken, terminated mark or '', was live, epoch}.
APPEND = r"""
local h = cjson.decode(ARGV[1])
local epoch = redis.call('HGET', KEYS[2], 'started') or ''
if h.since > 0 and (redis.call('LLEN', KEYS[1]) < h.since or (h.epoch ~= '' and h.epoch ~= epoch)) then
  -- the log is not the one this replica has followed (Redis restarted without its data, or the
  -- run expired and started again): append nothing; the replica seeds it again or rebuilds (SEED)
  return {0, {}, {}, '', 0, epoch}
end
local t = redis.call('TIME')
local now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
local stamp = now .. ' ' .. (redis.call('GET', KEYS[3]) or '0') .. ' '
local was_live = redis.call('EXISTS', KEYS[2])
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
  if i - 1 == h.take_at then take() end
  redis.call('RPUSH', KEYS[1], stamp .. ARGV[i])
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
return {first, redis.call('LRANGE', KEYS[1], h.since, -1), taken, term, was_live, epoch}
"""

# Seed a run's log again from a replica's copy after Redis lost it: KEYS 1 log, 2 run hash;
# ARGV 1 idle ms, 2 log ms, 3.. stored entries. Only into an empty log (one replica seeds, the others
# read what it seeded). Returns the log's length, or 0 when it was not empty.
SEED = r"""
if redis.call('LLEN', KEYS[1]) > 0 then return 0 end
for i = 3, #ARGV do redis.call('RPUSH', KEYS[1], ARGV[i]) end
if redis.call('EXISTS', KEYS[2]) == 0 then
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[2], 'started', t[1] .. '.' .. string.format('%06d', tonumber(t[2])))
end
redis.call('PEXPIRE', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('LLEN', KEYS[1])
"""

# The run of a call (SPEC §3), found or created in one step so two replicas never start two runs
# for one session. ARGV: 1 key prefix of the agent, 2 mode, 3 new run id, 4 idle ms, 5 slot ms,
# 6 explicit session id or announced episode id, 7 previous_response_id, 8.. history digests,
# longest first. Returns {outcome, run id, started}.
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
elseif mode == 'lineage' then
  if prev ~= '' then found = live(redis.call('GET', p .. 'resp:' .. prev)) end
  local i = 8
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

# Circuit breaker of one agent x upstream (proxy/guards/breaker.py's CircuitBreaker, state in a hash:
# s state, f consecutive failures, o opened at, ta trials admitted, g generation).
_BREAKER_LOAD = r"""
local k = KEYS[1]
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local st = redis.call('HMGET', k, 's', 'f', 'o', 'ta', 'g')
local s = st[1] or 'closed'
local f = tonumber(st[2] or '0')
local o = tonumber(st[3] or '')
local ta = tonumber(st[4] or '0')
local g = tonumber(st[5] or '0')
local function save()
  redis.call('HSET', k, 's', s, 'f', f, 'ta', ta, 'g', g, 'a', ARGV[2], 'u', ARGV[3])
  if o then redis.call('HSET', k, 'o', string.format('%.6f', o)) end
  redis.call('PEXPIRE', k, ARGV[4])
  redis.call('SADD', KEYS[2], k)
end
"""

# ARGV: 1 now ('' = TIME), 2 agent, 3 upstream, 4 ttl ms, 5 enabled, 6 cooldown, 7 half-open max.
# Returns {verdict, generation, trial, transition from ('' none), failures, retry_after, state}.
BREAKER_ADMIT = (
    _BREAKER_LOAD
    + r"""
if ARGV[5] == '0' then return {'allow', g, 0, '', f, '0', s} end
local cooldown = tonumber(ARGV[6])
local function left()
  if s ~= 'open' or not o then return 0 end
  return math.max(0, o + cooldown - now)
end
local moved = ''
if s == 'open' and left() <= 0 then
  moved = s
  s = 'half_open'
  g = g + 1
  ta = 0
  save()
end
if s == 'closed' then return {'allow', g, 0, '', f, '0', s} end
if s == 'half_open' and ta < tonumber(ARGV[7]) then
  ta = ta + 1
  save()
  return {'allow', g, 1, moved, f, '0', s}
end
return {'refuse', g, 0, '', f, tostring(left()), s}
"""
)

# ARGV: 1 now, 2 agent, 3 upstream, 4 ttl ms, 5 enabled, 6 open after, 7 ticket generation,
# 8 ticket trial (0/1), 9 failed (0/1). Returns {} or {from, to, failures, reason}.
BREAKER_REPORT = (
    _BREAKER_LOAD
    + r"""
if tonumber(ARGV[7]) ~= g then return {} end
local trial = ARGV[8] == '1'
local function move(new, reason)
  local old = s
  s = new
  g = g + 1
  ta = 0
  save()
  return {old, new, f, reason}
end
if ARGV[9] == '0' then
  if s == 'half_open' and trial then
    f = 0
    return move('closed', 'trial call succeeded')
  end
  if s == 'closed' and f ~= 0 then
    f = 0
    save()
  end
  return {}
end
if ARGV[5] == '0' then return {} end
f = f + 1
if s == 'half_open' and trial then
  o = now
  return move('open', 'trial call failed')
end
if s == 'closed' and f >= tonumber(ARGV[6]) then
  o = now
  return move('open', f .. ' consecutive failures')
end
save()
return {}
"""
)

# ARGV: 1 now, 2 agent, 3 upstream, 4 ttl ms, 5 ticket generation.
BREAKER_RELEASE = (
    _BREAKER_LOAD
    + r"""
if tonumber(ARGV[5]) == g and ta > 0 then
  ta = ta - 1
  save()
end
return 1
"""
)

# Prevention configs: KEYS 1 revision, ARGV 1 snapshot key prefix, 2 snapshot, 3 ms to keep old ones,
# 4 the newest revision the publisher knows (revisions never repeat, even if Redis lost them).
PUBLISH_CONFIG = r"""
if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[4]) then redis.call('SET', KEYS[1], ARGV[4]) end
local rev = redis.call('INCR', KEYS[1])
redis.call('SET', ARGV[1] .. rev, ARGV[2])
if rev > 1 then redis.call('PEXPIRE', ARGV[1] .. (rev - 1), ARGV[3]) end
return rev
"""

# KEYS 1 revision; ARGV 1 snapshot key prefix, 2 wanted revision ('' = current).
CONFIG_SNAPSHOT = r"""
local rev = ARGV[2]
if rev == '' then rev = redis.call('GET', KEYS[1]) or '0' end
return {rev, redis.call('GET', ARGV[1] .. rev) or ''}
"""
