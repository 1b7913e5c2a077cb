"""Entries of a run's shared guard log: what a replica tells the others, compactly (orjson), and
the typed codec that reads them back (`decode` -> one of the entry models below).

Version 1 (`"v": 1`; an entry without `v`, written before the field existed, is version 1 too):
the wire keys are short because every replica appends and reads every entry of a run; the models
name them (`Field(alias=...)`), so the short keys live in this module only. A later version adds a
model or a field with a default, and bumps `VERSION`; an entry of a kind this Tripwire does not know
decodes as `UnknownEntry` and is skipped (as replay skips events it does not know).

A check carries the call's guard inputs as the trace keeps them for replay (proxy/guard_trace.py):
fingerprints of arguments and results, never their content. A settle names the check it settles
by its sequence number. Pure: no I/O.

    {"v": VERSION,
            "k": "tool", "c", "tool", "server", "sig", "id", "est"}     MCP tools/call, before forwarding
    {"v": VERSION,
            "k": "llm", "c", "steps", "turn", "res", "est", "tok"}      LLM request, before forwarding
    {"k": "set", "ref", "cost", "tokens"} | {"k": "set", "ref", "res", "err"}   its answer
    {"k": "rel", "ref"}                                           never reached the upstream

`c` names the check (unique); a settle's `ref` is that name, so a check appended later than the
replica applied it (during an outage, fail_open) is still found.
    {"v": VERSION, "k": "ev", "type", "name", "id"}                             an event written to the trace
    {"k": "kill", "reason"}                                       the kill switch
    {"v": VERSION, "k": "raise", "vals": {key: value}}           limits raised (proxy/guards/raises.py)
    {"v": VERSION, "k": "resume"}                                  the session resumed in this run
    {"v": VERSION, "k": "appr", "until": call_seq}               a person approved a held loop call
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from proxy import ids
from proxy.guards.loop.history import HistoryCall, HistoryResults, call_tuple, results_map
from proxy.guards.loop.replies import Echo
from proxy.guards.signatures import call_fingerprints, error_fingerprint

VERSION = 1  # of the entries written (see the module's docstring)


def check_id() -> str:
    return ids.hex32()


def tool_check(cid: str, tool: str, args: Any, server: str | None, estimate_usd: float) -> bytes:
    fp = call_fingerprints(tool, args)
    return orjson.dumps(
        {
            "v": VERSION,
            "k": "tool",
            "c": cid,
            "tool": tool,
            "server": server,
            "sig": fp.sig,
            "id": fp.ident,
            "est": estimate_usd,
        }
    )


def llm_check(
    cid: str,
    steps: Sequence[Sequence[HistoryCall]],
    turn_start: int,
    results: HistoryResults,
    estimate_usd: float,
    estimate_tokens: int,
    echo: Echo | None = None,
) -> bytes:
    """The request's whole tool-call history (each call `[tool_call_id, tool, sig, ident]`) and the
    fingerprints of the results it carries: the same inputs the live guards get, hashed; `echo`,
    the same reply to the same nudge at the conversation's end (`proxy.guards.loop.replies`)."""
    rows = []
    for step in steps:
        row = []
        for c in step:
            call_id, name, args = call_tuple(c)
            fp = call_fingerprints(name, args)
            row.append([call_id, name, fp.sig, fp.ident])
        rows.append(row)
    got = {call_id: [fp, error_fingerprint(err)] for call_id, (fp, err) in results_map(results).items()}
    return orjson.dumps(
        {
            "v": VERSION,
            "k": "llm",
            "c": cid,
            "steps": rows,
            "turn": turn_start,
            "res": got,
            "est": estimate_usd,
            "tok": estimate_tokens,
            **({"echo": echo.record()} if echo is not None else {}),
        }
    )


def settle_llm(ref: str, cost_usd: float, tokens: int) -> bytes:
    return orjson.dumps({"v": VERSION, "k": "set", "ref": ref, "cost": cost_usd, "tokens": tokens})


def settle_tool(ref: str, result_fingerprint: str, error: str | None) -> bytes:
    return orjson.dumps(
        {"v": VERSION, "k": "set", "ref": ref, "res": result_fingerprint, "err": error_fingerprint(error)}
    )


def release(ref: str) -> bytes:
    return orjson.dumps({"v": VERSION, "k": "rel", "ref": ref})


def event(event_type: str, name: str, event_id: str) -> bytes:
    return orjson.dumps({"v": VERSION, "k": "ev", "type": event_type, "name": name, "id": event_id})


def kill(reason: str) -> bytes:
    return orjson.dumps({"v": VERSION, "k": "kill", "reason": reason})


def raise_limits(values: dict[str, float]) -> bytes:
    return orjson.dumps({"v": VERSION, "k": "raise", "vals": values})


def approve_loop(until: int) -> bytes:
    return orjson.dumps({"v": VERSION, "k": "appr", "until": until})


def resume() -> bytes:
    return orjson.dumps({"v": VERSION, "k": "resume"})


class _Entry(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    version: int = Field(1, alias="v")


class ToolCheck(_Entry):
    """An MCP tools/call, before forwarding: the tool and its arguments' fingerprints."""

    kind: Literal["tool"] = Field("tool", alias="k")
    check: str | None = Field(None, alias="c")  # the check's name (a settle's `ref`)
    tool: str
    server: str | None = None
    sig: str  # proxy.guards.signatures.call_fingerprints
    ident: str = Field(alias="id")
    estimate_usd: float = Field(0.0, alias="est")


class LlmCheck(_Entry):
    """An LLM request, before forwarding: its tool-call history and the results it carries, hashed."""

    kind: Literal["llm"] = Field("llm", alias="k")
    check: str | None = Field(None, alias="c")
    # each step's calls: (tool_call_id, tool, sig, ident)
    steps: list[list[tuple[str, str, str, str]]]
    turn_start: int = Field(0, alias="turn")
    # tool_call_id -> (result fingerprint, error fingerprint or None)
    results: dict[str, tuple[str, str | None]] = Field(default_factory=dict, alias="res")
    estimate_usd: float = Field(0.0, alias="est")
    estimate_tokens: int = Field(0, alias="tok")
    echo: list[Any] | None = None  # proxy.guards.loop.replies.Echo.record()


class Settle(_Entry):
    """A check's answer: an LLM call's cost and tokens, or a tool call's result fingerprints."""

    kind: Literal["set"] = Field("set", alias="k")
    ref: str  # the check settled
    cost_usd: float = Field(0.0, alias="cost")
    tokens: int = 0
    result: str = Field("", alias="res")
    error: str | None = Field(None, alias="err")


class Release(_Entry):
    """A check whose call never reached the upstream: its reservation goes back."""

    kind: Literal["rel"] = Field("rel", alias="k")
    ref: str


class EventEntry(_Entry):
    """An event written to the run's trace (max_events, AgentDbg's cycle)."""

    kind: Literal["ev"] = Field("ev", alias="k")
    event_type: str = Field(alias="type")
    name: str
    event_id: str = Field(alias="id")


class Kill(_Entry):
    """The kill switch."""

    kind: Literal["kill"] = Field("kill", alias="k")
    reason: str


class RaiseLimits(_Entry):
    """Budgets or limits raised for the rest of the session (validated before it was appended)."""

    kind: Literal["raise"] = Field("raise", alias="k")
    values: dict[str, float] = Field(alias="vals")


class Resume(_Entry):
    """A resumed session's new run: its log is the old run's, then this entry, which lifts what
    ended it (the kill switch, a guard's TERMINATE); spend and counts go on."""

    kind: Literal["resume"] = Field("resume", alias="k")


class ApproveLoop(_Entry):
    """A person approved a held loop call: loop asks go through up to call_seq `until`."""

    kind: Literal["appr"] = Field("appr", alias="k")
    until: int


class UnknownEntry(_Entry):
    """An entry of a kind this Tripwire does not know (a newer one wrote it): skipped."""

    kind: str = Field("", alias="k")


Known = ToolCheck | LlmCheck | Settle | Release | EventEntry | Kill | RaiseLimits | Resume | ApproveLoop
Entry = Known | UnknownEntry
_KNOWN: TypeAdapter[Known] = TypeAdapter(Annotated[Known, Field(discriminator="kind")])
_KINDS = frozenset({"tool", "llm", "set", "rel", "ev", "kill", "raise", "resume", "appr"})


def decode(body: bytes) -> Entry:
    """The entry a log body holds; ValueError when it is not one (not JSON, or a known kind with
    fields missing or of the wrong type)."""
    value = orjson.loads(body)
    if not isinstance(value, dict):
        raise ValueError("a guard log entry must be a JSON object")
    if value.get("k") not in _KINDS:
        return UnknownEntry(kind=str(value.get("k")))
    try:
        return _KNOWN.validate_python(value)
    except ValidationError as e:
        raise ValueError(f"a malformed guard log entry: {e}") from e
