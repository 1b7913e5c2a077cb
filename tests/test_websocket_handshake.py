"""The WebSocket handshake's headers each way and a refused upgrade (proxy/websocket/handshake.py),
without a socket. The handshake through real sockets is tests/test_websocket.py's."""

from __future__ import annotations

import aiohttp
import orjson
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.websocket.handshake import (
    client_handshake_headers,
    is_websocket_upgrade,
    refused_upgrade,
    requested_protocols,
)
from tests.factories import make_request

UPGRADE = {"Upgrade": "websocket", "Connection": "keep-alive, Upgrade"}


@pytest.mark.parametrize(
    ("method", "headers", "upgrade"),
    [
        ("GET", UPGRADE, True),
        ("GET", {"Upgrade": "h2c, WebSocket", "Connection": "upgrade"}, True),
        ("POST", UPGRADE, False),
        ("GET", {"Upgrade": "websocket"}, False),  # no Connection: upgrade
        ("GET", {"Connection": "upgrade"}, False),
    ],
)
def test_an_upgrade_is_a_get_asking_for_websocket(
    method: str, headers: dict[str, str], upgrade: bool
) -> None:
    assert is_websocket_upgrade(make_request(method, "/v1/responses", headers)) is upgrade


def test_the_subprotocols_asked_are_listed_in_order() -> None:
    headers = CIMultiDict([("Sec-WebSocket-Protocol", "a, b"), ("Sec-WebSocket-Protocol", " c ,")])
    assert requested_protocols(headers) == ["a", "b", "c"]
    assert requested_protocols({"Sec-WebSocket-Protocol": "a"}) == []  # (a plain dict has no getall)


def test_the_upstreams_101_headers_reach_the_client_minus_what_each_hop_negotiates() -> None:
    upstream = CIMultiDict(
        [
            ("x-request-id", "req_1"),
            ("openai-model", "gpt-5"),
            ("Sec-WebSocket-Accept", "abc"),
            ("Sec-WebSocket-Extensions", "permessage-deflate"),
            ("Date", "today"),
            ("Upgrade", "websocket"),
            ("Connection", "upgrade"),
        ]
    )
    assert dict(client_handshake_headers(upstream)) == {"x-request-id": "req_1", "openai-model": "gpt-5"}
    assert not client_handshake_headers(None)


def refusal(status: int, headers: CIMultiDict[str] | None = None) -> aiohttp.WSServerHandshakeError:
    return aiohttp.WSServerHandshakeError(
        None,
        (),
        status=status,
        message="Invalid response status",
        headers=CIMultiDictProxy(headers) if headers is not None else None,
    )


def test_a_refused_upgrade_answers_the_upstreams_status_and_headers() -> None:
    response = refused_upgrade(refusal(403, CIMultiDict({"x-request-id": "r", "Content-Type": "text/html"})))
    assert response.status == 403 and response.headers["x-request-id"] == "r"
    assert response.content_type == "application/json"
    body = orjson.loads(response.body)
    assert body["error"]["code"] == "websocket_upgrade_refused" and "HTTP 403" in body["error"]["message"]


@pytest.mark.parametrize("status", [101, 199, 600])
def test_an_upgrade_answered_wrongly_is_a_502(status: int) -> None:
    response = refused_upgrade(refusal(status))
    assert response.status == 502
    assert "wrongly" in orjson.loads(response.body)["error"]["message"]
