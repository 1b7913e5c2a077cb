"""The shared guard log's entry codec (proxy/guard_log/entries.py) alone: what is written reads back as
the typed entry it was, entries written before the version field read the same, a kind this
Tripwire does not know is skipped, and a known kind with a field missing is refused."""

from __future__ import annotations

import orjson
import pytest

from proxy.guard_log import entries


def test_each_kind_reads_back_as_its_typed_entry() -> None:
    tool = entries.decode(entries.tool_check("c1", "search", {"q": "x"}, "docs", 0.25))
    assert isinstance(tool, entries.ToolCheck)
    assert (tool.version, tool.check, tool.tool, tool.server, tool.estimate_usd) == (
        1,
        "c1",
        "search",
        "docs",
        0.25,
    )
    assert tool.sig and tool.ident

    steps = [[("call_1", "search", {"q": "x"})]]
    llm = entries.decode(entries.llm_check("c2", steps, 1, {"call_1": ("fp", "boom")}, 0.5, 700))
    assert isinstance(llm, entries.LlmCheck)
    assert (llm.check, llm.turn_start, llm.estimate_usd, llm.estimate_tokens) == ("c2", 1, 0.5, 700)
    ((call_id, name, sig, ident),) = llm.steps[0]
    assert (call_id, name) == ("call_1", "search") and sig and ident
    assert llm.results["call_1"][0] == "fp" and llm.results["call_1"][1] is not None

    settle = entries.decode(entries.settle_llm("c2", 0.01, 42))
    assert isinstance(settle, entries.Settle) and (settle.ref, settle.cost_usd, settle.tokens) == (
        "c2",
        0.01,
        42,
    )
    tool_settle = entries.decode(entries.settle_tool("c1", "result-fp", None))
    assert isinstance(tool_settle, entries.Settle)
    assert (tool_settle.result, tool_settle.error) == ("result-fp", None)
    assert entries.decode(entries.release("c1")) == entries.Release(ref="c1")
    event = entries.decode(entries.event("TOOL_CALL", "search", "ev-1"))
    assert isinstance(event, entries.EventEntry)
    assert (event.event_type, event.name, event.event_id) == ("TOOL_CALL", "search", "ev-1")
    kill = entries.decode(entries.kill("terminated"))
    assert isinstance(kill, entries.Kill) and kill.reason == "terminated"


def test_entries_written_before_the_version_field_read_the_same() -> None:
    old = [
        {
            "k": "llm",
            "c": "c9",
            "steps": [[["call_1", "search", "s", "i"]]],
            "turn": 0,
            "res": {},
            "est": 0.1,
            "tok": 5,
        },
        {"k": "set", "ref": "c9", "cost": 0.2, "tokens": 9},
        {"k": "ev", "type": "LLM_CALL", "name": "m", "id": "e1"},
    ]
    llm, settle, event = (entries.decode(orjson.dumps(body)) for body in old)
    assert (
        isinstance(llm, entries.LlmCheck)
        and llm.version == 1
        and llm.steps == [[("call_1", "search", "s", "i")]]
    )
    assert isinstance(settle, entries.Settle) and (settle.cost_usd, settle.tokens) == (0.2, 9)
    assert isinstance(event, entries.EventEntry) and event.event_id == "e1"


def test_a_kind_this_version_does_not_know_is_skipped_not_refused() -> None:
    unknown = entries.decode(orjson.dumps({"v": 2, "k": "ask", "who": "a person"}))
    assert isinstance(unknown, entries.UnknownEntry) and unknown.kind == "ask"


@pytest.mark.parametrize(
    "body",
    [b"[1, 2]", orjson.dumps({"k": "set"}), orjson.dumps({"k": "tool", "tool": "t", "sig": 3, "id": "i"})],
)
def test_a_malformed_entry_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError):
        entries.decode(body)
