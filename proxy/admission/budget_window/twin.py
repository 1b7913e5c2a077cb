"""The budget windows' shared-state twin (SPEC §9): a call's reservation in its agent's windows,
checked and placed inside the admission's APPEND (after the check is appended; not for a check a
gate refused), so concurrent calls through any number of replicas stop exactly at the limit. The
window rules are proxy/state/windows.py's (`MemoryWindows`, and the Lua `window_reserve` of
proxy/state/lua.py, which the windows' own scripts share); the request is made by
proxy/guard_backend/shared_windows.py (`SharedWindows.prepare`), its answer read by `decide`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.state import lua
from proxy.state.base import Store
from proxy.state.windows import MemoryWindows, Reserved, WindowRequest, parse_reserved

# args: {window keys, `window_reserve` header}
LUA = (
    lua.WINDOW_FUNCS
    + r"""
CHECKS.budget_window = function(a, now)
  return false, window_reserve(a[1], a[2])
end
"""
)


class WindowTwin:
    name = "budget_window"
    gate = False
    lua = LUA

    def args(self, request: WindowRequest) -> Any:
        return [list(request.keys), dict(request.header)]

    def parse(self, request: WindowRequest, reply: Sequence[Any]) -> Reserved:
        return parse_reserved(reply)

    def memory(self, store: Store, request: WindowRequest, now: float) -> tuple[bool, Reserved]:
        windows: MemoryWindows = store.store(self.name)["windows"]
        return False, windows.reserve_now(request.keys, request.header)


TWIN = WindowTwin()
