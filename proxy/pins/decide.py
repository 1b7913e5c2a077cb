"""Pinned tool definitions: what a server's `tools/list` is judged against, and the judgement.

Pure: the pins of one server and a listed page in, findings and the writes to make out (no I/O,
the clock passed in). The store (proxy/pins/store.py) keeps the pins; the service
(proxy/pins/service.py) reads them, asks here, writes back.

- The first list of a server pins every tool (`tool_pinned`). Pages before the last one (a
  `nextCursor`) keep the pins open ("unsealed"): every tool they bring is pinned too.
- Later, a tool whose definition differs from its pin is a `tool_changed` finding, a tool with no
  pin a `tool_added` one: either is kept as a *change* of the server (pending, or denied by a
  person), with the definition offered, until a person approves it (it is then pinned) or the
  server offers the pinned definition again.
- What an agent sees of a pending change is its action (`tool_changes` / `tool_added`): `ask` and
  `block` leave the tool out of the list (its call is held for a person, or refused), `warn` lists
  it (the finding is written once per definition), `off` looks at nothing. A denied change is left
  out and refused under any action but `off`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from proxy.constants import GUARD_TOOL_CHANGED
from proxy.pins.definitions import definition, definition_hash, diff, markers_in

PinAction = Literal["ask", "block", "warn", "off"]
MarkerAction = Literal["warn", "block", "off"]
CallVerdict = Literal["allow", "ask", "block"]

__all__ = ["GUARD_TOOL_CHANGED"]  # the guard code of a held or refused call of a changed tool

PENDING, DENIED = "pending", "denied"
CHANGED, ADDED = "changed", "added"
# finding kinds (the STATE_UPDATE names, the metric's label)
TOOL_PINNED, TOOL_CHANGED, TOOL_ADDED, HIDDEN_INSTRUCTIONS = (
    "tool_pinned",
    "tool_changed",
    "tool_added",
    "hidden_instructions",
)


@dataclass(frozen=True)
class PinPolicy:
    """What one agent's lists and calls of one server do about changes (config resolved)."""

    tool_changes: PinAction = "ask"
    tool_added: PinAction = "warn"
    hidden_instructions: MarkerAction = "warn"

    @property
    def off(self) -> bool:
        return self.tool_changes == self.tool_added == self.hidden_instructions == "off"

    def action(self, kind: str) -> PinAction:
        return self.tool_changes if kind == CHANGED else self.tool_added


@dataclass(frozen=True)
class Pin:
    hash: str
    definition: dict[str, Any]
    pinned_at: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Pin:
        return cls(str(data["hash"]), dict(data.get("definition") or {}), float(data.get("pinned_at", 0)))


@dataclass(frozen=True)
class Change:
    """A definition the server offers that nobody approved yet (or a person denied)."""

    kind: str  # CHANGED | ADDED
    hash: str
    definition: dict[str, Any]
    status: str  # PENDING | DENIED
    seen_at: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Change:
        return cls(
            str(data["kind"]),
            str(data["hash"]),
            dict(data.get("definition") or {}),
            str(data.get("status", PENDING)),
            float(data.get("seen_at", 0)),
        )


@dataclass(frozen=True)
class ServerPins:
    server: str
    tools: Mapping[str, Pin] = field(default_factory=dict)
    changes: Mapping[str, Change] = field(default_factory=dict)
    sealed: bool = False  # a whole list was seen: a tool with no pin is now an addition

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "sealed": self.sealed,
            "tools": {name: pin.to_json() for name, pin in sorted(self.tools.items())},
            "changes": {
                name: {**change.to_json(), "diff": diff(self.pinned(name), change.definition)}
                for name, change in sorted(self.changes.items())
            },
        }

    def pinned(self, tool: str) -> dict[str, Any] | None:
        pin = self.tools.get(tool)
        return pin.definition if pin is not None else None


# A write for the store: ("pin", tool, Pin) a first pin (kept if another replica pinned first),
# ("repin", tool, Pin) a person's approval, ("change", tool, Change), ("unchange", tool, None),
# ("seal", "", None).
Write = tuple[str, str, Any]


@dataclass(frozen=True)
class Finding:
    kind: str  # TOOL_PINNED | TOOL_CHANGED | TOOL_ADDED | HIDDEN_INSTRUCTIONS
    server: str
    action: str  # what the agent's config does about it ("pinned" for a first pin)
    tools: tuple[str, ...]
    hash: str | None = None
    old_hash: str | None = None
    diff: dict[str, Any] | None = None
    markers: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"server": self.server, "action": self.action}
        if self.kind == TOOL_PINNED:
            out["tools"] = list(self.tools)
        else:
            out["tool"] = self.tools[0]
        if self.hash is not None:
            out["hash"] = self.hash
        if self.old_hash is not None:
            out["old_hash"] = self.old_hash
        if self.diff is not None:
            out["diff"] = self.diff
        if self.markers:
            out["markers"] = list(self.markers)
        return out


@dataclass
class ListVerdict:
    hidden: set[str] = field(default_factory=set)  # tools left out of this agent's list
    findings: list[Finding] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)


def judge_list(
    pins: ServerPins, listed: Iterable[Any], policy: PinPolicy, now: float, *, last_page: bool
) -> ListVerdict:
    """One page of a server's `tools/list` against its pins, for an agent with `policy`."""
    verdict = ListVerdict()
    first: list[str] = []
    for tool in listed:
        name = tool.get("name") if isinstance(tool, dict) else None
        if not isinstance(name, str):
            continue
        defn = definition(tool)
        digest = definition_hash(defn)
        pin = pins.tools.get(name)
        change = pins.changes.get(name)
        new_definition = False
        if pin is not None and pin.hash == digest:
            if change is not None:  # offered as pinned again: nothing is pending any more
                verdict.writes.append(("unchange", name, None))
        elif pin is None and not pins.sealed:
            verdict.writes.append(("pin", name, Pin(digest, defn, now)))
            first.append(name)
            new_definition = True
        else:
            kind = CHANGED if pin is not None else ADDED
            action = policy.action(kind)
            if action != "off":
                if change is None or change.hash != digest:
                    change = Change(kind, digest, defn, PENDING, now)
                    verdict.writes.append(("change", name, change))
                    verdict.findings.append(
                        Finding(
                            TOOL_CHANGED if kind == CHANGED else TOOL_ADDED,
                            pins.server,
                            action,
                            (name,),
                            hash=digest,
                            old_hash=pin.hash if pin is not None else None,
                            diff=diff(pin.definition if pin is not None else None, defn),
                        )
                    )
                    new_definition = True
                if change.status == DENIED or action in ("ask", "block"):
                    verdict.hidden.add(name)
        if policy.hidden_instructions != "off" and (new_definition or policy.hidden_instructions == "block"):
            markers = _markers_of(digest, defn)
            if markers:
                if policy.hidden_instructions == "block":
                    verdict.hidden.add(name)
                if new_definition:  # reported once per definition, not on every list
                    verdict.findings.append(
                        Finding(
                            HIDDEN_INSTRUCTIONS,
                            pins.server,
                            policy.hidden_instructions,
                            (name,),
                            hash=digest,
                            markers=tuple(markers),
                        )
                    )
    if first:
        verdict.findings.insert(0, Finding(TOOL_PINNED, pins.server, "pinned", tuple(first)))
    if last_page and not pins.sealed:
        verdict.writes.append(("seal", "", None))
    return verdict


_MARKERS: dict[str, list[str]] = {}  # definition hash -> its markers (a list is judged again and again)
MAX_REMEMBERED = 4096


def _markers_of(digest: str, defn: dict[str, Any]) -> list[str]:
    found = _MARKERS.get(digest)
    if found is None:
        found = markers_in([defn.get("description"), defn.get("inputSchema"), defn.get("annotations")])
        if len(_MARKERS) >= MAX_REMEMBERED:
            _MARKERS.clear()
        _MARKERS[digest] = found
    return found


def judge_call(pins: ServerPins, tool: str, policy: PinPolicy) -> tuple[CallVerdict, Change | None]:
    """A `tools/call` of `tool` (the server's own name): held (`ask`), refused (`block`) or not."""
    change = pins.changes.get(tool)
    if change is None:
        return "allow", None
    action = policy.action(change.kind)
    if action == "off":
        return "allow", change
    if change.status == DENIED or action == "block":
        return "block", change
    if action == "ask":
        return "ask", change
    return "allow", change


def approve(pins: ServerPins, tool: str, now: float, expected_hash: str | None = None) -> list[Write]:
    """A person approved the change of `tool`: its offered definition is pinned. Nothing when
    there is no such change (or it is no longer the definition the person saw)."""
    change = pins.changes.get(tool)
    if change is None or (expected_hash is not None and change.hash != expected_hash):
        return []
    return [("repin", tool, Pin(change.hash, change.definition, now)), ("unchange", tool, None)]


def deny(pins: ServerPins, tool: str, expected_hash: str | None = None) -> list[Write]:
    """A person denied the change of `tool`: kept out of lists and refused until the server offers
    another definition (a new finding), the pinned one again, or the pins are reset."""
    change = pins.changes.get(tool)
    if change is None or (expected_hash is not None and change.hash != expected_hash):
        return []
    return [("change", tool, dataclasses.replace(change, status=DENIED))]


def apply(pins: ServerPins, writes: Iterable[Write]) -> ServerPins:
    """The pins after `writes` (what the store does, in memory)."""
    tools, changes, sealed = dict(pins.tools), dict(pins.changes), pins.sealed
    for op, tool, value in writes:
        if op == "pin":
            tools.setdefault(tool, value)
        elif op == "repin":
            tools[tool] = value
        elif op == "change":
            changes[tool] = value
        elif op == "unchange":
            changes.pop(tool, None)
        elif op == "seal":
            sealed = True
    return ServerPins(pins.server, tools, changes, sealed)
