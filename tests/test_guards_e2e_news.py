"""What counts as news, end to end over MCP (SPEC §5.1, issue 21 items 1-3), with the real mcp 2.x
client, and replayed: the same decisions from the recorded fingerprints.

Stuck: a deploy failing again and again, each error carrying a fresh base62 trace id and an attempt
counter: refused within max(threshold + 1, 2k) = 6 calls under `action: block`. Honest: a job poll
whose percentage moves, with a poll counter and a trace id in every answer: never refused.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x

from mcp import Client  # noqa: E402
from mcp.server.mcpserver import MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402

from proxy.replay import replay_dir  # noqa: E402
from tests.conftest import StartTripwire  # noqa: E402
from tests.mcp_servers import ServerThread  # noqa: E402
from tests.pipeline_errors import no_pipeline_errors  # noqa: E402, F401 (autouse fixture)
from tests.test_guards_e2e_mcp import only, text_of  # noqa: E402
from tests.test_replay import assert_replays_live, firings, run_dir_of  # noqa: E402

SESSION_URL = "/agents/bot/sessions/news-1/mcp/ops"
BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
CAUGHT_BY = 6


def trace_id(n: int) -> str:
    digest = hashlib.sha256(f"trace:{n}".encode()).digest()
    return "".join(BASE62[b % 62] for b in digest[:22])


@contextmanager
def ops_server(hits: Counter[str]) -> Iterator[str]:
    server = MCPServer("tripwire-news")

    @server.tool()
    def deploy(service: str) -> str:
        """Deploy a service."""
        hits["deploy"] += 1
        raise ToolError(f"Internal error (trace {trace_id(hits['deploy'])}, attempt {hits['deploy']} of 10)")

    @server.tool()
    def job_status(job: str) -> str:
        """A job's progress."""
        hits["job_status"] += 1
        n = hits["job_status"]
        return f"job {job}: running {min(100, 7 * n)}% (poll {n}, trace {trace_id(100 + n)})"

    thread = ServerThread(server.streamable_http_app())
    base = thread.start()
    try:
        yield base + "/mcp"
    finally:
        thread.stop()


async def test_the_same_failure_with_a_fresh_trace_id_and_attempt_counter_is_refused(
    start_tripwire: StartTripwire,
) -> None:
    hits: Counter[str] = Counter()
    with ops_server(hits) as upstream:
        tw = await start_tripwire(
            mcp={"ops": {"url": upstream}}, guards={"loop_detection": {"action": "block"}}
        )
        texts: list[str] = []
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            for _ in range(8):  # until it is refused
                result = await client.call_tool("deploy", {"service": "api"})
                texts.append(text_of(result)[0])
                if texts[-1].startswith("[tripwire"):
                    break
        d, events = await run_dir_of(tw)
    refused = [i + 1 for i, t in enumerate(texts) if t.startswith("[tripwire")]
    assert refused and refused[0] <= CAUGHT_BY, texts
    assert hits["deploy"] == refused[0] - 1  # the refused call never reached the server
    assert only(events, "ERROR")[0]["payload"]["guardrail"] == "loop_detection"
    replay = replay_dir(d)
    assert_replays_live(replay)
    assert any(kind == "retry_no_progress" or kind == "repetition" for _, _, kind, _ in firings(replay))


async def test_a_poll_whose_percentage_moves_is_untouched_whatever_its_counter_and_trace_id(
    start_tripwire: StartTripwire,
) -> None:
    hits: Counter[str] = Counter()
    with ops_server(hits) as upstream:
        tw = await start_tripwire(
            mcp={"ops": {"url": upstream}}, guards={"loop_detection": {"action": "block"}}
        )
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            texts = [text_of(await client.call_tool("job_status", {"job": "etl"}))[0] for _ in range(14)]
        d, events = await run_dir_of(tw)
    assert not any(t.startswith("[tripwire") for t in texts), texts
    assert hits["job_status"] == 14
    assert [e for e in only(events, "LOOP_WARNING") if e["payload"]["kind"] != "cycle"] == []
    assert replay_dir(d).decisions == []
