"""Protocol dialects: which module parses which LLM endpoint.

Each module satisfies the same contract (`Dialect`, proxy/dialects/contract.py): `parse_request`,
`upstream_body`, `parse_response`, `StreamAccumulator`, `render_blocked`, `estimate_prompt_tokens`,
and what the rest of Tripwire asks of a dialect instead of testing its name (its error shape, whether
it carries a conversation or chains responses, its span operation, ...).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from proxy.dialects.contract import Dialect

# upstream-relative path (after an optional /v1) -> module name; only POSTs are recorded
_EXACT = {
    "/chat/completions": "openai_chat",
    "/responses": "openai_responses",
    "/messages": "anthropic",
    "/embeddings": "embeddings",
    "/completions": "completions",
}


def dialect_name(path: str, method: str) -> str | None:
    """The dialect of a request, or None for anything that is forwarded unrecorded."""
    if method.upper() != "POST":
        return None
    path = path.split("?", 1)[0].rstrip("/")
    if path.startswith("/v1/"):
        path = path[3:]
    if path in _EXACT:
        return _EXACT[path]
    # deployment-style prefixes (Azure: /openai/deployments/NAME/chat/completions)
    if path.endswith("/chat/completions"):
        return "openai_chat"
    return None


def named(name: str) -> Dialect | None:
    """The dialect module of a recorded `endpoint` / `LLMRequest.dialect` name, else None."""
    found = _MODULES.get(name)
    if found is None and name in _NAMES:
        # every module named in _EXACT satisfies the contract (mypy checks it: proxy/dialects/contract.py)
        found = _MODULES[name] = cast("Dialect", importlib.import_module(f"proxy.dialects.{name}"))
    return found


def of_call(call: object) -> Dialect | None:
    """The dialect of a parsed call (an `LLMRequest`); None for anything else (an MCP call)."""
    name = getattr(call, "dialect", None)
    return named(name) if isinstance(name, str) else None


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


_NAMES = frozenset(_EXACT.values())
_MODULES: dict[str, Dialect] = {}  # name -> module, imported on first use (a handful of names)
_BY_PATH: dict[tuple[str, str], Dialect | None] = {}  # (path, method) -> dialect_for's answer
_PATHS_KEPT = 256
