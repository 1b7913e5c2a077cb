"""Values that change on every call without meaning anything (SPEC §5.1), taken out before comparing.

An agent stuck in a loop often sends a fresh `request_id`, `nonce` or timestamp with each call, and
tools echo them back with a `checked_at` time or a "passed in 0.31s" timing. None of that is news:
two calls that differ only there are the same call, and two results that differ only there are the
same result. Meaningful values stay: an ISO *date* alone (`date: "2026-11-26"`), a page number, a
path, an id that names a thing (`id: 42`).

Three kinds of rule, all conservative (a value wrongly kept only makes a call look new, which is
the lenient side):
- by key: fields whose name says they are per-call noise (`request_id`, `nonce`, `timestamp`,
  `checked_at`, `attempt`, ...) are dropped from arguments and results; fields named like a
  sequence number (`seq`, `counter`, `tick`, `iteration`) from arguments only (in a result, an
  iteration that jumps is progress: the rule across calls below tells a counter);
- by shape, anywhere in a string: UUIDs, ISO date-times and clock times, long hex tokens, epoch
  seconds / milliseconds, durations ("0.31s", "12 ms", "1m30.5s"), and ids in other alphabets
  (base62, base58, base32, base36: `is_opaque`) of 12 characters or more inside a longer text
  ("trace 8fK2mZpQ7xL1vN3aR"); a string that is only an id names a thing (a cursor, an object, a
  file) and stays, as does an id in a path (`/v1/objects/8fK2...`) or under a key of its own
  (`?cursor=8fK2...`, not `trace_id=8fK2...`);
- counters, numbers named as a count of calls ("attempt 3 of 5", "retry #4", "poll 7", "#12"): in
  arguments those named as attempts are erased ("#2400" there names an issue); in results and
  errors they are compared across calls (`result_slots`, by `proxy.guards.loop`): a result whose
  text is the tool's earlier result's with each counter the same or one more is that same result. Every other number is news when it
  moves: progress `20%` to `60%`, a depth, a reading, a price, a count of results, even one that
  steps by one ("1 of 3 replicas available" after "0 of 3").

Pure functions; used by `signatures.stable_signature` and `signatures.result_fingerprint`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from proxy.guards.tree import NOT_EXPANDED, rebuild

# field names (lower-cased, without `_`/`-`) whose value is per-call noise
VOLATILE_KEYS = frozenset(
    {
        "requestid",
        "reqid",
        "clientrequestid",
        "xrequestid",
        "traceid",
        "spanid",
        "correlationid",
        "idempotencykey",
        "nonce",
        "salt",
        "cachebuster",
        "uuid",
        "timestamp",
        "ts",
        "now",
        "currenttime",
        "servertime",
        "createdat",
        "updatedat",
        "checkedat",
        "fetchedat",
        "generatedat",
        "sentat",
        "receivedat",
        "requestedat",
        "lastchecked",
        "elapsed",
        "elapsedms",
        "elapseds",
        "durationms",
        "took",
        "tookms",
        "latencyms",
        "attempt",
        "attempts",
        "try",
        "retry",
        "retries",
        "retrycount",
        "pollcount",
    }
)
# sequence numbers: dropped from arguments; in results a number that steps by one per call is told
# across calls (`result_slots`), so an `iteration` that jumps from 200 to 400 stays news
ARGUMENT_COUNTER_KEYS = frozenset({"seq", "sequence", "seqno", "counter", "iteration", "tick"})

# ids by their shape: erased from arguments; a result keeps their values as the tokens of its template
# (`proxy.guards.structure`), so a page of new UUIDs is news and one fresh request id is not
_ID_SHAPES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
        "<id>",
    ),
    (re.compile(r"\b(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{16,}\b"), "<id>"),
)
# times, timings and ages: noise wherever they are; the order matters (date-times before clock times)
_TIME_SHAPES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"),
        "<time>",
    ),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<time>"),
    # a time relative to now ("updated 3 minutes ago"): it moves with the clock, not with the world
    (
        re.compile(
            r"\b\d+\s?(?:s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?|d|days?|w|weeks?)\s+ago\b",
            re.IGNORECASE,
        ),
        "<time>",
    ),
    # not a quantity that happens to fall in the range: "1600000000 of 3200000000 bytes"
    (re.compile(r"\b1[5-9]\d{8}(?:\d{3})?(?:\.\d+)?\b(?!\s*(?:/|of\b|[kMG]?i?B\b|bytes?\b|%))"), "<epoch>"),
    # Go's time.Duration ("1m30.5s", "2h3m4s") and ISO 8601's ("PT1.5S") before plain amounts
    (
        re.compile(
            r"\b(?:\d+h)?(?:\d+m(?!s))?\d+(?:\.\d+)?(?:ms|us|µs|ns|s)\b|\bPT(?:\d+H)?(?:\d+M)?(?:\d+(?:\.\d+)?S)?\b"
        ),
        "<duration>",
    ),
    # an age as kubectl and docker print them ("12m", "3h4m", "2d5h", "45s")
    (re.compile(r"\b(?:\d+d(?:\d+h)?(?:\d+m)?(?:\d+s)?|\d+h(?:\d+m)?(?:\d+s)?|\d+m)\b"), "<duration>"),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|msec|milliseconds?|s|sec|secs|seconds?)\b"), "<duration>"),
)
_SHAPES = _ID_SHAPES[:1] + _TIME_SHAPES[:3] + _ID_SHAPES[1:] + _TIME_SHAPES[3:]
# the time shapes of a result's template: not epoch numbers (in a result a 10-digit number is a
# token, `proxy.guards.structure`, whether it is a time or a random seed that happens to fall in the
# range, so both compare alike)
_RESULT_TIME_SHAPES = tuple((p, placeholder) for p, placeholder in _TIME_SHAPES if placeholder != "<epoch>")
_NEEDS = (":", ":", "ago") + ("",) * (len(_RESULT_TIME_SHAPES) - 3)  # what a shape cannot match without
# A number that counts calls, named so: "attempt 3", "retry #4", "poll 7", "call no. 2", "#12",
# `"iteration":40` in a result's JSON. The number alone is the match's group 1.
_COUNTED = re.compile(
    r"(?i)(?:\b(?:attempts?|tries|try|retry|retries|retrying|polls?|calls?|iteration|iter|tick|round|counter"
    r"|seq|sequence|seqno|no)\b\.?[\\\"]*\s*[:=]?\s*(?:#\s*|number\s*)?|#)([0-9]{1,11})(?![\w.%])"
)


# in arguments, only the words that count attempts: "#12" or "no. 5" there names an issue, a row
_COUNTED_ATTEMPT = re.compile(
    r"(?i)\b(?:attempts?|tries|try|retry|retries|retrying|polls?)\b\s*[:=]?\s*#?\s*([0-9]{1,11})(?![\w.%])"
)


def _erase_counter(match: re.Match[str]) -> str:
    return match.group()[: match.start(1) - match.start()] + "<n>"


# epoch seconds or milliseconds as a number (2017..2033): only at a time-like key, never a plain id
JSON_TEXT_LIMIT = 1 << 20
_EPOCH_RANGES = ((1.5e9, 2.0e9), (1.5e12, 2.0e12))
_TIME_KEY_ENDS = ("at", "ts", "time", "stamp", "date", "updated", "created", "modified", "expires")


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def is_volatile_key(name: str) -> bool:
    return _key(name) in VOLATILE_KEYS or _key(name) in ARGUMENT_COUNTER_KEYS


def _is_result_volatile_key(name: str) -> bool:
    return _key(name) in VOLATILE_KEYS


# -- opaque ids in any alphabet -------------------------------------------------------------------
# An id is a token of letters and digits that is not made of words. Words are told by their letter
# pairs: the 250 pairs most frequent in the words of Python's standard library source (its prose
# and its names; they make 96% of its pairs) make most of a word's pairs ("health", "nightly",
# "getIdByName") and few of a random string's ("8fK2mZpQ7x": f, K, m, Zp, Q, x). Digits between
# letters in two places or more ("a7Xk2q9"), or 12 digits and more (snowflake and decimal trace
# ids), are ids too. Measured on random ids (base62, base58, base32, base36): up to 3 in 1,000 of 16
# characters are taken for words, under 1 in 1,000 of 20 and more (most trace and request ids); and
# 1.7% of the standard library's names of 12 characters or more are taken for ids (abbreviations
# mostly: "PostgreSQL16", "XMLHttpRequest"), which only matters inside a longer text.
_COMMON_PAIRS = frozenset(
    re.findall(
        "..",
        "abacadagaiakalamanaparasatauavawaxaybabebibjblbobrbsbubycacccechcickclcocrcsctcudadddedidods"
        "dtdueaecedeeefegeielemenepeqeresetevewexeyfafefffiflfofrftfugageghgigngrgsguhahehihohtiaibic"
        "idieifigiliminioipirisitivixizjekekilaldlelflilllolsltlulymambmemimmmompmsmunancndnenfngninn"
        "nonpnsntnunvnyoaobocodofogoiokolomonoooporosotouovowpapephpiplpoppprpsptpupyqurarcrdrergrirk"
        "rmrnrorrrsrtrurvrysascseshsisospssstsusytatctethtitotptrtstttutyuaubucudueuiukulumunupurusut"
        "vaveviwawewhwiwowrwsxcxexixpxtymypysytze",
    )
)
_TOKEN = re.compile(r"(?<![A-Za-z0-9])[A-Za-z0-9]{12,}(?![A-Za-z0-9])")
_SEGMENT = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
ID_MIN = 12  # shorter tokens are too short to tell from a word, a code or a number
WORD_PAIRS = 0.7  # a token whose common letter pairs fall below this share of its pairs is no word


def is_opaque(token: str, min_len: int = ID_MIN) -> bool:
    """A token of letters and digits that is an id, not a word, a file name or a number (the note
    above): `8fK2mZpQ7xL1vN3a`, `JBSWY3DPEHPK3PXP`, `01ARZ3NDEKTSV4RRFFQ69G5FAV` are; `README`,
    `CrashLoopBackOff`, `test2024report`, `base64encoded` are not. `min_len`: shorter tokens are
    never ids (results' templates look at shorter ones, `proxy.guards.structure`)."""
    if len(token) < min_len:
        return False
    if token.isdigit():
        return True
    segments = _SEGMENT.findall(token)
    letters = [s.lower() for s in segments if not s[0].isdigit()]
    if len(segments) - len(letters) >= 2:
        return True
    # a lone letter between digits or case changes counts as a pair that is no word's
    pairs = sum(len(s) - 1 if len(s) > 1 else 1 for s in letters)
    common = sum(s[i : i + 2] in _COMMON_PAIRS for s in letters for i in range(len(s) - 1))
    return common < WORD_PAIRS * max(1, pairs)


_AROUND_A_NAME = " \t\r\n.,;:!?\"'()[]{}<>"


# the key of a `key=value` just before a value ("trace_id=", "?cursor=", "dd.trace_id=")
_KEY_BEFORE = re.compile(r"([A-Za-z][A-Za-z0-9_-]*)=$")
# a key=value whose key has one of these words says per-call noise: a trace, request or span id
_NOISE_KEY_WORDS = frozenset(
    {"trace", "request", "req", "span", "correlation", "nonce", "rid", "traceparent"}
)
_KEY_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


def _names_a_thing(text: str, start: int) -> bool:
    """An id in a path or a URL (`/objects/8fK2...`, `/tmp/build-8fK2.../out.log`) or the value of a
    key that does not say it is per-call noise (`?cursor=...`, but not `trace_id=...`) names what
    the call is about."""
    if text[start - 1 : start] == "=":
        key = _KEY_BEFORE.search(text, max(0, start - 64), start)
        return key is not None and not any(
            w.lower() in _NOISE_KEY_WORDS for w in _KEY_WORD.findall(key.group(1))
        )
    word = max(text.rfind(c, max(0, start - 512), start) for c in " \t\n\"'(<[,;")
    return "/" in text[word + 1 : start]


def _erase_embedded_id(match: re.Match[str]) -> str:
    token = match.group()
    if not is_opaque(token) or _names_a_thing(match.string, match.start()):
        return token
    return "<id>"


# a value that is one name: an id, or a cursor in base64 (`eyJvZmZzZXQiOiAyMH0=`, `+` `/` `-` `_`)
_ONE_NAME = re.compile(r"[A-Za-z0-9+/_-]+={0,2}")


def _erase_embedded_ids(text: str) -> str:
    """Ids inside a longer text (a trace id in an error message, a header in a command) erased; a
    text that is only an id (a cursor, in base64 too), or an id in a path or under a key of its own,
    names a thing (a cursor, an object, a file) and stays."""
    if len(text) <= ID_MIN or _ONE_NAME.fullmatch(text.strip(_AROUND_A_NAME)):
        return text
    return _TOKEN.sub(_erase_embedded_id, text)


_LONG_DECIMAL = re.compile(r"\d+\.\d{7,}")


def _round_decimal(match: re.Match[str]) -> str:
    return repr(round(float(match.group()), 6))


def stable_text(text: str) -> str:
    """A string with its per-call noise (ids, times, timings) replaced by placeholders, and decimals
    beyond 6 places rounded as arguments' floats are ("costs 0.9999999" is "costs 1.0")."""
    if not any(c.isdigit() for c in text):  # every shape but letter-only ids holds a digit
        return _erase_embedded_ids(text)
    for pattern, placeholder in _SHAPES:
        text = pattern.sub(placeholder, text)
    return _LONG_DECIMAL.sub(_round_decimal, _erase_embedded_ids(text))


def time_text(text: str) -> str:
    """A string with its times, timings and ages replaced and long decimals rounded, ids kept: what a
    result's template is made from (`proxy.guards.structure` then takes the ids out as its tokens)."""
    if _DIGIT.search(text) is None:  # every time shape holds a digit
        return text
    colon, ago = ":" in text, "ago" in text or "AGO" in text or "Ago" in text
    for (pattern, placeholder), needs in zip(_RESULT_TIME_SHAPES, _NEEDS, strict=True):
        # date-times and clock times hold a colon, relative times an "ago": most texts skip them
        if (needs == ":" and not colon) or (needs == "ago" and not ago):
            continue
        text = pattern.sub(placeholder, text)
    return _LONG_DECIMAL.sub(_round_decimal, text)


_DIGIT = re.compile(r"\d")


def _epoch_like(value: float) -> bool:
    return any(lo <= value < hi for lo, hi in _EPOCH_RANGES)


def _epoch_at_time_key(key: str, value: Any) -> bool:
    """An epoch number (seconds or milliseconds) under a time-like key: per-call noise."""
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not _key(key).endswith(_TIME_KEY_ENDS)
    ):
        return False
    try:
        return _epoch_like(float(value))
    except OverflowError:  # an integer beyond any float (json.loads reads up to 4,300 digits)
        return False


FOLD_LIMIT = 200  # longer strings (documents, outputs) are compared as they are


# a sentence's final punctuation, before closing quotes or brackets and a space or the end
_FINAL_PUNCTUATION = re.compile(r"[.?!]+(?=[\"')\].?!]*(?:\s|$))")


# spaces next to punctuation: `email = 'a'` and `email='a'`, `id , email` and `id, email` are one query
_SPACE_AT_PUNCTUATION = re.compile(r" (?=[^\w\s<>])|(?<=[^\w\s<>]) ")


def fold_text(text: str) -> str:
    """A short string as a person would repeat it: lower case, single spaces, none next to
    punctuation, no final punctuation (of the string, or of a sentence inside it: a query echoed in
    quotes, `for "Paris?".`)."""
    if len(text) <= FOLD_LIMIT:
        return _SPACE_AT_PUNCTUATION.sub("", " ".join(_FINAL_PUNCTUATION.sub("", text.lower()).split()))
    return text


def _stable_text(
    value: str, fold_case: bool, result: bool = False, text_of: Callable[[str], str] | None = None
) -> str:
    text = stable_text(value) if text_of is None else text_of(value)
    if not result and any(c.isdigit() for c in text):
        # arguments have no earlier result to step from: a number named as a count of attempts is noise
        text = _COUNTED_ATTEMPT.sub(_erase_counter, text)
    return fold_text(text) if fold_case else text


def _json_text(value: str) -> Any:
    """The JSON a string holds (tool results often are JSON sent as text), else _NOT_JSON."""
    if value[:1] in ("{", "[") and len(value) < JSON_TEXT_LIMIT:
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            pass
    return _NOT_JSON


_NOT_JSON = object()


def _keep_member(key: str, child: Any) -> bool:
    return not is_volatile_key(key) and not _epoch_at_time_key(key, child)


def _keep_result_member(key: str, child: Any) -> bool:
    return not _is_result_volatile_key(key) and not _epoch_at_time_key(key, child)


def _expand_json_text(value: str) -> Any:
    parsed = _json_text(value)
    return NOT_EXPANDED if parsed is _NOT_JSON else parsed


def stable_leaf(
    value: Any, fold_case: bool, result: bool = False, text_of: Callable[[str], str] | None = None
) -> Any:
    """A scalar of a stable value: strings lose their per-call noise, the rest is unchanged."""
    return _stable_text(value, fold_case, result, text_of) if isinstance(value, str) else value


def stable_value(
    value: Any,
    *,
    fold_case: bool = False,
    leaf: Callable[[Any], Any] | None = None,
    result: bool = False,
    text_of: Callable[[str], str] | None = None,
) -> Any:
    """JSON-like `value` without volatile fields and shapes; the rest unchanged.

    `fold_case` also folds short strings (queries, names) to lower case with single spaces and no
    trailing punctuation: "Weather in Paris?" is "weather in paris" (arguments and results alike).
    A string holding JSON (tool results often are JSON sent as text) is replaced by its stable value.
    `leaf`, when given, is applied to every stable scalar in the same walk (the canonical form of a
    fingerprint), so a value is walked once. `result`: a tool's result, whose sequence numbers
    (`seq`, `iteration`, ...) are kept for the rule across calls. `text_of`, when given, makes a
    string's stable text instead of `stable_text` (a result's template keeps its ids as tokens).
    Any depth (`proxy.guards.tree.rebuild`).
    """
    keep = _keep_result_member if result else _keep_member
    if leaf is None:
        return rebuild(
            value, lambda v: stable_leaf(v, fold_case, result, text_of), keep=keep, expand=_expand_json_text
        )
    return rebuild(
        value,
        lambda v: leaf(stable_leaf(v, fold_case, result, text_of)),
        keep=keep,
        expand=_expand_json_text,
    )


# -- counters, across calls -----------------------------------------------------------------------
MAX_SLOTS = 16  # a result naming more counters is compared whole


def result_slots(text: str) -> tuple[str, list[str]]:
    """(the text with each number named as a count of calls replaced by `<n>`, those numbers in
    order), or (text, []) when it names none (or more than MAX_SLOTS). `proxy.guards.loop` compares
    the numbers across calls: one more than the tool's earlier result's is a counter. A number not
    named so stays in the text: "1 of 3 replicas available" after "0 of 3" is news."""
    if not any(c.isdigit() for c in text):
        return text, []
    slots = [m.group(1) for m in _COUNTED.finditer(text)]
    if not slots or len(slots) > MAX_SLOTS or "<n>" in text:
        return text, []  # a `<n>` already there would shift every slot after it: compared whole
    return _COUNTED.sub(_erase_counter, text), slots


def same_or_counted(earlier: list[int], later: list[int]) -> bool:
    """Every number of `later` is the one at its place in `earlier`, or one more (a counter)."""
    return len(earlier) == len(later) and all(b in (a, a + 1) for a, b in zip(earlier, later, strict=True))
