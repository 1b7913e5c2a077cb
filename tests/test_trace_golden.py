"""The trace a fixed session writes, field for field, against a stored copy (tests/fixtures/trace_golden.json).

The recording path is tuned for speed (payloads built already redacted, the writer's passes): this
pins what it writes. The real `openai` and `anthropic` SDKs play one fixed session through Tripwire
against the fake upstream: answers with text, streamed and not, tool calls asking for secrets,
their results, secrets and over-long text in prompts, an upstream failure, a loop the guards warn
about, a Responses call, an Anthropic call; then the same with `record_content: false`. Every
event is compared as written, with only what differs from run to run replaced: ids by their order
of appearance, times and durations by placeholders.

After an intended change of the trace format, regenerate the stored copy and review its diff:
`TRIPWIRE_REGENERATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_trace_golden.py`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.conftest import AGENT_KEY, Running, StartTripwire, serve_fake
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.schema import assert_run_valid

GOLDEN = Path(__file__).parent / "fixtures" / "trace_golden.json"
SESSION = {"X-Tripwire-Session": "golden-1", "X-Tripwire-Agent": "golden-agent"}
SECRET = "sk-proj-" + "A1b2C3d4E5" * 4
LONG = "long text " * 400  # beyond max_field_bytes below: cut and marked

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# fields whose values change from run to run
TIME_FIELDS = {"ts", "duration_ms", "ttfb_ms", "t", "t_end", "started_at", "ended_at", "last_event_ts"}
ENVIRONMENT_FIELDS = {"cwd", "argv", "platform", "python_version"}


def normalise(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ids become `id-N` in order of first appearance; times and the environment become placeholders."""
    ids: dict[str, str] = {}

    def walk(value: Any, key: str | None = None) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if key in TIME_FIELDS and value is not None:
            return "<time>"
        if key in ENVIRONMENT_FIELDS:
            return "<environment>"
        if isinstance(value, str) and UUID.fullmatch(value):  # event ids, wherever they appear
            return ids.setdefault(value, f"id-{len(ids)}")
        return value

    return [walk(e) for e in events]


async def play(tw: Running, fake: FakeUpstream) -> None:
    chat = openai.AsyncOpenAI(
        base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION, max_retries=0
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are terse. Use the key {SECRET} for the API."},
        {"role": "user", "content": "weather in Paris? my password=hunter2 and Bearer abcdefghij"},
    ]
    fake.replies = [
        Reply(tool_calls=[("call_1", "get_weather", {"city": "Paris", "api_key": SECRET})]),
        Reply(tool_calls=[("call_2", "get_weather", {"city": "Paris", "api_key": SECRET})]),
        Reply(text="It is sunny. " + LONG, prompt_tokens=321, completion_tokens=45),
        Reply(status=500),
        Reply(tool_calls=[(f"call_{i}", "lookup", {"q": "same"}) for i in (3,)]),
        Reply(tool_calls=[(f"call_{i}", "lookup", {"q": "same"}) for i in (4,)]),
        Reply(tool_calls=[(f"call_{i}", "lookup", {"q": "same"}) for i in (5,)]),
        Reply(tool_calls=[(f"call_{i}", "lookup", {"q": "same"}) for i in (6,)]),
        Reply(text="done"),
    ]
    for step in range(3):
        if step == 1:  # streamed, with the usage chunk
            async with chat.chat.completions.stream(
                model="gpt-4o-mini", messages=messages, temperature=0.2
            ) as s:
                async for _event in s:
                    pass
                answer = await s.get_final_completion()
        else:
            answer = await chat.chat.completions.create(model="gpt-4o-mini", messages=messages)
        msg = answer.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls or []:
            result = json.dumps({"temp": 21, "token": "t0k3n-value-123", "note": LONG[:80]})
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": result})
    with pytest.raises(openai.InternalServerError):
        await chat.chat.completions.create(model="gpt-4o-mini", messages=messages)
    for _ in range(5):
        answer = await chat.chat.completions.create(model="gpt-4o-mini", messages=messages)
        msg = answer.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": "same answer"})
    fake.replies = [Reply(text="a Responses answer", prompt_tokens=12, completion_tokens=3)]
    await chat.responses.create(model="gpt-4o-mini", input=f"hello again, key {SECRET}")
    claude = anthropic.AsyncAnthropic(
        base_url=tw.url + "/llm/anthropic", api_key=AGENT_KEY, default_headers=SESSION, max_retries=0
    )
    fake.replies = [Reply(text="an Anthropic answer", prompt_tokens=7, completion_tokens=2)]
    await claude.messages.create(
        model="claude-3-5-haiku-latest",
        max_tokens=64,
        messages=[{"role": "user", "content": "cookie: session=abc123def456"}],
    )
    await tw.flush()


async def record(start_tripwire: StartTripwire, fake: FakeUpstream, url: str, **settings: Any) -> list[Any]:
    tw = await start_tripwire(
        upstream={"url": url},
        llm={"anthropic": {"url": url}},
        max_field_bytes=2048,
        **settings,
    )
    await play(tw, fake)
    await tw.engine.recorder.close()  # RUN_END, and nothing more to write
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    return normalise(events)


async def test_the_trace_of_a_fixed_session_is_unchanged(start_tripwire: StartTripwire) -> None:
    async with serve_fake(Reply(text="ok")) as (fake, url):
        traces = {
            "record_content": await record(start_tripwire, fake, url),
            "no_content": await record(start_tripwire, fake, url, record_content=False),
        }
    if os.environ.get("TRIPWIRE_REGENERATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(traces, indent=1, ensure_ascii=False) + "\n")
    expected = json.loads(GOLDEN.read_text())
    for name, events in traces.items():
        assert [e["event_type"] for e in events] == [e["event_type"] for e in expected[name]], name
        for got, want in zip(events, expected[name], strict=True):
            assert got == want, name
            assert json.dumps(got) == json.dumps(want), name  # the fields' order too
