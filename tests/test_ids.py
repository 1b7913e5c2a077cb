"""proxy/ids.py: uuid4's ids, made in batches from os.urandom."""

from __future__ import annotations

import os
import re
import uuid

from proxy import ids

HEX = re.compile("[0-9a-f]+")


def test_uuid4_text_is_a_canonical_version_4_uuid() -> None:
    seen = set()
    for _ in range(5 * ids._ID_BATCH + 3):  # across several batches
        text = ids.uuid4_text()
        parsed = uuid.UUID(text)
        assert str(parsed) == text  # canonical: lowercase, 8-4-4-4-12
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        seen.add(text)
    assert len(seen) == 5 * ids._ID_BATCH + 3
    # the variant's two low bits and every other digit stay random (uuid4's distribution)
    assert {text[19] for text in seen} == set("89ab")
    assert {text[14] for text in seen} == {"4"}
    assert {text[i] for text in seen for i in (0, 15, 20, 35)} == set("0123456789abcdef")


def test_hex_forms_are_uuid4s_hex_and_its_first_twelve_digits() -> None:
    long = [ids.hex32() for _ in range(300)]
    for h in long:
        assert len(h) == 32 and HEX.fullmatch(h)
        parsed = uuid.UUID(hex=h)
        assert parsed.hex == h and parsed.version == 4 and parsed.variant == uuid.RFC_4122
    short = [ids.hex12() for _ in range(300)]
    assert all(len(h) == 12 and HEX.fullmatch(h) for h in short)
    assert len(set(short)) == 300 and len(set(long)) == 300
    # every digit of the twelve is random (none is the version digit)
    assert {h[i] for h in short for i in range(12)} == set("0123456789abcdef")


def test_a_forked_child_never_hands_out_its_parents_ids() -> None:
    ids.uuid4_text()  # a batch made, most of it not handed out yet
    left = list(ids._ids)
    assert left
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id is new
        os.close(read)
        os.write(write, ids.uuid4_text().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert uuid.UUID(child).version == 4
    assert child not in left
    assert list(ids._ids) == left  # the parent's own are untouched
