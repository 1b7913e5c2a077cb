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
from proxy.pipeline import Pipeline
from proxy.stages.forward import ForwardStage


def forward_only(engine: Any) -> dict[str, Pipeline]:
    return {kind: Pipeline([ForwardStage(engine)]) for kind in ("llm", "mcp")}


if __name__ == "__main__":
    proxy.app.pipelines = forward_only  # read when the app is built (proxy/app.py make_proxy_app)
    sys.exit(main(sys.argv[1:]))
