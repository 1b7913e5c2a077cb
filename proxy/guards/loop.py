"""Loop detection for one session (SPEC §5.1): every pattern, and exactly when it fires.

Tool calls reach the detector two ways and count once:
- MCP `tools/call`: `check_tool_call()` before forwarding (the attempt counts even if refused),
  then `record_tool_result()` with what came back;
- function-calling tools the agent ran itself: `check_llm_history()` with the request's
  assistant steps; each `tool_call_id` counts once however often the history repeats it, and a
  call already seen as MCP (same bare tool name + canonical arguments) is not counted again.
`observe_event()` feeds AgentDbg's cycle detector with every LLM_CALL / TOOL_CALL recorded.

Each firing is a `Decision` (kind, pattern, repetitions, window_size, evidence). A streak writes
one LOOP_WARNING: `new_finding` is True only for its first decision (per level, for the
graduated patterns), while every further call in it gets the same action.

Pure: no I/O, no asyncio, the monotonic clock passed in as `now`.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.guards.config import LoopDetectionConfig
from proxy.guards.decision import Action, Decision
from proxy.guards.signatures import content_text, normalize_tool_name, result_fingerprint, signature

GUARD = "loop_detection"
TAG_LOOP = "loop_detected"
TAG_TERMINATED = "terminated"
PATTERN_CHARS = 80
MAX_EVIDENCE = 50
MAX_CYCLE_PERIOD = 4

IDEMPOTENT_WORDS = ("read", "get", "list", "search", "status", "fetch", "query")
MUTATING_WORDS = ("write", "edit", "delete", "execute", "shell", "commit", "push", "insert", "install")
# Well-known names the word heuristic would misplace (Loop Guard ships similar lists): read-only
# shell and git commands, and code runners whose names carry none of the words above.
KNOWN_IDEMPOTENT = frozenset(
    "grep glob ls cat head tail find pwd which whoami date git_log git_diff git_show git_branch"
    " view describe help".split()
)
KNOWN_MUTATING = frozenset(
    "bash exec eval run_python run_command subprocess mkdir rm mv cp touch create_file move_file"
    " patch_file git_add git_reset git_checkout".split()
)
_ACTIONS = {"warn": Action.WARN, "block": Action.BLOCK, "terminate": Action.TERMINATE}

# (tool_call_id, tool name, arguments), or the dialects' ToolCall (id, name, arguments)
HistoryCall = Any
# tool_call_id -> (result fingerprint, error text or None), or the dialects' ToolResult list
HistoryResults = Mapping[str, tuple[str, str | None]] | Iterable[Any]


def _call_tuple(call: Any) -> tuple[str, str, Any]:
    if isinstance(call, tuple | list):
        return str(call[0]), str(call[1]), call[2]
    return str(call.id), str(call.name), call.arguments


def _results_map(results: HistoryResults) -> Mapping[str, tuple[str, str | None]]:
    """ToolResult objects -> (fingerprint, error text when is_error) by tool_call_id."""
    if isinstance(results, Mapping):
        return results
    out: dict[str, tuple[str, str | None]] = {}
    for r in results:
        error = content_text(r.content) or "error" if getattr(r, "is_error", False) else None
        out[str(r.tool_call_id)] = (result_fingerprint(r.content), error)
    return out


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def _has_word(words: list[str], keys: tuple[str, ...]) -> bool:
    # a word that is a key or starts with one ("readfile", "searching"), never a substring
    # anywhere ("budget" is not "get", "credit" is not "edit")
    return any(w.startswith(k) for w in words for k in keys)


def classify_tool(name: str, config: LoopDetectionConfig) -> str:
    """Idempotent or mutating: the config's lists, well-known names, then the name's words.

    Mutating words win over idempotent ones (`read_then_write`); a name the heuristic cannot
    place is treated as mutating, the stricter side, as Loop Guard does.
    """
    bare = normalize_tool_name(name)
    if name in config.mutating_tools or bare in config.mutating_tools:
        return "mutating"
    if name in config.idempotent_tools or bare in config.idempotent_tools:
        return "idempotent"
    lowered = bare.lower()
    if lowered in KNOWN_MUTATING:
        return "mutating"
    if lowered in KNOWN_IDEMPOTENT:
        return "idempotent"
    words = _words(bare)
    if _has_word(words, MUTATING_WORDS):
        return "mutating"
    if _has_word(words, IDEMPOTENT_WORDS):
        return "idempotent"
    return "mutating"


@dataclass
class _Occurrence:
    sig: str
    tool: str
    evidence: str | None  # event id when known, else the tool_call_id


@dataclass
class _Streak:
    """A run of identical failures / identical results, numbered so one LOOP_WARNING is written."""

    key: Any
    count: int = 0
    serial: int = 0
    evidence: list[str] = field(default_factory=list)


class LoopDetector:
    """All loop patterns of one session."""

    def __init__(self, config: LoopDetectionConfig) -> None:
        self.config = config
        self._serial = 0
        # every tool-call attempt, in order (bounded: only tails are ever looked at)
        self._seq: deque[_Occurrence] = deque(maxlen=256)
        self._index = -1  # global index of the last occurrence
        self._run_len = 0  # repetition: identical signatures at the end
        self._periodic: dict[int, int] = {m: 0 for m in range(2, MAX_CYCLE_PERIOD + 1)}
        self._reported: set[Any] = set()  # streak keys that already wrote their LOOP_WARNING
        # retry without progress: consecutive (tool, error) failures across the session's results
        self._fail = _Streak(key=None)
        # no-progress poll: per signature, consecutive identical results
        self._results: dict[str, _Streak] = {}
        # per-tool escalation within a turn
        self.turn = 0
        self.turn_started_at: float | None = None
        self.turn_counts: Counter[str] = Counter()
        self._turn_ids: set[str] = set()
        self._last_mcp_at: float | None = None
        self._llm_seen = False
        # function-calling bookkeeping
        self._seen_ids: set[str] = set()
        self._id_sig: dict[str, str] = {}
        self._mcp_unclaimed: Counter[str] = Counter()
        self._answers: dict[tuple[str, ...], list[Decision]] = {}  # last request's decisions
        self.new_history_calls = 0  # counted by the last check_llm_history (not seen as MCP)
        self._history_seen = False  # a request's history was read before (later unseen ids are new)
        # AgentDbg cycle: event signatures in a sliding window
        self._window: deque[tuple[str, str]] = deque(maxlen=max(2, config.window))
        self._cycle_reported: set[str] = set()
        # stats
        self.tool_totals: Counter[str] = Counter()
        self.decision_counts: Counter[str] = Counter()

    def configure(self, config: LoopDetectionConfig) -> None:
        """A config change (admin API) applies from the next call; counts are kept."""
        self.config = config
        if self._window.maxlen != max(2, config.window):
            self._window = deque(self._window, maxlen=max(2, config.window))

    # -- MCP tool calls --------------------------------------------------------------------------

    def check_tool_call(
        self, tool: str, args: Any, now: float, *, server: str | None = None, evidence: str | None = None
    ) -> list[Decision]:
        """Before forwarding an MCP `tools/call`: the attempt counts (even when refused)."""
        sig = signature(tool, args)
        if len(self._mcp_unclaimed) > 10_000:  # an MCP-only session never claims them: stay bounded
            self._mcp_unclaimed.clear()
        self._mcp_unclaimed[sig] += 1  # the history that shows it later does not count it again
        if not self.config.enabled:
            return []
        if not self._llm_seen:
            gap = self.config.turn_gap_s
            if self._last_mcp_at is None or now - self._last_mcp_at > gap:
                self._new_turn(now)
        self._last_mcp_at = now
        decisions = self._count_call(sig, normalize_tool_name(tool), evidence)
        decisions += self._turn_time(now)
        return self._finish(decisions)

    def record_tool_result(
        self,
        tool: str,
        args: Any,
        result_fingerprint: str,
        error: str | None,
        now: float,
        *,
        event_id: str | None = None,
    ) -> None:
        """After an MCP call answered: feeds retry-without-progress and no-progress poll."""
        self._last_mcp_at = now  # the pause that ends an MCP-only turn runs from the last activity
        sig = signature(tool, args)
        if event_id is not None:
            for occ in reversed(self._seq):
                if occ.sig == sig:
                    occ.evidence = event_id
                    break
        self._record_result(sig, normalize_tool_name(tool), result_fingerprint, error, event_id)

    # -- function-calling tools in an LLM request's history ---------------------------------------

    def check_llm_history(
        self,
        steps: Sequence[Sequence[HistoryCall]],
        turn_start: int,
        tool_results: HistoryResults,
        now: float,
    ) -> list[Decision]:
        """Before forwarding an LLM request: the tool calls its history holds, new ones counted once.

        `steps` are the assistant steps (oldest first), `turn_start` the index of the first step
        after the last real user message, `tool_results` maps tool_call_id -> (fingerprint, error)
        for the results the request carries. Sending the same history again gives the same answer.
        """
        steps = [[_call_tuple(c) for c in step] for step in steps]
        tool_results = _results_map(tool_results)
        turn_start = max(0, min(turn_start, len(steps)))
        if not self.config.enabled:
            self._count_ids_only(steps, turn_start)
            return []
        self._llm_seen = True
        inside = [c[0] for step in steps[turn_start:] for c in step]
        before = [c[0] for step in steps[:turn_start] for c in step]
        if not inside or self._turn_ids.intersection(before) or self.turn_started_at is None:
            self._new_turn(now)

        decisions: list[Decision] = []
        new_calls = 0
        self.new_history_calls = 0
        for k, step in enumerate(steps):
            for call_id, name, args in step:
                first = self._first_sight(call_id, name, args)
                if first is None:
                    continue
                sig, claimed_by_mcp = first
                new_calls += 1
                self._id_sig[call_id] = sig
                if claimed_by_mcp:  # already counted as the MCP call it was
                    if k >= turn_start:
                        self._turn_ids.add(call_id)
                    continue
                if k < turn_start:
                    # an earlier turn: not judged now; a call Tripwire never saw before, in a
                    # history it has seen, came after it joined (its result sent along with the
                    # next user message): a tool call of the session all the same (limits)
                    self.new_history_calls += int(self._history_seen)
                    continue
                self._turn_ids.add(call_id)
                self.new_history_calls += 1
                decisions += self._count_call(sig, normalize_tool_name(name), call_id)
                if call_id in tool_results:
                    fingerprint, error = tool_results[call_id]
                    self._record_result(sig, normalize_tool_name(name), fingerprint, error, call_id)

        # the request's shape: the same history sent again gets the same answer
        last_ids = (str(turn_start), str(len(steps)), *(c[0] for c in steps[-1])) if steps else ()
        if new_calls == 0 and last_ids in self._answers:
            decisions = [replace(d, new_finding=False) for d in self._answers[last_ids]]
        else:
            decisions += self._identical_step(steps, turn_start)
            decisions = self._finish(decisions)
            if last_ids:
                self._answers = {last_ids: decisions}
        self._history_seen = True
        turn_time = self._turn_time(now)
        self._tally(turn_time)
        return self._dedupe(decisions + turn_time)

    def _count_ids_only(self, steps: Sequence[Sequence[HistoryCall]], turn_start: int) -> None:
        """Detection off: still tell the budget which history calls are new (limits stay on)."""
        self.new_history_calls = 0
        for k, step in enumerate(steps):
            for call_id, name, args in step:
                first = self._first_sight(call_id, name, args)
                if first is not None and not first[1] and (k >= turn_start or self._history_seen):
                    self.new_history_calls += 1
        self._history_seen = True

    def _first_sight(self, call_id: str, name: str, args: Any) -> tuple[str, bool] | None:
        """A history call not seen before: (its signature, whether an MCP call already counted it).

        None when the call id was seen in an earlier request (histories repeat every call).
        """
        if call_id in self._seen_ids:
            return None
        self._seen_ids.add(call_id)
        sig = signature(name, args)
        if self._mcp_unclaimed[sig] > 0:
            self._mcp_unclaimed[sig] -= 1
            return sig, True
        return sig, False

    # -- AgentDbg cycle --------------------------------------------------------------------------

    def observe_event(self, event_type: str, name: str, event_id: str) -> Decision | None:
        """After an event is recorded: AgentDbg's cycle over `window` event signatures."""
        if not self.config.enabled:
            return None
        if event_type in ("LLM_CALL", "TOOL_CALL"):
            sig = f"{event_type}:{name or 'UNKNOWN'}"
        else:
            sig = event_type
        self._window.append((sig, event_id))
        return self._cycle()

    def _cycle(self) -> Decision | None:
        cfg = self.config
        items = list(self._window)
        n, k = len(items), cfg.repetitions
        sigs = [s for s, _ in items]
        for m in range(1, n // k + 1):
            tail = sigs[-m * k :]
            block = tail[:m]
            if any(tail[i * m : (i + 1) * m] != block for i in range(k)):
                continue
            reps = k  # how many times the block repeats back to back at the end of the window
            while (reps + 1) * m <= n and sigs[-(reps + 1) * m : -reps * m] == block:
                reps += 1
            pattern = " -> ".join(block)
            evidence = tuple(e for _, e in items[-m * reps :])
            terminate = cfg.stop_on_loop and reps >= cfg.stop_on_loop_min_repetitions
            key = f"{pattern}|{'stop' if terminate else k}"
            if key in self._cycle_reported:
                # one LOOP_WARNING per distinct pattern per run; a stop already ended the session
                # (calls still in flight extend the same cycle: not another ERROR each)
                return None
            self._cycle_reported.add(key)
            decision = Decision(
                Action.TERMINATE if terminate else Action.WARN,
                "stop_on_loop" if terminate else GUARD,
                f"the run repeats {pattern!r} {reps} times in its last {n} events",
                threshold=cfg.stop_on_loop_min_repetitions if terminate else k,
                actual=reps,
                kind="cycle",
                pattern=pattern[:PATTERN_CHARS],
                repetitions=reps if terminate else k,
                window_size=n,
                evidence=evidence,
                tags=(TAG_LOOP, TAG_TERMINATED) if terminate else (TAG_LOOP,),
            )
            self._tally([decision])
            return decision
        return None

    # -- the shared counting ---------------------------------------------------------------------

    def _new_turn(self, now: float) -> None:
        self.turn += 1
        self.turn_started_at = now
        self.turn_counts.clear()
        self._turn_ids = set()

    def _count_call(self, sig: str, tool: str, evidence: str | None) -> list[Decision]:
        """One more attempt: the patterns that fire on it, before it is forwarded."""
        prev = self._seq[-1].sig if self._seq else None
        self._index += 1
        self._seq.append(_Occurrence(sig, tool, evidence))
        self._run_len = self._run_len + 1 if sig == prev else 1
        for m in self._periodic:
            if self._index >= m and self._seq[-1 - m].sig == sig:
                self._periodic[m] += 1
            else:
                self._periodic[m] = min(self._index + 1, m)
        self.turn_counts[tool] += 1
        self.tool_totals[tool] += 1

        out = [d for d in (self._repetition(), self._ping_pong()) if d is not None]
        out += self._per_tool(tool)
        out += self._pending_results(sig, tool)
        return out

    def _evidence(self, count: int) -> tuple[str, ...]:
        tail = list(self._seq)[-min(count, MAX_EVIDENCE) :]
        return tuple(o.evidence for o in tail if o.evidence)

    def _loop(self, kind: str, key: Any, action: Action, message: str, **kw: Any) -> Decision:
        new = key not in self._reported
        self._reported.add(key)
        tags = (TAG_LOOP, TAG_TERMINATED) if action is Action.TERMINATE else (TAG_LOOP,)
        pattern = kw.pop("pattern")
        return Decision(
            action,
            GUARD,
            message,
            kind=kind,
            pattern=pattern[:PATTERN_CHARS],
            new_finding=new,
            tags=tags,
            **kw,
        )

    def _repetition(self) -> Decision | None:
        t = self.config.threshold
        if self._run_len < t:
            return None
        sig = self._seq[-1].sig
        return self._loop(
            "repetition",
            ("repetition", self._index - self._run_len + 1),
            _ACTIONS[self.config.action],
            f"{self._seq[-1].tool} was called {self._run_len} times in a row with the same arguments",
            pattern=sig,
            threshold=t,
            actual=self._run_len,
            repetitions=self._run_len,
            window_size=self._run_len,
            evidence=self._evidence(self._run_len),
        )

    def _ping_pong(self) -> Decision | None:
        t = self.config.threshold
        for m, length in self._periodic.items():
            if length < 2 * m or length < t:
                continue
            block = [o.sig for o in list(self._seq)[-m:]]
            if len(set(block)) != m:
                continue
            start = self._index - length + 1
            block = [o.sig for o in list(self._seq)[-length:][:m]]  # in the order the cycle began
            tools = " -> ".join(normalize_tool_name(s.split("(", 1)[0]) for s in block)
            return self._loop(
                "ping_pong",
                ("ping_pong", m, start),
                _ACTIONS[self.config.action],
                f"the calls {tools} repeat as a cycle ({length} calls, {length // m} rounds)",
                pattern=" -> ".join(block),
                threshold=t,
                actual=length,
                repetitions=length // m,
                window_size=length,
                evidence=self._evidence(length),
            )
        return None

    def _per_tool(self, tool: str) -> list[Decision]:
        kind = classify_tool(tool, self.config)
        warn, block, halt = self.config.idempotent if kind == "idempotent" else self.config.mutating
        count = self.turn_counts[tool]
        if count >= halt:
            action, limit = Action.TERMINATE, halt
        elif count >= block:
            action, limit = Action.BLOCK, block
        elif count >= warn:
            action, limit = Action.WARN, warn
        else:
            return []
        return [
            self._loop(
                "per_tool",
                ("per_tool", self.turn, tool, action),
                action,
                f"{kind} tool {tool} was called {count} times in this turn",
                pattern=tool,
                threshold=limit,
                actual=count,
                repetitions=count,
                window_size=count,
                evidence=self._evidence_of(tool, count),
            )
        ]

    def _evidence_of(self, tool: str, count: int) -> tuple[str, ...]:
        picked = [o.evidence for o in reversed(self._seq) if o.tool == tool and o.evidence]
        return tuple(reversed(picked[: min(count, MAX_EVIDENCE)]))

    def _pending_results(self, sig: str, tool: str) -> list[Decision]:
        """Result-dependent patterns: the T-th identical attempt after T-1 identical results."""
        out: list[Decision] = []
        cfg = self.config
        f = self._fail
        if f.key is not None and f.key[0] == tool and f.count + 1 >= cfg.threshold:
            out.append(
                self._loop(
                    "retry_no_progress",
                    ("retry_no_progress", f.serial),
                    _ACTIONS[cfg.action],
                    f"{tool} failed {f.count} times in a row with the same error: {f.key[1]}",
                    pattern=f"{tool}: {f.key[1]}",
                    threshold=cfg.threshold,
                    actual=f.count + 1,
                    repetitions=f.count + 1,
                    window_size=f.count + 1,
                    evidence=tuple(f.evidence[-MAX_EVIDENCE:]),
                )
            )
        r = self._results.get(sig)
        if r is not None:
            attempt = r.count + 1
            if attempt >= cfg.no_progress_halt:
                action, limit = Action.TERMINATE, cfg.no_progress_halt
            elif attempt >= cfg.no_progress_warn:
                action, limit = Action.WARN, cfg.no_progress_warn
            else:
                return out
            out.append(
                self._loop(
                    "no_progress",
                    ("no_progress", r.serial, action),
                    action,
                    f"{tool} returned the same result {r.count} times in a row",
                    pattern=sig,
                    threshold=limit,
                    actual=attempt,
                    repetitions=attempt,
                    window_size=attempt,
                    evidence=tuple(r.evidence[-MAX_EVIDENCE:]),
                )
            )
        return out

    def _record_result(
        self, sig: str, tool: str, fingerprint: str, error: str | None, evidence: str | None
    ) -> None:
        if error is None:
            self._fail = _Streak(key=None)
        elif self._fail.key == (tool, error):
            self._fail.count += 1
        else:
            self._serial += 1
            self._fail = _Streak(key=(tool, error), count=1, serial=self._serial)
        if error is not None and evidence:
            self._fail.evidence.append(evidence)
        r = self._results.get(sig)
        if r is not None and r.key == fingerprint:
            r.count += 1
        else:
            self._serial += 1
            r = self._results[sig] = _Streak(key=fingerprint, count=1, serial=self._serial)
        if evidence:
            r.evidence.append(evidence)

    def _identical_step(self, steps: Sequence[Sequence[HistoryCall]], turn_start: int) -> list[Decision]:
        """003's guard: the same set of calls in consecutive assistant steps of this turn."""
        limit = self.config.max_repeated_tool_steps
        turn = list(steps[turn_start:])
        if not turn or not turn[-1]:
            return []
        keys = [tuple(sorted(self._id_sig.get(c[0]) or signature(c[1], c[2]) for c in step)) for step in turn]
        run = 1
        while run < len(keys) and keys[-1 - run] == keys[-1]:
            run += 1
        repeated = run - 1
        if repeated < limit:
            return []
        first_step = turn[len(turn) - run]
        ids = tuple(c[0] for step in turn[-run:] for c in step)
        return [
            self._loop(
                "identical_step",
                ("identical_step", first_step[0][0]),
                _ACTIONS[self.config.action],
                f"the same tool calls were repeated in {run} consecutive steps",
                pattern=" + ".join(keys[-1]),
                threshold=limit,
                actual=repeated,
                repetitions=run,
                window_size=run,
                evidence=ids[-MAX_EVIDENCE:],
            )
        ]

    def _turn_time(self, now: float) -> list[Decision]:
        """Loop Guard's max_time_per_turn, for turns the conversation history shows."""
        limit = self.config.max_time_per_turn
        if limit is None or not self._llm_seen or self.turn_started_at is None:
            return []
        elapsed = now - self.turn_started_at
        if elapsed <= limit:
            return []
        d = Decision(
            Action.BLOCK,
            "max_time_per_turn",
            f"this turn has run {elapsed:.3g}s, longer than {limit:g}s",
            threshold=limit,
            actual=round(elapsed, 3),
        )
        return [d]

    def _finish(self, decisions: list[Decision]) -> list[Decision]:
        decisions = self._dedupe(decisions)
        self._tally(decisions)
        return decisions

    @staticmethod
    def _dedupe(decisions: Iterable[Decision]) -> list[Decision]:
        """One decision per streak when a request carries several calls of it: the latest, strictest."""
        best: dict[tuple[Any, ...], Decision] = {}
        order: list[tuple[Any, ...]] = []
        for d in decisions:
            key = (d.kind, d.guard, d.pattern)
            old = best.get(key)
            if old is None:
                order.append(key)
                best[key] = d
            elif d.action >= old.action:
                best[key] = replace(d, new_finding=d.new_finding or old.new_finding)
        return [best[k] for k in order]

    def _tally(self, decisions: Iterable[Decision]) -> None:
        for d in decisions:
            self.decision_counts[f"{d.kind or d.guard}:{d.action.name.lower()}"] += 1

    def stats(self, now: float | None = None) -> dict[str, Any]:
        """Loop Guard's get_stats(): per-tool counts, the current turn, decisions so far."""
        out: dict[str, Any] = {
            "turn": self.turn,
            "turn_tool_counts": dict(self.turn_counts),
            "tool_counts": dict(self.tool_totals),
            "decisions": dict(self.decision_counts),
            "tool_calls_seen": self._index + 1,
        }
        if now is not None and self.turn_started_at is not None:
            out["turn_elapsed_s"] = round(now - self.turn_started_at, 3)
        return out
