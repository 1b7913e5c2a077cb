"""Prevention configs set through the admin API, shared by replicas by revision (SPEC §5.4, §8).

A PUT or DELETE on any replica publishes a whole snapshot of the API-set values (the format of
`prevention-config.json`) as a new revision. Every guard-log entry is stamped with the revision in
force when it was appended, so every replica judges it under the same config, and a change made on
one replica applies on all of them from the next call. Static sources (CLI, env, YAML) are each
replica's own: give replicas the same ones (one ConfigMap).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from proxy.guard_store import effective_config, parse_snapshot, snapshot_bytes
from proxy.guards.config import GuardConfig
from proxy.state.base import StateBackend

log = logging.getLogger("tripwire.state")

ApiConfigs = tuple[GuardConfig | None, dict[str, GuardConfig]]  # (project default, agent overrides)
NO_API_CONFIG: ApiConfigs = (None, {})


class SharedConfigs:
    def __init__(
        self,
        backend: StateBackend,
        static_default: GuardConfig,
        static_agents: dict[str, GuardConfig] | None = None,
    ) -> None:
        self.backend = backend
        self.static_default = static_default
        self.static_agents = dict(static_agents or {})
        self._by_rev: dict[int, ApiConfigs] = {0: NO_API_CONFIG}
        self.current = 0  # the newest revision seen
        self.listeners: list[Callable[[int], None]] = []  # told of each newer revision loaded

    def known(self, revision: int) -> bool:
        return revision in self._by_rev

    async def load(self, revision: int | None = None) -> int:
        """Fetch a revision's snapshot (None: the current one) unless it is cached; returns it."""
        if revision is not None and revision in self._by_rev:
            return revision
        rev, raw = await self.backend.config_snapshot(revision)
        self._remember(rev, raw)
        return rev

    def _remember(self, rev: int, raw: bytes | None) -> None:
        # an expired old snapshot reads as "no API config": replicas all read the same thing
        self._by_rev[rev] = (
            NO_API_CONFIG if raw is None else parse_snapshot(raw, f"shared config revision {rev}")
        )
        if rev > self.current:
            self.current = rev
            for listener in self.listeners:
                listener(rev)

    async def publish(self, project: GuardConfig | None, agents: dict[str, GuardConfig]) -> int:
        raw = snapshot_bytes(project, agents)
        rev = await self.backend.publish_config(raw, after=self.current)
        self._remember(rev, raw)
        return rev

    async def restore_if_lost(self, newest_in_log: int) -> None:
        """Entries are stamped with an older revision than one already seen: Redis lost the configs
        (restarted without its data). Publish the newest known snapshot again, above it."""
        if newest_in_log >= self.current or self.current == 0:
            return
        project, agents = self.api(self.current)
        log.warning(
            "state.config_restored: the shared config revision went back from %d to %d; publishing it again",
            self.current,
            newest_in_log,
        )
        await self.publish(project, agents)

    def api(self, revision: int) -> ApiConfigs:
        return self._by_rev.get(revision, NO_API_CONFIG)

    def effective(self, revision: int, agent: str) -> tuple[GuardConfig, bool]:
        """The agent's config under a revision (load it first)."""
        project, agents = self.api(revision)
        return effective_config(agent, self.static_default, self.static_agents, project, agents)
