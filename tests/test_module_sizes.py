"""Small modules with one concern each (issue 30): no module of the stages or of the shared state
storage over 600 lines; a stage that grows past it has a second concern to move out (as holding for
a person moved out of the guard stage, proxy/stages/hold.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

PROXY = Path(__file__).resolve().parents[1] / "proxy"
LIMIT = 600


@pytest.mark.parametrize("package", ["stages", "state", "admission", "guard_log", "guard_backend"])
def test_no_module_over_the_limit(package: str) -> None:
    sizes = {p.relative_to(PROXY): len(p.read_text().splitlines()) for p in (PROXY / package).rglob("*.py")}
    assert sizes, package
    assert {str(p): n for p, n in sizes.items() if n > LIMIT} == {}
