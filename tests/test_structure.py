"""Results compared by structure (proxy/guards/structure.py, issue 31), as properties.

Noise: ids drawn in any alphabet, with any separator between groups and of any realistic length,
inside a fixed template (an error, a status, a build log). News: content that changed wholesale,
whatever its alphabet (a page of new ids, a result that is only an id). A poll whose status moves
every 1 to 3 polls, however long, is never warned. Examples are drawn from seeded generators
(`derandomize`: the same examples every run).
"""

from __future__ import annotations

import random
import string

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.guards.config import LoopDetectionConfig
from proxy.guards.decision import Action
from proxy.guards.loop.detector import LoopDetector
from proxy.guards.signatures import call_keys, error_fingerprint, result_fingerprint
from proxy.guards.structure import read, same_result

PROPERTY = settings(derandomize=True, max_examples=150, deadline=None)

ALPHABETS = (
    "0123456789ABCDEF",  # GitHub's request ids: `C8F3:2B1A:1F3E6D9`
    "0123456789abcdef",
    string.digits + string.ascii_letters,  # base62
    "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz",  # base58
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567",  # base32
    string.digits + string.ascii_lowercase,  # base36
)

# fixed templates an agent reads again and again while stuck: `{}` is where the id goes
TEMPLATES = (
    "Server Error: 502 Bad Gateway. Please retry later. (request id: {})",
    "query failed: upstream timeout while reading from the metrics store (trace {}), retry later",
    "Your card was declined. See the request log at https://dashboard.example.com/logs/{}",
    "/usr/bin/ld: /tmp/{}.o: in function `handle_request': undefined reference to `parse_header'",
    "job build-7 is still queued behind 12 other jobs on runner pool linux-large ({})",
    '{{"status": "pending", "message": "waiting for the database migration to finish", "request": "{}"}}',
)


@st.composite
def ids(draw: st.DrawFn) -> str:
    """An id as a service mints it: groups of random characters of one alphabet, joined by one
    separator (or none), maybe after a prefix (`req_`)."""
    alphabet = draw(st.sampled_from(ALPHABETS))
    groups = draw(st.integers(1, 5))
    sizes = [draw(st.integers(4, 10)) for _ in range(groups)]
    if sum(sizes) < 10:
        sizes[-1] += 10 - sum(sizes)
    rng = random.Random(draw(st.integers(0, 2**64)))
    separator = draw(st.sampled_from((":", "-", "_", "")))
    body = separator.join("".join(rng.choice(alphabet) for _ in range(n)) for n in sizes)
    return draw(st.sampled_from(("", "req_", "tr-", "cc"))) + body


@given(st.sampled_from(TEMPLATES), ids(), ids())
@PROPERTY
def test_ids_of_any_alphabet_separator_and_length_in_a_fixed_template_are_noise(
    template: str, a: str, b: str
) -> None:
    assert same_result(result_fingerprint(template.format(a)), result_fingerprint(template.format(b)))
    assert same_result(error_fingerprint(template.format(a)), error_fingerprint(template.format(b)))


@given(st.sampled_from(TEMPLATES), st.lists(ids(), min_size=8, max_size=8), st.booleans())
@PROPERTY
def test_a_call_stuck_on_one_answer_with_a_fresh_id_each_time_is_caught(
    template: str, fresh: list[str], errors: bool
) -> None:
    """The same call, the same answer but for a fresh id each time: caught within threshold + 1."""
    d = LoopDetector(LoopDetectionConfig())
    caught = None
    for n, an_id in enumerate(fresh, 1):
        if d.check_tool_call("deploy", {"env": "prod"}, float(n)) and caught is None:
            caught = n
        text = template.format(an_id)
        fingerprint = result_fingerprint({"error": text} if errors else text)
        d.record_tool_result("deploy", {"env": "prod"}, fingerprint, text if errors else None, float(n))
    assert caught is not None and caught <= 6


@given(
    st.lists(ids(), min_size=1, max_size=30),
    st.integers(0, 2**32),
    st.sampled_from(("list", "object", "bare")),
)
@PROPERTY
def test_wholly_new_content_of_any_alphabet_is_news(page: list[str], seed: int, shape: str) -> None:
    """A page of new ids (or a result that is only an id) is news, however id-like."""
    rng = random.Random(seed)
    other = ["".join(rng.choice(string.ascii_letters + string.digits) for _ in range(len(x))) for x in page]

    def render(values: list[str]) -> str:
        if shape == "list":
            return orjson.dumps({"data": [{"id": v, "object": "file"} for v in values]}).decode()
        if shape == "object":
            return orjson.dumps({"ids": values, "next": values[-1]}).decode()
        return "\n".join(values)

    assert not same_result(result_fingerprint(render(page)), result_fingerprint(render(other)))


def test_a_result_that_is_only_an_id_is_news_when_the_id_changes() -> None:
    assert not same_result(
        result_fingerprint("usr_8fK2mZpQ7xL1vN3aR"), result_fingerprint("usr_Q2n7TzKx81pLmW4cV")
    )
    # ... and the same id again is the same result
    assert same_result(
        result_fingerprint("usr_8fK2mZpQ7xL1vN3aR"), result_fingerprint("usr_8fK2mZpQ7xL1vN3aR")
    )


@given(
    st.lists(st.integers(1, 3), min_size=4, max_size=30),
    st.integers(0, 2**32),
    st.booleans(),
)
@PROPERTY
def test_a_moving_poll_is_never_warned(runs: list[int], seed: int, noisy: bool) -> None:
    """A status that changes every 1 to 3 polls, however long the poll goes on, under the defaults;
    with a fresh request id and time in every answer or without."""
    rng = random.Random(seed)
    words = ("queued", "preparing", "building", "testing", "packaging", "uploading", "deploying")
    d = LoopDetector(LoopDetectionConfig())
    n = 0
    for stage, run in enumerate(runs):
        status = f"{words[stage % len(words)]} (stage {stage + 1})"
        for _ in range(run):
            n += 1
            assert d.check_tool_call("get_pipeline", {"id": 88412}, float(n)) == [], (stage, n)
            noise = f" request {rng.getrandbits(64):016x} at 09:{n % 60:02d}:07" if noisy else ""
            d.record_tool_result(
                "get_pipeline", {"id": 88412}, result_fingerprint(status + noise), None, float(n)
            )


def test_a_call_carrying_a_value_first_seen_in_a_result_follows_news() -> None:
    """A cursor handed out by a result, then carried by the next call: that call follows news."""
    d = LoopDetector(LoopDetectionConfig())
    cursor = "eyJvZmZzZXQiOiAyMCwgInNvcnQiOiAiY3JlYXRlZCJ9"
    d.check_tool_call("list_files", {}, 1.0)
    d.record_tool_result("list_files", {}, result_fingerprint({"data": [], "next_cursor": cursor}), None, 1.0)
    d.check_tool_call("list_files", {"cursor": cursor}, 2.0)
    assert d._turn.attempts[-1].follows
    d.record_tool_result("list_files", {"cursor": cursor}, result_fingerprint({"data": []}), None, 2.0)
    d.check_tool_call("list_files", {"cursor": cursor}, 3.0)  # carried again: nothing new to follow
    assert not d._turn.attempts[-1].follows


def test_the_fingerprint_carries_the_template_its_tokens_and_its_links() -> None:
    shape = read(
        result_fingerprint("failed, see https://x.example.com/logs/req_8fK2mZpQ7xL1vN (trace 4fK9Qw2Lp0)")
    )
    assert len(shape.template) == 24 and len(shape.tokens) == 2 and len(shape.follow) == 1
    assert shape.rich  # 40 characters of its own text or more: it says something whatever was asked
    assert read(result_fingerprint("README.md\nbin/\nconfig.yaml\ncurrent -> .\ndata/\nlogs/\n")).rich
    assert not read(result_fingerprint("200 OK")).rich  # about the thing the arguments name
    # the identity carries the digests of what its arguments name, split off before comparing
    _, ident = call_keys("fetch", {"url": "https://x.example.com/logs/req_8fK2mZpQ7xL1vN"})
    assert ident.startswith('fetch({"url":') and "\x1e" in ident


def test_a_page_that_grows_while_the_answer_stays_is_caught_and_blocked() -> None:
    d = LoopDetector(LoopDetectionConfig(action="block"))
    hits = orjson.dumps([{"path": f"src/m{i}.py", "line": i, "text": "def total(items):"} for i in range(4)])
    refused = None
    for page in range(1, 10):
        decisions = d.check_tool_call("search_code", {"q": "def total", "page": page}, float(page))
        if any(x.action >= Action.BLOCK for x in decisions):
            refused = page
            break
        d.record_tool_result(
            "search_code",
            {"q": "def total", "page": page},
            result_fingerprint(hits.decode()),
            None,
            float(page),
        )
    assert refused is not None and refused <= 2 + 5  # the loop starts at page 2: within threshold + 1
