"""A run's guard log shared by replicas (SPEC §8; docs/scaling.md), over the storage of proxy/state/.

- `entries` / `replica`: the log's entries and the pure replay of them into `SessionGuards`;
- `channel`: one channel per run (group commit, background settles, outage handling), which asks the
  admission's checks (proxy/admission/) in the same round trip as the check it appends;
- `configs`: the API-set prevention configs, by revision;
- `service`: `SharedState`, what the engine holds (the backend, the link, every run's channel).
"""
