"""`PerAgent`: a map keyed by (agent, key), kept as one dict per agent.

The session manager indexes each automatic run by the digest of the history it saw and the key of
the answer it gave, per agent (proxy/sessions.py). Keyed by an (agent, digest) tuple, each entry
held a 56-byte tuple for the idle timeout, and a stateless service's every call is a run with one of
each (issue 33); one dict per agent holds the digest itself. Reads as the flat dict it stands for:
`index[(agent, key)]`, `len`, truthiness.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class PerAgent(Generic[K, V]):
    __slots__ = ("_agents",)

    def __init__(self) -> None:
        self._agents: dict[str, dict[K, V]] = {}

    def get(self, agent: str, key: K) -> V | None:
        keys = self._agents.get(agent)
        return None if keys is None else keys.get(key)

    def set(self, agent: str, key: K, value: V) -> None:
        keys = self._agents.get(agent)
        if keys is None:
            keys = self._agents[agent] = {}
        keys[key] = value

    def pop(self, agent: str, key: K) -> V | None:
        """Remove and return the value (None when there is none); an agent left with none is dropped."""
        keys = self._agents.get(agent)
        if keys is None:
            return None
        value = keys.pop(key, None)
        if not keys:
            del self._agents[agent]
        return value

    def of(self, agent: str) -> dict[K, V] | None:
        """The agent's dict, to read or remove from in a loop (`drop_empty` it after removing)."""
        return self._agents.get(agent)

    def drop_empty(self, agent: str) -> None:
        keys = self._agents.get(agent)
        if keys is not None and not keys:
            del self._agents[agent]

    def __getitem__(self, agent_key: tuple[str, K]) -> V:
        return self._agents[agent_key[0]][agent_key[1]]

    def __contains__(self, agent_key: object) -> bool:
        if not isinstance(agent_key, tuple) or len(agent_key) != 2:
            return False
        keys = self._agents.get(agent_key[0])
        return keys is not None and agent_key[1] in keys

    def __len__(self) -> int:
        return sum(len(keys) for keys in self._agents.values())

    def __bool__(self) -> bool:
        return bool(self._agents)  # (no agent is kept with an empty dict)

    def __repr__(self) -> str:
        return f"PerAgent({self._agents!r})"
