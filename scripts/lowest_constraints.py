"""Print pip constraints pinning every runtime dependency of pyproject.toml to its lowest allowed
version (`name>=X` becomes `name==X`), for the lowest-versions job of scripts/test.sh: the code must
work on every version its pins allow, not only on the newest."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

# runtime dependencies a test dependency needs newer than Tripwire does: left to the resolver
TESTS_NEED_NEWER = {"pyyaml": "agentdbg (the trace-format tests) needs PyYAML>=6.0.3"}

LOWER_BOUND = re.compile(r"^\s*([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*(?:[^;]*?)>=\s*([0-9][^,;\s]*)[^;]*(;.*)?$")


def lowest_pins(pyproject: Path) -> list[str]:
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    pins = []
    for requirement in dependencies:
        found = LOWER_BOUND.match(requirement)
        if found and found.group(1).lower() not in TESTS_NEED_NEWER:
            name, version, marker = found.groups()
            pins.append(f"{name}=={version}{' ' + marker if marker else ''}")
    return pins


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    print("\n".join(lowest_pins(root / "pyproject.toml")))
