"""The trace writer's disk process (proxy/trace/disk_process.py, disk_child.py, off_loop.py): real
child processes writing real files. The child writes the same bytes as the loop for the same jobs
(failures included); a child killed with a pass in flight is replaced by the loop with nothing lost
or doubled; a parent killed with -9 leaves the child to finish what it was sent, holding the owner
lock until then, so recovery elsewhere waits for it."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy import runlock
from proxy.constants import EVENTS_JSONL, RUN_JSON, TRIPWIRE_JSON
from proxy.recorder import TraceRecorder
from proxy.trace.disk_child import job_of, pass_frame, unframe
from proxy.trace.disk_process import DiskProcess, DiskProcessGone
from proxy.trace.jobs import Job, JobResult, write_job
from proxy.trace.off_loop import OffLoop

# pipes on the loop: asyncio's and uvloop's transports differ (serve runs uvloop)
pytestmark = pytest.mark.both_loops
ROOT = Path(__file__).resolve().parents[1]
RUN_A = "00000000-0000-4000-8000-00000000000a"


def job(run_dir: Path, lines: list[bytes], **fields: Any) -> Job:
    values: dict[str, Any] = {
        "run_id": run_dir.name,
        "dir": str(run_dir),
        "make_dir": True,
        "lines": [],
        "data": list(lines),
        "data_size": sum(len(line) for line in lines),
        "after": None,
        "size": None,
        "torn": False,
        "run_json": {"run_id": run_dir.name, "counts": {"llm_calls": len(lines)}, "ratio": 0.1 + 0.2},
        "tripwire": {"run_id": run_dir.name, "guard_config": {"nested": [1, "two", None, True, {"k": 3.5}]}},
        "tripwire_first": True,
        "fsync": False,
    }
    values.update(fields)
    return Job(**values)


def scenario(root: Path) -> list[Job]:
    """A new run; appends to a run on disk; a rewrite only; a torn file cut back; failures: a folder
    that cannot be made, an events.jsonl that cannot be appended to, an unwritable tripwire.json."""
    (root / "b").mkdir(parents=True)
    (root / "b" / EVENTS_JSONL).write_bytes(b'{"n":0}\n')
    (root / "c").mkdir()
    (root / "d").mkdir()
    (root / "d" / EVENTS_JSONL).write_bytes(b'{"n":0}\n{"n":1, "cut sh')
    (root / "blocker").write_bytes(b"a file where a folder's parent should be")
    (root / "f").mkdir()
    (root / "f" / EVENTS_JSONL).mkdir()
    (root / "g").mkdir()
    (root / "g" / TRIPWIRE_JSON).mkdir()
    return [
        job(root / "a", [b'{"n":1}\n', b'{"n":2,"s":"\xc3\xa9"}\n']),
        job(root / "b", [b'{"n":1}\n'], make_dir=False, size=8, tripwire=None),
        job(root / "c", [], make_dir=False, tripwire=None, fsync=True),
        job(root / "d", [b'{"n":3}\n'], make_dir=False, size=8, torn=True, tripwire=None),
        job(root / "blocker" / "e", [b'{"n":1}\n']),
        job(root / "f", [b'{"n":1}\n'], make_dir=False),
        job(root / "g", [b'{"n":1}\n'], make_dir=False),
    ]


def tree(root: Path) -> dict[str, bytes | None]:
    """Every file's bytes under root by relative path (folders: None); no temp file may remain."""
    out: dict[str, bytes | None] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        assert not rel.endswith(".tmp"), rel
        out[rel] = None if p.is_dir() else p.read_bytes()
    return out


def comparable(res: JobResult, root: Path) -> tuple[Any, ...]:
    return (
        res.run_id,
        res.dir_made,
        res.size,
        res.torn,
        res.lines_ok,
        res.tripwire_ok,
        res.run_json_ok,
        res.errno,
        [e.replace(str(root), "ROOT") for e in res.errors],
    )


async def test_the_child_writes_the_same_bytes_and_results_as_the_loop(tmp_path: Path) -> None:
    on_loop, in_child = tmp_path / "loop", tmp_path / "child"
    loop_jobs, child_jobs = scenario(on_loop), scenario(in_child)
    loop_results = [write_job(j) for j in loop_jobs]
    p = DiskProcess()
    await p.start()
    try:
        child_results = await p.write(child_jobs, group_sync=False)
        assert p.sent == p.passes == 1
    finally:
        await p.close()
    assert tree(in_child) == tree(on_loop)
    assert [comparable(r, in_child) for r in child_results] == [comparable(r, on_loop) for r in loop_results]
    by_name = {Path(j.dir).name: r for j, r in zip(child_jobs, child_results, strict=True)}
    assert by_name["a"].lines_ok and by_name["a"].run_json_ok and by_name["a"].size == 8 + 17
    assert by_name["d"].lines_ok and (in_child / "d" / EVENTS_JSONL).read_bytes() == b'{"n":0}\n{"n":3}\n'
    assert by_name["e"].dir_made is False and by_name["e"].lines_ok is False and by_name["e"].errors
    assert by_name["f"].lines_ok is False and by_name["f"].run_json_ok is None
    assert by_name["g"].tripwire_ok is False and by_name["g"].run_json_ok is None  # tripwire.json first


async def test_a_read_only_folder_fails_alike_in_the_child(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder")
    results = []
    for name in ("loop", "child"):
        ro = tmp_path / name / "ro"
        ro.mkdir(parents=True)
        ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
        jobs = [job(ro / RUN_A, [b'{"n":1}\n']), job(ro / "runs" / "x", [b'{"n":1}\n'])]
        if name == "loop":
            results.append([comparable(write_job(j), tmp_path / name) for j in jobs])
        else:
            p = DiskProcess()
            await p.start()
            try:
                results.append([comparable(r, tmp_path / name) for r in await p.write(jobs, group_sync=True)])
            finally:
                await p.close()
        ro.chmod(stat.S_IRWXU)
    assert results[0] == results[1]
    assert all(r[4] is False and r[7] is not None for r in results[1])  # lines not written, errno kept


def test_the_wire_keeps_every_disk_field_and_json_marshal_refuses_as_orjson_reads_it() -> None:
    class Tag(str):
        pass

    tripwire = {"tag": Tag("t"), "status": StrEnum("S", ["ok"]).ok, "at": 0.1 + 0.2}
    j = job(Path("/x/y"), [b"a\n", b"b\n"], size=5, torn=True, tripwire=tripwire)
    body = pass_frame(True, [j])
    group_sync, (w,) = unframe(body[4:])
    back = job_of(w)
    assert group_sync is True
    assert (back.dir, back.make_dir, back.data, back.data_size, back.size, back.torn) == (
        "/x/y",
        True,
        [b"a\nb\n"],
        4,
        5,
        True,
    )
    assert (back.run_json, back.tripwire_first, back.fsync) == (j.run_json, True, False)
    assert back.tripwire == {"tag": "t", "status": "ok", "at": 0.1 + 0.2}
    assert type(back.tripwire["tag"]) is str
    encoded = orjson.dumps(tripwire, option=orjson.OPT_INDENT_2)
    assert orjson.dumps(back.tripwire, option=orjson.OPT_INDENT_2) == encoded  # the same bytes
    with pytest.raises(TypeError):
        pass_frame(False, [job(Path("/x/z"), [], run_json={"x": object()})])


async def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def read_fifo(path: Path) -> bytes:
    with open(path, "rb") as f:  # blocks until the writer opens it; returns at its close
        return f.read()


async def test_a_child_killed_mid_pass_is_replaced_by_the_loop_nothing_lost_or_doubled(
    tmp_path: Path,
) -> None:
    """Run a's writes done by the child, then it blocks on a FIFO (run b's events.jsonl) and is
    killed: the pass is written again off the child, a's lines once, b's all."""
    errors: list[str] = []
    off = OffLoop("process", errors.append, lambda: None)
    await off.start()
    assert off.process_up and off.pid is not None
    (tmp_path / "b").mkdir()
    os.mkfifo(tmp_path / "b" / EVENTS_JSONL)
    a_lines, b_lines = [b'{"run":"a","n":1}\n', b'{"run":"a","n":2}\n'], [b'{"run":"b","n":1}\n']
    jobs = [job(tmp_path / "a", a_lines), job(tmp_path / "b", b_lines, make_dir=False)]
    pass_ = asyncio.create_task(off.write(jobs, group_sync=False))
    await wait_for(lambda: (tmp_path / "a" / RUN_JSON).exists(), "the child to write run a")
    assert not pass_.done()  # the child is held by b's FIFO
    os.kill(off.pid, signal.SIGKILL)
    # seen dead (its stdout closed by its exit): its open of the FIFO is gone, the thread's is next
    await wait_for(lambda: off.process is None, "the writer to see the child gone")
    reader = asyncio.create_task(asyncio.to_thread(read_fifo, tmp_path / "b" / EVENTS_JSONL))
    results = await pass_
    assert await reader == b"".join(b_lines)
    assert [r.lines_ok for r in results] == [True, True] and not off.process_up
    assert (tmp_path / "a" / EVENTS_JSONL).read_bytes() == b"".join(a_lines)  # once, not twice
    assert results[0].size == len(b"".join(a_lines))
    assert orjson.loads((tmp_path / "a" / RUN_JSON).read_bytes())["counts"] == {"llm_calls": 2}
    assert len(errors) == 1 and "ended with a pass in flight" in errors[0]
    again = await off.write([job(tmp_path / "c", [b'{"run":"c"}\n'])], group_sync=False)  # on the loop now
    assert again[0].lines_ok and off.process is None
    await off.close()


async def test_a_recorder_whose_child_dies_goes_on_writing_on_the_loop(tmp_path: Path) -> None:
    rec = TraceRecorder(tmp_path, trace_writer="process")
    await rec.start()
    await rec._writer.off_loop.started()  # (started in the background: passes on the loop until then)
    try:
        first = rec.start_run(run_name="r1", agent_name="a", session_id="s1")
        rec.record(first, "LLM_CALL", "m", {"n": 1})
        await rec.flush()
        pid = rec.health()["writer_process"]
        assert isinstance(pid, int) and rec.health()["trace_writer"] == "process"
        os.kill(pid, signal.SIGKILL)
        rec.record(first, "LLM_CALL", "m", {"n": 2})
        second = rec.start_run(run_name="r2", agent_name="a", session_id="s2")
        rec.record(second, "LLM_CALL", "m", {"n": 1})
        await rec.flush()
        assert rec.health()["writer_process"] is None and rec.write_errors == 1
        rec.end_run(first, status="ok", reason="done")
        rec.end_run(second, status="ok", reason="done")
    finally:
        await rec.close()
    for rid, n in ((first, 2), (second, 1)):
        events = [orjson.loads(x) for x in (tmp_path / "runs" / rid / EVENTS_JSONL).read_bytes().splitlines()]
        assert [e["event_type"] for e in events] == ["RUN_START", *["LLM_CALL"] * n, "RUN_END"]
        assert [e["payload"]["n"] for e in events[1:-1]] == list(range(1, n + 1))
        assert orjson.loads((tmp_path / "runs" / rid / RUN_JSON).read_bytes())["status"] == "ok"


async def test_close_waits_for_the_child_and_leaves_no_process(tmp_path: Path) -> None:
    rec = TraceRecorder(tmp_path, trace_writer="process")
    await rec.start()
    await rec._writer.off_loop.started()  # (started in the background: passes on the loop until then)
    rid = rec.start_run(run_name="r", agent_name="a", session_id="s")
    await rec.flush()
    pid = rec.health()["writer_process"]
    assert isinstance(pid, int)
    await rec.close()
    assert rec.health()["writer_process"] is None
    assert reaped(pid)
    assert orjson.loads((tmp_path / "runs" / rid / RUN_JSON).read_bytes())["status"] == "ok"


async def test_a_child_that_cannot_start_leaves_the_writer_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python-here"))
    rec = TraceRecorder(tmp_path, trace_writer="process")
    await rec.start()
    await rec._writer.off_loop.started()  # (started in the background: passes on the loop until then)
    try:
        rid = rec.start_run(run_name="r", agent_name="a", session_id="s")
        await rec.flush()
        assert rec.health()["writer_process"] is None and rec.write_errors == 1
        assert "did not start" in (rec.last_error or "")
    finally:
        await rec.close()
    assert (tmp_path / "runs" / rid / EVENTS_JSONL).exists()


async def test_a_dead_child_is_reported_as_gone() -> None:
    p = DiskProcess()
    await p.start()
    p.kill()
    with pytest.raises(DiskProcessGone):
        await p.write([], group_sync=False)
    await p.close()


PARENT = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from proxy.recorder import TraceRecorder

    async def main(data_dir):
        rec = TraceRecorder(Path(data_dir), trace_writer="process")
        await rec.start()
        await rec._writer.off_loop.started()
        answered = rec.start_run(run_name="answered", agent_name="a", session_id="s0")
        rec.record(answered, "LLM_CALL", "m", {"n": 1})
        await rec.flush()  # on disk: the call was answered
        process = rec._writer.off_loop.process
        print(rec.owner.id, process.pid, answered, flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # the test has stopped the child (SIGSTOP)
        later = [rec.start_run(run_name=f"later{i}", agent_name="a", session_id=f"s{i}") for i in range(5)]
        for rid in later:
            rec.record(rid, "LLM_CALL", "m", {"n": 2})
        sent = process.sent
        rec._writer._wake.set()
        while process.sent == sent or process.unsent_bytes:
            await asyncio.sleep(0.001)
        print(*later, flush=True)  # in the pipe, not yet read: the child is stopped
        await asyncio.sleep(600)  # killed with -9 here

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_a_parent_killed_with_9_leaves_the_child_to_finish_and_hold_the_lock(tmp_path: Path) -> None:
    parent = spawn_parent(tmp_path)
    assert parent.stdout is not None and parent.stdin is not None
    owner, child, answered = (await asyncio.to_thread(parent.stdout.readline)).decode().split()
    os.kill(int(child), signal.SIGSTOP)
    try:
        parent.stdin.write(b"go\n")
        parent.stdin.flush()
        later = (await asyncio.to_thread(parent.stdout.readline)).decode().split()
        parent.kill()
        await asyncio.to_thread(parent.wait)
        runs = tmp_path / "runs"
        assert len(later) == 5 and not any((runs / rid).exists() for rid in later)
        assert runlock.owner_alive(tmp_path, owner)  # the (stopped) child holds the lock
        other = TraceRecorder(tmp_path)
        try:
            assert other.recover_interrupted() == []  # nothing closed while the child may write
            assert orjson.loads((runs / answered / RUN_JSON).read_bytes())["status"] == "running"
        finally:
            other.owner.release()
    finally:
        os.kill(int(child), signal.SIGCONT)
        parent.stdin.close()
        parent.stdout.close()
    await wait_for(lambda: not runlock.owner_alive(tmp_path, owner), "the child to write all and exit")
    await wait_for(lambda: exited(child), "the child to exit")
    for rid in later:  # every run the parent had sent is on disk, whole
        events = [orjson.loads(x) for x in (runs / rid / EVENTS_JSONL).read_bytes().splitlines()]
        assert [e["event_type"] for e in events] == ["RUN_START", "LLM_CALL"]
        assert orjson.loads((runs / rid / TRIPWIRE_JSON).read_bytes())["owner"]["id"] == owner
        assert orjson.loads((runs / rid / RUN_JSON).read_bytes())["counts"]["llm_calls"] == 1
    other = TraceRecorder(tmp_path)
    try:
        assert set(other.recover_interrupted()) == {answered, *later}  # now closed, as after any crash
    finally:
        other.owner.release()


def reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def spawn_parent(data_dir: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", PARENT, str(data_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def exited(pid: str) -> bool:
    """Gone, or a zombie waiting for whoever adopted it to reap it."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line for line in f)
    except OSError:
        return True


async def test_a_stuck_child_is_reported_as_a_stalled_writer_and_catches_up(tmp_path: Path) -> None:
    """A disk that hangs (here: the child stopped) is seen as with the loop's writer: events wait,
    /healthz's trace_store says stalled; then everything is written, in order."""
    rec = TraceRecorder(tmp_path, trace_writer="process", stall_after_s=0.2)
    await rec.start()
    await rec._writer.off_loop.started()
    try:
        rid = rec.start_run(run_name="r", agent_name="a", session_id="s")
        await rec.flush()
        pid = rec.health()["writer_process"]
        assert isinstance(pid, int)
        os.kill(pid, signal.SIGSTOP)
        try:
            second = rec.start_run(run_name="r2", agent_name="a", session_id="s2")  # the child's work
            rec.record(rid, "LLM_CALL", "m", {"n": 1})
            await wait_for(lambda: rec.health()["writer_stalled"], "the writer to report itself stalled")
            assert rec.health()["ok"] is False and rec.health()["queue_depth"] > 0
        finally:
            os.kill(pid, signal.SIGCONT)
        await rec.flush()
        assert rec.health()["writer_stalled"] is False and rec.health()["writer_process"] == pid
        assert rec.write_errors == 0
    finally:
        await rec.close()
    for run, types in ((rid, ["RUN_START", "LLM_CALL", "RUN_END"]), (second, ["RUN_START", "RUN_END"])):
        events = (tmp_path / "runs" / run / EVENTS_JSONL).read_bytes().splitlines()
        assert [orjson.loads(x)["event_type"] for x in events] == types
