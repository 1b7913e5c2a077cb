"""Content codings of relayed answers (gzip, deflate, br): decoded incrementally in bounded pieces,
and encoded again when an observer rewrites the stream.

Tripwire asks upstreams for `identity`; an answer compressed anyway is decoded here for the observer
(proxy/forward.py `ObserverFeed`). A few KB of gzip can expand a thousandfold, so no call to a decoder
produces more than `DECODE_PIECE` bytes (zlib's `max_length`, brotli's `output_buffer_limit`), and
`Codec.decode` is lazy: its consumer takes pieces as it can afford them and stops when it has read
enough (the ObserverFeed bounds both the work per event-loop turn and the total). Pure: no I/O.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

try:  # optional, as for aiohttp itself: br answers are decoded only when one is installed
    import brotli as _brotli
except ImportError:  # pragma: no cover - depends on the environment
    try:
        import brotlicffi as _brotli
    except ImportError:
        _brotli = None

# brotli >= 1.2 and brotlicffi >= 1.2 take an output bound (`process(data, output_buffer_limit=)`);
# an older decoder cannot be kept from expanding a chunk whole, so br is then not decoded at all
BROTLI_BOUNDED = _brotli is not None and hasattr(_brotli.Decompressor, "can_accept_more_data")

# the most one decoder call produces (brotli rounds up to its next output block: at most ~1.5x)
DECODE_PIECE = 64 * 1024

_GZIP_WBITS = zlib.MAX_WBITS | 16


class ContentDecodeError(Exception):
    pass


def content_codings(headers: Mapping[str, str]) -> list[str]:
    """The answer's content codings in the order they were applied (identity left out)."""
    values = headers.getall("content-encoding", []) if hasattr(headers, "getall") else []
    names = [c.strip().lower() for v in values for c in v.split(",")]
    return [c for c in names if c and c != "identity"]


class Codec:
    """An answer's content codings, in the order applied: decode them incrementally, encode again."""

    def __init__(self, names: list[str]) -> None:
        self._codings = [_Coding(name) for name in names]

    @staticmethod
    def decodes(names: list[str]) -> bool:
        """Tripwire can decode every one of these codings."""
        return bool(names) and all(_Coding.supported(name) for name in names)

    def decode(self, data: bytes) -> Iterator[bytes]:
        """The decoded bytes of `data`, lazily, in pieces of at most about `DECODE_PIECE` bytes.

        Decoders keep their state between calls; pieces come in order as long as each iterator is
        read to its end before the next one is started. Raises ContentDecodeError while iterated.
        """
        pieces: Iterable[bytes] = (data,)
        for coding in reversed(self._codings):  # the last coding applied comes off first
            pieces = _chain(coding, pieces)
        return iter(pieces)

    def encode(self, data: bytes, final: bool) -> bytes:
        """`data` compressed again with the same codings (flushed, so a stream stays a stream)."""
        for coding in self._codings:
            if not data and not final:
                return b""
            data = coding.encode(data, final)
        return data


def _chain(coding: _Coding, pieces: Iterable[bytes]) -> Iterator[bytes]:
    for piece in pieces:
        yield from coding.decode(piece)


class _Coding:
    """One content coding of an answer: decode it incrementally; encode again (re-compression)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._dec: Any = None
        self._head = b""  # deflate: the first bytes, until the zlib header check can be made
        self._enc: Any = None

    @staticmethod
    def supported(name: str) -> bool:
        return name in ("gzip", "x-gzip", "deflate") or (name == "br" and BROTLI_BOUNDED)

    def decode(self, data: bytes) -> Iterator[bytes]:
        try:
            if self.name == "br":
                yield from self._unbrotli(data)
            else:
                yield from self._inflate(data)
        except zlib.error as e:
            raise ContentDecodeError(f"{self.name}: {e}") from e
        except Exception as e:  # brotli raises its own error classes
            if self.name != "br":
                raise
            raise ContentDecodeError(f"br: {e}") from e

    def _inflate(self, data: bytes) -> Iterator[bytes]:
        if self._dec is None:
            if self.name != "deflate":
                self._dec = zlib.decompressobj(_GZIP_WBITS)
            else:
                # "deflate" is zlib-wrapped by the RFC, raw deflate in practice now and then
                self._head += data
                if len(self._head) < 2:
                    return
                data, self._head = self._head, b""
                zlib_header = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
                self._dec = zlib.decompressobj(zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS)
        while True:
            if self._dec.eof:
                data = self._dec.unused_data + data
                if not data or self.name == "deflate":
                    return  # (bytes after the end of a deflate stream are ignored, as zlib does)
                self._dec = zlib.decompressobj(_GZIP_WBITS)  # concatenated gzip members
            out = self._dec.decompress(data, DECODE_PIECE)
            # at the end of a member the rest is unused_data; unconsumed_tail may still hold it too
            data = b"" if self._dec.eof else self._dec.unconsumed_tail
            if out:
                yield out
            if not self._dec.eof and not data and len(out) < DECODE_PIECE:
                return

    def _unbrotli(self, data: bytes) -> Iterator[bytes]:
        if self._dec is None:
            self._dec = _brotli.Decompressor()
        while True:
            # past the bound the decoder keeps the rest of its input and its output for the next
            # call (with no new input); its can_accept_more_data() may say True while output is
            # still pending (brotli 1.2.1), so it is asked until it gives nothing more
            out = self._dec.process(data, output_buffer_limit=DECODE_PIECE)
            if not out:
                return
            data = b""
            yield out

    def encode(self, data: bytes, final: bool) -> bytes:
        if self._enc is None and not data:
            return b""  # nothing to send yet (or at all: an empty body stays empty)
        if self.name == "br":
            if self._enc is None:
                self._enc = _brotli.Compressor()
            enc = self._enc
            out = enc.process(data) if hasattr(enc, "process") else enc.compress(data)
            return out + (enc.finish() if final else enc.flush())
        if self._enc is None:
            wbits = zlib.MAX_WBITS if self.name == "deflate" else _GZIP_WBITS
            self._enc = zlib.compressobj(wbits=wbits)
        return self._enc.compress(data) + self._enc.flush(zlib.Z_FINISH if final else zlib.Z_SYNC_FLUSH)
