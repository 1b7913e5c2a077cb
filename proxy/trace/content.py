"""What a trace keeps of an event: the envelope AgentDbg writes, with payload and meta redacted and
truncated (proxy.redact.sanitize, `max_field_bytes`), and, for record_content=False, the payload
stripped to metadata (prompt and response structure without text, no tool args or results, tool
names only in loop patterns and guard messages). Pure: no I/O, no run state.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import orjson

from proxy import ids, storage
from proxy.constants import SPEC_VERSION, EventType
from proxy.redact import sanitize

# With record_content=False: these payload fields are dropped (set to null) ...
CONTENT_FIELDS = frozenset({"args", "arguments", "result", "text", "content", "input", "output"})
# ... and these are kept only as structure: inside them, strings survive only under STRUCTURE_KEYS,
# so a prompt keeps its roles and message count, a response its tool names, and no text.
STRIPPED_FIELDS = frozenset({"prompt", "response", "messages"})
STRUCTURE_KEYS = frozenset(
    {"role", "name", "id", "type", "tool_call_id", "call_id", "model", "finish_reason"}
)


def _strip(obj: Any) -> Any:
    """Structure of a prompt/response with its text removed (see STRUCTURE_KEYS)."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if isinstance(v, str):
                out[k] = v if k in STRUCTURE_KEYS else None
            elif k in CONTENT_FIELDS:
                out[k] = None
            else:
                out[k] = _strip(v)
        return out
    if isinstance(obj, list | tuple):
        return [_strip(v) for v in obj]
    return None if isinstance(obj, str) else obj


def strip_content(event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The payload with content removed, for record_content=False: metadata only.

    Kept: model, usage, cost, status, errors, tool names, timings, loop patterns, guard fields and
    STATE_UPDATE state (guard state, not conversation). Dropped: prompt and response text, tool args
    and results, and a TOOL_CALL error's message and details (a failed tool's output lands there).
    """
    out: dict[str, Any] = {}
    for k, v in payload.items():
        if k in STRIPPED_FIELDS:
            out[k] = _strip(v)
        elif k in CONTENT_FIELDS:
            out[k] = None
        elif k == "error" and event_type == EventType.TOOL_CALL and isinstance(v, dict):
            out[k] = {ek: (None if ek in ("message", "details") else ev) for ek, ev in v.items()}
        elif event_type in GUARD_EVENTS and k in ("pattern", "message") and isinstance(v, str):
            # loop patterns and guard messages quote tool arguments and errors: keep tool names only
            out[k] = tool_names_only(v)
        elif isinstance(v, dict):
            out[k] = strip_content(event_type, v)  # e.g. a refused call's summary carries its args
        else:
            out[k] = v
    return out


GUARD_EVENTS = frozenset({EventType.LOOP_WARNING, EventType.ERROR})
_CALL_SIG = re.compile(r"([A-Za-z0-9_.\-/]+)\(")


def tool_names_only(text: str) -> str:
    """`search({"q": "secret"}) -> fetch({...})` becomes `search -> fetch`; other text is dropped."""
    names = _CALL_SIG.findall(text)
    if names:
        return " -> ".join(dict.fromkeys(names))
    head = text.split(":", 1)[0].strip()  # "tool: error text" -> "tool"
    return head if head and " " not in head else "(content not recorded)"


def envelope(
    run_id: str,
    event_type: str,
    name: str,
    payload: dict[str, Any] | None,
    *,
    max_field_bytes: int,
    duration_ms: float | None = None,
    parent_id: str | None = None,
    meta: dict[str, Any] | None = None,
    ts: float,
    sanitized: bool = False,
) -> dict[str, Any]:
    """The AgentDbg event, its name, payload and meta redacted and truncated to `max_field_bytes`
    (`sanitized`: name, payload and meta already are, and are kept as they are)."""
    if sanitized:
        clean: Any = payload or {}
        clean_meta: Any = meta or {}
    else:
        clean = sanitize(payload, max_field_bytes) if payload else {}
        clean_meta = sanitize(meta, max_field_bytes) if meta else {}
    return {
        "spec_version": SPEC_VERSION,
        "event_id": ids.uuid4_text(),
        "run_id": run_id,
        "parent_id": parent_id,
        "event_type": str(event_type),
        "ts": storage.iso_ms(ts),
        "duration_ms": None if duration_ms is None else int(duration_ms) if duration_ms > 0 else 0,
        "name": name if sanitized else sanitize(str(name), max_field_bytes),
        "payload": clean if isinstance(clean, dict) else {"value": clean},
        "meta": clean_meta if isinstance(clean_meta, dict) else {"value": clean_meta},
    }


def encode(event: dict[str, Any]) -> bytes:
    """The event as one events.jsonl line."""
    try:
        return storage.encode_line(event)
    except (TypeError, orjson.JSONEncodeError):
        # sanitize() leaves only JSON types, but an int beyond 64 bits still defeats orjson
        return json.dumps(event, ensure_ascii=False, default=str).encode() + b"\n"


def is_uuid(s: Any) -> bool:
    try:
        uuid.UUID(s)
    except (TypeError, ValueError, AttributeError):
        return False
    return isinstance(s, str) and len(s) == 36
