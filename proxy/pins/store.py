"""Where pins live: the data dir (one JSON file per server), or Redis when `state` is set, so a
restart keeps them and every replica judges a list against the same pins.

Two operations: `load(server)` the server's pins as they are now, and `write(server, writes)` the
writes `proxy.pins.decide` asked for. In Redis a server's pins are one hash
(`tripwire:pins:<server>`: `pin:<tool>`, `change:<tool>`, `sealed`), so each write is one field: a
first pin is `HSETNX` (the replica that pinned first wins), a person's approval `HSET`.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from pathlib import Path
from typing import Any

import orjson

from proxy.pins.decide import Change, Pin, ServerPins, Write, apply
from proxy.storage import write_json_atomic

log = logging.getLogger("tripwire.pins")

REDIS_PREFIX = "tripwire:pins:"


def pins_from_json(server: str, data: dict[str, Any]) -> ServerPins:
    tools = {name: Pin.from_json(p) for name, p in (data.get("tools") or {}).items() if isinstance(p, dict)}
    changes = {
        name: Change.from_json(c) for name, c in (data.get("changes") or {}).items() if isinstance(c, dict)
    }
    return ServerPins(server, tools, changes, bool(data.get("sealed")))


def pins_to_file(pins: ServerPins) -> dict[str, Any]:
    return {
        "server": pins.server,
        "sealed": pins.sealed,
        "tools": {name: pin.to_json() for name, pin in pins.tools.items()},
        "changes": {name: change.to_json() for name, change in pins.changes.items()},
    }


class PinStore(abc.ABC):
    @abc.abstractmethod
    async def load(self, server: str) -> ServerPins: ...

    @abc.abstractmethod
    async def write(self, server: str, writes: list[Write]) -> None: ...

    @abc.abstractmethod
    async def reset(self, server: str) -> None: ...

    @abc.abstractmethod
    async def servers(self) -> list[str]: ...

    async def close(self) -> None:
        return None


class FilePinStore(PinStore):
    """`<data_dir>/pins/<server>.json`, written atomically. Writes of one process are serialised
    (a lock), so two lists answered at once cannot lose each other's pins."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir / "pins"
        self._lock = asyncio.Lock()

    def _path(self, server: str) -> Path:
        path = (self.dir / f"{server}.json").resolve()
        if not path.is_relative_to(self.dir.resolve()) or "/" in server or server.startswith("."):
            raise ValueError(f"not a server name: {server!r}")
        return path

    def _read(self, server: str) -> ServerPins:
        path = self._path(server)
        try:
            data = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return ServerPins(server)
        except (OSError, orjson.JSONDecodeError) as e:
            log.warning("pins of %r unreadable (%s): judged as unpinned", server, e)
            return ServerPins(server)
        return pins_from_json(server, data if isinstance(data, dict) else {})

    def _write(self, server: str, writes: list[Write]) -> None:
        pins = apply(self._read(server), writes)
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self._path(server), pins_to_file(pins))

    async def load(self, server: str) -> ServerPins:
        return await asyncio.to_thread(self._read, server)

    async def write(self, server: str, writes: list[Write]) -> None:
        if not writes:
            return
        async with self._lock:
            await asyncio.to_thread(self._write, server, writes)

    async def reset(self, server: str) -> None:
        async with self._lock:
            await asyncio.to_thread(self._path(server).unlink, True)

    async def servers(self) -> list[str]:
        def names() -> list[str]:
            if not self.dir.is_dir():
                return []
            return sorted(p.stem for p in self.dir.glob("*.json"))

        return await asyncio.to_thread(names)


class RedisPinStore(PinStore):
    def __init__(self, url: str) -> None:
        import redis.asyncio as redis

        self.client = redis.Redis.from_url(url)

    async def load(self, server: str) -> ServerPins:
        raw = await self.client.hgetall(REDIS_PREFIX + server)
        tools: dict[str, Pin] = {}
        changes: dict[str, Change] = {}
        sealed = False
        for key, value in raw.items():
            field = key.decode() if isinstance(key, bytes) else str(key)
            if field == "sealed":
                sealed = True
            elif field.startswith("pin:"):
                tools[field[4:]] = Pin.from_json(orjson.loads(value))
            elif field.startswith("change:"):
                changes[field[7:]] = Change.from_json(orjson.loads(value))
        return ServerPins(server, tools, changes, sealed)

    async def write(self, server: str, writes: list[Write]) -> None:
        if not writes:
            return
        key = REDIS_PREFIX + server
        pipe = self.client.pipeline(transaction=True)
        for op, tool, value in writes:
            if op == "pin":
                pipe.hsetnx(key, "pin:" + tool, orjson.dumps(value.to_json()))
            elif op == "repin":
                pipe.hset(key, "pin:" + tool, orjson.dumps(value.to_json()))
            elif op == "change":
                pipe.hset(key, "change:" + tool, orjson.dumps(value.to_json()))
            elif op == "unchange":
                pipe.hdel(key, "change:" + tool)
            elif op == "seal":
                pipe.hset(key, "sealed", "1")
        await pipe.execute()

    async def reset(self, server: str) -> None:
        await self.client.delete(REDIS_PREFIX + server)

    async def servers(self) -> list[str]:
        names = [k.decode()[len(REDIS_PREFIX) :] async for k in self.client.scan_iter(REDIS_PREFIX + "*")]
        return sorted(names)

    async def close(self) -> None:
        await self.client.aclose()
