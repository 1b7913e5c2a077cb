"""Values that change on every call without meaning anything (SPEC §5.1), taken out before comparing.

An agent stuck in a loop often sends a fresh `request_id`, `nonce` or timestamp with each call, and
tools echo them back with a `checked_at` time or a "passed in 0.31s" timing. None of that is news:
two calls that differ only there are the same call, and two results that differ only there are the
same result. Meaningful values stay: an ISO *date* alone (`date: "2026-11-26"`), a page number, a
path, an id that names a thing (`id: 42`).

Two kinds of rule, both conservative (a value wrongly kept only makes a call look new, which is
the lenient side):
- by key: fields whose name says they are per-call noise (`request_id`, `nonce`, `timestamp`,
  `checked_at`, `attempt`, ...) are dropped from arguments and results;
- by shape, anywhere in a string: UUIDs, ISO date-times and clock times, long hex tokens, epoch
  seconds / milliseconds, durations ("0.31s", "12 ms").

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
        "seq",
        "sequence",
        "seqno",
        "counter",
        "attempt",
        "attempts",
        "try",
        "retry",
        "retries",
        "retrycount",
        "iteration",
        "tick",
        "pollcount",
    }
)

# the order matters: date-times before clock times, UUIDs before hex runs
_SHAPES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
        "<uuid>",
    ),
    (
        re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"),
        "<time>",
    ),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<time>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{16,}\b"), "<hex>"),
    (re.compile(r"\b1[5-9]\d{8}(?:\d{3})?(?:\.\d+)?\b"), "<epoch>"),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|msec|milliseconds?|s|sec|secs|seconds?)\b"), "<duration>"),
)
# epoch seconds or milliseconds as a number (2017..2033): only at a time-like key, never a plain id
JSON_TEXT_LIMIT = 1 << 20
_EPOCH_RANGES = ((1.5e9, 2.0e9), (1.5e12, 2.0e12))
_TIME_KEY_ENDS = ("at", "ts", "time", "stamp", "date", "updated", "created", "modified", "expires")


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def is_volatile_key(name: str) -> bool:
    return _key(name) in VOLATILE_KEYS


_LONG_DECIMAL = re.compile(r"\d+\.\d{7,}")


def _round_decimal(match: re.Match[str]) -> str:
    return repr(round(float(match.group()), 6))


def stable_text(text: str) -> str:
    """A string with its per-call noise (ids, times, timings) replaced by placeholders, and decimals
    beyond 6 places rounded as arguments' floats are ("costs 0.9999999" is "costs 1.0")."""
    if not any(c.isdigit() for c in text):  # every shape holds a digit: the common fast path
        return text
    for pattern, placeholder in _SHAPES:
        text = pattern.sub(placeholder, text)
    return _LONG_DECIMAL.sub(_round_decimal, text)


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


def _stable_text(value: str, fold_case: bool) -> str:
    text = stable_text(value)
    if fold_case and len(text) <= 200:
        text = " ".join(text.lower().split()).rstrip(".?!")
    return text


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


def _expand_json_text(value: str) -> Any:
    parsed = _json_text(value)
    return NOT_EXPANDED if parsed is _NOT_JSON else parsed


def stable_leaf(value: Any, fold_case: bool) -> Any:
    """A scalar of a stable value: strings lose their per-call noise, the rest is unchanged."""
    return _stable_text(value, fold_case) if isinstance(value, str) else value


def stable_value(value: Any, *, fold_case: bool = False, leaf: Callable[[Any], Any] | None = None) -> Any:
    """JSON-like `value` without volatile fields and shapes; the rest unchanged.

    `fold_case` also folds short strings (queries, names) to lower case with single spaces and no
    trailing punctuation, for the identity of a call: "Weather in Paris?" is "weather in paris".
    A string holding JSON (tool results often are JSON sent as text) is replaced by its stable value.
    `leaf`, when given, is applied to every stable scalar in the same walk (the canonical form of a
    fingerprint), so a value is walked once. Any depth (`proxy.guards.tree.rebuild`).
    """
    if leaf is None:
        return rebuild(
            value, lambda v: stable_leaf(v, fold_case), keep=_keep_member, expand=_expand_json_text
        )
    return rebuild(
        value, lambda v: leaf(stable_leaf(v, fold_case)), keep=_keep_member, expand=_expand_json_text
    )
