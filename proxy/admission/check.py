"""What one check of admission is (proxy/admission/__init__.py lists them in order).

A check is one folder: its pure rule (proxy/guards/ or beside it), its shared-state twin
(`twin.py`: its Lua fragment of the APPEND script and the same rule in Python, `proxy.state.base.Twin`)
and its refusal (`Refusal`: the guard code on the ERROR and the answer, whether the agent may
retry, whether the session ends).

Per-agent gates (concurrent calls, rate limits) are asked for every call before the session's
guards: the local backend asks their twin's rule on this process's store, the shared backend in the
admission's one round trip; a call a gate refuses is no call of the session (nothing appended, the
later checks not asked). What a gate holds while the call runs (a concurrent call's slot) is given
back when the call ends (`Gate.release`), refused, failed or cancelled alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from proxy.guards.config import GuardConfig
from proxy.guards.decision import Decision
from proxy.state.base import Op, Twin

if TYPE_CHECKING:
    from proxy.exchange import Exchange


@dataclass(frozen=True, slots=True)
class Refusal:
    """How a check refuses: `code` is the guard name on the ERROR event and in the answer;
    `retryable`: an LLM call gets 429 + Retry-After, an MCP call the BLOCK result saying when;
    `ends_session`: the session is terminated (otherwise it goes on)."""

    code: str
    retryable: bool
    ends_session: bool


class Gate(Protocol):
    """A per-agent check asked before the session's guards (`Check.gate`)."""

    twin: Twin

    def ask(self, ex: Exchange, config: GuardConfig, member: str) -> Any | None:
        """What the call asks of the gate (its twin's request), None when the gate does not apply.
        `member`: a name unique to the call (the shared check's id; "" on this process's store)."""
        ...

    def refusal(self, request: Any, answer: Any) -> Decision:
        """The decision a refusing answer of the twin stands for."""
        ...

    # given back when the call ends, whatever happened to it (None: nothing held)
    release: Op | None

    def sweep(self, store: dict[str, Any], now: float) -> None:
        """Forget what no longer counts (idle agents hold no memory)."""
        ...


@dataclass(frozen=True, slots=True)
class Check:
    """One entry of `ADMISSION`."""

    name: str
    doc: str  # what it checks, in a line (docs/architecture.md, docs/gateway.md)
    refusals: tuple[Refusal, ...]
    gate: Gate | None = None  # a per-agent gate (its twin asked before the check is appended)
    twin: Twin | None = None  # its shared-state twin (a gate's is `gate.twin`)


class Stores:
    """Each twin's memory store in this process (`proxy.state.base.Store`): the local guard backend's,
    and a shared replica's while the backend is down (fail_open)."""

    def __init__(self) -> None:
        self._stores: dict[str, dict[Any, Any]] = {}

    def store(self, name: str) -> dict[Any, Any]:
        found = self._stores.get(name)
        if found is None:
            found = self._stores[name] = {}
        return found

    def items(self) -> list[tuple[str, dict[str, Any]]]:
        return list(self._stores.items())


@dataclass(frozen=True, slots=True)
class Hold:
    """What a gate holds for a call until it ends: the operation that gives it back, its request,
    and where it was taken (the shared backend, or this process's store)."""

    op: Op
    request: Any
    shared: bool
