"""The viewer's Pins page in headless Chromium (docs/mcp.md "Changed tools", issue 34): against the
real proxy and a server whose `fetch` description changes after the first list, read with the real
mcp 2.x client; the page shows the diff, and Approve pins the offered definition (the client's next
list shows it) or Deny keeps the tool out."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x

from tests.mcp_servers import connect  # noqa: E402
from tests.pin_servers import HONEST, POISONED, ChangingServer  # noqa: E402
from tests.test_browser import new_page, pytestmark  # noqa: E402, F401

try:
    from playwright.async_api import Browser, expect
except ImportError:  # pragma: no cover - depends on the environment
    pass


async def listed(client: Any) -> dict[str, str]:
    return {t.name: t.description for t in (await client.list_tools()).tools}


@pytest.mark.parametrize("decision", ["Approve", "Deny"])
async def test_the_pins_page_shows_the_diff_and_decides(
    browser: Browser, start_tripwire: Any, decision: str
) -> None:
    with ChangingServer() as srv:
        upstream = srv.start()
        tw = await start_tripwire(mcp={"files": {"url": upstream}}, admin_token="hunter2")
        page = await new_page(browser)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("dialog", lambda d: d.accept())
        await page.add_init_script("sessionStorage.setItem('tripwire_admin_token', 'hunter2')")
        async with connect("legacy", f"{tw.url}/mcp/files") as client:
            assert (await listed(client))["fetch"] == HONEST
            srv.rug_pull()
            assert "fetch" not in await listed(client)
            await page.goto(tw.admin_url + "/?view=pins")
            server = page.locator('.pin-server[data-server="files"]')
            await expect(server.locator('.pin-table tr[data-tool="fetch"]')).to_contain_text(HONEST)
            change = server.locator('.pin-change[data-tool="fetch"]')
            await expect(change).to_contain_text("changed")
            row = change.locator('tr[data-field="description"]')
            await expect(row.locator(".pin-from")).to_have_text(HONEST)
            await expect(row.locator(".pin-to")).to_have_text(POISONED)
            await change.get_by_role("button", name=decision).click()
            if decision == "Approve":
                await expect(change).to_have_count(0)
                await expect(server.locator('.pin-table tr[data-tool="fetch"]')).to_contain_text(
                    "<IMPORTANT>"
                )
                assert (await listed(client))["fetch"] == POISONED
            else:
                await expect(change).to_contain_text("denied")
                await expect(change.get_by_role("button", name="Deny")).to_have_count(0)
                assert "fetch" not in await listed(client)
                refused = await client.call_tool("fetch", {"url": "x"})
                assert refused.is_error is True
            await server.get_by_role("button", name="Reset pins").click()
            await expect(change).to_have_count(0)
            assert (await listed(client))["fetch"] == POISONED  # pinned afresh
    assert errors == []


async def test_an_agents_tool_pins_are_edited_on_the_agents_page(
    browser: Browser, start_tripwire: Any
) -> None:
    """The Agents page's guard form has the `tool_pins` section; saving it sets the agent's actions,
    which its next list follows (warn: the changed tool is listed)."""
    with ChangingServer() as srv:
        upstream = srv.start()
        tw = await start_tripwire(mcp={"files": {"url": upstream}}, admin_token="hunter2")
        page = await new_page(browser)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        await page.add_init_script("sessionStorage.setItem('tripwire_admin_token', 'hunter2')")
        async with connect("legacy", f"{tw.url}/agents/lax/mcp/files") as client:
            await listed(client)  # the agent is known (and the tools pinned)
            await page.goto(tw.admin_url + "/?view=agents&agent=lax")
            section = page.locator('fieldset[data-section="tool_pins"]')
            await expect(section).to_contain_text("MCP tool pins")
            await expect(page.locator("#f-tool_pins-tool_changes")).to_have_value("ask")
            await page.locator("#f-tool_pins-tool_changes").select_option("warn")
            await page.locator("#btn-save-guards").click()
            await expect(page.locator("#guard-banner")).to_have_text("Agent-specific config")
            assert tw.engine.guards.config("lax").tool_pins.tool_changes == "warn"
            srv.rug_pull()
            assert (await listed(client))["fetch"] == POISONED  # warn: listed, reported
    assert errors == []
