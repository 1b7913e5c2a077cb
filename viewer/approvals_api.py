"""The approvals API (SPEC §5.5a), on the admin listener only (its token, as every API call):

    GET  /api/approvals            pending approvals, oldest first (`?all=1`: recently decided too)
    POST /api/approvals/{id}       {"decision": "approve" | "deny", "note": "...", "raise": {...}}

Deciding an unknown approval is a 404; one decided, timed out, withdrawn or abandoned already a
409 (nothing is forwarded twice: the book takes one decision per approval, atomically); a `raise`
naming something that is not a budget or limit key, or a value not above what the session has
spent, a 400. The holding call (on any replica) applies the raise before it goes on.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import web

from proxy.approvals.book import AlreadyDecided, UnknownApproval
from proxy.approvals.service import Approvals
from proxy.guards.raises import RaiseError, validate_raise
from proxy.sessions import SessionManager

APPROVALS: web.AppKey[Approvals] = web.AppKey("tripwire_approvals", Approvals)
SESSIONS: web.AppKey[SessionManager] = web.AppKey("tripwire_approval_sessions", SessionManager)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _detail(status: int, detail: str) -> web.Response:
    return _json({"detail": detail}, status=status)


async def list_approvals(request: web.Request) -> web.Response:
    decided = request.query.get("all", "") not in ("", "0", "false")
    found = await request.app[APPROVALS].book.listing(decided=decided)
    return _json({"approvals": [a.to_json() for a in found]})


async def decide_approval(request: web.Request) -> web.Response:
    approval_id = request.match_info["approval_id"]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return _detail(400, "body must be JSON")
    if not isinstance(body, dict):
        return _detail(400, "body must be a JSON object")
    decision = body.get("decision")
    if decision not in ("approve", "deny"):
        return _detail(400, 'decision must be "approve" or "deny"')
    note = body.get("note") or ""
    if not isinstance(note, str):
        return _detail(400, "note must be a string")
    book = request.app[APPROVALS].book
    try:
        approval = await book.get(approval_id)
    except UnknownApproval:
        return _detail(404, f"no approval {approval_id!r}")
    if approval.status != "pending":
        return _detail(409, f"approval {approval_id} is already {approval.status}")
    raised: dict[str, float] = {}
    if body.get("raise") is not None:
        if decision != "approve":
            return _detail(400, "raise goes with approve only")
        session = request.app[SESSIONS].by_run_id(approval.run_id)
        try:
            if session is not None and session.guards is not None:
                raised = validate_raise(
                    body["raise"], session.guards.config, session.guards.budget, time.monotonic()
                )
            else:  # held on another replica: validated there too, against its session
                raised = validate_raise_keys(body["raise"])
        except RaiseError as e:
            return _detail(400, str(e))
    try:
        decided = await book.decide(approval_id, decision, note=note, by="api", raised=raised)
    except UnknownApproval:
        return _detail(404, f"no approval {approval_id!r}")
    except AlreadyDecided as e:
        return _detail(409, f"approval {approval_id} is already {e.status}")
    return _json(decided.to_json())


def validate_raise_keys(raised: Any) -> dict[str, float]:
    """The checks a replica without the session can make: keys and values (RaiseError)."""
    from proxy.guards.raises import RAISABLE

    if not isinstance(raised, dict) or not raised:
        raise RaiseError("raise must be a non-empty object of budget or limit keys and their new values")
    out: dict[str, float] = {}
    for key, value in raised.items():
        if key not in RAISABLE:
            raise RaiseError(
                f"raise: {key!r} is not a budget or limit key (one of {', '.join(sorted(RAISABLE))})"
            )
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise RaiseError(f"raise: {key} must be a positive number, got {value!r}")
        out[key] = value
    return out


def setup_approvals(app: web.Application, approvals: Approvals, sessions: SessionManager) -> None:
    app[APPROVALS] = approvals
    app[SESSIONS] = sessions
    app.router.add_get("/api/approvals", list_approvals)
    app.router.add_post("/api/approvals/{approval_id}", decide_approval)
