"""The viewer in headless Chromium against a live admin app on 127.0.0.1.

Needs `apt-get install -y chromium` and `pip install playwright` (the `browser` extra); skipped
with the reason otherwise. Screenshots land in the test's tmp dir (path printed), see docs/viewer.md.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import AGENT_KEY, CHROMIUM
from tests.fakes import Reply
from tests.viewer_fixtures import T0, FakeEngine, many_events, write_run
from viewer.api import setup_admin

try:
    from playwright.async_api import Browser, Page, async_playwright, expect
except ImportError:  # pragma: no cover - depends on the environment
    async_playwright = None  # type: ignore[assignment]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        async_playwright is None, reason="playwright is not installed (pip install playwright)"
    ),
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason=f"chromium not found at {CHROMIUM} (apt-get install chromium)"
    ),
]

if async_playwright is not None:
    expect.set_options(timeout=15_000)  # the whole suite shares 2 cores: give polling UIs room


async def start_admin(data_dir: Path, token: str | None = None) -> tuple[TestServer, FakeEngine]:
    engine = FakeEngine(data_dir, admin_token=token)
    app = web.Application()
    setup_admin(app, engine)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server, engine


async def new_page(browser: Browser) -> Page:
    ctx = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await ctx.new_page()
    page.set_default_timeout(10_000)
    return page


async def test_live_run_timeline_and_guards(browser: Browser, tmp_path: Path) -> None:
    server, engine = await start_admin(tmp_path)
    base = str(server.make_url("/")).rstrip("/")
    try:
        page = await new_page(browser)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        await page.goto(base + "/?poll_runs=1&poll_events=1")
        await expect(page.locator("#run-list")).to_contain_text("No runs yet")

        # a run appears while the page is open (live refresh)
        started = datetime.now(UTC) - timedelta(seconds=42)
        run_id = write_run(
            tmp_path, status="running", cost=0.0032, tokens=1240, tags=["loop_detected"], started=started
        )
        engine.live[run_id] = {"llm_calls": 2}
        item = page.locator(f'.run-item[data-run-id="{run_id}"]')
        await expect(item).to_be_visible()
        await expect(item.locator(".status-dot.running")).to_be_visible()
        await expect(item).to_contain_text("$0.0032")
        await expect(item).to_contain_text("loop_detected")
        await expect(item.locator("svg.spark polyline")).to_have_count(1)

        # filters: agent and health tag
        other = write_run(tmp_path, agent="writer", started=started - timedelta(minutes=5))
        await expect(page.locator(".run-item")).to_have_count(2)
        await page.locator("#filter-agent").select_option("writer")
        await expect(page.locator(".run-item")).to_have_count(1)
        await expect(page.locator(f'.run-item[data-run-id="{other}"]')).to_be_visible()
        await page.locator("#filter-agent").select_option("")
        await page.locator("#filter-tag").select_option("loop_detected")
        await expect(page.locator(".run-item")).to_have_count(1)
        await page.locator("#filter-tag").select_option("")
        await expect(page.locator(".run-item")).to_have_count(2)

        await item.click()
        await expect(page.locator("#run-kpis")).to_contain_text("$0.0032")
        await expect(page.locator("#run-detail")).not_to_contain_text("null")
        loop = page.locator('.event[data-type="LOOP_WARNING"]')
        await expect(loop).to_be_visible()
        await expect(loop).to_contain_text("Loop detected")
        await expect(loop).to_contain_text("repetition")
        bg = await loop.evaluate("n => getComputedStyle(n).backgroundColor")
        border = await loop.evaluate("n => getComputedStyle(n).borderLeftColor")
        assert bg == "rgb(255, 251, 235)", bg  # the warning tint, not a plain white row
        assert border == "rgb(245, 158, 11)", border
        guard = page.locator(".event.ev-guard")
        await expect(guard).to_contain_text("Guard fired: loop_detection")
        await expect(guard).to_contain_text("threshold 5")
        llm = page.locator('.event[data-type="LLM_CALL"]').first
        await expect(llm).to_contain_text("gpt-4o")
        await expect(llm).to_contain_text("100 in / 20 out")
        await expect(llm).to_contain_text("812 ms")
        tool = page.locator('.event[data-type="TOOL_CALL"]')
        await expect(tool).to_contain_text('{"q":"tripwire"}')
        shot = tmp_path / "run-view.png"
        await page.evaluate("window.scrollTo(0, 0)")
        await page.screenshot(path=str(shot), full_page=False)
        assert shot.stat().st_size > 10_000
        save_copy(shot)
        # payloads expand to JSON
        await tool.locator(".ev-head").click()
        await expect(tool.locator("pre.ev-json")).to_contain_text('"tool_name": "search"')

        # events of a running run refresh by themselves
        extra = many_events(run_id, 1)
        append_line(tmp_path / "runs" / run_id / "events.jsonl", extra[0])
        await expect(page.locator("#page-info")).to_contain_text("of 8")

        # the kill switch
        page.once("dialog", lambda d: d.accept())
        await page.locator("#btn-terminate").click()
        assert await _eventually(lambda: engine.terminated == [run_id])

        # Agents page: edit the agent's guards in the form, the API returns them
        await page.locator("#nav-agents").click()
        agent = page.locator('.agent-item[data-agent="research-agent"]')
        await agent.click()
        await expect(page.locator("#guard-banner")).to_have_text("Using project default")
        await page.locator("#f-loop_detection-threshold").fill("3")
        await page.locator("#f-loop_detection-action").select_option("terminate")
        await page.locator("#f-budget-max_cost_usd").fill("0.5")
        await page.locator("#btn-save-guards").click()
        await expect(page.locator("#guard-banner")).to_have_text("Agent-specific config")
        guards_shot = tmp_path / "agent-guards.png"
        await page.screenshot(path=str(guards_shot))
        save_copy(guards_shot)
        cfg, is_override = engine.guard_store.effective("research-agent")
        assert is_override
        assert (cfg.loop_detection.threshold, cfg.loop_detection.action) == (3, "terminate")
        assert cfg.budget.max_cost_usd == 0.5
        body = await _get_json(base + "/api/agents/research-agent/prevention-config")
        assert body["is_agent_override"] is True and body["loop_detection"]["threshold"] == 3

        # an invalid value is refused, naming the field; the saved config stays
        await page.locator("#f-loop_detection-threshold").fill("1")
        await page.locator("#btn-save-guards").click()
        await expect(page.locator("#guard-error")).to_contain_text("loop_detection.threshold")
        assert engine.guard_store.effective("research-agent")[0].loop_detection.threshold == 3

        await page.locator("#btn-reset-guards").click()
        await expect(page.locator("#guard-banner")).to_have_text("Using project default")
        assert engine.guard_store.effective("research-agent")[1] is False
        assert errors == []
    finally:
        await server.close()


async def test_huge_run_fetches_one_page(browser: Browser, tmp_path: Path) -> None:
    server, _ = await start_admin(tmp_path)
    base = str(server.make_url("/")).rstrip("/")
    run_id = write_run(tmp_path, events=many_events("x", 100_000), started=T0 + timedelta(hours=1))
    try:
        page = await new_page(browser)
        event_requests: list[str] = []
        page.on("request", lambda r: event_requests.append(r.url) if "/events" in r.url else None)
        await page.goto(f"{base}/?run={run_id}")
        await expect(page.locator("#page-info")).to_have_text(re.compile(r"Events 1–200 of 100,000"))
        assert await page.locator("#timeline > .event").count() == 200
        assert event_requests, "no events request seen"
        for url in event_requests:
            assert re.search(r"[?&]limit=200\b", url), url
        await page.locator('[data-page="last"]').click()
        await expect(page.locator("#page-info")).to_have_text(re.compile(r"Events 99,801–100,000 of 100,000"))
        assert await page.locator("#timeline > .event").count() == 200
        assert all(re.search(r"[?&]limit=200\b", u) for u in event_requests)
    finally:
        await server.close()


async def test_token_asked_once_and_kept(browser: Browser, tmp_path: Path) -> None:
    server, _ = await start_admin(tmp_path, token="s3cret-token")
    base = str(server.make_url("/")).rstrip("/")
    write_run(tmp_path)
    try:
        page = await new_page(browser)
        await page.goto(base + "/?poll_runs=1")
        dialog = page.locator("#token-dialog")
        await expect(dialog).to_be_visible()
        await page.locator("#token-input").fill("s3cret-token")
        await page.locator("#token-form button").click()
        await expect(page.locator(".run-item")).to_have_count(1)
        assert await page.evaluate("sessionStorage.getItem('tripwire_admin_token')") == "s3cret-token"
        await page.reload()
        await expect(page.locator(".run-item")).to_have_count(1)
        await expect(dialog).to_be_hidden()
    finally:
        await server.close()


async def test_agentdbg_run_link_opens_the_run(browser: Browser, tmp_path: Path) -> None:
    """`agentdbg view RUN_ID` links to `/?run_id=...`: the same link on Tripwire's port opens the run."""
    server, _ = await start_admin(tmp_path)
    base = str(server.make_url("/")).rstrip("/")
    run_id = write_run(tmp_path)
    write_run(tmp_path, started=T0 + timedelta(seconds=5))  # newer: not the one opened by default
    try:
        page = await new_page(browser)
        await page.goto(f"{base}/?run_id={run_id}")
        await expect(page.locator("#run-id")).to_contain_text(run_id)
        await expect(page.locator("#timeline > .event")).to_have_count(7)
        await expect(page.locator(f'.run-item.selected[data-run-id="{run_id}"]')).to_have_count(1)
        assert f"run={run_id}" in page.url and "run_id=" not in page.url
    finally:
        await server.close()


def append_line(path: Path, event: dict) -> None:
    with path.open("ab") as f:
        f.write(orjson.dumps(event) + b"\n")


def save_copy(shot: Path) -> None:
    """TRIPWIRE_SCREENSHOT_DIR=docs keeps a copy (how docs/viewer-run.png is regenerated)."""
    out = os.environ.get("TRIPWIRE_SCREENSHOT_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / ("viewer-" + shot.name)).write_bytes(shot.read_bytes())


async def _get_json(url: str) -> Any:
    from aiohttp import ClientSession

    async with ClientSession() as s, s.get(url) as r:
        assert r.status == 200
        return await r.json()


async def _eventually(cond: Any, seconds: float = 5.0) -> bool:
    import asyncio

    for _ in range(int(seconds / 0.05)):
        if cond():
            return True
        await asyncio.sleep(0.05)
    return cond()


async def test_agent_running_through_the_proxy(
    browser: Browser, start_tripwire: Any, fake_upstream: Any, tmp_path: Path
) -> None:
    """The viewer open while a real openai-SDK agent calls through Tripwire."""
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, admin_token="hunter2")
    llm = openai.AsyncOpenAI(base_url=tw.url + "/agents/research-agent/v1", api_key=AGENT_KEY, max_retries=0)
    page = await new_page(browser)
    await page.add_init_script("sessionStorage.setItem('tripwire_admin_token', 'hunter2')")
    await page.goto(tw.admin_url + "/?poll_runs=1&poll_events=1")
    await expect(page.locator("#run-list")).to_contain_text("No runs yet")

    await llm.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}])
    item = page.locator(".run-item").first
    await expect(item).to_contain_text("research-agent")
    await expect(item.locator(".status-dot.running")).to_be_visible()
    await item.click()
    await expect(page.locator('.event[data-type="LLM_CALL"]')).to_contain_text("100 in / 20 out")
    await expect(page.locator("#run-kpis")).to_contain_text("project default")  # the guard config in force

    # the open run's timeline follows the agent's next call by itself
    await llm.chat.completions.create(
        model="gpt-4o-mini",
        messages=[
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "Hello from the fake upstream"},
            {"role": "user", "content": "more"},
        ],
    )
    await expect(page.locator('.event[data-type="LLM_CALL"]')).to_have_count(2)
    await expect(page.locator("#page-info")).to_contain_text("of 3")

    # terminate from the UI: the next call is refused, the run ends as error and stops polling
    page.once("dialog", lambda d: d.accept())
    await page.locator("#btn-terminate").click()
    await expect(page.locator("#btn-terminate")).to_be_hidden()
    await expect(page.locator("#run-tags")).to_contain_text("terminated")
    with pytest.raises(openai.RateLimitError):  # the same episode (its conversation goes on): refused
        await llm.chat.completions.create(
            model="gpt-4o-mini",
            messages=[
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "Hello from the fake upstream"},
                {"role": "user", "content": "more"},
                {"role": "assistant", "content": "Hello from the fake upstream"},
                {"role": "user", "content": "again"},
            ],
        )
    await expect(page.locator('.event[data-type="ERROR"]').first).to_contain_text("kill_switch")
    shot = tmp_path / "proxy-run.png"
    await page.evaluate("window.scrollTo(0, 0)")
    await page.screenshot(path=str(shot))
    save_copy(shot)


async def test_a_looping_agents_run_is_named_by_its_ask_and_its_loop_says_why(
    browser: Browser, start_tripwire: Any, fake_upstream: Any, tmp_path: Path
) -> None:
    """Issue 25: runs were listed as `AGENT auto-337769a72f30`, and a LOOP_WARNING row showed only
    its kind, count and window, not what repeated and why that is no progress."""
    fake, url = fake_upstream
    guards = {"loop_detection": {"action": "block", "threshold": 3, "max_repeated_tool_steps": 10}}
    tw = await start_tripwire(upstream={"url": url}, admin_token="hunter2", guards=guards)
    llm = openai.AsyncOpenAI(base_url=tw.url + "/agents/weather-bot/v1", api_key=AGENT_KEY, max_retries=0)
    history: list[Any] = [{"role": "user", "content": "What is the weather in Paris today?"}]
    # the model asks for the same tool call again and again (the history carries its answers, so the
    # calls are one conversation, one run: SPEC §3); each tool result is the same
    fake.replies = [Reply(tool_calls=[(f"call_{i}", "get_weather", {"city": "Paris"})]) for i in range(3)]
    for i in range(3):
        await llm.chat.completions.create(model="gpt-4o-mini", messages=history)
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
        }
        history += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": "sunny, 21C"},
        ]
    blocked = await llm.chat.completions.create(model="gpt-4o-mini", messages=history)
    assert (blocked.choices[0].message.content or "").startswith("[tripwire] blocked:")
    await tw.flush()
    (run_id,) = tw.run_ids()
    (warning,) = [
        e
        for e in tw.events(run_id)
        if e["event_type"] == "LOOP_WARNING" and e["payload"]["kind"] == "repetition"
    ]
    sentence = warning["payload"]["message"]
    assert "get_weather" in sentence and "nothing new came back" in sentence

    page = await new_page(browser)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    await page.add_init_script("sessionStorage.setItem('tripwire_admin_token', 'hunter2')")
    await page.goto(tw.admin_url + f"/?run={run_id}")
    item = page.locator(f'.run-item[data-run-id="{run_id}"] .run-item-name')
    await expect(item).to_have_text("What is the weather in Paris today?")
    await expect(page.locator("#run-name")).to_contain_text("What is the weather in Paris today?")
    row = page.locator(f'.event[data-event-id="{warning["event_id"]}"]')
    await expect(row.locator(".ev-sentence")).to_have_text(sentence)
    shot = tmp_path / "loop-warning.png"
    await row.scroll_into_view_if_needed()
    await page.screenshot(path=str(shot))
    print("screenshot:", shot)
    save_copy(shot)
    assert errors == []


async def test_polling_pauses_when_hidden_and_stops_for_finished_runs(
    browser: Browser, tmp_path: Path
) -> None:
    server, _ = await start_admin(tmp_path)
    base = str(server.make_url("/")).rstrip("/")
    finished = write_run(tmp_path)
    try:
        page = await new_page(browser)
        seen: list[str] = []
        page.on("request", lambda r: seen.append(r.url) if "/api/runs" in r.url else None)
        await page.goto(f"{base}/?run={finished}&poll_runs=1&poll_events=1")
        await expect(page.locator("#timeline > .event")).to_have_count(7)
        # a finished run opened by its URL still gets its cost-over-time curve in the header
        await expect(page.locator("#run-kpis .kpi-spark svg polyline")).to_have_count(1)

        def count(part: str) -> int:
            return sum(1 for u in seen if part in u)

        # runs poll about every second; a finished run's events are not polled at all
        await page.wait_for_timeout(2500)
        assert count("/api/runs?") >= 2
        assert count("/events") == 1

        # hidden tab: nothing is polled until it is visible again
        await page.evaluate(
            "Object.defineProperty(document, 'hidden', {value: true, configurable: true});"
            "document.dispatchEvent(new Event('visibilitychange'))"
        )
        await expect(page.locator("#poll-state")).to_have_text("paused")
        before = count("/api/runs?")
        await page.wait_for_timeout(2500)
        assert count("/api/runs?") == before
        await page.evaluate(
            "Object.defineProperty(document, 'hidden', {value: false, configurable: true});"
            "document.dispatchEvent(new Event('visibilitychange'))"
        )
        await expect(page.locator("#poll-state")).to_have_text("live")
        await page.wait_for_timeout(1500)
        assert count("/api/runs?") > before
    finally:
        await server.close()


async def test_guard_replay_on_the_run_view(browser: Browser, start_tripwire: Any, tmp_path: Path) -> None:
    """A run recorded through Tripwire (an MCP agent polling an unchanging status), replayed from its
    run view: under the recorded config the firings sit on the calls beside the live ones; under an
    edited config (loop detection off) the table shows what would not have fired."""
    pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x
    from mcp import Client

    from tests.test_guards_e2e_mcp import SESSION_URL, shop

    with shop() as upstream:
        # no_progress warns after 3 identical results: on the 4th poll, alone (issue 31: after
        # no_progress_warn results; the default 4 would share the 5th with repetition)
        tw = await start_tripwire(
            mcp={"shop": {"url": upstream}},
            admin_token="hunter2",
            guards={"loop_detection": {"no_progress_warn": 3}},
        )
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            for _ in range(6):
                await client.call_tool("job_status", {"job_id": "j1"})
        await tw.flush()
    (run_id,) = tw.run_ids()
    call4 = next(e["event_id"] for e in tw.events(run_id) if e["payload"].get("call_seq") == 4)

    page = await new_page(browser)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    await page.add_init_script("sessionStorage.setItem('tripwire_admin_token', 'hunter2')")
    await page.goto(f"{tw.admin_url}/?run={run_id}")
    await expect(page.locator('.event[data-type="TOOL_CALL"]')).to_have_count(6)

    await page.locator("#replay-panel > summary").click()
    await expect(page.get_by_label("the recorded config (as it ran live)")).to_be_checked()
    await page.get_by_role("button", name="Replay guards").click()
    await expect(page.locator("#replay-summary")).to_contain_text(
        "6 calls replayed under the recorded config"
    )
    await expect(page.locator("#replay-summary")).to_contain_text("Every call decided as live")
    row = page.locator('#replay-table tr[data-call="4"]')
    await expect(row).to_contain_text("warn loop_detection · no_progress")
    await expect(page.locator("#replay-table tr.diff")).to_have_count(0)
    await expect(page.locator("#replay-panel")).not_to_contain_text("null")
    marks = page.locator(f'.event[data-event-id="{call4}"] .ev-marks')
    await expect(marks.locator(".mark-live")).to_have_text(["live: warn no_progress"])
    await expect(marks.locator(".mark-replay")).to_have_text(["replay: warn no_progress"])
    assert await page.locator('.event[data-type="LOOP_WARNING"]').count() >= 1  # live warnings stay
    shot = tmp_path / "run-replay.png"
    await page.locator("#replay-panel").screenshot(path=str(shot))
    save_copy(shot)

    # an edited config, filled from the current one: an invalid value is refused naming the field
    await page.get_by_label("an edited config").check()
    threshold = page.locator("#r-loop_detection-threshold")
    await expect(threshold).to_have_value("5")
    await threshold.fill("1")
    await page.get_by_role("button", name="Replay guards").click()
    await expect(page.locator("#replay-error")).to_contain_text("config.loop_detection.threshold")
    await expect(page.locator("#replay-form .field.invalid #r-loop_detection-threshold")).to_have_count(1)
    await threshold.fill("5")
    await page.locator("#r-loop_detection-enabled").uncheck()
    await page.get_by_role("button", name="Replay guards").click()
    await expect(page.locator("#replay-summary")).to_contain_text("under the edited config: nothing fired")
    await expect(row).to_have_class("diff")
    await expect(marks.locator(".mark-replay")).to_have_text(["replay: nothing"])
    await expect(marks.locator(".mark-live")).to_have_text(["live: warn no_progress"])
    # the edit was for the replay only: the agent's guards are as they were
    assert tw.engine.guard_config("bot").loop_detection.enabled is True

    await page.get_by_role("button", name="Clear replay").click()
    await expect(page.locator(".ev-marks")).to_have_count(0)
    await expect(page.locator("#replay-result")).to_be_hidden()
    assert errors == []
