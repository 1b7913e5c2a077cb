"""The approval book: pending approvals and the decisions that release them (SPEC §5.5a).

A held call opens an approval and awaits its decision (`wait`): an asyncio future resolved by
`decide` (the admin API) or by the shared book's one subscriber per replica, so nothing runs
while a call is held. Whatever ends the wait first wins, once: a decision, the timeout, the
client hanging up (withdrawn) or, with shared state, the holding replica dying (abandoned).
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

PENDING = "pending"
# how a wait ended: a person's decision, or what ended it without one
APPROVED, DENIED = "approved", "denied"
TIMEOUT, WITHDRAWN, ABANDONED = "timeout", "withdrawn", "abandoned"
DECISIONS = {"approve": APPROVED, "deny": DENIED}
RECENT_KEPT = 200  # decided approvals listed by `GET /api/approvals?all=1`


class UnknownApproval(KeyError):
    """No approval has this id (404)."""


class AlreadyDecided(Exception):
    """The approval was decided, timed out, withdrawn or abandoned already (409)."""

    def __init__(self, status: str) -> None:
        super().__init__(f"approval already {status}")
        self.status = status


@dataclass
class Approval:
    """One held call waiting for a person: what it is, and, once decided, how it ended."""

    id: str
    agent: str
    session_id: str | None
    run_id: str
    guard: str
    kind: str | None  # the loop pattern, or None for a budget, limit or tool permission
    message: str
    threshold: Any
    actual: Any
    call: dict[str, Any]  # {"tool", "arguments", "server"} or {"model", "stream", "tool_calls"}
    approving: str  # what approving does, in words
    requested_at: float  # epoch seconds
    timeout_s: float
    replica: str = ""  # the replica holding the call (shared book)
    status: str = PENDING
    decided_at: float | None = None
    note: str = ""
    by: str = ""
    raised: dict[str, float] = field(default_factory=dict)
    # a loop's: {"pattern", "repetitions", "window_size", "event_ids"} (proxy/approvals/hold.py)
    evidence: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["expires_at"] = self.requested_at + self.timeout_s
        if self.decided_at is not None:
            out["waited_s"] = round(self.decided_at - self.requested_at, 3)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Approval:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Decided:
    """How a held call's wait ended."""

    status: str  # approved / denied / timeout / withdrawn / abandoned
    note: str = ""
    by: str = ""
    raised: dict[str, float] = field(default_factory=dict)
    waited_s: float = 0.0


def closed(approval: Approval, status: str, now: float, note: str = "", by: str = "") -> Approval:
    approval.status, approval.decided_at, approval.note, approval.by = status, now, note, by
    return approval


def decided_of(approval: Approval) -> Decided:
    end = approval.decided_at if approval.decided_at is not None else time.time()
    return Decided(
        approval.status, approval.note, approval.by, dict(approval.raised), end - approval.requested_at
    )


class ApprovalBook(abc.ABC):
    """Where approvals live: this process (`LocalApprovalBook`) or Redis (`SharedApprovalBook`)."""

    @abc.abstractmethod
    async def open(self, approval: Approval) -> None:
        """A held call asks; `wait` then awaits its decision."""

    @abc.abstractmethod
    async def wait(
        self, approval_id: str, wait_s: float, gone: asyncio.Future[None] | None = None
    ) -> Decided:
        """The decision, or timeout / withdrawn (`gone` resolved: the client hung up), once."""

    @abc.abstractmethod
    async def decide(
        self,
        approval_id: str,
        decision: str,
        *,
        note: str = "",
        by: str = "api",
        raised: dict[str, float] | None = None,
    ) -> Approval:
        """A person's decision ("approve" / "deny"); UnknownApproval, AlreadyDecided."""

    @abc.abstractmethod
    async def get(self, approval_id: str) -> Approval:
        """UnknownApproval when no approval has this id."""

    @abc.abstractmethod
    async def listing(self, *, decided: bool = False) -> list[Approval]:
        """Pending approvals, oldest first; with `decided`, recently decided ones after them."""

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


class LocalApprovalBook(ApprovalBook):
    """Approvals of this process: a dict and one future per held call."""

    def __init__(self) -> None:
        self.pending: dict[str, Approval] = {}
        self.recent: collections.deque[Approval] = collections.deque(maxlen=RECENT_KEPT)
        self._futures: dict[str, asyncio.Future[Approval]] = {}

    async def open(self, approval: Approval) -> None:
        self.pending[approval.id] = approval
        self._futures[approval.id] = asyncio.get_running_loop().create_future()

    def _close(self, approval_id: str, status: str, note: str = "", by: str = "") -> Approval:
        approval = self.pending.pop(approval_id, None)
        if approval is None:
            for old in self.recent:
                if old.id == approval_id:
                    raise AlreadyDecided(old.status)
            raise UnknownApproval(approval_id)
        closed(approval, status, time.time(), note, by)
        self.recent.appendleft(approval)
        future = self._futures.pop(approval_id, None)
        if future is not None and not future.done():
            future.set_result(approval)
        return approval

    async def wait(
        self, approval_id: str, wait_s: float, gone: asyncio.Future[None] | None = None
    ) -> Decided:
        future = self._futures.get(approval_id)
        if future is None:
            return decided_of(await self.get(approval_id))
        approval = await wait_first(future, wait_s, gone)
        if approval is None:  # timed out, or the client went: unless a decision came just now
            status = WITHDRAWN if gone is not None and gone.done() else TIMEOUT
            with contextlib.suppress(AlreadyDecided, UnknownApproval):
                self._close(approval_id, status, by="tripwire")
            approval = await self.get(approval_id)
        return decided_of(approval)

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
        pending = self.pending.get(approval_id)
        if pending is not None:
            pending.raised = dict(raised or {})
        return self._close(approval_id, status, note, by)

    async def get(self, approval_id: str) -> Approval:
        found = self.pending.get(approval_id)
        if found is not None:
            return found
        for old in self.recent:
            if old.id == approval_id:
                return old
        raise UnknownApproval(approval_id)

    async def listing(self, *, decided: bool = False) -> list[Approval]:
        out = sorted(self.pending.values(), key=lambda a: a.requested_at)
        return out + list(self.recent) if decided else out


async def wait_first(
    future: asyncio.Future[Approval], wait_s: float, gone: asyncio.Future[None] | None
) -> Approval | None:
    """The decision, or None when `wait_s` passed or `gone` resolved first (no task per wait
    beyond asyncio.wait's own callbacks; nothing wakes until one of them happens)."""
    waiting: set[asyncio.Future[Any]] = {future}
    if gone is not None:
        waiting.add(gone)
    done, _ = await asyncio.wait(waiting, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
    if future in done:
        return future.result()
    return None
