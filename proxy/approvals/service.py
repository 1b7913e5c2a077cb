"""The approvals service the guard stage and the admin API share (SPEC §5.5a)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any

from proxy.alerts import Alerts
from proxy.approvals.book import (
    APPROVED,
    DENIED,
    WITHDRAWN,
    Approval,
    ApprovalBook,
    Decided,
    LocalApprovalBook,
)
from proxy.approvals.hold import HeldStream, Watch, held_call, held_evidence, held_stream_for
from proxy.exchange import Exchange
from proxy.guards.decision import Decision
from proxy.metrics import Metrics
from proxy.settings import Settings, split_host_port, url_host


class Approvals:
    """The book (local or shared), the watch over held calls, the streaks a person let go on."""

    # what the hold stage (proxy/stages/hold.py) reads of this package through the service: the
    # stages do not import proxy.approvals (import-linter)
    APPROVED, DENIED, WITHDRAWN = APPROVED, DENIED, WITHDRAWN
    approval_class: type[Approval] = Approval

    @staticmethod
    def held_call(ex: Exchange, max_field_bytes: int) -> dict[str, Any]:
        return held_call(ex, max_field_bytes)

    @staticmethod
    def held_stream_for(ex: Exchange) -> HeldStream | None:
        return held_stream_for(ex)

    @staticmethod
    def held_evidence(decision: Decision, max_field_bytes: int) -> dict[str, Any]:
        return held_evidence(decision, max_field_bytes)

    @staticmethod
    def covers_until(decision: Decision, decided: Decided, call_seq: int) -> int | None:
        return covers_until(decision, decided, call_seq)

    def __init__(self, book: ApprovalBook, metrics: Metrics, alerts: Alerts, decision_url: str) -> None:
        self.book = book
        self.metrics = metrics
        self.alerts = alerts
        self.decision_url = decision_url  # the admin API's `/api/approvals/`, for the webhook
        self.watch = Watch()
        self.held = 0  # calls this process holds now (the gauge)
        self.held_runs: collections.Counter[str] = collections.Counter()  # runs tagged awaiting_approval

    def holding(self, run_id: str, delta: int) -> bool:
        """One more (or one fewer) call of the run held here; True when the run's first starts or
        its last ends (its `awaiting_approval` tag goes on or off)."""
        self.held += delta
        self.metrics.set_pending_approvals(self.held)
        self.held_runs[run_id] += delta
        if self.held_runs[run_id] <= 0:
            del self.held_runs[run_id]
            return True
        return delta > 0 and self.held_runs[run_id] == 1

    async def hold(
        self,
        ex: Exchange,
        approval: Approval,
        requested: Callable[[], None],
        awaiting: Callable[[bool], None],
    ) -> tuple[Decided, HeldStream | None]:
        """Open `approval` and hold its call until a person decides, `ask_timeout_s` passes or the
        client hangs up; a streamed call's head and keep-alives go out meanwhile. `requested` writes
        the run's `approval_requested`; `awaiting(on)` tags the run while its first call is held."""
        await self.book.open(approval)
        requested()
        if self.holding(approval.run_id, 1):
            awaiting(True)
        self.notify(approval)
        stream = held_stream_for(ex)
        gone = self.watch.add(ex, stream)
        try:
            if stream is not None:
                try:
                    await stream.start()
                except (ConnectionResetError, RuntimeError, OSError):
                    gone.set_result(None)
            decided = await self.book.wait(approval.id, approval.timeout_s, gone)
        finally:
            self.watch.remove(ex)
            if self.holding(approval.run_id, -1):
                awaiting(False)
        return decided, stream

    def notify(self, approval: Approval) -> None:
        """The webhook: the pending approval with its id and where to decide it."""
        if not self.alerts.webhook:
            return
        body: dict[str, Any] = {
            "source": "tripwire",
            "event": "approval_requested",
            "decision_url": self.decision_url + approval.id,
            **approval.to_json(),
        }
        task = asyncio.create_task(
            self.alerts.poster.post_json(self.alerts.webhook, body), name="tripwire-alert"
        )
        self.alerts.in_flight.add(task)
        task.add_done_callback(self.alerts.in_flight.discard)

    async def start(self) -> None:
        await self.book.start()

    async def close(self) -> None:
        await self.watch.close()
        await self.book.close()


def covers_until(decision: Decision, decided: Decided, call_seq: int) -> int | None:
    """The last call an approved loop call covers (SPEC §5.5a): the loop goes on for `threshold`
    calls, this one the first, whichever pattern sees it; the next one asks again, as a loop fires
    on its threshold-th call. None for what is not a loop (a tool ask, a budget or limit)."""
    if decision.kind is None or decided.status != APPROVED:
        return None
    threshold = decision.threshold if isinstance(decision.threshold, int) else 1
    return call_seq + max(threshold, 1) - 1


def approval_book_for(settings: Settings, client: Any = None) -> ApprovalBook:
    """In Redis when `state` is set (every replica lists and decides every approval), else here;
    `client`: the process's one Redis client."""
    if settings.state.url:
        from proxy.approvals.shared import SharedApprovalBook

        return SharedApprovalBook(settings.state.url, client=client)
    return LocalApprovalBook()


def approvals_url(settings: Settings) -> str:
    """Where a person decides: the admin API's approvals, as the webhook names it."""
    host, port = split_host_port(settings.admin_listen)
    return f"http://{url_host(host)}:{port}/api/approvals/"
