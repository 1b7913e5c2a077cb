"""`tripwire replay`: recorded runs fed through fresh session guards (SPEC §5.7).

A run recorded by Tripwire carries, on each guarded call's event, what its guards were given and
when (`proxy.guard_trace`). Replay puts those inputs back in the order the live guards saw them:
calls by `call_seq`; before each call, the answers settled before it (by `rank`) and the events
observed before it (`ev`); each under the config in force (`cfg`), or the one `--config` gives. So
under the recorded config it decides exactly as the live guards did, and under another config it
answers "what would this have done?":

- a call the replay refuses is not forwarded: its recorded answer is not fed to the guards;
- a call refused live but admitted by the replay has no answer to feed: it stays unanswered;
- the circuit breaker (state per agent and upstream, outside the run), rate limits (per agent,
  across its sessions) and the kill switch (an operator's act) are not recomputed: their recorded
  decisions are listed, `replayed: false`. A call a rate limit refused never reached the session's
  guards (no call of the run), so the replay has nothing of it to judge.

Runs written by AgentDbg's own SDK carry none of this: their LLM_CALL and TOOL_CALL events are
replayed one after the other, in file order, with the arguments and results they hold (each call
answered before the next; times from the events' `ts`).

What is read is validated first (`proxy.replay_input`): a run whose files are not what Tripwire or
AgentDbg writes is refused with a `BadRecord` naming the run and the line, before any guard runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from proxy.constants import GUARD_KILL_SWITCH, GUARD_STOP_ON_LOOP, EventType
from proxy.guards.config import GuardConfig
from proxy.guards.decision import Action, Decision
from proxy.guards.loop.replies import Echo
from proxy.guards.session import SessionGuards
from proxy.guards.signatures import Fingerprinted, RecordedError, content_text, result_fingerprint
from proxy.replay_input import (
    PIN_FINDINGS,
    RECORDED_ONLY_GUARDRAILS,
    BadRecord,
    Event,
    GuardInput,
    HistoryDelta,
    Meta,
    Payload,
    ReplayError,
    read_events,
    read_meta,
)
from proxy.storage import EVENTS_JSONL, parse_iso, run_dir

__all__ = ["BadRecord", "ReplayError", "RunReplay", "replay_dir"]

# events the live guards never observed (not handed to `SessionPolicy.observe_event`): the session's
# start (counted when its guards were made), its end, and what AgentDbg's cycle and the kill switch
# wrote after the fact
APPROVAL_DECIDED = "approval_decided"  # the STATE_UPDATE of a held call's outcome (proxy/stages/guards.py)
NOT_OBSERVED_GUARDRAILS = frozenset({GUARD_STOP_ON_LOOP, GUARD_KILL_SWITCH})


@dataclass(frozen=True)
class ReplayDecision:
    run_id: str
    call_index: int | None
    event_id: str | None
    guard: str
    kind: str | None
    action: str
    message: str = ""
    replayed: bool = True
    decision: str | None = None  # an ask's recorded outcome (approved, denied, timeout, ...)

    def as_json(self) -> dict[str, Any]:
        """The stable `--json` object (SPEC §5.7)."""
        out: dict[str, Any] = {
            "run_id": self.run_id,
            "call_index": self.call_index,
            "event_id": self.event_id,
            "guard": self.guard,
            "kind": self.kind,
            "action": self.action,
        }
        if not self.replayed:
            out["replayed"] = False
        if self.decision is not None:
            out["decision"] = self.decision
        return out


@dataclass
class RunReplay:
    run_id: str
    calls: int = 0
    decisions: list[ReplayDecision] = field(default_factory=list)
    # call_seq -> [[guard, kind, action], ...]: what the live guards decided before each call
    live: dict[int, list[list[Any]]] = field(default_factory=dict)
    replayed_checks: dict[int, list[list[Any]]] = field(default_factory=dict)
    recorded_by: str = "tripwire"  # or "agentdbg": no guard inputs recorded

    def first(self, action: Action = Action.WARN) -> ReplayDecision | None:
        for d in self.decisions:
            if Action[d.action.upper()] >= action:
                return d
        return None


# -- locating and loading runs ---------------------------------------------------------------------


def resolve_run(target: str, data_dir: Path) -> Path:
    """A run directory: a path to one (holding events.jsonl), or a run id under `data_dir`."""
    path = Path(target)
    if os.path.lexists(path / EVENTS_JSONL):  # (not is_file: a FIFO there is refused when read, by name)
        return path
    try:
        d = run_dir(data_dir, target)
    except ValueError as e:
        raise ReplayError(f"{target}: not a run directory nor a run id ({e})") from e
    if not os.path.lexists(d / EVENTS_JSONL):
        raise ReplayError(f"{target}: no such run in {data_dir}")
    return d


def all_runs(data_dir: Path) -> list[Path]:
    base = data_dir / "runs"
    try:
        return sorted(p for p in base.iterdir() if os.path.lexists(p / EVENTS_JSONL))
    except OSError:
        return []


def replay_dir(d: Path, override: GuardConfig | dict[str, GuardConfig] | None = None) -> RunReplay:
    """Replay one run directory; BadRecord (naming the run and the line) when its files are not
    what Tripwire writes, OSError when they cannot be read."""
    events = read_events(d, d.name)
    meta = read_meta(d, d.name)
    run_id = next((e.run_id for e in events if e.run_id), d.name)
    return replay_events(run_id, events, meta, resolve_override(override, meta))


def resolve_override(override: GuardConfig | dict[str, GuardConfig] | None, meta: Meta) -> GuardConfig | None:
    """`--config` for this run: its agent's override if the file has one, else its project default."""
    if override is None or isinstance(override, GuardConfig):
        return override
    project = override.get("") or GuardConfig()
    agent = override.get(meta.agent_name or "")
    return project if agent is None else agent.inheriting_shadow(project)


# -- replaying -----------------------------------------------------------------------------------


def replay_events(
    run_id: str, events: list[Event], meta: Meta, override: GuardConfig | None = None
) -> RunReplay:
    calls: dict[int, Event] = {}
    for ev in events:
        seq = ev.payload.call_seq
        if seq is not None and ev.payload.guard_input is not None:
            calls.setdefault(seq, ev)
    if not calls:
        return _replay_agentdbg(run_id, events, meta, override)
    return _Replayer(run_id, events, calls, meta, override).run()


def _fields(ev: Event) -> GuardInput:
    """A guarded call's guard_input (replay_events keeps only calls that have one)."""
    assert ev.payload.guard_input is not None
    return ev.payload.guard_input


def _decision(run_id: str, call: int | None, event_id: str | None, d: Decision) -> ReplayDecision:
    return ReplayDecision(run_id, call, event_id, d.guard, d.kind, d.action.name.lower(), d.message)


def _listed(decisions: list[Decision]) -> list[list[Any]]:
    return [[d.guard, d.kind, d.action.name.lower()] for d in decisions if d.action > Action.ALLOW]


class _Replayer:
    def __init__(
        self,
        run_id: str,
        events: list[Event],
        calls: dict[int, Event],
        meta: Meta,
        override: GuardConfig | None,
    ) -> None:
        self.run_id = run_id
        self.events = events
        self.calls = calls
        self.override = override
        self.out = RunReplay(run_id, calls=len(calls))
        self.configs: dict[int, GuardConfig] = {}
        for seq in sorted(calls):
            fields = _fields(calls[seq])
            if fields.config is not None:
                self.configs.setdefault(fields.cfg, fields.config)
        if 0 not in self.configs and meta.guard_config is not None:
            self.configs[0] = meta.guard_config
        self.settles = sorted(
            (seq for seq, ev in calls.items() if _fields(ev).rank is not None), key=self._rank
        )
        self.settled = 0
        self.reservations: dict[int, Any] = {}
        self.history: list[list[tuple[str, str, Fingerprinted]]] = []
        self.results: dict[str, tuple[str, str | None]] = {}
        self.observable = self._observable()
        self.last_call: int | None = None
        self.guards: SessionGuards | None = None

    def _observable(self) -> Iterator[Event]:
        for ev in self.events:
            kind = ev.event_type
            payload = ev.payload
            if kind in (EventType.RUN_START, EventType.RUN_END):
                continue
            if kind == EventType.LOOP_WARNING and payload.kind == "cycle":
                continue
            if kind == EventType.ERROR and payload.guardrail in NOT_OBSERVED_GUARDRAILS:
                continue
            yield ev

    def config(self, rev: int) -> GuardConfig:
        if self.override is not None:
            return self.override
        if rev in self.configs:
            return self.configs[rev]
        earlier = [r for r in self.configs if r <= rev]
        return self.configs[max(earlier)] if earlier else GuardConfig()

    def run(self) -> RunReplay:
        for seq in sorted(self.calls):
            ev = self.calls[seq]
            fields = _fields(ev)
            guards = self._guards(fields.cfg)
            while self.settled < len(self.settles) and self._rank(self.settles[self.settled]) <= fields.done:
                self._settle(self.settles[self.settled])
            self._observe_until(fields.ev)
            guards.configure(self.config(fields.cfg))
            self.last_call = seq
            self._check(seq, ev, fields)
        while self.settled < len(self.settles):
            self._settle(self.settles[self.settled])
        self._observe_until(None)
        self._list_recorded_only()
        return self.out

    def _guards(self, rev: int) -> SessionGuards:
        if self.guards is None:
            self.guards = SessionGuards(self.config(rev), started_at=0.0)
            self.guards.budget.count_event()  # RUN_START, as live
            carried = next(
                (e.payload.carried_over for e in self.events if e.event_type == EventType.RUN_START), None
            )
            if carried:  # a resumed run: its session's spend and counts went on (SPEC §5.5a)
                self.guards.carry_over(carried)
        return self.guards

    def _rank(self, seq: int) -> int:
        return _fields(self.calls[seq]).rank or 0

    def _observe_until(self, count: int | None) -> None:
        guards = self.guards
        if guards is None:
            return
        while count is None or guards.events_seen < count:
            ev = next(self.observable, None)
            if ev is None:
                return
            if ev.event_type == EventType.STATE_UPDATE and ev.payload.raised:
                guards.raise_limits(ev.payload.raised)  # from the next call on, as live
            if ev.event_type == EventType.STATE_UPDATE and ev.payload.covers_until:
                guards.approve_loop(ev.payload.covers_until)  # an approved loop (SPEC §5.5a), as live
            d = guards.observe_event(str(ev.event_type), ev.name or "", str(ev.event_id))
            if d is not None:
                seq = ev.payload.call_seq if "call_seq" in ev.payload.model_fields_set else self.last_call
                self.out.decisions.append(_decision(self.run_id, seq, ev.event_id, d))

    def _check(self, seq: int, ev: Event, fields: GuardInput) -> None:
        guards = self.guards
        assert guards is not None
        now = fields.t
        if fields.kind == "tool":
            args = Fingerprinted(str(fields.sig), str(fields.id))
            verdict = guards.before_tool_call(
                str(fields.tool), args, now=now, server=fields.server, estimate_usd=fields.est
            )
        else:
            hist = fields.hist or HistoryDelta()
            added = [[(c[0], c[1], Fingerprinted(c[2], c[3])) for c in step] for step in hist.add]
            self.history = self.history[: hist.keep] + added
            for call_id, (fingerprint, error) in hist.results.items():
                self.results[call_id] = (fingerprint, None if error is None else RecordedError(error))
            verdict = guards.before_llm_call(
                self.history,
                hist.turn_start,
                self.results,
                estimate_usd=fields.est,
                estimate_tokens=fields.tok,
                now=now,
                echo=Echo.read(fields.echo),
            )
        self.out.live[seq] = list(fields.decisions)
        self.out.replayed_checks[seq] = _listed(verdict.decisions)
        for d in verdict.decisions:
            if d.action > Action.ALLOW:
                self.out.decisions.append(_decision(self.run_id, seq, ev.event_id, d))
        refused_live = ev.event_type == EventType.ERROR or fields.breaker
        if verdict.refused or refused_live:
            guards.release(verdict.reservation)  # not forwarded: no answer to settle
        else:
            self.reservations[seq] = verdict.reservation

    def _settle(self, seq: int) -> None:
        self.settled += 1
        if seq not in self.reservations:
            return  # refused here (or live): its answer never came
        guards = self.guards
        assert guards is not None
        reservation = self.reservations.pop(seq)
        ev = self.calls[seq]
        fields = _fields(ev)
        now = fields.t if fields.t_end is None else fields.t_end
        if fields.released:
            guards.release(reservation)
            return
        if fields.kind == "tool":
            error = fields.err
            after = guards.after_tool_call(
                reservation,
                str(fields.tool),
                Fingerprinted(str(fields.sig), str(fields.id)),
                result_fingerprint=fields.res,
                error=None if error is None else RecordedError(error),
                now=now,
                event_id=ev.event_id,
            )
        else:
            after = guards.after_llm_call(reservation, cost_usd=fields.cost, tokens=fields.tokens, now=now)
        for d in after:
            if d.action > Action.ALLOW:
                self.out.decisions.append(_decision(self.run_id, seq, ev.event_id, d))

    def _list_recorded_only(self) -> None:
        """The breaker's and the kill switch's decisions, as they happened (not recomputed)."""
        last: int | None = None
        for ev in self.events:
            payload = ev.payload
            if payload.call_seq is not None:
                last = payload.call_seq
            if ev.event_type == EventType.STATE_UPDATE and ev.name == APPROVAL_DECIDED:
                # a person's decision (SPEC §5.5a): listed as recorded, never recomputed
                self.out.decisions.append(
                    ReplayDecision(
                        self.run_id,
                        payload.call_seq,
                        ev.event_id,
                        str(payload.guardrail),
                        payload.kind if isinstance(payload.kind, str) else None,
                        "ask",
                        str(payload.message or ""),
                        replayed=False,
                        decision=str(payload.decision),
                    )
                )
                continue
            if ev.event_type == EventType.STATE_UPDATE and ev.name in PIN_FINDINGS:
                # a changed MCP tool definition (docs/mcp.md "Changed tools"): the server's, as found
                self.out.decisions.append(
                    ReplayDecision(
                        self.run_id,
                        last,
                        ev.event_id,
                        str(ev.name),
                        None,
                        str(payload.action or "warn"),
                        replayed=False,
                    )
                )
                continue
            if ev.event_type != EventType.ERROR or payload.guardrail not in RECORDED_ONLY_GUARDRAILS:
                continue
            self.out.decisions.append(
                ReplayDecision(
                    self.run_id,
                    payload.call_seq if "call_seq" in payload.model_fields_set else last,
                    ev.event_id,
                    str(payload.guardrail),
                    payload.kind,
                    str(payload.action or "terminate"),
                    str(payload.message or ""),
                    replayed=False,
                )
            )
        self.out.decisions.sort(key=lambda d: d.call_index if d.call_index is not None else 0)


def _replay_agentdbg(run_id: str, events: list[Event], meta: Meta, override: GuardConfig | None) -> RunReplay:
    """A run without guard inputs (AgentDbg's SDK): its calls one after the other, in file order."""
    config = override or meta.guard_config
    guards = SessionGuards(config or GuardConfig(), started_at=0.0)
    out = RunReplay(run_id, recorded_by="agentdbg")
    start = next((parse_iso(e.ts) for e in events if e.event_type == EventType.RUN_START), None)
    for ev in events:
        kind = ev.event_type
        ts = parse_iso(ev.ts)
        now = 0.0 if ts is None or start is None else max(0.0, ts - start)
        if kind == EventType.RUN_START:
            guards.budget.count_event()
            continue
        if kind in (EventType.LLM_CALL, EventType.TOOL_CALL):
            out.calls += 1
            got = _agentdbg_call(guards, kind, ev.payload, now)
            out.decisions += [_decision(run_id, out.calls, ev.event_id, d) for d in got]
        d = guards.observe_event(str(kind), ev.name or "", str(ev.event_id))
        if d is not None:
            out.decisions.append(_decision(run_id, out.calls or None, ev.event_id, d))
    return out


def _agentdbg_call(guards: SessionGuards, kind: str, payload: Payload, now: float) -> list[Decision]:
    if kind == EventType.LLM_CALL:
        verdict = guards.before_llm_call([], 0, {}, estimate_usd=0.0, now=now)
        tokens = payload.usage.total_tokens if payload.usage is not None else None
        after = guards.after_llm_call(
            verdict.reservation, cost_usd=payload.cost_usd or 0.0, tokens=tokens or 0, now=now
        )
        return [d for d in verdict.decisions + after if d.action > Action.ALLOW]
    tool = str(payload.tool_name or "unknown")
    args = payload.args
    verdict = guards.before_tool_call(tool, args, now=now)
    if verdict.refused:
        return [d for d in verdict.decisions if d.action > Action.ALLOW]
    error = None
    if payload.status == "error":
        err = payload.error
        error = content_text(err.get("message") if isinstance(err, dict) else err) or "error"
    after = guards.after_tool_call(
        verdict.reservation,
        tool,
        args,
        result_fingerprint=result_fingerprint(payload.result),
        error=error,
        now=now,
    )
    return [d for d in verdict.decisions + after if d.action > Action.ALLOW]


# -- printing ------------------------------------------------------------------------------------


def as_json(replays: list[RunReplay]) -> bytes:
    return orjson.dumps([d.as_json() for r in replays for d in r.decisions], option=orjson.OPT_INDENT_2)


def as_text(replay: RunReplay, config_label: str) -> str:
    lines = [f"run {replay.run_id}: {replay.calls} calls replayed under {config_label}"]
    if replay.recorded_by == "agentdbg":
        lines[0] += " (no guard inputs recorded: its calls one after the other)"
    if not replay.decisions:
        lines.append("  nothing fired")
    for d in replay.decisions:
        where = "-" if d.call_index is None else str(d.call_index)
        note = "" if d.replayed else f"  [recorded{': ' + d.decision if d.decision else ''}, not replayed]"
        lines.append(
            f"  call {where:>4}  event {d.event_id}  {d.guard}  {d.kind or '-'}  {d.action}  {d.message}{note}"
        )
    return "\n".join(lines)


def summary(replays: list[RunReplay]) -> str:
    """--all: runs that would be warned / blocked / ended, and each run's first firing."""
    ended = [r for r in replays if r.first(Action.TERMINATE)]
    blocked = [r for r in replays if r.first(Action.BLOCK) and r not in ended]
    warned = [r for r in replays if r.first(Action.WARN) and r not in ended and r not in blocked]
    lines = [
        f"{len(replays)} runs: {len(warned)} would be warned, {len(blocked)} blocked, {len(ended)} ended, "
        f"{len(replays) - len(warned) - len(blocked) - len(ended)} untouched"
    ]
    for r in replays:
        first = r.first()
        if first is not None:
            lines.append(
                f"  {r.run_id}: first at call {first.call_index}: {first.guard} {first.kind or '-'} {first.action}"
            )
    return "\n".join(lines)
