"""proxy/trace/writer.py's one-run write alone (`write_job`, what each pass does per run): the lines,
then tripwire.json, then run.json; a failed append writes neither file and leaves no partial line;
a file torn by an earlier failure is cut back to its last good size before the next append. (The
writer's passes, queue and health: tests/test_trace_writer.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from proxy.constants import EVENTS_JSONL, RUN_JSON, TRIPWIRE_JSON
from proxy.trace.writer import Job, write_job


def job(run_dir: Path, lines: list[bytes], **fields: Any) -> Job:
    values: dict[str, Any] = {
        "run_id": "run-1",
        "dir": run_dir,
        "make_dir": True,
        "lines": list(lines),  # (write_job reads only whether there are any)
        "data": list(lines),
        "data_size": sum(len(line) for line in lines),
        "after": None,
        "size": None,
        "torn": False,
        "run_json": {"run_id": "run-1", "counts": {"events": len(lines)}},
        "tripwire": {"run_id": "run-1"},
        "tripwire_first": True,
        "fsync": False,
    }
    values.update(fields)
    return Job(**values)


def test_the_lines_then_tripwire_json_then_run_json(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "run-1"
    lines = [b'{"n":1}\n', b'{"n":2}\n']
    res = write_job(job(run_dir, lines))
    assert res.dir_made and res.lines_ok and res.tripwire_ok and res.run_json_ok and not res.errors
    assert (run_dir / EVENTS_JSONL).read_bytes() == b"".join(lines)
    assert res.size == sum(len(line) for line in lines)
    assert orjson.loads((run_dir / RUN_JSON).read_bytes())["counts"] == {"events": 2}
    assert orjson.loads((run_dir / TRIPWIRE_JSON).read_bytes()) == {"run_id": "run-1"}


def test_a_failed_append_writes_neither_file(tmp_path: Path) -> None:
    run_dir = tmp_path / "run-1"
    run_dir.mkdir()
    (run_dir / EVENTS_JSONL).mkdir()  # events.jsonl cannot be appended to
    res = write_job(job(run_dir, [b'{"n":1}\n'], make_dir=False))
    assert res.lines_ok is False and res.errors
    assert res.tripwire_ok is None and res.run_json_ok is None
    assert not (run_dir / RUN_JSON).exists() and not (run_dir / TRIPWIRE_JSON).exists()


def test_a_torn_file_is_cut_back_before_the_next_append(tmp_path: Path) -> None:
    run_dir = tmp_path / "run-1"
    run_dir.mkdir()
    good = b'{"n":1}\n'
    (run_dir / EVENTS_JSONL).write_bytes(good + b'{"n":2, "cut sh')  # an append that failed midway
    res = write_job(job(run_dir, [b'{"n":3}\n'], make_dir=False, size=len(good), torn=True, tripwire=None))
    assert res.lines_ok and not res.torn
    assert (run_dir / EVENTS_JSONL).read_bytes() == good + b'{"n":3}\n'


def test_run_json_waits_for_tripwire_json_when_it_owns_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run-1"
    run_dir.mkdir()
    (run_dir / TRIPWIRE_JSON).mkdir()  # tripwire.json cannot be written
    res = write_job(job(run_dir, [], make_dir=False))
    assert res.lines_ok is None and res.tripwire_ok is False and res.run_json_ok is None
    assert not (run_dir / RUN_JSON).exists()
