"""Protocol dialects: which module parses which LLM endpoint.

Each module satisfies the same contract (`Dialect`, proxy/dialects/contract.py): `parse_request`,
`upstream_body`, `parse_response`, `StreamAccumulator`, `render_blocked`, `estimate_prompt_tokens`.
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


def dialect_for(path: str, method: str) -> Dialect | None:
    """The dialect module for an upstream-relative path like `/v1/chat/completions`, else None.

    Embeddings and legacy completions live in `other.py`; `embeddings.py` and `completions.py`
    give each the module interface every dialect has.
    """
    key = (path, method)
    if key in _BY_PATH:  # an agent calls the same endpoint over and over
        return _BY_PATH[key]
    name = dialect_name(path, method)
    found = None
    if name is not None:
        found = _MODULES.get(name)
        if found is None:
            # every module named in _EXACT satisfies the contract (mypy checks it: proxy/dialects/contract.py)
            found = _MODULES[name] = cast("Dialect", importlib.import_module(f"proxy.dialects.{name}"))
    if len(_BY_PATH) >= _PATHS_KEPT:  # paths are the client's to choose: bounded
        _BY_PATH.clear()
    _BY_PATH[key] = found
    return found


_MODULES: dict[str, Dialect] = {}  # name -> module, imported on first use (a handful of names)
_BY_PATH: dict[tuple[str, str], Dialect | None] = {}  # (path, method) -> dialect_for's answer
_PATHS_KEPT = 256
