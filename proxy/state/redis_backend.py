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
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from proxy.guards.breaker import State, Ticket, Transition, refusal
from proxy.guards.config import CircuitBreakerConfig
from proxy.guards.rate_limit import RateRefusal
from proxy.state import keys, lua
from proxy.state.base import (
    Append,
    Appended,
    BreakerAdmission,
    BreakerView,
    LogEntry,
    PendingCall,
    RateRequest,
    Resolved,
    ResolveMode,
    StateUnavailable,
)
from proxy.state.keys import LOG_GRACE_MS, ms, slot_ttl_ms
from proxy.state.redis_windows import RedisWindows
from proxy.state.windows import parse_reserved

# A reply or a connection slower than this marks Redis down (the failure policy applies until a probe
# gets through). Generous enough that a busy machine is not taken for an outage: 0.5 s connects
# failed under two CPU hogs when 50 calls opened connections at once.
CONNECT_TIMEOUT_S = 2.0
SOCKET_TIMEOUT_S = 2.0
# Connections per replica: concurrent commands beyond this wait for one (no connection storm when
# many calls arrive at once; a run's checks go in one round trip anyway).
MAX_CONNECTIONS = 16
BREAKER_TTL_MS = 7 * 86_400_000  # a breaker nobody called for a week is closed again
OLD_CONFIG_TTL_MS = 7 * 86_400_000  # superseded config snapshots, for replicas still replaying them


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def pending_json(call: PendingCall) -> str:
    return orjson.dumps(
        {"ev": call.event.decode(), "sigs": list(call.signatures), "detail": call.detail.decode()}
    ).decode()


def admit_args(config: CircuitBreakerConfig) -> list[Any]:
    return [int(config.enabled), repr(float(config.cooldown_seconds)), config.half_open_max_calls]


def admission(upstream: str, reply: Sequence[Any], config: CircuitBreakerConfig) -> BreakerAdmission:
    """A breaker script's admit answer as the pure breaker gives it (a ticket, or a refusal)."""
    verdict, gen, trial, moved, failures, left, state = reply
    if text(verdict) == "allow":
        transition = None
        if text(moved):
            transition = Transition(
                upstream, State(text(moved)), State.HALF_OPEN, int(failures), "cooldown elapsed"
            )
        return BreakerAdmission(Ticket(int(gen), trial=bool(int(trial)), transition=transition), None)
    return BreakerAdmission(
        None, refusal(upstream, State(text(state)), int(failures), float(text(left)), config)
    )


def rate_asks(rates: Sequence[tuple[int, RateRequest]]) -> list[Any]:
    """The rate limits to admit checks through, as the append script's `rate_admit` takes them."""
    return [
        [
            at,
            r.member,
            [
                [
                    keys.rate(r.agent, rule.key),
                    rule.max_calls,
                    repr(float(rule.per_s)),
                    min(need, rule.max_calls),
                ]
                for rule, need in zip(r.rules, r.slots or (1,) * len(r.rules), strict=True)
            ],
        ]
        for at, r in rates
    ]


def rate_answer(request: RateRequest, reply: Sequence[Any]) -> RateRefusal | None:
    """`rate_admit`'s answer for one check: None admitted, else the refusal of its fullest rule."""
    hit, wait, held = reply
    if int(hit) == 0:
        return None
    return RateRefusal(request.rules[int(hit) - 1], int(held), float(text(wait)))


def parse_entry(seq: int, raw: bytes | str) -> LogEntry:
    data = raw if isinstance(raw, bytes) else raw.encode()
    t, rev, body = data.split(b" ", 2)
    return LogEntry(seq, float(t), int(rev), body)


class RedisBackend:
    name = "redis"

    def __init__(self, url: str, *, client: redis.Redis | None = None) -> None:
        self.url = url
        if client is None:
            pool = redis.BlockingConnectionPool.from_url(
                url,
                max_connections=MAX_CONNECTIONS,
                timeout=SOCKET_TIMEOUT_S,  # waiting for a free connection
                socket_connect_timeout=CONNECT_TIMEOUT_S,
                socket_timeout=SOCKET_TIMEOUT_S,
                retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
                retry_on_error=[RedisConnectionError],
            )
            client = redis.Redis(connection_pool=pool)
            client.auto_close_connection_pool = True  # aclose() closes the pool too
        self.client = client
        c = self.client
        self._append = c.register_script(lua.APPEND)
        self._resolve = c.register_script(lua.RESOLVE)
        self._terminate = c.register_script(lua.TERMINATE)
        self._seed = c.register_script(lua.SEED)
        self._dataset = c.register_script(lua.DATASET)
        self._breaker_admit = c.register_script(lua.BREAKER_ADMIT)
        self._breaker_report = c.register_script(lua.BREAKER_REPORT)
        self._breaker_release = c.register_script(lua.BREAKER_RELEASE)
        self._publish_config = c.register_script(lua.PUBLISH_CONFIG)
        self._config_snapshot = c.register_script(lua.CONFIG_SNAPSHOT)
        self._chain = c.register_script(lua.CHAIN)
        self.windows = RedisWindows(c)  # budgets over time (SPEC §9)

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
        keep_alive, links, breakers = step.keep_alive, step.links, step.breakers
        links = links or {}
        breaker_at = list(step.breaker_at) or [0] * len(breakers)
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
            "breakers": [
                [
                    keys.breaker(b.agent, b.upstream),
                    b.agent,
                    b.upstream,
                    BREAKER_TTL_MS,
                    *admit_args(b.config),
                    at,
                ]
                for b, at in zip(breakers, breaker_at, strict=True)
            ],
            "breaker_index": keys.BREAKER_INDEX,
            "rates": rate_asks(step.rates),
            "windows": [[list(w.keys), dict(w.header), at] for at, w in step.windows],
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
        first, raw, taken, term, was_live, started, admitted, rated, reserved = await self._call(
            self._append, script_keys, [orjson.dumps(header), *bodies]
        )
        return Appended(
            entries=[parse_entry(since + 1 + i, r) for i, r in enumerate(raw)],
            first_own=int(first),
            taken=[(text(taken[i]), bytes(taken[i + 1])) for i in range(0, len(taken), 2)],
            terminated=text(term) or None,
            was_live=bool(was_live),
            epoch=text(started),
            breakers=[
                None if text(r[0]) == "skip" else admission(b.upstream, r, b.config)
                for b, r in zip(breakers, admitted, strict=False)
            ],
            rates=[rate_answer(request, r) for (_, request), r in zip(step.rates, rated, strict=False)],
            windows=[parse_reserved(r) for r in reserved],
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

    # --- circuit breakers ----------------------------------------------------------------------

    def _breaker_args(self, agent: str, upstream: str, now: float | None) -> tuple[list[str], list[Any]]:
        script_keys = [keys.breaker(agent, upstream), keys.BREAKER_INDEX]
        return script_keys, ["" if now is None else repr(now), agent, upstream, BREAKER_TTL_MS]

    async def breaker_admit(
        self, agent: str, upstream: str, config: CircuitBreakerConfig, *, now: float | None = None
    ) -> BreakerAdmission:
        script_keys, args = self._breaker_args(agent, upstream, now)
        args += admit_args(config)
        reply = await self._call(self._breaker_admit, script_keys, args)
        return admission(upstream, reply, config)

    async def breaker_report(
        self,
        agent: str,
        upstream: str,
        ticket: Ticket,
        config: CircuitBreakerConfig,
        *,
        failed: bool,
        now: float | None = None,
    ) -> Transition | None:
        script_keys, args = self._breaker_args(agent, upstream, now)
        args += [
            int(config.enabled),
            config.open_after_failures,
            ticket.generation,
            int(ticket.trial),
            int(failed),
        ]
        moved = await self._call(self._breaker_report, script_keys, args)
        if not moved:
            return None
        old, new, failures, reason = moved
        return Transition(upstream, State(text(old)), State(text(new)), int(failures), text(reason))

    async def breaker_release(self, agent: str, upstream: str, ticket: Ticket) -> None:
        if not ticket.trial:
            return  # only a half-open trial slot has anything to give back
        script_keys, args = self._breaker_args(agent, upstream, None)
        await self._call(self._breaker_release, script_keys, [*args, ticket.generation])

    async def breakers(self) -> list[BreakerView]:
        try:
            members = sorted(await self.client.smembers(keys.BREAKER_INDEX))
            if not members:
                return []
            async with self.client.pipeline(transaction=False) as pipe:
                for k in members:
                    pipe.hmget(k, "a", "u", "s", "f")
                rows = await pipe.execute()
            gone = [k for k, row in zip(members, rows, strict=True) if row[0] is None]
            if gone:
                await self.client.srem(keys.BREAKER_INDEX, *gone)
        except (RedisError, OSError) as e:
            raise StateUnavailable(f"redis: {type(e).__name__}: {e}") from e
        return [BreakerView(text(a), text(u), State(text(s)), int(f)) for a, u, s, f in rows if a is not None]

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
