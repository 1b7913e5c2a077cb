"""What progress is measured against in one user turn: its calls, what came back, and the streaks.

The detector records each call (`Turn.attempt`) and each answer (`resolve`, then `apply`) here; the
patterns read it. A new user turn starts a new `Turn`: progress starts from nothing.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from proxy.guards.signatures import error_fingerprint, normalize_tool_name
from proxy.guards.volatile import same_or_counted

MAX_CYCLE_PERIOD = 5
HISTORY = 64  # a turn's last attempts kept for cycles and evidence
MAX_TURN_KEYS = 8192  # identities / results remembered per turn (forgetting only makes calls look new)


@dataclass(eq=False)
class Attempt:
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
class Streak:
    """Consecutive identical results (or failures) of one identity, numbered for one warning each."""

    key: Any
    count: int
    serial: int
    evidence: list[str] = field(default_factory=list)
    at: int = 0  # the turn's answer epoch of its latest member
    text: str = ""  # what the streak repeats, as a message can show it


class Turn:
    """Everything progress is measured against: it starts from nothing at each user turn.

    `serials` numbers streaks across the session (shared by its turns), so each streak writes one
    LOOP_WARNING.
    """

    def __init__(self, number: int, started_at: float | None, serials: Iterator[int]) -> None:
        self.number = number
        self.started_at = started_at
        self._serials = serials
        self.attempts: deque[Attempt] = deque(maxlen=HISTORY)
        self.count = 0  # attempts so far
        self.serial = 0  # answers so far
        # "after" is by epoch, the answers a call had seen when it was made: the calls of one step
        # share it, so a fan-out's answers are never news to each other
        self.last_answer: dict[str, int] = {}  # identity -> epoch of its latest answer
        self.results: dict[tuple[str, str], int] = {}  # (tool, fingerprint) -> first serial
        self.last_news = -1  # epoch of the last answer that was progress and no failure
        self.no_progress: Counter[str] = Counter()  # tool -> calls without progress
        self.calls: Counter[str] = Counter()  # tool -> every attempt
        self.same: dict[str, Streak] = {}  # identity -> identical results in a row
        self.fails: dict[str, Streak] = {}  # tool -> identical failures in a row
        self.pending: dict[str, list[Attempt]] = {}  # exact signature -> MCP calls in flight
        # period m -> how many of the turn's last calls repeat with that period (repetition, cycles)
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

    def attempt(self, tool: str, sig: str, ident: str, evidence: str | None) -> Attempt:
        """One more call of the turn, with what was known when it was made."""
        bare = normalize_tool_name(tool)
        last = self.last_answer.get(ident)
        attempt = Attempt(
            ident=ident,
            sig=sig,
            tool=bare,
            evidence=evidence,
            index=self.count,
            known=self.serial,
            seen=last is not None,
            changed=last is not None and self.last_news > last,
        )
        attempts = self.attempts
        for m in self.periodic:
            if self.count >= m and len(attempts) >= m and attempts[-m].ident == ident:
                self.periodic[m] += 1
            else:
                self.periodic[m] = min(self.count + 1, m)
        self.count += 1
        attempts.append(attempt)
        self.calls[bare] += 1
        return attempt

    def resolve(self, attempt: Attempt, fingerprint: str) -> None:
        """Stale: the same call had come back, and so had this result, before it was made."""
        first = self.results.get((attempt.tool, fingerprint))
        attempt.stale = attempt.seen and first is not None and first <= attempt.known

    def apply(self, attempt: Attempt, fingerprint: str, error: str | None) -> None:
        """What the answer teaches the turn: news (progress that did not fail), the results each tool
        has returned, and the streaks of identical answers."""
        self.serial += 1
        epoch = attempt.known
        ident = attempt.ident
        no_progress = bool(attempt.stale) and not attempt.changed
        self.last_answer[ident] = epoch
        self.results.setdefault((attempt.tool, fingerprint), self.serial)
        if not attempt.stale and error is None:
            self.last_news = max(self.last_news, epoch)
        if no_progress:
            self.no_progress[attempt.tool] += 1
        same = self.same.get(ident)
        if no_progress and same is not None and same.key == fingerprint:
            same.count += 1
        else:
            same = self.same[ident] = Streak(fingerprint, 1, next(self._serials))
        if attempt.evidence:
            same.evidence.append(attempt.evidence)
        if error is None:
            self.fails.pop(attempt.tool, None)
        else:
            # a failure is no progress whatever its arguments: nothing changed, nothing was learned
            key = self.same_as(f"{attempt.tool}\x00error", error_fingerprint(error) or "")
            fail = self.fails.get(attempt.tool)
            if fail is not None and fail.key == key and self.last_news <= fail.at:
                fail.count += 1
            else:
                fail = self.fails[attempt.tool] = Streak(key, 1, next(self._serials), text=error)
            fail.at = epoch
            if attempt.evidence:
                fail.evidence.append(attempt.evidence)
        self._forget_if_large()

    def refused(self, attempt: Attempt) -> None:
        """A refused MCP call never ran: it learned nothing, and the streak it belongs to goes on."""
        attempt.stale = True
        waiting = self.pending.get(attempt.sig)
        if waiting and attempt in waiting:
            waiting.remove(attempt)
            if not waiting:
                del self.pending[attempt.sig]
        self.no_progress[attempt.tool] += 1

    def _forget_if_large(self) -> None:
        if (
            len(self.last_answer) > MAX_TURN_KEYS
            or len(self.results) > MAX_TURN_KEYS
            or len(self.counted) > MAX_TURN_KEYS
        ):
            self.counted.clear()
            self.last_answer.clear()
            self.results.clear()
            self.same.clear()
            self.fails.clear()
