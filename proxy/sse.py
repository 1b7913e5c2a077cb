"""Incremental Server-Sent Events decoder over raw bytes.

Why our own: the proxy relays upstream bytes as they arrive and must be able to forward an event
*unchanged* (or drop it, for the injected usage chunk), so every event keeps the exact bytes it
was parsed from. The SSE libraries on PyPI do not fit: `httpx-sse` decodes an httpx response's
text lines (no raw bytes, tied to httpx), `sse-starlette` and `aiohttp-sse` are servers, and
`sseclient-py` wraps a blocking iterator. The parsing rules are the WHATWG "event stream
interpretation" (https://html.spec.whatwg.org/multipage/server-sent-events.html):

- lines end in CRLF, CR or LF; a CR at the end of one chunk and an LF at the start of the next
  are one line ending (like httpx's `LineDecoder`);
- a blank line ends the event; `:` lines are comments; `event`, `data` (several data lines are
  joined with LF), `id` (ignored when it contains NUL) and `retry` (digits only);
  other fields are ignored; one leading space after the colon is removed;
- a UTF-8 BOM at the start of the stream is skipped.

Unlike a browser we also hand out events that a browser would not dispatch (comment-only
keep-alives, empty blocks), because a relaying filter has to forward their bytes too: the `raw`
of all events, in order, concatenated with the `raw` of `flush()`, is exactly the input.

Bounded memory (`max_event_bytes`, `MAX_EVENT_BYTES` = 1 MiB for the LLM stream observers): an
event whose bytes grow past the bound is not buffered whole. The decoder hands out what it holds
as an `oversized` piece at once and then every later byte of that event as further pieces as they
arrive (the last one, which carries the blank line, has `complete=True`); such pieces carry the
`event` and `id` fields read before the bound was hit but never `data`. Memory is then bounded by
the bound plus one input chunk, whatever the stream's line lengths, and the raw-bytes rule above
still holds. Without a bound (the default) every event is buffered whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

_EOL = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"

# The bound the LLM stream observers decode with: no chat, messages or responses event a client
# needs parsed comes near it except the Responses API's final events that repeat the whole output
# (their usage is still found, see openai_responses.StreamAccumulator).
MAX_EVENT_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One event block. `event`/`data`/`id`/`retry` are None when the block had no such field."""

    raw: bytes
    event: str | None = None
    data: str | None = None
    id: str | None = None
    retry: int | None = None
    comments: tuple[str, ...] = ()
    # False for the unterminated tail returned by flush(), and for the pieces of an oversized event
    # but its last one
    complete: bool = True
    oversized: bool = False  # a piece of an event larger than the decoder's max_event_bytes

    @property
    def type(self) -> str:
        """The dispatch type: the `event` field, else "message" (as EventSource does)."""
        return self.event or "message"


class SSEDecoder:
    """Feed bytes as they arrive; get each event as soon as its blank line is seen."""

    def __init__(self, max_event_bytes: int | None = None) -> None:
        self.max_event_bytes = max_event_bytes
        self._partial = bytearray()  # bytes of the current unterminated line
        self._raw = bytearray()  # bytes of the current event's complete lines
        self._skip_lf = False  # previous chunk ended in CR: a leading LF belongs to that line ending
        self._start = True  # still at the start of the stream (BOM check)
        self._oversized = False  # inside an event past max_event_bytes: its bytes go out as pieces
        self._line_start = False  # (oversized) the last byte seen ended a line
        self._reset_fields()

    def _reset_fields(self) -> None:
        self._event: str | None = None
        self._data: list[str] | None = None
        self._id: str | None = None
        self._retry: int | None = None
        self._comments: list[str] = []

    @property
    def pending(self) -> bool:
        """Whether bytes of an unfinished event are held (what `flush()` would return)."""
        return bool(self._raw or self._partial)

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode one chunk; returns the events it completes (possibly none)."""
        if not chunk:
            return []
        pos = 0
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                if not self._oversized:
                    self._raw += b"\n"
                pos = 1
        events: list[SSEEvent] = []
        if self._oversized:
            end = self._skip(chunk, pos)
            events.append(self._piece(chunk[:end]))
            if self._oversized:
                return events
            pos = end
        for match in _EOL.finditer(chunk, pos):
            if self._partial:
                self._partial += chunk[pos : match.start()]
                line = bytes(self._partial)
                self._partial.clear()
            else:
                line = chunk[pos : match.start()]
            self._raw += line
            self._raw += match.group()
            if match.group() == b"\r" and match.end() == len(chunk):
                self._skip_lf = True
            pos = match.end()
            event = self._line(line)
            if event is not None:
                events.append(event)
        if pos < len(chunk):
            self._partial += chunk[pos:]
        if self.max_event_bytes is not None and len(self._raw) + len(self._partial) > self.max_event_bytes:
            # too big to parse: hand out what is held, then the rest of the event as it comes
            self._line_start = not self._partial
            held = bytes(self._raw) + bytes(self._partial)
            self._raw.clear()
            self._partial.clear()
            self._oversized = True
            events.append(self._piece(held))
        return events

    def _skip(self, chunk: bytes, pos: int) -> int:
        """(Oversized event) where in `chunk` the event ends (after its blank line), else its length."""
        line_start = pos if self._line_start else -1
        for match in _EOL.finditer(chunk, pos):
            if match.group() == b"\r" and match.end() == len(chunk):
                self._skip_lf = True
            if match.start() == line_start:  # an empty line: the event ends here
                self._oversized = False
                return match.end()
            line_start = match.end()
        self._line_start = line_start == len(chunk)
        return len(chunk)

    def _piece(self, raw: bytes) -> SSEEvent:
        ended = not self._oversized
        piece = SSEEvent(raw=raw, event=self._event, id=self._id, complete=ended, oversized=True)
        if ended:
            self._start = False
            self._reset_fields()
        return piece

    def flush(self) -> list[SSEEvent]:
        """End of stream: the unterminated tail (if any) as one event with `complete=False`.

        A browser discards such a tail; it is returned so a caller can still account for it. An
        oversized event that never ended was handed out already: nothing is left of it.
        """
        if self._oversized:
            self._oversized = False
            self._reset_fields()
            return []
        if self._partial:
            line = bytes(self._partial)
            self._partial.clear()
            self._raw += line
            self._line_fields(line)
        if not self._raw:
            return []
        event = self._build(complete=False)
        return [event]

    def _line(self, line: bytes) -> SSEEvent | None:
        if not line:
            return self._build(complete=True)
        self._line_fields(line)
        return None

    def _line_fields(self, line: bytes) -> None:
        if self._start:
            self._start = False
            if line.startswith(_BOM):
                line = line[len(_BOM) :]
        text = line.decode("utf-8", "replace")
        name, colon, value = text.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if not name and colon:
            self._comments.append(value)
        elif name == "data":
            if self._data is None:
                self._data = []
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\x00" not in value:
                self._id = value
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self._retry = int(value)

    def _build(self, complete: bool) -> SSEEvent:
        self._start = False
        event = SSEEvent(
            raw=bytes(self._raw),
            event=self._event,
            data="\n".join(self._data) if self._data is not None else None,
            id=self._id,
            retry=self._retry,
            comments=tuple(self._comments),
            complete=complete,
        )
        self._raw.clear()
        self._reset_fields()
        return event


# What a stream observer keeps of an answer's text (and of each tool call's arguments) when nobody
# told it the recorder's cap: the recorder cuts strings at max_field_bytes anyway, so keeping a 300 MB
# answer whole only costs memory. The forward stage sets the real cap (max_field_bytes plus a margin).
DEFAULT_TEXT_LIMIT = 1024 * 1024


class BoundedText:
    """Text pieces kept up to `limit` characters; the rest is only counted (`dropped`).

    A drop-in for the list of pieces an observer joins at the end: `append`, and iteration for
    `"".join(...)`. Small pieces are joined as they pile up, so thousands of 4-character deltas do
    not each keep a string object alive.
    """

    def __init__(self, limit: int = DEFAULT_TEXT_LIMIT) -> None:
        self.limit = limit
        self.kept = 0
        self.dropped = 0
        self._parts: list[str] = []

    def append(self, piece: str) -> None:
        room = self.limit - self.kept
        if len(piece) > room:
            self.dropped += len(piece) - max(room, 0)
            piece = piece[: max(room, 0)]
            if not piece:
                return
        self._parts.append(piece)
        self.kept += len(piece)
        if len(self._parts) >= 1024:
            self._parts = ["".join(self._parts)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)
