"""One replica's copy of a run's session guards, fed from the run's shared guard log.

The session guards are pure and deterministic (the property `tripwire replay` rests on, SPEC §5.7):
the same inputs in the same order give the same decisions. So replicas share a run's guards by
sharing the ORDER of their inputs: every replica appends its calls' inputs to one log (one atomic
round trip, which also returns what the others appended since) and feeds the entries it has not
seen, in log order, into its own `SessionGuards` before reading the decision on its own entry.
Every replica computes the same decision for every entry, so two replicas can never both let
through the call that crosses a limit, and a budget or a loop fires at the same call as in one
process. Times are the backend's clock at append (one clock for all replicas), relative to the
run's first entry.

Pure: no I/O. What is not the session guards' (writing events, refusing) stays with the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from proxy.constants import GUARD_KILL_SWITCH
from proxy.guard_log import entries
from proxy.guards.budget import Reservation
from proxy.guards.config import GuardConfig
from proxy.guards.decision import Action, Decision
from proxy.guards.loop.replies import Echo
from proxy.guards.session import SessionGuards, Verdict
from proxy.guards.signatures import Fingerprinted, RecordedError
from proxy.state.base import LogEntry

ConfigFor = Callable[[int], GuardConfig]  # shared config revision -> this run's agent's config


@dataclass
class Applied:
    """What applying one entry concluded (the caller acts on its own entries' outcomes)."""

    seq: int
    kind: str
    verdict: Verdict | None = None  # checks: the guards' verdict (None when the run had ended)
    ended_by: Decision | None = None  # checks refused because the session had already ended
    decisions: list[Decision] = field(default_factory=list)  # settles (soft alert), events (cycle)
    events_before: int = 0  # checks: events the guards had observed, and answers settled, before it
    settled_before: int = 0


@dataclass
class _Open:
    """A check that was admitted and whose answer has not been settled yet."""

    reservation: Reservation | None
    tool: str | None = None
    args: Fingerprinted | None = None


KILLED = Decision(Action.TERMINATE, GUARD_KILL_SWITCH, "session terminated through the admin API")


class SessionReplica:
    """A run's `SessionGuards`, advanced entry by entry in log order."""

    def __init__(self, config_for: ConfigFor) -> None:
        self.config_for = config_for
        self.guards: SessionGuards | None = None
        self.applied = 0  # entries applied: the next one expected is applied + 1
        self.t0: float | None = None
        self.now = 0.0
        self.config_rev: int | None = None
        self.killed: Decision | None = None
        self._open: dict[str, _Open] = {}  # admitted checks not settled yet, by check name

    @property
    def ended_by(self) -> Decision | None:
        """What ended the session (a guard's TERMINATE, AgentDbg's stop_on_loop, the kill switch)."""
        if self.killed is not None:
            return self.killed
        return self.guards.terminated_by if self.guards is not None else None

    def apply(self, entry: LogEntry, event_ids: Mapping[str, str] | None = None) -> Applied | None:
        """Apply the next entry (an entry already applied is skipped: None). `event_ids`
        (tool_call_id -> TOOL_CALL event id) only names a LOOP_WARNING's evidence."""
        if entry.seq <= self.applied:
            return None
        if entry.seq != self.applied + 1:
            raise ValueError(f"guard log entry {entry.seq} applied after {self.applied}: a gap")
        self.applied = entry.seq
        if self.t0 is None:
            self.t0 = entry.t
        # the backend's clock, never going back (a stepped wall clock must not undo elapsed time)
        self.now = max(self.now, entry.t - self.t0)
        guards = self._guards(entry.config_rev)
        body = entries.decode(entry.body)
        kind = body.kind
        if isinstance(body, entries.ToolCheck | entries.LlmCheck):
            return self._check(entry.seq, body, guards, event_ids)
        if isinstance(body, entries.Settle):
            return Applied(entry.seq, kind, decisions=self._settle(body, guards))
        if isinstance(body, entries.Release):
            opened = self._open.pop(body.ref, None)
            if opened is not None:
                guards.release(opened.reservation)
            return Applied(entry.seq, kind)
        if isinstance(body, entries.EventEntry):
            d = guards.observe_event(body.event_type, body.name, body.event_id)
            return Applied(entry.seq, kind, decisions=[d] if d is not None else [])
        if isinstance(body, entries.Kill):
            if self.killed is None and guards.terminated_by is None:
                self.killed = KILLED
            return Applied(entry.seq, kind)
        if isinstance(body, entries.RaiseLimits):
            guards.raise_limits(body.values)
            return Applied(entry.seq, kind)
        if isinstance(body, entries.ApproveLoop):
            guards.approve_loop(body.until)
            return Applied(entry.seq, kind)
        if isinstance(body, entries.Resume):
            self.killed = None
            guards.resumed()
            return Applied(entry.seq, kind)
        return Applied(entry.seq, kind)  # an entry of a newer Tripwire: ignored, as replay does

    def _guards(self, config_rev: int) -> SessionGuards:
        if self.guards is None:
            self.guards = SessionGuards(self.config_for(config_rev), started_at=0.0)
            self.guards.budget.count_event()  # RUN_START, as in one process
            self.config_rev = config_rev
        elif config_rev != self.config_rev:
            self.guards.configure(self.config_for(config_rev))
            self.config_rev = config_rev
        return self.guards

    def _check(
        self,
        seq: int,
        body: entries.ToolCheck | entries.LlmCheck,
        guards: SessionGuards,
        event_ids: Mapping[str, str] | None,
    ) -> Applied:
        applied = Applied(
            seq, body.kind, events_before=guards.events_seen, settled_before=guards.calls_settled
        )
        ended = self.ended_by
        if ended is not None:
            applied.ended_by = ended  # refused as every call of an ended session: never judged
            return applied
        if isinstance(body, entries.ToolCheck):
            args = Fingerprinted(body.sig, body.ident)
            tool = body.tool
            verdict = guards.before_tool_call(
                tool, args, now=self.now, server=body.server, estimate_usd=body.estimate_usd
            )
            opened = _Open(verdict.reservation, tool, args)
        else:
            steps = [
                [(call_id, name, Fingerprinted(sig, ident)) for call_id, name, sig, ident in step]
                for step in body.steps
            ]
            results = {
                call_id: (fp, None if err is None else RecordedError(err))
                for call_id, (fp, err) in body.results.items()
            }
            verdict = guards.before_llm_call(
                steps,
                body.turn_start,
                results,
                estimate_usd=body.estimate_usd,
                estimate_tokens=body.estimate_tokens,
                now=self.now,
                event_ids=event_ids,
                echo=Echo.read(body.echo),
            )
            opened = _Open(verdict.reservation)
        if verdict.refused:
            guards.release(verdict.reservation)  # not forwarded: nothing will settle it
        else:
            self._open[body.check if body.check is not None else str(seq)] = opened
        applied.verdict = verdict
        return applied

    def _settle(self, body: entries.Settle, guards: SessionGuards) -> list[Decision]:
        opened = self._open.pop(body.ref, None)
        if opened is None:
            return []  # refused, or settled already
        if opened.tool is not None and opened.args is not None:
            err = body.error
            return guards.after_tool_call(
                opened.reservation,
                opened.tool,
                opened.args,
                result_fingerprint=body.result,
                error=None if err is None else RecordedError(err),
                now=self.now,
            )
        return guards.after_llm_call(
            opened.reservation,
            cost_usd=body.cost_usd,
            tokens=body.tokens,
            now=self.now,
        )
