"""The guard-state backend in process memory: the same rules as the Redis scripts, no service.

It is what one process needs (nothing to share), the reference the Redis backend is tested against
(tests/test_state_backend.py runs one contract on both), and what the benchmark compares Redis to.
Keys expire as in Redis; the clock is passed in (wall seconds, as Redis `TIME`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from proxy.state import keys
from proxy.state.base import Append, Appended, LogEntry, Op, PendingCall, Resolved, ResolveMode
from proxy.state.keys import LOG_GRACE_MS, slot_ttl_ms
from proxy.state.windows import MemoryWindows

Clock = Callable[[], float]


class _Expiring:
    """key -> value with an optional deadline, read lazily as Redis does."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._data: dict[str, tuple[Any, float | None]] = {}

    def get(self, key: str) -> Any:
        item = self._data.get(key)
        if item is None:
            return None
        value, deadline = item
        if deadline is not None and self.clock() >= deadline:
            del self._data[key]
            return None
        return value

    def set(self, key: str, value: Any, ttl_s: float | None = None) -> None:
        self._data[key] = (value, None if ttl_s is None else self.clock() + ttl_s)

    def expire(self, key: str, ttl_s: float) -> bool:
        value = self.get(key)
        if value is None:
            return False
        self._data[key] = (value, self.clock() + ttl_s)
        return True

    def delete(self, key: str) -> None:
        self._data.pop(key, None)

    def setdefault(self, key: str, factory: Callable[[], Any]) -> Any:
        value = self.get(key)
        if value is None:
            value = factory()
            self._data[key] = (value, None)
        return value


class MemoryBackend:
    name = "memory"

    def __init__(self, clock: Clock = time.time) -> None:
        self.clock = clock
        self._keys = _Expiring(clock)
        self._stores: dict[str, dict[Any, Any]] = {}  # each check's twin's (proxy/admission/)
        self._config_rev = 0
        self._configs: dict[int, bytes] = {}
        self.windows = MemoryWindows()  # budgets over time (SPEC §9)

    def store(self, name: str) -> dict[Any, Any]:
        """What the check `name`'s twin keeps here (its `memory` rule reads and updates it)."""
        found = self._stores.get(name)
        if found is None:
            found = self._stores[name] = {"windows": self.windows} if name == "budget_window" else {}
        return found

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None

    # --- a run's guard log ---------------------------------------------------------------------

    def _run_hash(self, agent: str, run_id: str) -> dict[str, str] | None:
        value: dict[str, str] | None = self._keys.get(keys.run(agent, run_id))
        return value

    async def append(self, step: Append) -> Appended:
        agent, run_id, bodies, since, idle_s, epoch = (
            step.agent,
            step.run_id,
            step.bodies,
            step.since,
            step.idle_s,
            step.epoch,
        )
        take, take_at, put, signatures = step.take, step.take_at, step.put, step.signatures
        keep_alive, links = step.keep_alive, step.links
        now = self.clock()
        run_key = keys.run(agent, run_id)
        log: list[LogEntry] = self._keys.setdefault(keys.log(agent, run_id), list)
        run = self._run_hash(agent, run_id)
        current = run["started"] if run is not None else ""
        if since > 0 and (since > len(log) or (epoch and epoch != current)):
            return Appended([], 0, epoch=current)  # not the log the caller followed
        was_live = run is not None
        if run is not None:
            run.pop("seeded", None)  # entries appended after a seed: no longer only a seed
        if run is None:
            run = {"started": f"{now:.6f}"}
            self._keys.set(run_key, run)
        pending: dict[str, PendingCall] = self._keys.setdefault(keys.pending(agent, run_id), dict)
        sigs: dict[str, int] = self._keys.setdefault(keys.mcp_signatures(agent, run_id), dict)
        # the gates before anything is appended: a check one refuses is not appended, nor asked further
        answers: list[Any] = [None] * len(step.checks)
        refused: set[int] = set()
        for i, ask in enumerate(step.checks):
            if ask.twin.gate and ask.at not in refused:
                no, answers[i] = ask.twin.memory(self, ask.request, now)
                if no:
                    refused.add(ask.at)
        first = len(log) + 1
        rev = self._config_rev
        for sig in signatures:
            sigs[sig] = sigs.get(sig, 0) + 1
        pending.update(put or {})
        taken: list[tuple[str, bytes]] = []

        def take_now() -> None:
            for call_id in take:
                call = pending.pop(call_id, None)
                if call is None:
                    continue
                recorded = next((s for s in call.signatures if sigs.get(s, 0) > 0), None)
                if recorded is not None:
                    sigs[recorded] -= 1
                    continue
                log.append(LogEntry(len(log) + 1, now, rev, call.event))
                taken.append((call_id, call.detail))

        for i, body in enumerate(bodies, start=1):
            if i in refused:
                continue
            if i == take_at:
                take_now()
            log.append(LogEntry(len(log) + 1, now, rev, bytes(body)))
        self._keys.expire(keys.log(agent, run_id), idle_s + LOG_GRACE_MS / 1000)
        for k in (run_key, keys.pending(agent, run_id), keys.mcp_signatures(agent, run_id)):
            self._keys.expire(k, idle_s)
        slot_s = slot_ttl_ms(idle_s) / 1000
        for k in keep_alive:
            current = self._keys.get(k)
            if current is None:
                self._keys.set(k, run_id, slot_s)
            elif current == run_id:
                self._keys.expire(k, slot_s)
        for k, target in (links or {}).items():
            self._keys.set(k, target, slot_s)
        if links:
            run["lin"] = "1"
        # the other checks (budget windows, the circuit): not asked for a check a gate refused
        for i, ask in enumerate(step.checks):
            if not ask.twin.gate and ask.at not in refused:
                _, answers[i] = ask.twin.memory(self, ask.request, now)
        return Appended(
            list(log[since:]),
            first,
            taken,
            run.get("term"),
            was_live,
            run["started"],
            answers,
            frozenset(refused),
        )

    async def read(self, agent: str, run_id: str, *, since: int) -> list[LogEntry]:
        log: list[LogEntry] = self._keys.get(keys.log(agent, run_id)) or []
        return list(log[since:])

    async def seed(
        self,
        agent: str,
        run_id: str,
        log: Sequence[LogEntry],
        *,
        idle_s: float,
        epoch: str = "",
        terminated: str | None = None,
        lineage: bool = False,
        slots: Sequence[str] = (),
    ) -> bool:
        current: list[LogEntry] = self._keys.setdefault(keys.log(agent, run_id), list)
        run = self._run_hash(agent, run_id)
        if run is None:
            run = {"started": epoch or f"{self.clock():.6f}"}
            self._keys.set(keys.run(agent, run_id), run)
        if terminated and "term" not in run:
            run["term"] = terminated
        if lineage:
            run["lin"] = "1"
        only_seed = len(current) == int(run.get("seeded", -1)) and epoch in ("", run["started"])
        went_in = bool(log) and (not current or (len(log) > len(current) and only_seed))
        if went_in:
            current.extend(log[len(current) :])
            run["seeded"] = str(len(log))
        slot_s = slot_ttl_ms(idle_s) / 1000
        for k in slots:
            named = self._keys.get(k)
            if named is None:
                self._keys.set(k, run_id, slot_s)
            elif named == run_id:
                self._keys.expire(k, slot_s)
        self._keys.expire(keys.run(agent, run_id), idle_s)
        self._keys.expire(keys.log(agent, run_id), idle_s + LOG_GRACE_MS / 1000)
        return went_in

    async def dataset(self, candidate: str) -> str:
        found: str = self._keys.setdefault(keys.DATASET, lambda: candidate)
        return found

    async def resume(
        self,
        agent: str,
        old_run_id: str,
        run_id: str,
        *,
        slots: Sequence[str],
        idle_s: float,
        ttl_s: float,
        session_id: str | None = None,
    ) -> None:
        slot_s = slot_ttl_ms(idle_s) / 1000
        for k in slots:
            self._keys.set(k, run_id, slot_s)
        if session_id:
            self._keys.delete(keys.slot_explicit_terminated(agent, session_id))
        self._keys.set(keys.resumed_as(agent, old_run_id), run_id, ttl_s)

    async def resumed_as(self, agent: str, run_id: str) -> str | None:
        found = self._keys.get(keys.resumed_as(agent, run_id))
        return None if found is None else str(found)

    async def resolve(
        self,
        agent: str,
        mode: ResolveMode,
        new_run_id: str,
        *,
        idle_s: float,
        name: str | None = None,
        previous_response_id: str | None = None,
        history: Sequence[str] = (),
    ) -> Resolved:
        get = self._keys.get
        slot_s = slot_ttl_ms(idle_s) / 1000

        def live(run_id: str | None) -> str | None:
            return run_id if run_id is not None and self._run_hash(agent, run_id) is not None else None

        found: str | None = None
        if mode == "explicit":
            assert name is not None
            if get(keys.slot_explicit_terminated(agent, name)) is not None:
                return Resolved(get(keys.slot_explicit(agent, name)) or "", "terminated", 0.0)
            found = live(get(keys.slot_explicit(agent, name)))
        elif mode == "episode":
            assert name is not None
            found = live(get(keys.slot_episode(agent, name)))
        elif mode in ("lineage", "first"):
            if previous_response_id:
                found = live(get(keys.slot_response(agent, previous_response_id)))
            for digest in history if mode == "lineage" else ():  # a first request continues nothing
                if found is not None:
                    break
                found = live(get(keys.slot_history(agent, digest)))
            if found is None:
                latest = live(get(keys.slot_latest(agent)))
                run = self._run_hash(agent, latest) if latest is not None else None
                if run is not None and "term" not in run and "lin" not in run:
                    found = latest
        else:
            found = live(get(keys.slot_latest(agent)))

        def attach(run_id: str) -> None:
            if mode == "explicit":
                return
            self._keys.set(keys.slot_latest(agent), run_id, slot_s)
            if history:
                self._keys.set(keys.slot_history(agent, history[0]), run_id, slot_s)
                run = self._run_hash(agent, run_id)
                assert run is not None
                run["lin"] = "1"

        if found is not None:
            self._keys.expire(keys.run(agent, found), idle_s)
            run = self._run_hash(agent, found)
            assert run is not None
            started = float(run.get("started", "0"))
            if "term" in run:
                return Resolved(found, "terminated", started)
            attach(found)
            return Resolved(found, "existing", started)
        now = self.clock()
        run = {"started": f"{now:.6f}"}
        self._keys.set(keys.run(agent, new_run_id), run, idle_s)
        if mode == "explicit":
            assert name is not None
            self._keys.set(keys.slot_explicit(agent, name), new_run_id, slot_s)
        elif mode == "episode":
            assert name is not None
            self._keys.set(keys.slot_episode(agent, name), new_run_id, slot_s)
            run["lin"] = "1"
        attach(new_run_id)
        return Resolved(new_run_id, "created", float(run["started"]))

    async def terminate(
        self, agent: str, run_id: str, reason: str, *, session_id: str | None = None, ttl_s: float = 0.0
    ) -> None:
        run = self._run_hash(agent, run_id)
        if run is not None:
            run["term"] = reason
        if session_id:
            self._keys.set(keys.slot_explicit_terminated(agent, session_id), reason, ttl_s)

    async def live_runs(
        self, agent_runs: Sequence[tuple[str, str]], *, idle_s: float | None = None
    ) -> list[bool]:
        if idle_s is None:
            return [self._run_hash(a, r) is not None for a, r in agent_runs]
        return [self._keys.expire(keys.run(a, r), idle_s) for a, r in agent_runs]

    # --- the checks' own operations ------------------------------------------------------------

    async def run(self, op: Op, request: Any) -> Any:
        return op.memory(self, request, self.clock())

    # --- prevention configs --------------------------------------------------------------------

    async def publish_config(self, snapshot: bytes, *, after: int = 0) -> int:
        self._config_rev = max(self._config_rev, after) + 1
        self._configs[self._config_rev] = bytes(snapshot)
        return self._config_rev

    async def put_links(
        self, agent: str, links: Mapping[str, tuple[bytes, str | None]], *, idle_s: float
    ) -> None:
        for response_id, (blob, parent) in links.items():
            self._keys.set(keys.chain_link(agent, response_id), (blob, parent), idle_s)

    async def chain(
        self, agent: str, response_id: str, *, limit: int, idle_s: float
    ) -> list[tuple[str, bytes]]:
        out: list[tuple[str, bytes]] = []
        rid: str | None = response_id
        while rid and len(out) < limit:
            key = keys.chain_link(agent, rid)
            found = self._keys.get(key)
            if found is None:
                break
            self._keys.expire(key, idle_s)
            out.append((rid, found[0]))
            rid = found[1]
        return out

    async def config_snapshot(self, revision: int | None = None) -> tuple[int, bytes | None]:
        rev = self._config_rev if revision is None else revision
        return rev, self._configs.get(rev)
