from proxy.per_agent import PerAgent


def test_reads_as_a_dict_keyed_by_agent_and_key() -> None:
    index: PerAgent[bytes, str] = PerAgent()
    assert not index and len(index) == 0 and index.get("a", b"k") is None
    index.set("a", b"k", "one")
    index.set("b", b"k", "two")
    index.set("a", b"j", "three")
    assert index and len(index) == 3
    assert index[("a", b"k")] == "one" and index.get("b", b"k") == "two"
    assert ("a", b"j") in index and ("b", b"j") not in index and "a" not in index
    assert index.of("a") == {b"k": "one", b"j": "three"} and index.of("c") is None


def test_an_agent_left_with_no_key_is_dropped() -> None:
    index: PerAgent[bytes, str] = PerAgent()
    index.set("a", b"k", "one")
    assert index.pop("a", b"nope") is None and index
    assert index.pop("a", b"k") == "one"
    assert not index and index.of("a") is None and index.pop("a", b"k") is None
    index.set("a", b"k", "one")
    keys = index.of("a")
    assert keys is not None
    del keys[b"k"]
    index.drop_empty("a")
    assert not index and len(index) == 0
