"""Embeddings (`POST /v1/embeddings`) under the common dialect interface; the logic is in other.py."""

from __future__ import annotations

from proxy.dialects.base import LLMRequest
from proxy.dialects.base import no_declared_tools as declared_tools
from proxy.dialects.other import EMBEDDINGS_BLOCKED_STATUS as BLOCKED_STATUS
from proxy.dialects.other import EmbeddingsAccumulator as StreamAccumulator
from proxy.dialects.other import embeddings_parse_request as parse_request
from proxy.dialects.other import embeddings_parse_response as parse_response
from proxy.dialects.other import embeddings_render_blocked as render_blocked
from proxy.dialects.other import estimate_prompt_tokens

__all__ = [
    "BLOCKED_STATUS",
    "DIALECT",
    "StreamAccumulator",
    "declared_tools",
    "estimate_prompt_tokens",
    "parse_request",
    "parse_response",
    "render_blocked",
    "upstream_body",
]

DIALECT = "embeddings"


def upstream_body(req: LLMRequest, body: dict) -> dict | None:
    return None
