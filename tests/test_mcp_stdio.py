"""`--mcp-stdio`: the SDK's own stdio server as a child process, served at /mcp/NAME over Streamable
HTTP with the same recording; restarted when it dies, stopped with Tripwire."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x

from mcp import Client  # noqa: E402

from tests.conftest import StartTripwire  # noqa: E402

SERVER = Path(__file__).with_name("mcp_servers.py")


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_stdio_server_served_recorded_and_restarted(start_tripwire: StartTripwire, mode: str) -> None:
    tw = await start_tripwire(mcp_stdio={"local": {"command": f"{sys.executable} {SERVER} stdio"}})
    await tw.engine.start_children()
    try:
        bridge = tw.engine.stdio.bridges["local"]
        url = f"{tw.url}/agents/bot/sessions/s1/mcp/local"
        async with Client(url, mode=mode, cache=None) as client:  # type: ignore[arg-type]
            tools = await client.list_tools()
            added = await client.call_tool("add", {"a": 20, "b": 22})
            exploded = await client.call_tool("explode", {"reason": "stdio"})
            assert bridge.proc is not None
            first_pid = bridge.proc.pid
            os.kill(first_pid, 9)  # the child dies; Tripwire restarts it and replays the handshake
            for _ in range(600):
                if bridge.proc.pid != first_pid and bridge.ready.is_set():
                    break
                await asyncio.sleep(0.05)
            again = await client.call_tool("echo", {"text": "still here"})
        await tw.flush()
    finally:
        await tw.engine.stop_children()

    assert {t.name for t in tools.tools} == {"add", "echo", "slow_count", "explode"}
    assert added.structured_content == {"result": 42}
    assert exploded.is_error is True
    assert again.content[0].text == "echo: still here"
    assert bridge.restarts == 1
    assert bridge.proc.returncode is not None  # stopped with Tripwire
    assert ("mcp", "local") not in tw.engine.upstreams.registered
    calls = [e for e in tw.events() if e["event_type"] == "TOOL_CALL"]
    assert [(e["name"], e["payload"]["status"]) for e in calls] == [
        ("add", "ok"),
        ("explode", "error"),
        ("echo", "ok"),
    ]
    assert all(e["payload"]["server"] == "local" for e in calls)


def children_of(pid: int) -> dict[int, str]:
    """The process's children: pid -> command line (its stdio servers, its trace writer's disk process)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out[int(stat.parent.name)] = (
                    (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                )
        except OSError:
            continue
    return out


async def test_tripwire_serve_starts_and_stops_its_stdio_children(tmp_path: Path) -> None:
    """`tripwire serve --mcp-stdio NAME="CMD ARGS"` as a real process: announced, served, and the
    child is gone once Tripwire stops on SIGTERM."""
    import signal

    from tests.test_process import start_serve

    (tmp_path / "data").mkdir()
    command = f"{sys.executable} {SERVER} stdio"
    proc, url, banner = await start_serve(
        tmp_path / "data", "http://127.0.0.1:9", "--mcp-stdio", f"local={command}"
    )
    assert proc.stdout is not None
    drain = asyncio.create_task(proc.stdout.read())  # the child's stderr shares this pipe: keep it flowing
    try:
        assert "/mcp/local" in banner
        children = children_of(proc.pid)
        (child,) = [pid for pid, command in children.items() if str(SERVER) in command]
        async with Client(f"{url}/mcp/local", mode="legacy", cache=None) as client:
            added = await client.call_tool("add", {"a": 3, "b": 4})
        assert added.structured_content == {"result": 7}
        assert f"all as one: {url}/mcp " in banner  # the aggregate endpoint, stdio children included
        async with Client(f"{url}/mcp", mode="auto", cache=None) as client:
            added = await client.call_tool("local__add", {"a": 4, "b": 4})
        assert added.structured_content == {"result": 8}
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
        await drain
    assert proc.returncode == 0
    for pid in children:  # the stdio server, and the trace writer's disk process alike
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_a_child_that_dies_at_once_after_a_restart_is_restarted_again(
    start_tripwire: StartTripwire, tmp_path: Path
) -> None:
    """The replayed initialize meets a dead child: the next restart follows its back-off, not a
    10 s wait for an answer that cannot come (nor a supervisor killed by a broken pipe)."""

    wrapper = tmp_path / "flaky.py"
    wrapper.write_text(
        "import os, sys\n"
        f"count = {str(tmp_path / 'starts')!r}\n"
        "n = int(open(count).read()) + 1 if os.path.exists(count) else 1\n"
        "open(count, 'w').write(str(n))\n"
        "if n == 2:\n"
        "    sys.exit(3)  # the first restart dies before reading anything\n"
        f"os.execv(sys.executable, [sys.executable, {str(SERVER)!r}, 'stdio'])\n"
    )
    tw = await start_tripwire(mcp_stdio={"local": {"command": f"{sys.executable} {wrapper}"}})
    await tw.engine.start_children()
    try:
        bridge = tw.engine.stdio.bridges["local"]
        async with Client(f"{tw.url}/mcp/local", mode="legacy", cache=None) as client:
            assert (await client.call_tool("add", {"a": 1, "b": 1})).structured_content == {"result": 2}
            assert bridge.proc is not None
            os.kill(bridge.proc.pid, 9)
            for _ in range(600):  # generous: two back-offs and two child start-ups on a busy machine
                if bridge.restarts == 2 and bridge.ready.is_set():
                    break
                await asyncio.sleep(0.05)
            again = await client.call_tool("echo", {"text": "back"})
    finally:
        await tw.engine.stop_children()
    assert bridge.restarts == 2
    # the dead child ended the replayed initialize's wait at once: no wait ran into its timeout
    assert bridge.replay_timeouts == 0
    assert again.content[0].text == "echo: back"


async def test_a_refused_initialize_is_not_replayed_into_a_restarted_child(
    start_tripwire: StartTripwire,
) -> None:
    """An mcp 2.x client in auto mode that gave up on a slow `server/discover` falls back to
    `initialize`, which the child, already serving the 2026-07-28 era, refuses. That handshake must
    not be replayed after a restart: the child would serve the handshake era and refuse every
    enveloped request of the client (a race seen on a busy machine, reproduced here on purpose)."""
    import aiohttp

    tw = await start_tripwire(mcp_stdio={"local": {"command": f"{sys.executable} {SERVER} stdio"}})
    await tw.engine.start_children()
    init = {
        "jsonrpc": "2.0",
        "id": "late-init",
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    try:
        bridge = tw.engine.stdio.bridges["local"]
        url = f"{tw.url}/mcp/local"
        async with Client(url, mode="auto", cache=None) as client:
            assert (await client.call_tool("add", {"a": 1, "b": 2})).structured_content == {"result": 3}
            headers = {"Accept": "application/json, text/event-stream"}
            async with aiohttp.ClientSession() as http, http.post(url, json=init, headers=headers) as r:
                refused = await r.json()
            assert "error" in refused  # the modern child refuses the late handshake
            assert bridge.initialize is None
            assert bridge.proc is not None
            first_pid = bridge.proc.pid
            os.kill(first_pid, 9)
            for _ in range(600):
                if bridge.proc.pid != first_pid and bridge.ready.is_set():
                    break
                await asyncio.sleep(0.05)
            again = await client.call_tool("echo", {"text": "modern still"})
    finally:
        await tw.engine.stop_children()
    assert again.content[0].text == "echo: modern still"


async def test_a_batch_of_one_is_answered_as_a_batch(start_tripwire: StartTripwire) -> None:
    """2025-03-26 batches: the bridge writes each message to the child; a batch of one request gets
    an array back (a bare object is not the answer to a batch)."""
    import aiohttp

    tw = await start_tripwire(mcp_stdio={"local": {"command": f"{sys.executable} {SERVER} stdio"}})
    await tw.engine.start_children()
    init = {
        "jsonrpc": "2.0",
        "id": "i-1",
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-03-26",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    headers = {"Accept": "application/json, text/event-stream"}
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{tw.url}/mcp/local", json=[init], headers=headers) as r:
                batch = await r.json()
            async with http.post(f"{tw.url}/mcp/local", json={**init, "id": 2}, headers=headers) as r:
                single = await r.json()
    finally:
        await tw.engine.stop_children()
    assert isinstance(batch, list) and [m["id"] for m in batch] == ["i-1"]
    assert single["id"] == 2 and "serverInfo" in single["result"]
