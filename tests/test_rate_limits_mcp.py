"""Rate limits on MCP `tools/call` (SPEC §9, §5.5): the real mcp 2.x client sees the BLOCK result
saying when to try again, the session goes on, and the call goes through once the window moved.
Tool patterns match `SERVER__TOOL`; `tools` counts every tool of every server."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x

from mcp import Client  # noqa: E402

from proxy.constants import GUARD_RATE_LIMITED  # noqa: E402
from proxy.replay import replay_dir  # noqa: E402
from tests.conftest import Running, StartTripwire  # noqa: E402
from tests.pipeline_errors import no_pipeline_errors  # noqa: E402, F401 (autouse fixture)
from tests.schema import assert_run_valid  # noqa: E402
from tests.test_guards_e2e_mcp import shop  # noqa: E402

SESSION_URL = "/agents/bot/sessions/s1/mcp/shop"
WAIT_S = 30.0
RETRY_TEXT = re.compile(r"^\[tripwire\] rate limited: .*Try again in (\d+)s\.$")


def rate(*rules: tuple[str, int, float]) -> dict[str, Any]:
    return {"rate_limits": [{"match": m, "max_calls": n, "per_s": s} for m, n, s in rules]}


def refusal_of(result: Any) -> int | None:
    """The retry_after of a rate-limit BLOCK result (None: not one), checking its shape."""
    if not result.is_error:
        return None
    meta = result.model_dump(by_alias=True)["_meta"]["tripwire"]
    assert meta["guard"] == GUARD_RATE_LIMITED
    (text,) = [c.text for c in result.content]
    match = RETRY_TEXT.match(text)
    assert match is not None, text
    assert int(match.group(1)) == meta["retry_after"] >= 1
    return int(meta["retry_after"])


async def test_an_mcp_client_reads_when_to_retry_and_its_retry_goes_through(
    start_tripwire: StartTripwire,
) -> None:
    with shop() as upstream:
        tw: Running = await start_tripwire(
            mcp={"shop": {"url": upstream}}, guards=rate(("shop__set_price", 1, 3))
        )
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            # two at once: one goes through, the other is refused saying when to retry
            both = await asyncio.gather(
                *(client.call_tool("set_price", {"sku": "A1", "price": p}) for p in (1.0, 2.0))
            )
            assert sorted(refusal_of(r) or 0 for r in both) in ([0, 1], [0, 2], [0, 3])
            # another tool of the server is not under the pattern
            assert not (await client.call_tool("fetch_user", {"user_id": 1})).is_error
            # retried until the window moved (refused tries take no slot): the session goes on
            deadline = asyncio.get_running_loop().time() + WAIT_S
            while True:
                again = await client.call_tool("set_price", {"sku": "A1", "price": 2.0})
                if refusal_of(again) is None:
                    break
                assert asyncio.get_running_loop().time() < deadline, "the window never moved"
                await asyncio.sleep(0.1)
    await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    tool_calls = [e for e in events if e["event_type"] == "TOOL_CALL"]
    assert sorted(e["name"] for e in tool_calls) == ["fetch_user", "set_price", "set_price"]
    errors = [e for e in events if e["event_type"] == "ERROR"]
    assert errors and {e["payload"]["guardrail"] for e in errors} == {GUARD_RATE_LIMITED}
    assert tw.run_json(run_id)["status"] != "error"
    # replay: the calls that went through replay as decided live; the rate limit (per agent, outside
    # the run) is listed as recorded, not recomputed
    replay = replay_dir(tw.data_dir / "runs" / run_id)
    assert replay.replayed_checks == replay.live and len(replay.live) == 3
    listed = [d for d in replay.decisions if d.guard == GUARD_RATE_LIMITED]
    assert len(listed) == len(errors) and all(not d.replayed and d.action == "block" for d in listed)
    # a refused call is no call of the run: listed at the run's last call before it
    assert all(d.call_index == 2 for d in listed[1:])


async def test_tools_counts_every_tool_call(start_tripwire: StartTripwire) -> None:
    with shop() as upstream:
        tw = await start_tripwire(mcp={"shop": {"url": upstream}}, guards=rate(("tools", 2, 60)))
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            assert not (await client.call_tool("fetch_user", {"user_id": 1})).is_error
            assert not (await client.call_tool("get_record", {"record_id": 1})).is_error
            refused = await client.call_tool("fetch_orders", {"user_id": 1})
            retry_after = refusal_of(refused)
            assert retry_after is not None and 1 <= retry_after <= 60
