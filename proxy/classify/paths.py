"""A client's path as Tripwire reads it and forwards it: decoded and normalised once (issue 30).

Pure. `/v1/chat%2Fcompletions`, `/v1//chat/completions`, `/v1/chat/completions;x=1` and
`/v1/chat/completions%20` all name `/v1/chat/completions`: an upstream may well read them so, and a
path Tripwire did not recognise used to be relayed unjudged. So the path is decoded, cut into
segments, and each segment loses its `;parameters` and surrounding whitespace; empty segments go
(a trailing slash stays). What the upstream receives is this path, re-encoded.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

# what stays unencoded in a forwarded segment: RFC 3986's pchar minus ';' (parameters are dropped)
_SAFE = "!$&'()*+,=:@-._~"


def segments(raw: list[str]) -> list[str]:
    """The decoded, normalised segments of the raw segments of a path (after its first `/`)."""
    out: list[str] = []
    for part in raw:
        decoded = unquote(part)
        # a decoded '/' separates segments as a literal one does
        for piece in decoded.split("/"):
            piece = piece.split(";", 1)[0].strip()
            if piece:
                out.append(piece)
    return out


def normalised(raw: list[str]) -> str:
    """The upstream path of the raw segments `raw`: `/` + normalised segments, re-encoded; a
    trailing slash kept (some servers tell `/mcp/` from `/mcp`); `""` for no segment at all."""
    found = segments(raw)
    path = "/" + "/".join(quote(s, safe=_SAFE) for s in found)
    if found and raw and raw[-1] == "":
        path += "/"
    return path if raw else ""


def has_dot_segment(raw: list[str]) -> bool:
    """`.` or `..` (also percent-encoded, or hidden behind `;params` or spaces): it would climb out
    of the API's base path on the upstream."""
    for part in raw:
        for piece in unquote(part).split("/"):
            if piece.split(";", 1)[0].strip() in (".", ".."):
                return True
    return False
