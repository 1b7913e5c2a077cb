"""The upstream registry: where a route's calls go (SPEC §3).

The configured upstreams (the default LLM API, `llm:` and `mcp:` names) plus those registered at
run time: a `--mcp-stdio` child's loopback URL, or a host the mitmproxy addon intercepts.
"""

from __future__ import annotations

from typing import Literal

from proxy.settings import Settings, UpstreamConfig

Kind = Literal["llm", "mcp"]


class UpstreamRegistry:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.registered: dict[tuple[str, str], UpstreamConfig] = {}
        self._names: dict[str, tuple[str, ...]] = {}  # per kind; every call's routing reads them

    def get(self, kind: str, name: str) -> UpstreamConfig:
        """The upstream of a resolved route (routing only resolves names this registry knows)."""
        registered = self.registered.get((kind, name))
        if registered is not None:
            return registered
        if kind == "llm":
            return self.settings.upstream if name == "default" else self.settings.llm[name]
        return self.settings.mcp[name]

    def names(self, kind: Kind) -> tuple[str, ...]:
        """The named upstreams of a kind, sorted (the default LLM API is /v1, not a name)."""
        names = self._names.get(kind)
        if names is None:
            found = set(self.settings.upstreams(kind)) | {n for k, n in self.registered if k == kind}
            names = self._names[kind] = tuple(sorted(found))
        return names

    def register(self, kind: Kind, name: str, upstream: UpstreamConfig) -> None:
        self.registered[(kind, name)] = upstream
        self._names.clear()

    def unregister(self, kind: Kind, name: str) -> None:
        self.registered.pop((kind, name), None)
        self._names.clear()
