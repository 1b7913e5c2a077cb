"""ResponsesChains: the history a previous_response_id stands for, and the synthetic-id rewrite."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.dialects import openai_responses
from proxy.dialects.base import ToolCall, ToolResult
from proxy.responses_chain import ResponsesChains, synthetic_id_of

A = "bot"  # the agent the chains belong to


def req(body: dict[str, Any]) -> Any:
    return openai_responses.parse_request({"model": "gpt-4o", **body})


def output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "ok"}


def test_a_chain_is_judged_on_its_whole_history() -> None:
    chains = ResponsesChains()
    first = req({"input": "go"})
    assert chains.history(A, first).steps == []
    chains.remember_answer(A, first, "resp_1", [ToolCall("c1", "read", {"p": 1})])
    second = req({"previous_response_id": "resp_1", "input": [output("c1")]})
    chains.remember_answer(A, second, "resp_2", [ToolCall("c2", "read", {"p": 1})])
    third = req({"previous_response_id": "resp_2", "input": [output("c2")]})
    h = chains.history(A, third)
    assert [[c.id for c in step] for step in h.steps] == [["c1"], ["c2"]]
    assert [r.tool_call_id for r in h.results] == ["c1", "c2"]
    assert h.turn_start == 0
    # a new user message in the chain starts a new turn after everything before it
    fourth = req(
        {"previous_response_id": "resp_2", "input": [output("c2"), {"role": "user", "content": "next"}]}
    )
    assert chains.history(A, fourth).turn_start == 2


def test_rewrite_continues_the_real_parent_with_the_blocked_input() -> None:
    chains = ResponsesChains()
    blocked_body = {"model": "gpt-4o", "previous_response_id": "resp_real", "input": [output("c9")]}
    _, answer = openai_responses.render_blocked(req(blocked_body), "[tripwire] blocked: x", "loop_detection")
    sid = synthetic_id_of(answer)
    assert sid is not None and openai_responses.is_synthetic_response_id(sid)
    chains.remember_block(A, req(blocked_body), sid, blocked_body, "[tripwire] blocked: x")
    body = {"model": "gpt-4o", "previous_response_id": sid, "input": "and now?"}
    rewritten = chains.rewrite(A, body)
    assert rewritten is not None
    assert rewritten["previous_response_id"] == "resp_real"
    assert rewritten["input"] == [
        output("c9"),
        {"role": "assistant", "content": "[tripwire] blocked: x"},
        {"role": "user", "content": "and now?"},
    ]
    assert chains.rewrite(A, {"previous_response_id": "resp_real", "input": "x"}) is None
    # a synthetic id Tripwire no longer knows is dropped rather than sent upstream
    assert "previous_response_id" not in chains.rewrite(
        A, {"previous_response_id": "resp_tripwire_00", "input": "x"}
    )


def test_links_are_bounded() -> None:
    chains = ResponsesChains(max_links=2)
    for i in range(3):
        chains.remember_answer(A, req({"input": "x"}), f"resp_{i}", [])
    assert chains.get(A, "resp_0") is None and chains.get(A, "resp_2") is not None


def test_a_link_travels_between_replicas_whole() -> None:
    from proxy.responses_chain import link_blob, link_from_blob

    chains = ResponsesChains()
    first = req({"input": "go"})
    chains.remember_answer(A, first, "resp_1", [ToolCall("c1", "search", {"q": "x"})])
    blocked = req({"previous_response_id": "resp_1", "input": [output("c1")]})
    chains.remember_block(
        A,
        blocked,
        "resp_tripwire_1",
        {"previous_response_id": "resp_1", "input": [output("c1")]},
        "[tripwire] no",
    )
    other = ResponsesChains()  # another replica
    for rid in ("resp_1", "resp_tripwire_1"):
        link = chains.links[(A, rid)]
        copy = link_from_blob(link_blob(link), other.get(A, link.parent_id))
        other.remember(A, rid, copy)
    later = req({"previous_response_id": "resp_tripwire_1", "input": "ok"})
    assert other.history(A, later) == chains.history(A, later)
    body = {"model": "gpt-4o", "previous_response_id": "resp_tripwire_1", "input": "ok"}
    assert other.rewrite(A, dict(body)) == chains.rewrite(A, dict(body))


def test_missing_names_the_newest_link_not_here_and_marks_whole_chains() -> None:
    chains = ResponsesChains()
    chains.remember_answer(A, req({"input": "go"}), "resp_1", [])
    chains.remember_answer(A, req({"previous_response_id": "resp_1", "input": "more"}), "resp_2", [])
    assert chains.missing(A, "resp_2") is None and chains.links[(A, "resp_1")].complete
    assert chains.missing(A, "resp_elsewhere") == "resp_elsewhere"
    # a link whose parent another replica answered: that parent is what is missing
    chains.remember_answer(A, req({"previous_response_id": "resp_x", "input": "go on"}), "resp_3", [])
    assert chains.missing(A, "resp_3") == "resp_x"
    assert chains.missing(A, None) is None


def test_chains_are_kept_per_agent() -> None:
    """Another agent naming this agent's ids gets what an unknown id gets (issue 26)."""
    chains = ResponsesChains()
    chains.remember_answer(A, req({"input": "go"}), "resp_1", [ToolCall("c1", "read", {"p": 1})])
    blocked = {"model": "gpt-4o", "previous_response_id": "resp_1", "input": [output("c1")]}
    chains.remember_block(A, req(blocked), "resp_tripwire_1", blocked, "[tripwire] no")
    later = req({"previous_response_id": "resp_1", "input": [output("c1")]})
    unknown = req({"previous_response_id": "resp_x", "input": [output("c1")]})
    assert chains.history("other", later) == chains.history(A, unknown)
    assert chains.history("other", later).steps == [] and chains.history(A, later).steps != []
    assert chains.missing("other", "resp_1") == "resp_1" and chains.missing(A, "resp_1") is None
    body = {"model": "gpt-4o", "previous_response_id": "resp_tripwire_1", "input": "ok"}
    assert chains.rewrite("other", body) == {"model": "gpt-4o", "input": "ok"}  # dropped, as unknown


def test_a_hosted_call_in_an_answer_brings_its_own_result_to_the_chain() -> None:
    """A web search the provider ran has no output item to come: the chain holds what the answer
    said it gave, so a chained request is judged as the whole history sent over HTTP would be."""
    chains = ResponsesChains()
    item = {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"query": "x"}}
    answer = openai_responses.parse_response(200, orjson.dumps({"id": "resp_1", "output": [item]}))
    first = req({"input": "go"})
    chains.remember_answer(A, first, "resp_1", answer.tool_calls)
    chained = chains.history(A, req({"previous_response_id": "resp_1", "input": "again"}))
    whole = req({"input": [{"role": "user", "content": "go"}, item, {"role": "user", "content": "again"}]})
    assert chained.steps == whole.steps
    assert chained.results == whole.tool_results == [ToolResult("ws_1", "completed")]
