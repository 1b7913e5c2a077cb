"""A fake Anthropic Messages upstream on 127.0.0.1 that logs what a real client (Claude Code) sends.

The sibling of scripts/codex_capture.py, for tests/fixtures/claude_code_*.json: start this, start
Tripwire with `--llm anthropic=http://127.0.0.1:PORT`, point Claude Code at Tripwire
(`ANTHROPIC_BASE_URL=http://127.0.0.1:8713/agents/claude/llm/anthropic claude -p ...`) and read the
log. Each request that offers tools (the conversation) gets the next list of content blocks of the
script file (a JSON list of lists; `tool_use` blocks end the answer with stop_reason `tool_use`;
once spent, a plain "done." text); a request without tools (Claude Code's side requests: a title,
a quota check) gets a short text. Streams when asked to, as the API does. Only 127.0.0.1.

    python scripts/claude_capture.py --port 18556 --script blocks.json --log capture.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

from aiohttp import web

_ids = itertools.count(1)
SIDE_TEXT = "Capture run"


class Capture:
    def __init__(self, script: list[Any], log: Path) -> None:
        self.script = list(script)
        self.log = log

    def write(self, record: dict[str, Any]) -> None:
        with self.log.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def next_content(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        if not body.get("tools"):
            return [{"type": "text", "text": SIDE_TEXT}]
        if self.script:
            return self.script.pop(0)
        return [{"type": "text", "text": "done."}]

    def message(self, body: dict[str, Any], content: list[dict[str, Any]]) -> dict[str, Any]:
        uses_tool = any(b.get("type") == "tool_use" for b in content)
        return {
            "id": f"msg_cap{next(_ids)}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model") or "claude-sonnet-4-5",
            "content": content,
            "stop_reason": "tool_use" if uses_tool else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 100, "output_tokens": 10},
        }

    def events(self, message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 100, "output_tokens": 1},
        }
        out: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": start})
        ]
        for i, block in enumerate(message["content"]):
            if block["type"] == "tool_use":
                empty = {**block, "input": {}}
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            else:
                empty = {**block, "text": ""}
                delta = {"type": "text_delta", "text": block["text"]}
            out.append(
                ("content_block_start", {"type": "content_block_start", "index": i, "content_block": empty})
            )
            out.append(("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}))
            out.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        stop = {"stop_reason": message["stop_reason"], "stop_sequence": None}
        out.append(
            ("message_delta", {"type": "message_delta", "delta": stop, "usage": {"output_tokens": 10}})
        )
        out.append(("message_stop", {"type": "message_stop"}))
        return out

    async def http(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        self.write(
            {
                "kind": "http",
                "method": request.method,
                "path": request.path,
                "query": request.query_string,
                "headers": dict(request.headers),
                "body": body,
            }
        )
        if request.path.endswith("/count_tokens"):
            return web.json_response({"input_tokens": 100})
        if not request.path.endswith("/messages") or not isinstance(body, dict):
            return web.json_response(
                {"type": "error", "error": {"type": "not_found_error", "message": "no"}}, status=404
            )
        message = self.message(body, self.next_content(body))
        if not body.get("stream"):
            return web.json_response(message)
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for name, event in self.events(message):
            await out.write(f"event: {name}\ndata: {json.dumps(event)}\n\n".encode())
        await out.write_eof()
        return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--script", type=Path)
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args()
    script = json.loads(args.script.read_text()) if args.script else []
    capture = Capture(script, args.log)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", capture.http)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
