"""`RedisWindows`: the budget-window operations of proxy/state/windows.py as Lua scripts
(proxy/state/lua.py `WINDOW_*`), one round trip each, atomic across replicas."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import redis.asyncio as redis
from redis.exceptions import RedisError

from proxy.state import lua
from proxy.state.base import StateUnavailable
from proxy.state.windows import Reserved, Settled, parse_reserved


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisWindows:
    def __init__(self, client: redis.Redis) -> None:
        self._reserve = client.register_script(lua.WINDOW_RESERVE)
        self._settle = client.register_script(lua.WINDOW_SETTLE)
        self._release = client.register_script(lua.WINDOW_RELEASE)
        self._reset = client.register_script(lua.WINDOW_RESET)

    async def _call(self, script: Any, keys: Sequence[str], header: Mapping[str, Any]) -> Any:
        try:
            return await script(keys=list(keys), args=[orjson.dumps(dict(header))])
        except (RedisError, OSError) as e:
            raise StateUnavailable(f"redis: {type(e).__name__}: {e}") from e

    async def reserve(self, keys: Sequence[str], header: Mapping[str, Any]) -> Reserved:
        return parse_reserved(await self._call(self._reserve, keys, header))

    async def settle(self, keys: Sequence[str], header: Mapping[str, Any]) -> Settled:
        rows = await self._call(self._settle, keys, header)
        return [(float(_text(r[0])), int(_text(r[1])), int(r[2]) == 1) for r in rows]

    async def release(self, keys: Sequence[str], header: Mapping[str, Any]) -> None:
        await self._call(self._release, keys, header)

    async def reset(self, keys: Sequence[str], header: Mapping[str, Any]) -> None:
        await self._call(self._reset, keys, header)
