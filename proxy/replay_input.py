"""What `tripwire replay` reads of a run, validated where it is read (SPEC §5.7).

A run directory is a file anyone may have written: the viewer's replay button and the command line
read it, so nothing of it is trusted. events.jsonl is read line by line into the models below (the
parts of an event replay uses; the rest of a payload is ignored); a line that is not a JSON object,
or whose payload, `call_seq` or `guard_input` is not what Tripwire writes, is a `BadRecord` naming
the run, the file and the line, never an AttributeError or IndexError half-way through a replay.
Only regular files are read (`storage.open_run_file`): a FIFO or a symlink is a `BadRecord` too.
An unterminated last line is a line still being written (a live run): left out unless it is whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError, model_validator

from proxy.constants import GUARD_KILL_SWITCH, GUARD_TOOL_CHANGED, RETRYABLE_GUARDS, EventType
from proxy.guards.config import GuardConfig
from proxy.storage import EVENTS_JSONL, TRIPWIRE_JSON, NotRegularFile, load_json, read_run_file

# guards whose decisions replay lists as recorded, not recomputed (state outside the run: the circuit
# per agent and upstream, rate limits per agent; an operator's act)
RECORDED_ONLY_GUARDRAILS = RETRYABLE_GUARDS | {GUARD_KILL_SWITCH, GUARD_TOOL_CHANGED}
# STATE_UPDATEs of what the pins found in MCP lists and results (docs/mcp.md "Changed tools")
PIN_FINDINGS = frozenset({"tool_changed", "tool_added", "hidden_instructions"})
DECISION_ACTIONS = ("warn", "block", "terminate")


class ReplayError(ValueError):
    """A run that cannot be replayed (no such run, no events, a file that is not what Tripwire writes)."""


class BadRecord(ReplayError):
    """A run file replay refuses: names the run, the file and (for events.jsonl) the line."""

    def __init__(self, run_id: str, file: str, line: int | None, problem: str) -> None:
        where = (
            f"{file} line {line}: " if line is not None else "" if problem.startswith(file) else f"{file}: "
        )
        super().__init__(_printable(f"run {run_id}: {where}{problem}"))
        self.run_id = run_id
        self.file = file
        self.line = line
        self.problem = problem


def _printable(text: str) -> str:
    """One line whatever the file held (a key of it may be in the message): control characters escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class _Read(BaseModel):
    # newer traces may carry more: ignored; a model is never changed once read
    model_config = ConfigDict(extra="ignore", frozen=True)


class HistoryDelta(_Read):
    """An LLM call's history as a change of the previous request's (proxy.guard_trace.llm_inputs)."""

    keep: NonNegativeInt = 0
    add: list[list[tuple[str, str, str, str]]] = Field(default_factory=list)  # [id, tool, sig, ident]
    turn_start: NonNegativeInt = 0
    results: dict[str, tuple[str, str | None]] = Field(default_factory=dict)  # id -> [result, error]


class GuardInput(_Read):
    """What the live guards were given for one call, and when (proxy.guard_trace)."""

    kind: str = "llm"  # "tool" (MCP) or "llm"
    t: float = 0.0
    ev: NonNegativeInt = 0
    done: NonNegativeInt = 0
    cfg: int = 0
    config: GuardConfig | None = None
    decisions: list[list[Any]] = Field(default_factory=list)
    breaker: Any = None
    # settled: its place among the answers, and what the answer brought
    rank: int | None = None
    t_end: float | None = None
    released: bool = False
    # an MCP tool call
    tool: str | None = None
    server: str | None = None
    sig: str | None = None
    id: str | None = None
    est: float = 0.0
    res: str = ""
    err: str | None = None
    # an LLM call
    hist: HistoryDelta | None = None
    tok: int = 0
    echo: list[Any] | None = None  # proxy.guards.loop.replies.Echo.record()
    cost: float = 0.0
    tokens: int = 0

    @model_validator(mode="after")
    def _tool_identity(self) -> GuardInput:
        if self.kind == "tool" and (self.sig is None or self.id is None):
            raise ValueError("a tool call's guard_input needs its sig and id")
        return self


class Usage(_Read):
    total_tokens: int | None = None


class Payload(_Read):
    """The parts of an event's payload replay reads."""

    call_seq: int | None = None
    guard_input: GuardInput | None = None
    raised: dict[str, float] | None = None  # STATE_UPDATE limits_raised (proxy/guards/raises.py)
    decision: Any = None  # STATE_UPDATE approval_decided: how a held call ended (SPEC §5.5a)
    covers_until: int | None = None  # ... and the last call an approved loop goes on to
    # RUN_START of a resumed run (SPEC §5.5a): the spend and counts its session carried over
    carried_over: dict[str, Any] | None = None
    # the ERROR of a guard, the LOOP_WARNING of a cycle
    guardrail: str | None = None
    kind: Any = None
    action: Any = None
    message: Any = None
    # what an AgentDbg SDK run's calls carry
    cost_usd: float | None = None
    usage: Usage | None = None
    tool_name: Any = None
    args: Any = None
    result: Any = None
    status: Any = None
    error: Any = None


class Event(_Read):
    event_type: str | None = None
    event_id: str | None = None
    name: str | None = None
    ts: Any = None
    run_id: str | None = None
    payload: Payload = Field(default_factory=Payload)

    @model_validator(mode="before")
    @classmethod
    def _null_payload(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("payload") is None:  # AgentDbg writes null for none
            return {k: v for k, v in data.items() if k != "payload"}
        return data

    @model_validator(mode="after")
    def _recorded_decision(self) -> Event:
        """The breaker's and the kill switch's ERRORs are listed as recorded: each must be a decision."""
        p = self.payload
        if self.event_type == EventType.ERROR and p.guardrail in RECORDED_ONLY_GUARDRAILS:
            if p.action is not None and p.action not in DECISION_ACTIONS:
                raise ValueError(
                    f"payload.action: a {p.guardrail} decision is one of {', '.join(DECISION_ACTIONS)}"
                )
            if p.kind is not None and not isinstance(p.kind, str):
                raise ValueError("payload.kind: Input should be a valid string")
        return self

    @property
    def guarded(self) -> bool:
        """A call Tripwire's guards judged: its arrival number and what they were given."""
        return self.payload.call_seq is not None and self.payload.guard_input is not None


class Meta(_Read):
    """tripwire.json's parts replay reads."""

    agent_name: str | None = None
    guard_config: GuardConfig | None = None


def _problem(e: ValidationError) -> str:
    """A validation error in one line: its first error's place and message (and how many more)."""
    errors = e.errors(include_url=False)
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where + ': ' if where else ''}{first['msg']}{more}"


def read_events(d: Path, run_id: str) -> list[Event]:
    """events.jsonl's events, each validated; BadRecord naming the first line that is not one."""
    path = d / EVENTS_JSONL
    try:
        data = read_run_file(path)
    except NotRegularFile as e:
        raise BadRecord(run_id, EVENTS_JSONL, None, e.strerror or str(e)) from None
    lines = data.split(b"\n")
    last = lines.pop()  # after the last newline: b"", or a line being written (a live run) or torn
    events: list[Event] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            events.append(Event.model_validate(orjson.loads(line)))
        except orjson.JSONDecodeError as e:
            raise BadRecord(run_id, EVENTS_JSONL, n, f"not JSON ({e})") from None
        except ValidationError as e:
            raise BadRecord(run_id, EVENTS_JSONL, n, _problem(e)) from None
    if last.strip():
        try:  # kept when whole (a crash after the line, before its newline), else left out
            events.append(Event.model_validate(orjson.loads(last)))
        except (orjson.JSONDecodeError, ValidationError):
            pass
    return events


def read_meta(d: Path, run_id: str) -> Meta:
    """tripwire.json's agent name and guard config (empty when it is missing or not an object)."""
    try:
        raw = load_json(d / TRIPWIRE_JSON) or {}
    except NotRegularFile as e:
        raise BadRecord(run_id, TRIPWIRE_JSON, None, e.strerror or str(e)) from None
    try:
        return Meta.model_validate(raw)
    except ValidationError as e:
        raise BadRecord(run_id, TRIPWIRE_JSON, None, _problem(e)) from None
