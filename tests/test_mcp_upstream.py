"""The aggregate's upstream sessions against real SDK servers that accept one era each
(tests/mcp_revision_servers.py): the era found, lists, calls, progress, notifications, a server's
question as `input_required`, restarts, timeouts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("mcp")  # the MCP test servers; absent from the mitmproxy environment

from proxy.mcp.aggregate import revisions as rev  # noqa: E402
from proxy.mcp.aggregate.upstream import REOPENED, ServerUnavailable, UpstreamError, UpstreamSessions  # noqa: E402
from tests.mcp_revision_servers import HttpTransport, RevisionServer  # noqa: E402

ERAS = {"handshake": "2025-11-25", "stateless": "2026-07-28"}


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, RevisionServer]]:
    started = {era: RevisionServer(era) for era in ERAS}
    for server in started.values():
        server.start()
    yield started
    for server in started.values():
        server.stop()


class Notes:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any]] = []

    def __call__(self, server: str, method: str, params: Any) -> None:
        self.seen.append((server, method, params))

    def methods(self, server: str) -> list[str]:
        return [m for s, m, _ in self.seen if s == server]


@pytest.fixture
async def sessions(servers: dict[str, RevisionServer]) -> AsyncIterator[tuple[UpstreamSessions, Notes]]:
    transport = HttpTransport({era: server.url for era, server in servers.items()})
    notes = Notes()
    upstream = UpstreamSessions(transport, notes, capabilities={"sampling": {}})
    yield upstream, notes
    await upstream.close()
    await transport.close()


async def until(condition: Any, what: str, limit_s: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("era", ERAS)
async def test_each_server_is_spoken_to_in_the_era_it_accepts(
    sessions: tuple[UpstreamSessions, Notes], servers: dict[str, RevisionServer], era: str
) -> None:
    upstream, _ = sessions
    session = upstream.get(era)
    assert upstream.get(era) is session  # one session per server, kept
    listed = await session.request("tools/list", None, timeout=30)
    assert {"add", "echo", "slow_count", "grow"} <= {t["name"] for t in listed["tools"]}
    assert session.revision == ERAS[era]
    called = await session.request("tools/call", {"name": "add", "arguments": {"a": 2, "b": 3}}, timeout=30)
    assert called["content"][0]["text"] == "5"
    # what the gate saw: stateless requests all carry 2026-07-28; handshake ones the negotiated revision
    # after the one refused probe and the initialize (which carries no version header)
    seen = servers[era].gate.seen  # type: ignore[union-attr]
    if era == "stateless":
        assert {version for _, version in seen} == {"2026-07-28"}
    else:
        assert seen[:2] == [("POST", "2026-07-28"), ("POST", None)]
        assert {version for _, version in seen[2:]} == {"2025-11-25"}
    info = session.initialize_result()
    assert info["serverInfo"]["name"] == "tripwire-demo" and "tools" in info["capabilities"]
    assert session.discover_result()["supportedVersions"] == list(rev.STATELESS_REVISIONS)


@pytest.mark.parametrize("era", ERAS)
async def test_a_json_rpc_error_is_raised_as_upstream_error(
    sessions: tuple[UpstreamSessions, Notes], era: str
) -> None:
    upstream, _ = sessions
    with pytest.raises(UpstreamError) as raised:
        await upstream.get(era).request("no/such-method", {}, timeout=30)
    assert raised.value.code == rev.METHOD_NOT_FOUND


@pytest.mark.parametrize("era", ERAS)
async def test_progress_goes_to_the_caller_with_its_own_token(
    sessions: tuple[UpstreamSessions, Notes], era: str
) -> None:
    upstream, notes = sessions
    progress: list[dict[str, Any]] = []
    params = {"name": "slow_count", "arguments": {"steps": 3}, "_meta": {"progressToken": "client-7"}}
    result = await upstream.get(era).request("tools/call", params, timeout=30, on_progress=progress.append)
    assert result["content"][0]["text"] == "counted to 3"
    assert [p["progress"] for p in progress] == [1, 2, 3]
    assert {p["progressToken"] for p in progress} == {"client-7"}
    assert "notifications/progress" not in notes.methods(era)


@pytest.mark.parametrize("era", ERAS)
async def test_list_changed_reaches_on_notification(
    sessions: tuple[UpstreamSessions, Notes], era: str
) -> None:
    upstream, notes = sessions
    session = upstream.get(era)
    await session.open()
    await asyncio.sleep(0.5)  # the GET / subscriptions/listen stream connects in the background
    await session.request("tools/call", {"name": "grow", "arguments": {"name": f"new_{era}"}}, timeout=30)
    await until(lambda: "notifications/tools/list_changed" in notes.methods(era), "tools/list_changed")
    listed = await session.request("tools/list", None, timeout=30)
    assert f"new_{era}" in {t["name"] for t in listed["tools"]}


async def test_resource_subscriptions_ride_the_listen_filter_at_2026(
    sessions: tuple[UpstreamSessions, Notes],
) -> None:
    """2026-07-28 has no `resources/subscribe`: the URI joins the `subscriptions/listen` filter's
    `resourceSubscriptions` and the server's `notifications/resources/updated` for it arrives;
    unsubscribed, it no longer does."""
    upstream, notes = sessions
    session = upstream.get("stateless")
    assert await session.request("resources/subscribe", {"uri": "memo://note"}, timeout=30) == {}
    await session.request("tools/call", {"name": "touch", "arguments": {"uri": "memo://note"}}, timeout=30)
    await until(lambda: "notifications/resources/updated" in notes.methods("stateless"), "resources/updated")
    updated = [p for s, m, p in notes.seen if m == "notifications/resources/updated"]
    assert updated == [{"uri": "memo://note"}]
    assert await session.request("resources/unsubscribe", {"uri": "memo://note"}, timeout=30) == {}
    await session.request("tools/call", {"name": "touch", "arguments": {"uri": "memo://note"}}, timeout=30)
    await session.request("tools/call", {"name": "grow", "arguments": {"name": "marker"}}, timeout=30)
    await until(lambda: "notifications/tools/list_changed" in notes.methods("stateless"), "the marker")
    assert [m for _, m, _ in notes.seen].count("notifications/resources/updated") == 1


@pytest.mark.parametrize("era", ERAS)
async def test_log_messages_reach_on_notification_once_a_level_is_set(
    sessions: tuple[UpstreamSessions, Notes], era: str
) -> None:
    """Handshake era: `logging/setLevel` goes to the server (this one, the SDK's, has dropped the
    deprecated method and says so; it logs anyway). 2026-07-28 has no such method: the level is kept
    and rides each request's `_meta` (`io.modelcontextprotocol/logLevel`), without which the server
    sends no log at all."""
    upstream, notes = sessions
    session = upstream.get(era)
    if era == "handshake":
        with pytest.raises(UpstreamError) as raised:
            await session.request("logging/setLevel", {"level": "info"}, timeout=30)
        assert raised.value.code == rev.METHOD_NOT_FOUND  # the server's answer: forwarded, not ours
    else:
        assert await session.request("logging/setLevel", {"level": "info"}, timeout=30) == {}
    await session.request("tools/call", {"name": "chatty", "arguments": {"text": "hello log"}}, timeout=30)
    await until(lambda: "notifications/message" in notes.methods(era), "notifications/message")
    logged = [p for s, m, p in notes.seen if s == era and m == "notifications/message"]
    assert logged[0]["data"] == "hello log" and logged[0]["level"] == "info"


@pytest.mark.parametrize("era", ERAS)
async def test_a_servers_question_comes_back_as_input_required_and_the_retry_answers_it(
    sessions: tuple[UpstreamSessions, Notes], era: str
) -> None:
    """Handshake era: the server's sampling/createMessage on the POST's stream is held there and
    handed back as input_required; 2026-07-28: the server's own input_required, unchanged."""
    upstream, _ = sessions
    session = upstream.get(era)
    params = {"name": "summarize", "arguments": {"topic": "cats"}}
    first = await session.request("tools/call", params, timeout=30)
    assert rev.result_type(first) == "input_required"
    asked = rev.input_requests(first)
    assert [method for _, method, _ in asked] == ["sampling/createMessage"]
    answer = {"role": "assistant", "content": {"type": "text", "text": "purr"}, "model": "test"}
    retry = rev.retry_params(params, {key: answer for key, _, _ in asked}, first.get("requestState"))
    final = await session.request("tools/call", retry, timeout=30)
    assert final["content"][0]["text"] == "summary of cats: purr"


async def test_without_the_capability_a_handshake_servers_question_is_refused(
    servers: dict[str, RevisionServer],
) -> None:
    transport = HttpTransport({"hs": servers["handshake"].url})
    upstream = UpstreamSessions(transport)  # declares no sampling capability
    try:
        with pytest.raises(UpstreamError) as raised:
            await upstream.get("hs").request(
                "tools/call", {"name": "summarize", "arguments": {"topic": "x"}}, timeout=30
            )
        assert raised.value.code == -32021  # MISSING_REQUIRED_CLIENT_CAPABILITY, relayed as the server said
    finally:
        await upstream.close()
        await transport.close()


async def test_a_2026_clients_capabilities_widen_a_handshake_session(
    servers: dict[str, RevisionServer],
) -> None:
    """The session opened declaring nothing; a request whose 2026-07-28 envelope declares `sampling`
    re-opens it declaring that too (quietly: no REOPENED), so the server asks instead of refusing."""
    transport = HttpTransport({"hs": servers["handshake"].url})
    notes = Notes()
    upstream = UpstreamSessions(transport, notes)
    try:
        session = upstream.get("hs")
        await session.request("tools/list", None, timeout=30)
        first_id = session._state.session_id  # type: ignore[union-attr]
        params = {
            "name": "summarize",
            "arguments": {"topic": "dogs"},
            "_meta": {
                rev.PROTOCOL_VERSION_META: "2026-07-28",
                rev.CLIENT_CAPABILITIES_META: {"sampling": {}},
            },
        }
        asked = await session.request("tools/call", params, timeout=30)
        assert rev.result_type(asked) == "input_required"
        assert session._state.session_id != first_id  # type: ignore[union-attr]
        assert session.capabilities == {"sampling": {}}
        answer = {"role": "assistant", "content": {"type": "text", "text": "woof"}, "model": "test"}
        retry = rev.retry_params(
            params, {k: answer for k, _, _ in rev.input_requests(asked)}, asked["requestState"]
        )
        final = await session.request("tools/call", retry, timeout=30)
        assert final["content"][0]["text"] == "summary of dogs: woof"
        assert REOPENED not in notes.methods("hs")
    finally:
        await upstream.close()
        await transport.close()


@pytest.mark.parametrize("era", ERAS)
async def test_timeout_raises_server_unavailable_and_the_session_carries_on(
    sessions: tuple[UpstreamSessions, Notes], era: str
) -> None:
    upstream, _ = sessions
    session = upstream.get(era)
    await session.open()
    with pytest.raises(ServerUnavailable):
        await session.request("tools/call", {"name": "nap", "arguments": {"seconds": 30}}, timeout=0.5)
    called = await session.request("tools/call", {"name": "echo", "arguments": {"text": "hi"}}, timeout=30)
    assert called["content"][0]["text"] == "echo: hi"


@pytest.mark.parametrize("era", ERAS)
async def test_cancelling_a_request_cancels_it_as_its_revision_says(
    sessions: tuple[UpstreamSessions, Notes], servers: dict[str, RevisionServer], era: str
) -> None:
    """Handshake era: `notifications/cancelled` naming Tripwire's upstream request id. 2026-07-28
    defines no client-to-server notification for it: the request's stream is closed, nothing posted."""
    upstream, _ = sessions
    session = upstream.get(era)
    await session.open()
    gate = servers[era].gate
    assert gate is not None
    before = len(gate.posted)
    call = asyncio.ensure_future(
        session.request("tools/call", {"name": "nap", "arguments": {"seconds": 30}}, timeout=60)
    )
    await until(
        lambda: any(m.get("method") == "tools/call" for m in gate.posted[before:] if isinstance(m, dict)),
        "the call reaching the server",
    )
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    sent = [m for m in gate.posted[before:] if isinstance(m, dict)]
    napping = next(m for m in sent if m.get("method") == "tools/call")
    if era == "handshake":
        await until(
            lambda: any(
                m.get("method") == "notifications/cancelled" for m in gate.posted if isinstance(m, dict)
            ),
            "notifications/cancelled",
        )
        cancelled = next(
            m for m in gate.posted if isinstance(m, dict) and m.get("method") == "notifications/cancelled"
        )
        assert cancelled["params"]["requestId"] == napping["id"]
    else:
        await asyncio.sleep(0.5)
        assert not [
            m for m in gate.posted[before:] if isinstance(m, dict) and "cancel" in str(m.get("method"))
        ]
    called = await session.request("tools/call", {"name": "echo", "arguments": {"text": "on"}}, timeout=30)
    assert called["content"][0]["text"] == "echo: on"


async def test_a_server_that_is_not_there_is_unavailable() -> None:
    transport = HttpTransport({"gone": "http://127.0.0.1:9/mcp"})
    upstream = UpstreamSessions(transport)
    try:
        with pytest.raises(ServerUnavailable):
            await upstream.get("gone").request("tools/list", None, timeout=30)
    finally:
        await upstream.close()
        await transport.close()


@pytest.mark.parametrize("era", ERAS)
async def test_a_restarted_server_is_reopened_and_reported(era: str) -> None:
    """Killed: requests raise ServerUnavailable. Restarted on the same port (a new process that knows
    no session): the session re-opens (handshake: the 404 for the old id means a fresh initialize), the
    next request is answered, and REOPENED tells the aggregate the server's lists may have changed."""
    server = RevisionServer(era)
    server.start()
    transport = HttpTransport({"s": server.url})
    notes = Notes()
    upstream = UpstreamSessions(transport, notes)
    try:
        session = upstream.get("s")
        await session.request("tools/list", None, timeout=30)
        await asyncio.sleep(0.5)
        server.stop()
        with pytest.raises(ServerUnavailable):
            await session.request("tools/list", None, timeout=30)
        server.start()
        await until(lambda: REOPENED in notes.methods("s"), "REOPENED after the restart")
        listed = await session.request("tools/list", None, timeout=30)
        assert "add" in {t["name"] for t in listed["tools"]}
        assert session.revision == ERAS[era]
        if era == "handshake":  # the server saw a second initialize
            assert [v for _, v in server.gate.seen].count(None) == 1  # type: ignore[union-attr]
    finally:
        await upstream.close()
        await transport.close()
        server.stop()


async def test_a_handshake_session_forgotten_without_a_visible_outage_is_reinitialized() -> None:
    """The request itself meets the 404 (no stream noticed anything): re-initialize, send once more."""
    server = RevisionServer("handshake")
    server.start()
    transport = HttpTransport({"s": server.url})
    upstream = UpstreamSessions(transport)
    try:
        session = upstream.get("s")
        await session.request("tools/list", None, timeout=30)
        session._state.session_id = "forgotten"  # type: ignore[union-attr]  # as after a restart
        called = await session.request(
            "tools/call", {"name": "add", "arguments": {"a": 1, "b": 1}}, timeout=30
        )
        assert called["content"][0]["text"] == "2"
        assert session._state.session_id != "forgotten"  # type: ignore[union-attr]
    finally:
        await upstream.close()
        await transport.close()
        server.stop()
