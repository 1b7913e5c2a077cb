"""Duplicate keys in a JSON body (attack round 2, docs/gateway.md "Fail closed").

`{"tools": [shell], "tools": [search]}` is read by orjson (and Python's json) as its last `tools`;
a server keeping the first reads `shell`. What Tripwire judged must be what the upstream reads, and
the body is forwarded byte for byte, so a body naming a key twice in one object is refused while
policy applies.

Pure. Fast path: the parsed body written back compactly is the body sent (clients write compact
JSON), so no key was dropped. Otherwise the key tokens of the text (a JSON string followed by `:`;
strings are matched whole, so a `":` inside one does not count) against the keys of the parsed
value: each object of it holds a key once, so fewer parsed keys than key tokens is a duplicate.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# a JSON string token, whole (escapes included), then the `:` that makes it a key, if any
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"([ \t\r\n]*:)?', re.DOTALL)


def key_tokens(raw: bytes) -> int:
    """How many object keys the JSON text `raw` spells (any of JSON's encodings, a BOM or not)."""
    text = raw.decode(json.detect_encoding(raw), "surrogatepass")
    colons = _STRING.findall(text)  # each string's following colon, or ""
    return len(colons) - colons.count("")


def parsed_keys(value: Any) -> int:
    """How many object keys the parsed value holds, at any depth."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            count += len(item)
            stack.extend(v for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend(v for v in item if isinstance(v, (dict, list)))
    return count


def has_duplicate_keys(raw: bytes, parsed: Any) -> bool:
    """True when some object of the JSON text `raw` (read as `parsed`) names a key twice."""
    if not isinstance(parsed, (dict, list)):
        return False
    try:
        if orjson.dumps(parsed) == raw:
            return False
    except (TypeError, orjson.JSONEncodeError):  # NaN, big integers, depth: counted below
        pass
    try:
        return key_tokens(raw) != parsed_keys(parsed)
    except UnicodeDecodeError:
        return True  # (the body was read, so its text decodes; refuse what does not)
