"""Replay and the admin API against run directories anyone may have written (issue 26, item 4).

`tripwire replay` and `POST /api/runs/{id}/replay` read events.jsonl and tripwire.json; the viewer's
routes read run.json and events.jsonl. A crafted directory (a payload that is a list or a string,
`guard_input` parts of the wrong type or length, a truncated line) is answered with a 422 / exit 2
naming the run and the line, never a traceback; a FIFO or a symlink as a run file is refused at
once by name, and never holds a thread (six such requests used to starve the default executor the
trace writer's fsync ran in: the trace stopped, /healthz said ok). A writer that stops making
progress is reported by /healthz and a metric, and readiness stays up (SPEC §6).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy import cli
from proxy.guards.config import GuardConfig
from proxy.recorder import TraceRecorder
from proxy.replay import BadRecord, replay_dir
from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream
from tests.test_process import start_serve, stop
from tests.viewer_fixtures import T0, event, write_run

# --- a small guarded run, written as Tripwire writes it ------------------------------------------


def tool_input(seq: int) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "t": 0.1 * seq,
        "ev": seq,
        "done": seq - 1,
        "cfg": 0,
        "kind": "tool",
        "tool": "get_status",
        "server": "shop",
        "sig": "sig-status",
        "id": "id-status",
        "est": 0.0,
        "decisions": [],
        "rank": seq,
        "t_end": 0.1 * seq + 0.05,
        "res": "res-pending",
        "err": None,
    }
    if seq == 1:
        fields["config"] = GuardConfig().model_dump(mode="json")
    return fields


def llm_input(seq: int) -> dict[str, Any]:
    return {
        "t": 0.1 * seq,
        "ev": seq,
        "done": seq - 1,
        "cfg": 0,
        "kind": "llm",
        "hist": {
            "keep": 0,
            "add": [[["call-1", "get_status", "sig-status", "id-status"]]],
            "turn_start": 0,
            "results": {"call-1": ["res-pending", None]},
        },
        "est": 0.0,
        "tok": 10,
        "decisions": [],
        "rank": seq,
        "t_end": 0.1 * seq + 0.05,
        "cost": 0.001,
        "tokens": 12,
    }


LLM_LINE = 5  # the LLM call's line in events.jsonl; the tool calls are lines 2-4


def guarded_events(run_id: str) -> list[dict[str, Any]]:
    """RUN_START, three MCP tool calls, an LLM call, RUN_END: each call with its guard_input."""
    ms = timedelta(milliseconds=100)
    evs = [event(run_id, "RUN_START", "run_start", {"run_name": "crafted"}, T0)]
    for seq in (1, 2, 3):
        payload = {"tool_name": "get_status", "args": {}, "result": "pending", "status": "ok", "error": None}
        payload |= {"call_seq": seq, "guard_input": tool_input(seq)}
        evs.append(event(run_id, "TOOL_CALL", "get_status", payload, T0 + seq * ms))
    payload = {"model": "m", "usage": {"total_tokens": 12}, "cost_usd": 0.001, "call_seq": 4}
    evs.append(event(run_id, "LLM_CALL", "m", payload | {"guard_input": llm_input(4)}, T0 + 4 * ms))
    evs.append(event(run_id, "RUN_END", "run_end", {"status": "ok"}, T0 + 5 * ms))
    return evs


def write_events(data: Path, run_id: str, lines: list[bytes]) -> Path:
    d = data / "runs" / run_id
    (d / "events.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    return d


def crafted_run(data: Path, change: Any = None, line: int = 3) -> tuple[str, Path]:
    """A guarded run whose event at `line` (1-based) `change` alters (a function of the event), or
    whose line is replaced by `change` when it is bytes."""
    run_id = write_run(data, events=[])
    lines = [orjson.dumps(e) for e in guarded_events(run_id)]
    if isinstance(change, bytes):
        lines[line - 1] = change
    elif change is not None:
        ev = orjson.loads(lines[line - 1])
        change(ev)
        lines[line - 1] = orjson.dumps(ev)
    return run_id, write_events(data, run_id, lines)


def setter(*path: str | int, value: Any = None, delete: bool = False) -> Any:
    def change(ev: dict[str, Any]) -> None:
        target: Any = ev
        for key in path[:-1]:
            target = target[key]
        if delete:
            del target[path[-1]]
        else:
            target[path[-1]] = value

    return change


GI = ("payload", "guard_input")
HIST = (*GI, "hist")
# (id, the change, the line it is on, what the message says)
CRAFTED = [
    ("payload-list", setter("payload", value=[1, 2]), 3, "payload"),
    ("payload-string", setter("payload", value="a payload"), 3, "payload"),
    ("payload-number", setter("payload", value=7), 3, "payload"),
    ("guard-input-string", setter(*GI, value="inputs"), 3, "guard_input"),
    (
        "history-step-too-short",
        setter(*HIST, "add", value=[[["call-1", "get_status", "sig"]]]),
        LLM_LINE,
        "add",
    ),
    ("history-steps-a-string", setter(*HIST, "add", value="steps"), LLM_LINE, "add"),
    ("history-result-too-short", setter(*HIST, "results", value={"call-1": ["res"]}), LLM_LINE, "results"),
    ("history-result-a-string", setter(*HIST, "results", value={"call-1": "res"}), LLM_LINE, "results"),
    ("history-keep-not-a-number", setter(*HIST, "keep", value="many"), LLM_LINE, "keep"),
    ("history-a-list", setter(*HIST, value=[0, 1]), LLM_LINE, "hist"),
    ("tool-call-without-sig", setter(*GI, "sig", delete=True), 3, "sig"),
    ("config-revision-a-list", setter(*GI, "cfg", value=[1]), 3, "cfg"),
    ("time-an-object", setter(*GI, "t", value={"s": 1}), 3, "t"),
    ("estimate-a-string", setter(*GI, "est", value="cheap"), 3, "est"),
    ("config-not-a-config", setter(*GI, "config", value={"loop_detection": "off"}), 2, "config"),
    ("call-seq-a-fraction", setter("payload", "call_seq", value=2.5), 3, "call_seq"),
    ("truncated-line", b'{"event_type": "TOOL_CALL", "payload": {"call_seq": 2, "gua', 3, "not JSON"),
    ("not-an-object", b'["TOOL_CALL", 2]', 3, "dictionary"),
]


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_a_well_formed_crafted_run_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The base every case below alters: it replays, so each failure is the alteration's."""
    _, d = crafted_run(tmp_path)
    replay = replay_dir(d)
    assert replay.calls == 4 and replay.replayed_checks == replay.live
    assert cli.main(["replay", str(d), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


@pytest.mark.parametrize(("change", "line", "names"), [c[1:] for c in CRAFTED], ids=[c[0] for c in CRAFTED])
def test_the_cli_names_the_run_and_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: Any, line: int, names: str
) -> None:
    run_id, d = crafted_run(tmp_path, change, line)
    assert cli.main(["replay", run_id, "--data-dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    message = one_line(captured.err)
    assert f"run {run_id}: events.jsonl line {line}:" in message and names in message
    assert captured.out == ""


@pytest.mark.parametrize(("change", "line", "names"), [c[1:] for c in CRAFTED], ids=[c[0] for c in CRAFTED])
async def test_the_replay_api_answers_422_naming_the_run_and_line(
    start_tripwire: StartTripwire, change: Any, line: int, names: str
) -> None:
    tw = await start_tripwire()
    run_id, _ = crafted_run(tw.data_dir, change, line)
    status, body = await api(tw, "POST", f"/api/runs/{run_id}/replay")
    assert status == 422, body
    assert (body["run_id"], body["file"], body["line"]) == (run_id, "events.jsonl", line)
    assert f"run {run_id}: events.jsonl line {line}:" in body["detail"] and names in body["detail"]


async def test_a_crafted_tripwire_json_is_named_too(
    start_tripwire: StartTripwire, capsys: pytest.CaptureFixture[str]
) -> None:
    tw = await start_tripwire()
    run_id, d = crafted_run(tw.data_dir)
    (d / "tripwire.json").write_text(json.dumps({"agent_name": "a", "guard_config": {"loop_detection": 5}}))
    assert cli.main(["replay", run_id, "--data-dir", str(tw.data_dir)]) == 2
    message = one_line(capsys.readouterr().err)
    assert f"run {run_id}: tripwire.json: guard_config.loop_detection:" in message
    status, body = await api(tw, "POST", f"/api/runs/{run_id}/replay")
    assert status == 422 and (body["file"], body["line"]) == ("tripwire.json", None)
    assert body["detail"] == message.removeprefix("tripwire replay: ")


def test_an_unterminated_last_line_is_a_line_being_written(tmp_path: Path) -> None:
    """A live run's last line may be half-written: left out, as the viewer leaves it out."""
    run_id, d = crafted_run(tmp_path)
    with open(d / "events.jsonl", "ab") as f:
        f.write(b'{"event_type": "TOOL_CALL", "payload": {"call_seq": 9')
    assert replay_dir(d).calls == 4
    with open(d / "events.jsonl", "ab") as f:
        f.write(b'[1, 2]\n{"event_type": "TOOL_CALL", "payload": [')
    with pytest.raises(BadRecord, match="events.jsonl line 7:"):  # no longer the last line
        replay_dir(d)


def test_other_runs_on_the_command_line_are_still_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, _ = crafted_run(tmp_path)
    bad, _ = crafted_run(tmp_path, setter("payload", value=["x"]), 4)
    looping = write_run(tmp_path, events=[])  # a run whose replay has decisions to print
    write_events(tmp_path, looping, [orjson.dumps(e) for e in looping_events(looping)])
    args = ["replay", bad, good, looping, "--data-dir", str(tmp_path)]
    assert cli.main([*args, "--json"]) == 2
    captured = capsys.readouterr()
    assert f"run {bad}: events.jsonl line 4:" in one_line(captured.err)
    decisions = json.loads(captured.out)  # still one valid array, of the runs that could be read
    assert decisions and {d["run_id"] for d in decisions} == {looping}
    assert cli.main(["replay", "--all", "--data-dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert bad in one_line(captured.err)
    assert f"run {good}: 4 calls" in captured.out and "2 runs:" in captured.out


def looping_events(run_id: str) -> list[dict[str, Any]]:
    """An AgentDbg SDK run: the same status polled eight times (no_progress fires)."""
    evs = [event(run_id, "RUN_START", "run_start", {}, T0)]
    for i in range(8):
        payload = {"tool_name": "get_status", "args": {"job": 1}, "result": "pending", "status": "ok"}
        evs.append(event(run_id, "TOOL_CALL", "get_status", payload, T0 + timedelta(seconds=i + 1)))
    return evs


def test_the_real_command_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    import subprocess

    run_id, d = crafted_run(tmp_path, setter(*HIST, "add", value=[[["only-an-id"]]]), LLM_LINE)
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "replay", str(d)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TRIPWIRE_DATA_DIR": str(tmp_path)},
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"run {run_id}: events.jsonl line {LLM_LINE}:" in one_line(done.stderr)


# --- any JSON where replay reads a part: a BadRecord or a replay, nothing else ---------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
PARTS = [
    ("payload",),
    ("payload", "call_seq"),
    GI,
    *[(*GI, key) for key in ("t", "ev", "done", "cfg", "rank", "t_end", "kind", "sig", "id", "tool", "est")],
    *[(*GI, key) for key in ("err", "res", "decisions", "breaker", "released", "config", "server")],
    *[(*HIST, key) for key in ("keep", "add", "turn_start", "results")],
    HIST,
    (*GI, "tok"),
    (*GI, "cost"),
    (*GI, "tokens"),
    ("payload", "usage"),
    ("payload", "cost_usd"),
    ("event_type",),
    ("name",),
    ("event_id",),
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(part=st.sampled_from(PARTS), line=st.sampled_from([2, 3, LLM_LINE]), value=JSON)
def test_any_json_in_any_part_is_replayed_or_refused_by_name(
    part: tuple[str | int, ...], line: int, value: Any
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        run_id = write_run(data, events=[])
        evs = guarded_events(run_id)
        ev = copy.deepcopy(evs[line - 1])
        target: Any = ev
        for key in part[:-1]:
            if not isinstance(target.get(key), dict):
                target[key] = {}
            target = target[key]
        target[part[-1]] = value
        evs[line - 1] = ev
        d = write_events(data, run_id, [orjson.dumps(e) for e in evs])
        try:
            replay_dir(d)
        except BadRecord as e:
            assert (e.run_id, e.file) == (run_id, "events.jsonl") and e.line == line
            assert "\n" not in str(e)


# --- files that are not regular files --------------------------------------------------------------


@contextmanager
def released(fifos: list[Path]) -> Iterator[None]:
    """On the way out, a writer opens and closes each FIFO: a reader stuck in open() (the bug) ends."""
    try:
        yield
    finally:
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass  # no reader waiting: nothing to release


def fifo_as(d: Path, name: str) -> Path:
    path = d / name
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


def zero_as(d: Path, name: str) -> Path:
    path = d / name
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")
    return path


@pytest.mark.parametrize(
    ("name", "plant", "says"),
    [
        ("events.jsonl", fifo_as, "FIFO"),
        ("events.jsonl", zero_as, "symlink"),
        ("tripwire.json", fifo_as, "FIFO"),
        ("tripwire.json", zero_as, "symlink"),
    ],
)
def test_the_cli_refuses_a_run_file_that_is_not_a_regular_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, plant: Any, says: str
) -> None:
    run_id, d = crafted_run(tmp_path)
    planted = plant(d, name)
    with released([planted] if plant is fifo_as else []):
        assert cli.main(["replay", run_id, "--data-dir", str(tmp_path)]) == 2
    message = one_line(capsys.readouterr().err)
    assert f"run {run_id}: {name} is a" in message and says in message


async def api(tw: Running, method: str, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.request(method, tw.admin_url + path) as resp:
        return resp.status, await resp.json(content_type=None)


@pytest.mark.parametrize(
    ("name", "plant", "routes"),
    [
        ("run.json", fifo_as, ["GET /api/runs/{id}", "POST /api/runs/{id}/replay"]),
        ("run.json", zero_as, ["GET /api/runs/{id}", "GET /api/runs/{id}/events"]),
        ("events.jsonl", fifo_as, ["GET /api/runs/{id}/events", "POST /api/runs/{id}/replay"]),
        ("events.jsonl", zero_as, ["GET /api/runs/{id}/cost-series", "POST /api/runs/{id}/replay"]),
        ("tripwire.json", fifo_as, ["GET /api/runs/{id}", "POST /api/runs/{id}/replay"]),
    ],
)
async def test_the_api_refuses_a_run_file_that_is_not_a_regular_file_by_name(
    start_tripwire: StartTripwire, name: str, plant: Any, routes: list[str]
) -> None:
    tw = await start_tripwire()
    run_id, d = crafted_run(tw.data_dir)
    planted = plant(d, name)
    with released([planted] if plant is fifo_as else []):
        for route in routes:
            method, path = route.split()
            status, body = await asyncio.wait_for(api(tw, method, path.format(id=run_id)), 60)
            assert status == 422, (route, body)
            assert body["run_id"] == run_id and body["file"] == name, route
            assert body["detail"].startswith(f"run {run_id}: {name} is a"), route
        # the list skips it and still answers
        status, body = await api(tw, "GET", "/api/runs")
        assert status == 200


async def llm_call(tw: Running, session: str) -> None:
    client = openai.AsyncOpenAI(
        base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers={"X-Tripwire-Session": session}
    )
    await client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])


def llm_calls_on_disk(tw: Running) -> int:
    total = 0
    for run_id in tw.run_ids():
        path = tw.data_dir / "runs" / run_id / "events.jsonl"
        if path.is_file() and not path.is_symlink():
            total += sum(b'"LLM_CALL"' in line for line in path.read_bytes().splitlines())
    return total


async def test_six_fifo_replays_neither_hang_nor_stop_the_trace_writer(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """Six requests on FIFO runs (the default executor's size on a 2-core machine) all answer, and
    the writer, whose every write fsyncs here, still writes another run's events meanwhile."""
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, fsync="always")
    fifos = []
    ids = []
    for _ in range(6):
        run_id, d = crafted_run(tw.data_dir)
        fifos.append(fifo_as(d, "events.jsonl"))
        ids.append(run_id)
    with released(fifos):
        requests = [api(tw, "POST", f"/api/runs/{run_id}/replay") for run_id in ids]
        requests += [api(tw, "GET", f"/api/runs/{run_id}/events") for run_id in ids]
        answers = await asyncio.wait_for(asyncio.gather(*requests), 60)
        assert {status for status, _ in answers} == {422}
        assert all(body["file"] == "events.jsonl" for _, body in answers)
        await asyncio.wait_for(llm_call(tw, "after-the-fifos"), 60)
        await asyncio.wait_for(tw.flush(), 60)
        assert llm_calls_on_disk(tw) == 1


async def test_a_full_default_executor_stops_neither_the_writer_nor_the_admin_api(
    start_tripwire: StartTripwire,
) -> None:
    """Whatever holds the loop's default executor (here: every one of its threads, blocked), the
    trace writer's fsyncs and the admin API's reads run in threads of their own. (The run is
    recorded through the engine's recorder: a proxied call would resolve its upstream's address in
    that executor, which this test holds.)"""
    tw = await start_tripwire(fsync="always")
    rec = tw.engine.recorder
    loop = asyncio.get_running_loop()
    go_on = threading.Event()
    held = [loop.run_in_executor(None, go_on.wait, 120) for _ in range(64)]  # more than its threads
    try:
        run_id = rec.start_run(run_name="beside a full executor", agent_name="a", session_id="s")
        rec.record(run_id, "LLM_CALL", "m", {"model": "m"})
        await asyncio.wait_for(rec.flush(), 60)
        assert llm_calls_on_disk(tw) == 1
        status, body = await asyncio.wait_for(api(tw, "GET", f"/api/runs/{run_id}/events"), 60)
        assert status == 200 and [e["event_type"] for e in body["events"]] == ["RUN_START", "LLM_CALL"]
        status, body = await asyncio.wait_for(api(tw, "POST", f"/api/runs/{run_id}/replay"), 60)
        assert status == 200 and body["run_id"] == run_id
    finally:
        go_on.set()
        await asyncio.gather(*held)


async def test_a_served_process_answers_fifo_replays_and_stops_on_sigterm(
    tmp_path: Path, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """The real `tripwire serve`: six replays of FIFO runs are answered, /healthz is ok, and SIGTERM
    ends the process (threads stuck in a FIFO's open() used to keep it alive)."""
    _, url = fake_upstream
    data = tmp_path / "data"
    ids, fifos = [], []
    for _ in range(6):
        run_id, d = crafted_run(data)
        fifos.append(fifo_as(d, "events.jsonl"))
        ids.append(run_id)
    proc, _, banner = await start_serve(data, url)
    found = re.search(r"viewer: (http://127\.0\.0\.1:\d+)", banner)
    assert found, banner
    admin = found.group(1)
    try:
        with released(fifos):
            async with aiohttp.ClientSession() as http:

                async def replay(run_id: str) -> int:
                    async with http.post(f"{admin}/api/runs/{run_id}/replay") as resp:
                        return resp.status

                statuses = await asyncio.wait_for(asyncio.gather(*map(replay, ids)), 60)
                assert statuses == [422] * 6
                async with http.get(f"{admin}/healthz") as resp:
                    assert (await resp.json())["status"] == "ok"
            out = await stop(proc)
            assert proc.returncode == 0, out
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_recovery_leaves_a_fifo_run_alone_without_waiting(tmp_path: Path) -> None:
    """A run left "running" whose events.jsonl is a FIFO: start-up does not wait on it forever."""
    run_id, d = crafted_run(tmp_path)
    meta = json.loads((d / "run.json").read_text())
    (d / "run.json").write_text(json.dumps({**meta, "status": "running"}))
    rec = TraceRecorder(tmp_path)
    with released([fifo_as(d, "events.jsonl")]):
        closed = await asyncio.wait_for(asyncio.to_thread(rec.recover_interrupted), 60)
    assert run_id not in closed
    assert json.loads((d / "run.json").read_text())["status"] == "running"
    rec.owner.release()


# --- a writer that stops making progress --------------------------------------------------------


@contextmanager
def stuck_fsync(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Every fsync waits until the event is set (a dead disk, a hung network filesystem)."""
    go_on = threading.Event()
    real = os.fsync

    def fsync(fd: int) -> None:
        go_on.wait(120)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    try:
        yield go_on
    finally:
        go_on.set()


async def get(tw: Running, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(tw.admin_url + path) as resp:
        return resp.status, await resp.text()


def stalled_metric(text: str) -> float:
    (line,) = [x for x in text.splitlines() if x.startswith("tripwire_event_store_stalled ")]
    return float(line.split()[1])


async def test_healthz_reports_a_writer_that_stopped_making_progress(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, fsync="always")
    tw.engine.recorder._writer.stall_after_s = 0.2
    status, body = await get(tw, "/healthz")
    assert json.loads(body)["trace_store"]["writer_stalled"] is False
    with stuck_fsync(monkeypatch) as go_on:
        await llm_call(tw, "stuck")
        for _ in range(600):  # the writer's pass is stuck in its fsync, events wait
            health = json.loads((await get(tw, "/healthz"))[1])
            if health["trace_store"]["writer_stalled"]:
                break
            await asyncio.sleep(0.05)
        assert health["status"] == "degraded" and health["trace_store"]["ok"] is False
        assert health["trace_store"]["queue_depth"] > 0
        assert stalled_metric((await get(tw, "/metrics"))[1]) == 1
        assert (await get(tw, "/readyz"))[0] == 200  # trace trouble never fails readiness
        go_on.set()
        await asyncio.wait_for(tw.flush(), 60)
    health = json.loads((await get(tw, "/healthz"))[1])
    assert health["status"] == "ok" and health["trace_store"]["writer_stalled"] is False
    assert stalled_metric((await get(tw, "/metrics"))[1]) == 0
    assert llm_calls_on_disk(tw) == 1
