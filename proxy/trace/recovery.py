"""Crash recovery: closing runs left "running" on disk by a process that is gone (SPEC §2). A run's
tripwire.json names its owner; a run is closed, as error / "interrupted" (or as its RUN_END says, if
the owner died just after writing it), only when that owner's lock is free (proxy/runlock.py) or it
names none. events.jsonl's torn last line is cut first, and the run ends at its last readable event.
Sync file I/O: run before serving, or in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Container
from pathlib import Path
from typing import Any

import orjson

from proxy import runlock, storage
from proxy.constants import (
    COUNT_FOR_EVENT,
    EVENTS_JSONL,
    REASON_INTERRUPTED,
    RUN_JSON,
    SPEC_VERSION,
    STATUS_ERROR,
    STATUS_OK,
    STATUS_RUNNING,
    TRIPWIRE_JSON,
    EventType,
    default_counts,
)
from proxy.trace.content import encode, envelope
from proxy.trace.runs import summary_order

logger = logging.getLogger(__name__)

RECOVER_INTERVAL_S = 5.0  # how often a started recorder looks for owners gone from the data dir


def recover(
    data_dir: Path,
    owner: runlock.OwnerLock,
    *,
    only: set[str] | None,
    skip: Container[str],
    fsync: bool,
    clock: Callable[[], float],
    max_field_bytes: int,
) -> list[str]:
    """Close the interrupted runs of dead owners (`only` those owners, else any dead or no owner);
    runs in `skip` (open in this process) and runs of `owner` are left alone. Returns the ids closed."""
    closed: list[str] = []
    base = storage.runs_base(data_dir)
    with runlock.recovery_lock(data_dir):
        try:
            entries = sorted(base.iterdir())
        except OSError:
            entries = []
        alive: dict[str, bool] = dict.fromkeys(only or (), False)
        for entry in entries:
            rid = entry.name
            if not storage.is_valid_run_id(rid) or rid in skip or not entry.is_dir():
                continue
            try:
                # No run.json: its owner died in the run's first write (run.json comes after the
                # lines), or is in it now. Rebuilt from RUN_START; a run with none on disk recorded
                # nothing and its folder goes.
                partial = not os.path.lexists(entry / RUN_JSON)
                if partial:
                    meta = started_meta(entry, rid)
                else:
                    meta = storage.read_json(entry / RUN_JSON)
                    if meta is None or meta.get("status") != STATUS_RUNNING:
                        continue
                tw = storage.read_json(entry / TRIPWIRE_JSON) or {}
                run_owner = runlock.owner_of(tw)
                if only is not None and run_owner not in only:
                    continue
                if run_owner is not None:
                    if run_owner == owner.id:
                        continue
                    if run_owner not in alive:
                        alive[run_owner] = runlock.owner_alive(data_dir, run_owner)
                    if alive[run_owner]:
                        continue
                elif partial and may_be_starting(entry, data_dir, owner, clock()):
                    continue
                if meta is None:
                    remove_unstarted(entry)
                    continue
                if partial:
                    tw = {**started_tripwire(entry), **tw}
                close_interrupted(
                    entry, rid, meta, tw, fsync=fsync, clock=clock, max_field_bytes=max_field_bytes
                )
                closed.append(rid)
            except storage.NotRegularFile as e:  # a FIFO or a symlink planted as a run file: left alone
                logger.warning("run %s not recovered: %s", rid, e.strerror)
            except Exception:
                logger.exception("could not recover interrupted run %s", rid)
        gone = {o for o, live in alive.items() if not live}
        if only is None:
            gone.update(runlock.dead_owners(data_dir, exclude=owner.id))
        for o in gone:
            runlock.forget_owner(data_dir, o)
    return closed


PARTIAL_GRACE_S = 60.0  # an ownerless run folder younger than this may be another live process's first write


def started_meta(d: Path, run_id: str) -> dict[str, Any] | None:
    """run.json as the writer would have written it before any call: from RUN_START, the first line."""
    start = _run_start(d)
    if start is None:
        return None
    return {
        "spec_version": SPEC_VERSION,
        "run_id": run_id,
        "run_name": (start.get("payload") or {}).get("run_name"),
        "started_at": start.get("ts"),
        "ended_at": None,
        "duration_ms": None,
        "status": STATUS_RUNNING,
        "counts": default_counts(),
        "last_event_ts": start.get("ts"),
    }


def started_tripwire(d: Path) -> dict[str, Any]:
    """tripwire.json's fields RUN_START also holds, for a run killed before its tripwire.json."""
    payload = (_run_start(d) or {}).get("payload") or {}
    return {
        "agent_name": payload.get("agent_name"),
        "session_id": payload.get("session_id"),
        "end_reason": None,
        "guard_config": {},
    }


def _run_start(d: Path) -> dict[str, Any] | None:
    try:
        data = storage.read_run_file(d / EVENTS_JSONL)
    except FileNotFoundError:
        return None
    try:
        first = orjson.loads(data.split(b"\n", 1)[0])
    except orjson.JSONDecodeError:
        return None
    if isinstance(first, dict) and first.get("event_type") == EventType.RUN_START:
        return first
    return None


def may_be_starting(d: Path, data_dir: Path, owner: runlock.OwnerLock, now: float) -> bool:
    """An ownerless folder without run.json: another live process may be in its first write (the
    lines land before tripwire.json names the owner). Left alone while any other owner lives and
    the folder is fresh; with no other owner alive it cannot be anybody's."""
    try:
        if now - d.stat().st_mtime >= PARTIAL_GRACE_S:
            return False
    except OSError:
        return True
    return any(o != owner.id and runlock.owner_alive(data_dir, o) for o in runlock.known_owners(data_dir))


def remove_unstarted(d: Path) -> None:
    """A run folder of a dead owner with no RUN_START on disk: nothing was recorded; the folder goes
    (only the files a run has: anything else planted there keeps it)."""
    for name in (EVENTS_JSONL, TRIPWIRE_JSON, RUN_JSON):
        try:
            os.unlink(d / name)
        except FileNotFoundError:
            pass
        except OSError as e:
            logger.warning("run folder %s not removed: %s", d, e)
            return
    try:
        os.rmdir(d)
    except OSError as e:
        logger.warning("run folder %s not removed: %s", d, e)
        return
    logger.warning("removed run folder %s: its process died before its first event was written", d.name)


def close_interrupted(
    d: Path,
    run_id: str,
    meta: dict[str, Any],
    tw: dict[str, Any],
    *,
    fsync: bool,
    clock: Callable[[], float],
    max_field_bytes: int,
) -> None:
    """Close one run left "running": RUN_END appended (unless there), run.json and tripwire.json ended."""
    events_path = d / EVENTS_JSONL
    repair_tail(events_path)
    events = storage.parse_events(events_path, run_id)
    counts = default_counts()
    for ev in events:
        key = COUNT_FOR_EVENT.get(ev.get("event_type", ""))
        if key:
            counts[key] += 1
    started = storage.parse_iso(meta.get("started_at")) or clock()
    times = [t for t in (storage.parse_iso(ev.get("ts")) for ev in events) if t is not None]
    last = max([started, *times])
    run_end = next((ev for ev in reversed(events) if ev.get("event_type") == EventType.RUN_END), None)
    if run_end is not None:
        # Died between appending RUN_END and rewriting run.json: the run did end, as RUN_END says.
        status = run_end.get("payload", {}).get("status", STATUS_ERROR)
        status = status if status in (STATUS_OK, STATUS_ERROR) else STATUS_ERROR
        reason = run_end.get("payload", {}).get("reason") or tw.get("end_reason")
    else:
        status, reason = STATUS_ERROR, REASON_INTERRUPTED
        tokens = tw.get("tokens")
        if not isinstance(tokens, dict):
            tokens = {}
        summary = {
            **counts,
            "duration_ms": max(0, int((last - started) * 1000)),
            "cost_usd": tw.get("cost_usd", 0.0),
            "total_tokens": tokens.get("total", 0),
        }
        event = envelope(
            run_id,
            EventType.RUN_END,
            "run_end",
            {"status": status, "summary": summary_order(summary), "reason": reason},
            max_field_bytes=max_field_bytes,
            ts=last,
        )
        storage.append_lines(events_path, [encode(event)], fsync=fsync)
    meta.update(
        {
            "status": status,
            "ended_at": storage.iso_ms(last),
            "duration_ms": max(0, int((last - started) * 1000)),
            "counts": counts,
            "last_event_ts": storage.iso_ms(last),
        }
    )
    storage.write_json_atomic(d / RUN_JSON, meta, fsync=fsync)
    tw["end_reason"] = reason
    storage.write_json_atomic(d / TRIPWIRE_JSON, tw, fsync=fsync)
    logger.warning(
        "run %s was left running by a process that is gone: closed as %s (%s)", run_id, status, reason
    )


async def watch_owners(interval_s: float, recover_dead_owners: Callable[[], list[str]]) -> None:
    """Every `interval_s`, in a worker thread: close the runs of owners that died meanwhile."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            closed = await asyncio.to_thread(recover_dead_owners)
        except Exception:
            logger.exception("looking for runs of owners that are gone failed")
            continue
        if closed:
            logger.warning("closed %d run(s) of a Tripwire process that died as interrupted", len(closed))


def repair_tail(path: Path) -> None:
    """Make events.jsonl end on a line boundary after a crash: cut a torn last line, or end a whole one.
    NotRegularFile when it is not a regular file (a FIFO would hold start-up forever)."""
    try:
        data = storage.read_run_file(path)
    except FileNotFoundError:
        return
    if not data or data.endswith(b"\n"):
        return
    cut = data.rfind(b"\n") + 1
    tail = data[cut:]
    try:
        complete = isinstance(orjson.loads(tail), dict)
    except orjson.JSONDecodeError:
        complete = False
    if complete:
        with open(path, "ab") as f:
            f.write(b"\n")
    else:
        logger.warning("cutting a torn last line (%d bytes) from %s", len(tail), path)
        os.truncate(path, cut)
