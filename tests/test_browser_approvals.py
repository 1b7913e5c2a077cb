"""The viewer's approvals queue and Resume button in headless Chromium (SPEC §5.5a, issue 23 items 3
and 4): against a stand-in approvals API (what is shown and what is posted), and against the real
proxy with the real `openai` SDK (a killed run resumed from the viewer, its next call served in a
linked run)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import AGENT_KEY
from tests.test_browser import new_page, pytestmark, save_copy  # noqa: F401
from tests.viewer_fixtures import FakeEngine, write_run
from viewer.api import setup_admin

try:
    from playwright.async_api import Browser, Page, expect
except ImportError:  # pragma: no cover - depends on the environment
    pass


def approval(run_id: str, **over: Any) -> dict[str, Any]:
    now = time.time()
    base: dict[str, Any] = {
        "id": "a1",
        "agent": "research-agent",
        "session_id": "s1",
        "run_id": run_id,
        "guard": "loop_detection",
        "kind": "repetition",
        "message": "search called 5 times with the same arguments",
        "threshold": 5,
        "actual": 5,
        "call": {"tool": "docs__search", "arguments": {"q": "same words"}, "server": "docs"},
        "approving": "forwards this call",
        "requested_at": now,
        "timeout_s": 120,
        "expires_at": now + 120,
        "status": "pending",
    }
    return {**base, **over}


class FakeApprovals:
    """`GET /api/approvals` and `POST /api/approvals/{id}` as the `ask` helper's API answers them."""

    def __init__(self) -> None:
        self.pending: list[dict[str, Any]] = []
        self.decisions: list[tuple[str, dict[str, Any]]] = []

    async def listing(self, request: web.Request) -> web.Response:
        return web.json_response({"approvals": self.pending})

    async def decide(self, request: web.Request) -> web.Response:
        approval_id = request.match_info["approval_id"]
        found = [a for a in self.pending if a["id"] == approval_id]
        if not found:
            return web.json_response({"detail": f"no approval {approval_id!r}"}, status=404)
        body = await request.json()
        if body.get("raise") and body["raise"].get("max_cost_usd", 1) < 0.5:
            return web.json_response({"detail": "raise: max_cost_usd 0.1 is not above the spend"}, status=400)
        self.decisions.append((approval_id, body))
        self.pending = [a for a in self.pending if a["id"] != approval_id]
        return web.json_response(
            {**found[0], "status": "approved" if body["decision"] == "approve" else "denied"}
        )


async def start_admin(data_dir: Path, approvals: FakeApprovals) -> TestServer:
    app = web.Application()
    setup_admin(app, FakeEngine(data_dir))
    app.router.add_get("/api/approvals", approvals.listing)
    app.router.add_post("/api/approvals/{approval_id}", approvals.decide)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


# the page's document.hidden and Notification, under the test's control
HIDDEN_AND_NOTIFY = """
window.__hidden = false;
Object.defineProperty(Document.prototype, 'hidden', { get() { return window.__hidden; }, configurable: true });
Object.defineProperty(Document.prototype, 'visibilityState', { get() { return window.__hidden ? 'hidden' : 'visible'; }, configurable: true });
window.__notes = [];
window.Notification = class { constructor(title, opts) { window.__notes.push({ title, body: (opts || {}).body }); } close() {} };
window.Notification.permission = 'default';
window.Notification.requestPermission = () => { window.Notification.permission = 'granted'; return Promise.resolve('granted'); };
"""


async def set_hidden(page: Page, hidden: bool) -> None:
    await page.evaluate(
        f"window.__hidden = {'true' if hidden else 'false'}; document.dispatchEvent(new Event('visibilitychange'))"
    )


async def test_the_queue_shows_each_held_call_and_posts_the_decision(
    browser: Browser, tmp_path: Path
) -> None:
    approvals = FakeApprovals()
    server = await start_admin(tmp_path, approvals)
    base = str(server.make_url("/")).rstrip("/")
    run_id = write_run(tmp_path, status="running")
    try:
        page = await new_page(browser)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        await page.add_init_script(HIDDEN_AND_NOTIFY)
        await page.goto(base + "/?poll_runs=1&view=agents")
        badge = page.locator("#approvals-badge")
        await expect(badge).to_contain_text("0")
        await expect(page.locator("#approvals")).to_be_hidden()

        approvals.pending = [approval(run_id)]
        await expect(badge).to_contain_text("1")
        item = page.locator('.approval[data-approval-id="a1"]')
        await expect(item).to_contain_text("loop_detection · repetition")
        await expect(item).to_contain_text("docs__search")
        await expect(item.locator(".approval-args")).to_contain_text('"q": "same words"')
        await expect(item).to_contain_text("threshold 5 · actual 5")
        await expect(item.locator(".approval-events li")).to_have_count(5)  # the run's last events
        await expect(item.locator(".approval-events")).to_contain_text("RUN_END")
        await expect(item.get_by_role("link", name="open run")).to_have_attribute("href", f"/?run={run_id}")
        await expect(item).to_contain_text("falls back in")
        await expect(item.get_by_label("Raise which limit")).to_have_count(0)  # a loop: nothing to raise

        await item.get_by_label("Note").fill("fine, it is paging")
        await item.get_by_role("button", name="Approve").click()
        await expect(badge).to_contain_text("0")
        assert approvals.decisions == [("a1", {"decision": "approve", "note": "fine, it is paging"})]

        # a budget: the raise field, a refused raise shown, then a good one posted
        approvals.pending = [
            approval(
                run_id,
                id="b2",
                guard="max_cost_usd",
                kind=None,
                threshold=0.1,
                actual=0.12,
                call={"model": "gpt-4o-mini", "stream": False},
            )
        ]
        item = page.locator('.approval[data-approval-id="b2"]')
        await expect(item).to_contain_text("LLM call to gpt-4o-mini")
        await expect(item.get_by_label("Raise which limit")).to_have_value("max_cost_usd")
        await item.get_by_label("Raise to").fill("0.1")
        await item.get_by_role("button", name="Approve").click()
        await expect(item.get_by_role("alert")).to_contain_text("not above the spend")
        await item.get_by_label("Raise to").fill("0.75")
        await item.get_by_role("button", name="Approve").click()
        await expect(badge).to_contain_text("0")
        assert approvals.decisions[-1] == (
            "b2",
            {"decision": "approve", "note": "", "raise": {"max_cost_usd": 0.75}},
        )

        # deny with a note
        approvals.pending = [approval(run_id, id="c3")]
        item = page.locator('.approval[data-approval-id="c3"]')
        await item.get_by_label("Note").fill("use the cached results")
        await item.get_by_role("button", name="Deny").click()
        await expect(badge).to_contain_text("0")
        assert approvals.decisions[-1] == ("c3", {"decision": "deny", "note": "use the cached results"})

        # hidden tab: no notification before the user allowed it (and no polling)...
        await set_hidden(page, True)
        approvals.pending = [approval(run_id, id="d4")]
        await page.wait_for_timeout(2500)
        assert await page.evaluate("window.__notes.length") == 0
        await set_hidden(page, False)
        await expect(badge).to_contain_text("1")
        # ...then allowed by a click (a user gesture), a new approval while hidden notifies
        await page.locator("#approvals-notify").click()
        await expect(page.locator("#approvals-notify")).to_be_hidden()
        await set_hidden(page, True)
        approvals.pending.append(approval(run_id, id="e5", call={"tool": "shell", "arguments": {}}))
        for _ in range(300):  # the hidden tab polls every 10 s once it may notify
            if await page.evaluate("window.__notes.length"):
                break
            await page.wait_for_timeout(100)
        assert await page.evaluate("window.__notes.length") == 1
        note = await page.evaluate("window.__notes[0]")
        assert note["title"] == "A call waits for approval" and "shell" in note["body"]
        await set_hidden(page, False)
        await expect(badge).to_contain_text("2")
        shot = tmp_path / "approvals.png"
        await page.screenshot(path=str(shot))
        save_copy(shot)
        assert errors == []
    finally:
        await server.close()


async def test_a_killed_run_resumed_from_the_viewer_serves_the_next_call_in_a_linked_run(
    browser: Browser, start_tripwire: Any, fake_upstream: Any, tmp_path: Path
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(
        upstream={"url": url}, admin_token="hunter2", guards={"limits": {"max_llm_calls": 1}}
    )
    llm = openai.AsyncOpenAI(
        base_url=tw.url + "/v1",
        api_key=AGENT_KEY,
        default_headers={"X-Tripwire-Session": "s1", "X-Tripwire-Agent": "bot"},
        max_retries=0,
    )
    hello = [{"role": "user", "content": "hello"}]
    await llm.chat.completions.create(model="gpt-4o-mini", messages=hello)
    with pytest.raises(openai.RateLimitError):
        await llm.chat.completions.create(model="gpt-4o-mini", messages=hello)
    await tw.flush()
    (old,) = tw.run_ids()

    page = await new_page(browser)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    await page.add_init_script("sessionStorage.setItem('tripwire_admin_token', 'hunter2')")
    await page.goto(f"{tw.admin_url}/?run={old}&poll_runs=1&poll_events=1")
    panel = page.locator("#resume-panel")
    await expect(panel).to_contain_text("Ended by guard:max_llm_calls")
    await page.locator("#btn-resume").click()  # no raise: the limit would refuse again
    await expect(page.locator("#resume-error")).to_contain_text("max_llm_calls")
    await page.get_by_label("Raise max_llm_calls").fill("3")
    await page.locator("#btn-resume").click()
    await expect(page.locator(".resume-link")).to_contain_text("Resumed from " + old)
    new = next(r for r in tw.run_ids() if r != old)
    await expect(page.locator("#run-id")).to_contain_text(new)
    await expect(panel).to_have_count(0)

    answer = await llm.chat.completions.create(model="gpt-4o-mini", messages=hello)
    assert answer.choices[0].message.content == "Hello from the fake upstream"
    assert len(fake.calls("/v1/chat/completions")) == 2
    await expect(page.locator('.event[data-type="LLM_CALL"]')).to_have_count(1)
    await tw.flush()
    start = orjson.loads((tw.data_dir / "runs" / new / "events.jsonl").read_bytes().splitlines()[0])
    assert start["payload"]["resumed_from"] == old
    # the old run links forward
    await page.goto(f"{tw.admin_url}/?run={old}")
    await expect(page.locator(".resume-link")).to_contain_text("Resumed as " + new)
    await expect(page.locator("#resume-panel")).to_have_count(0)
    shot = tmp_path / "resumed.png"
    await page.screenshot(path=str(shot))
    save_copy(shot)
    assert errors == []


@pytest.mark.parametrize("decision", ["Approve", "Deny"])
async def test_a_held_openai_sdk_loop_call_is_decided_in_the_browser(
    browser: Browser, start_tripwire: Any, fake_upstream: Any, tmp_path: Path, decision: str
) -> None:
    """Acceptance 1: a looping openai-SDK agent under `action: ask`; Playwright clicks Approve and
    the held request completes with the upstream's real answer, or Deny and the agent reads the
    note in the synthetic block; the SDK sees no error and retries nothing."""
    from tests.test_approvals import ASK_LOOP, CHAT, agent_loop, loop_then

    fake, url = fake_upstream
    loop_then(fake, 5, "Paris is sunny (the real answer)")
    tw = await start_tripwire(upstream={"url": url}, guards=ASK_LOOP, admin_token="hunter2")
    page = await new_page(browser)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    await page.add_init_script("sessionStorage.setItem('tripwire_admin_token', 'hunter2')")
    await page.goto(tw.admin_url + "/?poll_runs=1&poll_events=1")

    agent = asyncio.create_task(agent_loop(tw.url))
    item = page.locator(".approval")
    await expect(item).to_have_count(1, timeout=30_000)
    await expect(page.locator("#approvals-badge")).to_contain_text("1")
    await expect(item).to_contain_text("loop_detection · repetition")
    await expect(item).to_contain_text("LLM call to gpt-4o-mini")
    # what the held call repeats (issue 32 item 3): the step's tool call, and the loop's evidence
    await expect(item.locator(".approval-tool-calls")).to_contain_text("get_weather")
    await expect(item.locator(".approval-tool-calls .approval-args")).to_contain_text('"city": "Paris"')
    await expect(item.locator(".approval-evidence")).to_contain_text("5 times")
    await expect(item.locator(".approval-evidence a")).to_have_count(5)  # the calls' TOOL_CALL events
    await expect(item.locator(".approval-events li").first).to_be_visible()
    assert len(fake.calls(CHAT)) == 5 and not agent.done()  # held, not forwarded
    note = "fine, go on" if decision == "Approve" else "use the cached forecast"
    await item.get_by_label("Note").fill(note)
    await item.get_by_role("button", name=decision).click()
    answer = await asyncio.wait_for(agent, 60)
    text = answer.choices[0].message.content
    if decision == "Approve":
        assert text == "Paris is sunny (the real answer)"
        assert len(fake.calls(CHAT)) == 6  # forwarded once: no SDK retry
    else:
        assert text.startswith("[tripwire] blocked:") and note in text
        assert answer.choices[0].finish_reason == "stop"
        assert len(fake.calls(CHAT)) == 5
    await expect(page.locator("#approvals-badge")).to_contain_text("0")
    await expect(page.locator("#approvals")).to_be_hidden()
    assert errors == []
