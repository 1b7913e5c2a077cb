"""Which server owns a resource URI on the aggregate `/mcp` (issue 30, break 7).

Pure. Resources keep their URIs (they are not prefixed as tools are), so two servers may claim the
same one. A hostile server must not take over another's: a URI listed by two servers is owned by
neither (a read names both and is refused); a URI template owns only URIs it matches whole, and
only when its literal start names a scheme (`{uri}` or `{+anything}` would match everything: never
an owner); among templates that match, the longest literal start wins, and a tie between two
servers is refused too. A concrete listing always beats a template.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# RFC 6570 expressions: `{var}` (unreserved characters), `{+var}` / `{#var}` (reserved too), the rest
_EXPRESSION = re.compile(r"\{([+#./;?&]?)[^}]*\}")
_SIMPLE = r"[^/?#]*"
_ANY = r".*"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


@dataclass(frozen=True, slots=True)
class Ambiguous:
    """Two servers claim the URI: refused, naming them."""

    servers: tuple[str, ...]


@dataclass(slots=True)
class _Template:
    server: str
    pattern: re.Pattern[str]
    literal: int  # length of the literal start, before the first expression


def _compile(template: str) -> tuple[re.Pattern[str], int] | None:
    """A template as a whole-URI regex and its literal start's length; None when it could own any
    URI (its literal start names no scheme)."""
    first = _EXPRESSION.search(template)
    literal = template[: first.start()] if first else template
    if not _SCHEME.match(literal):
        return None
    parts: list[str] = []
    at = 0
    for m in _EXPRESSION.finditer(template):
        parts.append(re.escape(template[at : m.start()]))
        parts.append(_SIMPLE if m.group(1) == "" else _ANY)
        at = m.end()
    parts.append(re.escape(template[at:]))
    return re.compile("".join(parts)), len(literal)


@dataclass
class ResourceOwners:
    """A client session's view of who owns which URIs, from the lists its servers gave."""

    uris: dict[str, str | Ambiguous] = field(default_factory=dict)
    templates: dict[tuple[str, str], _Template] = field(default_factory=dict)  # (server, template)
    listed: bool = False  # both lists were read once in this session

    def resource(self, uri: str, server: str) -> None:
        known = self.uris.get(uri)
        if known is None or known == server:
            self.uris[uri] = server
        elif isinstance(known, Ambiguous):
            if server not in known.servers:
                self.uris[uri] = Ambiguous((*known.servers, server))
        else:
            self.uris[uri] = Ambiguous((known, server))

    def template(self, template: str, server: str) -> bool:
        """Remember `server`'s template; False when it is too broad to own anything (left out)."""
        compiled = _compile(template)
        if compiled is None:
            return False
        self.templates[(server, template)] = _Template(server, *compiled)
        return True

    def owner(self, uri: str) -> str | Ambiguous | None:
        known = self.uris.get(uri)
        if known is not None:
            return known
        best: list[_Template] = []
        for t in self.templates.values():
            if not t.pattern.fullmatch(uri):
                continue
            if not best or t.literal > best[0].literal:
                best = [t]
            elif t.literal == best[0].literal:
                best.append(t)
        servers = tuple(dict.fromkeys(t.server for t in best))
        if not servers:
            return None
        return servers[0] if len(servers) == 1 else Ambiguous(servers)
