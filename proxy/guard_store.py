"""Prevention config in force per agent: static sources below, what the admin API set on top (SPEC §5.4).

Two levels, as in LangSight: a project default for every agent, and whole-object agent overrides
(no partial merge). Each level has a static value (CLI, env, YAML, built-in defaults, resolved by
the caller) and may have an API value; the API value wins until it is deleted through the API.
API values are persisted in `<data_dir>/prevention-config.json` (temp file + `os.replace`), so a
restart keeps them. Reads are plain dict look-ups, cheap enough for every call.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import ValidationError

from proxy.guards.config import GuardConfig

log = logging.getLogger(__name__)

FILE_NAME = "prevention-config.json"
FORMAT_VERSION = 1

Source = Literal["api", "static", "default"]


class GuardStoreError(ValueError):
    """The persisted file cannot be used; the message names the file and the field."""


def validation_message(err: ValidationError) -> str:
    """One line per bad field, `section.field: why`, for API answers and start-up errors."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e.get("loc", ())) or "(body)"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)


def effective_config(
    agent: str,
    static_default: GuardConfig,
    static_agents: dict[str, GuardConfig],
    api_project: GuardConfig | None,
    api_agents: dict[str, GuardConfig],
) -> tuple[GuardConfig, bool]:
    """An agent's config in force, and whether it is an agent override: the API value of each
    level wins over the static one; an override replaces the project default whole (but inherits
    its `shadow` when it says nothing)."""
    project = api_project or static_default
    override = api_agents.get(agent) or static_agents.get(agent)
    if override is not None:
        return override.inheriting_shadow(project), True
    return project, False


def snapshot_bytes(project: GuardConfig | None, agents: dict[str, GuardConfig]) -> bytes:
    """The API-set configs as stored: `prevention-config.json`, and the shared state's snapshots."""
    snapshot = {
        "version": FORMAT_VERSION,
        "project": None if project is None else project.dump(),
        "agents": {name: cfg.dump() for name, cfg in sorted(agents.items())},
    }
    return orjson.dumps(snapshot, option=orjson.OPT_INDENT_2)


def parse_snapshot(raw: bytes, where: str) -> tuple[GuardConfig | None, dict[str, GuardConfig]]:
    """`snapshot_bytes` read back; errors name `where` and the field."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise GuardStoreError(f"{where}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise GuardStoreError(f"{where}: expected a JSON object")
    project = None
    try:
        if data.get("project") is not None:
            project = GuardConfig.model_validate(data["project"])
    except ValidationError as e:
        raise GuardStoreError(f"{where}: project.{validation_message(e)}") from e
    agents_raw = data.get("agents") or {}
    if not isinstance(agents_raw, dict):
        raise GuardStoreError(f"{where}: agents: expected an object")
    agents: dict[str, GuardConfig] = {}
    for name, body in agents_raw.items():
        try:
            agents[str(name)] = GuardConfig.model_validate(body)
        except ValidationError as e:
            raise GuardStoreError(f"{where}: agents.{name}.{validation_message(e)}") from e
    return project, agents


_EFFECTIVE_LIMIT = 4096  # agents whose config in force is kept (a name is any header value)


class GuardConfigStore:
    """Project default and agent overrides, static and API-set; sync, thread-safe, tiny."""

    def __init__(
        self,
        path: Path,
        static_default: GuardConfig,
        static_agents: dict[str, GuardConfig] | None = None,
    ) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._static_default = static_default
        self._static_agents: dict[str, GuardConfig] = dict(static_agents or {})
        self._api_project: GuardConfig | None = None
        self._api_agents: dict[str, GuardConfig] = {}
        # with shared state (several replicas): what shares the API values after each API write
        self.publisher: Callable[[GuardConfig | None, dict[str, GuardConfig]], Awaitable[None]] | None = None
        self._load()
        # agent -> `effective(agent)`, until the next write
        self._effective: dict[str, tuple[GuardConfig, bool]] = {}

    # --- reads -------------------------------------------------------------------------------

    def effective(self, agent: str) -> tuple[GuardConfig, bool]:
        """The config the agent's next call uses, and whether it is an agent override.

        Asked on every call: kept per agent until the next write (an override inheriting the
        project's `shadow` is then one object, not a copy per call the guards compare field by field)."""
        kept = self._effective  # (a write replaces the dict: a read racing it fills the old one)
        found = kept.get(agent)
        if found is None:
            found = effective_config(
                agent, self._static_default, self._static_agents, self._api_project, self._api_agents
            )
            if len(kept) >= _EFFECTIVE_LIMIT:
                kept.clear()
            kept[agent] = found
        return found

    def project(self) -> GuardConfig:
        """The project default in force (API value, else the static one)."""
        return self._api_project or self._static_default

    def project_source(self) -> Source:
        return "api" if self._api_project is not None else "static"

    def agent_source(self, agent: str) -> Source:
        """Where the agent's effective config comes from ("default" = the project default)."""
        if agent in self._api_agents:
            return "api"
        if agent in self._static_agents:
            return "static"
        return "default"

    def configured_agents(self) -> list[str]:
        """Agents that have an override, static or API-set, sorted."""
        return sorted(set(self._api_agents) | set(self._static_agents))

    # --- writes (the admin API) --------------------------------------------------------------

    def put_agent(self, agent: str, config: GuardConfig) -> None:
        with self._lock:
            self._commit(self._api_project, {**self._api_agents, agent: config})

    def delete_agent(self, agent: str) -> bool:
        """Drop the API override; a static override for the agent, if any, applies again."""
        with self._lock:
            if agent not in self._api_agents:
                return False
            self._commit(self._api_project, {k: v for k, v in self._api_agents.items() if k != agent})
            return True

    def put_project(self, config: GuardConfig) -> None:
        with self._lock:
            self._commit(config, self._api_agents)

    def delete_project(self) -> bool:
        """Return the project default to the static configuration."""
        with self._lock:
            if self._api_project is None:
                return False
            self._commit(None, self._api_agents)
            return True

    def api_values(self) -> tuple[GuardConfig | None, dict[str, GuardConfig]]:
        """What the API set: the project default (or None) and the agent overrides."""
        return self._api_project, dict(self._api_agents)

    async def publish(self) -> None:
        """After an API write: share it with the other replicas (no-op without shared state)."""
        if self.publisher is not None:
            await self.publisher(*self.api_values())

    def replace_api(self, project: GuardConfig | None, agents: dict[str, GuardConfig]) -> None:
        """Another replica changed the API values (shared state): take them, persisted here too."""
        with self._lock:
            if (project, agents) != (self._api_project, self._api_agents):
                self._commit(project, dict(agents))

    # --- persistence -------------------------------------------------------------------------

    def _commit(self, project: GuardConfig | None, agents: dict[str, GuardConfig]) -> None:
        """Persist the new API values, then put them in force: a failed write (OSError: a full or
        read-only disk) changes nothing, so the caller's error answer tells the truth."""
        self._write(snapshot_bytes(project, agents))
        self._api_project, self._api_agents = project, agents
        self._effective = {}

    def _write(self, data: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def _load(self) -> None:
        """Read what the API set before a restart; a bad file refuses start rather than guess."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        self._api_project, self._api_agents = parse_snapshot(raw, str(self.path))
        log.info(
            "guard_store.loaded path=%s project=%s agents=%d",
            self.path,
            self._api_project is not None,
            len(self._api_agents),
        )


# Keys of LangSight's GET answer that a client may send back unchanged in a PUT.
_ECHO_KEYS = ("agent_name", "is_agent_override", "source")


def config_from_body(body: Any) -> GuardConfig:
    """A PUT body (LangSight's shape, our extra sections optional) -> GuardConfig.

    Raises ValidationError naming the field; a non-object body is refused the same way.
    """
    if not isinstance(body, dict):
        return GuardConfig.model_validate(body)  # raises: the model wants an object
    clean = {k: v for k, v in body.items() if k not in _ECHO_KEYS}
    return GuardConfig.model_validate(clean)


def config_body(agent: str | None, config: GuardConfig, is_override: bool, source: Source) -> dict[str, Any]:
    """The GET answer: LangSight's `agent_name`, `is_agent_override` and the sections."""
    return {
        "agent_name": agent,
        "is_agent_override": is_override,
        **config.model_dump(mode="json"),
        "source": source,
    }
