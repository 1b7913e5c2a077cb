"""Typed aiohttp AppKeys shared by the proxy and admin apps (no str keys, no singletons)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from proxy.engine import Engine

# The engine bundles settings, recorder, sessions, guard config store, breakers and metrics.
ENGINE: web.AppKey[Engine] = web.AppKey["Engine"]("tripwire_engine")
