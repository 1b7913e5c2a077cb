"""`RecentKeys`: keys in the order they were last added, oldest first, and cheap while there is one.

An automatic run remembers the digests of the histories it saw, the answers it gave and the
Responses ids it produced (`proxy.session_state.Lineage`), newest last and bounded. A stateless
service's call is a run of its own that sees one history and gives one answer, and is held for the
idle timeout: a one-key dict costs ~220 bytes, so one key is kept alone and a dict made for two.
Iterating, `reversed`, `len`, `in` and truthiness work as on the dict it stands for; it is a
`MutableSet` (`clear`, `discard`, set comparisons), so it also stands for a small set that is
usually of one member (a conversation's recorded config revisions).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, MutableSet
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


class RecentKeys(MutableSet[K]):
    __slots__ = ("_one", "_many")

    def __init__(self) -> None:
        self._one: K | None = None  # the only key (while there is one and no dict)
        self._many: dict[K, None] | None = None  # every key, oldest first, once there were two

    def add(self, key: K) -> None:
        """`key` is the newest (moved there if it was in already)."""
        many = self._many
        if many is not None:
            many.pop(key, None)
            many[key] = None
            return
        one = self._one
        if one is None or one == key:
            self._one = key
        else:
            self._many, self._one = {one: None, key: None}, None

    def clear(self) -> None:
        self._one = self._many = None

    def discard(self, key: K) -> None:
        if self._many is not None:
            self._many.pop(key, None)
        elif self._one == key:
            self._one = None

    def pop_oldest(self) -> K:
        """Remove and return the oldest key (KeyError when there is none)."""
        many = self._many
        if many is not None:
            if not many:
                raise KeyError("no keys")
            key = next(iter(many))
            del many[key]
            return key
        one = self._one
        if one is None:
            raise KeyError("no keys")
        self._one = None
        return one

    def newest(self) -> K | None:
        many = self._many
        if many is not None:
            return next(reversed(many)) if many else None
        return self._one

    def __len__(self) -> int:
        if self._many is not None:
            return len(self._many)
        return 0 if self._one is None else 1

    def __bool__(self) -> bool:
        return bool(self._many) if self._many is not None else self._one is not None

    def __contains__(self, key: object) -> bool:
        if self._many is not None:
            return key in self._many
        return self._one is not None and self._one == key

    def __iter__(self) -> Iterator[K]:
        if self._many is not None:
            return iter(self._many)
        return iter(() if self._one is None else (self._one,))

    def __reversed__(self) -> Iterator[K]:
        if self._many is not None:
            return reversed(self._many)
        return iter(() if self._one is None else (self._one,))

    def __repr__(self) -> str:
        return f"RecentKeys({list(self)!r})"
