"""A real redis-server for the shared-state tests: on 127.0.0.1, a free port, nothing persisted.

`redis_server` (one per test session, emptied before each test through `redis_url`) and
`own_redis` (one per test, for tests that stop and restart it). Tests are skipped, with the
reason, only when the binary is absent; scripts/test.sh installs it (Debian's `redis-server`).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REDIS_BIN = shutil.which("redis-server") or "/usr/bin/redis-server"
START_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start (or restart, on the same port) and wait until it answers PING."""
        assert self.proc is None, "already running"
        args = [
            REDIS_BIN,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        args += ["--dir", str(self.workdir), "--protected-mode", "yes", "--loglevel", "warning"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not answers_ping(self.port):
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                self.proc = None
                raise RuntimeError(f"redis-server exited at start: {err}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("redis-server did not answer PING in time")
            time.sleep(0.02)

    def stop(self) -> None:
        """Kill it (as a crash would) and wait until the port is closed."""
        if self.proc is None:
            return
        self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=START_TIMEOUT_S)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None

    def flush(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(b"FLUSHALL\r\nSCRIPT FLUSH\r\n")
            got = b""
            while got.count(b"\r\n") < 2:
                chunk = s.recv(64)
                if not chunk:
                    break
                got += chunk


def _require_binary() -> None:
    if not Path(REDIS_BIN).exists():
        pytest.skip(
            f"redis-server not installed ({REDIS_BIN}); scripts/test.sh installs Debian's redis-server"
        )


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    _require_binary()
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The shared server, emptied for this test."""
    redis_server.flush()
    return redis_server.url


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test's own, which it may stop and start again."""
    _require_binary()
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
