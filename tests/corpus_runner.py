"""Feeds the loop corpus (`loop_corpus.py`) through the pure session guards, as an agent would.

Two ways, as Tripwire sees traffic:
- `mcp`: each call an MCP `tools/call` (checked before it is forwarded, its result read by the real
  JSON-RPC reader after); the calls of a `Parallel` step are all sent before any answer comes back;
  a user turn is a pause longer than `turn_gap_s` (an MCP-only session has no other sign of one);
- `fc`: function-calling; after each assistant step the agent sends the whole history with the
  step's results, and the request is judged (the decision lands on that step's calls). The request
  is a real body of the session's dialect (`Session.dialect`), read by Tripwire's own parser: Chat
  Completions (the whole history), Anthropic Messages (tool results, and the user's words with
  them, in user messages) or a Responses chain (each request carries the step's outputs and the
  user's words that follow, naming the answer before; `ResponsesChains` gives the history).
A refused call stops the agent (it got a blocked answer or a refusal); a warning lets it go on.

`python tests/corpus_runner.py` prints the accuracy tables of docs/guards.md (a test checks they
are current: regenerate them after growing the corpus).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loop_corpus import SESSIONS, Call, Parallel, Pause, Reply, Session, User  # noqa: E402

from proxy.dialects import anthropic, openai_chat, openai_responses  # noqa: E402
from proxy.dialects.base import LLMRequest, ToolCall  # noqa: E402
from proxy.guards.config import GuardConfig  # noqa: E402
from proxy.guards.decision import Action, Decision  # noqa: E402
from proxy.guards.loop.history import call_tuple, results_map  # noqa: E402
from proxy.guards.loop.replies import repeated_reply  # noqa: E402
from proxy.guards.session import SessionGuards  # noqa: E402
from proxy.guards.signatures import (  # noqa: E402
    RecordedError,
    call_fingerprints,
    error_fingerprint,
    result_fingerprint,
)
from proxy.mcp.jsonrpc import tool_result  # noqa: E402
from proxy.responses_chain import ResponsesChains  # noqa: E402

AGENT_OF_CHAIN = "corpus"  # chains are kept per agent; a corpus session is one agent's

SECONDS_PER_CALL = 0.5  # agents take a moment between calls; turns of the corpus stay realistic
USER_PAUSE_S = 90.0  # a person reading and answering: longer than turn_gap_s


@dataclass
class Outcome:
    """What the guards did to one session."""

    session: Session
    transport: str
    calls: int = 0  # calls the agent made (up to the first refusal)
    fired: list[tuple[int, Decision]] = field(default_factory=list)  # (call number, decision)

    def first(self, action: Action = Action.WARN, *, loop_only: bool = True) -> int | None:
        """The call number of the first decision at least `action` (loop patterns only by default)."""
        for n, d in self.fired:
            if d.action >= action and (d.kind is not None or not loop_only):
                return n
        return None

    @property
    def touched(self) -> bool:
        """Any decision at all: a warning, a refusal, an ended session, from any guard."""
        return any(d.action > Action.ALLOW for _, d in self.fired)

    def caught_after(self, action: Action = Action.WARN) -> int | None:
        """Calls from the loop's start to the first decision, counting both (None: never caught)."""
        first = self.first(action)
        start = self.session.loop_start or 1
        return None if first is None else first - start + 1


def bound(session: Session, threshold: int) -> int:
    """SPEC §5.1: caught within max(threshold + 1, 2k) calls of the loop's start."""
    return max(threshold + 1, 2 * (session.round_len or 1))


def transports(session: Session) -> list[str]:
    return ["mcp", "fc"] if session.transport == "both" else [session.transport]


def _events(outcome: Outcome, guards: SessionGuards, event_type: str, name: str, number: int) -> None:
    """Feed AgentDbg's cycle detector as the recorder would (it fires after the event is written)."""
    event_id = f"ev{len(outcome.fired)}-{number}-{event_type}"
    d = guards.observe_event(event_type, name, event_id)
    if d is not None:
        outcome.fired.append((number, d))


def _mcp_answer(call: Call) -> dict[str, Any]:
    text = call.error if call.error is not None else call.result
    if not isinstance(text, str):
        text = orjson.dumps(text).decode()
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if call.error is not None:
        result["isError"] = True
    elif isinstance(call.result, dict):
        result["structuredContent"] = call.result
    return {"jsonrpc": "2.0", "id": 1, "result": result}


def _fc_content(call: Call) -> str:
    value = call.error if call.error is not None else call.result
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _steps(session: Session) -> Iterator[Call | Parallel | User | Pause | Reply]:
    yield from session.steps


def _as_recorded(tool: str, args: Any, recorded: bool) -> Any:
    """A call's arguments as the guards get them live, or as a replay feeds them back (the
    fingerprints the trace records: `signatures.call_fingerprints`)."""
    return call_fingerprints(tool, args) if recorded else args


def _error_as_recorded(error: str | None, recorded: bool) -> str | None:
    if error is None or not recorded:
        return error
    return RecordedError(error_fingerprint(error) or "")


def run_mcp(session: Session, config: GuardConfig, recorded: bool = False) -> Outcome:
    """`recorded`: each call fed as a replay feeds it, from the fingerprints the trace keeps."""
    guards = SessionGuards(config, started_at=0.0)
    out = Outcome(session, "mcp")
    now = 0.0
    for step in _steps(session):
        if isinstance(step, User):
            now += USER_PAUSE_S if step.seconds is None else step.seconds
            continue
        if isinstance(step, Pause):
            now += step.seconds
            continue
        if isinstance(step, Reply):  # the model's text: no MCP traffic (sessions with it are fc-only)
            continue
        batch = step.calls if isinstance(step, Parallel) else (step,)
        admitted = []
        for call in batch:  # all sent before any answer comes back
            out.calls += 1
            now += SECONDS_PER_CALL / len(batch)
            verdict = guards.before_tool_call(
                call.tool, _as_recorded(call.tool, call.args, recorded), now=now
            )
            out.fired += [(out.calls, d) for d in verdict.decisions]
            if verdict.refused:
                return out
            admitted.append((out.calls, call, verdict))
        for number, call, verdict in admitted:
            answer = tool_result(_mcp_answer(call))
            out.fired += [
                (number, d)
                for d in guards.after_tool_call(
                    verdict.reservation,
                    call.tool,
                    _as_recorded(call.tool, call.args, recorded),
                    result_fingerprint=answer.fingerprint or "",
                    error=_error_as_recorded(
                        answer.error_text if answer.status == "error" else None, recorded
                    ),
                    now=now,
                    event_id=f"tool-{number}",
                )
            ]
            _events(out, guards, "TOOL_CALL", call.tool, number)
    return out


# a step of the history so far: the user's words before it, then its calls with their ids, or the
# model's text when it answered without a call (`Reply`)
Segment = tuple[list[str], list[tuple[str, Call]], str | None]
TASK = "Here is your task."


def _content(call: Call) -> str:
    return _fc_content(call)


def chat_body(segments: list[Segment], following: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for users, row, reply in segments:
        messages += [{"role": "user", "content": text} for text in users]
        if reply is not None:
            messages.append({"role": "assistant", "content": reply})
            continue
        calls = [
            {
                "id": cid,
                "type": "function",
                "function": {"name": c.tool, "arguments": orjson.dumps(c.args).decode()},
            }
            for cid, c in row
        ]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": cid, "content": _content(c)} for cid, c in row]
    messages += [{"role": "user", "content": text} for text in following]
    return {"model": "gpt-4o", "messages": messages}


def anthropic_body(segments: list[Segment], following: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    """Claude Code's shape: the user's words go with the previous step's tool results."""
    messages: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = [{"type": "text", "text": TASK}]
    for users, row, reply in segments:
        pending += [{"type": "text", "text": text} for text in users]
        messages.append({"role": "user", "content": pending})
        if reply is not None:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": reply}]})
            pending = []
            continue
        uses = [{"type": "tool_use", "id": cid, "name": c.tool, "input": c.args} for cid, c in row]
        messages.append({"role": "assistant", "content": uses})
        pending = [
            {
                "type": "tool_result",
                "tool_use_id": cid,
                "content": _content(c),
                "is_error": c.error is not None,
            }
            for cid, c in row
        ]
    pending += [{"type": "text", "text": text} for text in following]
    messages.append({"role": "user", "content": pending})
    return {"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": messages}


def responses_input(users: list[str], row: list[tuple[str, Call]]) -> list[dict[str, Any]]:
    """A chained request's input: the outputs of the step before, then the user's words."""
    outputs = [{"type": "function_call_output", "call_id": cid, "output": _content(c)} for cid, c in row]
    return [*outputs, *({"role": "user", "content": text} for text in users)]


def responses_full_input(segments: list[Segment], following: list[str]) -> dict[str, Any]:
    """A stateless Responses request (Codex with `store: false`): the whole conversation as input."""
    items: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for users, row, reply in segments:
        items += [{"role": "user", "content": text} for text in users]
        if reply is not None:
            items.append(
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": reply}]}
            )
            continue
        for cid, c in row:
            items.append(
                {
                    "type": "function_call",
                    "call_id": cid,
                    "name": c.tool,
                    "arguments": orjson.dumps(c.args).decode(),
                }
            )
        items += responses_input([], row)
    items += [{"role": "user", "content": text} for text in following]
    return {"model": "gpt-5", "input": items, "store": False}


def _segments(session: Session) -> Iterator[tuple[list[str], Call | Parallel | Reply, float]]:
    """(the user's words before a step, the step, seconds paused before it)."""
    users: list[str] = []
    paused = 0.0
    for step in _steps(session):
        if isinstance(step, User):
            users.append(step.text)
            paused += USER_PAUSE_S if step.seconds is None else step.seconds
        elif isinstance(step, Pause):
            paused += step.seconds
        else:
            yield users, step, paused
            users, paused = [], 0.0


def _history_as_recorded(steps: Any, results: Any, recorded: bool) -> tuple[Any, Any]:
    """A request's history as the guards get it live, or as the trace records it for replay."""
    if not recorded:
        return steps, results
    steps = [
        [(cid, name, call_fingerprints(name, args)) for cid, name, args in map(call_tuple, step)]
        for step in steps
    ]
    results = {cid: (fp, _error_as_recorded(err, True)) for cid, (fp, err) in results_map(results).items()}
    return steps, results


def run_fc(session: Session, config: GuardConfig, recorded: bool = False) -> Outcome:
    """`recorded`: each request's history fed as a replay feeds it (fingerprints, recorded errors)."""
    guards = SessionGuards(config, started_at=0.0)
    out = Outcome(session, "fc")
    segments: list[Segment] = []
    marks: dict[str, tuple[str, str | None]] = {}  # chat and Responses: errors as the agent knows them
    chains = ResponsesChains()
    now = 0.0
    _events(out, guards, "LLM_CALL", "gpt-4o", 0)  # the request that asked for the first step
    plan = list(_segments(session))
    if session.dialect == "responses":  # the first request: the task and the user's first words
        first = openai_responses.parse_request(
            {"input": responses_input([TASK, *plan[0][0]], [])} if plan else {}
        )
        chains.remember_answer(AGENT_OF_CHAIN, first, "resp_0", [])
    for k, (users, step, paused) in enumerate(plan):
        now += paused
        for _ in users:
            _events(out, guards, "LLM_CALL", "gpt-4o", out.calls)
        if isinstance(step, Reply):
            out.calls += 1
            segments.append((users, [], step.text))
            now += SECONDS_PER_CALL
            steps, turn_start, results, messages = _request(session, segments, plan, k, chains, marks)
            steps, results = _history_as_recorded(steps, results, recorded)
            verdict = guards.before_llm_call(
                steps, turn_start, results, estimate_usd=0.0, now=now, **_replies(session, messages)
            )
            out.fired += [(out.calls, d) for d in verdict.decisions]
            if verdict.refused:
                return out
            guards.after_llm_call(verdict.reservation, cost_usd=0.0, tokens=0, now=now)
            _events(out, guards, "LLM_CALL", "gpt-4o", out.calls)
            continue
        batch = step.calls if isinstance(step, Parallel) else (step,)
        row = []
        for call in batch:
            out.calls += 1
            call_id = f"call_{out.calls}"
            row.append((call_id, call))
            content = _fc_content(call)
            marks[call_id] = (result_fingerprint(content), content if call.error is not None else None)
            _events(out, guards, "TOOL_CALL", call.tool, out.calls)
        segments.append((users, row, None))
        now += SECONDS_PER_CALL * len(batch)
        steps, turn_start, results, messages = _request(session, segments, plan, k, chains, marks)
        steps, results = _history_as_recorded(steps, results, recorded)
        verdict = guards.before_llm_call(
            steps, turn_start, results, estimate_usd=0.0, now=now, **_replies(session, messages)
        )
        out.fired += [(out.calls, d) for d in verdict.decisions]
        if verdict.refused:
            return out
        guards.after_llm_call(verdict.reservation, cost_usd=0.0, tokens=0, now=now)
        _events(out, guards, "LLM_CALL", "gpt-4o", out.calls)
    return out


def _replies(session: Session, request: LLMRequest) -> dict[str, Any]:
    """What the guards are told of the model's own texts: the run of one reply to one nudge the
    request's messages end with, read as the guard backend reads it (proxy/guard_backend/local.py)."""
    return {"echo": repeated_reply(request.dialect, request.messages)}


def _answer(step: Call | Parallel | Reply, first: int) -> list[ToolCall]:
    """The model's answer that asked for `step`, its calls numbered from `first` as the runner does."""
    if isinstance(step, Reply):
        return []
    calls = step.calls if isinstance(step, Parallel) else (step,)
    return [ToolCall(f"call_{first + i}", c.tool, c.args) for i, c in enumerate(calls)]


def _request(
    session: Session,
    segments: list[Segment],
    plan: list[tuple[list[str], Call | Parallel | Reply, float]],
    k: int,
    chains: ResponsesChains,
    marks: dict[str, tuple[str, str | None]],
) -> tuple[Any, int, Any, LLMRequest]:
    """The guards' inputs of the request sent after step k, read from its body by the dialect, and
    the request. After a `Reply`, the request carries the user's words that follow it (the nudge)."""
    following = plan[k + 1][0] if k + 1 < len(plan) and segments[-1][2] is not None else []
    if session.dialect == "anthropic":
        req: LLMRequest = anthropic.parse_request(anthropic_body(segments, following))
        return req.steps, req.turn_start, req.tool_results, req
    if session.dialect == "responses" and any(isinstance(s, Reply) for s in session.steps):
        req = openai_responses.parse_request(responses_full_input(segments, following))
        return req.steps, req.turn_start, req.tool_results, req
    if session.dialect == "responses":
        # the step's outputs and the user's words before the next step go in one request, which
        # continues the answer that asked for the step (its calls were remembered with it)
        row = segments[-1][1]
        following = plan[k + 1][0] if k + 1 < len(plan) else []
        body = {"input": responses_input(following, row), "previous_response_id": f"resp_{k}"}
        call = openai_responses.parse_request(body)
        history = chains.history(AGENT_OF_CHAIN, call)
        if k + 1 < len(plan):
            first = sum(len(r) for _, r, _ in segments) + 1
            chains.remember_answer(AGENT_OF_CHAIN, call, f"resp_{k + 1}", _answer(plan[k + 1][1], first))
        return (
            history.steps,
            history.turn_start,
            {r.tool_call_id: marks[r.tool_call_id] for r in history.results},
            call,
        )
    req = openai_chat.parse_request(chat_body(segments, following))
    return req.steps, req.turn_start, {cid: marks[cid] for _, row, _ in segments for cid, _ in row}, req


RUNNERS = {"mcp": run_mcp, "fc": run_fc}


def run(
    session: Session, transport: str, loop_detection: dict[str, Any] | None = None, *, recorded: bool = False
) -> Outcome:
    config = GuardConfig.model_validate({"loop_detection": loop_detection or {}})
    return RUNNERS[transport](session, config, recorded)


# -- the accuracy table of docs/guards.md ----------------------------------------------------------

RULES: dict[str, dict[str, Any]] = {
    "default (progress)": {},
    "`per_tool_mode: count`": {"per_tool_mode": "count"},
    "`agentdbg_cycle: true`": {"agentdbg_cycle": True},
}


def _cell(outcome: Outcome) -> str:
    if not outcome.session.stuck:
        touched = [(n, d) for n, d in outcome.fired if d.action > Action.ALLOW]
        if not touched:
            return "untouched"
        n, d = touched[0]
        verb = {Action.WARN: "warned", Action.BLOCK: "blocked", Action.TERMINATE: "ended"}[d.action]
        return f"**{verb} at {n}**"
    after = outcome.caught_after()
    if after is None:
        return "**missed**"
    if after < 1:
        return f"**fired before the loop** (call {outcome.first()})"
    return f"call {after}"


def table() -> str:
    """One row per session: where each rule first fires (stuck: calls from the loop's start)."""
    head = "| session | shape | stuck | bound | " + " | ".join(RULES) + " |"
    lines = [head, "|" + "---|" * (4 + len(RULES))]
    for session in SESSIONS:
        cells = []
        for overrides in RULES.values():
            per = [_cell(run(session, t, overrides)) for t in transports(session)]
            cells.append(" / ".join(dict.fromkeys(per)))
        b = str(bound(session, 5)) if session.stuck else ""
        stuck = "stuck" if session.stuck else "honest"
        lines.append(f"| `{session.name}` | {session.shape} | {stuck} | {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary() -> str:
    """Per rule: honest sessions left alone, stuck sessions caught within the bound (and at all)."""
    lines = [
        "| rule | honest sessions untouched | stuck caught within the bound | stuck caught at all |",
        "|---|---|---|---|",
    ]
    honest = [(s, t) for s in SESSIONS if not s.stuck for t in transports(s)]
    stuck = [(s, t) for s in SESSIONS if s.stuck for t in transports(s)]
    for rule, overrides in RULES.items():
        untouched = sum(not run(s, t, overrides).touched for s, t in honest)
        afters = [(s, run(s, t, overrides).caught_after()) for s, t in stuck]
        within = sum(a is not None and 1 <= a <= bound(s, 5) for s, a in afters)
        caught = sum(a is not None for _, a in afters)
        n, m = len(honest), len(stuck)
        lines.append(f"| {rule} | {untouched} / {n} | {within} / {m} | {caught} / {m} |")
    return "\n".join(lines)


def report() -> str:
    """The block of docs/guards.md between its corpus markers (a test keeps it current)."""
    return summary() + "\n\n" + table()


if __name__ == "__main__":
    print(report())
