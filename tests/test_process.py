"""`tripwire serve` as a real process: start-up lines, SIGKILL recovery, SIGTERM drain (issue 2, acceptance 7)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.conftest import AGENT_KEY
from tests.fakes import Reply
from tests.schema import assert_run_valid


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def start_serve(
    data_dir: Path, upstream: str, *extra: str
) -> tuple[asyncio.subprocess.Process, str, str]:
    port, admin = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--admin-listen",
        f"127.0.0.1:{admin}",
        "--upstream",
        upstream,
        "--data-dir",
        str(data_dir),
        "--drain-grace",
        "10",
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=str(data_dir.parent),
    )
    assert proc.stdout is not None
    banner = []
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line, "tripwire exited early:\n" + "".join(banner)
        banner.append(line)
        if "viewer:" in line:
            break
    return proc, f"http://127.0.0.1:{port}", "".join(banner)


async def wait_for(predicate, limit_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def events_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


async def stop(proc: asyncio.subprocess.Process) -> str:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return out.decode()


async def test_startup_lines_and_sigkill_recovery(tmp_path: Path, fake_upstream) -> None:
    fake, url = fake_upstream
    data = tmp_path / "data"
    proc, base, banner = await start_serve(data, url)
    try:
        assert f"OPENAI_BASE_URL={base}/v1" in banner and "viewer: http://127.0.0.1:" in banner
        # uvloop is a dependency where it builds, and the default there
        uvloop_expected = sys.platform in ("linux", "darwin")
        assert ("event loop: uvloop" in banner) == uvloop_expected, banner
        c = openai.AsyncOpenAI(base_url=base + "/v1", api_key=AGENT_KEY, max_retries=0)
        # two calls of one conversation (one episode, one run: SPEC §3); a third identical
        # LLM_CALL would add AgentDbg's cycle LOOP_WARNING
        messages: list = [{"role": "user", "content": "m0"}]
        for i in range(2):
            answer = await c.chat.completions.create(model="gpt-4o-mini", messages=messages)
            messages += [
                {"role": "assistant", "content": answer.choices[0].message.content},
                {"role": "user", "content": f"m{i + 1}"},
            ]
        runs = data / "runs"
        await wait_for(lambda: runs.exists() and any(runs.iterdir()))
        (run_dir,) = list(runs.iterdir())
        # events are flushed within milliseconds, off the request path
        await wait_for(lambda: len(events_of(run_dir)) >= 3)
        assert [e["event_type"] for e in events_of(run_dir)] == ["RUN_START", "LLM_CALL", "LLM_CALL"]
        proc.kill()
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
    proc2, _, _ = await start_serve(data, url)
    try:
        events = events_of(run_dir)
        assert [e["event_type"] for e in events] == [
            "RUN_START",
            "LLM_CALL",
            "LLM_CALL",
            "RUN_END",
        ]
        assert events[-1]["payload"]["status"] == "error" and events[-1]["payload"]["reason"] == "interrupted"
        run = json.loads((run_dir / "run.json").read_text())
        assert run["status"] == "error" and run["ended_at"]
        assert_run_valid(data, run_dir.name)
    finally:
        await stop(proc2)


async def test_sigterm_drains_an_inflight_stream(tmp_path: Path, fake_upstream) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(text="a slow stream that keeps going for a while", chunk_delay=0.1)]
    data = tmp_path / "data"
    # asyncio's own loop here (uvloop, the default, drains in the test above and the one below)
    proc, base, banner = await start_serve(data, url, "--event-loop", "asyncio")
    assert "event loop: asyncio" in banner
    c = openai.AsyncOpenAI(base_url=base + "/v1", api_key=AGENT_KEY, max_retries=0)
    stream = await c.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}], stream=True
    )
    parts = []
    first = await stream.__anext__()
    parts.append(first)
    proc.send_signal(signal.SIGTERM)
    async for chunk in stream:
        parts.append(chunk)
    text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert text == "a slow stream that keeps going for a while"
    out = await stop(proc)
    assert proc.returncode == 0, out
    (run_dir,) = list((data / "runs").iterdir())
    events = events_of(run_dir)
    assert [e["event_type"] for e in events] == ["RUN_START", "LLM_CALL", "RUN_END"]
    assert events[1]["payload"]["status"] == "ok"
    assert events[-1]["payload"]["reason"] == "shutdown"


async def test_readyz_answers_503_from_the_moment_the_drain_starts(tmp_path: Path, fake_upstream) -> None:
    """SPEC §6: SIGTERM makes /readyz 503 at once (a load balancer stops sending calls) while the
    call in flight still completes."""
    fake, url = fake_upstream
    resume = asyncio.Event()
    fake.replies = [Reply(text="an answer held open by the upstream", pause_after_chunks=1, resume=resume)]
    proc, base, banner = await start_serve(tmp_path / "data", url)
    admin = banner.split("viewer: ", 1)[1].split()[0].rstrip("/")
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(admin + "/readyz") as r:
                assert r.status == 200
            c = openai.AsyncOpenAI(base_url=base + "/v1", api_key=AGENT_KEY, max_retries=0)
            stream = await c.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}], stream=True
            )
            parts = [await stream.__anext__()]  # in flight: the upstream holds the rest back
            proc.send_signal(signal.SIGTERM)
            statuses: list[int] = []
            deadline = asyncio.get_running_loop().time() + 30
            while not statuses or statuses[-1] != 503:
                assert asyncio.get_running_loop().time() < deadline, statuses
                async with s.get(admin + "/readyz") as r:
                    statuses.append(r.status)
                    body = await r.json()
                await asyncio.sleep(0.02)
            assert body == {"status": "draining"}
            resume.set()  # only now does the call in flight go on, and it completes
            async for chunk in stream:
                parts.append(chunk)
        text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
        assert text == "an answer held open by the upstream"
        out = await stop(proc)
        assert proc.returncode == 0, out
    finally:
        if proc.returncode is None:
            proc.kill()


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"]])
async def test_help_documents_every_flag(argv: list[str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", *argv, stdout=asyncio.subprocess.PIPE
    )
    out = (await proc.communicate())[0].decode()
    assert proc.returncode == 0
    if argv == ["serve", "--help"]:
        for flag in (
            "--listen",
            "--admin-listen",
            "--upstream",
            "--llm",
            "--mcp",
            "--mcp-stdio",
            "--agent",
            "--data-dir",
            "--config",
            "--session-idle-timeout",
            "--event-loop",
        ):
            assert flag in out
    else:
        assert "serve" in out


async def test_off_loopback_admin_without_token_is_refused(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "serve",
        "--admin-listen",
        "0.0.0.0:0",
        "--data-dir",
        str(tmp_path),
        stderr=asyncio.subprocess.PIPE,
    )
    err = (await proc.communicate())[1].decode()
    assert proc.returncode == 2 and "admin-token" in err


@pytest.mark.parametrize(("flag", "name"), [("--listen", "proxy"), ("--admin-listen", "admin")])
async def test_a_port_in_use_names_the_listener_and_its_flag(tmp_path: Path, flag: str, name: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        other = "--admin-listen" if flag == "--listen" else "--listen"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "proxy",
            "serve",
            flag,
            busy,
            other,
            f"127.0.0.1:{free_port()}",
            "--data-dir",
            str(tmp_path),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            cwd=str(tmp_path),
        )
        err = (await asyncio.wait_for(proc.communicate(), 60))[1].decode()
    assert proc.returncode == 1
    assert err.strip().splitlines()[-1] == (
        f"tripwire: cannot start: {name} listener {busy} is in use; choose another with {flag}"
    )


async def test_retention_prunes_old_finished_runs(start_tripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, retention={"max_age_days": 1})
    c = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, max_retries=0)
    await c.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}])
    await tw.flush()
    (live,) = tw.run_ids()
    # an old finished run left by an earlier process
    old = tw.data_dir / "runs" / "0b0b0b0b-0b0b-4b0b-8b0b-0b0b0b0b0b0b"
    old.mkdir()
    (old / "run.json").write_text(
        json.dumps(
            {
                "spec_version": "0.1",
                "run_id": old.name,
                "run_name": "old",
                "started_at": "2020-01-01T00:00:00.000Z",
                "ended_at": "2020-01-01T00:01:00.000Z",
                "duration_ms": 60000,
                "status": "ok",
                "counts": {"llm_calls": 0, "tool_calls": 0, "errors": 0, "loop_warnings": 0},
                "last_event_ts": None,
            }
        )
    )
    assert await tw.engine.prune() == [old.name]
    assert tw.run_ids() == [live]  # the open run is kept


async def test_sigterm_grace_over_cuts_streams_and_records_them(tmp_path: Path, fake_upstream) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(text="an endless stream of words " * 40, chunk_delay=0.1)]
    data = tmp_path / "data"
    proc, base, _ = await start_serve(data, url, "--drain-grace", "1")  # the last flag wins
    c = openai.AsyncOpenAI(base_url=base + "/v1", api_key=AGENT_KEY, max_retries=0)
    stream = await c.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}], stream=True
    )
    await stream.__anext__()
    proc.send_signal(signal.SIGTERM)
    got = []
    with pytest.raises(openai.APIConnectionError):  # the cut stream ends abnormally (SPEC §4.2)
        async for chunk in stream:
            got.append(chunk)
    out = await stop(proc)
    assert proc.returncode == 0, out
    assert "drain grace over: cutting 1 stream(s) still open" in out  # the grace ended it, not a hang
    assert got, "chunks kept flowing during the grace"
    runs = sorted((data / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    events = events_of(runs[-1])
    llm = [e for e in events if e["event_type"] == "LLM_CALL"]
    assert len(llm) == 1 and llm[0]["payload"]["status"] == "error"
    assert "shut down" in llm[0]["payload"]["error"]["message"]
    assert events[-1]["event_type"] == "RUN_END" and events[-1]["payload"]["reason"] == "shutdown"


def test_serving_takes_startup_out_of_the_collectors_way() -> None:
    """`serve` freezes what start-up built (before the loop, and again once listening) and widens the
    young generation; restored afterwards, as the test process must not keep them."""
    import gc

    from proxy.cli import YOUNG_GENERATION, collector_for_serving, freeze_startup

    threshold = gc.get_threshold()
    try:
        collector_for_serving()
        assert gc.get_threshold() == (YOUNG_GENERATION, *threshold[1:])
        frozen = gc.get_freeze_count()
        assert frozen > 0
        kept = [object() for _ in range(10)], {"built": "after the first freeze"}
        freeze_startup()
        assert gc.get_freeze_count() > frozen
        del kept
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


async def test_serve_with_the_trace_writers_disk_process(tmp_path: Path, fake_upstream) -> None:
    """`--trace-writer process`: /healthz names the child once it is up, calls' runs are written
    through it (the same complete, valid run), and SIGTERM ends the child with Tripwire."""
    _, url = fake_upstream
    data = tmp_path / "data"
    proc, base, banner = await start_serve(data, url, "--trace-writer", "process")
    admin = banner.split("viewer: ", 1)[1].split()[0].rstrip("/")
    try:
        async with aiohttp.ClientSession() as http:

            async def store() -> dict:
                async with http.get(admin + "/healthz") as r:
                    return (await r.json())["trace_store"]

            deadline = asyncio.get_running_loop().time() + 60
            while (await store())["writer_process"] is None:  # started in the background
                assert asyncio.get_running_loop().time() < deadline, "the disk process never came up"
                await asyncio.sleep(0.05)
            child = (await store())["writer_process"]
            assert (await store())["trace_writer"] == "process"
            c = openai.AsyncOpenAI(base_url=base + "/v1", api_key=AGENT_KEY, max_retries=0)
            for n in range(3):  # three unnamed first requests: three runs, made by the child
                await c.chat.completions.create(
                    model="gpt-4o-mini", messages=[{"role": "user", "content": f"q{n}"}]
                )
    finally:
        out = await stop(proc)
    assert proc.returncode == 0, out
    runs = list((data / "runs").iterdir())
    assert len(runs) == 3
    for run_dir in runs:
        run_json, events = assert_run_valid(data, run_dir.name)
        assert [e["event_type"] for e in events] == ["RUN_START", "LLM_CALL", "RUN_END"]
        assert run_json["status"] == "ok"
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
