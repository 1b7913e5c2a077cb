"""The guards' one walk over JSON-like values (proxy/guards/tree.py): a copy with every scalar
mapped, members dropped by `keep`, strings expanded in place by `expand`, and no recursion limit."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.guards.tree import NOT_EXPANDED, rebuild

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=4)
    ),
    max_leaves=30,
)


def same(v: Any) -> Any:
    return v


@given(json_values)
def test_the_identity_leaf_copies_a_json_value(value: Any) -> None:
    copy = rebuild(value, same)
    assert copy == value
    assert json.dumps(copy) == json.dumps(value)  # key order kept too


def test_every_scalar_goes_through_leaf_and_tuples_become_lists() -> None:
    value = {"a": [1, (2, "x")], "b": {"c": None}}
    assert rebuild(value, lambda v: f"<{v}>") == {"a": ["<1>", ["<2>", "<x>"]], "b": {"c": "<None>"}}


def test_the_input_is_not_changed() -> None:
    value = {"a": [1, {"b": 2}]}
    copy = rebuild(value, lambda v: v * 10)
    assert value == {"a": [1, {"b": 2}]} and copy == {"a": [10, {"b": 20}]}


def test_keys_become_str_and_of_two_keys_with_one_str_the_last_wins() -> None:
    assert rebuild({1: "first", "1": "second", 2: "x"}, same) == {"1": "second", "2": "x"}
    assert list(rebuild({"z": 1, "a": 2, "m": 3}, same)) == ["z", "a", "m"]


def test_keep_drops_members_at_any_depth() -> None:
    value = {"id": 1, "args": {"id": 2, "q": "x"}, "items": [{"id": 3, "n": 4}]}
    kept = rebuild(value, same, keep=lambda key, _child: key != "id")
    assert kept == {"args": {"q": "x"}, "items": [{"n": 4}]}


def test_expand_walks_json_sent_as_text_in_the_strings_place() -> None:
    def expand(text: str) -> Any:
        return json.loads(text) if text.startswith("{") else NOT_EXPANDED

    value = {"arguments": '{"path": "a", "n": 1}', "note": "plain"}
    assert rebuild(value, lambda v: v * 2, expand=expand) == {
        "arguments": {"path": "aa", "n": 2},
        "note": "plainplain",
    }


def test_a_value_nested_ten_thousand_levels_is_walked_without_recursion() -> None:
    deep: Any = "leaf"
    for _ in range(10_000):
        deep = {"k": [deep]}
    copy = rebuild(deep, str.upper)
    for _ in range(10_000):
        copy = copy["k"][0]
    assert copy == "LEAF"
