"""What Tripwire replicas share (SPEC §8; docs/scaling.md), as storage primitives that know nothing
of guards (import-linter forbids proxy.state -> proxy.guards): what a run's guard log, a check's
twin, a budget window are is proxy/guard_log/'s, proxy/admission/'s and proxy/guard_backend/'s.

- `base`: the backend interface (`StateBackend`: the log, runs, the checks' twins and operations);
- `memory` / `redis_backend`: in process memory, and Redis (Lua scripts in `lua`, keys in `keys`);
- `client`: the one Redis client (guard state, approvals, agent keys);
- `windows` / `redis_windows`: the agents' budget windows, stored;
- `link`: reachability and the failure policy (fail_open / fail_closed).
"""
