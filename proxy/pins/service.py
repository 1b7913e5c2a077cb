"""The pins service: each MCP server's pinned tool definitions, judged on every `tools/list` answer
and every `tools/call` (docs/mcp.md "Changed tools").

A list's answer is rewritten synchronously as it passes (proxy/mcp/hub.py `rewrite_answer`), so
the server's pins are read from the store *before* the request is forwarded (`refresh`, awaited in
the parse stage) and judged from memory when the answer comes; the writes go to the store in the
background. A call reads pins at most `CALL_REFRESH_S` old: a person's decision on another
replica applies here within that time.

Findings are written to the trace by the next `tools/call` of the same agent and session (a list
opens no run, SPEC §3): `flush` writes them as STATE_UPDATEs before that call is judged.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import Counter

from proxy.guards.config import GuardConfig, ServerPinsConfig
from proxy.pins import decide
from proxy.pins.decide import CallVerdict, Change, Finding, PinPolicy, ServerPins, Write
from proxy.pins.store import FilePinStore, PinStore, RedisPinStore

log = logging.getLogger("tripwire.pins")

CALL_REFRESH_S = 1.0  # a call judges pins at most this old (another replica's decision)
MAX_DEFERRED = 256  # findings kept per agent and session for its next call
MAX_KEYS = 1024  # agents and sessions with findings waiting; the oldest goes past it

DeferredKey = tuple[str, str | None]


class Pins:
    def __init__(
        self,
        store: PinStore,
        guard_config: Callable[[str], GuardConfig],
        server_config: Mapping[str, ServerPinsConfig | None],
        registry: Any = None,
    ) -> None:
        self.store = store
        self.guard_config = guard_config
        self.server_config = dict(server_config)
        self._cache: dict[str, tuple[ServerPins, float]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._deferred: collections.OrderedDict[DeferredKey, list[Finding]] = collections.OrderedDict()
        self.findings = (
            Counter(
                "tripwire_tool_pin_findings",
                "Tool-definition findings on MCP lists (tool_pinned, tool_changed, tool_added, "
                "hidden_instructions) by server and the action the agent's config took.",
                ["server", "kind", "action"],
                registry=registry,
            )
            if registry is not None
            else None
        )

    # --- config ----------------------------------------------------------------------------------

    def policy(self, agent: str, server: str) -> PinPolicy:
        agent_config = self.guard_config(agent).tool_pins
        own = self.server_config.get(server)
        if own is None:
            return PinPolicy(
                agent_config.tool_changes, agent_config.tool_added, agent_config.hidden_instructions
            )
        return PinPolicy(
            own.tool_changes or agent_config.tool_changes,
            own.tool_added or agent_config.tool_added,
            own.hidden_instructions or agent_config.hidden_instructions,
        )

    # --- reading -------------------------------------------------------------------------------

    def cached(self, server: str) -> ServerPins:
        found = self._cache.get(server)
        return found[0] if found is not None else ServerPins(server)

    async def refresh(self, server: str, max_age_s: float = 0.0) -> ServerPins:
        """The server's pins, read again when older than `max_age_s` (the store unreadable: the last
        read, logged: a pin store outage must not stop MCP traffic)."""
        found = self._cache.get(server)
        now = time.monotonic()
        if found is not None and now - found[1] <= max_age_s:
            return found[0]
        writing = [t for t in self._tasks if t.get_name() == _write_task_name(server)]
        if writing:  # what this process wrote last must be in what it reads back
            await asyncio.gather(*writing, return_exceptions=True)
        try:
            pins = await self.store.load(server)
        except Exception as e:
            log.warning("pins of %r could not be read (%r): judged against the last read", server, e)
            return self.cached(server)
        self._cache[server] = (pins, now)
        return pins

    # --- judging ---------------------------------------------------------------------------------

    async def list_filter(
        self, server: str, agent: str, session: str | None, shadow: bool
    ) -> Callable[[dict[str, Any]], dict[str, Any] | None] | None:
        """For a `tools/list` about to be forwarded: the pins read fresh, and what judges its
        answer (None: pins are off for this agent and server). In shadow mode findings are kept and
        nothing is left out."""
        if self.policy(agent, server).off:
            return None
        await self.refresh(server)

        def judge(msg: dict[str, Any]) -> dict[str, Any] | None:
            kept = self.judge_list_answer(msg, server, agent, session)
            return None if shadow else kept

        return judge

    def judge_list_answer(
        self, msg: dict[str, Any], server: str, agent: str, session: str | None
    ) -> dict[str, Any] | None:
        """A `tools/list` response of `server` for `agent`: the findings noted and the pins written;
        the answer without the tools held back (None: relayed unchanged)."""
        result = msg.get("result")
        listed = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(result, dict) or not isinstance(listed, list):
            return None
        policy = self.policy(agent, server)
        if policy.off:
            return None
        pins = self.cached(server)
        verdict = decide.judge_list(pins, listed, policy, time.time(), last_page=not result.get("nextCursor"))
        if verdict.writes:
            self._write(server, verdict.writes)
        for finding in verdict.findings:
            self._note(agent, session, finding)
        if not verdict.hidden:
            return None
        kept = [t for t in listed if not (isinstance(t, dict) and t.get("name") in verdict.hidden)]
        return {**msg, "result": {**result, "tools": kept}}

    def judge_call(self, server: str, tool: str, agent: str) -> tuple[CallVerdict, Change | None]:
        policy = self.policy(agent, server)
        if policy.off:
            return "allow", None
        return decide.judge_call(self.cached(server), tool, policy)

    # --- a person's decisions ------------------------------------------------------------------

    async def approve(self, server: str, tool: str, expected_hash: str | None = None) -> bool:
        pins = await self.refresh(server)
        writes = decide.approve(pins, tool, time.time(), expected_hash)
        await self._write_now(server, writes)
        return bool(writes)

    async def deny(self, server: str, tool: str, expected_hash: str | None = None) -> bool:
        pins = await self.refresh(server)
        writes = decide.deny(pins, tool, expected_hash)
        await self._write_now(server, writes)
        return bool(writes)

    async def reset(self, server: str) -> None:
        await self.store.reset(server)
        self._cache[server] = (ServerPins(server), time.monotonic())

    async def snapshot(self) -> list[dict[str, Any]]:
        servers = sorted(set(await self.store.servers()) | set(self.server_config))
        return [(await self.refresh(s)).to_json() for s in servers]

    # --- findings --------------------------------------------------------------------------------

    def count(self, finding: Finding) -> None:
        if self.findings is not None:
            self.findings.labels(finding.server, finding.kind, finding.action).inc()

    def _note(self, agent: str, session: str | None, finding: Finding) -> None:
        if finding.kind != decide.TOOL_PINNED:
            log.warning(
                "MCP server %r: %s %s (%s)",
                finding.server,
                finding.kind,
                ", ".join(finding.tools),
                finding.action,
            )
        self.count(finding)
        if finding.kind == decide.TOOL_PINNED:
            # a server's first pins are its own, not any one run's (`GET /api/pins` lists them); a
            # run gets `tool_pinned` when a person's approval re-pins a tool during it
            return
        key = (agent, session)
        waiting = self._deferred.pop(key, [])
        waiting.append(finding)
        self._deferred[key] = waiting[-MAX_DEFERRED:]
        while len(self._deferred) > MAX_KEYS:
            self._deferred.popitem(last=False)

    def take_findings(self, agent: str, session: str | None) -> list[Finding]:
        """The findings of lists this agent and session made since its last call (for its run)."""
        return self._deferred.pop((agent, session), [])

    # --- writing ---------------------------------------------------------------------------------

    def _write(self, server: str, writes: list[Write]) -> None:
        """Applied here at once (the next answer is judged with them), stored in the background."""
        pins, read_at = self._cache.get(server, (ServerPins(server), time.monotonic()))
        self._cache[server] = (decide.apply(pins, writes), read_at)
        task = asyncio.get_running_loop().create_task(
            self._store(server, writes), name=_write_task_name(server)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _store(self, server: str, writes: list[Write]) -> None:
        try:
            await self.store.write(server, writes)
        except Exception as e:
            log.warning("pins of %r not stored (%r): kept in memory only", server, e)

    async def _write_now(self, server: str, writes: list[Write]) -> None:
        if not writes:
            return
        pins, _ = self._cache.get(server, (ServerPins(server), 0.0))
        self._cache[server] = (decide.apply(pins, writes), time.monotonic())
        await self.store.write(server, writes)

    async def flush(self) -> None:
        """Every write made so far is in the store."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        await self.flush()
        await self.store.close()


def _write_task_name(server: str) -> str:
    return f"tripwire-pins-write-{server}"


def pins_for(settings: Any, guard_config: Callable[[str], GuardConfig], registry: Any = None) -> Pins:
    """In Redis with shared state (every replica judges against the same pins), else the data dir."""
    store: PinStore = (
        RedisPinStore(settings.state.url)
        if settings.state.url
        else FilePinStore(settings.resolved_data_dir())
    )
    own = {name: c.tool_pins for name, c in {**settings.mcp, **settings.mcp_stdio}.items()}
    return Pins(store, guard_config, own, registry)
