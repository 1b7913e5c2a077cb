"""The request pipeline: an ordered list of stages, one concern each (as mitmproxy's addons).

Each stage may implement `request(ex)` (before the upstream; a guard answers by setting
`ex.answer`, and later stages' `request` hooks are skipped) and `finish(ex)` (every stage, always,
whatever happened to the request hooks, once the
client has its answer: write trace events, settle budgets, update breakers). `request` hooks run
in list order and `finish` hooks unwind in reverse, like middleware: the record stage writes the
call's event before the guards that ran before it write what they concluded from it. A failing stage marked `fail_open` is logged and skipped: a guard bug must
not drop an agent's call.
"""

from __future__ import annotations

import logging
from typing import Protocol

from proxy.exchange import Exchange

log = logging.getLogger("tripwire.pipeline")


class Stage(Protocol):
    name: str
    fail_open: bool

    async def request(self, ex: Exchange) -> None: ...

    async def finish(self, ex: Exchange) -> None: ...


class BaseStage:
    name = "stage"
    fail_open = False

    async def request(self, ex: Exchange) -> None:
        return None

    async def finish(self, ex: Exchange) -> None:
        return None


def _implements(stage: Stage, hook: str) -> bool:
    """The stage has a hook of its own (not BaseStage's no-op)."""
    return getattr(type(stage), hook, None) is not getattr(BaseStage, hook)


class Pipeline:
    def __init__(self, stages: list[Stage]) -> None:
        self._set(stages)

    def _set(self, stages: list[Stage]) -> None:
        self.stages: tuple[Stage, ...] = tuple(stages)
        # only the hooks that do something are awaited: a no-op hook is a coroutine made, run and
        # dropped per call (half the pipeline's hooks are no-ops)
        self._requests = [s for s in stages if _implements(s, "request")]
        self._finishes = [s for s in reversed(stages) if _implements(s, "finish")]

    def insert_after(self, name: str, stage: Stage) -> None:
        """Put `stage` right after the stage called `name` (tests and plug-ins)."""
        stages = list(self.stages)
        stages.insert([s.name for s in stages].index(name) + 1, stage)
        self._set(stages)

    async def run(self, ex: Exchange) -> None:
        try:
            for stage in self._requests:
                if ex.answer is not None or ex.response is not None:
                    break
                try:
                    await stage.request(ex)
                except Exception:
                    if not stage.fail_open:
                        raise
                    log.exception("stage %s failed on request; carrying on (fail open)", stage.name)
        finally:
            for stage in self._finishes:
                try:
                    await stage.finish(ex)
                except Exception:
                    log.exception("stage %s failed on finish", stage.name)
