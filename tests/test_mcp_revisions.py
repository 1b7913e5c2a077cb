"""The translations between MCP revisions (proxy/mcp/aggregate/revisions.py), each as the revision
it answers for says, and the upstream session's reading of answers no server of the tests gives."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson
import pytest

from proxy.mcp.aggregate import revisions as rev
from proxy.mcp.aggregate.upstream import (
    REOPENED,
    ServerUnavailable,
    TransportStatus,
    UpstreamError,
    UpstreamSession,
)


def unsupported(*supported: str) -> dict[str, Any]:
    return {"code": -32022, "message": "Unsupported protocol version", "data": {"supported": list(supported)}}


@pytest.mark.parametrize(
    ("error", "result", "verdict"),
    [
        (None, {"supportedVersions": ["2026-07-28"]}, "stateless"),
        (
            None,
            {"supportedVersions": ["2025-11-25"]},
            "handshake",
        ),  # discover answered, no stateless revision
        ({"code": -32601, "message": "Method not found"}, None, "handshake"),
        ({"code": -32000, "message": "Bad Request: Unsupported protocol version"}, None, "handshake"),
        (None, None, "handshake"),  # an HTTP 4xx with no JSON-RPC body
        (unsupported("2026-07-28"), None, "stateless"),
        (unsupported("2025-11-25", "2027-01-01"), None, "handshake"),
        (unsupported("2027-01-01"), None, "incompatible"),  # modern-only, and disjoint: no fallback
    ],
)
def test_the_probe_verdict_follows_the_dual_era_client_rules(
    error: dict[str, Any] | None, result: dict[str, Any] | None, verdict: str
) -> None:
    assert rev.probe_verdict(error, result) == verdict


def test_the_envelope_keeps_a_stateless_clients_own_info_and_is_removed_for_a_handshake_server() -> None:
    own = {"_meta": {rev.CLIENT_CAPABILITIES_META: {"elicitation": {}}, "progressToken": 4}, "name": "t"}
    stamped = rev.with_envelope(own, "2026-07-28", {"name": "tw"}, {}, log_level="debug")
    meta = stamped["_meta"]
    assert meta[rev.PROTOCOL_VERSION_META] == "2026-07-28"
    assert meta[rev.CLIENT_CAPABILITIES_META] == {"elicitation": {}}  # the client's, not the default
    assert meta[rev.CLIENT_INFO_META] == {"name": "tw"}
    assert meta[rev.LOG_LEVEL_META] == "debug"
    assert rev.without_envelope(stamped) == {"_meta": {"progressToken": 4}, "name": "t"}
    assert rev.without_envelope({"_meta": {rev.PROTOCOL_VERSION_META: "x"}}) == {}
    assert rev.envelope_of(stamped) == ("2026-07-28", {"name": "tw"}, {"elicitation": {}})


def test_routing_and_param_headers() -> None:
    params = {"name": "café", "arguments": {"region": "eu", "deep": {"flag": True}, "n": 3}}
    assert rev.routing_headers("tools/call", params, "2026-07-28") == {
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "=?base64?Y2Fmw6k=?=",
    }
    schema = {
        "type": "object",
        "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "deep": {"type": "object", "properties": {"flag": {"type": "boolean", "x-mcp-header": "Flag"}}},
            "n": {"type": "integer"},
        },
    }
    assert rev.param_headers(schema, params["arguments"]) == {
        "Mcp-Param-Region": "eu",
        "Mcp-Param-Flag": "true",
    }
    assert rev.param_headers(schema, {}) == {}


def test_initialize_and_discover_results_translate_both_ways() -> None:
    initialize = {
        "protocolVersion": "2025-06-18",
        "capabilities": {"tools": {"listChanged": True}, "logging": {}},
        "serverInfo": {"name": "files", "version": "2"},
        "instructions": "read only",
    }
    discover = rev.discover_from_initialize(initialize)
    assert discover == {
        "resultType": "complete",
        "supportedVersions": ["2026-07-28"],
        "capabilities": {"tools": {"listChanged": True}, "logging": {}},
        "ttlMs": 0,
        "cacheScope": "private",
        "instructions": "read only",
        "_meta": {rev.SERVER_INFO_META: {"name": "files", "version": "2"}},
    }
    back = rev.initialize_from_discover(discover, "2025-11-25", "files")
    assert back == {
        "protocolVersion": "2025-11-25",
        "capabilities": {"tools": {"listChanged": True}, "logging": {}},
        "serverInfo": {"name": "files", "version": "2"},
        "instructions": "read only",
    }
    assert rev.initialize_from_discover({"capabilities": {}}, "2025-11-25", "x")["serverInfo"]["name"] == "x"


def test_results_and_round_trips() -> None:
    assert rev.result_type({"content": []}) == "complete"  # absent means complete
    assert rev.as_stateless_result({"content": []}) == {"content": [], "resultType": "complete"}
    assert rev.as_handshake_result({"content": [], "resultType": "complete"}) == {"content": []}
    asked = rev.input_required({"k1": {"method": "elicitation/create", "params": {"message": "ok?"}}}, "s1")
    assert asked == {
        "resultType": "input_required",
        "inputRequests": {"k1": {"method": "elicitation/create", "params": {"message": "ok?"}}},
        "requestState": "s1",
    }
    assert rev.input_requests(asked) == [("k1", "elicitation/create", {"message": "ok?"})]
    retry = rev.retry_params({"name": "t", "requestState": "old"}, {"k1": {"action": "accept"}}, "s1")
    assert retry == {"name": "t", "inputResponses": {"k1": {"action": "accept"}}, "requestState": "s1"}
    assert rev.split_retry(retry) == ({"name": "t"}, {"k1": {"action": "accept"}}, "s1")
    assert rev.may_ask("sampling/createMessage", {"sampling": {}})
    assert not rev.may_ask("sampling/createMessage", {"elicitation": {}})
    assert not rev.may_ask("ping", {"sampling": {}})


def test_what_one_era_has_and_the_other_has_not() -> None:
    assert rev.local_answer("ping", "2026-07-28") == {}
    assert rev.local_answer("logging/setLevel", "2026-07-28") == {}
    assert rev.local_answer("ping", "2025-11-25") is None
    assert rev.local_answer("tools/list", "2026-07-28") is None
    assert rev.cancels_by_notification("2025-11-25") and not rev.cancels_by_notification("2026-07-28")
    capabilities = {"tools": {"listChanged": True}, "prompts": {}, "resources": {"listChanged": True}}
    assert rev.listen_filter(capabilities) == {"toolsListChanged": True, "resourcesListChanged": True}
    assert rev.listen_filter({}, ["memo://a"]) == {"resourceSubscriptions": ["memo://a"]}
    stamped = {"_meta": {rev.SUBSCRIPTION_ID_META: 7}}
    assert rev.listen_notification(stamped) == {}


class ScriptedTransport:
    """Answers each POST from a list of outcomes: messages to yield, or an exception to raise."""

    def __init__(self, outcomes: list[Any]) -> None:
        self.outcomes = outcomes
        self.bodies: list[bytes] = []

    async def post(
        self,
        server: str,
        headers: Mapping[str, str],
        body: bytes,
        headers_out: Callable[[Mapping[str, str]], None] | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        self.bodies.append(body)
        if headers_out is not None:
            headers_out({"Mcp-Session-Id": "upstream-1"})
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        for message in outcome:
            yield message

    async def get_stream(self, server: str, headers: Mapping[str, str]) -> AsyncIterator[dict[str, Any]]:
        raise TransportStatus(405)
        yield {}

    async def delete(self, server: str, headers: Mapping[str, str]) -> None:
        return None


DISCOVERED = [
    {"jsonrpc": "2.0", "id": 1, "result": {"supportedVersions": ["2026-07-28"], "capabilities": {}}}
]


async def test_a_5xx_is_unavailability_even_with_a_json_rpc_body() -> None:
    """A gateway's (or Tripwire's own) 502 carries a JSON-RPC error: still a server that failed, so
    the aggregate drops it from tools/list rather than relaying an error."""
    failed = TransportStatus(
        502, {"jsonrpc": "2.0", "id": 2, "error": {"code": -32603, "message": "upstream failed"}}
    )
    session = UpstreamSession("s", ScriptedTransport([DISCOVERED, failed]))
    with pytest.raises(ServerUnavailable, match="upstream failed"):
        await session.request("tools/list", None)


async def test_a_4xx_with_a_json_rpc_body_is_that_error() -> None:
    refused = TransportStatus(
        400, {"jsonrpc": "2.0", "id": 2, "error": {"code": -32602, "message": "bad params"}}
    )
    session = UpstreamSession("s", ScriptedTransport([DISCOVERED, refused]))
    with pytest.raises(UpstreamError) as raised:
        await session.request("tools/call", {"name": "x"})
    assert (raised.value.code, raised.value.message) == (-32602, "bad params")


async def test_an_initialize_refused_with_a_stateless_revision_reprobes() -> None:
    """-32022 at initialize is stateless evidence (a probe that failed for another reason first)."""
    transport = ScriptedTransport(
        [
            TransportStatus(404),  # the probe: no verdict but "not stateless"
            [{"jsonrpc": "2.0", "id": 2, "error": unsupported("2026-07-28")}],  # initialize
            DISCOVERED,  # second probe (ids differ; the session matches by its own id)
            [{"jsonrpc": "2.0", "id": 4, "result": {"tools": []}}],
        ]
    )
    transport.outcomes[2] = [{"jsonrpc": "2.0", "id": 3, "result": DISCOVERED[0]["result"]}]
    session = UpstreamSession("s", transport)
    assert await session.request("tools/list", None) == {"tools": []}
    assert session.revision == "2026-07-28"


async def test_a_server_speaking_only_revisions_we_do_not_is_refused() -> None:
    session = UpstreamSession(
        "s", ScriptedTransport([TransportStatus(400, {"error": unsupported("2027-01-01")})])
    )
    with pytest.raises(UpstreamError) as raised:
        await session.request("tools/list", None)
    assert raised.value.code == -32022


async def test_tripwires_own_could_not_reach_error_is_unavailability_not_an_era() -> None:
    """In process, the server's pipeline answers an unreachable server with JSON-RPC -32051 over 200
    (docs/reliability.md): not an answer to the probe, and not the server's own error."""
    unreachable = [{"jsonrpc": "2.0", "id": 1, "error": {"code": -32051, "message": "could not reach 's'"}}]
    transport = ScriptedTransport(
        [unreachable, DISCOVERED, [{"jsonrpc": "2.0", "id": 3, "error": unreachable[0]["error"]}]]
    )
    transport.outcomes[1] = [{"jsonrpc": "2.0", "id": 2, "result": DISCOVERED[0]["result"]}]
    session = UpstreamSession("s", transport)
    with pytest.raises(ServerUnavailable, match="could not reach"):
        await session.request("tools/list", None)
    assert session.revision == ""  # no era concluded from it
    with pytest.raises(ServerUnavailable):
        await session.request("tools/list", None)
    assert session.revision == "2026-07-28"


async def test_a_server_that_could_not_be_opened_is_reported_back_at_its_first_answer() -> None:
    """It dropped out of the aggregate's lists when it was not there; the first answer after tells the
    aggregate (REOPENED) that its lists may be back."""
    heard: list[str] = []
    transport = ScriptedTransport(
        [
            ServerUnavailable("s", "connection refused"),
            [{"jsonrpc": "2.0", "id": 2, "result": DISCOVERED[0]["result"]}],
            [{"jsonrpc": "2.0", "id": 3, "result": {"tools": []}}],
        ]
    )
    session = UpstreamSession("s", transport, lambda server, method, params: heard.append(method))
    with pytest.raises(ServerUnavailable):
        await session.request("tools/list", None)
    assert await session.request("tools/list", None) == {"tools": []}
    for _ in range(100):
        if heard:
            break
        await asyncio.sleep(0.01)
    assert heard == [REOPENED]


async def test_a_handshake_servers_requests_nobody_relays_are_answered_on_its_session() -> None:
    """On a call's stream: `ping` gets the empty result; a question for a capability the session did
    not declare gets -32601, as a client without the feature answers; then the call's result."""
    initialized = {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "serverInfo": {"name": "s", "version": "1"},
    }
    transport = ScriptedTransport(
        [
            TransportStatus(400),  # the probe: a handshake-only server
            [{"jsonrpc": "2.0", "id": 2, "result": initialized}],
            [],  # notifications/initialized: 202
            [
                {"jsonrpc": "2.0", "id": "s1", "method": "ping"},
                {
                    "jsonrpc": "2.0",
                    "id": "s2",
                    "method": "elicitation/create",
                    "params": {"message": "sure?"},
                },
                {"jsonrpc": "2.0", "id": 3, "result": {"content": []}},
            ],
            [],  # the answer to the ping
            [],  # the answer to the elicitation
        ]
    )
    session = UpstreamSession("s", transport)
    assert await session.request("tools/call", {"name": "t"}) == {"content": []}
    assert session.revision == "2025-06-18"  # the server's counter-offer, which we speak
    answers = [orjson.loads(b) for b in transport.bodies[4:]]
    assert answers == [
        {"jsonrpc": "2.0", "id": "s1", "result": {}},
        {
            "jsonrpc": "2.0",
            "id": "s2",
            "error": {"code": -32601, "message": "client does not support elicitation/create"},
        },
    ]
    call = orjson.loads(transport.bodies[3])
    assert "_meta" not in call["params"]  # no 2026-07-28 envelope for a handshake server
