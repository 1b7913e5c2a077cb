"""Legacy completions (`POST /v1/completions`) under the common dialect interface; the logic is in other.py."""

from __future__ import annotations

from proxy.dialects.base import no_declared_tools as declared_tools
from proxy.dialects.other import CompletionsAccumulator as StreamAccumulator
from proxy.dialects.other import completions_parse_request as parse_request
from proxy.dialects.other import completions_parse_response as parse_response
from proxy.dialects.other import completions_render_blocked as render_blocked
from proxy.dialects.other import completions_upstream_body as upstream_body
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

# HTTP status to send render_blocked()'s body with
BLOCKED_STATUS = 200
DIALECT = "completions"
