"""docs/architecture.md's pipeline tables are the code's pipelines: same stages, same order, same
classes (the page is how a newcomer finds their way; a reshaped pipeline must redraw it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy.engine import Engine
from proxy.pipelines import llm_stages, mcp_stages

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
ROW = re.compile(r"^\| (\d+) \| `([a-z_]+)` \| `([A-Za-z]+)`")


def documented(heading: str) -> list[tuple[str, str]]:
    text = DOC.read_text()
    section = text[text.index(heading) :]
    section = section[: section.index("\n### ", 1) if "\n### " in section[1:] else len(section)]
    rows = [ROW.match(line) for line in section.splitlines()]
    found = [m for m in rows if m is not None]
    assert [int(m.group(1)) for m in found] == list(range(1, len(found) + 1))
    return [(m.group(2), m.group(3)) for m in found]


@pytest.mark.parametrize(
    ("heading", "stages"),
    [("### The LLM pipeline", llm_stages), ("### The MCP pipeline", mcp_stages)],
    ids=["llm", "mcp"],
)
def test_the_documented_pipeline_is_the_codes(heading: str, stages, engine: Engine) -> None:  # type: ignore[no-untyped-def]
    code = [(s.name, type(s).__name__) for s in stages(engine)]
    assert documented(heading) == code
