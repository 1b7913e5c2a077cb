"""Protocol dialects: which module parses which LLM endpoint.

Each module satisfies the same contract (`Dialect`, proxy/dialects/contract.py): `parse_request`,
`upstream_body`, `parse_response`, `StreamAccumulator`, `render_blocked`, `estimate_prompt_tokens`,
and what the rest of Tripwire asks of a dialect instead of testing its name (its error shape, whether
it carries a conversation or chains responses, its span operation, ...).

A dialect registers itself: every module of this package with a `DIALECT` name is one, routed by
the `PATHS` and `PATH_SUFFIXES` it declares. Adding a dialect is adding its module (and its test).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from proxy.dialects.contract import Dialect


@dataclass(frozen=True, slots=True)
class Registry:
    """The dialect modules, found once (on first use: a CLI that serves nothing imports none)."""

    modules: dict[str, Dialect]  # DIALECT name -> module
    exact: dict[str, str]  # upstream-relative path (after an optional /v1) -> name
    suffixes: tuple[tuple[str, str], ...]  # (path suffix, name): deployment-style prefixes


def discover() -> Registry:
    """Import every module of the package; those naming a DIALECT are the dialects."""
    modules: dict[str, Dialect] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        found = importlib.import_module(f"{__name__}.{info.name}")
        name = getattr(found, "DIALECT", None)
        if isinstance(name, str):
            # (mypy checks each such module against the contract: the block at its end)
            modules[name] = cast("Dialect", found)
    exact: dict[str, str] = {}
    for name, module in modules.items():
        for path in module.PATHS:
            if exact.setdefault(path, name) != name:
                raise RuntimeError(f"dialects {exact[path]} and {name} both claim {path}")
    suffixes = tuple((suffix, name) for name, module in modules.items() for suffix in module.PATH_SUFFIXES)
    return Registry(modules, exact, suffixes)


def registry() -> Registry:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = discover()
    return _REGISTRY


def dialect_name(path: str, method: str) -> str | None:
    """The dialect of a request, or None for anything that is forwarded unrecorded."""
    found = match(path, method)
    return found[0] if found is not None else None


def match(path: str, method: str) -> tuple[str, str] | None:
    """(dialect name, the path in the dialect's own spelling) of a POST, else None.

    Endpoints are matched without regard to case (`/v1/chat/Completions` is read as the chat
    endpoint, and forwarded as `/v1/chat/completions`: issue 30); a deployment-style prefix keeps
    its own spelling."""
    if method.upper() != "POST":
        return None
    path = path.split("?", 1)[0].rstrip("/")
    head = ""
    if path[:4].lower() == "/v1/":
        head, path = "/v1", path[3:]
    found = registry()
    folded = path.lower()
    name = found.exact.get(folded)
    if name is not None:
        return name, head + folded
    # deployment-style prefixes (Azure: /openai/deployments/NAME/chat/completions)
    for suffix, name in found.suffixes:
        if folded.endswith(suffix):
            return name, head + path[: len(path) - len(suffix)] + suffix
    return None


def named(name: str) -> Dialect | None:
    """The dialect module of a recorded `endpoint` / `LLMRequest.dialect` name, else None."""
    return registry().modules.get(name)


def of_call(call: object) -> Dialect | None:
    """The dialect of a parsed call (an `LLMRequest`); None for anything else (an MCP call)."""
    name = getattr(call, "dialect", None)
    return registry().modules.get(name) if isinstance(name, str) else None


def dialect_for(path: str, method: str) -> Dialect | None:
    """The dialect module for an upstream-relative path like `/v1/chat/completions`, else None.

    Embeddings and legacy completions live in `other.py`; `embeddings.py` and `completions.py`
    give each the module interface every dialect has.
    """
    key = (path, method)
    if key in _BY_PATH:  # an agent calls the same endpoint over and over
        return _BY_PATH[key]
    name = dialect_name(path, method)
    found = named(name) if name is not None else None
    if len(_BY_PATH) >= _PATHS_KEPT:  # paths are the client's to choose: bounded
        _BY_PATH.clear()
    _BY_PATH[key] = found
    return found


_REGISTRY: Registry | None = None
_BY_PATH: dict[tuple[str, str], Dialect | None] = {}  # (path, method) -> dialect_for's answer
_PATHS_KEPT = 256
