"""TraceRecorder.start_run: RUN_START's payload cleaned field by field (the process's fields once)
is byte for byte what sanitising the whole payload makes of it, hostile inputs included."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.constants import DEFAULT_MAX_FIELD_BYTES, EVENTS_JSONL, REDACTED_MARKER, RUNS_DIR
from proxy.recorder import TraceRecorder
from proxy.redact import redact_argv, sanitize

OPENAI_KEY = "sk-proj-4fQz9XbT1mK7pL2sV8nR3wY6"
T0 = 1771187465.0

HOSTILE = [
    # (run_name, agent_name, session_id)
    ("agent s1", "agent", "s1"),
    ("", "agent", "auto-0123456789ab"),  # no name: the event is named "run"
    (f"summarise this: {OPENAI_KEY}", f"agent-{OPENAI_KEY}", f"sess Bearer {OPENAI_KEY}"),
    ("fetch https://user:hunter2pass@example.com/x?api_key=abcdef123456", "a", "b"),
    ("é" * 5000 + " the end", "ä" * 300, "s" * 10_000),  # long: cut to the cap
    ("lone \ud800 surrogate", "agent\udfff", "s\ud83d"),
    ('{"password": "hunter2hunter2"} --token=abcdefabcdef', "AGENT", "x"),
]
ARGV = [
    "tripwire",
    "serve",
    "--admin-token",
    "hunter2",
    f"--upstream=https://me:{OPENAI_KEY}@api.example.com",
    OPENAI_KEY,
    "y" * 3000,
]


def full_payload(r: TraceRecorder, run_name: str, agent: str, session_id: str, argv: list[str]) -> Any:
    """What the payload was: built whole, then sanitised whole (as any event's is)."""
    raw = {
        "run_name": run_name,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "cwd": os.getcwd(),
        "argv": redact_argv(argv),
        "agent_name": agent,
        "session_id": session_id,
    }
    return sanitize(raw, r.max_field_bytes)


async def run_start(r: TraceRecorder, run_id: str) -> dict[str, Any]:
    await r.flush()
    lines = (r.data_dir / RUNS_DIR / run_id / EVENTS_JSONL).read_bytes().splitlines()
    event: dict[str, Any] = orjson.loads(lines[0])
    assert event["event_type"] == "RUN_START"
    return event


@pytest.mark.parametrize("max_field_bytes", [16, 64, DEFAULT_MAX_FIELD_BYTES])
async def test_run_start_is_the_whole_payload_sanitised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_field_bytes: int
) -> None:
    here = tmp_path / f"work-{OPENAI_KEY}-{'d' * 150}"  # a cwd with a secret in it, longer than the cap
    here.mkdir()
    monkeypatch.chdir(here)
    r = TraceRecorder(tmp_path / "data", max_field_bytes=max_field_bytes, clock=lambda: T0)
    await r.start()
    try:
        for run_name, agent, session_id in HOSTILE:
            for argv in (ARGV, ["tripwire", "serve"]):  # the process's fields change: worked out again
                run_id = r.start_run(run_name=run_name, agent_name=agent, session_id=session_id, argv=argv)
                event = await run_start(r, run_id)
                expected = full_payload(r, run_name, agent, session_id, argv)
                assert orjson.dumps(event["payload"]) == orjson.dumps(expected)
                assert event["name"] == sanitize(str(run_name or "run"), max_field_bytes)
                # (a key inside a word, as in the agent's name, is left as sanitize leaves it)
                assert OPENAI_KEY not in event["name"] + event["payload"]["run_name"]
        # the cwd changes: RUN_START says the new one
        monkeypatch.chdir(tmp_path)
        run_id = r.start_run(run_name="n", agent_name="a", session_id="s", argv=ARGV)
        event = await run_start(r, run_id)
        assert event["payload"] == full_payload(r, "n", "a", "s", ARGV)
        assert event["payload"]["cwd"] == sanitize(str(tmp_path), max_field_bytes)
    finally:
        await r.close()


async def test_a_resumed_runs_start_fields_are_sanitised_with_the_rest(tmp_path: Path) -> None:
    r = TraceRecorder(tmp_path, max_field_bytes=64, clock=lambda: T0)
    await r.start()
    try:
        fields = {"resumed_from": "r1", "carried_over": {"api_key": "x", "note": "Bearer " + OPENAI_KEY * 3}}
        run_id = r.start_run(run_name="n", agent_name="a", session_id="s", argv=ARGV, start_fields=fields)
        event = await run_start(r, run_id)
        m = r.max_field_bytes
        expected = sanitize({**full_payload(r, "n", "a", "s", ARGV), **sanitize(fields, m)}, m)
        assert orjson.dumps(event["payload"]) == orjson.dumps(expected)
        assert event["payload"]["carried_over"]["api_key"] == REDACTED_MARKER
    finally:
        await r.close()


async def test_each_run_start_holds_its_own_argv(tmp_path: Path) -> None:
    """The process's fields are kept once: a run's event gets a copy (a sink may hold it)."""
    r = TraceRecorder(tmp_path, clock=lambda: T0)
    await r.start()
    try:
        first = r.start_run(run_name="n", agent_name="a", session_id="s", argv=["tripwire", "serve"])
        second = r.start_run(run_name="n", agent_name="a", session_id="s", argv=["tripwire", "serve"])
        a, b = await run_start(r, first), await run_start(r, second)
        assert a["payload"]["argv"] == b["payload"]["argv"] == ["tripwire", "serve"]
    finally:
        await r.close()
