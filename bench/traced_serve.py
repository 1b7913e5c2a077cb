"""`tripwire serve` under tracemalloc, for bench/run_memory.py: SIGUSR1 dumps a snapshot (the
first one starts tracing: what was allocated before it is not traced).

    TRIPWIRE_TRACE_OUT=/tmp/snap python bench/traced_serve.py serve ...   # snapshots /tmp/snap.0, .1, ...

Run as a script (not `-m`), so that PYTHONPATH alone says whose `proxy` it serves (main's or this
checkout's): bench.run_memory compares them side by side.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import tracemalloc
from types import FrameType

FRAMES = int(os.environ.get("TRIPWIRE_TRACE_FRAMES", "6"))
OUT = os.environ["TRIPWIRE_TRACE_OUT"]
_numbers = itertools.count()


def _dump(signum: int, frame: FrameType | None) -> None:
    if not tracemalloc.is_tracing():
        # traced from the first snapshot on: start-up (the price table) untraced, and quicker
        tracemalloc.start(FRAMES)
    path = f"{OUT}.{next(_numbers)}"
    tracemalloc.take_snapshot().dump(path + ".tmp")
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, _dump)
    from proxy.cli import main

    sys.exit(main(sys.argv[1:]))
