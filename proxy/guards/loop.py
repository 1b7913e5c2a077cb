"""Loop detection for one session (SPEC §5.1): progress, not counts.

A call's *identity* is its tool and arguments without per-call noise (`stable_signature`: no request
ids, nonces, timestamps, counters); its result is a fingerprint without such noise. Then:

- a call is *stale* when, by the time it was made, the same identity had already come back in this
  turn and so had its result from that tool; every other call makes progress (a new call, or a
  known call with something new to say: a test run whose failure changed);
- *news* is an answer that made progress and did not fail; a stale call counts as *without
  progress* unless news came back since that identity's last answer (checking again after
  something happened is not a loop: the write-then-check, the poll with a sleep between).

"By the time it was made" means among the answers that had come back when it started, so the
calls of one step (one assistant message, or MCP calls in flight together) never count against each
other: a fan-out is not a repetition. A new user turn (MCP-only: a pause over `turn_gap_s`) starts
from nothing.

The patterns, each judged on the attempt before it is forwarded (so an MCP call can be refused):
- repetition (m = 1) and ping_pong (cycles of m = 2..5 calls): the turn's last calls repeat a block
  of m, and every call after the block's first round was stale; fires once that run spans
  max(threshold, 2m) calls, so a loop of k calls a round is caught within max(threshold + 1, 2k);
- no_progress (Loop Guard's poll): the same call came back with the same result, without
  progress, `no_progress_warn` - 1 times in a row: the next attempt warns (`no_progress_halt` ends);
- retry_no_progress: the same tool failed with the same error `threshold` - 1 times in a row, with
  no news since (whatever the arguments: a failure changes nothing and teaches nothing new);
- per_tool: a tool's calls without progress in the turn reach 5/8/12 (idempotent) or 3/5/7
  (mutating) -> warn/block/terminate; `per_tool_mode: count` counts every call, as Loop Guard;
- identical_step: the same set of calls in consecutive assistant steps, each stale;
- cycle (AgentDbg, opt-in `agentdbg_cycle`): name-only event signatures over a window.
An attempt whose identity has come back before, with no news since, is presumed stale: its own
result is not known yet ("the T-th attempt after T-1 results without progress").

Tool calls reach the detector two ways and count once: MCP `check_tool_call()` then
`record_tool_result()`; function-calling tools in an LLM request's history, `check_llm_history()`
(each `tool_call_id` once; a call already seen as MCP is not counted again).

Pure: no I/O, no asyncio, the monotonic clock passed in as `now`.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.constants import (
    GUARD_LOOP_DETECTION,
    GUARD_MAX_TIME_PER_TURN,
    GUARD_STOP_ON_LOOP,
    TAG_LOOP_DETECTED,
    TAG_TERMINATED,
    EventType,
)
from proxy.guards.config import LoopDetectionConfig
from proxy.guards.decision import Action, Decision
from proxy.guards.signatures import (
    call_keys,
    content_text,
    error_fingerprint,
    normalize_tool_name,
    result_fingerprint,
)
from proxy.guards.volatile import same_or_counted

PATTERN_CHARS = 80
MAX_EVIDENCE = 50
MAX_CYCLE_PERIOD = 5
HISTORY = 64  # a turn's last attempts kept for cycles and evidence
MAX_TURN_KEYS = 8192  # identities / results remembered per turn (forgetting only makes calls look new)

IDEMPOTENT_WORDS = (
    "read", "get", "list", "search", "status", "fetch", "query", "check", "find", "lookup", "view",
    "show", "describe", "inspect", "count", "test", "lint", "verify", "validate", "diff", "poll",
    "wait", "sleep", "ping", "health", "browse", "open", "load", "download", "scan",
)  # fmt: skip
MUTATING_WORDS = ("write", "edit", "delete", "execute", "shell", "commit", "push", "insert", "install")
# Well-known names the word heuristic would misplace (Loop Guard ships similar lists): read-only
# shell and git commands, and code runners whose names carry none of the words above.
KNOWN_IDEMPOTENT = frozenset(
    "grep glob ls cat head tail find pwd which whoami date git_log git_diff git_show git_branch"
    " git_status view describe help".split()
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


def call_tuple(call: Any) -> tuple[str, str, Any]:
    if isinstance(call, tuple | list):
        return str(call[0]), str(call[1]), call[2]
    return str(call.id), str(call.name), call.arguments


class _LazyResults(Mapping[str, tuple[str, str | None]]):
    """tool_call_id -> (fingerprint, error text when is_error), each computed when first asked for.

    A request carries every tool result of its history, and only the results of calls not seen
    before are looked at: fingerprinting all of them on every call made a session's cost grow with
    its history (80% of the time per call at 400 steps, docs/benchmarks.md).
    """

    def __init__(self, results: Iterable[Any], index: dict[str, Any] | None = None) -> None:
        # the last result of an id wins
        self._results = index if index is not None else {str(r.tool_call_id): r for r in results}
        self._done: dict[str, tuple[str, str | None]] = {}

    def __getitem__(self, call_id: str) -> tuple[str, str | None]:
        found = self._done.get(call_id)
        if found is None:
            r = self._results[call_id]
            error = content_text(r.content) or "error" if getattr(r, "is_error", False) else None
            found = self._done[call_id] = (result_fingerprint(r.content), error)
        return found

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._results

    def __iter__(self) -> Iterator[str]:
        return iter(self._results)

    def __len__(self) -> int:
        return len(self._results)


def results_map(results: HistoryResults) -> Mapping[str, tuple[str, str | None]]:
    """ToolResult objects -> (fingerprint, error text when is_error) by tool_call_id, computed lazily."""
    if type(results) is not list and isinstance(results, Mapping):  # a list is the usual case: no ABC check
        return results
    # ToolResult-like objects (mypy does not drop the parameterised Mapping from the union above)
    items: Iterable[Any] = results
    return _LazyResults(items)


def results_from_index(index: dict[str, Any]) -> Mapping[str, tuple[str, str | None]]:
    """`results_map` of a request's results already indexed by tool_call_id, the last of an id
    (dialects.base.ParseState.results_by_id): read-only, fingerprints computed when asked for."""
    return _LazyResults((), index)


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
    place is treated as mutating, as Loop Guard does (the stricter side for escalation counts).
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


@dataclass(slots=True)
class _Read:
    """The history `check_llm_history` read last, named by its caller (`reading`).

    After reading it, every call id of its `steps` is in `_seen_ids` (so reading them again changes
    nothing), and, when it was judged (`judged`, detection on), the turn's call ids hold none of the
    calls before `turn_start` (a new user turn would start a new one) and `inside` says whether the
    turn had a call. A history that goes on from it with the same `turn_start` keeps all of that.
    """

    token: object
    steps: int
    turn_start: int
    inside: bool
    enabled: bool


@dataclass(eq=False)
class _Attempt:
    """One tool call of the turn: what was known when it was made, and (once back) its staleness."""

    ident: str  # stable signature: the call without per-call noise
    sig: str  # exact canonical signature (MCP results are matched back by it)
    tool: str  # bare tool name
    evidence: str | None  # event id when known, else the tool_call_id
    index: int  # its number in the turn, from 0
    known: int  # answers of the turn that had come back when it was made
    seen: bool  # the same identity had come back before it was made
    changed: bool  # news came back after that identity's last answer (by epoch)
    stale: bool | None = None  # None while in flight; refused attempts are stale

    @property
    def presumed_stale(self) -> bool:
        """Judged before its result: the same call again, with no news since."""
        return self.seen and not self.changed


@dataclass
class _Streak:
    """Consecutive identical results (or failures) of one identity, numbered for one warning each."""

    key: Any
    count: int
    serial: int
    evidence: list[str] = field(default_factory=list)
    at: int = 0  # the turn's answer epoch of its latest member
    text: str = ""  # what the streak repeats, as a message can show it


class _Turn:
    """Everything progress is measured against: it starts from nothing at each user turn."""

    def __init__(self, number: int, started_at: float | None) -> None:
        self.number = number
        self.started_at = started_at
        self.attempts: deque[_Attempt] = deque(maxlen=HISTORY)
        self.count = 0  # attempts so far
        self.serial = 0  # answers so far
        self.answered: dict[str, int] = {}  # identity -> serial of its first answer
        # "after" is by epoch, the answers a call had seen when it was made: the calls of one step
        # share it, so a fan-out's answers are never news to each other
        self.last_answer: dict[str, int] = {}  # identity -> epoch of its latest answer
        self.results: dict[tuple[str, str], int] = {}  # (tool, fingerprint) -> first serial
        self.last_news = -1  # epoch of the last answer that was progress and no failure
        self.no_progress: Counter[str] = Counter()  # tool -> calls without progress
        self.calls: Counter[str] = Counter()  # tool -> every attempt
        self.same: dict[str, _Streak] = {}  # identity -> identical results in a row
        self.fails: dict[str, _Streak] = {}  # tool -> identical failures in a row
        self.pending: dict[str, list[_Attempt]] = {}  # exact signature -> MCP calls in flight
        self.periodic = dict.fromkeys(range(1, MAX_CYCLE_PERIOD + 1), 0)
        self.ids: set[str] = set()  # tool_call_ids of this turn
        # (tool, hash of a result's text without its counters) -> (its counters, the fingerprint it
        # is known by): a counter that went up by one does not make a result new
        self.counted: dict[tuple[str, str], tuple[list[int], str]] = {}

    def same_as(self, tool: str, fingerprint: str) -> str:
        """The fingerprint a result (or error) is known by in this turn: the tool's earlier result's
        when its text is that one's and each of its counters the same or one more ("attempt 3" after
        "attempt 2", SPEC §5.1); its own otherwise (a counter that jumped, or any other change).

        `fingerprint` is `signatures.slotted`'s: `<hash>` or `<hash of the text>|n|n...`.
        """
        skeleton, sep, rest = fingerprint.partition("|")
        if not sep:
            return fingerprint
        try:
            numbers = [int(n) for n in rest.split("|")]
        except ValueError:  # not one of ours (a replayed trace of another version): compared whole
            return fingerprint
        earlier = self.counted.get((tool, skeleton))
        known = earlier[1] if earlier is not None and same_or_counted(earlier[0], numbers) else fingerprint
        self.counted[(tool, skeleton)] = (numbers, known)
        return known

    @property
    def pristine(self) -> bool:
        """No attempt, answer or claimed call yet: every container is still as built."""
        return self.count == 0 and self.serial == 0 and not self.ids

    def forget_if_large(self) -> None:
        if (
            len(self.answered) > MAX_TURN_KEYS
            or len(self.results) > MAX_TURN_KEYS
            or len(self.counted) > MAX_TURN_KEYS
        ):
            self.counted.clear()
            self.answered.clear()
            self.last_answer.clear()
            self.results.clear()
            self.same.clear()
            self.fails.clear()


class LoopDetector:
    """All loop patterns of one session."""

    def __init__(self, config: LoopDetectionConfig) -> None:
        self.config = config
        self._serial = 0  # numbers streaks, so each writes one LOOP_WARNING
        self._reported: set[Any] = set()  # streak keys that already wrote their LOOP_WARNING
        self._turn = _Turn(0, None)
        self._last_mcp_at: float | None = None
        self._llm_seen = False
        # function-calling bookkeeping
        self._seen_ids: set[str] = set()
        self._by_id: dict[str, _Attempt] = {}
        self._mcp_unclaimed: Counter[str] = Counter()
        self._answers: dict[tuple[str, ...], list[Decision]] = {}  # last request's decisions
        self._event_ids: Mapping[str, str] | None = None  # tool_call_id -> TOOL_CALL event id
        self.new_history_calls = 0  # counted by the last check_llm_history (not seen as MCP)
        self._history_seen = False  # a request's history was read before (later unseen ids are new)
        self._read: _Read | None = None  # the history read last, when its caller named it
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

    # the turn, as the session's stats and turn-time limit read it
    @property
    def turn(self) -> int:
        return self._turn.number

    @property
    def turn_started_at(self) -> float | None:
        return self._turn.started_at

    @property
    def turn_counts(self) -> Counter[str]:
        return self._turn.calls

    # -- MCP tool calls --------------------------------------------------------------------------

    def check_tool_call(
        self,
        tool: str,
        args: Any,
        now: float,
        *,
        server: str | None = None,
        evidence: str | None = None,
        enforced: bool = True,
    ) -> list[Decision]:
        """Before forwarding an MCP `tools/call`: the attempt counts (even when refused).

        `args` may be the call's recorded `Fingerprinted` arguments (replay). `enforced` False
        (shadow mode): a refusal is only recorded, the call goes on and its result will come.
        """
        sig, ident = call_keys(tool, args)
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
        attempt = self._attempt(tool, sig, ident, evidence)
        self._turn.pending.setdefault(sig, []).append(attempt)
        decisions = self._judge(attempt) + self._turn_time(now)
        decisions = self._finish(decisions)
        if enforced and any(d.action >= Action.BLOCK for d in decisions):
            self._refused(attempt)
        return decisions

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
        """After an MCP call answered: whether it made progress, for the patterns that follow."""
        self._last_mcp_at = now  # the pause that ends an MCP-only turn runs from the last activity
        waiting = self._turn.pending.get(call_keys(tool, args)[0])
        if not waiting:
            return  # detection off when it was made, or a turn began since: nothing to measure against
        attempt = waiting.pop(0)
        if not waiting:
            del self._turn.pending[attempt.sig]
        if event_id is not None:
            attempt.evidence = event_id
        known = self._turn.same_as(attempt.tool, result_fingerprint)
        self._resolve(attempt, known, error)
        self._apply(attempt, known, error)

    # -- function-calling tools in an LLM request's history ---------------------------------------

    def check_llm_history(
        self,
        steps: Sequence[Sequence[HistoryCall]],
        turn_start: int,
        tool_results: HistoryResults,
        now: float,
        event_ids: Mapping[str, str] | None = None,
        *,
        reading: object = None,
        read_from: object = None,
    ) -> list[Decision]:
        """Before forwarding an LLM request: the tool calls its history holds, new ones counted once.

        `steps` are the assistant steps (oldest first), `turn_start` the index of the first step
        after the last real user message, `tool_results` maps tool_call_id -> (fingerprint, error)
        for the results the request carries. Sending the same history again gives the same answer.
        `event_ids` maps tool_call_id -> the id of its TOOL_CALL event, for the evidence of a
        LOOP_WARNING (a call without one is left out); without it the evidence is tool_call_ids.

        `reading` names this history (any object, compared by identity) and `read_from` the one it
        goes on from, when the caller knows: its first steps are that history's, unchanged (the
        dialect read it on from there). If that is the history this detector read last, only the
        steps after it are read; the decisions are the same as reading the whole.
        """
        self._event_ids = event_ids
        enabled = self.config.enabled
        if not steps:
            # a history without an assistant step (a plain chat call): no call to count or judge, a
            # turn without calls (renumbered when detection is on), and no turn time spent in it yet
            self.new_history_calls = 0
            if enabled:
                self._llm_seen = True
                self._new_turn(now)
            self._history_seen = True
            self._read = _Read(reading, 0, 0, False, enabled)
            return []
        turn_start = max(0, min(turn_start, len(steps)))
        # what this detector read last (see `_Read`): when this history goes on from it with the
        # same turn, every call of its first steps is one already seen, and nothing about the turn
        # changes but what the new steps bring; those steps alone are read
        last, self._read = self._read, None
        start = 0
        if (
            last is not None
            and read_from is not None
            and read_from is last.token
            and last.steps <= len(steps)
            and (not enabled or (last.enabled and last.turn_start == turn_start))
        ):
            start = last.steps
        new_steps = [[call_tuple(c) for c in step] for step in (steps[start:] if start else steps)]
        tool_results = results_map(tool_results)
        if not enabled:
            self._count_ids_only(new_steps, turn_start, start)
            self._read = _Read(reading, len(steps), turn_start, False, False)
            return []
        self._llm_seen = True
        if start:
            inside = last is not None and last.inside or any(new_steps)
            if not inside or self._turn.started_at is None:
                self._new_turn(now)
        else:
            inside_ids = [c[0] for step in new_steps[turn_start:] for c in step]
            before = [c[0] for step in new_steps[:turn_start] for c in step]
            inside = bool(inside_ids)
            if not inside or self._turn.ids.intersection(before) or self._turn.started_at is None:
                self._new_turn(now)

        decisions: list[Decision] = []
        new_calls = 0
        self.new_history_calls = 0
        for k, step in enumerate(new_steps, start):
            made: list[tuple[_Attempt, tuple[str, str | None] | None]] = []
            for call_id, name, args in step:
                first = self._first_sight(call_id, name, args)
                if first is None:
                    continue
                sig, claimed_by_mcp = first
                new_calls += 1
                if claimed_by_mcp:  # already counted as the MCP call it was
                    if k >= turn_start:
                        self._turn.ids.add(call_id)
                    continue
                if k < turn_start:
                    # an earlier turn: not judged now; a call Tripwire never saw before, in a
                    # history it has seen, came after it joined (its result sent along with the
                    # next user message): a tool call of the session all the same (limits)
                    self.new_history_calls += int(self._history_seen)
                    continue
                self._turn.ids.add(call_id)
                self.new_history_calls += 1
                attempt = self._attempt(name, sig, call_keys(name, args)[1], self._evidence_id(call_id))
                self._by_id[call_id] = attempt
                decisions += self._judge(attempt)
                result = tool_results.get(call_id)
                if result is not None:
                    result = (self._turn.same_as(attempt.tool, result[0]), result[1])
                    self._resolve(attempt, *result)  # known now: the step's next calls see it
                made.append((attempt, result))
            # the calls of one step were made together: what they returned counts from the next step
            for attempt, result in made:
                if result is not None:
                    self._apply(attempt, *result)

        # the request's shape: the same history sent again gets the same answer
        last_ids = (str(turn_start), str(len(steps)), *(call_tuple(c)[0] for c in steps[-1])) if steps else ()
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
        self._read = _Read(reading, len(steps), turn_start, inside, True)
        return self._dedupe(decisions + turn_time)

    def _evidence_id(self, call_id: str) -> str | None:
        return call_id if self._event_ids is None else self._event_ids.get(call_id)

    def _count_ids_only(
        self, steps: Sequence[Sequence[HistoryCall]], turn_start: int, start: int = 0
    ) -> None:
        """Detection off: still tell the budget which history calls are new (limits stay on).
        `steps` are the history's from index `start` on."""
        self.new_history_calls = 0
        for k, step in enumerate(steps, start):
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
        sig = call_keys(name, args)[0]
        if self._mcp_unclaimed[sig] > 0:
            self._mcp_unclaimed[sig] -= 1
            return sig, True
        return sig, False

    # -- AgentDbg cycle --------------------------------------------------------------------------

    def observe_event(self, event_type: str, name: str, event_id: str) -> Decision | None:
        """After an event is recorded: AgentDbg's cycle over `window` event signatures (opt-in)."""
        if not self.config.enabled or not self.config.agentdbg_cycle:
            return None
        if event_type in (EventType.LLM_CALL, EventType.TOOL_CALL):
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
                GUARD_STOP_ON_LOOP if terminate else GUARD_LOOP_DETECTION,
                f"the run repeats {pattern!r} {reps} times in its last {n} events",
                threshold=cfg.stop_on_loop_min_repetitions if terminate else k,
                actual=reps,
                kind="cycle",
                pattern=pattern[:PATTERN_CHARS],
                repetitions=reps if terminate else k,
                window_size=n,
                evidence=evidence,
                tags=(TAG_LOOP_DETECTED, TAG_TERMINATED) if terminate else (TAG_LOOP_DETECTED,),
            )
            self._tally([decision])
            return decision
        return None

    # -- attempts and their results --------------------------------------------------------------

    def _new_turn(self, now: float) -> None:
        t = self._turn
        if t.pristine:  # nothing happened in it: the next turn is the same empty one, renumbered
            t.number += 1
            t.started_at = now
            return
        self._turn = _Turn(t.number + 1, now)

    def _attempt(self, tool: str, sig: str, ident: str, evidence: str | None) -> _Attempt:
        """One more call of the turn, with what was known when it was made."""
        t = self._turn
        bare = normalize_tool_name(tool)
        last = t.last_answer.get(ident)
        attempt = _Attempt(
            ident=ident,
            sig=sig,
            tool=bare,
            evidence=evidence,
            index=t.count,
            known=t.serial,
            seen=last is not None,
            changed=last is not None and t.last_news > last,
        )
        for m in t.periodic:
            if t.count >= m and len(t.attempts) >= m and t.attempts[-m].ident == ident:
                t.periodic[m] += 1
            else:
                t.periodic[m] = min(t.count + 1, m)
        t.count += 1
        t.attempts.append(attempt)
        t.calls[bare] += 1
        self.tool_totals[bare] += 1
        return attempt

    def _resolve(self, attempt: _Attempt, fingerprint: str, error: str | None) -> None:
        """Stale: the same call had come back, and so had this result, before it was made."""
        first = self._turn.results.get((attempt.tool, fingerprint))
        attempt.stale = attempt.seen and first is not None and first <= attempt.known

    def _apply(self, attempt: _Attempt, fingerprint: str, error: str | None) -> None:
        """What the answer teaches the turn: news (progress that did not fail), the results each tool
        has returned, and the streaks of identical answers."""
        t = self._turn
        t.serial += 1
        epoch = attempt.known
        ident = attempt.ident
        no_progress = bool(attempt.stale) and not attempt.changed
        t.answered.setdefault(ident, t.serial)
        t.last_answer[ident] = epoch
        t.results.setdefault((attempt.tool, fingerprint), t.serial)
        if not attempt.stale and error is None:
            t.last_news = max(t.last_news, epoch)
        if no_progress:
            t.no_progress[attempt.tool] += 1
        same = t.same.get(ident)
        if no_progress and same is not None and same.key == fingerprint:
            same.count += 1
        else:
            same = t.same[ident] = _Streak(fingerprint, 1, self._next_serial())
        if attempt.evidence:
            same.evidence.append(attempt.evidence)
        if error is None:
            t.fails.pop(attempt.tool, None)
        else:
            # a failure is no progress whatever its arguments: nothing changed, nothing was learned
            key = t.same_as(f"{attempt.tool}\x00error", error_fingerprint(error) or "")
            fail = t.fails.get(attempt.tool)
            if fail is not None and fail.key == key and t.last_news <= fail.at:
                fail.count += 1
            else:
                fail = t.fails[attempt.tool] = _Streak(key, 1, self._next_serial(), text=error)
            fail.at = epoch
            if attempt.evidence:
                fail.evidence.append(attempt.evidence)
        t.forget_if_large()

    def _refused(self, attempt: _Attempt) -> None:
        """A refused MCP call never ran: it learned nothing, and the streak it belongs to goes on."""
        attempt.stale = True
        waiting = self._turn.pending.get(attempt.sig)
        if waiting and attempt in waiting:
            waiting.remove(attempt)
            if not waiting:
                del self._turn.pending[attempt.sig]
        self._turn.no_progress[attempt.tool] += 1

    def _next_serial(self) -> int:
        self._serial += 1
        return self._serial

    # -- the patterns ----------------------------------------------------------------------------

    def _judge(self, attempt: _Attempt) -> list[Decision]:
        """The patterns that fire on this attempt, before it is forwarded."""
        out = [d for d in (self._periodic(attempt),) if d is not None]
        if attempt.presumed_stale:
            out += self._no_progress(attempt)
        out += self._retry(attempt)
        out += self._per_tool(attempt)
        return out

    def _trailing_stale(self) -> int:
        """How many calls before the current one, back from it, came back stale (or were refused)."""
        n = 0
        attempts = self._turn.attempts
        for i in range(len(attempts) - 2, -1, -1):
            a = attempts[i]
            # in flight (an MCP fan-out): the same call again is presumed stale, as it is judged
            if not (a.stale or (a.stale is None and a.seen)):
                break
            n += 1
        return n

    def _periodic(self, attempt: _Attempt) -> Decision | None:
        """Repetition (m = 1) and cycles of m = 2..5 calls: the turn's tail repeats a block of m
        calls, and every call after the block's first round came back stale."""
        t = self._turn
        threshold = self.config.threshold
        stale_run: int | None = None
        for m, periodic_len in t.periodic.items():
            need = max(threshold, 2 * m)
            if periodic_len < need:
                continue
            if stale_run is None:
                stale_run = self._trailing_stale()
            length = min(periodic_len, stale_run + m + 1, len(t.attempts))
            if length < need:
                continue
            tail = list(t.attempts)[-length:]
            block = [a.ident for a in tail[:m]]  # in the order the loop began
            if m > 1 and any(
                all(block[i] == block[i % p] for i in range(m)) for p in range(1, m) if m % p == 0
            ):
                continue  # a shorter period repeats: that one is the loop
            start = attempt.index - length + 1
            evidence = tuple(a.evidence for a in tail[-MAX_EVIDENCE:] if a.evidence)
            if m == 1:
                return self._loop(
                    "repetition",
                    ("repetition", t.number, start),
                    _ACTIONS[self.config.action],
                    f"{attempt.tool} was called {length} times in a row with the same arguments"
                    " and nothing new came back",
                    pattern=attempt.sig,
                    threshold=threshold,
                    actual=length,
                    repetitions=length,
                    window_size=length,
                    evidence=evidence,
                )
            tools = " -> ".join(a.tool for a in tail[:m])
            return self._loop(
                "ping_pong",
                ("ping_pong", t.number, m, start),
                _ACTIONS[self.config.action],
                f"the calls {tools} repeat as a cycle ({length} calls, {length // m} rounds)"
                " and nothing new came back",
                pattern=" -> ".join(a.sig for a in tail[:m]),
                threshold=need,
                actual=length,
                repetitions=length // m,
                window_size=length,
                evidence=evidence,
            )
        return None

    def _no_progress(self, attempt: _Attempt) -> list[Decision]:
        """Loop Guard's poll: the same call, the same result, again and again."""
        cfg = self.config
        same = self._turn.same.get(attempt.ident)
        if same is None:
            return []
        number = same.count + 1  # this attempt's number in the streak
        if number >= cfg.no_progress_halt:
            action, limit = Action.TERMINATE, cfg.no_progress_halt
        elif number >= cfg.no_progress_warn:
            action, limit = Action.WARN, cfg.no_progress_warn
        else:
            return []
        times = "once" if same.count == 1 else f"{same.count} times in a row"
        return [
            self._loop(
                "no_progress",
                ("no_progress", same.serial, action),
                action,
                f"{attempt.tool} returned the same result {times}; this is call {number}",
                pattern=attempt.sig,
                threshold=limit,
                actual=number,
                repetitions=number,
                window_size=number,
                evidence=tuple(same.evidence[-MAX_EVIDENCE:]),
            )
        ]

    def _retry(self, attempt: _Attempt) -> list[Decision]:
        """The same tool failed with the same error threshold - 1 times in a row, and no news came
        back since: this attempt is the T-th."""
        threshold = self.config.threshold
        fail = self._turn.fails.get(attempt.tool)
        if fail is None or fail.count + 1 < threshold or self._turn.last_news > fail.at:
            return []
        return [
            self._loop(
                "retry_no_progress",
                ("retry_no_progress", fail.serial),
                _ACTIONS[self.config.action],
                f"{attempt.tool} failed {fail.count} times in a row with the same error: {fail.text}",
                pattern=f"{attempt.tool}: {fail.text}",
                threshold=threshold,
                actual=fail.count + 1,
                repetitions=fail.count + 1,
                window_size=fail.count + 1,
                evidence=tuple(fail.evidence[-MAX_EVIDENCE:]),
            )
        ]

    def _per_tool(self, attempt: _Attempt) -> list[Decision]:
        """Loop Guard's graduated escalation: by calls without progress, or every call (`count`)."""
        tool = attempt.tool
        t = self._turn
        if self.config.per_tool_mode == "count":
            count, counted = t.calls[tool], "called"
        elif attempt.presumed_stale:
            count, counted = t.no_progress[tool] + 1, "called without progress"
        else:
            return []
        kind = classify_tool(tool, self.config)
        warn, block, halt = self.config.idempotent if kind == "idempotent" else self.config.mutating
        if count >= halt:
            action, limit = Action.TERMINATE, halt
        elif count >= block:
            action, limit = Action.BLOCK, block
        elif count >= warn:
            action, limit = Action.WARN, warn
        else:
            return []
        picked = [a.evidence for a in reversed(t.attempts) if a.tool == tool and a.evidence]
        return [
            self._loop(
                "per_tool",
                ("per_tool", t.number, tool, action),
                action,
                f"{kind} tool {tool} was {counted} {count} times in this turn",
                pattern=tool,
                threshold=limit,
                actual=count,
                repetitions=count,
                window_size=count,
                evidence=tuple(reversed(picked[:MAX_EVIDENCE])),
            )
        ]

    def _identical_step(self, steps: Sequence[Sequence[HistoryCall]], turn_start: int) -> list[Decision]:
        """003's guard: the same set of calls in consecutive assistant steps of this turn, each step
        after the first of the run stale (the same calls, the same results)."""
        limit = self.config.max_repeated_tool_steps
        size = len(steps) - turn_start  # the turn's steps, read back from the last one only
        if size <= 0 or not steps[-1]:
            return []

        def step_at(back: int) -> list[tuple[str, str, Any]]:  # the turn's step `back` from the end
            return [call_tuple(c) for c in steps[len(steps) - 1 - back]]

        def key(step: Sequence[tuple[str, str, Any]]) -> tuple[str, ...]:
            return tuple(sorted(self._ident_of(c) for c in step))

        # back from the last step while the steps repeat it: a long turn is not read whole per call
        last = key(step_at(0))
        run = 1
        while run < size and key(step_at(run)) == last:
            run += 1
        repeated = run - 1
        if repeated < limit:
            return []
        turn = [step_at(back) for back in range(run - 1, -1, -1)]  # the run, oldest first
        middle = [[self._by_id.get(c[0]) for c in step] for step in turn[1:-1]]
        if not all(a is not None and a.stale for row in middle for a in row):
            return []  # something new came back on the way: the agent is getting somewhere
        first_step = turn[0]
        ids = tuple(e for step in turn for c in step if (e := self._evidence_id(c[0])))
        return [
            self._loop(
                "identical_step",
                ("identical_step", first_step[0][0]),
                _ACTIONS[self.config.action],
                f"the same tool calls were repeated in {run} consecutive steps and nothing new came back",
                pattern=" + ".join(last),
                threshold=limit,
                actual=repeated,
                repetitions=run,
                window_size=run,
                evidence=ids[-MAX_EVIDENCE:],
            )
        ]

    def _ident_of(self, call: tuple[str, str, Any]) -> str:
        attempt = self._by_id.get(call[0])
        return attempt.ident if attempt is not None else call_keys(call[1], call[2])[1]

    def _turn_time(self, now: float) -> list[Decision]:
        """Loop Guard's max_time_per_turn, for turns the conversation history shows."""
        limit = self.config.max_time_per_turn
        started = self._turn.started_at
        if limit is None or not self._llm_seen or started is None:
            return []
        elapsed = now - started
        if elapsed <= limit:
            return []
        d = Decision(
            Action.BLOCK,
            GUARD_MAX_TIME_PER_TURN,
            f"this turn has run {elapsed:.3g}s, longer than {limit:g}s",
            threshold=limit,
            actual=round(elapsed, 3),
        )
        return [d]

    # -- decisions -------------------------------------------------------------------------------

    def _loop(self, kind: str, key: Any, action: Action, message: str, **kw: Any) -> Decision:
        new = key not in self._reported
        self._reported.add(key)
        tags = (TAG_LOOP_DETECTED, TAG_TERMINATED) if action is Action.TERMINATE else (TAG_LOOP_DETECTED,)
        pattern = kw.pop("pattern")
        return Decision(
            action,
            GUARD_LOOP_DETECTION,
            message,
            kind=kind,
            pattern=pattern[:PATTERN_CHARS],
            new_finding=new,
            tags=tags,
            **kw,
        )

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
        t = self._turn
        out: dict[str, Any] = {
            "turn": t.number,
            "turn_tool_counts": dict(t.calls),
            "turn_no_progress_counts": dict(t.no_progress),
            "tool_counts": dict(self.tool_totals),
            "decisions": dict(self.decision_counts),
            "tool_calls_seen": sum(self.tool_totals.values()),
        }
        if now is not None and t.started_at is not None:
            out["turn_elapsed_s"] = round(now - t.started_at, 3)
        return out
