"""Entries of a run's shared guard log: what a replica tells the others, compactly (orjson).

A check carries the call's guard inputs as the trace keeps them for replay (proxy/guard_trace.py):
fingerprints of arguments and results, never their content. A settle names the check it settles
by its sequence number. Pure: no I/O.

    {"k": "tool", "c", "tool", "server", "sig", "id", "est"}     MCP tools/call, before forwarding
    {"k": "llm", "c", "steps", "turn", "res", "est", "tok"}      LLM request, before forwarding
    {"k": "set", "ref", "cost", "tokens"} | {"k": "set", "ref", "res", "err"}   its answer
    {"k": "rel", "ref"}                                           never reached the upstream

`c` names the check (unique); a settle's `ref` is that name, so a check appended later than the
replica applied it (during an outage, fail_open) is still found.
    {"k": "ev", "type", "name", "id"}                             an event written to the trace
    {"k": "kill", "reason"}                                       the kill switch
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import orjson

from proxy.guards.loop.history import HistoryCall, HistoryResults, call_tuple, results_map
from proxy.guards.signatures import call_fingerprints, error_fingerprint


def check_id() -> str:
    return uuid.uuid4().hex


def tool_check(cid: str, tool: str, args: Any, server: str | None, estimate_usd: float) -> bytes:
    fp = call_fingerprints(tool, args)
    return orjson.dumps(
        {
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
) -> bytes:
    """The request's whole tool-call history (each call `[tool_call_id, tool, sig, ident]`) and the
    fingerprints of the results it carries: the same inputs the live guards get, hashed."""
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
            "k": "llm",
            "c": cid,
            "steps": rows,
            "turn": turn_start,
            "res": got,
            "est": estimate_usd,
            "tok": estimate_tokens,
        }
    )


def settle_llm(ref: str, cost_usd: float, tokens: int) -> bytes:
    return orjson.dumps({"k": "set", "ref": ref, "cost": cost_usd, "tokens": tokens})


def settle_tool(ref: str, result_fingerprint: str, error: str | None) -> bytes:
    return orjson.dumps({"k": "set", "ref": ref, "res": result_fingerprint, "err": error_fingerprint(error)})


def release(ref: str) -> bytes:
    return orjson.dumps({"k": "rel", "ref": ref})


def event(event_type: str, name: str, event_id: str) -> bytes:
    return orjson.dumps({"k": "ev", "type": event_type, "name": name, "id": event_id})


def kill(reason: str) -> bytes:
    return orjson.dumps({"k": "kill", "reason": reason})


def decode(body: bytes) -> dict[str, Any]:
    value = orjson.loads(body)
    if not isinstance(value, dict):
        raise ValueError("a guard log entry must be a JSON object")
    return value
