"""Agent keys: the stores (data dir, Redis), `tripwire keys`, `/api/keys`, and a revocation reaching
every replica on its next call (SPEC §9)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from proxy.agent_keys import (
    KEY_PREFIX,
    STORE_FILE,
    FileKeyStore,
    KeyRequestError,
    RedisKeyStore,
    key_hash,
    parse_duration,
)
from proxy.cli import main
from tests.conftest import StartTripwire
from tests.fakes import FakeUpstream
from tests.redis_server import redis_server, redis_url  # noqa: F401 (fixtures)

HELLO = [{"role": "user", "content": "hello"}]
ADMIN = {"Authorization": "Bearer hunter2"}


def gateway_settings(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "auth": {"require_agent_key": True},
        "upstream": {"url": url, "api_key_env": "TW_TEST_UPSTREAM_KEY"},
        "admin_token": "hunter2",
        **extra,
    }


@pytest.fixture(autouse=True)
def _upstream_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TW_TEST_UPSTREAM_KEY", "sk-upstream")


async def chat_status(base: str, key: str) -> int:
    try:
        await openai.AsyncOpenAI(base_url=base + "/v1", api_key=key, max_retries=0).chat.completions.create(
            model="gpt-4o-mini",
            messages=HELLO,  # type: ignore[arg-type]
        )
    except openai.APIStatusError as e:
        return e.status_code
    return 200


async def eventually_status(base: str, key: str, want: int) -> None:
    for _ in range(200):  # generous: the data dir's watcher looks every 0.5 s
        if await chat_status(base, key) == want:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"calls never got {want}")


def test_durations() -> None:
    assert parse_duration("30d") == 30 * 86400 and parse_duration("12h") == 43200
    assert parse_duration("90m") == 5400 and parse_duration("2w") == 14 * 86400
    for bad in ("", "30", "0d", "-1d", "3y", "d"):
        with pytest.raises(KeyRequestError, match="expires"):
            parse_duration(bad)


async def test_file_store_keeps_hashes_only_in_a_private_file(tmp_path: Path) -> None:
    store = FileKeyStore(tmp_path)
    await store.start()
    try:
        record, secret = await store.create("alice", 3600, "ci")
        assert secret.startswith(KEY_PREFIX) and len(secret) == len(KEY_PREFIX) + 43
        assert record.hash == key_hash(secret) and "hash" not in record.public()
        assert await store.find(key_hash(secret)) == record
        assert await store.find(key_hash(secret + "x")) is None
        path = tmp_path / STORE_FILE
        assert secret not in path.read_text() and path.stat().st_mode & 0o777 == 0o600
        revoked = await store.revoke(record.id)
        assert revoked is not None and revoked.revoked is not None
        assert await store.revoke("key_nope") is None
        # another process (a second store on the same dir) sees the revocation
        other = FileKeyStore(tmp_path)
        other.reload()
        found = await other.find(key_hash(secret))
        assert found is not None and found.revoked is not None
        for agent in ("", " ", "a/b", "x" * 201):
            with pytest.raises(KeyRequestError, match="agent"):
                await store.create(agent)
    finally:
        await store.close()


async def test_a_broken_store_file_accepts_no_key(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = FileKeyStore(tmp_path)
    _, secret = await store.create("alice")
    (tmp_path / STORE_FILE).write_text("{not json")
    store.reload()
    assert await store.find(key_hash(secret)) is None
    # a record of the wrong shape: refused too, and the log names the file, never the hash it quotes
    (tmp_path / STORE_FILE).write_text(json.dumps({"keys": [{"id": 1, "hash": key_hash(secret)}]}))
    store.reload()
    assert await store.find(key_hash(secret)) is None
    assert (
        STORE_FILE in caplog.text and key_hash(secret)[-20:] not in caplog.text
    )  # (pydantic cuts the middle)


def test_cli_create_list_revoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = str(tmp_path / "d")
    assert (
        main(["keys", "create", "--agent", "alice", "--expires", "30d", "--note", "ci", "--data-dir", data])
        == 0
    )
    out = capsys.readouterr()
    secret = out.out.strip()
    assert secret.startswith(KEY_PREFIX) and "shown once" in out.err
    assert main(["keys", "list", "--json", "--data-dir", data]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["agent"] == "alice" and listed["status"] == "active" and listed["note"] == "ci"
    assert "hash" not in listed and secret not in json.dumps(listed)
    assert main(["keys", "list", "--data-dir", data]) == 0
    assert "alice" in capsys.readouterr().out
    assert main(["keys", "revoke", listed["id"], "--data-dir", data]) == 0
    assert capsys.readouterr().out.strip() == f"revoked {listed['id']}"
    assert main(["keys", "list", "--json", "--data-dir", data]) == 0
    assert json.loads(capsys.readouterr().out)[0]["status"] == "revoked"
    assert main(["keys", "revoke", "key_nope", "--data-dir", data]) == 1
    assert main(["keys", "create", "--agent", "bob", "--expires", "soon", "--data-dir", data]) == 2
    assert "expires" in capsys.readouterr().err
    assert os.stat(Path(data) / STORE_FILE).st_mode & 0o777 == 0o600


async def test_a_running_serve_sees_the_clis_keys_and_revocations(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(**gateway_settings(url))
    data = str(tw.data_dir)
    assert (
        await asyncio.to_thread(main, ["keys", "create", "--agent", "alice", "--json", "--data-dir", data])
        == 0
    )
    created = json.loads(capsys.readouterr().out)
    await eventually_status(tw.url, created["key"], 200)
    assert await asyncio.to_thread(main, ["keys", "revoke", created["id"], "--data-dir", data]) == 0
    await eventually_status(tw.url, created["key"], 401)


async def test_admin_api_create_list_revoke(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(**gateway_settings(url))
    async with aiohttp.ClientSession(headers=ADMIN) as http:
        async with http.post(
            tw.admin_url + "/api/keys", json={"agent": "alice", "expires": "1d", "note": "n"}
        ) as r:
            assert r.status == 201
            created = await r.json()
        assert (
            created["key"].startswith(KEY_PREFIX) and created["status"] == "active" and "hash" not in created
        )
        assert await chat_status(tw.url, created["key"]) == 200  # at once: the same process
        async with http.get(tw.admin_url + "/api/keys") as r:
            (listed,) = (await r.json())["keys"]
        assert listed["id"] == created["id"] and "key" not in listed and "hash" not in listed
        async with http.delete(tw.admin_url + f"/api/keys/{created['id']}") as r:
            assert r.status == 200 and (await r.json())["status"] == "revoked"
        assert await chat_status(tw.url, created["key"]) == 401
        async with http.delete(tw.admin_url + "/api/keys/key_nope") as r:
            assert r.status == 404
        for body, field in (
            ({"agent": ""}, "agent"),
            ({"agent": "a", "expires": "forever"}, "expires"),
            ({"agent": "a", "colour": "red"}, "colour"),
            ({}, "agent"),
            ({"agent": "a/b"}, "agent"),
        ):
            async with http.post(tw.admin_url + "/api/keys", json=body) as r:
                assert r.status == 400, body
                assert field in (await r.json())["detail"], body
        async with http.post(tw.admin_url + "/api/keys", data=b"{") as r:
            assert r.status == 400
    async with aiohttp.ClientSession() as http:  # the admin token applies
        async with http.get(tw.admin_url + "/api/keys") as r:
            assert r.status == 401


async def test_shared_store_a_key_and_a_revocation_reach_every_replica_on_the_next_call(
    start_tripwire: StartTripwire,
    fake_upstream: tuple[FakeUpstream, str],
    redis_url: str,  # noqa: F811
) -> None:
    fake, url = fake_upstream
    a = await start_tripwire(**gateway_settings(url, state={"url": redis_url}))
    b = await start_tripwire(**gateway_settings(url, state={"url": redis_url}))
    assert isinstance(a.engine.agent_keys, RedisKeyStore)
    async with aiohttp.ClientSession(headers=ADMIN) as http:
        async with http.post(a.admin_url + "/api/keys", json={"agent": "alice"}) as r:
            created = await r.json()
        assert await chat_status(b.url, created["key"]) == 200  # made on A, known on B at once
        async with http.delete(a.admin_url + f"/api/keys/{created['id']}") as r:
            assert r.status == 200
    assert await chat_status(b.url, created["key"]) == 401  # revoked on A: B's next call refused
    assert await chat_status(a.url, created["key"]) == 401
    assert len(fake.calls("/v1/chat/completions")) == 1
    # the CLI on the same state
    out = await asyncio.to_thread(_cli_create, redis_url, a.data_dir)
    assert await chat_status(b.url, out["key"]) == 200
    await b.flush()
    agents = {b.tripwire_json(r)["agent_name"] for r in b.run_ids()}
    assert agents == {"alice", "carol"}


def _cli_create(url: str, data_dir: Path) -> dict[str, Any]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert (
            main(
                ["keys", "create", "--agent", "carol", "--json", "--state", url, "--data-dir", str(data_dir)]
            )
            == 0
        )
    return dict(json.loads(buf.getvalue()))


async def test_shared_store_unreachable_refuses_rather_than_fail_open(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    from tests.redis_server import free_port

    fake, url = fake_upstream
    tw = await start_tripwire(**gateway_settings(url, state={"url": f"redis://127.0.0.1:{free_port()}/0"}))
    assert await chat_status(tw.url, KEY_PREFIX + "x" * 43) == 503
    assert fake.seen == [] and tw.run_ids() == []
