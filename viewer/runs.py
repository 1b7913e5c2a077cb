"""Read side of the trace store for the viewer: run lists with Tripwire fields, paged events.

The viewer polls every few seconds and a run may hold 100,000 events, so nothing here re-reads
what it has already read: run metadata is cached by file mtime, and each run's events.jsonl gets a
byte-offset index of its complete lines (extended as the file grows), so a page is one seek and
`limit` line parses. The same pass keeps the run's cumulative LLM cost for the sparkline.
Sync file I/O: the API calls these in its own bounded thread pool (viewer.api).
"""

from __future__ import annotations

import logging
import os
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from proxy import storage
from proxy.constants import EVENTS_JSONL, RUN_JSON, TRIPWIRE_JSON, EventType
from proxy.storage import is_valid_run_id, read_json

__all__ = ["RunReader", "is_valid_run_id", "run_summary"]

log = logging.getLogger(__name__)

MAX_INDEXED_RUNS = 32
# an events.jsonl line worth parsing for the cost curve (a cheap test before the JSON parse)
_LLM_CALL_TOKEN = f'"{EventType.LLM_CALL.value}"'.encode()


@dataclass
class _EventIndex:
    """Byte offsets of the complete lines of one events.jsonl, plus cumulative cost points."""

    inode: int = -1
    scanned: int = 0  # bytes covered by complete lines
    offsets: array = field(default_factory=lambda: array("q"))
    cost: float = 0.0
    # (when the call ended, its cost) per LLM_CALL: cost accrues when an answer settles, and calls
    # finish out of start order, so the curve is drawn over end times, cumulated in that order
    cost_calls: list[tuple[float, float]] = field(default_factory=list)


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def run_summary(tw: dict[str, Any] | None) -> dict[str, Any]:
    """The Tripwire fields a run list shows, from tripwire.json (missing file -> empty values)."""
    tw = tw or {}
    tokens = tw.get("tokens")
    if isinstance(tokens, dict):  # the recorder writes {prompt, completion, total}
        total = tokens.get("total", tokens.get("total_tokens"))
        if total is None:
            total = int(tokens.get("prompt") or 0) + int(tokens.get("completion") or 0)
    else:
        total = tokens
    return {
        **tw,
        "agent_name": tw.get("agent_name"),
        "session_id": tw.get("session_id"),
        "cost_usd": tw.get("cost_usd") or 0.0,
        "total_tokens": int(total or 0),
        "health_tags": list(tw.get("health_tags") or []),
    }


class RunReader:
    """Runs under `<data_dir>/runs`; thread-safe; caches keyed by what is on disk."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.base = storage.runs_base(self.data_dir)
        self._lock = threading.Lock()
        self._meta: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}
        self._indexes: OrderedDict[str, _EventIndex] = OrderedDict()

    def run_dir(self, run_id: str) -> Path:
        """ValueError("invalid run_id") unless canonical and inside the runs base."""
        return storage.run_dir(self.data_dir, run_id)

    # --- run metadata ------------------------------------------------------------------------

    def load_run(self, run_id: str) -> dict[str, Any]:
        """run.json as written (AgentDbg's fields); FileNotFoundError when there is none,
        NotRegularFile when it is not a regular file (a FIFO must not hold a worker thread)."""
        meta = storage.load_json(self.run_dir(run_id) / RUN_JSON)
        if meta is None:
            raise FileNotFoundError(run_id)
        return meta

    def load_tripwire(self, run_id: str) -> dict[str, Any]:
        """tripwire.json's run fields; NotRegularFile when it is a FIFO, a symlink..."""
        return run_summary(storage.load_json(self.run_dir(run_id) / TRIPWIRE_JSON))

    def list_runs(self) -> list[dict[str, Any]]:
        """Every run, newest first: run.json plus a `tripwire` object."""
        try:
            entries = [e for e in os.scandir(self.base) if e.is_dir() and is_valid_run_id(e.name)]
        except FileNotFoundError:
            return []
        out = []
        seen = set()
        for e in entries:
            d = Path(e.path)
            key = (_mtime(d / RUN_JSON), _mtime(d / TRIPWIRE_JSON))
            if key[0] == 0:
                continue
            seen.add(e.name)
            cached = self._meta.get(e.name)
            if cached is None or cached[0] != key:
                meta = read_json(d / RUN_JSON)
                if meta is None:
                    continue
                merged = {**meta, "tripwire": run_summary(read_json(d / TRIPWIRE_JSON))}
                cached = (key, merged)
                with self._lock:
                    self._meta[e.name] = cached
            out.append(cached[1])
        with self._lock:
            for gone in set(self._meta) - seen:
                del self._meta[gone]
        out.sort(key=lambda m: str(m.get("started_at") or ""), reverse=True)
        return out

    def delete(self, run_id: str) -> None:
        if not storage.delete_run(self.data_dir, run_id):
            raise FileNotFoundError(run_id)
        with self._lock:
            self._meta.pop(run_id, None)
            self._indexes.pop(run_id, None)

    # --- events ------------------------------------------------------------------------------

    def _index(self, run_id: str) -> tuple[_EventIndex, Path]:
        """Bring the run's line index up to date with the file; caller holds the lock."""
        path = self.run_dir(run_id) / EVENTS_JSONL
        idx = self._indexes.get(run_id)
        if idx is None:
            idx = _EventIndex()
            self._indexes[run_id] = idx
            while len(self._indexes) > MAX_INDEXED_RUNS:
                self._indexes.popitem(last=False)
        else:
            self._indexes.move_to_end(run_id)
        try:
            st = storage.regular_stat(path)
        except storage.NotRegularFile:  # a planted symlink or FIFO is no run file: never read
            del self._indexes[run_id]
            raise
        if st is None:
            self._indexes[run_id] = _EventIndex()
            return self._indexes[run_id], path
        if st.st_ino != idx.inode or st.st_size < idx.scanned:
            idx = _EventIndex(inode=st.st_ino)
            self._indexes[run_id] = idx
        if st.st_size > idx.scanned:
            self._extend(idx, path, st.st_size)
        return idx, path

    @staticmethod
    def _extend(idx: _EventIndex, path: Path, size: int) -> None:
        with storage.open_run_file(path) as f:
            f.seek(idx.scanned)
            chunk = f.read(size - idx.scanned)
        pos = 0
        while True:
            nl = chunk.find(b"\n", pos)
            if nl < 0:
                break  # a line still being written is left for the next call
            line = chunk[pos:nl]
            if line.strip():
                idx.offsets.append(idx.scanned + pos)
                if _LLM_CALL_TOKEN in line:
                    _add_cost(idx, line)
            pos = nl + 1
        idx.scanned += pos

    def count_events(self, run_id: str) -> int:
        with self._lock:
            idx, _ = self._index(run_id)
            return len(idx.offsets)

    def read_events(self, run_id: str, offset: int = 0, limit: int | None = None) -> tuple[list[dict], int]:
        """Events [offset, offset+limit) in write order, and how many the run has in total;
        NotRegularFile when events.jsonl is not a regular file."""
        with self._lock:
            idx, path = self._index(run_id)
            total = len(idx.offsets)
            end = total if limit is None else min(total, offset + limit)
            if offset >= end:
                return [], total
            start_byte = idx.offsets[offset]
            end_byte = idx.offsets[end] if end < total else idx.scanned
        with storage.open_run_file(path) as f:
            f.seek(start_byte)
            data = f.read(end_byte - start_byte)
        events = []
        for n, line in enumerate(data.split(b"\n")):
            if not line.strip():
                continue
            try:
                events.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                log.warning("viewer.corrupt_event_line run_id=%s line=%d", run_id, offset + n + 1)
        return events, total

    def cost_series(self, run_id: str, max_points: int = 120) -> list[tuple[str, float]]:
        """Cumulative LLM cost after each LLM_CALL, thinned to at most `max_points` (last kept)."""
        with self._lock:
            idx, _ = self._index(run_id)
            calls = sorted(idx.cost_calls, key=lambda c: c[0])
        points: list[tuple[str, float]] = []
        total = 0.0
        for ended, cost in calls:
            total += cost
            points.append((storage.iso_ms(ended), round(total, 9)))
        if len(points) <= max_points:
            return points
        step = len(points) / max_points
        thinned = [points[int(i * step)] for i in range(max_points - 1)]
        thinned.append(points[-1])
        return thinned


def _add_cost(idx: _EventIndex, line: bytes) -> None:
    try:
        ev = orjson.loads(line)
    except orjson.JSONDecodeError:
        return
    if not isinstance(ev, dict) or ev.get("event_type") != EventType.LLM_CALL:
        return
    payload = ev.get("payload") or {}
    cost = payload.get("cost_usd") if isinstance(payload, dict) else None
    cost = float(cost) if isinstance(cost, int | float) else 0.0
    idx.cost += cost
    started = storage.parse_iso(ev.get("ts"))
    if started is None:
        return
    duration = ev.get("duration_ms")
    ended = started + (duration / 1000 if isinstance(duration, int | float) and duration > 0 else 0.0)
    idx.cost_calls.append((ended, cost))
