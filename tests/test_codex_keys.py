"""Codex without its key (issue 32 item 6): Codex 0.171 reads `CODEX_API_KEY` or the key of
`codex login --with-api-key`, never `OPENAI_API_KEY`, so a gateway user who sets only the latter
sends Codex's requests with no key at all. The 401 says that no key arrived (Codex shows the message
and nothing else), in the OpenAI error shape Codex reads; a key that is not an agent key is told
apart. The headers are those the real CLI sent (tests/fixtures/codex_0171_http.json)."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import StartTripwire
from tests.fakes import FakeUpstream

CODEX = json.loads((Path(__file__).parent / "fixtures" / "codex_0171_http.json").read_text())


@pytest.mark.parametrize("key", [None, "sk-an-openai-key"])
async def test_a_codex_request_without_an_agent_key_is_told_why(
    key: str | None,
    start_tripwire: StartTripwire,
    fake_upstream: tuple[FakeUpstream, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake, url = fake_upstream
    monkeypatch.setenv("TW_TEST_UPSTREAM_KEY", "sk-upstream")
    tw = await start_tripwire(
        auth={"require_agent_key": True}, upstream={"url": url, "api_key_env": "TW_TEST_UPSTREAM_KEY"}
    )
    headers = dict(CODEX["headers"])
    assert not {"authorization", "x-api-key", "api-key"} & {h.lower() for h in headers}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    async with aiohttp.ClientSession() as http:
        async with http.post(tw.url + "/v1/responses", json=CODEX["requests"][0], headers=headers) as resp:
            status, body = resp.status, await resp.json()
    error = body["error"]
    assert (status, error["code"], error["type"]) == (401, "invalid_api_key", "invalid_request_error")
    if key is None:
        assert "no key arrived" in error["message"] and "CODEX_API_KEY" in error["message"]
    else:
        assert "no key arrived" not in error["message"] and "not one (tw_...)" in error["message"]
    assert fake.calls("/v1/responses") == []
