"""What progress is measured against in one user turn: its calls and what came back.

The detector records each call (`Turn.attempt`) and each answer (`resolve`, then `apply`) here; the
patterns read it (and keep their own streaks). A new user turn starts a new `Turn`: progress starts
from nothing.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from proxy.guards.signatures import normalize_tool_name
from proxy.guards.volatile import same_or_counted

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


class Turn:
    """Everything progress is measured against: it starts from nothing at each user turn."""

    def __init__(self, number: int, started_at: float | None) -> None:
        self.number = number
        self.started_at = started_at
        self.attempts: deque[Attempt] = deque(maxlen=HISTORY)
        self.count = 0  # attempts so far
        self.serial = 0  # answers so far
        # "after" is by epoch, the answers a call had seen when it was made: the calls of one step
        # share it, so a fan-out's answers are never news to each other
        self.last_answer: dict[str, int] = {}  # identity -> epoch of its latest answer
        self.results: dict[tuple[str, str], int] = {}  # (tool, fingerprint) -> first serial
        self.last_news = -1  # epoch of the last answer that was progress and no failure
        # tool -> calls without progress since that tool's last news: a streak, so a poll whose
        # status moves every few calls never adds up over a long turn (SPEC §5.1)
        self.no_progress: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()  # tool -> every attempt
        self.pending: dict[str, list[Attempt]] = {}  # exact signature -> MCP calls in flight
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
        self.count += 1
        self.attempts.append(attempt)
        self.calls[bare] += 1
        return attempt

    def resolve(self, attempt: Attempt, fingerprint: str) -> None:
        """Stale: the same call had come back, and so had this result, before it was made."""
        first = self.results.get((attempt.tool, fingerprint))
        attempt.stale = attempt.seen and first is not None and first <= attempt.known

    def apply(self, attempt: Attempt, fingerprint: str, error: str | None) -> None:
        """What the answer teaches the turn: news (progress that did not fail), the results each tool
        has returned, and the tool's calls without progress."""
        self.serial += 1
        epoch = attempt.known
        self.last_answer[attempt.ident] = epoch
        self.results.setdefault((attempt.tool, fingerprint), self.serial)
        if not attempt.stale and error is None:
            self.last_news = max(self.last_news, epoch)
            self.no_progress.pop(attempt.tool, None)  # news: the tool's streak starts again
        elif attempt.stale and not attempt.changed:
            self.no_progress[attempt.tool] += 1

    def refused(self, attempt: Attempt) -> None:
        """A refused MCP call never ran: it learned nothing, and the streak it belongs to goes on."""
        attempt.stale = True
        waiting = self.pending.get(attempt.sig)
        if waiting and attempt in waiting:
            waiting.remove(attempt)
            if not waiting:
                del self.pending[attempt.sig]
        self.no_progress[attempt.tool] += 1

    @property
    def too_large(self) -> bool:
        return (
            len(self.last_answer) > MAX_TURN_KEYS
            or len(self.results) > MAX_TURN_KEYS
            or len(self.counted) > MAX_TURN_KEYS
        )

    def forget(self) -> None:
        """What came back, forgotten to stay bounded (calls then only look new)."""
        self.counted.clear()
        self.last_answer.clear()
        self.results.clear()
