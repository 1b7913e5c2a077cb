"""MCP traffic in the pipeline. Placeholder: MCP calls are forwarded unrecorded until the MCP adapter lands."""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.pipeline import BaseStage

if TYPE_CHECKING:
    from proxy.engine import Engine


def mcp_parse_stage(engine: Engine) -> BaseStage:
    return BaseStage()
