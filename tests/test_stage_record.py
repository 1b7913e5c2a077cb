"""`RecordStage` alone: once the upstream answered (played into the exchange as the forward stage
leaves it), `finish` writes the call's event through its protocol adapter; a refused call, or one
with no session, writes none."""

from __future__ import annotations

from typing import Any

from proxy.engine import Engine
from proxy.exchange import Answer, Exchange
from proxy.stages.llm_parse import LLMParseStage
from proxy.stages.mcp_parse import MCPParseStage
from proxy.stages.record import RecordStage
from proxy.stages.session import SessionStage
from tests.factories import (
    CHAT,
    MESSAGES,
    EngineFactory,
    anthropic_message,
    anthropic_request,
    chat_completion,
    chat_completion_sse,
    chat_request,
    kinds,
    make_exchange,
    mcp_tool_result,
    mcp_tools_call,
    play_upstream,
    read_events,
)

SESSION = "/agents/bot/sessions/s1"


async def attached(engine: Engine, path: str, body: Any) -> Exchange:
    """Parsed and attached to its session, as the stages before the forward stage leave it."""
    ex = make_exchange("POST", path, body=body, engine=engine)
    parse = MCPParseStage(engine.services) if "/mcp/" in path else LLMParseStage(engine.services)
    await parse.request(ex)
    await SessionStage(engine.services).request(ex)
    assert ex.session is not None
    return ex


async def test_a_chat_call_is_one_llm_call_event(engine_factory: EngineFactory) -> None:
    engine = await engine_factory(pricing_table={"gpt-4o-mini": (1.0, 2.0)})
    ex = await attached(engine, SESSION + CHAT, chat_request())
    play_upstream(ex, chat_completion("Sunny", prompt_tokens=1000, completion_tokens=500))
    await RecordStage(engine.services).finish(ex)
    assert ex.session is not None
    events = await read_events(engine, ex.session.run_id)
    assert kinds(events) == ["RUN_START", "LLM_CALL"]
    payload = events[1]["payload"]
    assert payload["response"]["text"] == "Sunny" and payload["status"] == "ok"
    assert payload["usage"] == {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}
    assert payload["cost_usd"] == ex.cost_usd > 0
    assert payload["endpoint"] == "openai_chat" and payload["provider"] == "openai"
    assert payload["prompt"] == chat_request()["messages"]
    assert events[1]["meta"]["session_id"] == "s1"
    assert ex.llm_event_id == events[1]["event_id"]


async def test_a_streamed_answer_is_read_through_its_accumulator(engine: Engine) -> None:
    ex = await attached(engine, SESSION + CHAT, chat_request(stream=True))
    relayed = play_upstream(ex, chat_completion_sse("Hello there"), chunks=7)
    assert relayed == chat_completion_sse("Hello there")  # the client gets the stream unchanged
    await RecordStage(engine.services).finish(ex)
    assert ex.session is not None
    (call,) = [e for e in await read_events(engine, ex.session.run_id) if e["event_type"] == "LLM_CALL"]
    assert call["payload"]["response"]["text"] == "Hello there" and call["payload"]["stream"] is True
    assert call["payload"]["usage"]["total_tokens"] == 120


async def test_a_stream_without_its_terminator_is_an_error(engine: Engine) -> None:
    ex = await attached(engine, SESSION + CHAT, chat_request(stream=True))
    play_upstream(ex, chat_completion_sse("Hello", done=False))
    await RecordStage(engine.services).finish(ex)
    assert ex.session is not None
    events = await read_events(engine, ex.session.run_id)
    assert kinds(events) == ["RUN_START", "LLM_CALL", "ERROR"]
    assert events[1]["payload"]["status"] == "error"
    assert events[2]["name"] == "upstream_error" and events[2]["parent_id"] == events[1]["event_id"]


async def test_an_anthropic_message_names_its_provider(engine: Engine) -> None:
    ex = await attached(engine, SESSION + MESSAGES, anthropic_request())
    play_upstream(ex, anthropic_message("Bonjour"))
    await RecordStage(engine.services).finish(ex)
    assert ex.session is not None
    call = (await read_events(engine, ex.session.run_id))[-1]
    assert call["event_type"] == "LLM_CALL" and call["payload"]["provider"] == "anthropic"
    assert call["payload"]["response"]["text"] == "Bonjour"


async def test_an_upstream_5xx_is_an_llm_call_in_error_and_an_error_event(engine: Engine) -> None:
    ex = await attached(engine, SESSION + CHAT, chat_request())
    play_upstream(ex, {"error": {"message": "boom", "type": "server_error"}}, status=500)
    await RecordStage(engine.services).finish(ex)
    assert ex.session is not None
    events = await read_events(engine, ex.session.run_id)
    assert kinds(events) == ["RUN_START", "LLM_CALL", "ERROR"]
    assert events[1]["payload"]["http_status"] == 500 and events[1]["payload"]["status"] == "error"


async def test_a_refused_call_writes_no_call_event(engine: Engine) -> None:
    ex = await attached(engine, SESSION + CHAT, chat_request())
    ex.answer = Answer(429, b"{}")  # a guard answered; the upstream never saw it
    await RecordStage(engine.services).finish(ex)
    assert ex.session is not None
    assert kinds(await read_events(engine, ex.session.run_id)) == ["RUN_START"]


async def test_a_call_without_a_session_writes_nothing(engine: Engine) -> None:
    ex = make_exchange("POST", SESSION + CHAT, body=chat_request(), engine=engine)
    await LLMParseStage(engine.services).request(ex)
    play_upstream(ex, chat_completion())
    await RecordStage(engine.services).finish(ex)
    assert engine.sessions.live() == []
    assert not (engine.data_dir / "runs").exists() or not any((engine.data_dir / "runs").iterdir())


async def test_an_mcp_tools_call_is_one_tool_call_event(engine_factory: EngineFactory) -> None:
    engine = await engine_factory(mcp={"demo": {"url": "http://127.0.0.1:9/mcp"}})
    ex = await attached(engine, SESSION + "/mcp/demo", mcp_tools_call("echo", {"text": "hi"}, msg_id=7))
    play_upstream(ex, mcp_tool_result("hi", msg_id=7))
    await ex.protocol.await_result(ex)
    await RecordStage(engine.services).finish(ex)
    assert ex.session is not None
    events = await read_events(engine, ex.session.run_id)
    assert kinds(events) == ["RUN_START", "TOOL_CALL"]
    tool = events[1]
    assert tool["name"] == "echo" and tool["payload"]["args"] == {"text": "hi"}
    assert tool["payload"]["source"] == "mcp" and tool["payload"]["server"] == "demo"
    assert tool["payload"]["status"] == "ok"
    assert tool["meta"]["jsonrpc_id"] == 7 and tool["meta"]["transport"] == "streamable"
    assert ex.tool_event_id == tool["event_id"] and ex.mcp_recorded is True


def _deep(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = {"next": [value]}
    return value


async def test_the_llm_call_payload_built_sanitised_is_sanitize_of_the_raw_one(engine: Engine) -> None:
    """The LLM_CALL is built already sanitised (one pass): exactly what sanitize makes of the raw
    payload and meta, secrets, long text and a prompt nested past DEPTH_LIMIT included."""
    from proxy import jsonparse
    from proxy.constants import DEPTH_LIMIT, TRUNCATED_MARKER
    from proxy.llm_trace import llm_call_payload
    from proxy.redact import is_secret_key, sanitize

    secret = "sk-proj-" + "Z9y8X7w6V5" * 3
    messages = [
        {"role": "system", "content": f"key {secret}", "api_key": secret, "token_count": 3},
        {"role": "user", "content": "x" * 5000, "deep": _deep(DEPTH_LIMIT + 20)},
    ]
    ex = await attached(
        engine, SESSION + CHAT, chat_request(messages, temperature={"password": "p", "t": [0.5]})
    )
    from proxy.stages.guards import GuardStage

    await GuardStage(engine.services).request(ex)
    assert ex.guard_trace is not None  # its fields are in the payload too
    answer = chat_completion("Bearer abcdefghijklmnop " + "y" * 3000)
    answer["choices"][0]["message"]["tool_calls"] = [
        {"id": "call_1", "type": "function", "function": {"name": "login", "arguments": '{"password": "pw"}'}}
    ]
    play_upstream(ex, answer)
    prompt = list(ex.call.messages)
    for max_field_bytes in (1024, 0, 1 << 20):
        clean, clean_meta = llm_call_payload(ex, prompt, max_field_bytes)
        raw, raw_meta = llm_call_payload(ex, jsonparse.cap_depth(prompt, DEPTH_LIMIT, TRUNCATED_MARKER), None)
        assert clean == sanitize(raw, max_field_bytes)
        assert clean_meta == sanitize(raw_meta, max_field_bytes)
        assert list(clean) == list(raw)  # the fields' order
    # the payload's own names are none secret-named: sanitize would leave every one as it is
    assert "guard_input" in clean and clean["call_seq"] == 1
    from proxy.guard_trace import SETTLE_KEYS, settle_fields_llm, settle_fields_tool

    assert {*settle_fields_llm(0.0, 0), *settle_fields_tool("f", None), "released"} == set(SETTLE_KEYS)

    names = [*raw, *raw["response"], *raw["usage"], *raw["response"]["tool_calls"][0], *raw_meta]
    names += [*SETTLE_KEYS, "rank", "t_end"]  # what a settle adds to guard_input
    assert not [name for name in names if is_secret_key(name)]


async def test_a_sanitised_payload_is_refused_when_content_is_stripped(engine_factory: EngineFactory) -> None:
    import pytest

    engine = await engine_factory(record_content=False)
    ex = await attached(engine, SESSION + CHAT, chat_request())
    assert ex.session is not None
    with pytest.raises(ValueError, match="sanitised"):
        engine.recorder.record(ex.session.run_id, "LLM_CALL", "m", {"model": "m"}, sanitized=True)


def test_clean_names_is_sanitize_of_each_name() -> None:
    """The names an LLM_CALL repeats are remembered cleaned; each is what sanitize makes of it,
    seen once or again, whatever its type, length or cap (1, 1.0 and True are not mixed up)."""
    from proxy import llm_trace as llm
    from proxy.redact import sanitize

    secret = "sk-proj-" + "Z9y8X7w6V5" * 3
    sets: list[tuple[Any, ...]] = [
        ("gpt-4o-mini", "gpt-4o-mini", "default", "openai_chat", "stop", "bot", "s1"),
        (f"model {secret}", None, "default", "openai_chat", None, "bot", "x" * 5000),
        ("m", "m", "default", "openai_chat", 1, "bot", "s1"),
        ("m", "m", "default", "openai_chat", True, "bot", "s1"),
        ("m", "m", "default", "openai_chat", 1.0, "bot", "s1"),
        ("m", {"password": "p"}, "default", "openai_chat", ["stop"], "bot", "s1"),
        ("ü" * 300, "a\ud83d", "default", "openai_chat", "end_turn", "bot", "s1"),
    ]
    for max_field_bytes in (1, 64, 1024, 20000):
        for _ in range(2):  # the second time from the memo, where kept
            for names in sets:
                got = llm.clean_names(names, max_field_bytes)
                want = tuple(sanitize(v, max_field_bytes, 1) for v in names)
                assert got == want
                assert [type(v) for v in got] == [type(v) for v in want]
    llm._NAMES.clear()


def test_clean_names_is_bounded() -> None:
    from proxy import llm_trace as llm

    llm._NAMES.clear()
    for i in range(llm._NAMES_KEPT + 10):
        llm.clean_names(("m", "m", "default", "openai_chat", "stop", "bot", f"s{i}"), 1024)
    assert 0 < len(llm._NAMES) <= llm._NAMES_KEPT
    llm.clean_names(("m", "m", "default", "openai_chat", "stop", "bot", "y" * (llm._NAME_CHARS + 1)), 1024)
    assert not [key for key in llm._NAMES if "y" * (llm._NAME_CHARS + 1) in key]
    llm._NAMES.clear()
    llm._SHARED.clear()
    for i in range(llm._NAMES_KEPT + 10):
        llm.clean_names((f"m{i}", "m", "default", "openai_chat", "stop", "bot", "s"), 1024)
    assert 0 < len(llm._SHARED) <= llm._NAMES_KEPT
    llm._NAMES.clear()
    llm._SHARED.clear()


def test_a_new_sessions_names_are_its_own_id_cleaned_and_the_names_it_shares() -> None:
    """Issue 33: a session's names but its id are remembered apart, for the next new session; its
    id is still what sanitize makes of it (a secret in it, a long one, a lone surrogate)."""
    from proxy import llm_trace as llm
    from proxy.redact import sanitize

    secret = "sk-proj-" + "Z9y8X7w6V5" * 3
    shared = ("gpt-4o-mini", "gpt-4o-mini", "default", "openai_chat", "stop", "bot")
    for max_field_bytes in (16, 20000):
        for session_id in ("auto-0123456789ab", f"s {secret}", "x" * 5000, "a\ud83d", "auto-0123456789ab"):
            got = llm.clean_names((*shared, session_id), max_field_bytes)
            assert got == tuple(sanitize(v, max_field_bytes, 1) for v in (*shared, session_id))
        assert (max_field_bytes, *shared) in llm._SHARED
    llm._NAMES.clear()
    llm._SHARED.clear()


async def test_the_llm_call_event_is_named_after_its_model_sanitised(engine: Engine) -> None:
    secret = "sk-proj-" + "Z9y8X7w6V5" * 3
    ex = await attached(engine, SESSION + CHAT, chat_request())
    answer = chat_completion("Sunny")
    answer["model"] = f"gpt {secret}"
    play_upstream(ex, answer)
    await RecordStage(engine.services).finish(ex)
    assert ex.session is not None
    call = (await read_events(engine, ex.session.run_id))[-1]
    assert call["name"] == call["payload"]["model"] == "gpt __REDACTED__"
