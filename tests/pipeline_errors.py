"""A fixture for end-to-end tests: fail when a pipeline stage raised, even one that fails open.

A guard bug must not drop a call (the stage is skipped and logged), which also means a test that
only looks at answers would not see it; this fixture makes such a log line a test failure.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def no_pipeline_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.ERROR, logger="tripwire")
    yield
    failed = [r for r in caplog.records if r.name.startswith("tripwire") and r.levelno >= logging.ERROR]
    assert not failed, "a pipeline stage raised:\n" + "\n".join(r.getMessage() for r in failed)
