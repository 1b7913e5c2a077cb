"""`POST/GET /api/keys`, `DELETE /api/keys/{id}`: agent keys on the admin listener (SPEC §9,
docs/gateway.md). The admin token applies (viewer/api.py's middleware guards every `/api/` route).
A new key is in the POST's answer only; the list never shows a key or its hash.
"""

from __future__ import annotations

import logging
import time

import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxy.agent_keys import AgentKey, KeyRequestError, KeyStore, parse_duration

log = logging.getLogger("tripwire.admin")

KEY_STORE: web.AppKey[KeyStore] = web.AppKey("tripwire_agent_keys", KeyStore)


class CreateKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: str = Field(min_length=1, max_length=200)
    expires: str | None = None  # a duration: 30d, 12h, 90m; null: never
    note: str | None = Field(None, max_length=500)


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _bad(message: str) -> web.Response:
    return _json({"detail": message}, 400)


def listed(record: AgentKey, now: float) -> dict[str, object]:
    state = "revoked" if record.revoked is not None else ("active" if record.usable_at(now) else "expired")
    return {**record.public(), "status": state}


async def create_key(request: web.Request) -> web.Response:
    try:
        body = CreateKey.model_validate(orjson.loads(await request.read()))
    except orjson.JSONDecodeError:
        return _bad("body: invalid JSON")
    except ValidationError as e:
        return _bad(
            "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in e.errors())
        )
    try:
        expires = parse_duration(body.expires) if body.expires else None
        record, secret = await request.app[KEY_STORE].create(body.agent, expires, body.note)
    except KeyRequestError as e:
        return _bad(str(e))
    log.info("agent key %s created for agent %r", record.id, record.agent)
    return _json({**listed(record, time.time()), "key": secret}, 201)


async def list_keys(request: web.Request) -> web.Response:
    now = time.time()
    return _json({"keys": [listed(r, now) for r in await request.app[KEY_STORE].list()]})


async def revoke_key(request: web.Request) -> web.Response:
    key_id = request.match_info["id"]
    record = await request.app[KEY_STORE].revoke(key_id)
    if record is None:
        return _json({"detail": f"no key {key_id!r}"}, 404)
    log.info("agent key %s revoked", record.id)
    return _json(listed(record, time.time()))


def setup_keys_api(app: web.Application, store: KeyStore) -> None:
    app[KEY_STORE] = store
    app.router.add_post("/api/keys", create_key)
    app.router.add_get("/api/keys", list_keys)
    app.router.add_delete("/api/keys/{id}", revoke_key)
