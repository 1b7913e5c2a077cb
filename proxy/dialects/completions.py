"""Legacy completions (`POST /v1/completions`) under the common dialect interface; the logic is in other.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.dialects.base import (
    CODEX_REASON_HEADER,
    PROVIDER_OPENAI,
    openai_bad_request_error,
    openai_error_body,
)
from proxy.dialects.base import no_declared_tools as declared_tools
from proxy.dialects.base import no_tools_to_remove as without_tools
from proxy.dialects.other import CompletionsAccumulator as StreamAccumulator
from proxy.dialects.other import completions_parse_request as parse_request
from proxy.dialects.other import completions_parse_response as parse_response
from proxy.dialects.other import completions_render_blocked as render_blocked
from proxy.dialects.other import completions_upstream_body as upstream_body
from proxy.dialects.other import estimate_prompt_tokens

__all__ = [
    "BLOCKED_STATUS",
    "CHAINS_RESPONSES",
    "CONVERSATIONAL",
    "DIALECT",
    "MAX_TOKENS_RECOVERY",
    "OPERATION",
    "PATHS",
    "PATH_SUFFIXES",
    "PROVIDER",
    "REFUSAL_REASON_HEADER",
    "WEBSOCKET_CALLS",
    "StreamAccumulator",
    "bad_request_error",
    "declared_tools",
    "error_body",
    "estimate_prompt_tokens",
    "parse_request",
    "parse_response",
    "render_blocked",
    "upstream_body",
    "without_tools",
]

# HTTP status to send render_blocked()'s body with
BLOCKED_STATUS = 200
DIALECT = "completions"
PATHS: tuple[str, ...] = ("/completions",)  # upstream-relative, after an optional /v1; POSTs only
PATH_SUFFIXES: tuple[str, ...] = ()
PROVIDER = PROVIDER_OPENAI
OPERATION = "text_completion"
CONVERSATIONAL = False
CHAINS_RESPONSES = False
WEBSOCKET_CALLS = False
MAX_TOKENS_RECOVERY = False
REFUSAL_REASON_HEADER: str | None = CODEX_REASON_HEADER
error_body = openai_error_body
bad_request_error = openai_bad_request_error


if TYPE_CHECKING:  # mypy checks this module against the contract
    from proxy.dialects import completions as _this
    from proxy.dialects.contract import Dialect

    _checked: Dialect = _this
