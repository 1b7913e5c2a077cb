"""The benchmark's fake OpenAI upstream: a minimal HTTP/1.1 server on asyncio (uvloop when installed).

Hand-written on purpose: the upstream must cost as little as possible, so the columns of the
benchmark measure the proxies, not it. It answers every POST (keep-alive, Content-Length bodies)
with a Chat Completions answer, and streams one when the body asks for `"stream": true`.

Request headers steer the answer (a proxy forwards them like any other header):
- `x-bench-tool-call: ID`: the answer asks for one `read_file` tool call with that id (agent loops);
- `x-bench-chunks: N`, `x-bench-chunk-delay-ms: D`: a stream of N content chunks, D ms apart.

    python -m bench.upstream --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson

ANSWER_TEXT = "A fine answer of moderate length. " * 8


def completion(tool_call_id: str | None, prompt_tokens: int) -> bytes:
    message: dict[str, object] = {"role": "assistant", "content": None if tool_call_id else ANSWER_TEXT}
    if tool_call_id:
        args = orjson.dumps({"path": f"src/module_{tool_call_id[-6:]}.py"}).decode()
        message["tool_calls"] = [
            {"id": tool_call_id, "type": "function", "function": {"name": "read_file", "arguments": args}}
        ]
    return orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if tool_call_id else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 42,
                "total_tokens": prompt_tokens + 42,
            },
        }
    )


def sse_chunk(delta: dict[str, object], usage: dict[str, int] | None = None) -> bytes:
    chunk = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": None}],
    }
    if usage:
        chunk["usage"] = usage
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Upstream(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            headers = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4 : end + 4 + length])
            del self.buf[: end + 4 + length]
            self.answer(headers, body)

    def answer(self, headers: dict[str, str], body: bytes) -> None:
        assert self.transport is not None
        prompt_tokens = max(1, len(body) // 4)
        if b'"stream":true' in body or b'"stream": true' in body:
            self.stream(headers, prompt_tokens)
            return
        payload = completion(headers.get("x-bench-tool-call"), prompt_tokens)
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(payload), payload)
        )

    def stream(self, headers: dict[str, str], prompt_tokens: int) -> None:
        assert self.transport is not None
        n = int(headers.get("x-bench-chunks", "10"))
        delay = float(headers.get("x-bench-chunk-delay-ms", "0")) / 1000
        parts = [sse_chunk({"role": "assistant", "content": ""})]
        parts += [sse_chunk({"content": f"word{i} "}) for i in range(n)]
        parts.append(
            sse_chunk(
                {},
                {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n},
            )
        )
        parts.append(b"data: [DONE]\n\n")
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        if delay <= 0:
            self.transport.write(b"".join(http_chunk(p) for p in parts) + b"0\r\n\r\n")
            return
        # the role chunk goes at once (first byte), each content chunk `delay` after the one before
        loop = asyncio.get_running_loop()
        transport = self.transport
        start = loop.time()
        transport.write(http_chunk(parts[0]))
        for i, part in enumerate(parts[1:], start=1):
            last = i == len(parts) - 1
            data = http_chunk(part) + (b"0\r\n\r\n" if last else b"")
            loop.call_at(start + min(i, n) * delay, _write_if_open, transport, data)


def _write_if_open(transport: Any, data: bytes) -> None:
    if not transport.is_closing():
        transport.write(data)


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Upstream, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    try:
        import uvloop
    except ImportError:  # the benchmark still runs, a little slower
        asyncio.run(serve(args.port))
    else:
        uvloop.run(serve(args.port))


if __name__ == "__main__":
    main()
