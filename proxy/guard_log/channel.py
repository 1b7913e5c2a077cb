"""Session guards shared by replicas: one `RunChannel` per run, over a `StateBackend`.

A channel keeps this replica's `SessionReplica` of the run and an outbox of entries to append.
Admitting a call puts its check in the outbox and waits for the append that carries it: the one
round trip appends it (with the settles and events still queued before it) and returns what the
other replicas appended since, which the replica applies in log order before reading its own
verdict. Calls of one run arriving together share a round trip (group commit), so a burst costs
one round trip per batch, not per call. Events are queued and sent in the background (or with the
next check or settle, whichever comes first), in order. A call's settle is sent at once, with what
is queued before it, and the guard stage waits for it before the answer's end goes to the client
(SPEC §8): the agent's next call, on whichever replica, is judged with that answer.

Backend unavailable (proxy/state/link.py): under `fail_open` the entries are applied to the local
replica at once (guarded from this replica's memory) and kept; when the backend is back they are
appended and the replica is rebuilt from the whole log, so what was served meanwhile counts.
Under `fail_closed` a check raises `StateUnavailable` (the caller refuses the call); settles and
events are kept and sent when the backend is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.admission.check import Stores
from proxy.guard_log.configs import SharedConfigs
from proxy.guard_log.replica import Applied, SessionReplica
from proxy.guards.config import GuardConfig
from proxy.state.base import Append, Appended, CheckAsk, LogEntry, PendingCall, StateUnavailable, Twin
from proxy.state.link import StateLink

log = logging.getLogger("tripwire.state")

# Events wait this long for a check or a settle to ride along with (the call's own settle, usually):
# fewer round trips. A settle does not wait (see `RunChannel.settle`).
SETTLE_DELAY_S = 0.005
# A settle the backend does not confirm in this long lets the answer end anyway (the link's own
# timeouts come first; this is the bound that keeps a client from waiting on a bug)
SETTLE_WAIT_S = 30.0


@dataclass
class Admission:
    """A check's outcome: its verdict (or the decision that had ended the session), the pending
    function-calling tool calls it took (their TOOL_CALL events are this replica's to write), and
    what the admission's checks asked with it answered (proxy/admission/)."""

    applied: Applied | None  # None: refused by a gate, never appended
    taken: list[tuple[str, bytes]] = field(default_factory=list)
    shared: bool = True  # False: decided from this replica's memory (backend down, fail_open)
    # each check's twin's answer, by twin name (shared; a gate's also when decided from memory)
    answers: dict[str, Any] = field(default_factory=dict)
    refused_by: str | None = None  # the gate that refused the check (its answer in `answers`)


# (applied, answers by twin name, the refusing gate's name, decided by the backend)
Outcome = tuple[Applied | None, dict[str, Any], str | None, bool]


@dataclass
class _Item:
    body: bytes
    waiter: asyncio.Future[Outcome] | None = None
    take: tuple[str, ...] = ()
    event_ids: Mapping[str, str] | None = None
    # the admission's checks asked with this check (proxy/admission/): (twin, request), in list order
    checks: tuple[tuple[Twin, Any], ...] = ()
    on_applied: Callable[[Applied], None] | None = None  # a queued entry's outcome (soft alert, cycle)
    done: asyncio.Future[None] | None = None  # a settle: appended (or kept, backend down)


@dataclass
class _Extras:
    """What rides along with the next append besides entries."""

    put: dict[str, PendingCall] = field(default_factory=dict)
    signatures: list[str] = field(default_factory=list)
    keep_alive: set[str] = field(default_factory=set)
    links: dict[str, str] = field(default_factory=dict)

    def merge(self, other: _Extras) -> None:
        self.put.update(other.put)
        self.signatures.extend(other.signatures)
        self.keep_alive |= other.keep_alive
        self.links.update(other.links)


class RunChannel:
    def __init__(self, owner: SharedGuards, agent: str, run_id: str) -> None:
        self.owner = owner
        self.agent = agent
        self.run_id = run_id
        self.replica = SessionReplica(self._config_for)
        self.shared_seq = 0  # entries of the shared log applied
        self.history: list[LogEntry] = []  # those entries, to seed the log again if Redis loses it
        self.epoch = ""  # which log they are (the run's start stamp in the backend)
        self.dirty = False  # the replica applied entries the shared log does not have yet
        self.backlog: list[bytes] = []  # those entries (or, fail_closed, entries not sent yet)
        self.terminated: str | None = None  # the run's terminated mark, as last read
        self._queue: list[_Item] = []
        self._extras = _Extras()
        self._taken: dict[str, bytes] = {}
        self._flusher: asyncio.Task[None] | None = None
        self._delayed: asyncio.TimerHandle | None = None  # the settles' flush, unless a check comes first

    def _config_for(self, revision: int) -> GuardConfig:
        return self.owner.configs.effective(revision, self.agent)[0]

    # --- what the pipeline calls ---------------------------------------------------------------

    async def admit(
        self,
        check: bytes,
        *,
        take: Sequence[str] = (),
        event_ids: Mapping[str, str] | None = None,
        keep_alive: Sequence[str] = (),
        links: Mapping[str, str] | None = None,
        checks: Sequence[tuple[Twin, Any]] = (),
    ) -> Admission:
        """Append a check and return its verdict (one round trip, shared with concurrent checks);
        `checks`: what the admission's checks ask of their twins (proxy/admission/), in list order,
        answered in the same round trip (a gate first: a check it refuses is not appended)."""
        waiter: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._extras.keep_alive.update(keep_alive)
        self._extras.links.update(links or {})
        item = _Item(check, waiter, tuple(take), event_ids, tuple(checks))
        self._queue.append(item)
        self._kick()
        applied, answers, refused_by, shared = await waiter
        taken = [(i, self._taken.pop(i)) for i in take if i in self._taken]
        return Admission(
            applied, taken, shared=shared and not self.dirty, answers=answers, refused_by=refused_by
        )

    def queue(
        self,
        bodies: Sequence[bytes],
        *,
        put: Mapping[str, PendingCall] | None = None,
        signatures: Sequence[str] = (),
        links: Mapping[str, str] | None = None,
        on_applied: Callable[[Applied], None] | None = None,
    ) -> None:
        """Settles, events, pending tool calls: appended in the background, in order.
        `on_applied` gets each entry's outcome once this replica applied it."""
        self._queue.extend(_Item(b, on_applied=on_applied) for b in bodies)
        self._extras.put.update(put or {})
        self._extras.signatures.extend(signatures)
        self._extras.links.update(links or {})
        if put:
            # tool calls the agent will answer through any replica: shared before it can run them
            self._kick()
        elif self._delayed is None and (self._flusher is None or self._flusher.done()):
            self._delayed = asyncio.get_running_loop().call_later(self.owner.settle_delay_s, self._kick)

    async def settle(
        self,
        body: bytes,
        *,
        put: Mapping[str, PendingCall] | None = None,
        signatures: Sequence[str] = (),
        links: Mapping[str, str] | None = None,
        on_applied: Callable[[Applied], None] | None = None,
    ) -> None:
        """Append a call's settle now, with everything queued before it, and return once the log has
        it (or, backend down, once the failure policy kept it): the caller ends the answer after
        this, so the agent's next call is judged with it whichever replica serves it (SPEC §8)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Item(body, on_applied=on_applied, done=done))
        self._extras.put.update(put or {})
        self._extras.signatures.extend(signatures)
        self._extras.links.update(links or {})
        self._kick()
        try:
            await asyncio.wait_for(asyncio.shield(done), SETTLE_WAIT_S)
        except TimeoutError:
            log.error("state.settle_slow run_id=%s: the answer ends before its settle is shared", self.run_id)

    async def flush(self) -> None:
        """Wait until everything queued has been appended (or the backend was found down)."""
        if self._queue:
            self._kick()
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    # --- the flusher -----------------------------------------------------------------------------

    def _kick(self) -> None:
        if self._delayed is not None:
            self._delayed.cancel()
            self._delayed = None
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(
                self._flush_all(), name="tripwire-state-flush"
            )
            self.owner.tasks.add(self._flusher)
            self._flusher.add_done_callback(self.owner.tasks.discard)

    async def _flush_all(self) -> None:
        while self._queue:
            batch = self._next_batch()
            extras, self._extras = self._extras, _Extras()
            try:
                await self._append(batch, extras)
            except StateUnavailable:
                self._unavailable(batch, extras)
            except Exception as e:  # a bug must not leave callers waiting forever
                log.exception("state.flush_failed run_id=%s", self.run_id)
                for item in batch:
                    if item.waiter is not None and not item.waiter.done():
                        item.waiter.set_exception(e)
                    _settled(item)

    def resend(self) -> None:
        """The backend is back: send what was kept, without waiting for the run's next call."""
        if self.backlog and not self._queue:
            self._queue.append(_Item(b"", None))  # an empty marker, dropped by `_append`
        self._kick()

    def _next_batch(self) -> list[_Item]:
        """Everything queued, but at most one check that takes tool calls, and last (its TOOL_CALL
        entries go right before it)."""
        for i, item in enumerate(self._queue):
            if item.take:
                batch, self._queue = self._queue[: i + 1], self._queue[i + 1 :]
                return batch
        batch, self._queue = self._queue, []
        return batch

    async def _append(self, batch: list[_Item], extras: _Extras, *, retried: bool = False) -> None:
        owner = self.owner
        batch = [i for i in batch if i.body]  # the `resend` marker
        backlog = self.backlog
        bodies = [*backlog, *(i.body for i in batch)]
        if not bodies:
            return
        take = batch[-1].take if batch and batch[-1].take else ()
        at = {id(item): n for n, item in enumerate(batch, start=len(backlog) + 1)}  # position in bodies
        asking = [i for i in batch if i.checks and i.waiter is not None]
        checks = [CheckAsk(twin, at[id(i)], request) for i in asking for twin, request in i.checks]
        appended: Appended = await owner.link.call(
            lambda: owner.backend.append(
                Append(
                    self.agent,
                    self.run_id,
                    bodies,
                    since=self.shared_seq,
                    idle_s=owner.idle_s,
                    epoch=self.epoch,
                    take=take,
                    take_at=len(bodies) if take else 0,
                    put=extras.put,
                    signatures=extras.signatures,
                    keep_alive=sorted(extras.keep_alive),
                    links=extras.links,
                    checks=checks,
                )
            )
        )
        if appended.lost:
            if retried:
                raise StateUnavailable("the run's guard log keeps losing entries")
            # Redis lost the run's log (restarted without its data): put this replica's copy back,
            # or, when another replica did it first, rebuild from what that one put back
            ok = await owner.link.call(
                lambda: owner.backend.seed(self.agent, self.run_id, self.history, idle_s=owner.idle_s)
            )
            log.warning("state.log_lost run_id=%s: %s", self.run_id, "seeded again" if ok else "rebuilt")
            if not ok:
                self.history, self.shared_seq, self.dirty = [], 0, True
            self.epoch = ""
            await self._append(batch, extras, retried=True)
            return
        self.backlog = []
        self.epoch = appended.epoch
        entries = appended.entries
        await self._load_configs(entries)
        if self.dirty:
            # entries were applied here that the log did not have (or in another order): start
            # again from the shared prefix, then follow the log
            self.replica = SessionReplica(self._config_for)
            for entry in self.history:
                self.replica.apply(entry)
            self.dirty = False
        self._taken.update(appended.taken)
        self.terminated = appended.terminated
        # each check's answers, by twin name; checks a gate refused were not appended: answered
        # now (by the last gate asked, the one that refused), and given no seq
        answers: dict[int, dict[str, Any]] = {id(i): {} for i in asking}
        refused: dict[int, str] = {}
        for ask, answer in zip(checks, appended.answers, strict=True):
            item = batch[ask.at - len(backlog) - 1]
            if answer is not None:
                answers[id(item)][ask.twin.name] = answer
                if ask.twin.gate and ask.at in appended.refused:
                    refused[id(item)] = ask.twin.name
        for item in asking:
            if id(item) in refused and item.waiter is not None and not item.waiter.done():
                item.waiter.set_result((None, answers[id(item)], refused[id(item)], True))
        # the seq of each body of the batch: after the backlog, and after the taken TOOL_CALLs
        own: dict[int, _Item] = {}
        seq = appended.first_own + len(backlog)
        for n, item in enumerate(batch, start=1):
            if id(item) in refused:
                continue
            if take and n == len(batch):
                seq += len(appended.taken)
            own[seq] = item
            seq += 1
        for entry in entries:
            mine = own.get(entry.seq)
            applied = self.replica.apply(entry, mine.event_ids if mine is not None else None)
            if applied is not None:
                self.history.append(entry)
            if mine is not None and applied is not None:
                self._deliver(mine, applied, answers.get(id(mine), {}), shared=True)
        self.shared_seq = self.replica.applied
        for item in batch:
            _settled(item)  # (each one the log has by now, applied or not)

    @staticmethod
    def _deliver(item: _Item, applied: Applied, answers: dict[str, Any], *, shared: bool) -> None:
        if item.waiter is not None and not item.waiter.done():
            item.waiter.set_result((applied, answers, None, shared))
        if item.on_applied is not None:
            try:
                item.on_applied(applied)
            except Exception:
                log.exception("state.on_applied_failed")
        _settled(item)

    async def _load_configs(self, entries: Sequence[LogEntry]) -> None:
        configs = self.owner.configs
        for revision in sorted({e.config_rev for e in entries}):
            if not configs.known(revision):
                await self.owner.link.call(lambda: configs.load(revision))  # noqa: B023 (awaited here)
        if entries:
            await self.owner.link.call(lambda: configs.restore_if_lost(entries[-1].config_rev))

    def _unavailable(self, batch: list[_Item], extras: _Extras) -> None:
        """The backend is down: fail_open decides here and sends later; fail_closed refuses checks."""
        self._extras.merge(extras)  # pending calls, signatures and links go with the next append
        if not self.owner.link.fail_open:
            for item in batch:
                if item.waiter is not None:
                    if not item.waiter.done():
                        item.waiter.set_exception(StateUnavailable("state backend unavailable"))
                else:
                    self.backlog.append(item.body)  # a settle or an event: sent when it is back
                    _settled(item)
            return
        revision = (
            self.replica.config_rev if self.replica.config_rev is not None else self.owner.configs.current
        )
        now = time.time()
        for item in batch:
            # the gates (concurrent calls, rate limits) from this replica's memory meanwhile (SPEC
            # §8 fail_open); the other checks fall back on their own (the circuit, budget windows)
            gated: dict[str, Any] = {}
            refused_by = None
            for twin, request in item.checks if item.waiter is not None else ():
                if twin.gate and refused_by is None:
                    no, gated[twin.name] = twin.memory(self.owner.local, request, time.monotonic())
                    refused_by = twin.name if no else None
            if refused_by is not None:
                assert item.waiter is not None
                if not item.waiter.done():
                    item.waiter.set_result((None, gated, refused_by, False))
                continue
            entry = LogEntry(self.replica.applied + 1, now, revision, item.body)
            applied = self.replica.apply(entry, item.event_ids)
            self.backlog.append(item.body)
            self.dirty = True
            if applied is not None:
                self._deliver(item, applied, gated, shared=False)  # the circuit: this replica's own
            _settled(item)


def _settled(item: _Item) -> None:
    if item.done is not None and not item.done.done():
        item.done.set_result(None)


class SharedGuards:
    """Every run's channel on this replica, over one backend and its failure policy."""

    def __init__(
        self,
        link: StateLink,
        configs: SharedConfigs,
        *,
        idle_s: float,
        settle_delay_s: float = SETTLE_DELAY_S,
    ) -> None:
        self.link = link
        self.settle_delay_s = settle_delay_s
        self.backend = link.backend
        self.configs = configs
        self.idle_s = idle_s
        self.tasks: set[asyncio.Task[None]] = set()
        self._channels: dict[str, RunChannel] = {}
        self.local = Stores()  # the gates' memory while the backend is down (fail_open)
        link.listeners.append(self._on_link)

    def _on_link(self, up: bool) -> None:
        if up:
            for ch in list(self._channels.values()):
                if ch.backlog:
                    ch.resend()

    def channel(self, agent: str, run_id: str) -> RunChannel:
        ch = self._channels.get(run_id)
        if ch is None:
            ch = self._channels[run_id] = RunChannel(self, agent, run_id)
        return ch

    def get(self, run_id: str) -> RunChannel | None:
        return self._channels.get(run_id)

    def forget(self, run_id: str) -> None:
        """The run ended on this replica; what is still queued is sent first."""
        ch = self._channels.pop(run_id, None)
        if ch is not None and (ch._queue or ch.backlog):
            ch._kick()

    async def flush(self) -> None:
        for ch in list(self._channels.values()):
            await ch.flush()
        if self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.flush(), 2.0)
        for task in list(self.tasks):
            task.cancel()
