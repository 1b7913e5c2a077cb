"""Canonical signatures: the identity every loop pattern compares (SPEC §5.1)."""

from __future__ import annotations

import pytest

from proxy.guards.signatures import (
    canonical_args,
    content_text,
    normalize_tool_name,
    result_fingerprint,
    signature,
)


@pytest.mark.parametrize("value", [1.0, 0.9999999, 1.0000001, 1.0000004])
def test_float_micro_variations_share_a_signature(value: float) -> None:
    assert signature("get_price", {"price": value}) == signature("get_price", {"price": 1.0})


def test_floats_further_apart_than_6_decimals_differ() -> None:
    assert signature("f", {"x": 1.0}) != signature("f", {"x": 1.00001})


def test_rounding_is_recursive_through_objects_and_arrays() -> None:
    a = {"outer": {"inner": [0.1 + 0.2, {"deep": 2.0000000001}]}}
    b = {"outer": {"inner": [0.3, {"deep": 2.0}]}}
    assert canonical_args(a) == canonical_args(b)


def test_keys_are_sorted_at_every_level() -> None:
    assert canonical_args({"b": 1, "a": {"d": 1, "c": 2}}) == '{"a":{"c":2,"d":1},"b":1}'


def test_ints_bools_strings_null_unchanged() -> None:
    out = canonical_args({"i": 7, "big": 2**70, "t": True, "f": False, "s": "1.0000001", "n": None})
    assert out == '{"big":1180591620717411303424,"f":false,"i":7,"n":null,"s":"1.0000001","t":true}'


def test_bool_is_not_turned_into_a_number() -> None:
    assert canonical_args({"x": True}) != canonical_args({"x": 1})


def test_openai_json_string_arguments_match_mcp_objects() -> None:
    assert canonical_args('{"path": "a.txt", "limit": 10}') == canonical_args({"limit": 10, "path": "a.txt"})
    assert signature("read_file", ' {"x": 0.9999999} ') == signature("read_file", {"x": 1.0})


def test_empty_and_missing_arguments_are_the_same_call() -> None:
    assert canonical_args(None) == canonical_args("") == canonical_args("{}") == canonical_args({}) == "{}"


def test_a_string_that_is_not_json_is_compared_as_is() -> None:
    assert canonical_args("ls -la") == '"ls -la"'
    assert canonical_args("ls -la") != canonical_args("ls -l")


def test_negative_zero_matches_zero() -> None:
    assert canonical_args({"x": -0.0000001}) == canonical_args({"x": 0.0})


@pytest.mark.parametrize(
    ("name", "bare"),
    [
        ("search", "search"),
        ("docs__search", "search"),
        ("mcp__docs__search", "search"),
        ("read_file", "read_file"),
        ("__init__", "__init__"),
        ("tool__", "tool__"),
    ],
)
def test_server_prefix_is_dropped(name: str, bare: str) -> None:
    assert normalize_tool_name(name) == bare


def test_prefixed_and_bare_names_share_a_signature() -> None:
    assert signature("docs__search", '{"q": "x"}') == signature("search", {"q": "x"})


def test_paging_arguments_keep_calls_apart() -> None:
    assert signature("list", {"page": 1}) != signature("list", {"page": 2})


def test_result_fingerprint_is_stable_and_canonical() -> None:
    a = result_fingerprint([{"type": "text", "text": "pending", "score": 0.9999999}])
    b = result_fingerprint([{"score": 1.0, "text": "pending", "type": "text"}])
    assert a == b and len(a) == 24
    assert result_fingerprint("done") != result_fingerprint("pending")


@pytest.mark.parametrize(
    ("content", "text"),
    [
        ("  boom ", "boom"),
        ([{"type": "text", "text": "HTTP 503"}, {"type": "text", "text": "retry"}], "HTTP 503\nretry"),
        ({"content": [{"type": "text", "text": "x"}], "isError": True}, "x"),
        ({"code": -32603, "message": "internal"}, "internal"),
        (None, ""),
    ],
)
def test_content_text_reads_the_common_result_shapes(content: object, text: str) -> None:
    assert content_text(content) == text
