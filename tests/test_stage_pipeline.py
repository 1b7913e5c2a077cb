"""`Pipeline.run` alone: request hooks in order, finish hooks unwinding in reverse, an answer stops
later request hooks but every finish runs, `fail_open` stages are skipped when they raise."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from proxy.exchange import Answer, Exchange
from proxy.pipeline import BaseStage, Pipeline
from tests.factories import make_exchange


class Probe(BaseStage):
    """A stage that writes what happened to a shared log; optionally answers or raises."""

    def __init__(
        self,
        name: str,
        log: list[str],
        *,
        answer: bool = False,
        raise_on_request: bool = False,
        raise_on_finish: bool = False,
        fail_open: bool = False,
    ) -> None:
        self.name = name
        self.log = log
        self.answer = answer
        self.raise_on_request = raise_on_request
        self.raise_on_finish = raise_on_finish
        self.fail_open = fail_open

    async def request(self, ex: Exchange) -> None:
        self.log.append(f"request:{self.name}")
        if self.raise_on_request:
            raise RuntimeError(f"{self.name} broke")
        if self.answer:
            ex.answer = Answer(429, b"{}")

    async def finish(self, ex: Exchange) -> None:
        self.log.append(f"finish:{self.name}")
        if self.raise_on_finish:
            raise RuntimeError(f"{self.name} broke on finish")


async def test_request_hooks_in_order_and_finish_hooks_in_reverse() -> None:
    log: list[str] = []
    await Pipeline([Probe("a", log), Probe("b", log), Probe("c", log)]).run(make_exchange())
    assert log == ["request:a", "request:b", "request:c", "finish:c", "finish:b", "finish:a"]


async def test_an_answer_skips_later_request_hooks_but_every_finish_runs() -> None:
    log: list[str] = []
    ex = make_exchange()
    await Pipeline([Probe("a", log), Probe("guard", log, answer=True), Probe("forward", log)]).run(ex)
    assert log == ["request:a", "request:guard", "finish:forward", "finish:guard", "finish:a"]
    assert ex.answer is not None and ex.answer.status == 429


async def test_an_exchange_already_answered_runs_no_request_hook() -> None:
    log: list[str] = []
    ex = make_exchange()
    ex.answer = Answer(400, b"{}")
    await Pipeline([Probe("a", log), Probe("b", log)]).run(ex)
    assert log == ["finish:b", "finish:a"]


async def test_a_fail_open_stage_that_raises_is_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []
    with caplog.at_level(logging.ERROR, logger="tripwire.pipeline"):
        await Pipeline(
            [Probe("guards", log, raise_on_request=True, fail_open=True), Probe("forward", log)]
        ).run(make_exchange())
    assert log == ["request:guards", "request:forward", "finish:forward", "finish:guards"]
    assert any("stage guards failed on request" in r.getMessage() for r in caplog.records)


async def test_a_failing_stage_that_is_not_fail_open_raises_after_every_finish_ran() -> None:
    log: list[str] = []
    pipeline = Pipeline([Probe("a", log), Probe("parse", log, raise_on_request=True), Probe("forward", log)])
    with pytest.raises(RuntimeError, match="parse broke"):
        await pipeline.run(make_exchange())
    assert log == ["request:a", "request:parse", "finish:forward", "finish:parse", "finish:a"]


async def test_a_finish_that_raises_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []
    with caplog.at_level(logging.ERROR, logger="tripwire.pipeline"):
        await Pipeline([Probe("a", log), Probe("b", log, raise_on_finish=True), Probe("c", log)]).run(
            make_exchange()
        )
    assert log[3:] == ["finish:c", "finish:b", "finish:a"]
    assert any("stage b failed on finish" in r.getMessage() for r in caplog.records)


async def test_base_stage_hooks_do_nothing() -> None:
    ex = make_exchange()
    await Pipeline([BaseStage()]).run(ex)
    assert ex.answer is None and ex.response is None and not ex.forwarded


def test_a_new_exchange_has_every_fields_default() -> None:
    """Exchange's own __init__ sets only the call's inputs: every other field reads as its declared
    default, and a default made per instance (a list) is not shared between two calls."""
    a = Exchange(request=None, route=None, body=b"", started=0.0, started_wall=0.0)  # type: ignore[arg-type]
    b = Exchange(request=None, route=None, body=b"", started=0.0, started_wall=0.0)  # type: ignore[arg-type]
    for f in dataclasses.fields(Exchange):
        if f.default_factory is not dataclasses.MISSING:
            assert getattr(a, f.name) == f.default_factory(), f.name
            assert getattr(a, f.name) is not getattr(b, f.name), f.name
        elif f.default is not dataclasses.MISSING:
            assert getattr(a, f.name) == f.default, f.name
