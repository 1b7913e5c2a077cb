"""Responses API chains: the history a `previous_response_id` stands for, and Tripwire's own ids.

A Responses request that continues a chain carries only its new input; the tool calls the chain
made live upstream. The loop guards judge a request's whole history, so every answered response
is remembered as a `Link` (the request's own steps and results plus the answer's step) and a
request naming a known parent is judged on the chain's history.

A blocked answer (SPEC §5.5) gets a synthetic id (`resp_tripwire_*`) the upstream never saw. A
later request naming it is rewritten to continue the real parent: the blocked request's input
(which the upstream never got either: it may hold tool outputs the parent waits for) and the
synthetic answer's text go in as input before the request's own. Pure, bounded, no I/O.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.dialects import openai_responses
from proxy.dialects.base import LLMRequest, ToolCall, ToolResult

MAX_LINKS = 20_000  # responses remembered (LRU); an older parent is judged on the request alone
_SYNTHETIC_ID = re.compile(rb"resp_tripwire_[0-9a-f]+")


@dataclass
class Link:
    """One response of a chain: its request's steps and results, then the answer's step."""

    parent: Link | None
    steps: list[list[ToolCall]]
    results: list[ToolResult]
    turn_start: int | None  # index into `steps` where a user message started a turn; None: inherited
    turn_said: str | None = None  # what began the turn in force after it (`dialects.base.said`)
    # synthetic (blocked) answers only: what the upstream must get instead of this id
    real_parent: str | None = None
    input_items: list[Any] = field(default_factory=list)
    text: str | None = None
    parent_id: str | None = None  # the request's previous_response_id (shared chains: proxy/guard_backend/)
    complete: bool = False  # every ancestor is linked here (`ResponsesChains.missing` walks no further)


def link_blob(link: Link) -> bytes:
    """A link as replicas share it (the parent by id; the chain's other links are shared alike)."""
    return orjson.dumps(
        {
            "parent_id": link.parent_id,
            "steps": [[[c.id, c.name, c.arguments] for c in step] for step in link.steps],
            "results": [[r.tool_call_id, r.content, r.is_error] for r in link.results],
            "turn_start": link.turn_start,
            "turn_said": link.turn_said,
            "real_parent": link.real_parent,
            "input_items": link.input_items,
            "text": link.text,
        }
    )


def link_from_blob(blob: bytes, parent: Link | None) -> Link:
    data = orjson.loads(blob)
    return Link(
        parent=parent,
        steps=[[ToolCall(i, n, a) for i, n, a in step] for step in data["steps"]],
        results=[ToolResult(i, c, bool(e)) for i, c, e in data["results"]],
        turn_start=data["turn_start"],
        turn_said=data.get("turn_said"),
        real_parent=data["real_parent"],
        input_items=list(data["input_items"]),
        text=data["text"],
        parent_id=data["parent_id"],
    )


@dataclass(frozen=True)
class History:
    steps: list[list[ToolCall]]
    turn_start: int
    results: list[ToolResult]


def has_user_message(call: LLMRequest) -> bool:
    return any(
        isinstance(m, dict) and m.get("role") == "user" and (m.get("type") or "message") == "message"
        for m in call.messages
    )


def opens_turn(call: LLMRequest, parent: Link | None) -> bool:
    """Whether a request continuing `parent` begins a turn: it has a user message, and not only one
    that repeats the words that began the chain's turn (a harness's "Continue.": SPEC §5.1)."""
    if not has_user_message(call):
        return False
    in_force = parent.turn_said if parent is not None else None
    return not (call.turns_opened == 1 and call.turn_said == in_force)


def turn_link(call: LLMRequest, parent: Link | None) -> dict[str, Any]:
    """The `turn_start` and `turn_said` of the link a request makes on `parent`."""
    if opens_turn(call, parent):
        return {"turn_start": call.turn_start, "turn_said": call.turn_said}
    return {"turn_start": None, "turn_said": parent.turn_said if parent is not None else None}


def input_items(body: dict[str, Any]) -> list[Any]:
    raw = body.get("input")
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    return list(raw) if isinstance(raw, list) else []


def synthetic_id_of(answer_body: bytes) -> str | None:
    """The `resp_tripwire_*` id in a rendered blocked answer (JSON or SSE); the first is the response's."""
    m = _SYNTHETIC_ID.search(answer_body)
    return m.group(0).decode() if m else None


class ResponsesChains:
    """The chains per agent (as shared state keys them): an agent naming another's response id gets
    what an unknown id gets, never that agent's history, blocked input or real parent."""

    def __init__(self, max_links: int = MAX_LINKS) -> None:
        self.links: OrderedDict[tuple[str, str], Link] = OrderedDict()  # (agent, response id)
        self.max_links = max_links

    def get(self, agent: str, response_id: str | None) -> Link | None:
        if response_id is None:
            return None
        key = (agent, response_id)
        link = self.links.get(key)
        if link is not None:
            self.links.move_to_end(key)
        return link

    def missing(self, agent: str, response_id: str | None) -> str | None:
        """The newest link of the chain ending at `response_id` that is not known here (another
        replica answered it), or None when the whole chain is here. Links found complete are marked,
        so a long chain is walked once."""
        walked: list[Link] = []
        rid = response_id
        found: str | None = None
        while rid is not None:
            link = self.links.get((agent, rid))
            if link is None:
                found = rid
                break
            if link.complete:
                break
            walked.append(link)
            if link.parent is None and link.parent_id is not None:
                link.parent = self.links.get((agent, link.parent_id))  # it may have arrived since
            rid = link.parent_id
        if found is None:
            for link in walked:
                link.complete = True
        return found

    def remember(self, agent: str, response_id: str, link: Link) -> None:
        key = (agent, response_id)
        self.links[key] = link
        self.links.move_to_end(key)
        while len(self.links) > self.max_links:
            self.links.popitem(last=False)

    def history(self, agent: str, call: LLMRequest) -> History:
        """The request's history with its chain in front (as if the whole input had been sent)."""
        chain: list[Link] = []
        parent = link = self.get(agent, call.previous_response_id)
        while link is not None:
            chain.append(link)
            link = link.parent
        steps: list[list[ToolCall]] = []
        results: list[ToolResult] = []
        turn_start = 0
        for link in reversed(chain):
            if link.turn_start is not None:
                turn_start = len(steps) + link.turn_start
            steps.extend(link.steps)
            results.extend(link.results)
        if not chain or opens_turn(call, parent):
            turn_start = len(steps) + call.turn_start
        return History([*steps, *call.steps], turn_start, [*results, *call.tool_results])

    def remember_answer(
        self, agent: str, call: LLMRequest, response_id: str, tool_calls: list[ToolCall]
    ) -> None:
        """A real response: the chain now goes on from it (with what its hosted calls gave)."""
        link = self._link(agent, call, [list(tool_calls)])
        link.results += [tc.result for tc in tool_calls if tc.hosted and tc.result is not None]
        self.remember(agent, response_id, link)

    def remember_block(
        self, agent: str, call: LLMRequest, synthetic_id: str, sent_body: dict[str, Any], text: str
    ) -> None:
        """A blocked answer: where a request continuing it must really go, and what to send along."""
        link = self._link(agent, call, [[]])
        previous = sent_body.get("previous_response_id")
        link.real_parent = previous if isinstance(previous, str) else None
        link.input_items = input_items(sent_body)
        link.text = text
        self.remember(agent, synthetic_id, link)

    def _link(self, agent: str, call: LLMRequest, answer_steps: list[list[ToolCall]]) -> Link:
        parent = self.get(agent, call.previous_response_id)
        return Link(
            parent=parent,
            steps=[*call.steps, *answer_steps],
            results=list(call.tool_results),
            parent_id=call.previous_response_id,
            **turn_link(call, parent),
        )

    def rewrite(self, agent: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The body to send upstream when it names a synthetic parent; None when it does not."""
        previous = body.get("previous_response_id")
        if not openai_responses.is_synthetic_response_id(previous):
            return None
        link = self.get(agent, previous)
        if link is None or link.text is None:  # forgotten (restart, LRU): drop the unknown id
            rewritten = {**body}
            rewritten.pop("previous_response_id", None)
            return rewritten
        rewritten = openai_responses.rewrite_previous_response(body, link.real_parent, link.text)
        rewritten["input"] = [*link.input_items, *rewritten["input"]]
        return rewritten
