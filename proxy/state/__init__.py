"""Guard state shared by Tripwire replicas (SPEC §8; docs/scaling.md).

- `base`: the backend interface (`StateBackend`) and its types;
- `memory` / `redis_backend`: in process memory, and Redis (Lua scripts in `lua`, keys in `keys`);
- `entries` / `replica`: a run's guard log and the pure replay of it into `SessionGuards`;
- `shared`: one channel per run (group commit, background settles, outage handling);
- `configs`: the API-set prevention configs, by revision;
- `link`: reachability and the failure policy (fail_open / fail_closed).
"""
