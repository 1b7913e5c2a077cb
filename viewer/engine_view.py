"""What the admin app reads of the engine: `EngineView`, checked by mypy, not a prose convention.

`proxy.engine.Engine` satisfies it (mypy checks that where `proxy.app.make_admin_app` hands its engine
to `viewer.api.setup_admin`, and tests/test_viewer_api.py checks every member at run time), and so
does the tests' stand-in (tests/viewer_fixtures.py, in mypy's `files`). The members are read-only
properties so an implementation may hold a narrower type (a `TraceRecorder` for `RecorderView`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from proxy.guard_store import GuardConfigStore
from proxy.metrics import Metrics


@runtime_checkable
class RecorderView(Protocol):
    """The trace recorder's part: renaming and deleting runs, and whether a run is live here."""

    async def rename_run(self, run_id: str, name: str) -> dict[str, Any] | None:
        """The new run.json; None when there is no such run."""
        ...

    async def discard_run(self, run_id: str) -> None:
        """Forget the run and wait out a write in flight, so deleting its directory cannot race one."""
        ...

    def is_open(self, run_id: str) -> bool: ...

    def summary(self, run_id: str) -> dict[str, Any]:
        """RUN_END's summary of a run this recorder knows; {} for one it does not."""
        ...


@runtime_checkable
class EngineView(Protocol):
    """Everything viewer/api.py reads of the engine."""

    @property
    def data_dir(self) -> Path: ...

    @property
    def recorder(self) -> RecorderView: ...

    @property
    def guard_store(self) -> GuardConfigStore: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def draining(self) -> bool:
        """SIGTERM started the drain: `/readyz` answers 503 from then on."""
        ...

    @property
    def admin_token(self) -> str | None:
        """None: the admin API asks for no token."""
        ...

    def health(self) -> dict[str, Any]:
        """`/healthz`'s report; its `trace_store` part also feeds the store gauges of `/metrics`."""
        ...

    async def terminate_run(self, run_id: str) -> bool:
        """The kill switch; False when the run has no live session."""
        ...

    def guard_stats(self, run_id: str) -> dict[str, Any] | None:
        """The live session's guard counters; None when there is no live session."""
        ...
