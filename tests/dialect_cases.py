"""The sample each dialect's test file gives tests/test_dialect_contract.py: a new dialect's module
and its test file (with its `CONTRACT_CASES`) are all it takes for the contract tests to run on it."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Case:
    path: str
    request: dict[str, Any]
    answer: dict[str, Any]
    streams: bool  # the blocked answer of a streamed request is a stream


def contract_cases() -> dict[str, Case]:
    """Every `CONTRACT_CASES` of the tests/test_dialect_*.py files: dialect name -> its case."""
    cases: dict[str, Case] = {}
    for path in sorted(Path(__file__).parent.glob("test_dialect_*.py")):
        if path.stem == "test_dialect_contract":
            continue
        # (by its base name: the module pytest imports, tests/ being on sys.path as for canned_server)
        cases.update(getattr(importlib.import_module(path.stem), "CONTRACT_CASES", {}))
    return cases
