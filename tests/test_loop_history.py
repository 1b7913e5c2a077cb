"""The history reader alone (proxy/guards/loop/history.py): what a request's history brings since
the last one, without judging any of it."""

from __future__ import annotations

from typing import Any

from proxy.dialects.base import ToolCall, ToolResult
from proxy.guards.loop.history import HistoryReader, results_from_index, results_map
from proxy.guards.signatures import call_keys, result_fingerprint


def history(n: int) -> list[list[Any]]:
    """n assistant steps of one call each (the dialects' ToolCall), ids c0..c<n-1>."""
    return [[ToolCall(f"c{i}", "read_file", {"p": i})] for i in range(n)]


def ids(reading_steps: list[list[Any]]) -> list[list[str]]:
    return [[c.call_id for c in step] for step in reading_steps]


def test_each_call_is_new_once_however_often_the_history_comes_again() -> None:
    r = HistoryReader()
    first = r.read(history(2), 0, judged=True)
    assert ids(first.turn_steps) == [["c0"], ["c1"]] and (first.new_calls, first.new_history_calls) == (2, 2)
    again = r.read(history(3), 0, judged=True)
    assert ids(again.turn_steps) == [[], [], ["c2"]] and again.new_calls == 1 and not again.continued
    assert again.inside and again.earlier_ids == []


def test_a_history_read_on_from_the_last_reads_only_its_new_steps() -> None:
    r = HistoryReader()
    token1, token2 = object(), object()
    r.read(history(2), 0, judged=True, reading=token1)
    on = r.read(history(4), 0, judged=True, reading=token2, read_from=token1)
    assert on.continued and ids(on.turn_steps) == [["c2"], ["c3"]] and on.new_calls == 2
    # another turn start, or a history not from the last one: read whole
    assert not r.read(history(5), 1, judged=True, read_from=token2).continued


def test_a_call_already_counted_as_mcp_is_claimed_not_counted_again() -> None:
    r = HistoryReader()
    call = ToolCall("c0", "search", {"q": "x"})
    r.mcp_call(call_keys(call.name, call.arguments)[0])
    got = r.read([[call]], 0, judged=True)
    (seen,) = got.turn_steps[0]
    assert seen.claimed and got.new_calls == 1 and got.new_history_calls == 0


def test_calls_before_the_turn_are_not_judged_and_count_once_the_history_was_seen() -> None:
    r = HistoryReader()
    got = r.read(history(3), 2, judged=True)  # joined mid-session: two earlier steps
    assert ids(got.turn_steps) == [["c2"]] and got.earlier_ids == ["c0", "c1"]
    assert got.new_history_calls == 1  # the earlier turn's calls happened before Tripwire joined
    later = r.read(
        [*history(3), [ToolCall("x", "t", {})], *history(5)[3:]], 6, judged=True
    )  # a user message last
    assert (
        later.new_history_calls == 3
    )  # x, c3, c4: after it joined, before this turn: tool calls all the same
    assert later.turn_steps == [] and not later.inside


def test_without_judging_only_the_counts_are_read() -> None:
    r = HistoryReader()
    got = r.read(history(2), 1, judged=False)
    assert not got.inside and got.earlier_ids == [] and got.new_history_calls == 1
    empty = r.read([], 0, judged=True)
    assert (empty.new_calls, empty.inside, empty.turn_steps) == (0, False, [])


def test_results_are_fingerprinted_when_asked_for_the_last_of_an_id_winning() -> None:
    results = [ToolResult("c0", "old"), ToolResult("c0", "new"), ToolResult("c1", "boom", is_error=True)]
    by_id = results_map(results)
    assert by_id["c0"] == (result_fingerprint("new"), None) and by_id["c1"][1] == "boom"
    assert set(results_from_index({"c1": results[2]})) == {"c1"}
    assert results_map({"c9": ("fp", None)})["c9"] == ("fp", None)  # a map is used as it is
