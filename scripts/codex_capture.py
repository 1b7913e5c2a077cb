"""A fake Responses upstream on 127.0.0.1 that logs what a real client (Codex CLI) sends.

How tests/fixtures/codex_<version>_*.json are recorded: start this, point the client at it
(`codex exec -c openai_base_url=http://127.0.0.1:PORT/v1 ...`), and read the log. Each answer
the client asks for (not Codex's `generate: false` warm-up) is the next list of output items in the
script file (a JSON list of lists; once spent, a plain "done." message); a request whose last
input item is a `compaction_trigger` gets a `compaction` item. `--no-ws` refuses the WebSocket
upgrade so the client falls back to HTTP + SSE; `--usage N` makes every answer report N tokens (a
low `-c model_auto_compact_token_limit=...` then makes Codex compact). Only 127.0.0.1.

Through Tripwire, as tests/fixtures/codex_0171_code_mode_*.json were recorded: start Tripwire with
`--upstream http://127.0.0.1:PORT` (and `--mcp-stdio demo="python tests/mcp_servers.py stdio"`), give
Codex `openai_base_url` and `[mcp_servers.demo]` in `$CODEX_HOME/config.toml` and its key in
`CODEX_API_KEY`, and script `exec` calls (custom_tool_call items named `exec`, namespace
`functions`, whose `input` is the JavaScript); then scripts/capture_fixture.py turns the log into a
fixture. Claude Code's sibling: scripts/claude_capture.py.

    python scripts/codex_capture.py --port 18555 --script items.json --log capture.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

_ids = itertools.count(1)


def _usage(total: int) -> dict[str, Any]:
    return {
        "input_tokens": total - 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 10,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": total,
    }


class Capture:
    def __init__(self, script: list[Any], log: Path, ws: bool, usage: int) -> None:
        self.script = list(script)
        self.log = log
        self.ws = ws
        self.usage = usage

    def write(self, record: dict[str, Any]) -> None:
        with self.log.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def next_output(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        items = body.get("input") or []
        if items and isinstance(items[-1], dict) and items[-1].get("type") == "compaction_trigger":
            return [{"type": "compaction", "id": f"cmp_{next(_ids)}", "encrypted_content": "opaque-summary"}]
        if self.script:
            return self.script.pop(0)
        done = [{"type": "output_text", "text": "done.", "annotations": []}]
        return [
            {
                "type": "message",
                "id": f"msg_{next(_ids)}",
                "role": "assistant",
                "status": "completed",
                "content": done,
            }
        ]

    def events(self, body: dict[str, Any], output: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rid = f"resp_cap{next(_ids)}"
        response = {
            "id": rid,
            "object": "response",
            "created_at": 1700000000,
            "status": "completed",
            "model": body.get("model") or "gpt-5",
            "output": output,
            "usage": _usage(self.usage),
        }
        events = [
            {"type": "response.created", "response": {**response, "status": "in_progress", "output": []}}
        ]
        for i, item in enumerate(output):
            events.append({"type": "response.output_item.added", "output_index": i, "item": item})
            events.append({"type": "response.output_item.done", "output_index": i, "item": item})
        events.append({"type": "response.completed", "response": response})
        return [{**e, "sequence_number": n} for n, e in enumerate(events)]

    async def http(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        self.write(
            {
                "kind": "http",
                "method": request.method,
                "path": request.path,
                "headers": dict(request.headers),
                "body": body,
            }
        )
        if request.method == "GET" and request.path.endswith("/responses"):
            return await self.websocket(request)
        if request.path.endswith("/models"):
            return web.json_response({"object": "list", "data": []})
        if request.path.endswith("/responses/compact"):
            item = {"type": "compaction", "id": f"cmp_{next(_ids)}", "encrypted_content": "opaque-summary"}
            return web.json_response(
                {
                    "id": f"resp_cmp{next(_ids)}",
                    "object": "response.compaction",
                    "output": [item],
                    "usage": _usage(100),
                }
            )
        if not isinstance(body, dict):
            return web.json_response({}, status=404)
        events = self.events(body, self.next_output(body))
        if not body.get("stream"):
            return web.json_response(events[-1]["response"])
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for event in events:
            await out.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        await out.write_eof()
        return out

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        if not self.ws:
            return web.json_response({"error": {"message": "no websockets"}}, status=426)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            self.write({"kind": "ws", "message": data})
            if data.get("type") != "response.create":
                continue
            output = [] if data.get("generate") is False else self.next_output(data)
            for event in self.events(data, output):
                await ws.send_str(json.dumps(event))
        return ws


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--script", type=Path)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--no-ws", action="store_true")
    parser.add_argument("--usage", type=int, default=110, help="total_tokens each answer reports")
    args = parser.parse_args()
    script = json.loads(args.script.read_text()) if args.script else []
    capture = Capture(script, args.log, not args.no_ws, args.usage)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", capture.http)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
