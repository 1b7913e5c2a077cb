"""Fake upstreams for tests: a real aiohttp server on 127.0.0.1 that speaks the OpenAI
(Chat Completions, Responses, embeddings, models) and Anthropic Messages wire formats.

Replies are scripted: each chat/responses/messages call pops the next `Reply` (text or tool calls),
so a test drives a real SDK agent loop against it and knows exactly what usage each call reported.
Every request is kept (method, path, headers, JSON body) for assertions.

Faults a `Reply` can inject (all off by default): a stream that breaks or hangs after N frames, an
answer compressed although nobody asked (`content_encoding`), LiteLLM's usage-chunk shape, and
streams too big to hold (many large chunks, one very long SSE line), generated as they are sent.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web
from multidict import CIMultiDict


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # (id, name, args)
    prompt_tokens: int = 100
    completion_tokens: int = 20
    model: str | None = None  # defaults to the request's model
    status: int = 200
    break_after_chunks: int | None = None  # streams: drop the connection after N data events
    finish_reason: str | None = None
    chunk_delay: float = 0.0  # streams: seconds between events (slow upstreams, drain tests)
    # streams: after N frames send nothing more and keep the connection open until the peer closes it
    hang_after_chunks: int | None = None
    # compress the answer whatever Accept-Encoding says: "gzip", "deflate" (zlib-wrapped) or
    # "deflate-raw" (raw deflate, labelled "deflate"); streams are flushed frame by frame
    content_encoding: str | None = None
    # chat streams: the usage chunk's `choices` (None: OpenAI's []; LiteLLM: [{"index": 0, "delta": {}}])
    usage_chunk_choices: list[dict[str, Any]] | None = None
    # chat streams: after the text, `bulk_chunks` more content deltas of `bulk_chunk_chars` "x" each
    bulk_chunks: int = 0
    bulk_chunk_chars: int = 0
    # chat streams: then one content delta of this many "y" in a single SSE line, written 1 MiB at a time
    long_line_chars: int = 0
    # Responses WebSocket: after this many events, send nothing more until `resume` is set
    pause_after_events: int | None = None
    resume: asyncio.Event | None = None
    # SSE streams: after this many frames, send nothing more until `resume` is set
    pause_after_chunks: int | None = None
    # Responses: output items sent as they are, after the text and tool calls (local_shell_call, ...)
    output_items: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Seen:
    method: str
    path: str
    query: str
    headers: CIMultiDict[str]  # case-insensitive, as HTTP headers are
    body: Any


class FakeUpstream:
    def __init__(self, replies: list[Reply] | None = None, default: Reply | None = None) -> None:
        self.replies = list(replies or [])
        self.default = default or Reply(text="ok")
        self.seen: list[Seen] = []
        self.app = web.Application()
        r = self.app.router
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/v1/responses", self.responses)
        r.add_post("/v1/messages", self.messages)
        r.add_post("/v1/embeddings", self.embeddings)
        r.add_get("/v1/models", self.models)
        # the Responses API over WebSocket (a plain GET is echoed as before)
        r.add_get("/v1/responses", self.responses_ws)
        r.add_route("*", "/{tail:.*}", self.echo)
        # WebSockets: handshakes, client messages and the close codes the fake received
        self.ws_handshakes: list[Seen] = []
        self.ws_messages: list[Any] = []
        self.ws_closes: list[tuple[int | None, str | None]] = []
        self.ws_refuse_status: int | None = None  # answer upgrades with this status instead
        self.ws_protocols: tuple[str, ...] = ()  # subprotocols the fake accepts
        self.ws_response_headers: dict[str, str] = {}  # extra headers of the 101

    def next_reply(self) -> Reply:
        return self.replies.pop(0) if self.replies else self.default

    async def _seen(self, request: web.Request) -> Any:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        self.seen.append(
            Seen(request.method, request.path, request.query_string, dict(request.headers), body)
        )
        return body

    def calls(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    # ---- OpenAI Chat Completions -------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._seen(request)
        reply = self.next_reply()
        model = reply.model or body.get("model", "gpt-4o-mini")
        if reply.status >= 400:
            return self._json({"error": {"message": "boom", "type": "server_error"}}, reply, reply.status)
        usage = {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        }
        finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        tool_calls = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, n, a in reply.tool_calls
        ]
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
            if tool_calls:
                message["tool_calls"] = tool_calls
            return self._json(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": 1700000000,
                    "model": model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                    "usage": usage,
                },
                reply,
            )
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any] | None, finish_reason: str | None = None) -> dict[str, Any]:
            c: dict[str, Any] = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": model,
                "choices": []
                if delta is None
                else [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
            if include_usage:
                c["usage"] = None
            return c

        events: list[dict[str, Any]] = [chunk({"role": "assistant", "content": ""})]
        for piece in _pieces(reply.text):
            events.append(chunk({"content": piece}))
        for idx, (cid, name, args) in enumerate(reply.tool_calls):
            events.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": idx,
                                "id": cid,
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ]
                    }
                )
            )
            for piece in _pieces(json.dumps(args)):
                events.append(chunk({"tool_calls": [{"index": idx, "function": {"arguments": piece}}]}))
        tail: list[dict[str, Any]] = [chunk({}, finish)]
        if include_usage:
            last = chunk(None)
            if reply.usage_chunk_choices is not None:
                last["choices"] = reply.usage_chunk_choices
            last["usage"] = usage
            tail.append(last)

        def frames() -> Iterator[str | bytes]:
            for e in events:
                yield f"data: {json.dumps(e)}\n\n"
            if reply.bulk_chunks:
                bulk = f"data: {json.dumps(chunk({'content': 'x' * reply.bulk_chunk_chars}))}\n\n".encode()
                for _ in range(reply.bulk_chunks):
                    yield bulk
            if reply.long_line_chars:
                head, end = json.dumps(chunk({"content": "@"})).split("@")
                yield f"data: {head}"
                piece = b"y" * (1 << 20)
                for start in range(0, reply.long_line_chars, len(piece)):
                    yield piece[: reply.long_line_chars - start]
                yield f"{end}\n\n"
            for e in tail:
                yield f"data: {json.dumps(e)}\n\n"
            yield "data: [DONE]\n\n"

        return await self._sse(request, frames(), reply)

    def _json(self, data: Any, reply: Reply, status: int = 200) -> web.Response:
        if reply.content_encoding is None:
            return web.json_response(data, status=status)
        coder = _Compressor(reply.content_encoding)
        body = coder.compress(json.dumps(data).encode()) + coder.finish()
        headers = {"Content-Type": "application/json", "Content-Encoding": coder.header}
        return web.Response(body=body, status=status, headers=headers)

    async def _sse(
        self, request: web.Request, frames: Iterable[str | bytes], reply: Reply
    ) -> web.StreamResponse:
        headers = {"Content-Type": "text/event-stream"}
        coder = _Compressor(reply.content_encoding) if reply.content_encoding else None
        if coder is not None:
            headers["Content-Encoding"] = coder.header
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)
        for n, frame in enumerate(frames):
            if reply.break_after_chunks is not None and n >= reply.break_after_chunks:
                assert request.transport is not None
                request.transport.abort()  # a broken stream: no terminator, connection dropped
                return resp
            if reply.hang_after_chunks is not None and n >= reply.hang_after_chunks:
                # an upstream gone silent, until the proxy hangs up (aiohttp has no event for that)
                while request.transport is not None and not request.transport.is_closing():  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                return resp
            if reply.pause_after_chunks is not None and n == reply.pause_after_chunks:
                assert reply.resume is not None
                await reply.resume.wait()  # the test saw the first events arrive before the rest exist
            data = frame.encode() if isinstance(frame, str) else frame
            await resp.write(coder.compress(data) + coder.flush() if coder is not None else data)
            await asyncio.sleep(reply.chunk_delay)
        if coder is not None:
            await resp.write(coder.finish())
        await resp.write_eof()
        return resp

    # ---- OpenAI Responses ------------------------------------------------------------------------

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._seen(request)
        reply = self.next_reply()
        response, events = self._responses_answer(body, reply, f"resp_fake{len(self.seen)}")
        if not body.get("stream"):
            return self._json(response, reply)
        frames = []
        for n, (kind, data) in enumerate(events):
            data = {"type": kind, "sequence_number": n, **data}
            frames.append(f"event: {kind}\ndata: {json.dumps(data)}\n\n")
        return await self._sse(request, frames, reply)

    def _responses_answer(
        self, body: dict[str, Any], reply: Reply, response_id: str
    ) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
        """A Responses answer: the response object, and the events of its stream (SSE or WebSocket)."""
        model = reply.model or body.get("model", "gpt-4o")
        output: list[dict[str, Any]] = []
        if reply.text:
            output.append(
                {
                    "type": "message",
                    "id": "msg_fake",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
                }
            )
        for cid, name, args in reply.tool_calls:
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{cid}",
                    "call_id": cid,
                    "name": name,
                    "arguments": json.dumps(args),
                    "status": "completed",
                }
            )
        output.extend(reply.output_items)
        response = {
            "id": response_id,
            "object": "response",
            "created_at": 1700000000,
            "status": "completed",
            "model": model,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": reply.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": reply.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            },
        }
        events: list[tuple[str, dict[str, Any]]] = []

        def ev(kind: str, data: dict[str, Any]) -> None:
            events.append((kind, data))

        ev(
            "response.created",
            {"response": {**response, "status": "in_progress", "output": [], "usage": None}},
        )
        for i, item in enumerate(output):
            ev("response.output_item.added", {"output_index": i, "item": item})
            if item["type"] == "message":
                for piece in _pieces(reply.text):
                    ev(
                        "response.output_text.delta",
                        {
                            "item_id": item["id"],
                            "output_index": i,
                            "content_index": 0,
                            "delta": piece,
                            "logprobs": [],
                        },
                    )
            ev("response.output_item.done", {"output_index": i, "item": item})
        ev("response.completed", {"response": response})
        return response, events

    async def responses_ws(self, request: web.Request) -> web.StreamResponse:
        """The Responses API over WebSocket: each `response.create` answered with the events of
        the SSE stream, one JSON text message each (echoing its `stream_id`); a `generate: false`
        warm-up gets an empty completed response; a Reply with status >= 400 an `error` event."""
        ws = await self._ws_accept(request)
        if not isinstance(ws, web.WebSocketResponse):
            return ws
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            self.ws_messages.append(data)
            if not isinstance(data, dict) or data.get("type") != "response.create":
                continue
            lane = {"stream_id": data["stream_id"]} if "stream_id" in data else {}
            rid = f"resp_ws{len(self.ws_messages)}"
            if data.get("generate") is False:
                reply = Reply(prompt_tokens=0, completion_tokens=0)
                response, events = self._responses_answer(data, reply, rid)
                events = [e for e in events if e[0] in ("response.created", "response.completed")]
            else:
                reply = self.next_reply()
                if reply.status >= 400:
                    error = {
                        "type": "invalid_request_error",
                        "code": "fake_error",
                        "message": "boom",
                        "param": None,
                    }
                    await ws.send_str(
                        json.dumps({"type": "error", "status": reply.status, "error": error, **lane})
                    )
                    continue
                response, events = self._responses_answer(data, reply, rid)
            for n, (kind, event) in enumerate(events):
                if reply.pause_after_events is not None and n == reply.pause_after_events:
                    assert reply.resume is not None
                    await reply.resume.wait()
                await ws.send_str(json.dumps({"type": kind, "sequence_number": n, **event, **lane}))
        self.ws_closes.append((ws.close_code, None))
        return ws

    async def _ws_accept(self, request: web.Request) -> web.StreamResponse:
        """The upgrade of a WebSocket handshake (a plain request: the echo; refused when asked)."""
        ws = web.WebSocketResponse(protocols=self.ws_protocols)
        if not ws.can_prepare(request).ok:
            return await self.echo(request)
        self.ws_handshakes.append(
            Seen(request.method, request.path, request.query_string, CIMultiDict(request.headers), None)
        )
        if self.ws_refuse_status is not None:
            return web.json_response(
                {"error": {"message": "no websockets here", "type": "invalid_request_error"}},
                status=self.ws_refuse_status,
                headers={"X-Upstream-Refusal": "1"},
            )
        ws.headers.update(self.ws_response_headers)
        await ws.prepare(request)
        return ws

    async def echo_ws(self, request: web.Request) -> web.StreamResponse:
        """Any other WebSocket: text and binary messages echoed; text `close:CODE` closes with CODE."""
        ws = await self._ws_accept(request)
        if not isinstance(ws, web.WebSocketResponse):
            return ws
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                self.ws_messages.append(msg.data)
                if msg.data.startswith("close:"):
                    await ws.close(code=int(msg.data[6:]), message=b"asked to")
                    break
                await ws.send_str("echo:" + msg.data)
            elif msg.type == WSMsgType.BINARY:
                self.ws_messages.append(msg.data)
                await ws.send_bytes(msg.data[::-1])
        self.ws_closes.append((ws.close_code, None))
        return ws

    # ---- Anthropic Messages ----------------------------------------------------------------------

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._seen(request)
        reply = self.next_reply()
        if reply.status >= 400:
            error = {"type": "error", "error": {"type": "api_error", "message": f"fake error {reply.status}"}}
            return web.json_response(error, status=reply.status)
        model = reply.model or body.get("model", "claude-sonnet-4-5")
        content: list[dict[str, Any]] = []
        if reply.text:
            content.append({"type": "text", "text": reply.text})
        for cid, name, args in reply.tool_calls:
            content.append({"type": "tool_use", "id": cid, "name": name, "input": args})
        stop = "tool_use" if reply.tool_calls else "end_turn"
        usage = {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens}
        if not body.get("stream"):
            return self._json(
                {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": content,
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": usage,
                },
                reply,
            )
        frames = []

        def ev(kind: str, data: dict[str, Any]) -> None:
            frames.append(f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n")

        ev(
            "message_start",
            {
                "message": {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": 1},
                }
            },
        )
        for i, block in enumerate(content):
            if block["type"] == "text":
                ev("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}})
                for piece in _pieces(block["text"]):
                    ev("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": piece}})
            else:
                ev("content_block_start", {"index": i, "content_block": {**block, "input": {}}})
                ev(
                    "content_block_delta",
                    {
                        "index": i,
                        "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])},
                    },
                )
            ev("content_block_stop", {"index": i})
        ev(
            "message_delta",
            {
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": reply.completion_tokens},
            },
        )
        ev("message_stop", {})
        return await self._sse(request, frames, reply)

    # ---- the rest ----------------------------------------------------------------------------------

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await self._seen(request)
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]}
                    for i, _ in enumerate(inputs)
                ],
                "model": body.get("model", "text-embedding-3-small"),
                "usage": {"prompt_tokens": 8 * len(inputs), "total_tokens": 8 * len(inputs)},
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        await self._seen(request)
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": "gpt-4o-mini", "object": "model", "created": 1, "owned_by": "fake"}],
            }
        )

    async def echo(self, request: web.Request) -> web.StreamResponse:
        if web.WebSocketResponse().can_prepare(request).ok:
            return await self.echo_ws(request)
        body = await self._seen(request)
        return web.json_response(
            {"method": request.method, "path": request.path, "query": request.query_string, "body": body},
            headers={"X-Upstream-Echo": "1"},
        )


class _Compressor:
    """An answer's content coding, flushed frame by frame so a stream stays a stream."""

    def __init__(self, coding: str) -> None:
        self.header = "deflate" if coding == "deflate-raw" else coding
        self._br: Any = None
        if coding == "br":
            import brotli  # a dev dependency

            self._br = brotli.Compressor()
            return
        wbits = {"gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS, "deflate-raw": -zlib.MAX_WBITS}
        self._obj = zlib.compressobj(wbits=wbits[coding])

    def compress(self, data: bytes) -> bytes:
        return self._br.process(data) if self._br is not None else self._obj.compress(data)

    def flush(self) -> bytes:
        return self._br.flush() if self._br is not None else self._obj.flush(zlib.Z_SYNC_FLUSH)

    def finish(self) -> bytes:
        return self._br.finish() if self._br is not None else self._obj.flush(zlib.Z_FINISH)


def _pieces(text: str, size: int = 4) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


# ---- alert webhooks --------------------------------------------------------------------------------


@dataclass
class Webhook:
    """What an `alert_webhook` receiver got: the JSON bodies, in order; `arrived` set at each."""

    url: str
    got: list[dict[str, Any]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)


@asynccontextmanager
async def webhook_receiver() -> AsyncIterator[Webhook]:
    """A webhook receiver on 127.0.0.1 (POST /hook answers 204), closed on exit."""
    from aiohttp.test_utils import TestServer

    received: list[dict[str, Any]] = []
    arrived = asyncio.Event()

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        arrived.set()
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield Webhook(str(server.make_url("/hook")), received, arrived)
    finally:
        await server.close()
