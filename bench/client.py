"""A lean HTTP/1.1 load client on raw asyncio streams: one keep-alive connection per worker, the
request bytes built once, each answer read by Content-Length or chunk by chunk (the arrival time of
every chunk is kept, for streams). Its own cost is the same for every column of the benchmark and
small, so it hides little of the differences between them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field


def request_bytes(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        "Authorization: Bearer sk-bench",
        f"Content-Length: {len(body)}",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass
class Answer:
    status: int
    total_s: float  # from the first byte sent to the answer's end
    first_s: float  # to the first body byte (a stream's first chunk)
    chunk_times: list[float] = field(default_factory=list)  # each body chunk's arrival, from the start
    parts: list[bytes] = field(default_factory=list)  # the body chunks (kept on request)


class Connection:
    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port, limit=2**24)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    async def send(self, raw: bytes, keep_body: bool = False) -> Answer:
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        reader = self.reader
        t0 = time.perf_counter()
        self.writer.write(raw)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        chunks: list[float] = []
        parts: list[bytes] = []
        if "content-length" in headers:
            data = await reader.readexactly(int(headers["content-length"]))
            chunks.append(time.perf_counter() - t0)
            parts.append(data)
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                data = await reader.readexactly(size + 2)
                if size == 0:
                    break
                chunks.append(time.perf_counter() - t0)
                parts.append(data[:-2])
        else:  # read to close
            parts.append(await reader.read())
            chunks.append(time.perf_counter() - t0)
            self.close()
        if headers.get("connection", "").lower() == "close":
            self.close()
        total = time.perf_counter() - t0
        return Answer(
            status,
            total,
            chunks[0] if chunks else total,
            chunks,
            parts if keep_body else [],
        )


async def sequential(port: int, raw: bytes, n: int) -> list[Answer]:
    """n requests one after another on one connection."""
    conn = Connection(port)
    try:
        return [await conn.send(raw) for _ in range(n)]
    finally:
        conn.close()


async def concurrent(port: int, raws: list[bytes], concurrency: int) -> tuple[list[Answer], float]:
    """Every request of `raws`, `concurrency` at a time; returns the answers and the wall time."""
    items = iter(raws)
    out: list[Answer] = []

    async def worker() -> None:
        conn = Connection(port)
        try:
            for raw in items:
                out.append(await conn.send(raw))
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out, time.perf_counter() - t0
