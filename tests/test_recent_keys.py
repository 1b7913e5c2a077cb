"""RecentKeys answers as the insertion-ordered dict it stands for, one key kept without a dict."""

from __future__ import annotations

import random

import pytest

from proxy.recent_keys import RecentKeys


def test_it_answers_as_a_dict_moved_to_the_end_on_every_add() -> None:
    rng = random.Random(33)
    for _ in range(300):
        keys: RecentKeys[int] = RecentKeys()
        ref: dict[int, None] = {}
        for _ in range(rng.randrange(1, 30)):
            op, k = rng.random(), rng.randrange(6)
            if op < 0.5:
                keys.add(k)
                ref.pop(k, None)
                ref[k] = None
            elif op < 0.75:
                keys.discard(k)
                ref.pop(k, None)
            elif ref:
                oldest = next(iter(ref))
                del ref[oldest]
                assert keys.pop_oldest() == oldest
            else:
                with pytest.raises(KeyError):
                    keys.pop_oldest()
            assert list(keys) == list(ref)
            assert list(reversed(keys)) == list(reversed(ref))
            assert len(keys) == len(ref) and bool(keys) == bool(ref)
            assert keys.newest() == (next(reversed(ref)) if ref else None)
            assert all((k in keys) == (k in ref) for k in range(6))


def test_one_key_is_kept_without_a_dict() -> None:
    keys: RecentKeys[bytes] = RecentKeys()
    keys.add(b"a")
    keys.add(b"a")
    assert keys._many is None and list(keys) == [b"a"]
    keys.add(b"b")
    assert keys._many == {b"a": None, b"b": None}


def test_it_is_a_small_set_too() -> None:
    revisions: RecentKeys[int] = RecentKeys()
    assert 0 not in revisions
    revisions.add(0)
    assert 0 in revisions and revisions == {0}
    revisions.add(1)
    assert revisions == {0, 1}
    revisions.clear()
    assert not revisions and 0 not in revisions and list(revisions) == []
