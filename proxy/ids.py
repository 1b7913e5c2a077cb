"""Random ids on the request path: version-4 UUIDs as text, made from os.urandom in batches.

`str(uuid.uuid4())` costs a system call, a UUID object and its formatting per id; a run opened by a
stateless service's call takes several (its run id, its session id, an event id per event). Here one
os.urandom call makes `_ID_BATCH` ids, their version and variant bits set and their text cut in C.
The ids are what uuid4 makes: 122 random bits, version 4, RFC 4122 variant, canonical lowercase.
"""

from __future__ import annotations

import os
import re
from collections import deque

_ID_BATCH = 128  # ids made from one os.urandom call
_ids: deque[str] = deque()  # made, not yet handed out (popleft is atomic: threads never share one)
os.register_at_fork(after_in_child=_ids.clear)  # a child never hands out its parent's ids
# a random byte with the bits uuid4 sets: byte 6's high nibble the version (4), byte 8's two high
# bits the variant (RFC 4122: 10)
_VERSION_4 = bytes((b & 0x0F) | 0x40 for b in range(256))
_VARIANT_RFC_4122 = bytes((b & 0x3F) | 0x80 for b in range(256))
_UUID_GROUPS = re.compile("(.{8})(.{4})(.{4})(.{4})(.{12})")  # a UUID's 32 hex digits, 8-4-4-4-12


def _id_batch() -> list[str]:
    """_ID_BATCH ids, the bits set and the text cut in C (translate, hex, findall, join): a few
    hundred nanoseconds an id less than slicing each one in Python."""
    raw = bytearray(os.urandom(16 * _ID_BATCH))
    raw[6::16] = raw[6::16].translate(_VERSION_4)
    raw[8::16] = raw[8::16].translate(_VARIANT_RFC_4122)
    return list(map("-".join, _UUID_GROUPS.findall(raw.hex())))


def uuid4_text() -> str:
    """`str(uuid.uuid4())`: a version-4 UUID of os.urandom's bits (the version and variant bits set
    as uuid4 sets them), made in batches: one system call per 128 ids (an event id per event on the
    request path)."""
    while True:
        try:
            return _ids.popleft()
        except IndexError:
            _ids.extend(_id_batch())


def hex12() -> str:
    """`uuid.uuid4().hex[:12]`: 12 random hex digits (a UUID's first 12, before its version digit)."""
    text = uuid4_text()
    return text[:8] + text[9:13]


def hex32() -> str:
    """`uuid.uuid4().hex`: the same id as uuid4_text, without its hyphens."""
    return uuid4_text().replace("-", "")
