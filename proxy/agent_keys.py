"""Agent keys (SPEC §9, docs/gateway.md): who calls the proxy listener.

A key is `tw_` + 32 random bytes (urlsafe base64), shown once when it is made; only its SHA-256 is
kept, with its id, agent, creation and expiry times, note and revocation time. A plain hash is
enough: the key is 256 random bits, so nobody can guess it or find it back from its hash (a slow
password hash only helps low-entropy secrets people choose), and one SHA-256 per call is cheap.

Two stores with one interface: `FileKeyStore` (`agent-keys.json` in the data dir, mode 0600,
replaced atomically, read into memory: a call's check is a dict lookup, no I/O) and `RedisKeyStore`
(one hash in the shared state when `state` is set: every replica reads it on each call, so a new
key or a revocation applies on the next call whichever replica serves it).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import hmac
import logging
import os
import re
import secrets
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

log = logging.getLogger("tripwire.keys")

KEY_PREFIX = "tw_"
KEY_BYTES = 32
STORE_FILE = "agent-keys.json"
REDIS_KEY = "tripwire:agentkeys"  # hash: key hash -> the key's record (JSON)
# how often a running serve looks for changes another process (`tripwire keys`) made to the file
WATCH_INTERVAL_S = 0.5
MAX_NOTE = 500
MAX_AGENT = 200


class KeyRequestError(ValueError):
    """A request about keys that cannot be honoured (bad agent, expiry, note): a 400."""


class AgentKey(BaseModel):
    """One key's record as stored (never the key itself)."""

    model_config = ConfigDict(frozen=True)

    id: str
    agent: str
    hash: str
    created: float  # unix seconds
    expires: float | None = None
    note: str | None = None
    revoked: float | None = None

    def usable_at(self, now: float) -> bool:
        return self.revoked is None and (self.expires is None or now < self.expires)

    def public(self) -> dict[str, object]:
        """What the API and the CLI show: everything but the hash."""
        return self.model_dump(exclude={"hash"})


def new_secret() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)


def key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def is_agent_key_header(value: str) -> bool:
    """A header value that carries a Tripwire key (`tw_...` or `Bearer tw_...`)."""
    value = value.strip()
    if value[:7].lower() == "bearer ":
        value = value[7:].lstrip()
    return value.startswith(KEY_PREFIX)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """`30d`, `12h`, `90m`, `2w`, `45s` -> seconds."""
    found = _DURATION.match(text)
    if found is None or float(found.group(1)) <= 0:
        raise KeyRequestError(f"expires: expected a positive duration such as 30d, 12h, 90m, got {text!r}")
    return float(found.group(1)) * _UNIT_S[found.group(2)]


def new_record(agent: str, expires_in_s: float | None, note: str | None, now: float) -> tuple[AgentKey, str]:
    agent = agent.strip()
    if not agent or len(agent) > MAX_AGENT or "/" in agent:
        raise KeyRequestError(f"agent: a name of 1-{MAX_AGENT} characters without '/', got {agent!r}")
    if note is not None and len(note) > MAX_NOTE:
        raise KeyRequestError(f"note: at most {MAX_NOTE} characters")
    if expires_in_s is not None and expires_in_s <= 0:
        raise KeyRequestError("expires: must be in the future")
    secret = new_secret()
    record = AgentKey(
        id="key_" + uuid.uuid4().hex[:16],
        agent=agent,
        hash=key_hash(secret),
        created=now,
        expires=None if expires_in_s is None else now + expires_in_s,
        note=note or None,
    )
    return record, secret


def matching(record: AgentKey | None, digest: str) -> AgentKey | None:
    """The record, if its hash is the presented key's (compared in constant time)."""
    if record is None or not hmac.compare_digest(record.hash, digest):
        return None
    return record


class KeyStore(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def find(self, digest: str) -> AgentKey | None: ...  # by key hash (a call's check)

    async def create(
        self, agent: str, expires_in_s: float | None = None, note: str | None = None
    ) -> tuple[AgentKey, str]: ...

    async def list(self) -> list[AgentKey]: ...

    async def revoke(self, key_id: str) -> AgentKey | None: ...  # None: no such key


# ---- the data dir --------------------------------------------------------------------------------


class FileKeyStore:
    """`agent-keys.json` in the data dir, held in memory; other processes' changes (the CLI beside a
    running serve) are read within WATCH_INTERVAL_S, this process's own at once."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / STORE_FILE
        self.lock_path = data_dir / (STORE_FILE + ".lock")
        self.by_hash: dict[str, AgentKey] = {}
        self._seen: tuple[int, int, int] | None = None  # (mtime_ns, size, inode) of what was read
        self._watcher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.reload()
        self._watcher = asyncio.create_task(self._watch(), name="tripwire-agent-keys")

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher

    async def find(self, digest: str) -> AgentKey | None:
        return matching(self.by_hash.get(digest), digest)

    # writes (and the file reads of `list`) run in a thread: an fsync must not hold the event loop

    async def create(
        self, agent: str, expires_in_s: float | None = None, note: str | None = None
    ) -> tuple[AgentKey, str]:
        record, secret = new_record(agent, expires_in_s, note, time.time())
        await asyncio.to_thread(self._add, record)
        return record, secret

    async def list(self) -> list[AgentKey]:
        await asyncio.to_thread(self.reload)
        return sorted(self.by_hash.values(), key=lambda r: r.created)

    async def revoke(self, key_id: str) -> AgentKey | None:
        return await asyncio.to_thread(self._revoke, key_id)

    def _add(self, record: AgentKey) -> None:
        with self._locked() as records:
            records[record.hash] = record

    def _revoke(self, key_id: str) -> AgentKey | None:
        with self._locked() as records:
            for digest, record in records.items():
                if record.id == key_id:
                    if record.revoked is None:
                        record = records[digest] = record.model_copy(update={"revoked": time.time()})
                    return record
        return None

    # --- the file ----------------------------------------------------------------------------

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def reload(self) -> None:
        """Read the file again if it changed since it was last read."""
        seen = self._stat()
        if seen == self._seen:
            return
        self.by_hash = self._read()
        self._seen = seen

    def _read(self) -> dict[str, AgentKey]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            items = orjson.loads(raw)["keys"]
            records = [AgentKey.model_validate(item) for item in items]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValidationError) as e:
            # refuse every key rather than guess: a broken file is fixed by hand or by new keys
            # (the error's type only: a validation error quotes the values, and they are hashes)
            log.error(
                "%s is not a valid key store (%s): no agent key is accepted", self.path, type(e).__name__
            )
            return {}
        return {r.hash: r for r in records}

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, AgentKey]]:
        """Read, change and write the file under a lock (serve and the CLI may write at once)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            records = self._read()
            yield records
            self._write(records)
            self.by_hash = records
            self._seen = self._stat()
        finally:
            os.close(fd)  # (releases the lock)

    def _write(self, records: dict[str, AgentKey]) -> None:
        body = orjson.dumps(
            {"keys": [r.model_dump() for r in sorted(records.values(), key=lambda r: r.created)]},
            option=orjson.OPT_INDENT_2,
        )
        tmp = self.path.with_name(f".{STORE_FILE}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
        try:
            os.fchmod(fd, 0o600)  # (a tmp file left by a crash may have other bits)
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            try:
                self.reload()
            except OSError as e:
                log.warning("cannot read %s: %s", self.path, e)


# ---- the shared state (Redis) ---------------------------------------------------------------------


class RedisKeyStore:
    """One Redis hash, read on every call: a key made or revoked on any replica (or by the CLI)
    applies on the next call. Redis unreachable: the call is refused (authentication never fails
    open), see proxy/auth.py."""

    def __init__(self, url: str, client: Any = None) -> None:
        """`client`: the process's one Redis client (proxy/state/client.py; its owner closes it)."""
        self._owns_client = client is None
        if client is None:
            import redis.asyncio as redis  # loaded only when shared state is configured

            client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self.client = client

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        if self._owns_client:
            await self.client.aclose()

    async def find(self, digest: str) -> AgentKey | None:
        raw = await self.client.hget(REDIS_KEY, digest)
        if raw is None:
            return None
        return matching(AgentKey.model_validate_json(raw), digest)

    async def create(
        self, agent: str, expires_in_s: float | None = None, note: str | None = None
    ) -> tuple[AgentKey, str]:
        record, secret = new_record(agent, expires_in_s, note, time.time())
        await self.client.hset(REDIS_KEY, record.hash, record.model_dump_json())
        return record, secret

    async def list(self) -> list[AgentKey]:
        values = await self.client.hvals(REDIS_KEY)
        return sorted((AgentKey.model_validate_json(v) for v in values), key=lambda r: r.created)

    async def revoke(self, key_id: str) -> AgentKey | None:
        for record in await self.list():
            if record.id == key_id:
                if record.revoked is None:
                    record = record.model_copy(update={"revoked": time.time()})
                    await self.client.hset(REDIS_KEY, record.hash, record.model_dump_json())
                return record
        return None


def key_store_for(data_dir: Path, state_url: str | None, client: Any = None) -> KeyStore:
    """The key store of a data dir and state: Redis when shared state is configured (through
    `client`, the process's one Redis client, when given)."""
    return RedisKeyStore(state_url, client) if state_url else FileKeyStore(data_dir)
