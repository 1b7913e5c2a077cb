"""`MessageObserver` (the Forwarder's observer for MCP answers) fed bytes directly: a JSON answer or
an SSE stream is sniffed from its first bytes, every message goes to `on_message`, a replacement is
relayed instead, a JSON answer is held only when it will be rewritten, Tripwire's queued events are
injected between the server's, and an event id makes the stream resumable."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.mcp.observe import MessageObserver
from tests.factories import mcp_tool_result, sse_message


def feed_all(observer: MessageObserver, data: bytes, size: int = 7) -> bytes:
    out = b"".join(observer.feed(data[i : i + size]) for i in range(0, len(data), size))
    return out + observer.flush()


def test_a_json_answer_is_relayed_as_it_comes_and_its_message_seen() -> None:
    seen: list[Any] = []
    observer = MessageObserver(lambda m: seen.append(m), limit=1 << 20)
    body = orjson.dumps(mcp_tool_result(msg_id=1))
    assert feed_all(observer, b"  " + body) == b"  " + body
    assert observer.mode == "json" and seen == [mcp_tool_result(msg_id=1)] and observer.messages_seen == 1


def test_a_held_json_answer_is_rewritten_whole() -> None:
    replacement = {"jsonrpc": "2.0", "id": 1, "result": {"content": [], "isError": False}}
    observer = MessageObserver(lambda m: replacement, limit=1 << 20, hold_json=lambda: True)
    assert observer.rewrites
    body = orjson.dumps(mcp_tool_result(msg_id=1))
    first = observer.feed(body[:10])
    assert first == b""  # held until complete
    assert orjson.loads(first + observer.feed(body[10:]) + observer.flush()) == replacement


def test_a_held_json_answer_too_big_to_hold_is_relayed_unchanged() -> None:
    observer = MessageObserver(lambda m: {"replaced": True}, limit=10, hold_json=lambda: True)
    body = orjson.dumps(mcp_tool_result("x" * 50, msg_id=1))
    assert feed_all(observer, body, size=8) == body


def test_sse_events_are_relayed_whole_and_a_replacement_keeps_the_events_id() -> None:
    def on_message(msg: dict[str, Any]) -> dict[str, Any] | None:
        return {**msg, "result": {"replaced": True}} if msg.get("id") == 2 else None

    observer = MessageObserver(on_message, limit=1 << 20)
    stream = (
        sse_message(mcp_tool_result(msg_id=1))
        + b": keep-alive\n\n"
        + sse_message(mcp_tool_result(msg_id=2), "e2")
    )
    out = feed_all(observer, stream, size=5)
    assert observer.mode == "sse" and observer.resumable and observer.messages_seen == 2
    first, comment, second = out.split(b"\n\n")[:3]
    assert first + b"\n\n" == sse_message(mcp_tool_result(msg_id=1))
    assert comment == b": keep-alive"
    assert second.startswith(b"event: message\nid: e2\ndata: ")
    assert orjson.loads(second.split(b"data: ", 1)[1])["result"] == {"replaced": True}


def test_queued_events_are_injected_between_the_servers() -> None:
    queued = [sse_message({"jsonrpc": "2.0", "id": 9, "result": {}})]

    def take() -> bytes:
        return queued.pop() if queued else b""

    observer = MessageObserver(lambda m: None, limit=1 << 20, take_injected=take)
    server_event = sse_message(mcp_tool_result(msg_id=1))
    out = observer.feed(server_event)
    assert out == sse_message({"jsonrpc": "2.0", "id": 9, "result": {}}) + server_event


def test_the_legacy_endpoint_event_is_rewritten() -> None:
    observer = MessageObserver(lambda m: None, limit=1 << 20, on_endpoint=lambda data: "/mcp/demo" + data)
    out = feed_all(observer, b"event: endpoint\ndata: /messages?session_id=1\n\n")
    assert out == b"event: endpoint\ndata: /mcp/demo/messages?session_id=1\n\n"
    assert observer.messages_seen == 0
