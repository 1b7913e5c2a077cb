"""Which intercepted hosts go through Tripwire, and under which upstream name (pure, no mitmproxy).

An entry is `[SCHEME://]HOST[:PORT]=TARGET`: TARGET is `default` (the default LLM upstream), another
LLM upstream name, or `mcp:NAME`. The upstream URL Tripwire forwards to is the original host
(`https://HOST[:PORT]` unless a scheme is given), so the agent reaches the API it asked for.
An entry without a port matches every port of its host.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

DEFAULT_HOSTS = ("api.openai.com=default", "api.anthropic.com=anthropic")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Intercept:
    host: str  # lower case, no brackets
    port: int | None  # None: any port
    scheme: Literal["http", "https"]  # of the upstream URL
    kind: Literal["llm", "mcp"]
    name: str  # Tripwire's upstream name (a path segment of /llm/NAME or /mcp/NAME)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = "" if self.port is None or self.port == _DEFAULT_PORTS[self.scheme] else f":{self.port}"
        return f"{self.scheme}://{host}{port}"

    @property
    def prefix(self) -> str:
        """The Tripwire route the request is re-pointed at (the original path goes after it)."""
        return f"/{self.kind}/{self.name}"


def parse_entry(text: str) -> Intercept:
    """Parse one `[SCHEME://]HOST[:PORT]=TARGET` entry; ValueError says what is wrong."""
    where, sep, target = text.strip().rpartition("=")
    if not sep or not where or not target:
        raise ValueError(f"expected [SCHEME://]HOST[:PORT]=NAME, got {text!r}")
    scheme = "https"
    if "://" in where:
        scheme, _, where = where.partition("://")
        if scheme not in ("http", "https"):
            raise ValueError(f"{text!r}: scheme must be http or https")
    host, port = _split_host(where.rstrip("/"), text)
    kind: Literal["llm", "mcp"] = "llm"
    if target.startswith("mcp:"):
        kind, target = "mcp", target[4:]
    if not _NAME.match(target):
        raise ValueError(f"{text!r}: upstream name {target!r} must be letters, digits, '.', '_' or '-'")
    return Intercept(host, port, scheme, kind, target)  # type: ignore[arg-type]


def _split_host(where: str, text: str) -> tuple[str, int | None]:
    if where.startswith("["):  # [::1]:8080
        host, _, rest = where[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif where.count(":") == 1:
        host, _, port_text = where.partition(":")
    else:
        host, port_text = where, ""
    if not host or "/" in host:
        raise ValueError(f"{text!r}: expected a host name, got {where!r}")
    if port_text and not (port_text.isdigit() and 0 < int(port_text) < 65536):
        raise ValueError(f"{text!r}: bad port {port_text!r}")
    return host.lower(), int(port_text) if port_text else None


def parse_host_map(entries: Iterable[str]) -> tuple[Intercept, ...]:
    """Parse every entry; one upstream name may stand for one URL only (it is one upstream)."""
    out: list[Intercept] = []
    urls: dict[tuple[str, str], str] = {}
    for text in entries:
        if not text.strip():
            continue
        entry = parse_entry(text)
        seen = urls.setdefault((entry.kind, entry.name), entry.url)
        if seen != entry.url:
            raise ValueError(f"{text!r}: {entry.kind} upstream {entry.name!r} is already {seen}")
        out.append(entry)
    return tuple(out)


def with_reverse_target(
    intercepts: Sequence[Intercept], scheme: str, host: str, port: int
) -> tuple[Intercept, ...]:
    """Reverse mode sends every request to one target: it is the default LLM upstream unless mapped.

    A map entry that already names the target's host wins; otherwise `default` is taken over by
    the target (in reverse mode no other host is ever seen).
    """
    if match(intercepts, host, port) is not None:
        return tuple(intercepts)
    if scheme not in ("http", "https"):
        raise ValueError(f"reverse mode to {scheme}:// cannot carry LLM or MCP calls")
    target = Intercept(host.lower(), port, scheme, "llm", "default")  # type: ignore[arg-type]
    return (target, *(i for i in intercepts if not (i.kind == "llm" and i.name == "default")))


def match(intercepts: Sequence[Intercept], host: str, port: int) -> Intercept | None:
    """The entry for a request's host and port: an exact port first, then a port-less entry."""
    host = host.lower().strip("[]")
    loose = None
    for entry in intercepts:
        if entry.host != host:
            continue
        if entry.port == port:
            return entry
        if entry.port is None and loose is None:
            loose = entry
    return loose
