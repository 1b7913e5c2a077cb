"""The processes a benchmark run starts on 127.0.0.1: the fake upstream, the floor, Tripwire (full and
all-off), and the comparison proxies when installed (mitmdump, LiteLLM's proxy, each in its own
virtualenv). Each is a child process, ended by its own pid when the run ends.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_listening(port: int, proc: asyncio.subprocess.Process, timeout_s: float = 60) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if proc.returncode is not None:
            raise RuntimeError(f"exited with {proc.returncode} before listening on {port}")
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port} after {timeout_s:.0f}s")


@dataclass
class Target:
    """One column of the benchmark: a name, its port, and the process serving it (None: direct)."""

    name: str
    port: int
    proc: asyncio.subprocess.Process | None = None
    note: str = ""
    admin_port: int | None = None  # Tripwire's admin listener (/healthz, /metrics)
    tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self.tmp is not None:
            self.tmp.cleanup()


async def _spawn(
    name: str, port: int, *argv: str, env: dict[str, str] | None = None, cwd: Path = ROOT, **kw: object
) -> Target:
    log = open(Path(tempfile.gettempdir()) / f"tripwire-bench-{name}-{port}.log", "wb")  # noqa: ASYNC230
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=str(cwd),
        stdout=log,
        stderr=log,
        stdin=asyncio.subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    log.close()
    target = Target(name, port, proc, **kw)  # type: ignore[arg-type]
    try:
        await wait_listening(port, proc)
    except RuntimeError as e:
        await target.stop()
        raise RuntimeError(f"{name}: {e} (log: {log.name})") from e
    return target


async def upstream() -> Target:
    port = free_port()
    return await _spawn("upstream", port, sys.executable, "-m", "bench.upstream", "--port", str(port))


async def mcp_server(name: str, delay_ms: float, tools: int) -> Target:
    """A handshake-era MCP server whose tools/list takes `delay_ms` (bench/mcp_upstream.py)."""
    port = free_port()
    return await _spawn(
        name,
        port,
        sys.executable,
        "-m",
        "bench.mcp_upstream",
        "--port",
        str(port),
        "--delay-ms",
        str(delay_ms),
        "--tools",
        str(tools),
    )


async def floor(up: int) -> Target:
    port = free_port()
    return await _spawn(
        "floor",
        port,
        sys.executable,
        "-m",
        "bench.floor",
        "--port",
        str(port),
        "--upstream",
        f"http://127.0.0.1:{up}",
    )


async def tripwire(
    name: str,
    up: int,
    *,
    lean: bool = False,
    extra: tuple[str, ...] = (),
    root: Path | None = None,
    data_root: str | None = None,
) -> Target:
    """`tripwire serve` with a fresh data dir (defaults: guards on, trace, metrics, fsync run_end).
    `root`: another checkout's code (its directory as cwd and PYTHONPATH), to compare side by side."""
    port, admin = free_port(), free_port()
    tmp = tempfile.TemporaryDirectory(prefix="tripwire-bench-", dir=data_root)
    module = "bench.lean" if lean else "proxy"
    target = await _spawn(
        name,
        port,
        sys.executable,
        "-m",
        module,
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--admin-listen",
        f"127.0.0.1:{admin}",
        "--upstream",
        f"http://127.0.0.1:{up}",
        "--data-dir",
        tmp.name,
        "--log-level",
        "WARNING",
        *extra,
        # no HOME config: the defaults, whatever the machine's ~/.tripwire/config.yaml says
        env={"HOME": tmp.name, **({"PYTHONPATH": str(root)} if root else {})},
        cwd=root or ROOT,
        tmp=tmp,
    )
    target.admin_port = admin
    return target


async def redis_server() -> Target:
    """Debian's redis-server on loopback, nothing persisted: the shared guard state of `tripwire-redis`."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server not installed (apt-get install redis-server)")
    port = free_port()
    argv = ("--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no")
    return await _spawn("redis", port, binary, *argv)


async def tripwire_redis(up: int, redis: Target) -> Target:
    """`tripwire serve --state redis://...`: the guard state in Redis (docs/scaling.md)."""
    return await tripwire("tripwire-redis", up, extra=("--state", f"redis://127.0.0.1:{redis.port}/0"))


def _venv_tool(*candidates: Path) -> Path | None:
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    return None


def mitmdump_path() -> Path | None:
    """$BENCH_MITMDUMP, the project's .venv-mitm (docs/mitmproxy.md), or one on PATH."""
    found = shutil.which("mitmdump")
    env = os.environ.get("BENCH_MITMDUMP")
    return _venv_tool(
        *([Path(env)] if env else []),
        ROOT / ".venv-mitm" / "bin" / "mitmdump",
        *([Path(found)] if found else []),
    )


async def mitmdump(up: int) -> Target:
    exe = mitmdump_path()
    if exe is None:
        raise RuntimeError(
            "mitmdump not installed (python3 -m venv .venv-mitm && .venv-mitm/bin/pip install mitmproxy)"
        )
    port = free_port()
    tmp = tempfile.TemporaryDirectory(prefix="tripwire-bench-mitm-")
    return await _spawn(
        "mitmdump",
        port,
        str(exe),
        "--mode",
        f"reverse:http://127.0.0.1:{up}",
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        str(port),
        "--set",
        f"confdir={tmp.name}",
        "-q",
        tmp=tmp,
    )


def litellm_path() -> Path | None:
    """$BENCH_LITELLM, or the LiteLLM proxy in .venv-litellm."""
    env = os.environ.get("BENCH_LITELLM")
    return _venv_tool(*([Path(env)] if env else []), ROOT / ".venv-litellm" / "bin" / "litellm")


async def litellm(up: int) -> Target:
    exe = litellm_path()
    if exe is None:
        raise RuntimeError(
            "LiteLLM not installed (python3 -m venv .venv-litellm && .venv-litellm/bin/pip install 'litellm[proxy]')"
        )
    port = free_port()
    tmp = tempfile.TemporaryDirectory(prefix="tripwire-bench-litellm-")
    config = Path(tmp.name) / "config.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: gpt-4o-mini\n"
        "    litellm_params:\n"
        "      model: openai/gpt-4o-mini\n"
        f"      api_base: http://127.0.0.1:{up}/v1\n"
        "      api_key: sk-bench\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
    )
    return await _spawn(
        "litellm",
        port,
        str(exe),
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
        # the benchmark's clients send "Bearer sk-bench": LiteLLM's master key, so it lets them in
        env={"HOME": tmp.name, "LITELLM_LOG": "ERROR", "LITELLM_MASTER_KEY": "sk-bench"},
        tmp=tmp,
    )


def rss_kb(pid: int) -> int:
    """The process's resident set size (Linux /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process (all its threads) has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds(pid: int) -> float:
    """CPU time of the process's live children so far (Tripwire's trace writer's disk process,
    `trace_writer: process`): 0.0 when it has none."""
    total = 0.0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids = f.read().split()
        except OSError:
            continue
        for kid in kids:
            try:
                total += cpu_seconds(int(kid))
            except OSError:  # gone meanwhile
                pass
    return total
