"""`tripwire serve` with the whole feature set off: no parsing, sessions, guards, trace or metrics,
only Tripwire's routing and forwarding (the pipeline is just the forward stage). The benchmark's
"Tripwire, all off" column: the difference to the full column is what the feature set costs.

    python -m bench.lean serve --listen ... --upstream ...   (the flags of `tripwire serve`)
"""

from __future__ import annotations

import sys
from typing import Any

import proxy.app
from proxy.cli import main
from proxy.stages import ForwardStage


def forward_only(engine: Any, kind: str) -> list[Any]:
    return [ForwardStage(engine)]


if __name__ == "__main__":
    proxy.app.default_stages = forward_only  # read when the app is built
    sys.exit(main(sys.argv[1:]))
