"""Fake upstreams for tests: a real aiohttp server on 127.0.0.1 that speaks the OpenAI
(Chat Completions, Responses, embeddings, models) and Anthropic Messages wire formats.

Replies are scripted: each chat/responses/messages call pops the next `Reply` (text or tool calls),
so a test drives a real SDK agent loop against it and knows exactly what usage each call reported.
Every request is kept (method, path, headers, JSON body) for assertions.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
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
        r.add_route("*", "/{tail:.*}", self.echo)

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
            return web.json_response(
                {"error": {"message": "boom", "type": "server_error"}}, status=reply.status
            )
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
            return web.json_response(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": 1700000000,
                    "model": model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                    "usage": usage,
                }
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
        events.append(chunk({}, finish))
        if include_usage:
            last = chunk(None)
            last["usage"] = usage
            events.append(last)
        return await self._sse(
            request, [f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"], reply
        )

    async def _sse(self, request: web.Request, frames: list[str], reply: Reply) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for n, frame in enumerate(frames):
            if reply.break_after_chunks is not None and n >= reply.break_after_chunks:
                assert request.transport is not None
                request.transport.abort()  # a broken stream: no terminator, connection dropped
                return resp
            await resp.write(frame.encode())
            await asyncio.sleep(reply.chunk_delay)
        await resp.write_eof()
        return resp

    # ---- OpenAI Responses ------------------------------------------------------------------------

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._seen(request)
        reply = self.next_reply()
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
        response = {
            "id": f"resp_fake{len(self.seen)}",
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
        if not body.get("stream"):
            return web.json_response(response)
        seq = iter(range(1000))
        frames = []

        def ev(kind: str, data: dict[str, Any]) -> None:
            data = {"type": kind, "sequence_number": next(seq), **data}
            frames.append(f"event: {kind}\ndata: {json.dumps(data)}\n\n")

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
        return await self._sse(request, frames, reply)

    # ---- Anthropic Messages ----------------------------------------------------------------------

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._seen(request)
        reply = self.next_reply()
        model = reply.model or body.get("model", "claude-sonnet-4-5")
        content: list[dict[str, Any]] = []
        if reply.text:
            content.append({"type": "text", "text": reply.text})
        for cid, name, args in reply.tool_calls:
            content.append({"type": "tool_use", "id": cid, "name": name, "input": args})
        stop = "tool_use" if reply.tool_calls else "end_turn"
        usage = {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens}
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": content,
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": usage,
                }
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

    async def echo(self, request: web.Request) -> web.Response:
        body = await self._seen(request)
        return web.json_response(
            {"method": request.method, "path": request.path, "query": request.query_string, "body": body},
            headers={"X-Upstream-Echo": "1"},
        )


def _pieces(text: str, size: int = 4) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]
