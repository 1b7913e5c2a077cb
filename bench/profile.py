"""Where `tripwire serve` spends its CPU under load: py-spy samples it while wrk drives c=32.

    .venv/bin/pip install py-spy
    .venv/bin/python -m bench.profile [--seconds 10] [--history 0] [--top 25]

Prints the top functions by samples in them or below them (inclusive) and by samples in them alone
(self), over every thread; `--history N` sends an N-step function-calling body instead of the
800-byte prompt. The raw collapsed stacks are kept in --out for a closer look.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

from bench import bodies, procs, runs
from bench.run import WRK_SCRIPT

_LINE = re.compile(r" \(([^()]*?):\d+\)$")


def frame_name(frame: str) -> str:
    """`handler (proxy/app.py:71)` -> `handler (proxy/app.py)`: a function, whatever line it was on."""
    frame = _LINE.sub(lambda m: f" ({_short(m.group(1))})", frame.strip())
    return frame


def _short(path: str) -> str:
    for marker in ("site-packages/", "lib/python3.11/", "/wt-perf/", "/main/", "/wt/runs/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def top(collapsed: str, n: int) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        total += k
        frames = [frame_name(f) for f in stack.split(";")]
        frames = [f for f in frames if not f.startswith(("process ", "thread "))] or frames
        own[frames[-1]] += k
        for f in set(frames):
            inclusive[f] += k
    return total, inclusive.most_common(n), own.most_common(n)


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--conns", type=int, default=32)
    ap.add_argument(
        "--history", type=int, default=0, help="function-calling steps in the body (0: small prompt)"
    )
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--data-root", help="where the data dir goes (e.g. /dev/shm: without the disk's cost)")
    ap.add_argument(
        "--workload",
        choices=("named", "distinct", "identical"),
        default="named",
        help="one named session, or unnamed single calls each its own run (bench/runs.py)",
    )
    ap.add_argument(
        "--nonblocking", action="store_true", help="sample without pausing the process (truncated stacks)"
    )
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "tripwire-profile.txt")
    args = ap.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    body = bodies.encoded(bodies.history(args.history) if args.history else bodies.SMALL)
    up = await procs.upstream()
    tw = await procs.tripwire("tripwire", up.port, data_root=args.data_root)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            (Path(tmp) / "body.json").write_bytes(body)
            script = Path(tmp) / "post.lua"
            script.write_text(WRK_SCRIPT.format(body=Path(tmp) / "body.json"))
            if args.workload != "named" and not args.history:
                script = runs.wrk_script(Path(tmp), args.workload, "profile")
            url = f"http://127.0.0.1:{tw.port}/v1/chat/completions"
            warm = await asyncio.create_subprocess_exec(
                "wrk", "-t1", "-c8", "-d2s", "-s", str(script), url, stdout=asyncio.subprocess.DEVNULL
            )
            await warm.wait()
            load = await asyncio.create_subprocess_exec(
                "wrk",
                "-t1",
                f"-c{args.conns}",
                f"-d{args.seconds + 2}s",
                "-s",
                str(script),
                url,
                stdout=asyncio.subprocess.PIPE,
            )
            await asyncio.sleep(1)
            spy_proc = await asyncio.create_subprocess_exec(
                spy, "record", "--pid", str(tw.pid), "--duration", str(args.seconds), "--rate", "250",
                "--format", "raw", "--output", str(args.out), *(["--nonblocking"] if args.nonblocking else []),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            await spy_proc.wait()
            out = (await load.communicate())[0].decode()
        finally:
            await tw.stop()
            await up.stop()
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    total, inclusive, own = top(args.out.read_text(), args.top)
    print(
        f"wrk c={args.conns}: {rps.group(1) if rps else '?'} req/s; {total} samples (all threads), stacks in {args.out}"
    )
    print(f"\n{'inclusive':>9}  function")
    for name, k in inclusive:
        print(f"{k / total:>8.1%}  {name}")
    print(f"\n{'self':>9}  function")
    for name, k in own:
        print(f"{k / total:>8.1%}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
