"""Max-tokens recovery (settings.max_tokens_recovery): a Chat Completions answer cut off at its
token limit is continued upstream and the `openai` SDK gets one stitched answer."""

from __future__ import annotations

from typing import Any

import openai

from proxy.stages.recovery import CONTINUE_PROMPT, stitch, sum_usage, truncated_text
from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.schema import assert_run_valid

CHAT = "/v1/chat/completions"
ASK = [{"role": "user", "content": "write a long story"}]


def llm(tw: Running) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, max_retries=0)


def cut(text: str, tokens: int = 10) -> Reply:
    return Reply(text=text, finish_reason="length", prompt_tokens=50, completion_tokens=tokens)


def test_pure_helpers() -> None:
    answer: dict[str, Any] = {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Once"}, "finish_reason": "length"}
        ]
    }
    assert truncated_text(answer) == "Once"
    assert truncated_text({**answer, "choices": [{**answer["choices"][0], "finish_reason": "stop"}]}) is None
    assert truncated_text({"choices": []}) is None
    assert sum_usage(
        {"prompt_tokens": 1, "completion_tokens": 2, "details": {"cached_tokens": 1}},
        {"prompt_tokens": 3, "completion_tokens": 4, "details": {"cached_tokens": 2}, "extra": 1},
    ) == {"prompt_tokens": 4, "completion_tokens": 6, "details": {"cached_tokens": 3}, "extra": 1}
    two = {
        **answer,
        "choices": [{**answer["choices"][0], "message": {"content": " upon"}, "finish_reason": "stop"}],
    }
    stitched = stitch([answer, two])
    assert stitched["choices"][0]["message"] == {"role": "assistant", "content": "Once upon"}
    assert stitched["choices"][0]["finish_reason"] == "stop"
    assert answer["choices"][0]["message"]["content"] == "Once"  # inputs untouched


async def test_a_cut_off_answer_is_continued_and_stitched(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.replies = [
        cut("Once upon "),
        cut("a time, "),
        Reply(text="the end.", prompt_tokens=70, completion_tokens=3),
    ]
    tw = await start_tripwire(upstream={"url": url}, max_tokens_recovery=2)
    raw = await llm(tw).chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=ASK, max_tokens=10
    )
    answer = raw.parse()
    assert answer.choices[0].message.content == "Once upon a time, the end."
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (170, 23)
    assert raw.headers["X-Tripwire-Max-Tokens-Recoveries"] == "2"
    sent = [s.body for s in fake.calls(CHAT)]
    assert len(sent) == 3
    assert sent[2]["messages"] == [
        *ASK,
        {"role": "assistant", "content": "Once upon a time, "},
        {"role": "user", "content": CONTINUE_PROMPT},
    ]
    await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    (call,) = [e for e in events if e["event_type"] == "LLM_CALL"]
    assert call["payload"]["response"]["text"] == "Once upon a time, the end."
    assert call["payload"]["usage"]["total_tokens"] == 193
    assert call["payload"]["prompt"] == ASK  # the agent's own request, not the continuations


async def test_recovery_stops_after_n_and_keeps_length(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.replies = [cut("a"), cut("b"), cut("c")]
    tw = await start_tripwire(upstream={"url": url}, max_tokens_recovery=1)
    answer = await llm(tw).chat.completions.create(model="gpt-4o-mini", messages=ASK)
    assert answer.choices[0].message.content == "ab"
    assert answer.choices[0].finish_reason == "length"
    assert len(fake.calls(CHAT)) == 2


async def test_off_by_default(start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]) -> None:
    fake, url = fake_upstream
    fake.replies = [cut("cut")]
    tw = await start_tripwire(upstream={"url": url})
    async with llm(tw) as client:
        first = await client.chat.completions.create(model="gpt-4o-mini", messages=ASK)
    assert (first.choices[0].message.content, first.choices[0].finish_reason) == ("cut", "length")
    assert len(fake.calls(CHAT)) == 1


async def test_never_for_streams_or_whole_answers(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(text="whole"), cut("streamed cut")]
    tw = await start_tripwire(upstream={"url": url}, max_tokens_recovery=3)
    async with llm(tw) as client:
        whole = await client.chat.completions.create(model="gpt-4o-mini", messages=ASK)
        assert whole.choices[0].message.content == "whole"
        stream = await client.chat.completions.create(model="gpt-4o-mini", messages=ASK, stream=True)
        chunks = [c async for c in stream]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert len(fake.calls(CHAT)) == 2


async def test_an_upstream_error_is_relayed_as_it_came(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(status=400)]
    tw = await start_tripwire(upstream={"url": url}, max_tokens_recovery=2)
    try:
        await llm(tw).chat.completions.create(model="gpt-4o-mini", messages=ASK)
    except openai.BadRequestError as e:
        assert e.body == {"message": "boom", "type": "server_error"}
    else:
        raise AssertionError("expected the upstream's 400")
    assert len(fake.calls(CHAT)) == 1


async def test_an_answer_compressed_anyway_is_decoded_before_it_is_continued(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    # the upstream gzips although Tripwire asked for identity: the answers are read decoded, and the
    # client gets the stitched JSON without a Content-Encoding (it was relayed raw before: garbage)
    fake, url = fake_upstream
    fake.replies = [
        Reply(text="Once upon ", finish_reason="length", completion_tokens=10, content_encoding="gzip"),
        Reply(text="a time.", prompt_tokens=70, completion_tokens=3, content_encoding="gzip"),
    ]
    tw = await start_tripwire(upstream={"url": url}, max_tokens_recovery=2)
    raw = await llm(tw).chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=ASK, max_tokens=10
    )
    assert raw.parse().choices[0].message.content == "Once upon a time."
    assert "content-encoding" not in {k.lower() for k in raw.headers}
    assert len(fake.calls(CHAT)) == 2
