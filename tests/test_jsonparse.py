"""proxy.jsonparse: exactly what `json.loads(bytes)` accepts, at any depth, without recursion (issue 11).

The iterative parser is checked against the standard library with hypothesis: every document
either parses to an equal value in both or is refused by both. Deep documents (which json.loads
cannot read) are checked by round trip through the iterative encoder.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
import pytest

from proxy import jsonparse
from proxy.guards import signatures, volatile

hypothesis = pytest.importorskip("hypothesis")  # in the dev extra; the mcp<2 env has only [test]
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

DEEP = 10_000


def outcome(fn: Any, doc: Any) -> tuple[str, str]:
    """("ok", repr of the value) or ("error", ""): repr compares NaN, -0.0, int/float and key order."""
    try:
        return "ok", repr(fn(doc))
    except ValueError:  # JSONDecodeError, UnicodeDecodeError, the int digit limit
        return "error", ""


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),  # includes lone surrogates
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=25,
)


@given(json_values, st.booleans(), st.sampled_from([None, 0, 2]))
@settings(max_examples=400, deadline=None, database=None, derandomize=True)
def test_iterative_parser_equals_json_loads_on_serialised_values(
    value: Any, ascii_only: bool, indent: Any
) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    doc = text.encode("utf-8", "surrogatepass")
    assert outcome(jsonparse.loads_iterative, doc) == outcome(json.loads, doc)
    assert outcome(jsonparse.loads_iterative, text) == outcome(json.loads, text)
    assert outcome(jsonparse.loads, doc) == fast_or_stdlib(doc)


def fast_or_stdlib(doc: bytes) -> tuple[str, str]:
    """What jsonparse.loads promises: orjson's value where orjson accepts (the same documents
    json.loads accepts, but integers beyond 64 bits read as floats), else json.loads's."""
    try:
        return "ok", repr(orjson.loads(doc))
    except orjson.JSONDecodeError:
        return outcome(json.loads, doc)


NEAR_JSON = '{}[]",:0123456789.eE+- \t\n\r\\/ubfnrtx\x00\x1fNaIyltsé٣\ud83d\udc00'


@given(st.text(alphabet=NEAR_JSON, max_size=40))
@settings(max_examples=1500, deadline=None, database=None, derandomize=True)
def test_iterative_parser_equals_json_loads_on_near_json_text(text: str) -> None:
    assert outcome(jsonparse.loads_iterative, text) == outcome(json.loads, text)
    doc = text.encode("utf-8", "surrogatepass")
    assert outcome(jsonparse.loads_iterative, doc) == outcome(json.loads, doc)
    assert outcome(jsonparse.loads_lenient, doc) == outcome(json.loads, doc)
    assert_orjson_accepts_less(doc)


def assert_orjson_accepts_less(doc: bytes) -> None:
    """The fast path never accepts a document json.loads refuses."""
    if fast_or_stdlib(doc)[0] == "ok":
        assert outcome(json.loads, doc)[0] == "ok"


@given(st.binary(max_size=40))
@settings(max_examples=800, deadline=None, database=None, derandomize=True)
def test_iterative_parser_equals_json_loads_on_bytes(doc: bytes) -> None:
    assert outcome(jsonparse.loads_iterative, doc) == outcome(json.loads, doc)
    assert_orjson_accepts_less(doc)


@given(st.lists(st.sampled_from(["list", "dict"]), min_size=1, max_size=700), json_values, st.booleans())
@settings(max_examples=100, deadline=None, database=None, derandomize=True)
def test_nested_documents_within_the_stdlib_limit_equal_json_loads(
    kinds: list[str], leaf: Any, broken: bool
) -> None:
    head = "".join("[1, " if k == "list" else '{"k": 0, "k": ' for k in kinds)
    tail = "".join("]" if k == "list" else "}" for k in reversed(kinds))
    if broken:
        tail = tail[:-1]
    doc = (head + json.dumps(leaf) + tail).encode()
    assert outcome(jsonparse.loads_iterative, doc) == outcome(json.loads, doc)


@given(json_values, st.sampled_from(["utf-16", "utf-16-le", "utf-32", "utf-32-be", "utf-8-sig"]))
@settings(max_examples=200, deadline=None, database=None, derandomize=True)
def test_other_encodings_as_json_loads(value: Any, encoding: str) -> None:
    doc = json.dumps(value).encode(encoding)  # ASCII text: every encoding can carry it
    assert outcome(jsonparse.loads_iterative, doc) == outcome(json.loads, doc)
    assert outcome(jsonparse.loads, doc) == fast_or_stdlib(doc)


@given(json_values, st.booleans())
@settings(max_examples=400, deadline=None, database=None, derandomize=True)
def test_dumps_text_equals_json_dumps(value: Any, sort_keys: bool) -> None:
    text = jsonparse.dumps_text(value, sort_keys=sort_keys)
    raw = text.encode("utf-8")  # never a lone surrogate in the output
    try:
        expected = json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys)
        expected.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: escaped by dumps_text, the value survives
        assert repr(json.loads(raw)) == repr(json.loads(json.dumps(value, sort_keys=sort_keys)))
    else:
        assert text == expected
    assert repr(json.loads(jsonparse.dumps(value))) == repr(json.loads(json.dumps(value)))


# --- the cases of the issue ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "doc",
    [
        b'{"content": "cut emoji \\ud83d"}',
        b'{"t": NaN, "u": Infinity, "v": -Infinity}',
        '{"text": "utf-16"}'.encode("utf-16"),
        '{"text": "utf-32"}'.encode("utf-32"),
        b'\xef\xbb\xbf{"bom": 1}',
        b'{"n": ' + b"9" * 4300 + b"}",
        b'"\xed\xa0\xbd"',  # an encoded surrogate: json.loads reads it (surrogatepass)
    ],
)
def test_accepts_what_json_loads_accepts(doc: bytes) -> None:
    assert repr(jsonparse.loads(doc)) == repr(json.loads(doc))
    assert repr(jsonparse.loads_iterative(doc)) == repr(json.loads(doc))


@pytest.mark.parametrize(
    "doc",
    [
        b'{"content": "\xff\xfe invalid utf-8 \xc3"}',
        b'{"n": ' + b"9" * 5000 + b"}",
        b"[" * DEEP + b"1" + b"]" * (DEEP - 1),  # deep and unclosed
        b"[" * DEEP + b"1," + b"]" * DEEP,  # deep, trailing comma
        b'{"a": }',
        b"garbage",
        b"",
        b"[1] [2]",
        b'{"a" 1}',
        b"nan",
        b"+1",
    ],
)
def test_refuses_everything_else(doc: bytes) -> None:
    with pytest.raises(ValueError):
        jsonparse.loads(doc)
    with pytest.raises(ValueError):
        jsonparse.loads_iterative(doc)


@pytest.mark.parametrize(
    "doc",
    [
        b"[" * DEEP + b"]" * DEEP,
        b'{"a":' * DEEP + b"null" + b"}" * DEEP,
        b'{"messages":['
        + b'{"x":[' * (DEEP // 2)
        + b'"\\ud83d",NaN,123456789012345678901234567890'
        + b"]}" * (DEEP // 2)
        + b"]}",
    ],
)
def test_deep_documents_parse_without_recursion(doc: bytes) -> None:
    with pytest.raises(RecursionError):
        json.loads(doc)  # what the standard library cannot do
    value = jsonparse.loads(doc)
    assert jsonparse.max_depth(value) >= DEEP
    # the iterative encoder writes it back byte for byte (compact input)
    assert jsonparse.dumps(value) == doc


def test_deep_document_with_whitespace_and_unicode() -> None:
    doc = ("[ " * DEEP + '"é \\ud83d"' + " ]\n" * DEEP).encode()
    value = jsonparse.loads(doc)
    inner = value
    for _ in range(DEEP):
        (inner,) = inner
    assert inner == "é \ud83d"


def test_cap_depth_replaces_deep_subtrees_only() -> None:
    shallow = {"a": [1, {"b": 2}]}
    assert jsonparse.cap_depth(shallow, 3, "M") is shallow
    assert jsonparse.cap_depth({"a": [[1]], "z": 0}, 2, "M") == {"a": ["M"], "z": 0}
    deep = jsonparse.loads(b"[" * DEEP + b"]" * DEEP)
    capped = jsonparse.cap_depth(deep, 64, "__TRUNCATED__")
    assert jsonparse.max_depth(capped) == 64
    assert orjson.dumps(capped)  # now writable by orjson (which stops at 254)


def test_dumps_keeps_what_orjson_would_change() -> None:
    value = {"a": math.inf, "b": [math.nan], "c": 2**70, "d": "\ud83d"}
    assert jsonparse.dumps(value) == b'{"a":Infinity,"b":[NaN],"c":1180591620717411303424,"d":"\\ud83d"}'
    assert jsonparse.dumps({"a": 1.5, "b": "é"}) == orjson.dumps({"a": 1.5, "b": "é"})


# --- the guards' iterative walks equal the recursive ones they replaced (issue 11, 2) --------------
# (signatures.canonical_value, volatile.stable_value, signatures.content_text: normal inputs keep
# exactly the output they had; tests/test_reliability_parsing.py covers the deep ones)


def old_canonical_value(value: Any) -> Any:
    """signatures.canonical_value as it was (recursive): the reference for normal inputs."""
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return repr(value)
        rounded = round(value, 6)
        return 0.0 if rounded == 0 else rounded
    if isinstance(value, dict):
        return {str(k): old_canonical_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [old_canonical_value(v) for v in value]
    return str(value)


def old_stable_value(value: Any, *, fold_case: bool = False) -> Any:
    """volatile.stable_value as it was (recursive)."""
    if isinstance(value, str):
        if value[:1] in ("{", "[") and len(value) < volatile.JSON_TEXT_LIMIT:
            try:
                return old_stable_value(orjson.loads(value), fold_case=fold_case)
            except orjson.JSONDecodeError:
                pass
        text = volatile.stable_text(value)
        if fold_case:
            text = volatile.fold_text(text)  # (spaces next to punctuation go too: issue 31)
        return text
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = str(k)
            if volatile.is_volatile_key(key):
                continue
            if (
                isinstance(v, int | float)
                and not isinstance(v, bool)
                and volatile._epoch_like(float(v))
                and volatile._key(key).endswith(volatile._TIME_KEY_ENDS)
            ):
                continue
            out[key] = old_stable_value(v, fold_case=fold_case)
        return out
    if isinstance(value, list | tuple):
        return [old_stable_value(v, fold_case=fold_case) for v in value]
    return value


def old_content_text(content: Any, limit: int = 500) -> str:
    """signatures.content_text as it was (recursive)."""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = [old_content_text(p, limit) for p in content]
        text = "\n".join(p for p in parts if p)
    elif isinstance(content, dict):
        if isinstance(content.get("text"), str):
            text = content["text"]
        elif "content" in content:
            text = old_content_text(content["content"], limit)
        elif isinstance(content.get("message"), str):
            text = content["message"]
        else:
            text = signatures.canonical_args(content)
    elif content is None:
        text = ""
    else:
        text = signatures.canonical_args(content)
    return text.strip()[:limit]


KEYS = st.sampled_from(["a", "b", "text", "content", "message", "request_id", "created_at", "q", "ts"])
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1.7e9, 1.7e12, "Weather in Paris?", '{"x": 1, "nonce": "n"}', "[1, 2]", "took 0.31s"]),
    st.text(max_size=12),
)
values = st.recursive(
    leaves,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(KEYS | st.text(max_size=4), kids, max_size=4),
    max_leaves=30,
)


@given(values, st.booleans())
@example(
    {"content": [-10000, False]}, False
)  # a wrapper's list text is cut and stripped twice, as recursion did
@settings(max_examples=500, deadline=None, database=None, derandomize=True)
def test_iterative_canonical_and_stable_values_equal_the_recursive_ones(value: Any, fold: bool) -> None:
    assert repr(signatures.canonical_value(value)) == repr(old_canonical_value(value))
    expected = old_stable_value(value, fold_case=fold)
    assert repr(volatile.stable_value(value, fold_case=fold)) == repr(expected)
    assert signatures.content_text(value) == old_content_text(value)
    assert signatures.content_text(value, 7) == old_content_text(value, 7)
