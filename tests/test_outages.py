"""The unreachable-upstream sentence and the once-per-outage log (proxy/outages.py, issue 25)."""

from __future__ import annotations

import errno
import logging
import socket

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey
from yarl import URL

from proxy.outages import OutageLog, host_port, unreachable_message


def key(host: str, port: int) -> ConnectionKey:
    return ConnectionKey(host, port, False, True, None, None, None)


def test_the_answer_names_upstream_host_port_and_cause() -> None:
    refused = aiohttp.ClientConnectorError(
        key("10.1.2.3", 8000), ConnectionRefusedError(errno.ECONNREFUSED, "x")
    )
    assert unreachable_message("default", URL("http://10.1.2.3:8000/v1/chat"), refused) == (
        "Tripwire could not reach the upstream 'default' at 10.1.2.3:8000: connection refused (ClientConnectorError)"
    )
    dns = aiohttp.ClientConnectorDNSError(
        key("api.nowhere.invalid", 443), socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    )
    assert unreachable_message("anthropic", URL("https://api.nowhere.invalid/v1/messages"), dns) == (
        "Tripwire could not reach the upstream 'anthropic' at api.nowhere.invalid:443: "
        "name or service not known (ClientConnectorDNSError)"
    )
    broke = aiohttp.ServerDisconnectedError()
    assert unreachable_message("default", "http://[::1]:9/v1", broke) == (
        "Tripwire could not reach the upstream 'default' at [::1]:9: Server disconnected (ServerDisconnectedError)"
    )
    assert host_port("https://api.openai.com/v1") == "api.openai.com:443"


def test_one_warning_per_outage_and_one_line_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    outages = OutageLog(logging.getLogger("tripwire.test_outages"))
    with caplog.at_level(logging.INFO, logger="tripwire.test_outages"):
        outages.answered("llm", "default")  # no outage: nothing to say
        for _ in range(3):
            outages.failed("llm", "default", "cannot reach default")
        outages.failed("mcp", "files", "cannot reach files")
        outages.answered("llm", "default")
        outages.answered("llm", "default")
        outages.failed("llm", "default", "cannot reach default again")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "cannot reach default; further failures are not logged until it answers again"),
        ("WARNING", "cannot reach files; further failures are not logged until it answers again"),
        ("INFO", "upstream 'default' answers again (3 calls failed to reach it)"),
        ("WARNING", "cannot reach default again; further failures are not logged until it answers again"),
    ]
