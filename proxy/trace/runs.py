"""The run registry: the runs this recorder has open, in memory (counts, usage, tags, tripwire.json
fields, the lines queued for each), the summaries of runs ended recently, and what a run's run.json,
tripwire.json and RUN_END summary say. Only the event-loop thread touches it; no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from proxy import storage
from proxy.constants import SPEC_VERSION, STATUS_RUNNING, EventType
from proxy.trace.content import encode

ENDED_MEMORY = 10_000  # summaries of ended runs kept for summary() / idempotent end_run
# the event types as plain strs (an enum member's class lookup costs more than the comparison)
_RUN_START: str = EventType.RUN_START.value
BOOKENDS = frozenset({_RUN_START, EventType.RUN_END.value})  # RUN_START and RUN_END
_LLM_CALL: str = EventType.LLM_CALL.value
NO_TAGS: frozenset[str] = frozenset()  # a run's tags until it has one
NO_LINES: tuple[()] = ()  # a run's pending lines while none is queued


class Line(NamedTuple):
    """One queued event: its encoded line (None for RUN_END, encoded when written) and what it counts."""

    data: bytes | None
    event_type: str
    key: str | None  # run.json counts key, if the event counts
    ts: float
    ts_iso: str
    size: int


def counts_of(c: Disk | Run) -> dict[str, int]:
    """run.json's counts object, in its order (`constants.default_counts`), from an object that keeps
    the four counts as fields (a run's accepted events, or its lines on disk)."""
    return {
        "llm_calls": c.llm_calls,
        "tool_calls": c.tool_calls,
        "errors": c.errors,
        "loop_warnings": c.loop_warnings,
    }


@dataclass(slots=True)
class Disk:
    """What a run's files hold: run.json is written from this, never from what is only queued.

    Its four counts are fields, not a dict (`counts` makes one): a run holds a Disk for as long as
    it is live, and a stateless service's every call is a run (issue 33)."""

    llm_calls: int = 0
    tool_calls: int = 0
    errors: int = 0
    loop_warnings: int = 0
    last_ts: float = 0.0
    last_event_ts: str | None = None
    started: bool = False  # RUN_START is in events.jsonl
    ended: bool = False  # RUN_END is in events.jsonl
    size: int | None = None  # events.jsonl's size after the last good append (None: not known yet)

    def add(self, line: Line) -> None:
        self.add_lines([line])

    def add_lines(self, lines: list[Line]) -> None:
        """`add` of each line, in order (a writer pass adds a few dozen at a time)."""
        last_ts, last_iso = self.last_ts, self.last_event_ts
        for line in lines:
            key = line.key
            if key:
                setattr(self, key, getattr(self, key) + 1)  # (a COUNT_FOR_EVENT value: a field)
            if line.ts >= last_ts or last_iso is None:
                last_ts, last_iso = line.ts, line.ts_iso
            if line.event_type in BOOKENDS:
                if line.event_type == _RUN_START:
                    self.started = True
                else:
                    self.ended = True
        self.last_ts, self.last_event_ts = last_ts, last_iso

    def copy(self) -> Disk:
        """A copy to add a job's lines to (dataclasses.replace, without its per-call introspection)."""
        return Disk(
            self.llm_calls,
            self.tool_calls,
            self.errors,
            self.loop_warnings,
            self.last_ts,
            self.last_event_ts,
            self.started,
            self.ended,
            self.size,
        )

    @property
    def counts(self) -> dict[str, int]:
        """run.json's counts object of the lines on disk."""
        return counts_of(self)


@dataclass(slots=True)
class Run:
    """One open run, in memory. Only the event-loop thread touches it. (Slots: a stateless
    service keeps one per call for the idle timeout; without them each held a ~1 KB __dict__.)

    Its folder is `dir`, made from the runs folder every run shares and its id when asked (a Path
    or a str of its own was ~300 bytes a run, issue 33); its four counts, every event accepted,
    are fields (`counts` makes the dict)."""

    run_id: str
    base: str  # the runs folder, `<data_dir>/runs` (one str for all the recorder's runs)
    run_name: str | None
    started: float
    llm_calls: int = 0
    tool_calls: int = 0
    errors: int = 0
    loop_warnings: int = 0
    last_event_ts: str | None = None
    last_ts: float = 0.0
    status: str = STATUS_RUNNING
    ended: float | None = None
    cost_usd: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    tags: AbstractSet[str] = NO_TAGS  # health tags (a set of its own once the first is added)
    fields: dict[str, Any] = field(default_factory=dict)  # tripwire.json fields set by the caller
    # queued, not yet on disk, in order; NO_LINES (shared) while none is: no empty list a run
    pending: list[Line] | tuple[()] = NO_LINES
    end_event: dict[str, Any] | None = None  # RUN_END, encoded when written (summary = what is on disk)
    disk: Disk = field(default_factory=Disk)
    run_json_dirty: bool = True
    tripwire_dirty: bool = True
    dir_made: bool = False
    torn: bool = False  # a failed append may have left bytes past disk.size: cut them before the next
    tripwire_written: bool = False
    run_json_written: bool = False
    meta_due: float = 0.0  # monotonic time before which a live run's metadata rewrite waits
    failing: bool = False  # its last write failed: retried at retry_at, or on flush
    retry_at: float = 0.0
    wait_due: float | None = None  # its entry in the writer's waiting heap

    @property
    def dir(self) -> str:
        """`<data_dir>/runs/<run_id>`, as str(Path) spells it."""
        return f"{self.base}/{self.run_id}"

    @property
    def counts(self) -> dict[str, int]:
        """run.json's counts object of every event accepted."""
        return counts_of(self)

    def add_tags(self, tags: Iterable[str]) -> None:
        if self.tags is NO_TAGS:
            self.tags = set(tags)  # (most runs carry none: no empty set each, issue 33)
        else:
            assert isinstance(self.tags, set)
            self.tags.update(tags)

    def remove_tags(self, tags: Iterable[str]) -> None:
        if self.tags is not NO_TAGS:
            assert isinstance(self.tags, set)
            self.tags.difference_update(tags)

    @property
    def is_open(self) -> bool:
        return self.status == STATUS_RUNNING

    def note_event(self, event_type: str, payload: dict[str, Any] | None, ts: float, ts_iso: str) -> None:
        """An accepted event's effect on the run's usage (LLM_CALL tokens) and last event time."""
        if event_type == _LLM_CALL and isinstance(payload, dict):
            usage = payload.get("usage")
            if isinstance(usage, dict):
                prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
                self.prompt_tokens += prompt if type(prompt) is int else _int(prompt)
                self.completion_tokens += completion if type(completion) is int else _int(completion)
                self.tripwire_dirty = True
        if ts >= self.last_ts or self.last_event_ts is None:
            self.last_ts = ts
            self.last_event_ts = ts_iso


class RunRegistry:
    """The open runs by id, and the summaries of runs ended a while ago (for summary() / end_run)."""

    def __init__(self) -> None:
        self.runs: dict[str, Run] = {}
        self.ended: OrderedDict[str, dict[str, Any]] = OrderedDict()
        # the runs held that `close` ended (their last writes still to do): `open_count` without a
        # pass over every run, which /healthz and the idle sweep ask for (issue 33: 100,000 runs held)
        self._closed: set[str] = set()

    def get(self, run_id: str) -> Run | None:
        return self.runs.get(run_id)

    def known(self, run_id: str) -> bool:
        return run_id in self.runs or run_id in self.ended

    def add(self, run: Run) -> None:
        self.runs[run.run_id] = run

    def pop(self, run_id: str) -> Run | None:
        self._closed.discard(run_id)
        return self.runs.pop(run_id, None)

    def close(self, run: Run, status: str) -> None:
        """The run ended with `status`: no longer open (held until its last writes are done)."""
        run.status = status
        if self.runs.get(run.run_id) is run:
            self._closed.add(run.run_id)

    def open_ids(self) -> list[str]:
        return [rid for rid, run in self.runs.items() if run.status == STATUS_RUNNING]

    def open_count(self) -> int:
        """The runs held that are open: every one but those `close` ended."""
        return len(self.runs) - len(self._closed)

    def summary(self, run_id: str, now: float) -> dict[str, Any]:
        run = self.runs.get(run_id)
        if run is not None:
            return summary(run, run.ended if run.ended is not None else now)
        return dict(self.ended.get(run_id, {}))

    def retire(self, run: Run) -> None:
        """An ended run leaves memory; its summary is kept for a while."""
        self.pop(run.run_id)
        self.ended[run.run_id] = summary(run, run.ended if run.ended is not None else run.last_ts)
        while len(self.ended) > ENDED_MEMORY:
            self.ended.popitem(last=False)


def summary_order(s: dict[str, Any]) -> dict[str, Any]:
    """RUN_END summary with the spec's keys in the spec's order."""
    keys = ("llm_calls", "tool_calls", "errors", "duration_ms", "loop_warnings", "cost_usd", "total_tokens")
    return {k: s.get(k, 0) for k in keys}


def summary(run: Run, now: float) -> dict[str, Any]:
    """RUN_END's summary shape, counting every event accepted (`summary_order`'s keys and order,
    built in one go: an expiry ends thousands of runs in one sweep)."""
    return {
        "llm_calls": run.llm_calls,
        "tool_calls": run.tool_calls,
        "errors": run.errors,
        "duration_ms": max(0, int((now - run.started) * 1000)),
        "loop_warnings": run.loop_warnings,
        "cost_usd": round(run.cost_usd, 10),
        "total_tokens": run.total_tokens,
    }


def run_json(run: Run, disk: Disk | None = None) -> dict[str, Any]:
    """run.json as the files are (or will be once the job's lines are appended): counts, last
    event and end from the events on disk, never from events only queued."""
    disk = disk or run.disk
    ended = disk.ended and run.ended is not None and run.status != STATUS_RUNNING
    return {
        "spec_version": SPEC_VERSION,
        "run_id": run.run_id,
        "run_name": run.run_name,
        "started_at": storage.iso_ms(run.started),
        "ended_at": storage.iso_ms(run.ended) if ended and run.ended is not None else None,
        "duration_ms": max(0, int((run.ended - run.started) * 1000))
        if ended and run.ended is not None
        else None,
        "status": run.status if ended else STATUS_RUNNING,
        "counts": disk.counts,
        "last_event_ts": disk.last_event_ts,
    }


def tripwire_json(run: Run) -> dict[str, Any]:
    return {
        **run.fields,
        "cost_usd": round(run.cost_usd, 10),
        "tokens": {
            "prompt": run.prompt_tokens,
            "completion": run.completion_tokens,
            "total": run.total_tokens,
        },
        "health_tags": sorted(run.tags),
    }


def encode_end(run: Run, counts: dict[str, int]) -> bytes:
    """RUN_END's line, its summary counting the events written before it."""
    event = run.end_event or {}
    payload = dict(event.get("payload") or {})
    payload["summary"] = summary_order({**(payload.get("summary") or {}), **counts})
    return encode({**event, "payload": payload})


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0
