"""JSON bodies as Python's `json.loads(bytes)` reads them, at any depth (SPEC §4.2).

Tripwire never forwards a call its guards did not judge, so a body the fast parser (orjson)
refuses is not simply passed through: it is read again by the standard library, which accepts
more (lone surrogate escapes such as the `"\\ud83d"` Node's `JSON.stringify` writes for a cut
emoji, `NaN` / `Infinity`, UTF-16/32, a UTF-8 BOM, integers up to `sys.get_int_max_str_digits()`
digits, 4,300 by default). The standard library recurses and gives up near 1,000 levels, so a
deeper document is read by `loads_iterative`, a small parser without recursion that accepts
exactly the documents `json.loads` accepts and returns equal values. Anything else (invalid
UTF-8, a 5,000-digit integer, garbage) raises `ValueError`: the caller refuses the call.

The other half is writing such values back: `dumps` is `orjson.dumps` when orjson can, and
otherwise an iterative encoder with the output of `json.dumps(..., separators=(",", ":"),
ensure_ascii=False)` (`NaN` stays `NaN`, big integers stay exact), except that a lone surrogate
is written as its `\\uXXXX` escape so the result is valid UTF-8. `cap_depth` copies a value with
its sub-trees below a depth replaced by a marker, for consumers that must stay shallow.

Pure functions, no I/O.
"""

from __future__ import annotations

import json
import re
from json.decoder import JSONDecodeError, scanstring  # type: ignore[attr-defined]  # defined, not in typeshed
from json.encoder import encode_basestring, encode_basestring_ascii
from typing import Any

import orjson

__all__ = [
    "JSONDecodeError",
    "cap_depth",
    "dumps",
    "dumps_text",
    "loads",
    "loads_iterative",
    "loads_lenient",
    "max_depth",
]

# ASCII only: the C scanner json.loads uses reads [0-9], never other Unicode digits
_NUMBER = re.compile(r"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_WS = re.compile(r"[ \t\n\r]*")
_CONSTANTS: tuple[tuple[str, Any], ...] = (
    ("null", None),
    ("true", True),
    ("false", False),
    ("NaN", float("nan")),
    ("Infinity", float("inf")),
    ("-Infinity", float("-inf")),
)


def loads(data: bytes | bytearray | str) -> Any:
    """orjson when it can (fast), else exactly what `json.loads(data)` returns; `ValueError` otherwise."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return loads_lenient(data)


def loads_lenient(data: bytes | bytearray | str) -> Any:
    """`json.loads(data)`, without its recursion limit: a deeper document goes to `loads_iterative`."""
    try:
        return json.loads(data)
    except RecursionError:
        return loads_iterative(data)


def _text(data: bytes | bytearray | str) -> str:
    """The document as json.loads decodes it (the encoding detected from the first bytes)."""
    if isinstance(data, str):
        if data.startswith("\ufeff"):
            raise JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", data, 0)
        return data
    if isinstance(data, bytes | bytearray):
        return data.decode(json.detect_encoding(data), "surrogatepass")
    raise TypeError(f"the JSON object must be str, bytes or bytearray, not {type(data).__name__}")


def _skip(s: str, idx: int) -> int:
    return _WS.match(s, idx).end()  # type: ignore[union-attr]  # `*` always matches


def _key(s: str, idx: int) -> tuple[str, int]:
    """A member name and its colon at `idx`; returns (name, index of the member's value)."""
    if s[idx : idx + 1] != '"':
        raise JSONDecodeError("Expecting property name enclosed in double quotes", s, idx)
    key, idx = scanstring(s, idx + 1, True)
    idx = _skip(s, idx)
    if s[idx : idx + 1] != ":":
        raise JSONDecodeError("Expecting ':' delimiter", s, idx)
    return key, _skip(s, idx + 1)


def _scalar(s: str, idx: int) -> tuple[Any, int]:
    """A string, number or constant at `idx`: (value, end)."""
    c = s[idx : idx + 1]
    if c == '"':
        return scanstring(s, idx + 1, True)
    for word, value in _CONSTANTS:
        if s.startswith(word, idx):
            return value, idx + len(word)
    m = _NUMBER.match(s, idx)
    if m is None:
        raise JSONDecodeError("Expecting value", s, idx)
    integer, frac, exp = m.groups()
    if frac or exp:
        return float(integer + (frac or "") + (exp or "")), m.end()
    return int(integer), m.end()  # ValueError beyond the int digit limit, as json.loads


def loads_iterative(data: bytes | bytearray | str) -> Any:
    """`json.loads(data)` without recursion: any depth, the same values, the same refusals.

    An explicit stack of open containers replaces the recursive descent: a `[` or `{` pushes one,
    a complete value is stored into the innermost, a `]` or `}` pops it and stores it in turn.
    """
    s = _text(data)
    end = len(s)
    stack: list[list[Any] | dict[str, Any]] = []
    keys: list[str] = []  # the pending member name of each open object, in stack order
    idx = _skip(s, 0)
    while True:
        c = s[idx : idx + 1]
        value: Any
        if c == "{":
            idx = _skip(s, idx + 1)
            if s[idx : idx + 1] == "}":
                value, idx = {}, idx + 1
            else:
                key, idx = _key(s, idx)
                stack.append({})
                keys.append(key)
                continue
        elif c == "[":
            idx = _skip(s, idx + 1)
            if s[idx : idx + 1] == "]":
                value, idx = [], idx + 1
            else:
                stack.append([])
                continue
        else:
            value, idx = _scalar(s, idx)
        # a complete value: store it, then close every container that ends right after it
        while True:
            if not stack:
                idx = _skip(s, idx)
                if idx != end:
                    raise JSONDecodeError("Extra data", s, idx)
                return value
            top = stack[-1]
            if isinstance(top, list):
                top.append(value)
            else:
                top[keys[-1]] = value
            idx = _skip(s, idx)
            c = s[idx : idx + 1]
            if c == ",":
                idx = _skip(s, idx + 1)
                if isinstance(top, dict):
                    keys[-1], idx = _key(s, idx)
                break  # the next element's value
            if c == ("]" if isinstance(top, list) else "}"):
                idx += 1
                value = stack.pop()
                if isinstance(value, dict):
                    keys.pop()
                continue
            raise JSONDecodeError("Expecting ',' delimiter", s, idx)


# --- writing -------------------------------------------------------------------------------------


def _string(s: str) -> str:
    """A JSON string literal: UTF-8 as it is, but a lone surrogate as its escape (valid UTF-8)."""
    if s.isascii():
        return encode_basestring(s)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return encode_basestring_ascii(s)
    return encode_basestring(s)


def _float(f: float) -> str:
    if f != f:
        return "NaN"
    if f == float("inf"):
        return "Infinity"
    if f == float("-inf"):
        return "-Infinity"
    return float.__repr__(f)


def _atom(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return _float(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _key_text(key: Any) -> str:
    """A member name as json.dumps writes it (str keys as they are; numbers, bools, None as text)."""
    if isinstance(key, str):
        return key
    if isinstance(key, float):
        return _float(key)
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, int):
        return int.__repr__(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def dumps_text(value: Any, *, sort_keys: bool = False) -> str:
    """`json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=...)`, iteratively.

    Lists and tuples are arrays, dicts objects; a lone surrogate is escaped so the text encodes
    to UTF-8. TypeError for anything else, as json.dumps (no circular check: parsed JSON has none).
    """
    out: list[str] = []
    # a work stack: values still to write, and the literal pieces (_Piece) that go between them
    work: list[Any] = [value]
    while work:
        item = work.pop()
        if isinstance(item, _Piece):
            out.append(item.text)
            continue
        if isinstance(item, dict):
            if not item:
                out.append("{}")
                continue
            pairs = [(_key_text(k), v) for k, v in item.items()]
            if sort_keys:
                pairs.sort(key=lambda kv: kv[0])
            out.append("{")
            work.append(_CLOSE_OBJECT)
            for i in range(len(pairs) - 1, -1, -1):
                k, v = pairs[i]
                work.append(v)
                work.append(_Piece(("," if i else "") + _string(k) + ":"))
            continue
        if isinstance(item, list | tuple):
            if not item:
                out.append("[]")
                continue
            out.append("[")
            work.append(_CLOSE_ARRAY)
            for i in range(len(item) - 1, -1, -1):
                work.append(item[i])
                if i:
                    work.append(_COMMA)
            continue
        out.append(_atom(item))
    return "".join(out)


class _Piece:
    """Literal text in dumps_text's work stack (never confused with a value to encode)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


_CLOSE_OBJECT = _Piece("}")
_CLOSE_ARRAY = _Piece("]")
_COMMA = _Piece(",")


def dumps(value: Any, *, finite: bool = False) -> bytes:
    """Compact JSON bytes: orjson when it writes `value` faithfully, else `dumps_text`.

    orjson refuses nesting deeper than 254, integers beyond 64 bits and lone surrogates, and
    writes NaN / Infinity as null; those values go through the iterative encoder instead. Only
    an output holding `null` can hide a NaN, so only then is the value walked to look for one;
    `finite=True` says there is none (orjson read the value: it refuses them).
    """
    try:
        out = orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError: depth, big integers, surrogates
        return dumps_text(value).encode("utf-8")
    if finite or b"null" not in out or _orjson_faithful(value):
        return out
    return dumps_text(value).encode("utf-8")


def _orjson_faithful(value: Any) -> bool:
    """No non-finite float anywhere (orjson would write null); walked without recursion."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                return False
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
    return True


# --- depth ---------------------------------------------------------------------------------------


_CONTAINERS = (dict, list, tuple)


def max_depth(value: Any) -> int:
    """Nesting depth of a JSON-like value (a scalar is 0, `[]` is 1, `[[1]]` is 2), iteratively:
    one level at a time, only the containers of each kept for the next (the record path asks this
    of every prompt, mostly strings)."""
    depth = 0
    level = [value] if isinstance(value, _CONTAINERS) else []
    while level:
        depth += 1
        below: list[Any] = []
        for v in level:
            for child in v.values() if isinstance(v, dict) else v:
                if isinstance(child, _CONTAINERS):
                    below.append(child)
        level = below
    return depth


def cap_depth(value: Any, limit: int, marker: Any) -> Any:
    """A copy of `value` where every container nested `limit` levels deep is replaced by `marker`.

    `cap_depth(x, 2, M)` keeps `{"a": [1]}` and turns `{"a": [[1]]}` into `{"a": [M]}`. Values within
    the limit are returned as they are (no copy), so a normal payload costs one walk.
    """
    if max_depth(value) <= limit:
        return value
    root: list[Any] = [None]
    work: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 0)]
    while work:
        v, parent, slot, depth = work.pop()
        if isinstance(v, dict | list | tuple):
            if depth >= limit:
                parent[slot] = marker
            elif isinstance(v, dict):
                out: dict[Any, Any] = dict.fromkeys(v)
                parent[slot] = out
                work.extend((c, out, k, depth + 1) for k, c in v.items())
            else:
                items: list[Any] = [None] * len(v)
                parent[slot] = items
                work.extend((c, items, i, depth + 1) for i, c in enumerate(v))
        else:
            parent[slot] = v
    return root[0]
