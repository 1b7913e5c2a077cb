"""A guard config as the trace records it: its JSON dump, and that dump sanitised, kept per config.

A run's tripwire.json keeps the config in force (`guard_config`), and the first call judged under
a config revision keeps it again in its `guard_input.config` (replay follows every change). A
stateless service opens a run per call, so both were made per call: a pydantic dump and a
sanitising walk of it. The config in force is one object until the next write
(`GuardConfigStore.effective`) and frozen (pydantic, `frozen=True`: its dump never changes),
so its dump and the dump's sanitised forms are made once per config object and handed out read-only: every run under an equal config holds the same dicts
(configs that dump alike share one dump, so open runs do not hold ~2 KB each).
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from proxy.redact import sanitize

KEPT = 256  # configs kept (agents' overrides, admin API changes: a few at a time)


class Recordable(Protocol):
    def recorded(self) -> dict[str, Any]: ...


class _Dump:
    __slots__ = ("dump", "clean")

    def __init__(self, dump: dict[str, Any]) -> None:
        self.dump = dump
        self.clean: dict[tuple[int, int], Any] = {}  # (max_field_bytes, depth) -> sanitize's


class ConfigDumps:
    """Per config object: `recorded()` once, and each sanitised form of its dump once."""

    def __init__(self, kept: int = KEPT) -> None:
        self._limit = kept
        self._by_config: dict[int, tuple[Recordable, _Dump]] = {}  # the config held: its id stays its own
        self._by_bytes: dict[bytes, _Dump] = {}  # equal dumps, one
        self._by_dump: dict[int, _Dump] = {}

    def recorded(self, config: Recordable) -> dict[str, Any]:
        """`config.recorded()`, the same dict each time for the same config (and for configs that
        dump alike). Read-only."""
        found = self._by_config.get(id(config))
        if found is not None and found[0] is config:
            return found[1].dump
        if len(self._by_config) >= self._limit:
            self._by_config.clear()
            self._by_bytes.clear()
            self._by_dump.clear()
        dump = config.recorded()
        key = orjson.dumps(dump, option=orjson.OPT_SORT_KEYS)
        kept = self._by_bytes.get(key)
        if kept is None:
            kept = self._by_bytes[key] = self._by_dump[id(dump)] = _Dump(dump)
        self._by_config[id(config)] = (config, kept)
        return kept.dump

    def sanitized(self, dump: Any, max_field_bytes: int, depth: int = 0) -> Any:
        """`sanitize(dump, max_field_bytes, depth)`, made once for a dump `recorded` handed out
        (the same object each time, read-only); any other value is sanitised as it comes."""
        kept = self._by_dump.get(id(dump))
        if kept is None or kept.dump is not dump:
            return sanitize(dump, max_field_bytes, depth)
        key = (max_field_bytes, depth)
        clean = kept.clean.get(key)
        if clean is None:
            clean = kept.clean[key] = sanitize(dump, max_field_bytes, depth)
        return clean
