"""guard_trace.sanitized_fields: the guard fields of a call's event, sanitised with the walk cut
short where Tripwire made the value, are exactly what `sanitize` makes of them, for every shape the
guard fields take (plain calls, history deltas, MCP calls, a config, decisions) and any field cap."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.guard_trace import (
    CLEAN_FROM_BYTES,
    GuardTrace,
    clean_fields,
    llm_inputs,
    mcp_inputs,
    own_numbers,
    sanitized_fields,
)
from proxy.guards.config import GuardConfig
from proxy.guards.session import SessionGuards
from proxy.redact import is_secret_key, sanitize

SECRET = "sk-proj-" + "Q1w2E3r4T5" * 3


def fields(inputs: dict[str, Any], **more: Any) -> dict[str, Any]:
    """As guard_trace.begin lays them out (its own numbers first, then the inputs)."""
    return {"t": 0.012345, "ev": 3, "done": 2, "cfg": 0, **inputs, **more}


def shapes() -> list[dict[str, Any]]:
    plain, _ = llm_inputs([], [], 0, [], 0.00064, 1227)
    steps = [[("call_1", "get_weather", {"city": "Paris", "api_key": SECRET})]]
    results = {"call_1": ("f" * 16, "failed: Bearer abcdefghijklmnop")}
    history, ids = llm_inputs([], steps, 1, results, 0.5, 10)
    kept, _ = llm_inputs(ids, steps, 1, {}, 0.5, 10)
    return [
        fields(plain, decisions=[]),
        fields(plain, decisions=[["loop", "repeat", "warn"]]),
        fields(history, decisions=[]),
        fields(kept),
        fields(mcp_inputs("search " + "x" * 3000, {"token": SECRET}, "srv", 0.0)),
        fields(plain, config={"max_cost_usd": 1.0, "admin_token": "hunter2", "names": ["a", "b"]}),
        fields({"kind": "llm", "hist": {"keep": 0, "add": [], "turn_start": 0, "results": {}, "x": SECRET}}),
        fields({"kind": "llm", "hist": {"keep": 0.5, "add": [], "turn_start": 0, "results": {}}}),
    ]


@pytest.mark.parametrize("max_field_bytes", [1, 8, 64, 1024, 20000])
def test_sanitized_fields_are_sanitize_of_the_fields(max_field_bytes: int) -> None:
    for shape in shapes():
        got = sanitized_fields(shape, max_field_bytes)
        assert got == sanitize(shape, max_field_bytes, 1)
        assert list(got) == list(shape)
        if "hist" in got:
            assert list(got["hist"]) == list(shape["hist"])


def test_the_guard_fields_own_names_are_none_secret_named() -> None:
    for shape in shapes()[:5]:
        names = [*shape, *shape.get("hist", {})]
        assert not [name for name in names if is_secret_key(name)]


@pytest.mark.parametrize("max_field_bytes", [8, 1024])
def test_clean_fields_cleans_in_place_what_sanitize_would_change(max_field_bytes: int) -> None:
    for shape in shapes():
        fields = dict(shape)
        want = sanitize(shape, max_field_bytes, 1)
        assert clean_fields(fields, max_field_bytes) is fields
        assert fields == want and list(fields) == list(want)
        assert clean_fields(fields, max_field_bytes) == want  # a second time: the same


def test_a_settled_payload_is_the_same_each_time_it_is_taken() -> None:
    """The sanitised payload cleans the trace's fields in place (written once, with the call's
    event); taken again, it is the same, and sanitize of the raw one taken before."""
    for shape in shapes():
        trace = GuardTrace(3, dict(shape), SessionGuards(GuardConfig(), started_at=0.0), started_at=0.0)
        trace.rank, trace.settled_at, trace.settle = 2, 1.5, {"cost": 0.001, "tokens": 12}
        raw = trace.payload()
        first = trace.payload(64)
        assert first == sanitize(raw, 64) and list(first["guard_input"]) == list(raw["guard_input"])
        assert trace.payload(64) == first


def all_inputs() -> list[dict[str, Any]]:
    plain, _ = llm_inputs([], [], 0, [], 0.00064, 1227)
    steps = [[("call_1", "get_weather", {"city": "Paris"})]]
    history, ids = llm_inputs([], steps, 1, {"call_1": ("f" * 16, None)}, 0.5, 10)
    kept, _ = llm_inputs(ids, steps, 1, {}, 0.5, 10)
    odd = {"keep": 0, "add": [], "turn_start": 0, "results": {}}
    return [
        plain,
        history,
        kept,
        mcp_inputs("search", {"q": "x"}, "srv", 0.0),
        {**plain, "hist": {**odd, "x": SECRET}},
        {**plain, "hist": {**odd, "keep": 0.5}},
        {**plain, "est": "0.1"},
        {**plain, "tok": [1]},
    ]


@pytest.mark.parametrize("max_field_bytes", [1, 8, 1024])
def test_own_numbers_only_where_sanitize_keeps_every_value(max_field_bytes: int) -> None:
    """A trace marked clean (own_numbers, nothing decided, no config) skips clean_fields: only right
    where clean_fields would keep every value as it is."""
    for inputs in all_inputs():
        shape = fields(inputs, decisions=[])
        cleaned = clean_fields(dict(shape), max_field_bytes)
        if own_numbers(inputs) and max_field_bytes >= CLEAN_FROM_BYTES:
            assert all(cleaned[k] is v for k, v in shape.items())
    assert [own_numbers(inputs) for inputs in all_inputs()] == [True, False, True] + [False] * 5


@pytest.mark.parametrize("max_field_bytes", [1, 8, 16, 64])
@pytest.mark.parametrize("clean", [False, True])
def test_a_clean_trace_gives_what_sanitize_makes(clean: bool, max_field_bytes: int) -> None:
    plain, _ = llm_inputs([], [], 0, [], 0.00064, 1227)
    trace = GuardTrace(
        3, fields(plain, decisions=[]), SessionGuards(GuardConfig(), started_at=0.0), 0.0, clean
    )
    trace.rank, trace.settled_at, trace.settle = 2, 1.5, {"cost": 0.001, "tokens": 12}
    raw = trace.payload()
    got = trace.payload(max_field_bytes)
    assert got == sanitize(raw, max_field_bytes) and list(got["guard_input"]) == list(raw["guard_input"])
    assert trace.payload(max_field_bytes) == got
