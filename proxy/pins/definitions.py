"""A tool's definition as Tripwire pins it, its hash, the diff of two, and hidden-instruction markers.

Pure: no I/O. What is pinned is what an agent (or a person) trusted when it read the list: the
tool's `name`, `description`, `inputSchema` and `annotations`. The hash is SHA-256 over canonical
JSON (keys sorted, no whitespace), so the order a server writes its keys in changes nothing.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from typing import Any

import orjson

PINNED_FIELDS = ("name", "description", "inputSchema", "annotations")


def definition(tool: dict[str, Any]) -> dict[str, Any]:
    """The pinned part of a listed tool (absent fields are null, so adding one is a change)."""
    return {key: tool.get(key) for key in PINNED_FIELDS}


def definition_hash(defn: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(defn, option=orjson.OPT_SORT_KEYS)).hexdigest()


def diff(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{field: {"from": old value, "to": new value}} for each pinned field that differs."""
    before = old or {}
    return {
        key: {"from": before.get(key), "to": new.get(key)}
        for key in PINNED_FIELDS
        if before.get(key) != new.get(key)
    }


# Bidi controls (Trojan Source: text that reads differently than it runs), zero-width and other
# invisible format characters, and the Unicode "tag" block (ASCII smuggled invisibly).
_BIDI = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_INVISIBLE = set("\u00ad\u034f\u115f\u1160\u180e\u200b\u200c\u200d\u2060\u2061\u2062\u2063\u2064\ufeff")
# `<IMPORTANT>`-style tags: what the published tool-poisoning examples hide instructions in
_TAG = re.compile(
    r"<\s*/?\s*(important|system|instructions?|secret|hidden|admin|assistant|critical|override)\b[^>]*>",
    re.IGNORECASE,
)
MAX_MARKERS = 8  # per text: enough to show what was found


# every character `hidden_markers` reports, as one class (Unicode's format characters, Cf, the
# invisible ones above, the tag block), so ordinary text is one regex search
_SUSPICIOUS = re.compile(
    "[\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u115f\u1160\u180e"
    "\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e007f]"
)


def hidden_markers(text: str) -> list[str]:
    """What in `text` hides instructions from a person reading it: invisible Unicode, bidi
    controls, tag characters, `<IMPORTANT>`-style tags. Empty for ordinary text."""
    found: list[str] = []
    seen: set[str] = set()
    if "<" not in text and (text.isascii() or _SUSPICIOUS.search(text) is None):
        return found  # (most descriptions and results: one scan)
    for match in _SUSPICIOUS.finditer(text) if not text.isascii() else ():
        ch = match.group(0)
        if ch in seen:
            continue
        code = ord(ch)
        if ch in _BIDI:
            kind = "bidi control"
        elif ch in _INVISIBLE or 0xE0000 <= code <= 0xE007F:
            kind = "tag character" if code >= 0xE0000 else "invisible character"
        elif unicodedata.category(ch) == "Cf":
            kind = "invisible character"
        else:
            continue
        seen.add(ch)
        found.append(f"{kind} U+{code:04X}")
        if len(found) >= MAX_MARKERS:
            return found
    for match in _TAG.finditer(text):
        tag = f"tag {match.group(0)[:40]}"
        if tag not in found:
            found.append(tag)
        if len(found) >= MAX_MARKERS:
            break
    return found


def texts_of(value: Any) -> list[str]:
    """Every string in a JSON value (a description, a schema, a tool result), depth first."""
    out: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return out


def markers_in(value: Any) -> list[str]:
    """The hidden-instruction markers anywhere in a JSON value."""
    found: list[str] = []
    for text in texts_of(value):
        for marker in hidden_markers(text):
            if marker not in found:
                found.append(marker)
    return found[:MAX_MARKERS]
