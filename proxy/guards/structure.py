"""Results compared by structure (SPEC §5.1, issue 31): a template, and the values in it.

Guessing which strings are ids moved errors around: a page made only of UUIDs became "noise" (an
honest agent paging was blocked), while a request id in a short alphabet (`C8F3:2B1A:1F3E6D9`), a
10-character trace id or a temp file (`/tmp/ccA1b2C3.o`) made a stuck failure look new. So a
result is not reduced to one hash with its ids erased. Its *template* is its stable text (times,
timings and ages erased, `volatile.time_text`) with every id-like value taken out as a *token*:
UUIDs, hex runs, ids in any alphabet and of 8 characters or more (with `:`, `-`, `_` between
groups), digit runs of 5 to 11 digits that measure nothing (a seed, a PID), a value that is one
opaque name (a base64 cursor). Two results of a tool are the same when their templates are, and
their tokens differ in a few places only (at most `NOISE_TOKENS`, together at most
`NOISE_SHARE`% of the text): one fresh request id is noise, a page of new UUIDs is news however
id-like, and a result that is only an id is news when the id changes.

Values the agent may follow (every token, and URLs) are kept as short digests: a call whose
arguments carry one first seen in a result of the turn follows news (`proxy.guards.loop.turn`).

All of it rides in the fingerprint string (recorded for replay, shared between replicas):
`<hash of the template>[|n|n...]` (counters, `signatures.slotted`), then, when the result has
tokens, follow values or is *rich*, `~<r?><share>:<token digests>:<follow digests>` (digests of 6
hex characters joined by `.`). *Rich*: a template of `RICH_CHARS` characters or more (a listing, a
page of results): the same rich result for other arguments says the arguments changed nothing
(page 7 is page 6), while a short answer (`200 OK`) to other arguments is about the thing they name.

Pure functions, no I/O.
"""

from __future__ import annotations

import functools
import re
import zlib
from dataclasses import dataclass, field
from typing import NamedTuple

from proxy.guards.volatile import is_opaque, same_or_counted, time_text

PLACEHOLDER = "<v>"
DIGEST_CHARS = 6
MAX_TOKENS = 64  # a result with more is compared on its first MAX_TOKENS (it changed wholesale anyway)
MAX_FOLLOW = 64
NOISE_TOKENS = 4  # at most this many values of a template may change for the result to be the same
NOISE_SHARE = 66  # ... and what changed makes at most this share (%) of the text (two thirds)
RICH_CHARS = 40  # texts this long say something whatever the arguments were (a listing, a page)
TOKEN_MIN = 8  # shorter tokens are too short to tell from a word, a code or a number
GROUP_MIN = 6  # a group of a compound token (`req_ZTYS355nRa`) judged alone from this length
DIGITS_MIN, DIGITS_MAX = 5, 11  # a digit run in this range that measures nothing (no unit after it)

# a candidate token: letters and digits, groups joined by `:`, `-` or `_` (`C8F3:2B1A:1F3E6D9`,
# `req_8fK2mZpQ7x`, `api-7d9f8b6c5-x2k9p`); not inside a number (`1.5`) or a placeholder
_CANDIDATE = re.compile(
    r"(?<![A-Za-z0-9.<])(?=[A-Za-z0-9:_-]{5})[A-Za-z0-9]+(?:[:_-][A-Za-z0-9]+)*(?![A-Za-z0-9>]|\.\d)"
)
# what follows a number that measures something: a unit, a share, a fraction
_QUANTITY_AFTER = re.compile(
    r"\s?(?:%|/|of\b|[kKMGT]?i?B\b|bytes?\b|(?:ms|us|ns|s|secs?|m|mins?|h|hrs?|x|rows?|items?|results?|records?"
    r"|lines?|files?|tokens?|req|requests?|users?|messages?|events?|pods?|ops|kb|mb|gb)\b)",
    re.IGNORECASE,
)
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_HEX = re.compile(r"(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]+")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_SEPARATORS = re.compile(r"[:_-]")
# a value that is one opaque name: an id, a base64 cursor
_ONE_NAME = re.compile(r"[A-Za-z0-9+/_-]{12,}={0,2}")
_URL = re.compile(r"https?://[^\s\"'<>()\[\]{}]+")
_URL_END = ".,;:!?"


def digest(value: str) -> str:
    """A value's short digest (24 bits of CRC-32: a result has a few dozen values at most), case
    folded as short texts are compared (`volatile.fold_text`)."""
    return f"{zlib.crc32(value.lower().encode('utf-8', 'surrogatepass')) & 0xFFFFFF:06x}"


def _is_token(raw: str, text: str, end: int) -> bool:
    """A candidate (`_CANDIDATE`) that is an id: its letters and digits, separators aside, are not
    made of words (`volatile.is_opaque`, from 8 characters), or a hex run mixing letters and digits,
    or a digit run of 5 to 11 digits with no unit after it (a seed, a PID; `42 ms`, `120 of 300`,
    `4096 MiB` measure something), 12 digits and more."""
    if _UUID.fullmatch(raw):
        return True
    alnum = _SEPARATORS.sub("", raw) if not raw.isalnum() else raw
    if alnum.isdigit():
        if len(alnum) > DIGITS_MAX:
            return True
        if len(alnum) < DIGITS_MIN or len(alnum) != len(raw) or _DATE.fullmatch(raw):
            return False
        return _QUANTITY_AFTER.match(text, end) is None
    if len(alnum) < TOKEN_MIN:
        return False
    if _HEX.fullmatch(alnum):
        return True
    if _opaque(_case_free(alnum), TOKEN_MIN):
        return True
    if alnum is raw:
        return False
    # a prefix of words before the id (`req_ZTYS3:55nRa`): the rest, and its groups, judged alone
    groups = _SEPARATORS.split(raw)
    rest = "".join(groups[1:])
    return (len(rest) >= TOKEN_MIN and _opaque(_case_free(rest), TOKEN_MIN)) or any(
        len(group) >= GROUP_MIN and _opaque(_case_free(group), GROUP_MIN) for group in groups
    )


def _one_name_is_id(value: str) -> bool:
    """A value that is one name (`_ONE_NAME`) is an id: a UUID, or random characters (a cursor)."""
    if len(value) == 36 and _UUID.fullmatch(value):
        return True
    return _opaque(
        _case_free(_SEPARATORS.sub("", value.replace("=", "").replace("/", "").replace("+", ""))[:64]),
        TOKEN_MIN,
    )


def _case_free(alnum: str) -> str:
    """Letters alone are judged case folded, as short texts are compared (`ABaAABAB` and `ABAAABAB`
    are one value, a word or not); with digits among them, the case changes tell the segments."""
    return alnum if _DIGIT.search(alnum) else alnum.lower()


_DIGIT = re.compile(r"\d")


@functools.lru_cache(maxsize=8192)
def _opaque(alnum: str, min_len: int) -> bool:
    """`volatile.is_opaque`, remembered: the words of a tool's results come back with every call."""
    return is_opaque(alnum, min_len)


@dataclass(slots=True)
class Harvest:
    """What one result's template took out: its tokens (in order) and the values the agent may follow."""

    tokens: list[str] = field(default_factory=list)  # digests, in order
    token_chars: int = 0
    own_chars: int = 0  # the characters of its texts outside the tokens (not JSON's keys and marks)
    follow: list[str] = field(default_factory=list)  # digests of URLs (tokens are followable too)

    def template(self, value: str) -> str:
        """`value` with its times erased and its id-like values replaced by `<v>` (kept as tokens)."""
        if len(value) < 5:  # too short for any token or time shape to matter
            self.own_chars += len(value)
            return value
        stripped = value.strip()
        if len(stripped) >= 12 and _ONE_NAME.fullmatch(stripped) and _one_name_is_id(stripped):
            self._token(stripped)  # a cursor, an id: the whole value
            return PLACEHOLDER
        text = time_text(value)
        if "://" in text and len(self.follow) < MAX_FOLLOW:
            self.follow.extend(digest(u.rstrip(_URL_END)) for u in _URL.findall(text))
        if len(text) >= TOKEN_MIN:
            before = len(self.tokens)
            text = _CANDIDATE.sub(self._replace, text)
            self.own_chars += len(text) - len(PLACEHOLDER) * (len(self.tokens) - before)
        else:
            self.own_chars += len(text)
        return text

    def _replace(self, match: re.Match[str]) -> str:
        raw = match.group()
        if not _is_token(raw, match.string, match.end()):
            return raw
        self._token(raw)
        return PLACEHOLDER

    def _token(self, raw: str) -> None:
        self.token_chars += len(raw)
        if len(self.tokens) < MAX_TOKENS:
            self.tokens.append(digest(raw))

    def suffix(self) -> str:
        """What the fingerprint carries after its hash (the module's docstring), or ""."""
        own = self.own_chars
        rich = own >= RICH_CHARS
        if not self.tokens and not self.follow and not rich:
            return ""
        share = self.token_chars * 100 // max(1, self.token_chars + own)
        return f"~{'r' if rich else ''}{min(share, 99)}:{'.'.join(self.tokens)}:{'.'.join(self.follow)}"


class Shape(NamedTuple):
    """A fingerprint read back: its template part, how much of it was tokens, its tokens, the values
    it offers to follow, and whether it is rich."""

    template: str  # `<hash>[|n|n...]`
    share: int
    tokens: tuple[str, ...]
    follow: tuple[str, ...]
    rich: bool


def read(fingerprint: str) -> Shape:
    """A fingerprint's parts (`Harvest.suffix`); one without a suffix is its template alone."""
    head, sep, tail = fingerprint.partition("~")
    if not sep:
        return Shape(fingerprint, 0, (), (), False)
    flags, _, rest = tail.partition(":")
    tokens, _, follow = rest.partition(":")
    rich = flags.startswith("r")
    try:
        share = int(flags[1:] if rich else flags)
    except ValueError:  # not one of ours (a replayed trace of another version): compared whole
        return Shape(fingerprint, 0, (), (), False)
    return Shape(
        head,
        share,
        tuple(tokens.split(".")) if tokens else (),
        tuple(follow.split(".")) if follow else (),
        rich,
    )


def same_tokens(earlier: tuple[str, ...], later: tuple[str, ...], share: int) -> bool:
    """The tokens of two results with one template are the same values but a few (noise), not a
    wholesale change (news)."""
    if len(earlier) != len(later):
        return False
    changed = 0
    for a, b in zip(earlier, later, strict=True):
        if a != b:
            changed += 1
            if changed > NOISE_TOKENS:  # a wholesale change: no need to count the rest
                return False
    return changed == 0 or share * changed <= NOISE_SHARE * len(later)


def argument_values(values: list[str]) -> list[str]:
    """Digests of what a call's argument strings name (the whole value, its URLs, its tokens): a
    call carrying one first seen in a result follows news."""
    out: list[str] = []
    for value in values:
        if len(out) >= MAX_FOLLOW:
            break
        if len(value) < 6:
            continue
        stripped = value.strip()
        one_name = _SPACE.search(stripped) is None
        if one_name:
            out.append(digest(stripped))
        if "://" in value:
            out.extend(digest(u.rstrip(_URL_END)) for u in _URL.findall(value))
        # the tokens inside a text or a path (a name alone was digested whole)
        if len(value) >= TOKEN_MIN and (not one_name or "/" in stripped):
            harvest = Harvest()
            _CANDIDATE.sub(harvest._replace, value)
            out.extend(harvest.tokens)
    return list(dict.fromkeys(out))[:MAX_FOLLOW] if out else out


_SPACE = re.compile(r"\s")


def same_result(earlier: str, later: str) -> bool:
    """Two fingerprints of one tool's results are the same result: one template, each counter the
    same or one more (`volatile.same_or_counted`), the tokens the same but a few (`same_tokens`).
    What `loop.turn.Turn.same_as` decides against each earlier result of the turn."""
    a, b = read(earlier), read(later)
    head_a, _, counters_a = a.template.partition("|")
    head_b, _, counters_b = b.template.partition("|")
    if head_a != head_b:
        return False
    try:
        numbers_a = [int(n) for n in counters_a.split("|")] if counters_a else []
        numbers_b = [int(n) for n in counters_b.split("|")] if counters_b else []
    except ValueError:
        return earlier == later
    return same_or_counted(numbers_a, numbers_b) and same_tokens(a.tokens, b.tokens, b.share)
