"""The tool-permission check's cost per call (issue 22, acceptance 5): `tripwire serve` with a guard
config of ten patterns against the same server with the defaults, at c=32, in interleaved rounds.
Every call declares the five tools of `bodies.TOOLS`, one of which the patterns deny: the check runs
on each declared tool and the body is rewritten (the worst case; a call whose tools are all allowed
is forwarded as sent). The cost is the difference in the proxy process's own CPU per call."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import bodies, procs

# ten patterns, as a gateway's policy for a coding agent might read (fnmatch globs, SPEC §9)
TOOLS_CONFIG = {
    "allow": ["read_*", "list_*", "grep", "run_tests", "search*", "fs__read*", "git__log", "git__diff"],
    "deny": ["write_*", "*__delete*"],
}
BODY = {**bodies.SMALL, "tools": bodies.TOOLS}

Throughput = Callable[[list[procs.Target], bytes, int, float, int, Path], Awaitable[dict[str, Any]]]


async def measure(
    up: int, throughput: Throughput, rounds: int, seconds: float, conns: int, tmp: Path
) -> dict[str, Any]:
    """The throughput phase on two columns, defaults and the ten patterns; the CPU difference per call."""
    config = tmp / "permissions.yaml"
    config.write_text(json.dumps({"tools": TOOLS_CONFIG}))  # (JSON is YAML)
    plain = await procs.tripwire("tripwire-tools", up)
    try:
        checked = await procs.tripwire("tripwire-permissions", up, extra=("--config", str(config)))
    except BaseException:
        await plain.stop()
        raise
    try:
        tp = await throughput([plain, checked], bodies.encoded(BODY), rounds, seconds, conns, tmp)
    finally:
        await checked.stop()
        await plain.stop()
    a, b = tp[plain.name].get("cpu_us_per_call"), tp[checked.name].get("cpu_us_per_call")
    return {
        "patterns": sum(len(v) for v in TOOLS_CONFIG.values()),
        "declared_tools": len(bodies.TOOLS),
        "defaults": tp[plain.name],
        "permissions": tp[checked.name],
        "cost_us_per_call": None if a is None or b is None else round(b - a, 1),
    }
