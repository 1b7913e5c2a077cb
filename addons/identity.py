"""Agent and session from the proxy credentials an agent already sends (pure, no mitmproxy).

An agent that can set neither a base URL nor headers can still be named through its proxy URL:
`HTTPS_PROXY=http://research-agent:run-42@127.0.0.1:8080` sends `Proxy-Authorization: Basic ...`
(on the CONNECT of each tunnel for HTTPS); the user name is the agent, the password, if any, the
session. It plays the part of the `/agents/NAME/sessions/ID/` path prefix of `tripwire serve`.
With agent keys (SPEC §9), a credential that is a Tripwire key (`tw_...`, as the password:
`http://research-agent:tw_...@127.0.0.1:8080`, or alone as the user name) is the call's key: it goes
to Tripwire's check as `Authorization: Bearer`, in place of whatever key the agent sent.
"""

from __future__ import annotations

import base64
import binascii

from proxy.agent_keys import KEY_PREFIX
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
    agent: str | None
    agent, session = credentials
    out = {}
    if agent.startswith(KEY_PREFIX):  # `http://tw_...@proxy`: the key alone
        out["Authorization"] = f"Bearer {agent}"
        agent, session = None, None
    elif session and session.startswith(KEY_PREFIX):  # `http://agent:tw_...@proxy`
        out["Authorization"] = f"Bearer {session}"
        session = None
    if agent and AGENT_HEADER.lower() not in present:
        out[AGENT_HEADER] = agent
    if session and SESSION_HEADER.lower() not in present:
        out[SESSION_HEADER] = session
    return out
