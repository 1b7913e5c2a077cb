"""The dialect contract: what every module in proxy/dialects/ offers the LLM protocol adapter.

A dialect is a module (no instances, no state); `Dialect` is the Protocol such a module satisfies,
checked by mypy for every dialect (the `if TYPE_CHECKING:` block at each module's end) and exercised
alike for each by tests/test_dialect_contract.py. Adding a dialect: a module with these names (found
by proxy/dialects/__init__.py, routed by its PATHS), and its test file with its contract case.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from proxy.dialects.base import LLMRequest, LLMResult


class Accumulator(Protocol):
    """Reads an answer as it is relayed (a stream's events, or a plain body), passing bytes on."""

    status: int | None  # the upstream's status, set by the caller before the first chunk

    def feed(self, chunk: bytes) -> bytes: ...  # what goes on to the client (usually the chunk)

    def finish(self, complete: bool) -> LLMResult: ...  # complete: the stream ended normally


class Dialect(Protocol):
    __name__: str
    DIALECT: str  # the endpoint name recorded in LLM_CALL's `endpoint`
    PATHS: tuple[str, ...]  # the upstream-relative paths it parses (after an optional /v1; POSTs)
    PATH_SUFFIXES: tuple[str, ...]  # and any path ending so (deployment-style prefixes)
    BLOCKED_STATUS: int  # the HTTP status render_blocked()'s body goes with
    PROVIDER: str  # the LLM_CALL's `provider` (and the span's gen_ai.provider.name)
    OPERATION: str  # the span's gen_ai.operation.name (OpenTelemetry's: chat, embeddings, ...)
    # its requests carry a conversation: a run's episode is found by its history (proxy/episodes.py)
    CONVERSATIONAL: bool
    # an answer has an id a later request continues by `previous_response_id` (proxy/responses_chain.py)
    CHAINS_RESPONSES: bool
    # its calls also come as `response.create` messages on a WebSocket (proxy/websocket/)
    WEBSOCKET_CALLS: bool
    # a non-streamed answer cut by its token limit may be continued upstream (proxy/stages/recovery.py)
    MAX_TOKENS_RECOVERY: bool
    # the header a 429 refusal's reason is copied into, for clients that show only it (Codex shows
    # the request id of a 429, never its body), else None
    REFUSAL_REASON_HEADER: str | None

    def StreamAccumulator(self, req: LLMRequest, /) -> Accumulator: ...  # noqa: N802 (a class)

    def parse_request(self, body: dict[str, Any], /) -> LLMRequest: ...

    def upstream_body(self, req: LLMRequest, body: dict[str, Any], /) -> dict[str, Any] | None: ...

    def parse_response(self, status: int, body: bytes, req: LLMRequest | None = None) -> LLMResult: ...

    def render_blocked(self, req: LLMRequest, text: str, guard: str, /) -> tuple[str, bytes]: ...

    def estimate_prompt_tokens(self, req: LLMRequest, /) -> int: ...

    # an error answer's body in this protocol's shape (SPEC §5.5), `error` being Tripwire's fields
    # (message, type, code, guardrail, ...), so the client's SDK parses it as its own
    def error_body(self, status: int, error: dict[str, Any], /) -> bytes: ...

    # the `error` fields of a 400 for a body Tripwire cannot read (the SDK raises its BadRequestError)
    def bad_request_error(self, message: str, /) -> dict[str, Any]: ...

    # the tool definitions a request makes available, as they are in the body (a permission filter
    # acts on them); `base.tool_name` names one
    def declared_tools(self, body: dict[str, Any], /) -> list[dict[str, Any]]: ...

    # the body without the declared tools `keep(name)` refuses (`base.tool_name` names them), a
    # `tool_choice` naming one reset so the upstream does not reject the request; None when nothing
    # is removed (the body is then forwarded as the client sent it). Tool permissions, SPEC §9
    def without_tools(
        self, body: dict[str, Any], keep: Callable[[str], bool], /
    ) -> dict[str, Any] | None: ...
