"""What a person reads when an upstream cannot be reached: the agent's answer and the log.

The answer names the upstream, its host:port and the cause ("connection refused", "name or service
not known"), not only aiohttp's exception class. The log gets one WARNING when an upstream stops
answering and one INFO when it answers again (an outage lasts until the next answer), not a line
per failed call: an agent retrying a dead server in a loop must not flood the console.
"""

from __future__ import annotations

import errno
import logging
import os

import aiohttp
from yarl import URL

log = logging.getLogger("tripwire.forward")


def host_port(url: URL | str) -> str:
    """`host:port` of a URL, the port made explicit (a refused https call is to port 443)."""
    target = url if isinstance(url, URL) else URL(url)
    host = target.raw_host or "?"
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    return f"{host}:{target.port}" if target.port is not None else host


def cause_of(e: BaseException) -> str:
    """The reason a connection failed, in words: the OS error's text, else the exception's own."""
    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        return f"TLS certificate not accepted: {e.certificate_error}"
    os_error = getattr(e, "os_error", None)
    if isinstance(os_error, OSError):
        code = os_error.errno
        if isinstance(code, int) and code > 0 and code in errno.errorcode:
            return os.strerror(code).lower()  # "Connect call failed ('127.0.0.1', 9)" says less
        if os_error.strerror:
            return str(os_error.strerror).lower()
    text = str(e).strip()
    return text or type(e).__name__


def unreachable_message(upstream: str, url: URL | str, e: BaseException) -> str:
    """The sentence the agent gets in its 502: which upstream, where, and why."""
    where = host_port(url)
    return (
        f"Tripwire could not reach the upstream {upstream!r} at {where}: {cause_of(e)} ({type(e).__name__})"
    )


class OutageLog:
    """One WARNING per outage of an upstream, one INFO when it answers again.

    Keyed by (kind, upstream name): several agents calling one dead server are one outage. Bounded
    by the configured upstreams (names come from the config, not from clients)."""

    def __init__(self, logger: logging.Logger = log) -> None:
        self._log = logger
        self._failing: dict[tuple[str, str], int] = {}  # upstream -> calls failed since the outage began

    def failed(self, kind: str, upstream: str, message: str) -> None:
        key = (kind, upstream)
        count = self._failing.get(key)
        if count is None:
            self._log.warning("%s; further failures are not logged until it answers again", message)
            count = 0
        self._failing[key] = count + 1

    def answered(self, kind: str, upstream: str) -> None:
        if not self._failing:  # (every answered call comes here: nothing to do unless an outage is on)
            return
        count = self._failing.pop((kind, upstream), None)
        if count is not None:
            plural = "" if count == 1 else "s"
            self._log.info(
                "upstream %r answers again (%d call%s failed to reach it)", upstream, count, plural
            )
