"""Guard state in Redis (redis-py's asyncio client), for several Tripwire replicas (SPEC §8).

Each check-and-update is one Lua script (proxy/state/lua.py), run by EVALSHA (redis-py's
`register_script` loads it again after a Redis restart). Connection problems become
`StateUnavailable` quickly: short timeouts by default (the URL's `socket_timeout` /
`socket_connect_timeout` query parameters override them) and one immediate retry on a dropped
connection (a pooled socket that died with a restarted Redis), never a back-off that would hold a
call; the failure policy (proxy/state/policy.py) decides what a call gets meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import redis.asyncio as redis
from redis.exceptions import RedisError

from proxy.state import keys, lua
from proxy.state.base import (
    Append,
    Appended,
    LogEntry,
    Op,
    PendingCall,
    Resolved,
    ResolveMode,
    StateUnavailable,
    Twin,
)
from proxy.state.client import redis_client
from proxy.state.keys import LOG_GRACE_MS, ms, slot_ttl_ms
from proxy.state.redis_windows import RedisWindows

OLD_CONFIG_TTL_MS = 7 * 86_400_000  # superseded config snapshots, for replicas still replaying them


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def pending_json(call: PendingCall) -> str:
    return orjson.dumps(
        {"ev": call.event.decode(), "sigs": list(call.signatures), "detail": call.detail.decode()}
    ).decode()


def parse_entry(seq: int, raw: bytes | str) -> LogEntry:
    data = raw if isinstance(raw, bytes) else raw.encode()
    t, rev, body = data.split(b" ", 2)
    return LogEntry(seq, float(t), int(rev), body)


class RedisBackend:
    name = "redis"

    def __init__(self, url: str, *, client: redis.Redis | None = None, twins: Sequence[Twin] = ()) -> None:
        """`twins`: the admission's checks' twins (proxy/admission/), whose fragments the APPEND
        script is assembled from at start; a twin an append brings that was not given is added then."""
        self.url = url
        self._owns_client = client is None  # a client given is its owner's to close (the engine's)
        self.client = client if client is not None else redis_client(url)
        c = self.client
        self._twins: dict[str, Twin] = {}
        self._append: Any = None
        self._add_twins(twins)
        self._ops: dict[str, Any] = {}
        self._resolve = c.register_script(lua.RESOLVE)
        self._terminate = c.register_script(lua.TERMINATE)
        self._seed = c.register_script(lua.SEED)
        self._dataset = c.register_script(lua.DATASET)
        self._publish_config = c.register_script(lua.PUBLISH_CONFIG)
        self._config_snapshot = c.register_script(lua.CONFIG_SNAPSHOT)
        self._chain = c.register_script(lua.CHAIN)
        self.windows = RedisWindows(c)  # budgets over time (SPEC §9)

    def _add_twins(self, twins: Sequence[Twin]) -> None:
        new = [t for t in twins if t.name not in self._twins]
        if new or self._append is None:
            self._twins.update((t.name, t) for t in new)
            fragments = [t.lua for t in self._twins.values()]
            self._append = self.client.register_script(lua.append_script(fragments))

    async def _call(self, script: Any, keys_: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return await script(keys=list(keys_), args=list(args))
        except (RedisError, OSError) as e:
            raise StateUnavailable(f"redis: {type(e).__name__}: {e}") from e

    async def ping(self) -> None:
        try:
            await self.client.ping()
        except (RedisError, OSError) as e:
            raise StateUnavailable(f"redis: {type(e).__name__}: {e}") from e

    async def close(self) -> None:
        if self._owns_client:
            await self.client.aclose()

    # --- a run's guard log ---------------------------------------------------------------------

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
        keep_alive, links, checks = step.keep_alive, step.links, step.checks
        links = links or {}
        if any(c.twin.name not in self._twins for c in checks):
            self._add_twins([c.twin for c in checks])
        header = {
            "since": since,
            "epoch": epoch,
            "idle": ms(idle_s),
            "logttl": ms(idle_s) + LOG_GRACE_MS,
            "mapttl": slot_ttl_ms(idle_s),
            "sigs": list(signatures),
            "put": {call_id: pending_json(c) for call_id, c in (put or {}).items()},
            "take": list(take),
            "take_at": take_at if take else 0,
            "alive": len(keep_alive),
            "run": run_id,
            "links": list(links.values()),
            "checks": [[c.twin.name, c.at, c.twin.args(c.request), int(c.twin.gate)] for c in checks],
        }
        script_keys = [
            keys.log(agent, run_id),
            keys.run(agent, run_id),
            keys.CONFIG_REVISION,
            keys.pending(agent, run_id),
            keys.mcp_signatures(agent, run_id),
            *keep_alive,
            *links.keys(),
        ]
        first, raw, taken, term, was_live, started, answers, refused = await self._call(
            self._append, script_keys, [orjson.dumps(header), *bodies]
        )
        return Appended(
            entries=[parse_entry(since + 1 + i, r) for i, r in enumerate(raw)],
            first_own=int(first),
            taken=[(text(taken[i]), bytes(taken[i + 1])) for i in range(0, len(taken), 2)],
            terminated=text(term) or None,
            was_live=bool(was_live),
            epoch=text(started),
            answers=[
                None if r and r[0] in (b"skip", "skip") else c.twin.parse(c.request, r)
                for c, r in zip(checks, answers, strict=False)  # (none when the log was lost)
            ],
            refused=frozenset(int(at) for at in refused),
        )

    async def read(self, agent: str, run_id: str, *, since: int) -> list[LogEntry]:
        try:
            raw = await self.client.lrange(keys.log(agent, run_id), since, -1)
        except (RedisError, OSError) as e:
            raise StateUnavailable(f"redis: {type(e).__name__}: {e}") from e
        return [parse_entry(since + 1 + i, r) for i, r in enumerate(raw)]

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
        stored = [b"%.6f %d %s" % (e.t, e.config_rev, e.body) for e in log]
        header = {
            "idle": ms(idle_s),
            "logttl": ms(idle_s) + LOG_GRACE_MS,
            "mapttl": slot_ttl_ms(idle_s),
            "epoch": epoch,
            "term": terminated or "",
            "lin": lineage,
            "run": run_id,
        }
        n = await self._call(
            self._seed,
            [keys.log(agent, run_id), keys.run(agent, run_id), *slots],
            [orjson.dumps(header), *stored],
        )
        return bool(n)

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
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                for k in slots:
                    pipe.set(k, run_id, px=slot_ttl_ms(idle_s))
                if session_id:
                    pipe.delete(keys.slot_explicit_terminated(agent, session_id))
                pipe.set(keys.resumed_as(agent, old_run_id), run_id, px=max(1, ms(ttl_s)))
                await pipe.execute()
        except (RedisError, OSError) as e:
            raise StateUnavailable(f"redis: {type(e).__name__}: {e}") from e

    async def resumed_as(self, agent: str, run_id: str) -> str | None:
        try:
            found = await self.client.get(keys.resumed_as(agent, run_id))
        except (RedisError, OSError) as e:
            raise StateUnavailable(f"redis: {type(e).__name__}: {e}") from e
        return None if found is None else text(found)

    async def dataset(self, candidate: str) -> str:
        return text(await self._call(self._dataset, [keys.DATASET], [candidate]))

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
        args = [
            keys.agent_prefix(agent),
            mode,
            keys.part(new_run_id),
            ms(idle_s),
            slot_ttl_ms(idle_s),
            keys.part(name or ""),
            keys.part(previous_response_id or ""),
            *(keys.part(d) for d in history),
        ]
        outcome, run_id, started = await self._call(self._resolve, [], args)
        return Resolved(text(run_id), text(outcome), float(text(started)))  # type: ignore[arg-type]

    async def terminate(
        self, agent: str, run_id: str, reason: str, *, session_id: str | None = None, ttl_s: float = 0.0
    ) -> None:
        # without an explicit session id the mark key is a placeholder the script leaves alone
        mark = keys.slot_explicit_terminated(agent, session_id) if session_id else keys.run(agent, run_id)
        await self._call(
            self._terminate,
            [keys.run(agent, run_id), mark],
            [reason, ms(ttl_s) if session_id else 0],
        )

    async def live_runs(
        self, agent_runs: Sequence[tuple[str, str]], *, idle_s: float | None = None
    ) -> list[bool]:
        if not agent_runs:
            return []
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for agent, run_id in agent_runs:
                    if idle_s is None:
                        pipe.exists(keys.run(agent, run_id))
                    else:
                        pipe.pexpire(keys.run(agent, run_id), ms(idle_s))
                return [bool(x) for x in await pipe.execute()]
        except (RedisError, OSError) as e:
            raise StateUnavailable(f"redis: {type(e).__name__}: {e}") from e

    # --- the checks' own operations ------------------------------------------------------------

    async def run(self, op: Op, request: Any) -> Any:
        script = self._ops.get(op.name)
        if script is None:
            script = self._ops[op.name] = self.client.register_script(op.lua)
        return op.parse(request, await self._call(script, op.keys(request), op.args(request)))

    # --- prevention configs --------------------------------------------------------------------

    async def publish_config(self, snapshot: bytes, *, after: int = 0) -> int:
        rev = await self._call(
            self._publish_config,
            [keys.CONFIG_REVISION],
            [keys.CONFIG_SNAPSHOT, snapshot, OLD_CONFIG_TTL_MS, after],
        )
        return int(rev)

    async def put_links(
        self, agent: str, links: Mapping[str, tuple[bytes, str | None]], *, idle_s: float
    ) -> None:
        ttl = max(1, int(idle_s) + 1)
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for response_id, (blob, parent) in links.items():
                    key = keys.chain_link(agent, response_id)
                    pipe.hset(key, mapping={"b": blob, "p": parent or ""})
                    pipe.expire(key, ttl)
                await pipe.execute()
        except (RedisError, OSError) as e:
            raise StateUnavailable(f"redis: {type(e).__name__}: {e}") from e

    async def chain(
        self, agent: str, response_id: str, *, limit: int, idle_s: float
    ) -> list[tuple[str, bytes]]:
        prefix = keys.chain_link(agent, "")
        ttl = max(1, int(idle_s) + 1)
        flat = await self._call(self._chain, [prefix], [keys.part(response_id), limit, ttl])
        return [(bytes(flat[i]).decode(), bytes(flat[i + 1])) for i in range(0, len(flat), 2)]

    async def config_snapshot(self, revision: int | None = None) -> tuple[int, bytes | None]:
        rev, snapshot = await self._call(
            self._config_snapshot,
            [keys.CONFIG_REVISION],
            [keys.CONFIG_SNAPSHOT, "" if revision is None else revision],
        )
        return int(rev), (bytes(snapshot) or None)
