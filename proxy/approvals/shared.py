"""Approvals in Redis, for several replicas (SPEC §5.5a, §8).

Every replica lists and decides every approval; the replica holding the call is released within
a second by Redis pub/sub: one subscription per replica (not per call) resolves the future the
held call awaits. A decision, a timeout, a withdrawal and an abandonment all go through one Lua
script that closes a pending approval once and publishes it, so nothing is decided (and forwarded)
twice. Each replica refreshes a short-lived heartbeat key; a pending approval whose holder's
heartbeat is gone (the replica died, its clients' connections with it) is closed as abandoned when
it is next listed or decided.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

import orjson
import redis.asyncio as redis
from redis.exceptions import RedisError

from proxy.approvals.book import (
    ABANDONED,
    DECISIONS,
    PENDING,
    RECENT_KEPT,
    TIMEOUT,
    WITHDRAWN,
    AlreadyDecided,
    Approval,
    ApprovalBook,
    Decided,
    UnknownApproval,
    decided_of,
    wait_first,
)

log = logging.getLogger("tripwire.approvals")

PREFIX = "tripwire:approvals:"
PENDING_KEY = PREFIX + "pending"  # zset: id -> requested_at
DECIDED_KEY = PREFIX + "decided"  # list of ids, newest first
CHANNEL = PREFIX + "decisions"  # each closed approval's JSON
HEARTBEAT_S = 1.0
HEARTBEAT_TTL_MS = 5000  # a replica silent this long is taken for dead
KEEP_S = 86_400  # a decided approval is listed (and answers 409) this long


def approval_key(approval_id: str) -> str:
    return f"{PREFIX}item:{approval_id}"


def alive_key(replica: str) -> str:
    return f"{PREFIX}replica:{replica}"


# close a pending approval once: (status, note, by, raised, decided_at); publish it
CLOSE = """
local raw = redis.call('GET', KEYS[1])
if not raw then return {'unknown', ''} end
local a = cjson.decode(raw)
if a.status ~= 'pending' then return {'decided', a.status} end
a.status = ARGV[2]
a.note = ARGV[3]
a.by = ARGV[4]
a.raised = cjson.decode(ARGV[5])
a.decided_at = tonumber(ARGV[6])
local out = cjson.encode(a)
redis.call('SET', KEYS[1], out, 'KEEPTTL')
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('LPUSH', KEYS[3], ARGV[1])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[8]) - 1)
redis.call('PUBLISH', ARGV[7], out)
return {'ok', out}
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class SharedApprovalBook(ApprovalBook):
    def __init__(self, url: str, *, replica: str | None = None, client: redis.Redis | None = None) -> None:
        # the process's one Redis client when given (proxy/state/client.py; its owner closes it)
        self._owns_client = client is None
        self.client = client if client is not None else redis.Redis.from_url(url)
        self.replica = replica or uuid.uuid4().hex[:12]
        self._close = self.client.register_script(CLOSE)
        self._futures: dict[str, asyncio.Future[Approval]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self._beat()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._heartbeat(), name="tripwire-approvals-heartbeat"),
            loop.create_task(self._subscribe(), name="tripwire-approvals-subscriber"),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            while not task.done():
                # cancelled until it stops: on Python 3.11 a cancellation that lands as a Redis call
                # with a socket timeout completes can be swallowed (asyncio's timeout race), and the
                # loop goes on (as the engine's sweeper, proxy/engine.py)
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)
        with contextlib.suppress(RedisError, OSError):
            await self.client.delete(alive_key(self.replica))
        if self._owns_client:
            await self.client.aclose()

    # --- the holding replica -------------------------------------------------------------------

    async def open(self, approval: Approval) -> None:
        approval.replica = self.replica
        self._futures[approval.id] = asyncio.get_running_loop().create_future()
        pipe = self.client.pipeline(transaction=True)
        pipe.set(
            approval_key(approval.id), orjson.dumps(approval.to_json()), ex=int(approval.timeout_s + KEEP_S)
        )
        pipe.zadd(PENDING_KEY, {approval.id: approval.requested_at})
        await pipe.execute()

    async def wait(
        self, approval_id: str, wait_s: float, gone: asyncio.Future[None] | None = None
    ) -> Decided:
        future = self._futures.get(approval_id)
        try:
            if future is None:
                return decided_of(await self.get(approval_id))
            started = time.time()
            approval = await wait_first(future, wait_s, gone)
            if approval is None:
                status = WITHDRAWN if gone is not None and gone.done() else TIMEOUT
                try:
                    approval = await self._closing(approval_id, status, by="tripwire")
                except AlreadyDecided:  # a decision came just now (its message may still be on its way)
                    approval = await self.get(approval_id)
                except (RedisError, OSError) as e:  # Redis away: the timeout applies here all the same
                    log.warning("approval %s: %s without Redis (%r)", approval_id, status, e)
                    return Decided(status, by="tripwire", waited_s=time.time() - started)
            return decided_of(approval)
        finally:
            self._futures.pop(approval_id, None)

    # --- any replica ---------------------------------------------------------------------------

    async def _closing(
        self,
        approval_id: str,
        status: str,
        *,
        note: str = "",
        by: str = "",
        raised: dict[str, float] | None = None,
    ) -> Approval:
        reply = await self._close(
            keys=[approval_key(approval_id), PENDING_KEY, DECIDED_KEY],
            args=[
                approval_id,
                status,
                note,
                by,
                orjson.dumps(raised or {}),
                repr(time.time()),
                CHANNEL,
                RECENT_KEPT,
            ],
        )
        outcome, detail = _text(reply[0]), _text(reply[1])
        if outcome == "unknown":
            raise UnknownApproval(approval_id)
        if outcome == "decided":
            raise AlreadyDecided(detail)
        approval = Approval.from_json(orjson.loads(detail))
        self._release(approval)  # held here: no need to wait for the message
        return approval

    async def decide(
        self,
        approval_id: str,
        decision: str,
        *,
        note: str = "",
        by: str = "api",
        raised: dict[str, float] | None = None,
    ) -> Approval:
        status = DECISIONS[decision]
        await self._abandon_if_orphaned(await self.get(approval_id))
        return await self._closing(approval_id, status, note=note, by=by, raised=raised)

    async def get(self, approval_id: str) -> Approval:
        raw = await self.client.get(approval_key(approval_id))
        if raw is None:
            raise UnknownApproval(approval_id)
        return Approval.from_json(orjson.loads(raw))

    async def listing(self, *, decided: bool = False) -> list[Approval]:
        ids = [_text(i) for i in await self.client.zrange(PENDING_KEY, 0, -1)]
        if decided:
            ids += [_text(i) for i in await self.client.lrange(DECIDED_KEY, 0, RECENT_KEPT - 1)]
        if not ids:
            return []
        found = [
            Approval.from_json(orjson.loads(raw))
            for raw in await self.client.mget(*map(approval_key, ids))
            if raw
        ]
        out = []
        for approval in found:
            if approval.status == PENDING and await self._abandon_if_orphaned(approval):
                if not decided:
                    continue
                approval = await self.get(approval.id)
            out.append(approval)
        return out

    async def _abandon_if_orphaned(self, approval: Approval) -> bool:
        """A pending approval whose replica is gone (dead, its client's connection with it)."""
        if approval.status != PENDING or approval.replica == self.replica:
            return False
        if await self.client.exists(alive_key(approval.replica)):
            return False
        with contextlib.suppress(AlreadyDecided, UnknownApproval):
            await self._closing(approval.id, ABANDONED, by="tripwire")
            log.warning("approval %s abandoned: replica %s is gone", approval.id, approval.replica)
        return True

    # --- background: one heartbeat and one subscription per replica ----------------------------

    async def _beat(self) -> None:
        await self.client.set(alive_key(self.replica), b"1", px=HEARTBEAT_TTL_MS)

    async def _heartbeat(self) -> None:
        while True:
            try:
                await self._beat()
            except (RedisError, OSError) as e:
                log.debug("approvals heartbeat failed: %r", e)
            await asyncio.sleep(HEARTBEAT_S)

    def _release(self, approval: Approval) -> None:
        future = self._futures.get(approval.id)
        if future is not None and not future.done():
            future.set_result(approval)

    async def _subscribe(self) -> None:
        """Decisions taken on any replica, released here when this replica holds the call."""
        while True:
            pubsub = self.client.pubsub()
            try:
                await pubsub.subscribe(CHANNEL)
                await self._catch_up()  # a decision published while the subscription was down
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    with contextlib.suppress(orjson.JSONDecodeError, TypeError):
                        self._release(Approval.from_json(orjson.loads(message["data"])))
            except (RedisError, OSError) as e:
                log.warning("approvals subscription lost (%r); again in 1s", e)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            await asyncio.sleep(1.0)

    async def _catch_up(self) -> None:
        for approval_id in list(self._futures):
            with contextlib.suppress(UnknownApproval):
                approval = await self.get(approval_id)
                if approval.status != PENDING:
                    self._release(approval)
