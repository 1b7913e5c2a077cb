"""The viewer's Keys page in headless Chromium against a live Tripwire on 127.0.0.1 (SPEC §9): create
shows the key once, the key then works with the openai SDK, the list shows it, Revoke refuses it."""

from __future__ import annotations

import re

import openai
import pytest

from tests.conftest import StartTripwire
from tests.fakes import FakeUpstream
from tests.test_browser import pytestmark  # noqa: F401 (the same skips and marks)

try:
    from playwright.async_api import Browser, async_playwright, expect
except ImportError:  # pragma: no cover - depends on the environment
    async_playwright = None  # type: ignore[assignment]


async def status_of(base: str, key: str) -> int:
    try:
        await openai.AsyncOpenAI(base_url=base + "/v1", api_key=key, max_retries=0).chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "hi"}],
        )
    except openai.APIStatusError as e:
        return e.status_code
    return 200


async def test_keys_page_creates_shows_once_lists_and_revokes(
    browser: Browser,
    start_tripwire: StartTripwire,
    fake_upstream: tuple[FakeUpstream, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, url = fake_upstream
    monkeypatch.setenv("TW_TEST_UPSTREAM_KEY", "sk-upstream")
    tw = await start_tripwire(
        auth={"require_agent_key": True}, upstream={"url": url, "api_key_env": "TW_TEST_UPSTREAM_KEY"}
    )
    page = await browser.new_page()
    await page.goto(tw.admin_url + "/")
    await page.click("#nav-keys")
    await expect(page.locator("#view-keys")).to_be_visible()
    await expect(page.locator("#view-runs")).to_be_hidden()

    await page.fill("#key-agent", "")
    await page.click("#btn-create-key")
    await expect(page.locator("#key-error")).to_contain_text("agent")

    await page.fill("#key-agent", "research-agent")
    await page.fill("#key-expires", "30d")
    await page.fill("#key-note", "from the browser")
    await page.click("#btn-create-key")
    shown = page.locator("#key-new-value")
    await expect(shown).to_have_text(re.compile(r"^tw_[A-Za-z0-9_-]{43}$"))
    key = await shown.text_content()
    assert key is not None
    row = page.locator("#key-rows tr")
    await expect(row).to_have_count(1)
    await expect(row).to_contain_text("research-agent")
    await expect(row).to_contain_text("active")
    await expect(row).to_contain_text("from the browser")
    assert key not in await page.locator("#key-table").inner_text()
    assert await status_of(tw.url, key) == 200

    # shown once: leaving the page and coming back does not show it again
    await page.click("#nav-runs")
    await expect(page.locator("#view-keys")).to_be_hidden()
    await page.click("#nav-keys")
    await expect(page.locator("#key-new")).to_be_hidden()
    assert key not in await page.content()

    await row.locator("button", has_text="Revoke").click()
    await expect(row).to_contain_text("revoked")
    await expect(row.locator("button")).to_have_count(0)
    assert await status_of(tw.url, key) == 401
