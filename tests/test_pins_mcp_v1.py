"""Pinned tool definitions with the mcp 1.x SDK (docs/mcp.md "Changed tools", issue 34): the
description of `fetch` changes after the first list; the tool is held back from the next list and
its call held for a person; approving re-pins it, denying keeps it out. Runs in `.venv-mcp1`
(`pytest -m mcp1`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("mcp.server.fastmcp")  # mcp 1.x only

from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402

from tests.conftest import StartTripwire  # noqa: E402
from tests.pin_servers import HONEST, POISONED, ChangingServer  # noqa: E402
from tests.test_approvals import approvals, decide, until  # noqa: E402

pytestmark = pytest.mark.mcp1


async def names(s: ClientSession) -> dict[str, str | None]:
    return {t.name: t.description for t in (await s.list_tools()).tools}


@pytest.mark.parametrize(
    "path,prefix", [("/mcp/files", ""), ("/mcp", "files__")], ids=["direct", "aggregate"]
)
@pytest.mark.parametrize("json_response", [False, True], ids=["sse-answers", "json-answers"])
@pytest.mark.parametrize("decision", ["approve", "deny"])
async def test_a_changed_description_is_held(
    start_tripwire: StartTripwire, path: str, prefix: str, json_response: bool, decision: str
) -> None:
    with ChangingServer(json_response=json_response) as srv:
        upstream = srv.start()
        tw = await start_tripwire(mcp={"files": {"url": upstream}}, admin_token="hunter2")
        url = f"{tw.url}/agents/bot/sessions/v1{path}"
        async with streamablehttp_client(url) as (read, write, _), ClientSession(read, write) as s:
            await s.initialize()
            assert (await names(s))[prefix + "fetch"] == HONEST
            srv.rug_pull()
            assert prefix + "fetch" not in await names(s)
            held = asyncio.create_task(s.call_tool(prefix + "fetch", {"url": "b"}))
            (approval,) = await until(lambda: approvals(tw), "the changed tool's call held")
            assert approval["guard"] == "tool_changed"
            assert approval["call"]["tool_change"]["diff"]["description"]["to"] == POISONED
            status, _ = await decide(tw, approval["id"], {"decision": decision, "note": "rug pull"})
            assert status == 200
            result: Any = await held
            after = await names(s)
    if decision == "approve":
        assert result.isError is False and "fetched b" in result.content[0].text
        assert after[prefix + "fetch"] == POISONED
    else:
        assert result.isError is True and "rug pull" in result.content[0].text
        assert prefix + "fetch" not in after
