"""What the trace keeps of each guarded call, so `tripwire replay` decides as the live guards did.

The session guards are pure and deterministic: fed the same inputs in the same order, they take the
same decisions. So each call's event (LLM_CALL, TOOL_CALL, or the ERROR of a refused call) carries
(SPEC §5.7), in its payload:

- `call_seq`: the call's arrival number in the run, from 1 (replay's `call_index`);
- `args_fingerprint` / `result_fingerprint`: hashes of the full arguments and result (MCP), from
  before any truncation or redaction, so a `--no-record-content` run replays the same;
- `guard_input`: what the guards were given and when, compactly:
  `t` (seconds since the session started, on the clock the guards read), `ev` (events the guards
  had observed), `done` (answers settled before it), `cfg` (config revision; the config itself the
  first time a revision is used), the call's inputs (MCP: tool, identity fingerprints, reservation
  estimate; LLM: the history's change since the previous request, estimates), the decisions the live
  guards took, and, once answered, `rank` (its place among settled answers) with what the answer
  brought (`t_end`, result and error fingerprints, or cost and tokens).

The history of an LLM request is recorded as a delta: `keep` steps of the previous request's history
(compared by tool_call_ids) plus the steps `add`ed, each call `[tool_call_id, tool, sig, ident]`, and
the results of the added calls. Agents resend their whole history; the trace grows with what is new.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, MutableSet, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.config_dumps import ConfigDumps
from proxy.guards.decision import Action, Decision
from proxy.guards.loop.history import HistoryCall, HistoryResults, call_tuple, results_map
from proxy.guards.session import SessionGuards
from proxy.guards.signatures import call_fingerprints, error_fingerprint
from proxy.redact import PLAIN, sanitize, sanitize_text

T_DIGITS = 6


def decision_list(decisions: Iterable[Decision]) -> list[list[Any]]:
    """[guard, kind, action] of every decision other than ALLOW, as recorded and as replayed."""
    return [[d.guard, d.kind, d.action.name.lower()] for d in decisions if d.action > Action.ALLOW]


@dataclass
class GuardTrace:
    """One call's guard record, built when it is judged and completed when its answer settles."""

    call_seq: int
    fields: dict[str, Any]
    guards: SessionGuards
    started_at: float  # the session's monotonic start (t = now - started_at)
    # the fields are what sanitize makes of them already (own_numbers): the event takes them as they are
    clean: bool = False
    tool: bool = False  # an MCP tool call (its settle brings fingerprints), else an LLM call
    rank: int | None = None
    settled_at: float | None = None
    settle: dict[str, Any] = field(default_factory=dict)
    # where `fields["config"]`, a config's dump (`begin`), has its sanitised form made once
    dumps: ConfigDumps | None = None

    def payload(
        self, max_field_bytes: int | None = None, into: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The fields the call's event carries; with `max_field_bytes`, already as `sanitize` makes
        them where they sit in the event's payload (the recorder then keeps them as they are).
        `into`: the event's payload being built, which gets them in place of a dict of their own.

        With `max_field_bytes` the fields are cleaned in place and become the event's guard_input,
        settle values added (no copy: the trace's fields are written once, with the call's event;
        a later call gives the same, cleaned, fields). So nothing may write to `fields` once the
        event is recorded: the queued event (and an OTLP sink's copy) holds that very dict."""
        settled = self.rank is not None and self.settled_at is not None
        out: dict[str, Any] = {} if into is None else into
        if max_field_bytes is None:
            if settled:  # (one dict built, in the same order)
                t_end = round(self.settled_at - self.started_at, T_DIGITS)  # type: ignore[operator]
                guard_input = {**self.fields, "rank": self.rank, "t_end": t_end, **self.settle}
            else:
                guard_input = dict(self.fields)
            out["call_seq"] = self.call_seq
        else:
            m = max_field_bytes
            # (under a cap this short sanitize could cut even a clean trace's one str, its kind)
            clean = self.clean and m >= CLEAN_FROM_BYTES
            guard_input = self.fields if clean else clean_fields(self.fields, m, self.dumps)
            if settled:
                guard_input["rank"] = self.rank
                guard_input["t_end"] = round(self.settled_at - self.started_at, T_DIGITS)  # type: ignore[operator]
                if not self.tool:  # an LLM call's settle (or a release): numbers and a bool only
                    guard_input.update(self.settle)
                else:
                    for key, value in self.settle.items():  # SETTLE_KEYS: none secret-named
                        guard_input[key] = value if type(value) in PLAIN else sanitize(value, m, 2)
            call_seq = self.call_seq
            out["call_seq"] = call_seq if type(call_seq) is int else sanitize(call_seq, m, 1)
        out["guard_input"] = guard_input
        if self.tool:  # (an LLM call has neither fingerprint)
            if "sig" in self.fields:
                out["args_fingerprint"] = guard_input["sig"]
            if "res" in self.settle:
                out["result_fingerprint"] = guard_input["res"]
        return out


def sanitized_fields(fields: dict[str, Any], max_field_bytes: int) -> dict[str, Any]:
    """`sanitize(fields, max_field_bytes, 1)`, the walk cut short where Tripwire made the value.

    The keys are Tripwire's own names (begin, mcp_inputs, llm_inputs; none secret-named), numbers
    stay as they are, and a plain call's history delta (nothing added, no results) holds only
    numbers: what sanitize would copy is kept as it is, without the walk. The rest is sanitised.
    """
    return clean_fields(dict(fields), max_field_bytes)


def clean_fields(
    fields: dict[str, Any], max_field_bytes: int, dumps: ConfigDumps | None = None
) -> dict[str, Any]:
    """sanitized_fields in place: each value that sanitize would change is replaced by what it
    makes; a value it would only copy (a number, a short name, an empty list, a numbers-only
    history delta) stays, the same object. Returns `fields`. `dumps`: where the config recorded
    (`begin`) was dumped, which keeps what sanitize makes of it."""
    plain = PLAIN
    for key, value in fields.items():  # (only values are replaced: the dict keeps its size)
        t = type(value)
        if t in plain or (t is list and not value):
            continue
        if t is str:
            clean = sanitize_text(value, max_field_bytes)
            if clean is not value:
                fields[key] = clean
        elif dumps is not None and key == "config":
            fields[key] = dumps.sanitized(value, max_field_bytes, 2)  # (sanitize's, made once)
        elif not (t is dict and key == "hist" and _numbers_only_hist(value)):
            fields[key] = sanitize(value, max_field_bytes, 2)
    return fields


_HIST_KEYS = ("keep", "add", "turn_start", "results")


def _numbers_only_hist(hist: dict[str, Any]) -> bool:
    """A history delta as llm_inputs builds it with no step added: its own keys, ints and empties."""
    return (
        tuple(hist) == _HIST_KEYS
        and type(hist["keep"]) is int
        and type(hist["turn_start"]) is int
        and type(add := hist["add"]) is list
        and not add
        and type(results := hist["results"]) is dict
        and not results
    )


CLEAN_FROM_BYTES = 16  # a field cap from which sanitize keeps "llm" as it is (redact._str)


def own_numbers(inputs: dict[str, Any]) -> bool:
    """The call's inputs are those of a plain LLM call (llm_inputs with no step added, no result,
    numeric estimates): with begin's own numbers they are already what sanitize makes of them, so
    GuardTrace.clean spares the record path clean_fields."""
    return (
        inputs["kind"] == "llm"
        and _numbers_only_hist(inputs["hist"])
        and type(inputs["est"]) in PLAIN
        and type(inputs["tok"]) in PLAIN
    )


# what a settle adds to a call's guard_input (besides rank and t_end)
SETTLE_KEYS = ("released", "res", "err", "cost", "tokens")


def begin(
    guards: SessionGuards,
    started_at: float,
    now: float,
    inputs: dict[str, Any],
    *,
    events_before: int,
    settled_before: int,
    config_rev: int,
    config_recorded: MutableSet[int],
    dumps: ConfigDumps | None = None,
) -> dict[str, Any]:
    """The fields every judged call records (before the guards judge it). `dumps`: where the
    config's dump is made once (a run's first call records it: every run, for a stateless service)."""
    fields: dict[str, Any] = {
        "t": round(now - started_at, T_DIGITS),
        "ev": events_before,
        "done": settled_before,
        "cfg": config_rev,
        **inputs,
    }
    if config_rev not in config_recorded:
        # the config in force, the first time a call runs under it: replay follows every change
        config_recorded.add(config_rev)
        config = guards.config
        fields["config"] = config.recorded() if dumps is None else dumps.recorded(config)
    return fields


def mcp_inputs(tool: str, args: Any, server: str | None, estimate_usd: float) -> dict[str, Any]:
    fp = call_fingerprints(tool, args)
    return {
        "kind": "tool",
        "tool": tool,
        "server": server,
        "sig": fp.sig,
        "id": fp.ident,
        "est": estimate_usd,
    }


def llm_inputs(
    previous: Sequence[tuple[str, ...]],
    steps: Sequence[Sequence[HistoryCall]],
    turn_start: int,
    results: HistoryResults,
    estimate_usd: float,
    estimate_tokens: int,
    *,
    known: int = 0,
) -> tuple[dict[str, Any], Sequence[tuple[str, ...]]]:
    """The request's history as a delta from the previous request's; returns (inputs, its step ids).

    Only the ids of the steps are taken for the whole history (it usually starts with the previous
    request's, compared at once); the calls of the added steps alone are read in full. `known`:
    the caller has proven that the first `known` steps are the previous request's, unchanged (the
    dialect read this request on from it): only the ids of the rest are taken.
    """
    keep = len(previous)
    if not steps and not keep:  # no assistant step now or before (plain chat calls): nothing to compare
        hist = {"keep": 0, "add": [], "turn_start": turn_start, "results": {}}
        # its step ids: none, as before (`previous`, empty: the conversation's shared empty tuple
        # as a rule, no empty list a run, issue 33)
        return {"kind": "llm", "hist": hist, "est": estimate_usd, "tok": estimate_tokens}, previous
    if known and known == keep and known <= len(steps):
        ids = list(previous)
        ids += [tuple([_call_id(c) for c in step]) for step in steps[known:]]
    else:
        ids = [tuple([_call_id(c) for c in step]) for step in steps]
        # (`previous` is a list, or empty: keep is then 0 whatever the comparison says)
        if keep > len(ids) or ids[:keep] != previous:
            keep = 0
            while keep < min(len(previous), len(ids)) and previous[keep] == ids[keep]:
                keep += 1
    added = [[call_tuple(c) for c in step] for step in steps[keep:]]
    by_id = results_map(results)
    add: list[list[list[Any]]] = []
    got: dict[str, list[Any]] = {}
    for row in added:
        step = []
        for call_id, name, args in row:
            fp = call_fingerprints(name, args)
            step.append([call_id, name, fp.sig, fp.ident])
            if call_id in by_id:
                fingerprint, error = by_id[call_id]
                got[call_id] = [fingerprint, error_fingerprint(error)]
        add.append(step)
    inputs = {
        "kind": "llm",
        "hist": {"keep": keep, "add": add, "turn_start": turn_start, "results": got},
        "est": estimate_usd,
        "tok": estimate_tokens,
    }
    return inputs, ids


def _call_id(call: HistoryCall) -> str:
    """`call_tuple(call)[0]`, without reading the rest of the call."""
    return str(call[0]) if isinstance(call, tuple | list) else str(call.id)


def settle_fields_tool(result_fingerprint: str, error: str | None) -> dict[str, Any]:
    return {"res": result_fingerprint, "err": error_fingerprint(error)}


def settle_fields_llm(cost_usd: float, tokens: int) -> dict[str, Any]:
    return {"cost": cost_usd, "tokens": tokens}


def call_fields(
    ex: Any, max_field_bytes: int | None = None, into: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The guard fields of a call's event (LLM_CALL / TOOL_CALL), written when it is recorded
    (with `max_field_bytes`: already sanitised, see GuardTrace.payload; `into`: added to the
    event's payload being built).

    Takes the call's settle rank now: the guard stage settles it right after, with these values.
    """
    trace: GuardTrace | None = ex.guard_trace
    if trace is None:
        return {} if into is None else into
    mark_settled(ex, trace, time.monotonic())
    return trace.payload(max_field_bytes, into)


def mark_settled(ex: Any, trace: GuardTrace, now: float) -> float:
    """Rank the answer (once) and note what the guards are told of it; returns the `now` to settle at.

    The rank is the answer's place among the session's settled answers, taken when the call's
    event is written; the guards settle it right after, on the same tick, so the ranks are the
    order the guards saw the answers in.
    """
    if trace.rank is not None:  # ranked already (the event was written): the guards settle it now
        assert trace.settled_at is not None
        return trace.settled_at
    trace.rank = trace.guards.next_settle()
    trace.settled_at = now
    settle = trace.settle
    if not ex.forwarded:  # (refused, or never sent) it never reached the upstream: its reservation goes back
        settle["released"] = True
    elif trace.tool:
        result = ex.result
        failed = result is not None and result.status == "error"
        fingerprint = (result.fingerprint or "") if result is not None else ""
        settle.update(settle_fields_tool(fingerprint, result.error_text if failed else None))
    else:  # settle_fields_llm's, set in place
        settle["cost"] = float(ex.cost_usd)
        settle["tokens"] = int(ex.tokens)
    return now
