"""Is the shared state reachable, and what do calls get while it is not (SPEC §8 failure policy).

`fail_open` (default): calls go on, guarded from this replica's memory; `fail_closed`: calls are
refused with guard code `state_unavailable` (503 + Retry-After). Either way an outage is logged
loudly once when it starts and once when it ends, reported in /healthz's body and by the gauge
`tripwire_state_backend_up`; readiness is untouched (SPEC §6: taking replicas out of service would
not bring Redis back). While the backend is down no call waits on it: calls fail at once and one
background probe (PING every `probe_interval_s`) notices when it is back; no restart is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from proxy.state.base import StateBackend, StateUnavailable

log = logging.getLogger("tripwire.state")

Policy = Literal["fail_open", "fail_closed"]
T = TypeVar("T")

PROBE_INTERVAL_S = 1.0


class StateLink:
    def __init__(
        self,
        backend: StateBackend,
        policy: Policy = "fail_open",
        *,
        probe_interval_s: float = PROBE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.policy = policy
        self.probe_interval_s = probe_interval_s
        self.listeners: list[Callable[[bool], None]] = []  # told when it goes down (False) or up
        self.clock = clock
        self.up = True
        self.down_since: float | None = None
        self.last_error: str | None = None
        self.outages = 0
        self.calls_while_down = 0  # calls that did not reach the backend during the current outage
        self._probe: asyncio.Task[None] | None = None

    @property
    def fail_open(self) -> bool:
        return self.policy == "fail_open"

    def retry_after_s(self) -> float:
        """What a refused call (fail_closed) is told to wait: about one probe."""
        return max(1.0, self.probe_interval_s)

    async def call(self, op: Callable[[], Awaitable[T]]) -> T:
        """Run one backend operation; while the backend is down, fail at once."""
        if not self.up:
            self.calls_while_down += 1
            raise StateUnavailable(self.last_error or "state backend unavailable")
        try:
            return await op()
        except StateUnavailable as e:
            self.mark_down(str(e))
            raise

    def mark_down(self, error: str) -> None:
        self.last_error = error
        if not self.up:
            return
        self.up = False
        self.down_since = self.clock()
        self.outages += 1
        self.calls_while_down = 0
        what = "calls go on, guarded from this replica's memory" if self.fail_open else "calls are refused"
        log.error(
            "state.unavailable backend=%s policy=%s error=%r: %s until it is back (probing every %.1fs)",
            self.backend.name,
            self.policy,
            error,
            what,
            self.probe_interval_s,
        )
        self._tell(False)
        self._start_probe()

    def mark_up(self) -> None:
        if self.up:
            return
        down_for = self.clock() - (self.down_since or self.clock())
        self.up = True
        self.down_since = None
        log.warning(
            "state.recovered backend=%s after %.1fs; %d call(s) did not reach it meanwhile",
            self.backend.name,
            down_for,
            self.calls_while_down,
        )
        self._tell(True)

    def _tell(self, up: bool) -> None:
        for listener in self.listeners:
            try:
                listener(up)
            except Exception:
                log.exception("state.listener_failed")

    def _start_probe(self) -> None:
        if self._probe is not None and not self._probe.done():
            return
        try:
            self._probe = asyncio.get_running_loop().create_task(
                self._probe_until_up(), name="tripwire-state-probe"
            )
        except RuntimeError:
            self._probe = None  # no loop (a sync caller): the next `probe()` call will do it

    async def _probe_until_up(self) -> None:
        while not self.up:
            await asyncio.sleep(self.probe_interval_s)
            await self.probe()

    async def probe(self) -> bool:
        try:
            await self.backend.ping()
        except StateUnavailable as e:
            self.last_error = str(e)
            return False
        self.mark_up()
        return True

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        await self.backend.close()

    def health(self) -> dict[str, Any]:
        """For /healthz's body."""
        out: dict[str, Any] = {"backend": self.backend.name, "up": self.up, "on_unavailable": self.policy}
        if not self.up:
            out["down_for_s"] = round(self.clock() - (self.down_since or self.clock()), 3)
            out["last_error"] = self.last_error
            out["calls_while_down"] = self.calls_while_down
        out["outages"] = self.outages
        return out
