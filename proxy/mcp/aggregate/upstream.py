"""One upstream MCP session per server, for the aggregate endpoint (SPEC §3).

The aggregate (`/mcp`) is Tripwire's own MCP server; behind it each configured server gets one
`UpstreamSession`, opened lazily on first use and kept. The session speaks whichever revision the
server accepts, found the way the SDK's `mode="auto"` client finds it (mcp/client/_probe.py):

1. `server/discover` at 2026-07-28, with the per-request envelope and routing headers. A result that
   lists a stateless revision in `supportedVersions` settles it: stateless, no session.
2. Any other answer but a transport failure (a JSON-RPC error such as -32601, an HTTP 400 "Unsupported
   protocol version" from a handshake-only server, a 404 or 405, a result listing only handshake
   revisions) means the server predates 2026-07-28: `initialize` at the newest handshake revision
   (2025-11-25), the server's `protocolVersion` kept if we speak it, `notifications/initialized`, the
   `Mcp-Session-Id` on every later request, the GET stream for its notifications, `DELETE` at close.
3. An `initialize` answered with -32022 (UnsupportedProtocolVersionError) naming a stateless revision
   is stateless evidence after all: probe once more at that revision. -32022 naming only revisions we
   do not speak: incompatible, `UpstreamError`.
A transport failure is never an era verdict: `ServerUnavailable`, and the next request tries again.

Restarts: a handshake request answered 404 while we hold a session id means the server forgot the
session (transports "Session Management": the client MUST start a new session with a fresh
`initialize`): the session re-opens and the request is sent once more. The GET stream (handshake) or
`subscriptions/listen` stream (2026-07-28) reconnects with backoff; when it finds the server back
after a loss (or the session forgotten), `REOPENED` is reported to `on_notification`, so the aggregate
can tell its client the lists changed (re-listen and refetch).

Server-to-client requests (handshake era: `elicitation/create`, `sampling/createMessage`,
`roots/list` on a POST's stream) become a 2026-07-28 `input_required` result: the POST's stream stays
open, the result names the requests under keys and carries an opaque `requestState`; the retry of
the same request with `inputResponses` and that `requestState` answers the server on its session and
reads on. So the aggregate sees one shape whichever era the server is (a stateless server's own
`input_required` is returned unchanged). A handshake server learns the client's capabilities once, at
`initialize`: a request whose 2026-07-28 envelope declares a question capability the session did not
re-opens it declaring that too. What 2026-07-28 lacks is answered as that revision says (`ping`,
`logging/setLevel`, `resources/subscribe` via the listen filter); docs/mcp.md "Aggregation: revisions".

The bytes go through a `Transport`: the aggregate implements it over the owning server's in-process
MCP pipeline (so guards and the trace see a direct call); tests implement it over plain HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from proxy.mcp.aggregate import revisions as rev
from proxy.mcp.jsonrpc import TRIPWIRE_UPSTREAM_ERROR

log = logging.getLogger("tripwire.mcp.aggregate")

JsonObject = dict[str, Any]
NotificationHandler = Callable[[str, str, JsonObject | None], Awaitable[None] | None]
"""`on_notification(server, method, params)`: list-changed, progress, logging, ... from a server."""
ProgressHandler = Callable[[JsonObject], Awaitable[None] | None]
"""`on_progress(params)`: the `notifications/progress` params of one request, its `progressToken`
the one the caller put in `params._meta` (or absent when the caller gave none)."""

REOPENED = "tripwire/upstream/reopened"
"""Reported to `on_notification` when a server is reachable again after a loss, or its session was
re-opened after a restart: whatever the aggregate listed from it may have changed."""

DEFAULT_CLIENT_INFO: JsonObject = {"name": "tripwire-aggregate", "version": "1"}
SUSPENDED_TTL_S = 300.0
"""How long a handshake POST waiting on an `input_required` retry is kept open before it is cancelled."""
RECONNECT_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
RESUBSCRIBE_WAIT_S = 10.0
"""How long `resources/subscribe` at 2026-07-28 waits for the new listen stream's acknowledgement."""

ACCEPT = "application/json, text/event-stream"


class UpstreamError(Exception):
    """The server answered with a JSON-RPC error: relay it as is (code, message, data)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data

    def as_error(self) -> JsonObject:
        """The JSON-RPC `error` member."""
        error: JsonObject = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class ServerUnavailable(Exception):
    """The server could not be reached, failed at the transport level or did not answer in time."""

    def __init__(self, server: str, reason: str) -> None:
        super().__init__(f"MCP server {server!r} unavailable: {reason}")
        self.server = server
        self.reason = reason


class TransportStatus(Exception):
    """An HTTP error status from the server's endpoint (the body, if JSON-RPC, in `message`)."""

    def __init__(self, status: int, message: JsonObject | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.message = message


class Transport(Protocol):
    """The bytes under an upstream session: one server's Streamable HTTP endpoint, however reached.

    `post` sends one JSON-RPC message and yields the JSON-RPC messages the server answers with (one
    for a JSON body, several for an SSE stream: notifications, server requests, then the response;
    none for a 202); an HTTP error status raises `TransportStatus` (404 means an unknown session), a
    failure to connect or a broken stream `ServerUnavailable`. Response headers the session needs
    (`Mcp-Session-Id`) are handed to `headers_out` when given, before the first message. Closing the
    iterator early (the session does, to cancel a 2026-07-28 request) must close the response.
    """

    def post(
        self,
        server: str,
        headers: Mapping[str, str],
        body: bytes,
        headers_out: Callable[[Mapping[str, str]], None] | None = None,
    ) -> AsyncIterator[JsonObject]: ...

    def get_stream(self, server: str, headers: Mapping[str, str]) -> AsyncIterator[JsonObject]:
        """The server's standalone GET stream (handshake era): its notifications and requests.
        An HTTP error status raises `TransportStatus` (405: the server offers none)."""
        ...

    async def delete(self, server: str, headers: Mapping[str, str]) -> None:
        """End the session (handshake era, `Mcp-Session-Id` in `headers`)."""
        ...


def _error(server: str, error: Any) -> Exception:
    """The exception for a JSON-RPC `error` member: the server's own error, or, when Tripwire's
    pipeline in front of the server says it could not reach it (-32051), the server's absence."""
    err = error if isinstance(error, dict) else {}
    code, message = int(err.get("code", rev.INTERNAL_ERROR)), str(err.get("message", ""))
    if code == TRIPWIRE_UPSTREAM_ERROR:
        return ServerUnavailable(server, message)
    return UpstreamError(code, message, err.get("data"))


def _dumps(message: JsonObject) -> bytes:
    return orjson.dumps(message)


@dataclass
class _Suspended:
    """A handshake POST whose server asked the client something: kept open until the retry."""

    stream: AsyncIterator[JsonObject]
    request_id: int
    asked: dict[str, Any]  # key in inputRequests -> the server's JSON-RPC request id
    caller_token: Any
    timer: asyncio.TimerHandle | None = None


@dataclass
class _State:
    """What one opening of the session learnt: era, revision, session id, the server's self-description."""

    revision: str = ""
    session_id: str | None = None
    server_result: JsonObject = field(default_factory=dict)  # initialize or server/discover result


class UpstreamSession:
    """One server's upstream session, in whichever revision the server accepts."""

    server: str
    revision: str
    """The negotiated protocol version (e.g. "2025-11-25" or "2026-07-28"); "" before opening."""

    def __init__(
        self,
        server: str,
        transport: Transport,
        on_notification: NotificationHandler | None = None,
        *,
        client_info: Mapping[str, Any] | None = None,
        capabilities: Mapping[str, Any] | None = None,
    ) -> None:
        self.server = server
        self.revision = ""
        self._transport = transport
        self._on_notification = on_notification
        self.client_info: JsonObject = dict(client_info or DEFAULT_CLIENT_INFO)
        self.capabilities: JsonObject = dict(capabilities or {})
        self._state: _State | None = None
        self._open_lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._log_level: str | None = None
        self._resource_uris: list[str] = []  # resources/subscribe'd, for a 2026-07-28 listen filter
        self._listen_acked = asyncio.Event()
        self._tool_schemas: dict[str, Any] = {}  # tools/list inputSchemas, for Mcp-Param-* (2026-07-28)
        self._suspended: dict[str, _Suspended] = {}
        self._stream_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._lost = False  # a request or the stream found the server unreachable since it last answered

    # --- what the aggregate reads ---

    @property
    def stateless(self) -> bool:
        return rev.is_stateless(self.revision)

    @property
    def server_result(self) -> JsonObject:
        """The server's `initialize` result (handshake) or `server/discover` result (2026-07-28)."""
        return dict(self._state.server_result) if self._state else {}

    @property
    def server_capabilities(self) -> JsonObject:
        return dict(self.server_result.get("capabilities") or {})

    def initialize_result(self) -> JsonObject:
        """The server's self-description as an `initialize` result, whichever era it is."""
        if self.stateless:
            return rev.initialize_from_discover(self.server_result, rev.LATEST_HANDSHAKE, self.server)
        return self.server_result

    def discover_result(self) -> JsonObject:
        """The server's self-description as a `server/discover` result, whichever era it is."""
        return self.server_result if self.stateless else rev.discover_from_initialize(self.server_result)

    async def open(self) -> None:
        """Open the session now (requests open it on first use anyway)."""
        await self._ensure_open()

    # --- requests ---

    async def request(
        self,
        method: str,
        params: JsonObject | None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the seam with the aggregate names it)
        on_progress: ProgressHandler | None = None,
    ) -> JsonObject:
        """Send one request; return its JSON-RPC `result`.

        Raises `UpstreamError` for a JSON-RPC error answer, `ServerUnavailable` for a transport
        failure or no answer within `timeout` seconds (the whole exchange, opening included). A
        handshake server's question to the client comes back as an `input_required` result (module
        docstring); cancelling the awaiting task cancels the request the way its revision says.
        """
        try:
            async with asyncio.timeout(timeout):
                return await self._request(method, params, on_progress)
        except TimeoutError:
            within = f" within {timeout:g} s" if timeout is not None else ""
            raise ServerUnavailable(self.server, f"no answer to {method}{within}") from None

    async def _request(
        self, method: str, params: JsonObject | None, on_progress: ProgressHandler | None
    ) -> JsonObject:
        state = await self._ensure_open()
        _, _, request_state = rev.split_retry(params)
        if request_state is not None and request_state in self._suspended:
            return await self._resume(state, params, on_progress)
        if rev.is_stateless(state.revision) and method in ("resources/subscribe", "resources/unsubscribe"):
            return await self._resubscribe(state, method, params)
        if not rev.is_stateless(state.revision):
            state = await self._widen(state, params)
        local = rev.local_answer(method, state.revision)
        if local is not None:
            if method == "logging/setLevel":
                self._log_level = (params or {}).get("level")
            return local
        try:
            return await self._exchange(state, method, params, on_progress)
        except TransportStatus as status:
            if status.status == 404 and state.session_id is not None:
                # the server forgot our session (a restart): a fresh initialize, then once more
                log.info("MCP server %r forgot session; re-initializing", self.server)
                state = await self._reopen(state)
                try:
                    return await self._exchange(state, method, params, on_progress)
                except TransportStatus as again:
                    raise self._status_error(again) from None
            raise self._status_error(status) from None

    async def _resubscribe(self, state: _State, method: str, params: JsonObject | None) -> JsonObject:
        """2026-07-28 replaced `resources/subscribe` / `unsubscribe` by the `resourceSubscriptions` of
        a `subscriptions/listen` filter: the set changes, the listen stream is opened again with it
        (the new one acknowledged before the answer, so no update falls between the two streams)."""
        uri = (params or {}).get("uri")
        if not isinstance(uri, str):
            raise UpstreamError(rev.INVALID_PARAMS, f"{method} needs a uri")
        if method == "resources/subscribe" and uri not in self._resource_uris:
            self._resource_uris.append(uri)
        elif method == "resources/unsubscribe" and uri in self._resource_uris:
            self._resource_uris.remove(uri)
        else:
            return {}
        old, self._stream_task = self._stream_task, None
        self._start_stream()
        if self._stream_task is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RESUBSCRIBE_WAIT_S):
                    await self._listen_acked.wait()
        if old is not None:
            old.cancel()
        return {}

    async def notify(self, method: str, params: JsonObject | None) -> None:
        """Send one notification, as the server's revision has it.

        2026-07-28 defines no client-to-server notifications over HTTP: they are dropped (a request
        is cancelled by cancelling the task awaiting `request`, which closes its stream). Handshake
        era: POSTed on the session.
        """
        state = await self._ensure_open()
        if rev.is_stateless(state.revision):
            return
        message: JsonObject = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = rev.without_envelope(params)
        try:
            await self._drain(self._transport.post(self.server, self._headers(state), _dumps(message)))
        except TransportStatus as status:
            if status.status == 404:
                await self._reopen(state)
            else:
                log.debug("notification %s to MCP server %r: HTTP %s", method, self.server, status.status)

    async def close(self) -> None:
        """End the session (handshake era: `DELETE`), stop its stream, cancel suspended requests."""
        self._closed = True
        for key in list(self._suspended):
            await self._drop_suspended(key)
        if self._stream_task is not None:
            self._stream_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._stream_task
            self._stream_task = None
        for task in list(self._tasks):
            task.cancel()
        state, self._state = self._state, None
        if state is not None and state.session_id is not None:
            with contextlib.suppress(ServerUnavailable, TransportStatus, OSError):
                await self._transport.delete(self.server, self._headers(state))

    # --- opening ---

    async def _ensure_open(self) -> _State:
        if self._state is not None:
            return self._state
        async with self._open_lock:
            if self._state is None:
                self._closed = False
                try:
                    self._state = await self._open()
                except ServerUnavailable:
                    self._lost = True  # so its first answer after this reports REOPENED
                    raise
                self.revision = self._state.revision
                self._start_stream()
            return self._state

    async def _widen(self, state: _State, params: JsonObject | None) -> _State:
        """A 2026-07-28 client declares its capabilities on every request; a handshake server learnt
        ours once, at `initialize`. When a request's envelope declares a server-to-client request
        capability (elicitation, sampling, roots) the session did not, it is opened again declaring it
        too, so the server may ask (and its question comes back as input_required). Requests already
        under way keep the old session id, which the server still knows."""
        _, _, declared = rev.envelope_of(params)
        if not isinstance(declared, Mapping):
            return state
        wider = {
            name: declared[name]
            for name in rev.SERVER_REQUEST_CAPABILITY.values()
            if declared.get(name) is not None and self.capabilities.get(name) is None
        }
        if not wider:
            return state
        self.capabilities = {**self.capabilities, **wider}
        log.info("MCP server %r: session re-opened declaring %s", self.server, ", ".join(sorted(wider)))
        return await self._reopen(state, report=False)

    async def _reopen(self, stale: _State, *, report: bool = True) -> _State:
        async with self._open_lock:
            if self._state is stale or self._state is None:
                if self._stream_task is not None:
                    self._stream_task.cancel()
                    self._stream_task = None
                self._state = None
                self._state = await self._open()
                self.revision = self._state.revision
                self._start_stream()
                if report:
                    await self._emit(REOPENED, None)
            return self._state

    async def _open(self) -> _State:
        version = rev.LATEST_STATELESS
        for attempt in range(2):
            verdict, result = await self._probe(version)
            if verdict == "stateless":
                return result
            if verdict == "retry" and attempt == 0:
                version = str(result)
                continue
            try:
                return await self._initialize()
            except UpstreamError as err:
                mutual = rev.mutual_stateless(rev.unsupported_versions(err.as_error()))
                if mutual is None or attempt:
                    raise
                version = mutual  # -32022 at initialize: the server is stateless after all
        raise UpstreamError(
            rev.UNSUPPORTED_PROTOCOL_VERSION, f"no revision in common with MCP server {self.server!r}"
        )

    async def _probe(self, version: str) -> tuple[str, Any]:
        """("stateless", state) | ("retry", version) | ("handshake", None); raises when incompatible."""
        request_id = next(self._ids)
        params = rev.with_envelope({}, version, self.client_info, self.capabilities)
        headers = {"Accept": ACCEPT, "Content-Type": "application/json"}
        headers.update(rev.routing_headers("server/discover", params, version))
        message = {"jsonrpc": "2.0", "id": request_id, "method": "server/discover", "params": params}
        error: JsonObject | None = None
        result: JsonObject | None = None
        try:
            async with _closing(self._transport.post(self.server, headers, _dumps(message))) as stream:
                async for msg in stream:
                    if msg.get("id") == request_id and "method" not in msg:
                        result, error = msg.get("result"), msg.get("error")
                        break
        except TransportStatus as status:
            error = (status.message or {}).get("error") if isinstance(status.message, dict) else None
            if status.status >= 500:
                raise ServerUnavailable(self.server, f"HTTP {status.status} to server/discover") from None
        if isinstance(error, dict) and error.get("code") == TRIPWIRE_UPSTREAM_ERROR:
            raise _error(self.server, error)  # not an era verdict: the server is not there
        verdict = rev.probe_verdict(error, result)
        if verdict == "incompatible":
            err = error or {}
            raise UpstreamError(
                int(err.get("code", rev.UNSUPPORTED_PROTOCOL_VERSION)),
                str(err.get("message", "")),
                err.get("data"),
            )
        if verdict == "stateless" and result is not None:
            versions = [v for v in result.get("supportedVersions", []) if isinstance(v, str)]
            revision = rev.mutual_stateless(versions) or version
            return "stateless", _State(revision=revision, server_result=dict(result))
        if verdict == "stateless":  # -32022 naming a stateless revision we also speak
            mutual = rev.mutual_stateless(rev.unsupported_versions(error))
            return "retry", mutual
        return "handshake", None

    async def _initialize(self) -> _State:
        request_id = next(self._ids)
        params = {
            "protocolVersion": rev.LATEST_HANDSHAKE,
            "capabilities": self.capabilities,
            "clientInfo": self.client_info,
        }
        message = {"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": params}
        got: dict[str, str] = {}

        def keep_headers(headers: Mapping[str, str]) -> None:
            for name, value in headers.items():
                if name.lower() == rev.SESSION_ID_HEADER.lower():
                    got["session"] = value

        headers = {"Accept": ACCEPT, "Content-Type": "application/json"}
        answer: JsonObject | None = None
        try:
            async with _closing(
                self._transport.post(self.server, headers, _dumps(message), keep_headers)
            ) as stream:
                async for msg in stream:
                    if msg.get("id") == request_id and "method" not in msg:
                        answer = msg
                        break
        except TransportStatus as status:
            raise self._status_error(status) from None
        if answer is None:
            raise ServerUnavailable(self.server, "no answer to initialize")
        if "error" in answer:
            raise _error(self.server, answer["error"])
        result = answer.get("result") or {}
        revision = rev.newest_handshake(str(result.get("protocolVersion", "")))
        if revision is None:
            raise UpstreamError(
                rev.UNSUPPORTED_PROTOCOL_VERSION,
                f"MCP server {self.server!r} answered initialize with protocol version "
                f"{result.get('protocolVersion')!r}, which Tripwire does not speak",
            )
        state = _State(revision=revision, session_id=got.get("session"), server_result=dict(result))
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        try:
            await self._drain(self._transport.post(self.server, self._headers(state), _dumps(initialized)))
        except TransportStatus as status:
            raise self._status_error(status) from None
        return state

    # --- one exchange ---

    def _headers(
        self, state: _State, method: str | None = None, params: JsonObject | None = None
    ) -> dict[str, str]:
        headers = {"Accept": ACCEPT, "Content-Type": "application/json"}
        if rev.is_stateless(state.revision):
            if method is not None:
                headers.update(rev.routing_headers(method, params, state.revision))
                if method == "tools/call" and params is not None:
                    schema = self._tool_schemas.get(str(params.get("name")))
                    headers.update(rev.param_headers(schema, params.get("arguments")))
            else:
                headers[rev.PROTOCOL_VERSION_HEADER] = state.revision
            return headers
        headers[rev.PROTOCOL_VERSION_HEADER] = state.revision
        if state.session_id is not None:
            headers[rev.SESSION_ID_HEADER] = state.session_id
        return headers

    def _outgoing_params(self, state: _State, params: JsonObject | None, token: Any) -> JsonObject | None:
        out: JsonObject | None
        if rev.is_stateless(state.revision):
            out = rev.with_envelope(
                params, state.revision, self.client_info, self.capabilities, self._log_level
            )
        else:
            out = rev.without_envelope(params)
        if token is not None:
            out = dict(out or {})
            out["_meta"] = {**dict(out.get("_meta") or {}), "progressToken": token}
        return out

    async def _exchange(
        self, state: _State, method: str, params: JsonObject | None, on_progress: ProgressHandler | None
    ) -> JsonObject:
        request_id = next(self._ids)
        caller_meta = (params or {}).get("_meta")
        caller_token = caller_meta.get("progressToken") if isinstance(caller_meta, Mapping) else None
        token = f"tw-{self.server}-{request_id}" if on_progress is not None else None
        body_params = self._outgoing_params(state, params, token)
        message: JsonObject = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if body_params is not None:
            message["params"] = body_params
        stream = self._transport.post(self.server, self._headers(state, method, body_params), _dumps(message))
        result = await self._read(state, stream, request_id, token, caller_token, on_progress)
        if method == "tools/list":
            self._remember_schemas(result)
        return result

    async def _read(
        self,
        state: _State,
        stream: AsyncIterator[JsonObject],
        request_id: int,
        token: Any,
        caller_token: Any,
        on_progress: ProgressHandler | None,
    ) -> JsonObject:
        """Read one POST's stream up to the answer to `request_id`: progress to `on_progress`, other
        notifications to `on_notification`, a server's question suspends the stream (input_required)."""
        keep_open = False
        try:
            async for msg in stream:
                if "method" not in msg:
                    if msg.get("id") != request_id:
                        continue
                    if "error" in msg:
                        failure = _error(self.server, msg["error"])
                        if isinstance(failure, UpstreamError):
                            self._mark_reachable()
                        raise failure
                    self._mark_reachable()
                    result = msg.get("result")
                    return dict(result) if isinstance(result, dict) else {}
                params = msg.get("params")
                if "id" not in msg:
                    if msg["method"] == "notifications/progress" and token is not None:
                        if isinstance(params, dict) and params.get("progressToken") == token:
                            await self._progress(on_progress, params, caller_token)
                            continue
                    await self._emit(msg["method"], params if isinstance(params, dict) else None)
                    continue
                # a server-to-client request on this POST's stream (handshake era)
                if rev.may_ask(msg["method"], self.capabilities):
                    keep_open = True
                    return self._suspend(stream, request_id, msg, caller_token)
                await self._answer_server_request(state, msg)
            raise ServerUnavailable(self.server, "the stream ended before the answer")
        except asyncio.CancelledError:
            if rev.cancels_by_notification(state.revision):
                self._cancel_upstream(state, request_id, "cancelled by the client")
            raise
        except TimeoutError:
            if rev.cancels_by_notification(state.revision):
                self._cancel_upstream(state, request_id, "timed out")
            raise
        except ServerUnavailable:
            self._lost = True
            raise
        finally:
            if not keep_open:
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    with contextlib.suppress(Exception):
                        await aclose()

    async def _progress(
        self, on_progress: ProgressHandler | None, params: JsonObject, caller_token: Any
    ) -> None:
        if on_progress is None:
            return
        relayed = dict(params)
        if caller_token is None:
            relayed.pop("progressToken", None)
        else:
            relayed["progressToken"] = caller_token
        await _call(on_progress, relayed)

    def _suspend(
        self, stream: AsyncIterator[JsonObject], request_id: int, asked: JsonObject, caller_token: Any
    ) -> JsonObject:
        key = str(asked["id"])
        state_token = f"tripwire-upstream:{uuid.uuid4().hex}"
        suspended = _Suspended(
            stream=stream, request_id=request_id, asked={key: asked["id"]}, caller_token=caller_token
        )
        suspended.timer = asyncio.get_running_loop().call_later(
            SUSPENDED_TTL_S, lambda: self._spawn(self._drop_suspended(state_token))
        )
        self._suspended[state_token] = suspended
        request: JsonObject = {"method": asked["method"]}
        if asked.get("params") is not None:
            request["params"] = asked["params"]
        return rev.input_required({key: request}, state_token)

    async def _resume(
        self, state: _State, params: JsonObject | None, on_progress: ProgressHandler | None
    ) -> JsonObject:
        _, responses, state_token = rev.split_retry(params)
        suspended = self._suspended.pop(str(state_token))
        if suspended.timer is not None:
            suspended.timer.cancel()
        for key, server_id in suspended.asked.items():
            answer: JsonObject = {"jsonrpc": "2.0", "id": server_id}
            if key in responses and isinstance(responses[key], dict):
                answer["result"] = responses[key]
            else:
                answer["error"] = {"code": rev.INVALID_REQUEST, "message": "the client gave no answer"}
            try:
                await self._drain(self._transport.post(self.server, self._headers(state), _dumps(answer)))
            except TransportStatus as status:
                raise self._status_error(status) from None
        token = f"tw-{self.server}-{suspended.request_id}"
        return await self._read(
            state, suspended.stream, suspended.request_id, token, suspended.caller_token, on_progress
        )

    async def _drop_suspended(self, state_token: str) -> None:
        suspended = self._suspended.pop(state_token, None)
        if suspended is None:
            return
        if suspended.timer is not None:
            suspended.timer.cancel()
        aclose = getattr(suspended.stream, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
        if self._state is not None:
            self._cancel_upstream(self._state, suspended.request_id, "the client never answered")

    async def _answer_server_request(self, state: _State, msg: JsonObject) -> None:
        """Answer a server request nobody relays: `ping` with the empty result, anything the client
        did not declare a capability for with -32601, as a client without that feature does."""
        if msg["method"] == "ping":
            answer: JsonObject = {"jsonrpc": "2.0", "id": msg["id"], "result": {}}
        else:
            answer = {
                "jsonrpc": "2.0",
                "id": msg["id"],
                "error": {
                    "code": rev.METHOD_NOT_FOUND,
                    "message": f"client does not support {msg['method']}",
                },
            }
        if rev.is_stateless(state.revision):
            return  # no back channel at 2026-07-28: nothing can carry an answer
        with contextlib.suppress(TransportStatus, ServerUnavailable):
            await self._drain(self._transport.post(self.server, self._headers(state), _dumps(answer)))

    def _cancel_upstream(self, state: _State, request_id: int, reason: str) -> None:
        """Handshake era: tell the server the request is abandoned (`notifications/cancelled`)."""
        message = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": request_id, "reason": reason},
        }

        async def send() -> None:
            with contextlib.suppress(TransportStatus, ServerUnavailable, OSError):
                await self._drain(self._transport.post(self.server, self._headers(state), _dumps(message)))

        self._spawn(send())

    def _remember_schemas(self, result: JsonObject) -> None:
        for tool in result.get("tools") or []:
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                self._tool_schemas[tool["name"]] = tool.get("inputSchema")

    def _status_error(self, status: TransportStatus) -> Exception:
        message = status.message if isinstance(status.message, dict) else None
        error = message.get("error") if message else None
        if status.status >= 500:  # a failing server or gateway, whatever its body says: isolation's business
            self._lost = True
            detail = f": {error.get('message')}" if isinstance(error, dict) and error.get("message") else ""
            return ServerUnavailable(self.server, f"HTTP {status.status}{detail}")
        if isinstance(error, dict) and "code" in error:
            return UpstreamError(int(error["code"]), str(error.get("message", "")), error.get("data"))
        return UpstreamError(rev.INTERNAL_ERROR, f"MCP server {self.server!r} answered HTTP {status.status}")

    async def _drain(self, stream: AsyncIterator[JsonObject]) -> None:
        async with _closing(stream) as messages:
            async for _ in messages:
                pass

    # --- notifications: the GET stream (handshake) or subscriptions/listen (2026-07-28) ---

    def _start_stream(self) -> None:
        state = self._state
        if state is None or self._closed:
            return
        if rev.is_stateless(state.revision):
            wanted = rev.listen_filter(state.server_result.get("capabilities") or {}, self._resource_uris)
            if not wanted:
                return
            self._listen_acked = asyncio.Event()
            self._stream_task = asyncio.create_task(
                self._listen(state, wanted, self._listen_acked), name=f"tripwire-mcp-listen-{self.server}"
            )
        elif state.session_id is not None:
            self._stream_task = asyncio.create_task(
                self._get_stream(state), name=f"tripwire-mcp-get-{self.server}"
            )

    async def _get_stream(self, state: _State) -> None:
        failures = 0
        while not self._closed and self._state is state:
            try:
                async with _closing(self._transport.get_stream(self.server, self._headers(state))) as stream:
                    if failures:
                        failures = 0
                        await self._emit(REOPENED, None)  # reachable again: its lists may differ
                    async for msg in stream:
                        await self._stream_message(state, msg)
            except asyncio.CancelledError:
                raise
            except TransportStatus as status:
                if status.status == 405:
                    return  # the server offers no GET stream
                if status.status == 404:
                    self._spawn(self._reopen(state))  # the server restarted and forgot us
                    return
                failures += 1
            except Exception as exc:  # ServerUnavailable, a broken stream: reconnect
                log.debug("GET stream of MCP server %r: %s", self.server, exc)
                failures += 1
            await asyncio.sleep(RECONNECT_BACKOFF_S[min(failures, len(RECONNECT_BACKOFF_S) - 1)])

    async def _listen(self, state: _State, wanted: JsonObject, acked: asyncio.Event) -> None:
        failures = 0
        while not self._closed and self._state is state:
            request_id = f"tripwire-listen-{next(self._ids)}"
            params = rev.with_envelope(
                {"notifications": wanted}, state.revision, self.client_info, self.capabilities
            )
            message = {"jsonrpc": "2.0", "id": request_id, "method": "subscriptions/listen", "params": params}
            headers = self._headers(state, "subscriptions/listen", params)
            try:
                async with _closing(self._transport.post(self.server, headers, _dumps(message))) as stream:
                    async for msg in stream:
                        if msg.get("method") == "notifications/subscriptions/acknowledged":
                            acked.set()
                            if failures:
                                failures = 0
                                await self._emit(REOPENED, None)  # re-listen and refetch
                            continue
                        if "method" in msg and "id" not in msg:
                            await self._emit(msg["method"], rev.listen_notification(msg.get("params")))
                        elif msg.get("id") == request_id and "error" in msg:
                            return  # the server refuses to listen
                failures += 1  # the stream ended: the server closed it, or went away
            except asyncio.CancelledError:
                raise
            except TransportStatus as status:
                if 400 <= status.status < 500 and status.status not in (408, 429):  # it will not listen: stop
                    log.warning(
                        "MCP server %r refuses subscriptions/listen: HTTP %s", self.server, status.status
                    )
                    return
                failures += 1
            except Exception as exc:
                log.debug("listen stream of MCP server %r: %s", self.server, exc)
                failures += 1
            await asyncio.sleep(RECONNECT_BACKOFF_S[min(failures, len(RECONNECT_BACKOFF_S) - 1)])

    async def _stream_message(self, state: _State, msg: JsonObject) -> None:
        if "method" not in msg:
            return
        if "id" in msg:  # a request on the GET stream belongs to no client request: answer it here
            await self._answer_server_request(state, msg)
            return
        params = msg.get("params")
        await self._emit(msg["method"], params if isinstance(params, dict) else None)

    def _mark_reachable(self) -> None:
        if self._lost:
            self._lost = False
            self._spawn(self._emit(REOPENED, None))

    async def _emit(self, method: str, params: JsonObject | None) -> None:
        if self._on_notification is None:
            return
        try:
            await _call(self._on_notification, self.server, method, params)
        except Exception:
            log.exception("on_notification for MCP server %r failed", self.server)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


@contextlib.asynccontextmanager
async def _closing(stream: AsyncIterator[JsonObject]) -> AsyncIterator[AsyncIterator[JsonObject]]:
    """`stream`, closed on the way out (an async generator's `aclose`: the HTTP response with it)."""
    try:
        yield stream
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()


async def _call(handler: Callable[..., Awaitable[None] | None], *args: Any) -> None:
    outcome = handler(*args)
    if inspect.isawaitable(outcome):
        await outcome


class UpstreamSessions:
    """Every server's upstream session, each opened lazily on first `get` and kept."""

    on_notification: NotificationHandler | None
    """Set by the aggregate: called with (server, method, params) for each server notification
    (and `REOPENED` when a server's lists may have changed)."""

    def __init__(
        self,
        transport: Transport,
        on_notification: NotificationHandler | None = None,
        *,
        client_info: Mapping[str, Any] | None = None,
        capabilities: Mapping[str, Any] | None = None,
    ) -> None:
        self._transport = transport
        self.on_notification = on_notification
        self.client_info = dict(client_info or DEFAULT_CLIENT_INFO)
        self.capabilities = dict(capabilities or {})
        self._sessions: dict[str, UpstreamSession] = {}

    def get(self, server: str) -> UpstreamSession:
        """The server's session (created on first use; it opens on its first request)."""
        session = self._sessions.get(server)
        if session is None:
            session = UpstreamSession(
                server,
                self._transport,
                self._relay,
                client_info=self.client_info,
                capabilities=self.capabilities,
            )
            self._sessions[server] = session
        return session

    async def _relay(self, server: str, method: str, params: JsonObject | None) -> None:
        if self.on_notification is not None:
            await _call(self.on_notification, server, method, params)

    async def close(self) -> None:
        """Close every session."""
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
