"""Reading an LLM request's history since last time: which of its tool calls are new, and the turn.

A request carries its whole conversation, so every call of it comes again with each request: each
`tool_call_id` counts once, and a call already counted as the MCP call it was (`mcp_call`) is not
counted again. When the caller names the history it read last (`reading` / `read_from`: the dialect
read this one on from there), only the steps after it are read. The reader only reads: the detector
judges what it found.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.guards.signatures import call_keys, content_text, result_fingerprint

# (tool_call_id, tool name, arguments), or the dialects' ToolCall (id, name, arguments)
HistoryCall = Any
# tool_call_id -> (result fingerprint, error text or None), or the dialects' ToolResult list
HistoryResults = Mapping[str, tuple[str, str | None]] | Iterable[Any]

MAX_MCP_UNCLAIMED = 10_000  # an MCP-only session never claims its calls: stay bounded


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


@dataclass(slots=True)
class _Read:
    """The history read last, named by its caller (`reading`).

    After reading it, every call id of its `steps` is seen (so reading them again changes nothing),
    and, when it was judged (`enabled`, detection on), the turn's call ids hold none of the calls
    before `turn_start` (a new user turn would start a new one) and `inside` says whether the turn
    had a call. A history that goes on from it with the same `turn_start` keeps all of that.
    """

    token: object
    steps: int
    turn_start: int
    inside: bool
    enabled: bool


@dataclass(slots=True)
class NewCall:
    """A call of the turn seen for the first time."""

    call_id: str
    name: str
    args: Any
    sig: str  # exact canonical signature
    ident: str  # stable signature: the call without per-call noise
    claimed: bool  # already counted as the MCP call it was


@dataclass(slots=True)
class Reading:
    """What one request's history brings since the history read last."""

    continued: bool  # only the steps after the history read last were read
    inside: bool  # the turn holds a call
    earlier_ids: list[str]  # (whole reads) the call ids before the turn: a turn seen before ended
    turn_steps: list[list[NewCall]]  # the turn's steps read now (oldest first), their new calls
    new_calls: int  # calls seen for the first time (MCP-claimed ones included)
    new_history_calls: int  # of those, the tool calls the budget has not counted yet
    # the names of the new calls not counted as MCP calls (tool permissions judge them)
    new_names: Sequence[str] = ()


class HistoryReader:
    """Reads each request's history on from the last: the calls not seen before, once each."""

    __slots__ = ("_seen_ids", "_mcp_unclaimed", "_history_seen", "_last")

    def __init__(self) -> None:
        # (each made at its first use: a one-call run's first request reads no tool call)
        self._seen_ids: set[str] | None = None
        self._mcp_unclaimed: Counter[str] | None = None
        self._history_seen = False  # a request's history was read before (later unseen ids are new)
        self._last: _Read | None = None  # the history read last, when its caller named it

    def mcp_call(self, sig: str) -> None:
        """An MCP call was counted: the history that shows it later does not count it again."""
        unclaimed = self._mcp_unclaimed
        if unclaimed is None:
            unclaimed = self._mcp_unclaimed = Counter()
        elif len(unclaimed) > MAX_MCP_UNCLAIMED:
            unclaimed.clear()
        unclaimed[sig] += 1

    def read(
        self,
        steps: Sequence[Sequence[HistoryCall]],
        turn_start: int,
        *,
        judged: bool,
        reading: object = None,
        read_from: object = None,
    ) -> Reading:
        """The new calls of `steps` (assistant steps, oldest first; the turn's first is `turn_start`,
        clamped). `judged` (detection on): the reading also says where the turn stands."""
        last, self._last = self._last, None
        if not steps:
            self._last = _Read(reading, 0, 0, False, judged)
            self._history_seen = True
            return Reading(False, False, [], [], 0, 0, ())
        # when this history goes on from the one read last with the same turn, every call of its
        # first steps is one already seen, and nothing about the turn changes but what the new
        # steps bring: those steps alone are read
        start = 0
        if (
            last is not None
            and read_from is not None
            and read_from is last.token
            and last.steps <= len(steps)
            and (not judged or (last.enabled and last.turn_start == turn_start))
        ):
            start = last.steps
        new_steps = [[call_tuple(c) for c in step] for step in (steps[start:] if start else steps)]
        inside = False
        earlier: list[str] = []
        if judged:
            if start:
                inside = last is not None and last.inside or any(new_steps)
            else:
                inside = any(new_steps[turn_start:])
                earlier = [c[0] for step in new_steps[:turn_start] for c in step]
        turn_steps: list[list[NewCall]] = []
        new_calls = new_history_calls = 0
        new_names: list[str] = []
        seen_ids = self._seen_ids
        if seen_ids is None:
            seen_ids = self._seen_ids = set()
        unclaimed = self._mcp_unclaimed
        for k, step in enumerate(new_steps, start):
            in_turn = k >= turn_start
            fresh: list[NewCall] = []
            for call_id, name, args in step:
                if call_id in seen_ids:
                    continue  # read in an earlier request: histories repeat every call
                seen_ids.add(call_id)
                sig, ident = call_keys(name, args)
                claimed = unclaimed is not None and unclaimed[sig] > 0
                if claimed and unclaimed is not None:
                    unclaimed[sig] -= 1
                new_calls += 1
                # a call of an earlier turn Tripwire never saw, in a history it has seen, came after
                # it joined (its result sent along with the next user message): a tool call of the
                # session all the same (limits)
                if not claimed:
                    new_names.append(name)
                    if in_turn or self._history_seen:
                        new_history_calls += 1
                if in_turn:
                    fresh.append(NewCall(call_id, name, args, sig, ident, claimed))
            if in_turn:
                turn_steps.append(fresh)
        self._history_seen = True
        self._last = _Read(reading, len(steps), turn_start, inside, judged)
        return Reading(bool(start), inside, earlier, turn_steps, new_calls, new_history_calls, new_names)
