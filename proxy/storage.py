"""Run directories on disk: ids, paths, atomic JSON writes, JSONL appends, and readers for the viewer.

Layout (AgentDbg's, plus tripwire.json): `<data_dir>/runs/<run_id>/{run.json, events.jsonl, tripwire.json}`.
Sync file I/O in small functions: the recorder's writer calls the writers (appends and rewrites on the
event loop, where page-cache writes take microseconds; anything that fsyncs in the writer's thread), the
viewer API calls the readers (in its own thread pool). A run id is validated and its resolved path checked to be
inside the runs base before any path is built from it, so an API argument can never name another file.
Every read of a run's file opens it through `open_run_file`: regular files only (no symlink, FIFO, device).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import re
import shutil
import stat
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from proxy.constants import EVENTS_JSONL, RUN_JSON, RUNS_DIR, TRIPWIRE_JSON

logger = logging.getLogger(__name__)

_UUID4 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


# --- time -------------------------------------------------------------------------------------------


# the last second formatted, and its text: events come in bursts within one second (one tuple,
# swapped whole, so the writer thread may read it too)
_last_second: tuple[int, str] = (-1, "")
_MILLIS = tuple(f".{n:03d}Z" for n in range(1000))  # a timestamp's tail, by its milliseconds


def iso_ms(epoch_seconds: float) -> str:
    """Epoch seconds → AgentDbg's timestamp form, UTC with milliseconds: `2026-02-15T20:31:05.123Z`."""
    global _last_second
    # Floor to the millisecond (ts order follows clock order); the epsilon absorbs float error in *1000.
    ms = int(epoch_seconds * 1000 + 1e-4)
    second, milli = divmod(ms, 1000)
    last = _last_second
    if last[0] != second:
        last = _last_second = (second, f"{datetime.fromtimestamp(second, UTC):%Y-%m-%dT%H:%M:%S}")
    return last[1] + _MILLIS[milli]


def parse_iso(s: Any) -> float | None:
    """An ISO 8601 timestamp (as iso_ms writes, or AgentDbg) → epoch seconds; None when not one."""
    if not isinstance(s, str) or not s:
        return None
    try:
        dt = datetime.fromisoformat(s.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


# --- ids and paths ---------------------------------------------------------------------------------


def is_valid_run_id(s: Any) -> bool:
    """True for a canonical lowercase UUIDv4 string (the only run ids AgentDbg accepts)."""
    return isinstance(s, str) and _UUID4.fullmatch(s) is not None


def runs_base(data_dir: Path) -> Path:
    """`<data_dir>/runs`."""
    return Path(data_dir).expanduser() / RUNS_DIR


def run_dir(data_dir: Path, run_id: str) -> Path:
    """`<data_dir>/runs/<run_id>`; ValueError("invalid run_id") unless the id is valid and stays inside."""
    if not is_valid_run_id(run_id):
        raise ValueError("invalid run_id")
    base = runs_base(data_dir)
    path = base / run_id
    try:
        inside = path.resolve().is_relative_to(base.resolve())
    except OSError as e:
        raise ValueError("invalid run_id") from e
    if not inside:
        raise ValueError("invalid run_id")
    return path


def run_paths(data_dir: Path, run_id: str) -> dict[str, str]:
    """The run's local paths, as AgentDbg's `/api/runs/{id}/paths` returns them."""
    d = run_dir(data_dir, run_id)
    return {"run_dir": str(d), "run_json": str(d / RUN_JSON), "events_jsonl": str(d / EVENTS_JSONL)}


# --- writers ---------------------------------------------------------------------------------------


def _find_syncfs() -> Any:
    """libc's syncfs(2) (Linux), else None."""
    try:
        import ctypes

        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (ImportError, OSError, AttributeError):
        return None
    syncfs.argtypes = [ctypes.c_int]
    syncfs.restype = ctypes.c_int
    return syncfs


_SYNCFS = _find_syncfs()


def can_sync_filesystem() -> bool:
    return _SYNCFS is not None


def sync_filesystem(path: str | Path) -> None:
    """syncfs(2): everything written to the filesystem holding `path` is on disk when it returns,
    in one call (a group commit: many runs' files flushed by one device flush instead of an fsync
    of each file and directory, ~5 ms each on a virtual disk). OSError on failure, or where the
    call is missing (`can_sync_filesystem`)."""
    if _SYNCFS is None:
        raise OSError(errno.ENOSYS, "syncfs is not available")
    import ctypes

    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _SYNCFS(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it survives power loss (best effort: not on every OS)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def make_run_dir(path: str | Path) -> None:
    """A run's directory (and `runs/` the first time): one mkdir, the parents only when missing."""
    try:
        os.mkdir(path)
    except FileNotFoundError:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        if not os.path.isdir(path):
            raise


_TEMP_SEQ = itertools.count()  # write_json_atomic's temp names: unique in this process, no random draw


def write_json_atomic(path: str | Path, data: dict[str, Any], *, fsync: bool = False) -> None:
    """Write JSON so readers see the old file or the new one, never half of one.

    Temp file in the same directory (same filesystem), optional fsync, then `os.replace`. The JSON
    is encoded before any file is made (a value that cannot be encoded leaves nothing behind); the
    temp file is `NAME.<pid>-<n>.tmp`, private (0600, as mkstemp makes it) and made with O_EXCL, with
    plain os calls: a stateless service writes two of these per run, and mkstemp's random names and
    a buffered file object were most of their cost on the loop.
    """
    encoded = orjson.dumps(data, option=orjson.OPT_INDENT_2)
    target = os.fspath(path)
    while True:
        tmp = f"{target}.{os.getpid()}-{next(_TEMP_SEQ)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            break
        except FileExistsError:  # left by an earlier process with this pid: take another name
            continue
    try:
        try:
            view = memoryview(encoded)
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        _fsync_dir(Path(os.path.dirname(target)))


def append_lines(path: str | Path, lines: list[bytes], *, fsync: bool = False) -> None:
    """Append already-encoded JSONL lines (each ending in b"\\n") with one `write()` (O_APPEND).

    A short write is continued; an error (ENOSPC after part of the data) raises and may leave part of
    the data behind: the caller knows the size before and cuts it back (`truncate_file`).
    """
    if not lines:
        return
    data = b"".join(lines)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        written = os.write(fd, data)
        if written < len(data):  # rare: continued from where it stopped, without copies
            rest = memoryview(data)[written:]
            while rest:
                rest = rest[os.write(fd, rest) :]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def file_size(path: str | Path) -> int:
    """The size of a file in bytes, 0 when it does not exist."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def truncate_file(path: str | Path, size: int) -> None:
    """Cut a file back to `size` bytes (a failed append's partial line); nothing when it is not longer."""
    try:
        if os.stat(path).st_size > size:
            os.truncate(path, size)
    except FileNotFoundError:
        pass


def encode_line(obj: dict[str, Any]) -> bytes:
    """One JSONL line: compact JSON (UTF-8, not ASCII-escaped) and a newline."""
    return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)


# --- readers ---------------------------------------------------------------------------------------


class NotRegularFile(OSError):
    """A run's file that is not a regular file (a symlink, a FIFO, a device, a directory): never read.

    Its message names the file (`events.jsonl is a FIFO, not a regular file`)."""


def _file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_run_file(path: Path) -> BinaryIO:
    """Open a file of a run for reading, only when it is a regular file (NotRegularFile otherwise).

    Every read of run.json, events.jsonl and tripwire.json comes here. O_NOFOLLOW: a link planted in
    a run dir must not make the viewer serve a file from elsewhere (`/etc/shadow`, `/dev/zero`).
    O_NONBLOCK: opening a FIFO must not wait for a writer (a worker thread held forever); the fstat
    after the open then refuses it, as it refuses a device (no read ever blocks on a regular file).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotRegularFile(
                errno.ELOOP, f"{path.name} is a symlink, not a regular file", str(path)
            ) from e
        raise
    try:
        mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(
            errno.EINVAL, f"{path.name} is {_file_kind(mode)}, not a regular file", str(path)
        )
    return os.fdopen(fd, "rb")


def regular_stat(path: Path) -> os.stat_result | None:
    """The lstat of a run file, None when missing; NotRegularFile when it is not a regular file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else _file_kind(st.st_mode)
        raise NotRegularFile(errno.EINVAL, f"{path.name} is {kind}, not a regular file", str(path))
    return st


def read_run_file(path: Path) -> bytes:
    """A run file's bytes (see open_run_file)."""
    with open_run_file(path) as f:
        return f.read()


def load_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file; None when missing, not JSON or not an object; NotRegularFile when it is not
    a regular file and OSError when it cannot be read (for callers that say so, as the API does)."""
    try:
        data = orjson.loads(read_run_file(path))
    except FileNotFoundError:
        return None
    except orjson.JSONDecodeError as e:
        logger.warning("cannot read %s: %s", path, e)
        return None
    return data if isinstance(data, dict) else None


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when missing, unreadable (not a regular file too) or not an object."""
    try:
        return load_json(path)
    except OSError as e:
        logger.warning("cannot read %s: %s", path, e)
        return None


def _with_tripwire(d: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """run.json plus a `tripwire` sub-object from tripwire.json ({} when absent)."""
    return {**meta, "tripwire": read_json(d / TRIPWIRE_JSON) or {}}


def load_run(data_dir: Path, run_id: str) -> dict[str, Any] | None:
    """run.json with a `tripwire` sub-object; None when no such run. ValueError on a malformed id."""
    d = run_dir(data_dir, run_id)
    meta = read_json(d / RUN_JSON)
    return None if meta is None else _with_tripwire(d, meta)


def list_runs(data_dir: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Every run (run.json + `tripwire`), newest first by started_at; unreadable runs are skipped."""
    base = runs_base(data_dir)
    try:
        entries = list(base.iterdir())
    except OSError:
        return []
    found: list[tuple[float, dict[str, Any]]] = []
    for entry in entries:
        if not is_valid_run_id(entry.name) or not entry.is_dir():
            continue
        meta = read_json(entry / RUN_JSON)
        if meta is None:
            continue
        started = parse_iso(meta.get("started_at"))
        found.append((started if started is not None else float("-inf"), _with_tripwire(entry, meta)))
    found.sort(key=lambda item: item[0], reverse=True)
    runs = [meta for _, meta in found]
    return runs if limit is None else runs[:limit]


def iter_event_lines(path: Path) -> list[tuple[bytes, bool]]:
    """The non-blank lines of a JSONL file as (line, ends_with_newline); [] when the file is missing,
    NotRegularFile when it is not a regular file."""
    try:
        data = read_run_file(path)
    except FileNotFoundError:
        return []
    except NotRegularFile:  # the caller says so (a FIFO, a symlink)
        raise
    except OSError as e:  # unreadable
        logger.warning("cannot read %s: %s", path, e)
        return []
    lines = data.split(b"\n")
    out = [(line, True) for line in lines[:-1] if line.strip()]
    if lines[-1].strip():
        out.append((lines[-1], False))  # no newline yet: a line being written, or torn by a crash
    return out


def parse_events(path: Path, run_id: str = "") -> list[dict[str, Any]]:
    """Every event object in a JSONL file; corrupt or partial lines are skipped with a warning."""
    events: list[dict[str, Any]] = []
    for n, (line, complete) in enumerate(iter_event_lines(path), start=1):
        try:
            ev = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            if complete:
                logger.warning("skipping corrupt event line run_id=%s line=%d: %s", run_id, n, e)
            else:
                logger.debug("skipping unterminated last event line run_id=%s", run_id)
            continue
        if isinstance(ev, dict):
            events.append(ev)
        else:
            logger.warning("skipping non-object event line run_id=%s line=%d", run_id, n)
    return events


def read_events(
    data_dir: Path, run_id: str, offset: int = 0, limit: int | None = None
) -> list[dict[str, Any]]:
    """Events of a run in write order, from index `offset` (of the readable events), at most `limit`."""
    events = parse_events(run_dir(data_dir, run_id) / EVENTS_JSONL, run_id)
    end = None if limit is None else offset + max(0, limit)
    return events[max(0, offset) : end]


def count_events(data_dir: Path, run_id: str) -> int:
    """How many readable events the run has."""
    return len(parse_events(run_dir(data_dir, run_id) / EVENTS_JSONL, run_id))


def run_exists(data_dir: Path, run_id: str) -> bool:
    """True when the run has a run.json. ValueError on a malformed id."""
    return (run_dir(data_dir, run_id) / RUN_JSON).is_file()


# --- changes from the viewer -------------------------------------------------------------------------


def rename_run(data_dir: Path, run_id: str, name: str) -> dict[str, Any] | None:
    """Set run.json's run_name; returns the new run.json, None when no such run.

    ValueError on a malformed id or an empty name. For a run the recorder still has open, call
    `TraceRecorder.rename_run` instead: its next run.json rewrite would undo a change made here.
    """
    new_name = (name or "").strip()
    if not new_name:
        raise ValueError("run_name must be non-empty")
    path = run_dir(data_dir, run_id) / RUN_JSON
    meta = read_json(path)
    if meta is None:
        return None
    meta["run_name"] = new_name
    write_json_atomic(path, meta)
    return meta


def run_name_of(data_dir: Path, run_id: str) -> str | None:
    """run.json's run_name, or None (no run, unreadable, no name)."""
    try:
        meta = read_json(run_dir(data_dir, run_id) / RUN_JSON)
    except (ValueError, OSError):
        return None
    name = (meta or {}).get("run_name")
    return name if isinstance(name, str) and name else None


def update_tripwire_json(data_dir: Path, run_id: str, fields: dict[str, Any]) -> bool:
    """Set fields of an ended run's tripwire.json (a resumed run's `resumed_as`); False when it has
    none. For a run the recorder still has open, use `TraceRecorder.update_tripwire`."""
    path = run_dir(data_dir, run_id) / TRIPWIRE_JSON
    meta = read_json(path)
    if meta is None:
        return False
    meta.update(fields)
    write_json_atomic(path, meta)
    return True


def delete_run(data_dir: Path, run_id: str) -> bool:
    """Remove the run's directory; False when there was none. ValueError on a malformed id."""
    d = run_dir(data_dir, run_id)
    if not d.is_dir():
        return False
    shutil.rmtree(d)
    return True


# --- retention ---------------------------------------------------------------------------------------


def _dir_bytes(d: Path) -> int:
    total = 0
    try:
        for entry in os.scandir(d):
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
    except OSError:
        pass
    return total


def prune_runs(
    data_dir: Path,
    *,
    now: float,
    max_age_s: float | None = None,
    max_total_bytes: int | None = None,
    keep: Collection[str] = (),
) -> list[str]:
    """Delete old finished runs (SPEC §4.1 retention); returns the ids deleted.

    A run is older than `max_age_s` by its ended_at (started_at if it has none). Then, while the
    finished runs' total size exceeds `max_total_bytes`, the oldest go first. Runs still "running"
    on disk and ids in `keep` (the recorder's open runs) are never deleted, nor counted in the size.
    """
    if max_age_s is None and max_total_bytes is None:
        return []
    base = runs_base(data_dir)
    try:
        entries = list(base.iterdir())
    except OSError:
        return []
    finished: list[tuple[float, str, int]] = []
    for entry in entries:
        rid = entry.name
        if not is_valid_run_id(rid) or rid in keep or not entry.is_dir():
            continue
        meta = read_json(entry / RUN_JSON)
        if meta is None or meta.get("status") == "running":
            continue
        when = parse_iso(meta.get("ended_at")) or parse_iso(meta.get("started_at")) or 0.0
        finished.append((when, rid, _dir_bytes(entry)))
    finished.sort()
    doomed: list[str] = []
    if max_age_s is not None:
        doomed += [rid for when, rid, _ in finished if now - when > max_age_s]
    if max_total_bytes is not None:
        left = [(rid, size) for _, rid, size in finished if rid not in doomed]
        total = sum(size for _, size in left)
        for rid, size in left:
            if total <= max_total_bytes:
                break
            doomed.append(rid)
            total -= size
    deleted: list[str] = []
    for rid in doomed:
        try:
            shutil.rmtree(base / rid)
            deleted.append(rid)
        except OSError as e:
            logger.warning("retention: could not delete run %s: %s", rid, e)
    if deleted:
        logger.info("retention: deleted %d old run(s)", len(deleted))
    return deleted
