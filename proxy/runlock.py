"""Who owns the runs in a shared data dir (SPEC §2): one flock'd lock file per Tripwire process.

Several Tripwire processes on one machine (two serves, serve and intercept) may share a data dir.
Each writes only the runs it opened, and start-up recovery must close only the runs of processes
that are gone, never a live neighbour's. So each process (each `TraceRecorder` that starts) holds an
exclusive `flock` on `<data_dir>/owners/<owner_id>.lock` for as long as it runs and records its owner
id in every run's tripwire.json. The kernel drops the lock when the process dies, however it dies
(kill -9 included): a lock file that can be locked belongs to a process that is gone.

`owner_id` is `<pid>-<8 hex>` (the pid for people, the random part so a reused pid is a new owner).
The lock file's content is a small JSON object, rewritten in place after every writer pass: the
owner's pid, host and start time, and the writer's progress (`passes`, `written_seq`), so a test or
an operator can see how far the writer got, even after a kill -9.

Recovery passes of different processes are serialised by a second lock,
`<data_dir>/owners/recovery.lock`, so two processes never close the same run twice.

Needs `fcntl` (POSIX). Where it is missing, no lock is taken and every run is written without an
owner: recovery then closes any "running" run it finds, as before ownership existed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

OWNERS_DIR = "owners"
RECOVERY_LOCK = "recovery.lock"
_OWNER_ID = re.compile(r"[0-9]{1,10}-[0-9a-f]{8}")
_PROGRESS_WIDTH = 16  # digits reserved for each progress counter: the record keeps one size


def owners_dir(data_dir: Path) -> Path:
    return Path(data_dir).expanduser() / OWNERS_DIR


def lock_path(data_dir: Path, owner_id: str) -> Path:
    return owners_dir(data_dir) / f"{owner_id}.lock"


def is_owner_id(s: Any) -> bool:
    return isinstance(s, str) and _OWNER_ID.fullmatch(s) is not None


def owner_of(tripwire: dict[str, Any] | None) -> str | None:
    """The owner id a run's tripwire.json records; None for a run written without one."""
    owner = (tripwire or {}).get("owner")
    oid = owner.get("id") if isinstance(owner, dict) else None
    return oid if is_owner_id(oid) else None


class OwnerLock:
    """This process's claim on the runs it writes in one data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir).expanduser()
        self.pid = os.getpid()
        self.id = f"{self.pid}-{secrets.token_hex(4)}"
        self.host = socket.gethostname()
        self.started_at = time.time()
        self._fd: int | None = None
        self._format: bytes | None = None
        self._info: dict[str, Any] | None = None

    @property
    def path(self) -> Path:
        return lock_path(self.data_dir, self.id)

    @property
    def held(self) -> bool:
        return self._fd is not None

    @property
    def fd(self) -> int | None:
        """The locked file's descriptor: the trace writer's disk process inherits it, so the lock is
        held until the child has written everything, even after a kill -9 of this process."""
        return self._fd

    def info(self) -> dict[str, Any]:
        """What each run's tripwire.json records as its owner: the same dict every time, not to be
        changed (every live run's fields hold it; a dict each was ~64 bytes a run, issue 33)."""
        info = self._info
        if (
            info is None
            or info["id"] is not self.id
            or info["pid"] != self.pid
            or info["host"] is not self.host
        ):
            info = self._info = {"id": self.id, "pid": self.pid, "host": self.host}
        return info

    def acquire(self) -> bool:
        """Create and lock the lock file; False (logged) when the data dir does not allow it."""
        if self._fd is not None:
            return True
        if fcntl is None:  # pragma: no cover - not POSIX
            return False
        d = owners_dir(self.data_dir)
        # Locked under a temporary name, then renamed: another process's recovery never sees this
        # owner's lock file unlocked (it would take the owner for gone and delete the file).
        tmp = d / f".{self.id}.tmp"
        fd: int | None = None
        try:
            d.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.replace(tmp, self.path)
        except OSError as e:
            logger.warning(
                "cannot take the run owner lock in %s (%s): runs are written without an owner", d, e
            )
            if fd is not None:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            return False
        self._fd = fd
        self.progress(0, 0)
        return True

    def progress(self, passes: int, written_seq: int) -> None:
        """Rewrite the lock file's record in place (one `pwrite`, same size every time; best effort)."""
        if self._fd is None:
            return
        try:
            os.pwrite(self._fd, self._record_format % (passes, written_seq, passes), 0)
        except OSError:
            pass

    @property
    def _record_format(self) -> bytes:
        """The record as a bytes %-format, its fixed part formatted once (progress() runs after every
        writer pass: one %-format of three ints instead of an f-string with widths and an encode)."""
        if self._format is None:
            w = _PROGRESS_WIDTH
            head = (
                f'{{"owner": "{self.id}", "pid": {self.pid}, "host": {orjson.dumps(self.host).decode()}, '
                f'"started_at": {self.started_at:.3f}, '
            )
            self._format = (
                head.replace("%", "%%") + f'"passes": %-{w}d, "written_seq": %-{w}d, "check": %-{w}d}}\n'
            ).encode()
        return self._format

    def release(self) -> None:
        """Give the runs up: the file is removed while still locked, then the lock is dropped."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = None


def read_progress(data_dir: Path, owner_id: str) -> dict[str, Any] | None:
    """An owner's lock file record, None when missing or caught mid-rewrite (read again)."""
    try:
        data = orjson.loads(lock_path(data_dir, owner_id).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("passes") != data.get("check"):
        return None
    return data


def owner_alive(data_dir: Path, owner_id: str) -> bool:
    """True while the owner's process holds its lock; False when the lock file is gone or unlocked."""
    if fcntl is None:  # pragma: no cover - not POSIX
        return False
    try:
        fd = os.open(lock_path(data_dir, owner_id), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell: leave its runs alone
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return True
    finally:
        os.close(fd)  # also drops the lock if it was taken
    return False


def known_owners(data_dir: Path) -> list[str]:
    """Every owner with a lock file in the data dir, alive or not."""
    try:
        names = os.listdir(owners_dir(data_dir))
    except OSError:
        return []
    return sorted(i for i in (n[: -len(".lock")] for n in names if n.endswith(".lock")) if is_owner_id(i))


def dead_owners(data_dir: Path, exclude: str | None = None) -> list[str]:
    """Owners whose lock file is still there but no longer held: their process is gone."""
    return [i for i in known_owners(data_dir) if i != exclude and not owner_alive(data_dir, i)]


def forget_owner(data_dir: Path, owner_id: str) -> None:
    """Remove a gone owner's lock file (after its runs are closed)."""
    with contextlib.suppress(OSError):
        os.unlink(lock_path(data_dir, owner_id))


@contextlib.contextmanager
def recovery_lock(data_dir: Path) -> Iterator[None]:
    """Serialise recovery passes across the processes sharing the data dir (best effort)."""
    fd: int | None = None
    if fcntl is not None:
        d = owners_dir(data_dir)
        try:
            d.mkdir(parents=True, exist_ok=True)
            fd = os.open(d / RECOVERY_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            logger.debug("recovery lock not taken in %s: %s", d, e)
            if fd is not None:
                os.close(fd)
                fd = None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)
