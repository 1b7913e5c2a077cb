"""Pure parts of the MCP adapter: JSON-RPC classification, tool results, Tripwire's own answers, and
the relaying observer (whole events out as they complete, rewrites keep event ids)."""

from __future__ import annotations

import orjson

from proxy.mcp import jsonrpc
from proxy.mcp.observe import MessageObserver


def test_kinds_and_ids() -> None:
    assert jsonrpc.kind({"jsonrpc": "2.0", "id": 1, "method": "tools/call"}) == "request"
    assert jsonrpc.kind({"jsonrpc": "2.0", "method": "notifications/progress"}) == "notification"
    assert jsonrpc.kind({"jsonrpc": "2.0", "id": 1, "result": {}}) == "response"
    assert jsonrpc.kind({"jsonrpc": "2.0", "id": 1, "error": {"code": 1}}) == "response"
    # a server-to-client request that happens to carry a result-looking field is still a request
    assert jsonrpc.kind({"jsonrpc": "2.0", "id": 1, "method": "x", "result": {}}) == "request"
    assert jsonrpc.kind([1]) == "invalid"
    assert jsonrpc.id_key(1) != jsonrpc.id_key("1")
    assert jsonrpc.parse_body(b"nope") is None
    assert jsonrpc.parse_body(b"[1,2]") == ([1, 2], True)


def test_tool_results() -> None:
    ok = jsonrpc.tool_result(
        {"id": 1, "result": {"content": [{"type": "text", "text": "a"}], "structuredContent": {"x": 1.5}}}
    )
    assert ok.status == "ok" and ok.result == {
        "content": [{"type": "text", "text": "a"}],
        "structuredContent": {"x": 1.5},
    }
    same = jsonrpc.tool_result(
        {
            "id": 2,
            "result": {"structuredContent": {"x": 1.5000000001}, "content": [{"text": "a", "type": "text"}]},
        }
    )
    assert same.fingerprint == ok.fingerprint  # ids and float noise do not change the fingerprint
    failed = jsonrpc.tool_result(
        {"id": 1, "result": {"content": [{"type": "text", "text": "bad"}], "isError": True}}
    )
    assert (failed.status, failed.error_text, failed.upstream_failure) == ("error", "bad", False)
    internal = jsonrpc.tool_result({"id": 1, "error": {"code": -32603, "message": "boom"}})
    assert internal.status == "error" and internal.upstream_failure and internal.error_text == "-32603: boom"
    invalid = jsonrpc.tool_result({"id": 1, "error": {"code": -32602, "message": "bad args"}})
    assert not invalid.upstream_failure
    waiting = jsonrpc.tool_result({"id": 1, "result": {"resultType": "input_required", "requestState": "s"}})
    assert waiting.input_required


def test_blocked_result_and_errors() -> None:
    blocked = jsonrpc.blocked_result("[tripwire] blocked: x", "loop_detection", 5, 6, expose=False)
    assert blocked["isError"] is True and blocked["resultType"] == "complete"
    assert blocked["_meta"] == {"tripwire": {"loop_blocked": True, "guard": "loop_detection"}}
    err = orjson.loads(jsonrpc.render_error("a", jsonrpc.TRIPWIRE_GUARD_ERROR, "no", {"guardrail": "g"}))
    assert err == {
        "jsonrpc": "2.0",
        "id": "a",
        "error": {"code": -32050, "message": "no", "data": {"guardrail": "g"}},
    }


def test_observer_relays_whole_events_and_rewrites_the_matching_one() -> None:
    seen: list[dict] = []

    def on_message(msg: dict) -> dict | None:
        seen.append(msg)
        if jsonrpc.kind(msg) == "response":
            return jsonrpc.append_text_block(msg, "[tripwire] warning")
        return None

    obs = MessageObserver(on_message, limit=1 << 20)
    note = b'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/progress"}\n\n'
    result = b'id: 9\nevent: message\ndata: {"jsonrpc":"2.0","id":1,"result":{"content":[]}}\n\n'
    stream = b": ping\n\n" + note + result
    out = [obs.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)]
    out.append(obs.flush())
    joined = b"".join(out)
    assert joined.startswith(b": ping\n\n" + note)  # unchanged bytes, as soon as each event completes
    assert b"id: 9\nevent: message\n" not in joined  # re-rendered with event first, then id
    rewritten = joined[len(b": ping\n\n" + note) :]
    assert rewritten.startswith(b"event: message\nid: 9\ndata: ")
    assert orjson.loads(rewritten.split(b"data: ", 1)[1])["result"]["content"] == [
        {"type": "text", "text": "[tripwire] warning"}
    ]
    assert [jsonrpc.kind(m) for m in seen] == ["notification", "response"]


def test_observer_json_passthrough_and_hold() -> None:
    body = b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"a"}]}}'
    plain = MessageObserver(lambda m: None, limit=1 << 20)
    assert plain.feed(body[:10]) + plain.feed(body[10:]) + plain.flush() == body
    held = MessageObserver(lambda m: jsonrpc.append_text_block(m, "w"), limit=1 << 20, hold_json=lambda: True)
    assert held.rewrites
    assert held.feed(body) == b""
    assert orjson.loads(held.flush())["result"]["content"][-1] == {"type": "text", "text": "w"}


def test_endpoint_event_is_rewritten() -> None:
    obs = MessageObserver(lambda m: None, limit=1 << 20, on_endpoint=lambda d: "/mcp/x" + d)
    out = obs.feed(b"event: endpoint\ndata: /messages/?session_id=abc\n\n")
    assert out == b"event: endpoint\ndata: /mcp/x/messages/?session_id=abc\n\n"
