"""What progress is measured against in one user turn: its calls and what came back.

The detector records each call (`Turn.attempt`) and each answer (`resolve`, then `apply`) here; the
patterns read it (and keep their own streaks). A new user turn starts a new `Turn`: progress starts
from nothing.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from proxy.guards import structure
from proxy.guards.signatures import normalize_tool_name, split_identity
from proxy.guards.volatile import same_or_counted

HISTORY = 64  # a turn's last attempts kept for cycles and evidence
MAX_TURN_KEYS = 8192  # identities / results remembered per turn (forgetting only makes calls look new)
MAX_VARIANTS = 8  # results of one template kept per tool, each compared with a new result of it


@dataclass(eq=False, slots=True)
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
    follows: bool = False  # its arguments carry a value first seen in a result of the turn
    writes: bool = False  # a mutating tool: new arguments change something new

    @property
    def presumed_stale(self) -> bool:
        """Judged before its result: the same call again, with no news since."""
        return self.seen and not self.changed


class Turn:
    """Everything progress is measured against: it starts from nothing at each user turn."""

    __slots__ = (
        "number",
        "started_at",
        "attempts",
        "count",
        "serial",
        "last_answer",
        "results",
        "last_news",
        "no_progress",
        "calls",
        "pending",
        "ids",
        "counted",
        "values_seen",
        "fresh",
        "tool_quiet_at",
    )

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
        # (tool, hash of a result's template without its counters) -> its latest results of that
        # template (counters, tokens, the fingerprint each is known by): a counter that went up by
        # one, or a few fresh ids, do not make a result new
        self.counted: dict[tuple[str, str], list[tuple[list[int], tuple[str, ...], str]]] = {}
        # values the turn's results named (digests, `proxy.guards.structure`): `fresh` ones were
        # first seen in a result and no call has carried them yet; a call that does follows news
        self.values_seen: set[str] = set()
        self.fresh: set[str] = set()
        self.tool_quiet_at: dict[str, int] = {}  # tool -> epoch of its latest answer without progress

    def same_as(self, tool: str, fingerprint: str) -> str:
        """The fingerprint a result (or error) is known by in this turn: an earlier result's of the
        tool when its template is that one's, each of its counters the same or one more ("attempt 3"
        after "attempt 2", SPEC §5.1) and its tokens the same but a few (a fresh request id, not a
        page of new ids: `structure.same_tokens`); its own otherwise. The values it names become
        the turn's (`fresh` when first seen).

        `fingerprint` is `signatures.result_fingerprint`'s: `<hash>[|n|n...][~...]`.
        """
        if "~" not in fingerprint and "|" not in fingerprint:
            return fingerprint  # no counter, no token: compared whole
        shape = structure.read(fingerprint)
        if shape.tokens or shape.follow:
            self._named(shape)
        skeleton, sep, rest = shape.template.partition("|")
        if not sep and not shape.tokens:
            return fingerprint
        try:
            numbers = [int(n) for n in rest.split("|")] if sep else []
        except ValueError:  # not one of ours (a replayed trace of another version): compared whole
            return fingerprint
        variants = self.counted.setdefault((tool, skeleton), [])
        known = fingerprint
        for i in range(len(variants) - 1, -1, -1):
            counters, tokens, earlier = variants[i]
            if same_or_counted(counters, numbers) and structure.same_tokens(
                tokens, shape.tokens, shape.share
            ):
                known = earlier
                del variants[i]
                break
        variants.append((numbers, shape.tokens, known))
        if len(variants) > MAX_VARIANTS:
            del variants[0]
        return known

    def _named(self, shape: structure.Shape) -> None:
        values = {*shape.tokens, *shape.follow}
        new = values - self.values_seen
        if new:
            self.values_seen |= new
            self.fresh |= new

    def quiet(self, tool: str) -> bool:
        """The tool's latest answers made no progress and nothing new came back since: a call of it
        with new arguments is presumed to learn nothing either (page 7 after pages 5 and 6 came back
        as page 4)."""
        at = self.tool_quiet_at.get(tool)
        return at is not None and self.no_progress[tool] > 0 and self.last_news <= at

    @property
    def pristine(self) -> bool:
        """No attempt, answer or claimed call yet: every container is still as built."""
        return self.count == 0 and self.serial == 0 and not self.ids

    def attempt(
        self, tool: str, sig: str, ident: str, evidence: str | None, *, writes: bool = False
    ) -> Attempt:
        """One more call of the turn, with what was known when it was made. `ident` may carry the
        digests of the values its arguments name (`signatures.call_keys`): one first seen in a
        result, and not carried by a call yet, makes the call follow news."""
        bare = normalize_tool_name(tool)
        ident, values = split_identity(ident)
        follows = False
        for value in values:
            if value in self.fresh:
                follows = True
                self.fresh.discard(value)
            self.values_seen.add(value)
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
            follows=follows,
            writes=writes,
        )
        self.count += 1
        self.attempts.append(attempt)
        self.calls[bare] += 1
        return attempt

    def resolve(self, attempt: Attempt, fingerprint: str) -> None:
        """Stale: this result of the tool had come back before the call was made, and the call was
        the same call again, or one with other arguments that learned nothing by them (a rich result,
        `structure.RICH_CHARS`: page 7 is page 6, `current/current/` lists `current/`). A write with
        new arguments, or a call following news, is never stale."""
        first = self.results.get((attempt.tool, fingerprint))
        if first is None or first > attempt.known or attempt.follows:
            attempt.stale = False
        elif attempt.seen:
            attempt.stale = True
        else:
            attempt.stale = not attempt.writes and structure.read(fingerprint).rich

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
            self.tool_quiet_at[attempt.tool] = epoch

    def refused(self, attempt: Attempt) -> None:
        """A refused MCP call never ran: it learned nothing, and the streak it belongs to goes on."""
        attempt.stale = True
        waiting = self.pending.get(attempt.sig)
        if waiting and attempt in waiting:
            waiting.remove(attempt)
            if not waiting:
                del self.pending[attempt.sig]
        self.no_progress[attempt.tool] += 1
        self.tool_quiet_at[attempt.tool] = max(self.tool_quiet_at.get(attempt.tool, -1), self.last_news)

    @property
    def too_large(self) -> bool:
        return (
            len(self.last_answer) > MAX_TURN_KEYS
            or len(self.results) > MAX_TURN_KEYS
            or len(self.counted) > MAX_TURN_KEYS
            or len(self.values_seen) > MAX_TURN_KEYS
        )

    def forget(self) -> None:
        """What came back, forgotten to stay bounded (calls then only look new)."""
        self.counted.clear()
        self.last_answer.clear()
        self.results.clear()
        self.values_seen.clear()
        self.fresh.clear()
