"""One iterative walk over JSON-like values, for every rewrite the guards make of arguments and results.

`rebuild(value, leaf, keep=..., expand=...)` copies dicts (keys as `str`, in source order; of two keys
with one `str()` the last wins) and lists/tuples (as lists) at any depth with an explicit stack, never
recursion (a body may nest 10,000 levels), applying `leaf` to every scalar. `keep(key, child)` drops
dict members; `expand(text)` may turn a string into a value to walk in its place (JSON sent as text),
or return `NOT_EXPANDED`. Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

NOT_EXPANDED = object()


def rebuild(
    value: Any,
    leaf: Callable[[Any], Any],
    *,
    keep: Callable[[str, Any], bool] | None = None,
    expand: Callable[[str], Any] | None = None,
) -> Any:
    root: list[Any] = [None]
    work: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while work:
        v, parent, slot = work.pop()
        if expand is not None and isinstance(v, str):
            parsed = expand(v)
            if parsed is not NOT_EXPANDED:
                work.append((parsed, parent, slot))  # walked in the string's place
                continue
        if isinstance(v, dict):
            out: dict[str, Any] = {}
            parent[slot] = out
            members = []
            for k, child in v.items():
                key = str(k)
                if keep is not None and not keep(key, child):
                    continue
                out[key] = None  # keeps the source's key order
                members.append((child, out, key))
            work.extend(reversed(members))  # filled in order: of two keys with one str(), the last wins
        elif isinstance(v, list | tuple):
            items: list[Any] = [None] * len(v)
            parent[slot] = items
            work.extend((child, items, i) for i, child in enumerate(v))
        else:
            parent[slot] = leaf(v)
    return root[0]
