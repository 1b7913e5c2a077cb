"""The agent panel's gateway policy in headless Chromium (viewer/static/spend.js): tool permissions,
rate limits and a bar per budget window of a live Tripwire whose agent spent through the real
`openai` SDK against a fake upstream on 127.0.0.1; the Reset button empties the window."""

from __future__ import annotations

import datetime as dt
from typing import Any

import openai

from tests.conftest import AGENT_KEY, StartTripwire
from tests.fakes import FakeUpstream, Reply
from tests.test_browser import async_playwright, new_page, pytestmark  # noqa: F401

if async_playwright is not None:
    from playwright.async_api import Browser, expect

NOON = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.UTC).timestamp()


async def test_the_agent_panel_shows_permissions_rate_limits_and_a_bar_per_window(
    browser: Browser, start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="ok", prompt_tokens=7, completion_tokens=10)
    agent: dict[str, Any] = {
        "budget_windows": [
            {"period": "day", "max_cost_usd": 10, "soft_alert_pct": 20},
            {"period": "month", "max_tokens": 1000},
        ],
        "tools": {"deny": ["files__delete_*"]},
        "rate_limits": [{"match": "llm", "max_calls": 30, "per_s": 60}],
    }
    tw = await start_tripwire(
        upstream={"url": url}, pricing_table={"window-model": [0.0, 100_000.0]}, agents={"spender": agent}
    )
    tw.engine.windows.clock = lambda: NOON
    llm = openai.AsyncOpenAI(
        base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers={"X-Tripwire-Agent": "spender"}
    )
    for _ in range(3):  # $1.00 and 17 tokens each
        await llm.chat.completions.create(
            model="window-model", messages=[{"role": "user", "content": "hi"}], max_tokens=10
        )
    await tw.flush()

    page = await new_page(browser)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    await page.goto(tw.admin_url + "/?view=agents&agent=spender")
    panel = page.locator("#agent-policy")
    await expect(panel.locator("#agent-tools")).to_contain_text("files__delete_*")
    await expect(panel.locator("#agent-rates")).to_contain_text("llm: at most 30 calls per 60 s")
    day = panel.locator('.window[data-period="day"]')
    await expect(day).to_contain_text("day:2026-11-27")
    await expect(day).to_contain_text("$3.00 spent + $0.00 reserved of $10.00")
    await expect(day).to_contain_text("soft alert")
    await expect(day.locator('[role="meter"]')).to_have_attribute("aria-valuenow", "30.0")
    month = panel.locator('.window[data-period="month"]')
    await expect(month).to_contain_text("51 + 0 reserved of 1000 tokens")
    # the panel sits beside the agent's Guards, before their form
    assert await page.evaluate(
        "document.querySelector('#agent-policy').compareDocumentPosition("
        "document.querySelector('#guard-form')) & Node.DOCUMENT_POSITION_FOLLOWING"
    )

    await day.locator("button[data-reset]").click()
    await expect(day).to_contain_text("$0.00 spent")
    await expect(day.locator('[role="meter"]')).to_have_attribute("aria-valuenow", "0.0")
    await expect(month).to_contain_text("51 + 0 reserved")  # only the day was reset
    assert errors == []
