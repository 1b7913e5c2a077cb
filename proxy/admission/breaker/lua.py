"""The circuit breaker's Lua (twin.py): its fragment of the APPEND script and its own scripts."""

from __future__ import annotations

from proxy.state.lua import CLOCK

# Circuit breaker of one agent x upstream (proxy/guards/breaker.py's CircuitBreaker; state in a hash:
# s state, f consecutive failures, o opened at, ta trials admitted, g generation; a agent, u upstream).
# `breaker(k, index, now, agent, upstream, ttl)` loads it; `admit(b, enabled, cooldown, half_max)`
# returns {verdict, generation, trial, transition from ('' none), failures, retry_after, state}.
FUNCS = r"""
local function breaker(k, index, now, agent, upstream, ttl)
  local st = redis.call('HMGET', k, 's', 'f', 'o', 'ta', 'g')
  local b = {k = k, index = index, now = now, agent = agent, upstream = upstream, ttl = ttl,
    s = st[1] or 'closed', f = tonumber(st[2] or '0'), o = tonumber(st[3] or ''),
    ta = tonumber(st[4] or '0'), g = tonumber(st[5] or '0')}
  return b
end
local function save(b)
  redis.call('HSET', b.k, 's', b.s, 'f', b.f, 'ta', b.ta, 'g', b.g, 'a', b.agent, 'u', b.upstream)
  if b.o then redis.call('HSET', b.k, 'o', string.format('%.6f', b.o)) end
  redis.call('PEXPIRE', b.k, b.ttl)
  redis.call('SADD', b.index, b.k)
end
local function admit(b, enabled, cooldown, half_max)
  if enabled == '0' then return {'allow', b.g, 0, '', b.f, '0', b.s} end
  local function left()
    if b.s ~= 'open' or not b.o then return 0 end
    return math.max(0, b.o + tonumber(cooldown) - b.now)
  end
  local moved = ''
  if b.s == 'open' and left() <= 0 then
    moved = b.s
    b.s = 'half_open'
    b.g = b.g + 1
    b.ta = 0
    save(b)
  end
  if b.s == 'closed' then return {'allow', b.g, 0, '', b.f, '0', b.s} end
  if b.s == 'half_open' and b.ta < tonumber(half_max) then
    b.ta = b.ta + 1
    save(b)
    return {'allow', b.g, 1, moved, b.f, '0', b.s}
  end
  return {'refuse', b.g, 0, '', b.f, tostring(left()), b.s}
end
"""

# args: {key, agent, upstream, ttl ms, enabled, cooldown, half-open max, index}
LUA = (
    FUNCS
    + r"""
CHECKS.breaker = function(a, now)
  local b = breaker(a[1], a[8], now, a[2], a[3], a[4])
  return false, admit(b, a[5], a[6], a[7])
end
"""
)

# KEYS: 1 breaker hash, 2 index of breakers. ARGV: 1 now ('' = TIME), 2 agent, 3 upstream, 4 ttl ms,
# 5 enabled, 6 cooldown, 7 half-open max.
ADMIT_LUA = (
    CLOCK
    + FUNCS
    + r"""
local b = breaker(KEYS[1], KEYS[2], clock(ARGV[1]), ARGV[2], ARGV[3], ARGV[4])
return admit(b, ARGV[5], ARGV[6], ARGV[7])
"""
)

# ARGV: 1 now, 2 agent, 3 upstream, 4 ttl ms, 5 enabled, 6 open after, 7 ticket generation,
# 8 ticket trial (0/1), 9 failed (0/1). Returns {} or {from, to, failures, reason}.
REPORT_LUA = (
    CLOCK
    + FUNCS
    + r"""
local b = breaker(KEYS[1], KEYS[2], clock(ARGV[1]), ARGV[2], ARGV[3], ARGV[4])
if tonumber(ARGV[7]) ~= b.g then return {} end
local trial = ARGV[8] == '1'
local function move(new, reason)
  local old = b.s
  b.s = new
  b.g = b.g + 1
  b.ta = 0
  save(b)
  return {old, new, b.f, reason}
end
if ARGV[9] == '0' then
  if b.s == 'half_open' and trial then
    b.f = 0
    return move('closed', 'trial call succeeded')
  end
  if b.s == 'closed' and b.f ~= 0 then
    b.f = 0
    save(b)
  end
  return {}
end
if ARGV[5] == '0' then return {} end
b.f = b.f + 1
if b.s == 'half_open' and trial then
  b.o = b.now
  return move('open', 'trial call failed')
end
if b.s == 'closed' and b.f >= tonumber(ARGV[6]) then
  b.o = b.now
  return move('open', b.f .. ' consecutive failures')
end
save(b)
return {}
"""
)

# ARGV: 1 now, 2 agent, 3 upstream, 4 ttl ms, 5 ticket generation.
RELEASE_LUA = (
    CLOCK
    + FUNCS
    + r"""
local b = breaker(KEYS[1], KEYS[2], clock(ARGV[1]), ARGV[2], ARGV[3], ARGV[4])
if tonumber(ARGV[5]) == b.g and b.ta > 0 then
  b.ta = b.ta - 1
  save(b)
end
return 1
"""
)

# The circuits stored (the admin API's view): KEYS 1 the index; drops keys that expired.
VIEW_LUA = r"""
local out = {}
for _, k in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local row = redis.call('HMGET', k, 'a', 'u', 's', 'f')
  if row[1] then table.insert(out, row) else redis.call('SREM', KEYS[1], k) end
end
return out
"""
