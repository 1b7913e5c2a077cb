"""The approvals service the guard stage and the admin API share (SPEC §5.5a)."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from proxy.alerts import Alerts
from proxy.approvals.book import APPROVED, DENIED, WITHDRAWN, Approval, ApprovalBook, LocalApprovalBook
from proxy.approvals.hold import HeldStream, Watch, held_call, held_stream_for
from proxy.exchange import Exchange
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

    def __init__(self, book: ApprovalBook, metrics: Metrics, alerts: Alerts, decision_url: str) -> None:
        self.book = book
        self.metrics = metrics
        self.alerts = alerts
        self.decision_url = decision_url  # the admin API's `/api/approvals/`, for the webhook
        self.watch = Watch()
        # (run_id, guard, kind) -> the last call_seq of an approved streak that asks no more: the
        # same streak asks again only once it goes on `threshold` more calls (SPEC §5.5a)
        self._quiet: dict[tuple[str, str, str | None], int] = {}
        self.held = 0  # calls this process holds now (the gauge)
        self.held_runs: collections.Counter[str] = collections.Counter()  # runs tagged awaiting_approval

    def quiet(self, run_id: str, guard: str, kind: str | None, call_seq: int) -> bool:
        """An approved streak going on: this call is let through without asking."""
        until = self._quiet.get((run_id, guard, kind))
        return until is not None and call_seq <= until

    def approved_streak(self, run_id: str, guard: str, kind: str | None, call_seq: int, calls: int) -> None:
        self._quiet[(run_id, guard, kind)] = call_seq + calls - 1  # the T-th call on asks, as a loop fires

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
