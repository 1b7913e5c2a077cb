"""Budgets over time in the shared state (SPEC §9): what a backend keeps of an agent's windows,
`tripwire:window:<agent>:<period key>` (proxy/state/keys.py), and the rules both backends apply.

`RedisBackend` runs each operation as one Lua script (proxy/state/lua.py `WINDOW_*`; the reservation
also inside the admission's APPEND, so a call's windows cost no round trip of their own);
`MemoryBackend` applies the same rules here in Python (`MemoryWindows`), and tests/test_state_backend
runs one contract against both. The headers are built by proxy/guard_backend/shared_windows.py:

- reserve: {id, usd, tok, now, stale, place, force, w: [{max_usd, max_tok (-1: none), ttl (ms),
  spent, tokens, alerted}]}; a window the backend lost is first put back from `spent`, `tokens`,
  `alerted` (what the replica last saw; until a reset, a replica that saw more raises it). Answers (index of the refusing window or 0, rows before
  this call's reservation);
- settle: {id, usd, tok, w: [{ttl, alert_usd, alert_tok, spent, tokens, alerted}]}; answers
  (spent, tokens, crossed the soft alert first) per window;
- release: {id}; reset: {w: [{ttl}]}.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

Row = tuple[float, int, float, int, bool]  # spent, tokens, reserved usd, reserved tokens, alerted
Reserved = tuple[int, list[Row]]  # index (from 1) of the window that refuses, 0: none; the rows
Settled = list[tuple[float, int, bool]]  # spent, tokens, this settle crossed the soft alert first


@dataclass(frozen=True, slots=True)
class WindowRequest:
    """A call's reservation in its agent's windows, made in the admission's step (`Append.windows`)."""

    keys: Sequence[str]
    header: Mapping[str, Any]


class WindowStore(Protocol):
    async def reserve(self, keys: Sequence[str], header: Mapping[str, Any]) -> Reserved: ...
    async def settle(self, keys: Sequence[str], header: Mapping[str, Any]) -> Settled: ...
    async def release(self, keys: Sequence[str], header: Mapping[str, Any]) -> None: ...
    async def reset(self, keys: Sequence[str], header: Mapping[str, Any]) -> None: ...


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def parse_reserved(reply: Sequence[Any]) -> Reserved:
    """A reserve script's answer (Redis turns Lua numbers into integers: floats come as strings)."""
    refused, rows = reply
    return int(refused), [
        (float(_text(r[0])), int(_text(r[1])), float(_text(r[2])), int(_text(r[3])), _text(r[4]) == "1")
        for r in rows
    ]


@dataclass
class _Window:
    spent: float = 0.0
    tokens: int = 0
    alerted: bool = False
    held: dict[str, tuple[float, int, float]] = field(default_factory=dict)  # id -> usd, tokens, at
    seeded: bool = False  # put back by a replica (not reset since)


class MemoryWindows:
    """The windows in this process, by the Lua scripts' rules (expiry left out: a test's lifetime)."""

    def __init__(self) -> None:
        self.windows: dict[str, _Window] = {}

    def _seed(self, key: str, w: Mapping[str, Any]) -> _Window:
        window = self.windows.get(key)
        if window is None:  # lost (or new): put back what the caller last saw
            window = self.windows[key] = _Window(
                float(w["spent"]), int(w["tokens"]), bool(w["alerted"]), seeded=True
            )
        elif window.seeded:  # until a reset, the most any replica saw wins
            window.spent = max(window.spent, float(w["spent"]))
            window.tokens = max(window.tokens, int(w["tokens"]))
            window.alerted = window.alerted or bool(w["alerted"])
        return window

    async def reserve(self, keys: Sequence[str], header: Mapping[str, Any]) -> Reserved:
        return self.reserve_now(keys, header)

    def reserve_now(self, keys: Sequence[str], header: Mapping[str, Any]) -> Reserved:
        """`reserve` in one step (also the budget window twin's rule inside `MemoryBackend.append`)."""
        refused, rows = 0, []
        now, stale = float(header["now"]), float(header["stale"])
        for i, (key, w) in enumerate(zip(keys, header["w"], strict=True), start=1):
            window = self._seed(key, w)
            window.held = {k: v for k, v in window.held.items() if v[2] >= now - stale}
            rusd = sum(v[0] for v in window.held.values())
            rtok = sum(v[1] for v in window.held.values())
            over_usd = w["max_usd"] >= 0 and window.spent + rusd >= w["max_usd"]
            over_tok = w["max_tok"] >= 0 and window.tokens + rtok >= w["max_tok"]
            if refused == 0 and (over_usd or over_tok):
                refused = i
            rows.append((window.spent, window.tokens, rusd, rtok, window.alerted))
        if header["place"] and (refused == 0 or header["force"]):
            for key in keys:
                self.windows[key].held[str(header["id"])] = (float(header["usd"]), int(header["tok"]), now)
        return refused, rows

    async def settle(self, keys: Sequence[str], header: Mapping[str, Any]) -> Settled:
        out: Settled = []
        for key, w in zip(keys, header["w"], strict=True):
            window = self._seed(key, w)
            window.held.pop(str(header["id"]), None)
            window.spent += float(header["usd"])
            window.tokens += int(header["tok"])
            crossed = False
            reached = (w["alert_usd"] >= 0 and window.spent >= w["alert_usd"]) or (
                w["alert_tok"] >= 0 and window.tokens >= w["alert_tok"]
            )
            if reached and not window.alerted:
                window.alerted = crossed = True
            out.append((window.spent, window.tokens, crossed))
        return out

    async def release(self, keys: Sequence[str], header: Mapping[str, Any]) -> None:
        for key in keys:
            window = self.windows.get(key)
            if window is not None:
                window.held.pop(str(header["id"]), None)

    async def reset(self, keys: Sequence[str], header: Mapping[str, Any]) -> None:
        for key in keys:
            window = self.windows.setdefault(key, _Window())
            window.spent, window.tokens, window.alerted, window.seeded = 0.0, 0, False, False
