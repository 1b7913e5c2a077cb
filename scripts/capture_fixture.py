"""Turn a capture log (scripts/codex_capture.py, scripts/claude_capture.py) into a test fixture.

Keeps what the client sent (HTTP bodies and headers, WebSocket messages) and what the fake answered
(the script), cuts long instruction texts and tool descriptions to 160 characters (`[cut]`), drops
the key headers and WebSocket plumbing, and replaces the client's session id with SESSION. The keys
in a capture are fake; they are dropped all the same, as a real one would be.

    python scripts/capture_fixture.py --log capture.jsonl --script items.json --source "..." --out f.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

CUT = 160
DROPPED_HEADERS = {
    "authorization",
    "x-api-key",
    "host",
    "content-length",
    "connection",
    "upgrade",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-extensions",
    "accept-encoding",
}
SESSION_HEADERS = ("session-id", "session_id", "x-claude-code-session-id")


def cut(text: str) -> str:
    return text if len(text) <= CUT else text[:CUT] + " [cut]"


def trimmed(value: Any, key: str = "") -> Any:
    """Long descriptions and instruction texts cut; everything else as it came."""
    if isinstance(value, dict):
        role = value.get("role")
        out = {}
        for k, v in value.items():
            if k == "description" and isinstance(v, str):
                out[k] = cut(v)
            elif role in ("developer", "system") and k == "content":
                out[k] = trimmed_texts(v)
            else:
                out[k] = trimmed(v, k)
        return out
    if isinstance(value, list):
        if key == "system":  # Anthropic's system blocks
            return trimmed_texts(value)
        return [trimmed(v) for v in value]
    if key in ("instructions", "system") and isinstance(value, str):
        return cut(value)
    return value


def trimmed_texts(content: Any) -> Any:
    if isinstance(content, str):
        return cut(content)
    if isinstance(content, list):
        return [
            {**b, "text": cut(b["text"])} if isinstance(b, dict) and isinstance(b.get("text"), str) else b
            for b in content
        ]
    return content


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--script", type=Path)
    parser.add_argument("--source", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    records = [json.loads(line) for line in args.log.read_text().splitlines() if line.strip()]
    session = None
    headers: dict[str, str] = {}
    handshake: dict[str, str] = {}
    requests: list[Any] = []
    messages: list[Any] = []
    for r in records:
        if r["kind"] == "http":
            kept = {k: v for k, v in r["headers"].items() if k.lower() not in DROPPED_HEADERS}
            for name in SESSION_HEADERS:
                session = session or next((v for k, v in kept.items() if k.lower() == name), None)
            if r["method"] == "GET":
                handshake = handshake or kept
            elif isinstance(r.get("body"), dict):
                headers = headers or kept
                requests.append({"path": r["path"], "body": trimmed(r["body"])})
        elif r["kind"] == "ws":
            messages.append(trimmed(r["message"]))
    fixture: dict[str, Any] = {"_source": args.source}
    if headers:
        fixture["headers"] = headers
    if handshake and messages:
        fixture["handshake_headers"] = handshake
    if requests:
        fixture["requests"] = requests
    if messages:
        fixture["messages"] = messages
    if args.script:
        fixture["answers"] = json.loads(args.script.read_text())
    text = json.dumps(fixture, indent=1, ensure_ascii=False)
    if session:
        text = text.replace(session, "SESSION")
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
