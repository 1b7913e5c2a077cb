"""One automatic run per episode (SPEC §3 "Session"; issue 14): what a client announces decides,
else the conversation's lineage; a guard ending one episode leaves the agent's next episode alone.

The end-to-end tests drive a running Tripwire with the real `openai` and `anthropic` SDKs against
the fake upstream, sending requests shaped as Codex and Claude Code send them
(tests/fixtures/*.json say where each shape comes from).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from proxy import episodes
from proxy.dialects.base import LLMRequest
from proxy.episodes import NO_CONVERSATION, Episode, announced, history_digests
from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import Reply
from tests.schema import assert_run_valid

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def fill(value: Any, **slots: str) -> Any:
    """The fixture with its placeholders (SESSION, THREAD, PROMPT, ...) replaced, in every string."""
    if isinstance(value, str):
        for slot, text in slots.items():
            value = value.replace(slot, text)
        return value
    if isinstance(value, list):
        return [fill(v, **slots) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, **slots) for k, v in value.items()}
    return value


def llm_request(dialect: str, messages: list[Any], previous: str | None = None) -> LLMRequest:
    return LLMRequest(dialect, "m", False, messages, None, None, [], [], 0, previous_response_id=previous)


# --- what a request announces (pure) -------------------------------------------------------------


def test_codex_headers_and_prompt_cache_key_announce_the_episode() -> None:
    codex = fixture("codex_exec_responses_request.json")
    for variant in ("headers", "headers_legacy"):
        headers = fill(codex[variant], SESSION="s-1", THREAD="t-1")
        body = fill(codex["body"], SESSION="s-1", THREAD="t-1")
        # the session id, not the thread id: Codex sub-agents run in their own thread of the session
        assert announced(headers, body)[1] == "s-1"
    # a client that sends only prompt_cache_key
    assert announced({}, {"prompt_cache_key": "pck-9"}) == ("body:prompt_cache_key", "pck-9")
    assert announced({"x-session-id": "gw-1"}, {}) == ("header:x-session-id", "gw-1")
    # Responses conversation state (the OpenAI Agents SDK's conversation_id)
    assert announced({}, {"conversation": "conv_1"})[1] == "conv_1"
    assert announced({}, {"conversation": {"id": "conv_2"}})[1] == "conv_2"


def test_claude_code_header_and_metadata_announce_the_episode() -> None:
    claude = fixture("claude_code_messages_request.json")
    headers = fill(claude["headers"], SESSION="c-1")
    body = fill(claude["body"], USER_ID=claude["user_id"])
    body = fill(body, SESSION="c-1")
    assert announced(headers, body) == ("header:x-claude-code-session-id", "c-1")
    # without the header (before 2.1.86): the session inside metadata.user_id, both formats
    assert announced({}, body) == ("body:metadata.user_id", "c-1")
    legacy = {
        "metadata": {
            "user_id": fill(claude["user_id_legacy"], SESSION="0c7d5e8a-1b2c-4d3e-8f90-a1b2c3d4e5f6")
        }
    }
    assert announced({}, legacy)[1] == "0c7d5e8a-1b2c-4d3e-8f90-a1b2c3d4e5f6"
    # a plain user id names a user, not an episode
    assert announced({}, {"metadata": {"user_id": "user-42"}}) is None
    assert announced({}, {"metadata": {"user_id": '{"device_id": "d"}'}}) is None
    assert announced({}, {"metadata": {"user_id": "{not json"}}) is None


@pytest.mark.parametrize("bad", ["", "   ", "x" * 257, "a\nb", 42, None, ["s"], {"id": 1}])
def test_a_malformed_id_announces_nothing(bad: Any) -> None:
    assert announced({"session_id": bad} if isinstance(bad, str) else {}, {"prompt_cache_key": bad}) is None


def test_the_first_source_in_the_table_wins() -> None:
    both = {"X-Claude-Code-Session-Id": "claude", "session_id": "codex"}
    assert announced(both, {"prompt_cache_key": "pck"})[1] == "claude"
    assert announced({"session_id": "codex"}, {"prompt_cache_key": "pck"})[1] == "codex"
    assert [source for source, _ in episodes.EXTRACTORS][-1] == "body:conversation"


def test_lineage_evidence_of_a_request() -> None:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    episode = episodes.for_llm({}, {}, llm_request("openai_chat", messages))
    assert episode.announced is None and len(episode.history) == 2
    # a longer history has the shorter one's digests as its prefix
    longer = history_digests([*messages, {"role": "assistant", "content": "a"}])
    assert longer[:2] == episode.history
    # an announced id: the id alone decides, no history needed
    said = episodes.for_llm({"session_id": "s"}, {}, llm_request("openai_chat", messages))
    assert said == Episode(announced="s", source="header:session_id")
    # no conversation: embeddings, completions, an empty history
    assert episodes.for_llm({}, {}, llm_request("embeddings", ["text"])) is NO_CONVERSATION
    assert episodes.for_llm({}, {}, llm_request("openai_chat", [])) is NO_CONVERSATION
    chained = episodes.for_llm({}, {}, llm_request("openai_responses", [], previous="resp_1"))
    assert chained.previous_response_id == "resp_1" and chained.has_lineage
    assert episodes.for_mcp({}) is NO_CONVERSATION
    assert episodes.for_mcp({"X-Claude-Code-Session-Id": "c"}).announced == "c"


def test_lineage_ignores_moving_cache_control_markers() -> None:
    """Anthropic clients move `cache_control` to the newest blocks on every request."""
    first = [
        {
            "role": "system",
            "content": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        },
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
    ]
    later = [
        {
            "role": "system",
            "content": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        },
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "more", "cache_control": {"type": "ephemeral"}}],
        },
    ]
    assert history_digests(later)[1] == history_digests(first)[-1]


def test_lineage_reads_one_plain_text_block_as_its_text() -> None:
    """Claude Code 2.1.332 sends a system message as one marked text block, then, the marker moved on,
    as its text (tests/fixtures/claude_code_2_1_332.json): the same message. A block that says more
    than its text (citations), or two blocks, is not a plain string."""
    block = {"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}
    as_block = [{"role": "system", "content": [block]}, {"role": "user", "content": "hi"}]
    as_text = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert history_digests(as_block) == history_digests(as_text)
    cited = [{"role": "system", "content": [{"type": "text", "text": "sys", "citations": []}]}]
    two = [{"role": "system", "content": [{"type": "text", "text": "s"}, {"type": "text", "text": "ys"}]}]
    for other in (cited, two):
        assert history_digests(other)[0] != history_digests(as_text)[0]


# --- end to end: helpers ---------------------------------------------------------------------


def llm_calls(tw: Running, run_id: str) -> list[dict[str, Any]]:
    return [e for e in tw.events(run_id) if e["event_type"] == "LLM_CALL"]


def runs_by_marker(tw: Running, markers: list[str]) -> dict[str, str]:
    """marker -> the one run whose events mention it; every run mentions exactly one marker."""
    found: dict[str, str] = {}
    for run_id in tw.run_ids():
        text = json.dumps(tw.events(run_id))
        mine = [m for m in markers if m in text]
        assert len(mine) == 1, f"run {run_id} mentions {mine}"
        assert mine[0] not in found, f"{mine[0]} is in two runs"
        found[mine[0]] = run_id
    assert sorted(found) == sorted(markers)
    return found


def tool_reply(n: int) -> Reply:
    return Reply(tool_calls=[(f"call_{n}", "shell", {"command": ["ls", f"dir{n}"]})])


async def codex_episode(
    tw: Running,
    prompt: str,
    turns: int,
    *,
    session: str | None = None,
    legacy: bool = False,
    base: str = "/v1",
) -> None:
    """One `codex exec`: `turns` Responses requests of one session, each resending the whole
    history (store: false), running the shell tool the model asks for in between."""
    codex = fixture("codex_exec_responses_request.json")
    session = session or str(uuid.uuid4())
    slots = {"SESSION": session, "THREAD": session, "PROMPT": prompt}
    headers = fill(codex["headers_legacy" if legacy else "headers"], **slots)
    body = fill(codex["body"], **slots)
    history = body.pop("input")
    model, extra = body.pop("model"), {k: v for k, v in body.items() if k != "stream"}
    client = openai.AsyncOpenAI(base_url=tw.url + base, api_key=AGENT_KEY, max_retries=0)
    for _ in range(turns):
        stream = await client.responses.create(
            model=model, input=history, stream=True, extra_headers=headers, extra_body=extra
        )
        done = None
        async for event in stream:
            if event.type == "response.completed":
                done = event.response
        assert done is not None
        for item in done.output:
            history.append(item.model_dump(exclude_none=True))
            if item.type == "function_call":
                history.append({"type": "function_call_output", "call_id": item.call_id, "output": "ok"})
        if not any(item.type == "function_call" for item in done.output):
            history.append(
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go on"}]}
            )


# --- end to end: Codex ---------------------------------------------------------------------------


@pytest.mark.parametrize("legacy", [False, True], ids=["session-id", "session_id+conversation_id"])
async def test_three_codex_exec_episodes_are_three_runs(
    start_tripwire: StartTripwire, fake_upstream: Any, legacy: bool
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    sessions = [str(uuid.uuid4()) for _ in range(3)]
    for i, session in enumerate(sessions):
        fake.replies = [tool_reply(i), Reply(text=f"done {i}")]
        await codex_episode(tw, f"codex task {i}", 2, session=session, legacy=legacy)
    await tw.flush()
    runs = runs_by_marker(tw, [f"codex task {i}" for i in range(3)])
    for i, session in enumerate(sessions):
        run_id = runs[f"codex task {i}"]
        assert len(llm_calls(tw, run_id)) == 2
        episode = tw.tripwire_json(run_id)["episode"]
        assert episode["id"] == session
        assert episode["source"] == ("header:session_id" if legacy else "header:session-id")
        assert_run_valid(tw.data_dir, run_id)


async def test_a_long_codex_episode_is_one_run(start_tripwire: StartTripwire, fake_upstream: Any) -> None:
    fake, url = fake_upstream
    fake.replies = [*(tool_reply(i) for i in range(5)), Reply(text="all done")]
    tw = await start_tripwire(upstream={"url": url})
    await codex_episode(tw, "one long task", 6)
    await tw.flush()
    (run_id,) = tw.run_ids()
    events = tw.events(run_id)
    assert [e["event_type"] for e in events].count("LLM_CALL") == 6
    assert [e["event_type"] for e in events].count("TOOL_CALL") == 5
    assert_run_valid(tw.data_dir, run_id)


# --- end to end: Claude Code ---------------------------------------------------------------------


async def claude_code_episode(tw: Running, prompt: str, *, legacy: bool = False) -> str:
    """One `claude -p`: the main conversation, a sub-agent (its own system prompt and history),
    then the main conversation going on with the cache_control marker moved to the newest block."""
    claude = fixture("claude_code_messages_request.json")
    session = str(uuid.uuid4())
    headers = fill(claude["headers"], SESSION=session)
    if legacy:  # before 2.1.86: no header, the session is in metadata.user_id
        headers.pop("X-Claude-Code-Session-Id")
    user_id = fill(claude["user_id_legacy" if legacy else "user_id"], SESSION=session)
    body = fill(claude["body"], PROMPT=prompt, USER_ID=user_id)
    body.pop("stream")
    client = anthropic.AsyncAnthropic(base_url=tw.url, api_key=AGENT_KEY, max_retries=0)

    async def ask(**kw: Any) -> Any:
        async with client.messages.stream(**kw, extra_headers=headers) as stream:
            return await stream.get_final_message()

    first = await ask(**body)
    await ask(
        **{
            **body,
            "system": [{"type": "text", "text": "You are a file search specialist for Claude Code."}],
            "messages": [{"role": "user", "content": f"Find the files for: {prompt}"}],
        }
    )
    messages = body["messages"]
    messages[0]["content"][-1].pop("cache_control")
    messages += [
        {"role": "assistant", "content": [{"type": "text", "text": first.content[0].text}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "go on", "cache_control": {"type": "ephemeral"}}],
        },
    ]
    await ask(**body)
    return session


@pytest.mark.parametrize("legacy", [False, True], ids=["header", "metadata-only"])
async def test_three_claude_code_episodes_are_three_runs(
    start_tripwire: StartTripwire, fake_upstream: Any, legacy: bool
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="working on it")
    tw = await start_tripwire(upstream={"url": url})
    sessions = [await claude_code_episode(tw, f"claude task {i}", legacy=legacy) for i in range(3)]
    await tw.flush()
    runs = runs_by_marker(tw, [f"claude task {i}" for i in range(3)])
    for i, session in enumerate(sessions):
        run_id = runs[f"claude task {i}"]
        assert len(llm_calls(tw, run_id)) == 3  # main, sub-agent, main again: one run
        assert tw.tripwire_json(run_id)["episode"]["id"] == session
        assert_run_valid(tw.data_dir, run_id)


# --- end to end: plain SDK conversations (lineage) -----------------------------------------------


class Conversation:
    """A chat with the openai SDK that resends its whole history, as chat agents do."""

    def __init__(self, tw: Running, first: str) -> None:
        self.client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, max_retries=0)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": first},
        ]

    async def turn(self, then: str) -> None:
        answer = await self.client.chat.completions.create(model="gpt-4o-mini", messages=self.messages)
        self.messages += [
            {"role": "assistant", "content": answer.choices[0].message.content},
            {"role": "user", "content": then},
        ]


async def test_unrelated_chat_conversations_are_separate_runs(
    start_tripwire: StartTripwire, fake_upstream: Any
) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    for topic in ("weather", "taxes", "poetry"):
        await Conversation(tw, f"tell me about {topic}").turn("thanks")
    await tw.flush()
    runs = runs_by_marker(tw, [f"tell me about {t}" for t in ("weather", "taxes", "poetry")])
    assert all(len(llm_calls(tw, r)) == 1 for r in runs.values())


async def test_one_conversation_continued_is_one_run(
    start_tripwire: StartTripwire, fake_upstream: Any
) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    chat = Conversation(tw, "plan my week")
    for i in range(4):
        await chat.turn(f"and then {i}")
    await tw.flush()
    (run_id,) = tw.run_ids()
    calls = llm_calls(tw, run_id)
    assert len(calls) == 4
    # the recorded prompt of each later call is only what is new (the run saw the rest)
    assert [c["payload"]["prompt_messages_total"] for c in calls] == [2, 4, 6, 8]
    assert [len(c["payload"]["prompt"]) for c in calls] == [2, 2, 2, 2]


async def test_two_interleaved_conversations_are_two_runs_each_with_its_own_events(
    start_tripwire: StartTripwire, fake_upstream: Any
) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    a, b = Conversation(tw, "conversation A"), Conversation(tw, "conversation B")
    for i in range(3):
        await a.turn(f"A step {i}")
        await b.turn(f"B step {i}")
    await tw.flush()
    runs = runs_by_marker(tw, ["conversation A", "conversation B"])
    for name, run_id in runs.items():
        calls = llm_calls(tw, run_id)
        assert len(calls) == 3
        prompts = json.dumps([c["payload"]["prompt"] for c in calls])
        other = "B" if name.endswith("A") else "A"
        assert f"{other} step" not in prompts and f"conversation {other}" not in prompts
        # each call records only what is new since its own conversation's previous call
        assert [len(c["payload"]["prompt"]) for c in calls] == [2, 2, 2]
        assert_run_valid(tw.data_dir, run_id)


@pytest.mark.parametrize("same_answers", [True, False], ids=["same-answers", "own-answers"])
async def test_an_evaluation_batch_is_one_run_per_conversation(
    start_tripwire: StartTripwire, fake_upstream: Any, same_answers: bool
) -> None:
    """SPEC §3: six conversations that start with the same system and user message (one task run
    six times, no session named) are six runs, each with its own two calls, interleaved; whether
    the model answers each the same (temperature 0) or not."""
    fake, url = fake_upstream
    if same_answers:
        fake.default = Reply(text="the same first answer")
    else:
        fake.replies = [Reply(text=f"answer number {i}") for i in range(6)]
    tw = await start_tripwire(upstream={"url": url})
    batch = [Conversation(tw, "solve task 17") for _ in range(6)]
    for i, chat in enumerate(batch):
        await chat.turn(f"and check it (conversation {i})")
    if not same_answers:
        fake.default = Reply(text="done")
    for chat in batch:
        await chat.turn("thanks")
    await tw.flush()
    runs = runs_by_marker(tw, [f"conversation {i})" for i in range(6)])
    assert len(tw.run_ids()) == 6
    for i, run_id in runs.items():
        calls = llm_calls(tw, run_id)
        assert len(calls) == 2, i
        # each run's second call continues its own conversation: only what is new is recorded
        assert [c["payload"]["prompt_messages_total"] for c in calls] == [2, 4]
        assert_run_valid(tw.data_dir, run_id)


async def test_responses_chains_by_previous_response_id_are_one_run_each(
    start_tripwire: StartTripwire, fake_upstream: Any
) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, max_retries=0)
    for topic in ("chain one", "chain two"):
        previous = None
        for i in range(3):
            text = topic if i == 0 else f"{topic} follow-up {i}"
            answer = await client.responses.create(model="gpt-4o", input=text, previous_response_id=previous)
            previous = answer.id
    await tw.flush()
    runs = runs_by_marker(tw, ["chain one", "chain two"])
    assert all(len(llm_calls(tw, r)) == 3 for r in runs.values())


# --- end to end: a guard ends one episode, not the agent ---------------------------------------


async def test_a_terminated_codex_episode_stays_refused_and_a_new_episode_is_served(
    start_tripwire: StartTripwire, fake_upstream: Any
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="ok")
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_llm_calls": 2}})
    session = str(uuid.uuid4())
    await codex_episode(tw, "limited task", 2, session=session)
    with pytest.raises(openai.RateLimitError) as third:
        await codex_episode(tw, "limited task", 1, session=session)
    assert third.value.response.headers["X-Tripwire-Guard"] == "max_llm_calls"
    # the same episode again (a retry, or its next turn): still refused
    with pytest.raises(openai.RateLimitError) as again:
        await codex_episode(tw, "limited task, retried", 1, session=session)
    assert again.value.response.headers["X-Tripwire-Guard"] == "session_terminated"
    # the agent's next `codex exec` is another episode: served, in a new run
    await codex_episode(tw, "the next task", 1)
    await tw.flush()
    runs = runs_by_marker(tw, ["limited task", "the next task"])
    ended = tw.run_json(runs["limited task"])
    assert ended["status"] == "error"
    assert tw.run_json(runs["the next task"])["status"] == "running"
    assert len(llm_calls(tw, runs["the next task"])) == 1


async def test_a_terminated_conversation_stays_refused_and_a_new_conversation_is_served(
    start_tripwire: StartTripwire, fake_upstream: Any
) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_llm_calls": 2}})
    chat = Conversation(tw, "conversation with a limit")
    await chat.turn("one")
    await chat.turn("two")
    with pytest.raises(openai.RateLimitError) as third:
        await chat.turn("three")
    assert third.value.response.headers["X-Tripwire-Guard"] == "max_llm_calls"
    with pytest.raises(openai.RateLimitError) as retry:
        await chat.turn("three")  # the same conversation: refused
    assert retry.value.response.headers["X-Tripwire-Guard"] == "session_terminated"
    fresh = Conversation(tw, "a fresh conversation")
    await fresh.turn("fine")
    await tw.flush()
    runs = runs_by_marker(tw, ["conversation with a limit", "a fresh conversation"])
    assert tw.run_json(runs["conversation with a limit"])["status"] == "error"
    assert len(llm_calls(tw, runs["a fresh conversation"])) == 1


# --- end to end: an explicit session wins ------------------------------------------------------


async def test_an_explicit_session_wins_over_announced_episodes(
    start_tripwire: StartTripwire, fake_upstream: Any
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="ok")
    tw = await start_tripwire(upstream={"url": url})
    client = openai.AsyncOpenAI(
        base_url=tw.url + "/v1",
        api_key=AGENT_KEY,
        max_retries=0,
        default_headers={"X-Tripwire-Session": "nightly"},
    )
    for i in range(3):  # three Codex session ids, one explicit session
        await client.responses.create(
            model="gpt-5.1-codex",
            input=f"explicit task {i}",
            extra_headers={"session-id": str(uuid.uuid4())},
            prompt_cache_key=str(uuid.uuid4()),
        )
    # the path form too
    for i in range(2):
        await codex_episode(tw, f"path task {i}", 1, base="/agents/default/sessions/by-path/v1")
    await tw.flush()
    runs = tw.run_ids()
    assert len(runs) == 2
    by_session = {tw.tripwire_json(r)["session_id"]: r for r in runs}
    assert sorted(by_session) == ["by-path", "nightly"]
    assert len(llm_calls(tw, by_session["nightly"])) == 3
    assert len(llm_calls(tw, by_session["by-path"])) == 2
    assert "episode" not in tw.tripwire_json(by_session["nightly"])


async def test_an_anthropic_sdk_conversation_with_moving_cache_markers_is_one_run(
    start_tripwire: StartTripwire, fake_upstream: Any
) -> None:
    """No announced id (a plain SDK agent): lineage, blind to the cache_control marker that moves to
    the newest block on every request; another conversation is another run."""
    fake, url = fake_upstream
    fake.default = Reply(text="noted")
    tw = await start_tripwire(upstream={"url": url})
    client = anthropic.AsyncAnthropic(base_url=tw.url, api_key=AGENT_KEY, max_retries=0)
    marker = {"type": "ephemeral"}
    for topic in ("anthropic one", "anthropic two"):
        messages: list[dict[str, Any]] = []
        for i in range(3):
            for m in messages:
                for block in m["content"]:
                    block.pop("cache_control", None)
            text = topic if i == 0 else f"{topic} more {i}"
            messages.append(
                {"role": "user", "content": [{"type": "text", "text": text, "cache_control": marker}]}
            )
            answer = await client.messages.create(
                model="claude-sonnet-4-5",
                max_tokens=100,
                system=[{"type": "text", "text": "Be brief.", "cache_control": marker}],
                messages=messages,
            )
            messages.append(
                {"role": "assistant", "content": [{"type": "text", "text": answer.content[0].text}]}
            )
    await tw.flush()
    runs = runs_by_marker(tw, ["anthropic one", "anthropic two"])
    assert all(len(llm_calls(tw, r)) == 3 for r in runs.values())


def test_both_digest_chains_come_from_one_pass() -> None:
    """digest_chains hashes each message once for both chains, forking the lineage chain at the
    first `cache_control` marker: each chain is what hashing its own messages separately gives."""
    import hashlib

    import orjson

    from proxy.episodes import digest_chains

    def chain(messages: list) -> list[bytes]:
        h = hashlib.blake2b(digest_size=16)
        out = [h.digest()]
        for m in messages:
            raw = orjson.dumps(m)
            h.update(len(raw).to_bytes(8, "little"))
            h.update(raw)
            out.append(h.digest())
        return out

    plain = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    marked = {
        "role": "user",
        "content": [{"type": "text", "text": "c", "cache_control": {"type": "ephemeral"}}],
    }
    unmarked = {"role": "user", "content": "c"}  # unmarked, one plain text block reads as its text
    messages = [*plain, marked, {"role": "assistant", "content": "d"}]
    chains = digest_chains(messages)
    assert chains.sent == chain(messages)
    assert chains.lineage == chain([*plain, unmarked, {"role": "assistant", "content": "d"}])
    assert chains.lineage[:3] == chains.sent[:3] and chains.lineage[3] != chains.sent[3]
    assert digest_chains(plain).lineage == digest_chains(plain).sent == chain(plain)


def test_message_tokens_counts_a_plain_message_as_the_prompt_estimate_does() -> None:
    from proxy.dialects.base import TOKENS_PER_MESSAGE, estimate_value_tokens
    from proxy.episodes import message_tokens

    for message in (
        {"role": "user", "content": "hello there"},
        {"role": "system", "content": "x" * 2047},
        {"role": "user", "content": "A" * 4096},  # an attachment-like string: the capped count
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"name": "f"}}]},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {},
        "a bare string",
        ["a", "list"],
    ):
        assert message_tokens(message) == estimate_value_tokens(message) + TOKENS_PER_MESSAGE
