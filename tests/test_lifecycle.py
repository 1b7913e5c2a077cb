"""`running_engine`, the one lifecycle `tripwire serve` and the mitmproxy addon share: upstreams
the host registers are routed, the engine is started inside and closed on the way out (open runs
end), also when the body fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.lifecycle import running_engine
from proxy.settings import UpstreamConfig
from tests.factories import engine_settings, make_session


async def test_registered_upstreams_and_runs_closed_on_exit(tmp_path: Path) -> None:
    extra = [("llm", "intercepted", UpstreamConfig(url="http://127.0.0.1:7/v1"))]
    async with running_engine(engine_settings(tmp_path), argv=["tripwire"], upstreams=extra) as engine:
        assert engine.upstreams.names("llm") == ("intercepted",)
        assert engine.forwarder.session is not None and not engine.forwarder.session.closed
        session = make_session(engine, "bot", "s1")
    assert session.ended and engine.forwarder.session.closed
    events = (engine.data_dir / "runs" / session.run_id / "events.jsonl").read_text().splitlines()
    assert '"RUN_END"' in events[-1]


async def test_the_engine_closes_when_the_host_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        async with running_engine(engine_settings(tmp_path), argv=["tripwire"]) as engine:
            session = make_session(engine, "bot", None)
            raise RuntimeError("a listener could not bind")
    assert session.ended
