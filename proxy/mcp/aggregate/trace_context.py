"""The W3C trace context of the client's request the aggregate is answering (`traceparent`,
`tracestate`, `baggage`), for the requests it makes of its servers on that request's behalf.

An aggregate session is shared by a client's requests (a 2026-07-28 client's by every request of
its agent and session), so the context cannot ride on the session: it is a context variable, set
while one client request is answered and copied into the tasks that answer it. The same keys in a
request's `params._meta` (MCP SEP-414) travel in the body, untouched.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

TRACE_HEADERS = ("traceparent", "tracestate", "baggage")

_current: ContextVar[Mapping[str, str] | None] = ContextVar("tripwire_mcp_trace_context", default=None)


@contextmanager
def answering(headers: Mapping[str, str]) -> Iterator[None]:
    """While a client request is answered: its trace headers go with what is sent for it."""
    token = _current.set({name: value for name in TRACE_HEADERS if (value := headers.get(name))})
    try:
        yield
    finally:
        _current.reset(token)


def current() -> Mapping[str, str]:
    return _current.get() or {}
