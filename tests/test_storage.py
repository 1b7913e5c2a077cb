"""Run directories, ids, atomic writes and the viewer's readers (proxy/storage.py)."""

from __future__ import annotations

import logging
import os
import stat
import uuid
from pathlib import Path

import orjson
import pytest

from proxy import runlock, storage
from proxy.constants import EVENTS_JSONL, RUN_JSON, TRIPWIRE_JSON


def _make_run(data_dir: Path, started_at: str, *, name: str = "r", events: int = 0) -> str:
    run_id = str(uuid.uuid4())
    d = data_dir / "runs" / run_id
    d.mkdir(parents=True)
    storage.write_json_atomic(
        d / RUN_JSON,
        {
            "spec_version": "0.1",
            "run_id": run_id,
            "run_name": name,
            "started_at": started_at,
            "ended_at": None,
            "duration_ms": None,
            "status": "running",
            "counts": {"llm_calls": 0, "tool_calls": 0, "errors": 0, "loop_warnings": 0},
            "last_event_ts": None,
        },
    )
    storage.append_lines(d / EVENTS_JSONL, [storage.encode_line({"i": i}) for i in range(events)])
    return run_id


def test_iso_ms() -> None:
    assert storage.iso_ms(1771187465.123) == "2026-02-15T20:31:05.123Z"
    assert storage.iso_ms(1771187465.1239) == "2026-02-15T20:31:05.123Z"  # floored, never rounded up
    assert storage.iso_ms(0) == "1970-01-01T00:00:00.000Z"


def test_iso_ms_agrees_with_datetime_across_seconds() -> None:
    # the last second's text is reused: times going back and forth across seconds still format right
    from datetime import UTC, datetime

    base = 1771187465.0
    for offset in (0.001, 0.999, 1.0, 0.5, 86400.25, 1.5, -3600.75, 0.0):
        ms = int((base + offset) * 1000 + 1e-4)
        expected = f"{datetime.fromtimestamp(ms // 1000, UTC):%Y-%m-%dT%H:%M:%S}.{ms % 1000:03d}Z"
        assert storage.iso_ms(base + offset) == expected


def test_parse_iso_reads_iso_ms_and_refuses_the_rest() -> None:
    assert storage.parse_iso("2026-02-15T20:31:05.123Z") == pytest.approx(1771187465.123)
    assert storage.parse_iso("not a date") is None
    assert storage.parse_iso(None) is None


def test_is_valid_run_id() -> None:
    good = str(uuid.uuid4())
    assert storage.is_valid_run_id(good)
    assert not storage.is_valid_run_id(good.upper())
    assert not storage.is_valid_run_id(str(uuid.uuid1()))
    assert not storage.is_valid_run_id(good.replace("-", ""))
    assert not storage.is_valid_run_id("../" + good)
    assert not storage.is_valid_run_id(good + "\n")
    assert not storage.is_valid_run_id(None)
    assert not storage.is_valid_run_id("")


@pytest.mark.parametrize("bad", ["..", "../etc", "x", "/etc/passwd", "00000000-0000-0000-0000-000000000000"])
def test_run_dir_rejects_bad_ids(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="invalid run_id"):
        storage.run_dir(tmp_path, bad)


def test_run_dir_rejects_a_symlink_out_of_the_base(tmp_path: Path) -> None:
    run_id = str(uuid.uuid4())
    (tmp_path / "runs").mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "runs" / run_id)
    with pytest.raises(ValueError):
        storage.run_dir(tmp_path, run_id)


def test_run_dir_ok(tmp_path: Path) -> None:
    run_id = str(uuid.uuid4())
    assert storage.run_dir(tmp_path, run_id) == tmp_path / "runs" / run_id
    paths = storage.run_paths(tmp_path, run_id)
    assert paths["events_jsonl"].endswith(f"{run_id}/events.jsonl")


@pytest.mark.parametrize("fsync", [False, True])
def test_write_json_atomic_replaces_and_leaves_no_temp(tmp_path: Path, fsync: bool) -> None:
    path = tmp_path / "x.json"
    storage.write_json_atomic(path, {"a": 1}, fsync=fsync)
    storage.write_json_atomic(path, {"a": "é"}, fsync=fsync)
    assert orjson.loads(path.read_bytes()) == {"a": "é"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_write_json_atomic_failure_keeps_old_file(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    storage.write_json_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        storage.write_json_atomic(path, {"a": object()})
    assert orjson.loads(path.read_bytes()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_write_json_atomic_temp_is_private_and_a_stale_one_is_stepped_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temp file is made with plain os calls (no mkstemp): private as mkstemp made it, and a
    temp an earlier process with the same pid left behind is neither reused nor removed."""
    path = tmp_path / "run.json"
    counter = iter(range(100))
    monkeypatch.setattr(storage, "_TEMP_SEQ", counter)
    stale = tmp_path / f"run.json.{os.getpid()}-0.tmp"
    stale.write_bytes(b"stale")
    storage.write_json_atomic(path, {"a": 1}, fsync=True)
    assert orjson.loads(path.read_bytes()) == {"a": 1}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stale.read_bytes() == b"stale"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json", stale.name]


def test_make_run_dir_makes_runs_the_first_time(tmp_path: Path) -> None:
    run = tmp_path / "data" / "runs" / str(uuid.uuid4())
    storage.make_run_dir(run)
    storage.make_run_dir(run)  # again: already there
    assert run.is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError):
        storage.make_run_dir(tmp_path / "file")


def test_append_lines(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    storage.append_lines(path, [storage.encode_line({"a": 1})])
    storage.append_lines(path, [storage.encode_line({"a": 2}), storage.encode_line({"a": "ü"})], fsync=True)
    storage.append_lines(path, [])
    assert path.read_bytes() == b'{"a":1}\n{"a":2}\n{"a":"\xc3\xbc"}\n'


def test_list_runs_newest_first_with_tripwire(tmp_path: Path) -> None:
    old = _make_run(tmp_path, "2026-01-01T00:00:00.000Z", name="old")
    new = _make_run(tmp_path, "2026-03-01T00:00:00.000Z", name="new")
    mid = _make_run(tmp_path, "2026-02-01T00:00:00Z", name="mid")  # AgentDbg also accepts no millis
    storage.write_json_atomic(tmp_path / "runs" / new / TRIPWIRE_JSON, {"agent_name": "a", "cost_usd": 0.5})
    (tmp_path / "runs" / "not-a-run").mkdir()
    broken = tmp_path / "runs" / str(uuid.uuid4())
    broken.mkdir()
    (broken / RUN_JSON).write_text("{ half")
    runs = storage.list_runs(tmp_path)
    assert [r["run_id"] for r in runs] == [new, mid, old]
    assert runs[0]["tripwire"] == {"agent_name": "a", "cost_usd": 0.5}
    assert runs[1]["tripwire"] == {}
    assert [r["run_id"] for r in storage.list_runs(tmp_path, limit=1)] == [new]


def test_list_runs_no_dir(tmp_path: Path) -> None:
    assert storage.list_runs(tmp_path / "nothing") == []


def test_load_run(tmp_path: Path) -> None:
    run_id = _make_run(tmp_path, "2026-01-01T00:00:00.000Z")
    run = storage.load_run(tmp_path, run_id)
    assert run is not None and run["run_id"] == run_id and run["tripwire"] == {}
    assert storage.load_run(tmp_path, str(uuid.uuid4())) is None
    with pytest.raises(ValueError):
        storage.load_run(tmp_path, "../../x")


def test_read_events_skips_corrupt_and_partial_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_id = _make_run(tmp_path, "2026-01-01T00:00:00.000Z", events=3)
    path = tmp_path / "runs" / run_id / EVENTS_JSONL
    with open(path, "ab") as f:
        f.write(b"{not json}\n\n[1,2]\n")
        f.write(storage.encode_line({"i": 3}))
        f.write(b'{"i": 4, "half')  # torn last line
    with caplog.at_level(logging.WARNING, logger="proxy.storage"):
        events = storage.read_events(tmp_path, run_id)
    assert events == [{"i": 0}, {"i": 1}, {"i": 2}, {"i": 3}]
    assert "corrupt" in caplog.text
    assert storage.count_events(tmp_path, run_id) == 4
    assert storage.read_events(tmp_path, run_id, offset=1, limit=2) == [{"i": 1}, {"i": 2}]
    assert storage.read_events(tmp_path, run_id, offset=3) == [{"i": 3}]
    assert storage.read_events(tmp_path, run_id, offset=10) == []
    assert storage.read_events(tmp_path, run_id, limit=0) == []


def test_read_events_missing_file(tmp_path: Path) -> None:
    run_id = str(uuid.uuid4())
    assert storage.read_events(tmp_path, run_id) == []
    assert storage.count_events(tmp_path, run_id) == 0


def test_rename_run(tmp_path: Path) -> None:
    run_id = _make_run(tmp_path, "2026-01-01T00:00:00.000Z")
    meta = storage.rename_run(tmp_path, run_id, "  better name ")
    assert meta is not None and meta["run_name"] == "better name"
    assert orjson.loads((tmp_path / "runs" / run_id / RUN_JSON).read_bytes())["run_name"] == "better name"
    with pytest.raises(ValueError):
        storage.rename_run(tmp_path, run_id, "   ")
    assert storage.rename_run(tmp_path, str(uuid.uuid4()), "x") is None


def test_delete_run(tmp_path: Path) -> None:
    run_id = _make_run(tmp_path, "2026-01-01T00:00:00.000Z", events=2)
    assert storage.run_exists(tmp_path, run_id)
    assert storage.delete_run(tmp_path, run_id) is True
    assert not (tmp_path / "runs" / run_id).exists()
    assert storage.delete_run(tmp_path, run_id) is False
    with pytest.raises(ValueError):
        storage.delete_run(tmp_path, "..")


def _finish(data_dir: Path, run_id: str, ended_at: str, size: int) -> None:
    d = data_dir / "runs" / run_id
    meta = orjson.loads((d / RUN_JSON).read_bytes())
    meta.update(status="ok", ended_at=ended_at, duration_ms=0)
    storage.write_json_atomic(d / RUN_JSON, meta)
    (d / EVENTS_JSONL).write_bytes(b"x" * size)


def test_prune_runs_by_age_and_size(tmp_path: Path) -> None:
    now = storage.parse_iso("2026-03-10T00:00:00.000Z")
    assert now is not None
    old = _make_run(tmp_path, "2026-01-01T00:00:00.000Z")
    _finish(tmp_path, old, "2026-01-01T01:00:00.000Z", 100)
    mid = _make_run(tmp_path, "2026-03-01T00:00:00.000Z")
    _finish(tmp_path, mid, "2026-03-01T01:00:00.000Z", 1000)
    new = _make_run(tmp_path, "2026-03-09T00:00:00.000Z")
    _finish(tmp_path, new, "2026-03-09T01:00:00.000Z", 1000)
    running = _make_run(tmp_path, "2025-01-01T00:00:00.000Z")  # ancient but still running: kept
    kept = _make_run(tmp_path, "2025-01-01T00:00:00.000Z")
    _finish(tmp_path, kept, "2025-01-01T00:00:00.000Z", 10)

    assert storage.prune_runs(tmp_path, now=now) == []
    assert storage.prune_runs(tmp_path, now=now, max_age_s=30 * 86400, keep={kept}) == [old]
    # size: mid + new (+ small run.json files) exceed 1500 bytes: the oldest finished one goes
    assert storage.prune_runs(tmp_path, now=now, max_total_bytes=1500, keep={kept}) == [mid]
    left = {p.name for p in (tmp_path / "runs").iterdir()}
    assert left == {new, running, kept}


def test_append_lines_continues_a_short_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write() that takes only part of the data is continued from where it stopped, nothing doubled."""
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))
    path = tmp_path / EVENTS_JSONL
    lines = [storage.encode_line({"i": i, "text": "x" * 20}) for i in range(3)]
    storage.append_lines(path, lines)
    assert path.read_bytes() == b"".join(lines)


def test_owner_progress_record_keeps_its_size(tmp_path: Path) -> None:
    """The lock file's progress record is rewritten in place at one size, whatever the counters
    (a '%' in the host name stays as it is)."""
    lock = runlock.OwnerLock(tmp_path)
    lock.host = "host-%d-100%"
    assert lock.acquire()
    try:
        sizes = set()
        for passes, seq in [(0, 0), (7, 12345), (10**15, 3)]:
            lock.progress(passes, seq)
            raw = lock.path.read_bytes()
            sizes.add(len(raw))
            record = runlock.read_progress(tmp_path, lock.id)
            assert record is not None
            assert (record["passes"], record["written_seq"], record["check"]) == (passes, seq, passes)
            assert record["host"] == "host-%d-100%" and record["owner"] == lock.id
        assert len(sizes) == 1
    finally:
        lock.release()
