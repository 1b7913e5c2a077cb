"""Embeddings (`POST /v1/embeddings`) under the common dialect interface; the logic is in other.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.dialects.base import (
    CODEX_REASON_HEADER,
    PROVIDER_OPENAI,
    LLMRequest,
    openai_bad_request_error,
    openai_error_body,
)
from proxy.dialects.base import no_declared_tools as declared_tools
from proxy.dialects.base import no_tools_to_remove as without_tools
from proxy.dialects.other import EMBEDDINGS_BLOCKED_STATUS as BLOCKED_STATUS
from proxy.dialects.other import EmbeddingsAccumulator as StreamAccumulator
from proxy.dialects.other import embeddings_parse_request as parse_request
from proxy.dialects.other import embeddings_parse_response as parse_response
from proxy.dialects.other import embeddings_render_blocked as render_blocked
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

DIALECT = "embeddings"
PATHS: tuple[str, ...] = ("/embeddings",)  # upstream-relative, after an optional /v1; POSTs only
PATH_SUFFIXES: tuple[str, ...] = ()
PROVIDER = PROVIDER_OPENAI
OPERATION = "embeddings"
CONVERSATIONAL = False
CHAINS_RESPONSES = False
WEBSOCKET_CALLS = False
MAX_TOKENS_RECOVERY = False
REFUSAL_REASON_HEADER: str | None = CODEX_REASON_HEADER
error_body = openai_error_body
bad_request_error = openai_bad_request_error


def upstream_body(req: LLMRequest, body: dict) -> dict | None:
    return None


if TYPE_CHECKING:  # mypy checks this module against the contract
    from proxy.dialects import embeddings as _this
    from proxy.dialects.contract import Dialect

    _checked: Dialect = _this
