"""AgentDbg 0.1 JSON Schema checks for files Tripwire writes; import `assert_run_valid` in any test.

Validates with Draft 2020-12 and format checking (uuid, date-time), so a sloppy id or timestamp fails.
"""

from __future__ import annotations

import functools
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import jsonschema
import orjson

SCHEMA_DIR = Path("/work/shared/reference/agentdbg-0.1")
# A copy travels with the tests so they also run outside this workspace.
_LOCAL_SCHEMA_DIR = Path(__file__).parent / "schemas" / "agentdbg-0.1"


_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})\Z")
# AgentDbg's own form, which Tripwire always writes: UTC, milliseconds, Z.
ISO_MS_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z\Z")
UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\Z")

_FORMATS = jsonschema.FormatChecker()


@_FORMATS.checks("date-time", raises=ValueError)
def _is_date_time(value: object) -> bool:
    """RFC 3339 date-time (jsonschema only checks it with an optional extra package installed)."""
    if not isinstance(value, str):
        return True
    if not _RFC3339.match(value):
        return False
    datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    return True


@functools.cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    base = _LOCAL_SCHEMA_DIR if (_LOCAL_SCHEMA_DIR / name).is_file() else SCHEMA_DIR
    schema = orjson.loads((base / name).read_bytes())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=_FORMATS)


def run_validator() -> jsonschema.Draft202012Validator:
    return _validator("run.schema.json")


def event_validator() -> jsonschema.Draft202012Validator:
    return _validator("event.schema.json")


def assert_valid_run_json(meta: dict[str, Any]) -> None:
    errors = sorted(run_validator().iter_errors(meta), key=str)
    assert not errors, f"run.json invalid: {[e.message for e in errors]}\n{meta}"


def assert_valid_event(event: dict[str, Any]) -> None:
    errors = sorted(event_validator().iter_errors(event), key=str)
    assert not errors, f"event invalid: {[e.message for e in errors]}\n{event}"


def read_run_files(data_dir: Path, run_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """run.json and every line of events.jsonl, parsed strictly (a corrupt line fails the test)."""
    d = Path(data_dir) / "runs" / run_id
    meta = orjson.loads((d / "run.json").read_bytes())
    raw = (d / "events.jsonl").read_bytes()
    assert raw.endswith(b"\n"), "events.jsonl must end with a newline"
    events = [orjson.loads(line) for line in raw.splitlines() if line.strip()]
    return meta, events


def assert_run_valid(data_dir: Path, run_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Validate run.json and every event of a run against AgentDbg's schemas, plus the invariants
    the schemas cannot say (ids match the folder, RUN_START first, RUN_END last when ended, counts
    agree with the events). Returns (run_json, events) for further asserts.
    """
    meta, events = read_run_files(data_dir, run_id)
    assert_valid_run_json(meta)
    assert meta["run_id"] == run_id and UUID4.match(run_id)
    for key in ("started_at", "ended_at", "last_event_ts"):
        assert meta[key] is None or ISO_MS_Z.match(meta[key]), f"{key}={meta[key]!r}"
    assert events, "a run has at least its RUN_START"
    for ev in events:
        assert_valid_event(ev)
        assert ev["run_id"] == run_id
        assert UUID4.match(ev["event_id"]), ev["event_id"]
        assert ISO_MS_Z.match(ev["ts"]), ev["ts"]
    assert events[0]["event_type"] == "RUN_START"
    assert len({ev["event_id"] for ev in events}) == len(events), "event ids must be unique"
    kinds = [ev["event_type"] for ev in events]
    assert kinds.count("RUN_START") == 1
    if meta["status"] != "running":
        assert kinds[-1] == "RUN_END" and kinds.count("RUN_END") == 1
        assert meta["ended_at"] is not None and meta["duration_ms"] is not None
    else:
        assert "RUN_END" not in kinds
    expected = {
        "llm_calls": kinds.count("LLM_CALL"),
        "tool_calls": kinds.count("TOOL_CALL"),
        "errors": kinds.count("ERROR"),
        "loop_warnings": kinds.count("LOOP_WARNING"),
    }
    assert meta["counts"] == expected, f"counts {meta['counts']} != events {expected}"
    return meta, events
