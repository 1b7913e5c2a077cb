"""Agent and session from the proxy credentials an agent already sends (pure, no mitmproxy).

An agent that can set neither a base URL nor headers can still be named through its proxy URL:
`HTTPS_PROXY=http://research-agent:run-42@127.0.0.1:8080` sends `Proxy-Authorization: Basic ...`
(on the CONNECT of each tunnel for HTTPS); the user name is the agent, the password, if any, the
session. It plays the part of the `/agents/NAME/sessions/ID/` path prefix of `tripwire serve`.
"""

from __future__ import annotations

import base64
import binascii

from proxy.routing import AGENT_HEADER, SESSION_HEADER

MAX_NAME = 200


def from_basic(header: str | None) -> tuple[str, str | None] | None:
    """`Basic base64(user:password)` -> (agent, session or None); None when absent or malformed."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    try:
        user, _, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, password = user.strip(), password.strip()
    if not user or len(user) > MAX_NAME or len(password) > MAX_NAME:
        return None
    return user, password or None


def identity_headers(credentials: tuple[str, str | None] | None, present: set[str]) -> dict[str, str]:
    """The X-Tripwire-* headers to add; the agent's own headers (`present`, lower case) win."""
    if credentials is None:
        return {}
    agent, session = credentials
    out = {}
    if AGENT_HEADER.lower() not in present:
        out[AGENT_HEADER] = agent
    if session and SESSION_HEADER.lower() not in present:
        out[SESSION_HEADER] = session
    return out
