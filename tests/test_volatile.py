"""What is noise and what is news (SPEC §5.1), as properties: `proxy/guards/volatile.py` and the
loop detector's comparison of results across calls.

Noise (a call or result that differs only there is the same): ids in any alphabet inside a text,
timestamps and durations in common formats, counters that go up by one per call. News: a number
that measures something and moves (progress, a depth, a reading, a price, a count), a word or a
file name, a value that is only an id (it names a thing). Ids are drawn from seeded generators in
several alphabets and lengths (`derandomize`: the same examples every run).
"""

from __future__ import annotations

import random
import string
from datetime import UTC, datetime, time, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.guards.config import LoopDetectionConfig
from proxy.guards.decision import Action, Decision, strictest
from proxy.guards.loop.detector import LoopDetector
from proxy.guards.signatures import error_fingerprint, result_fingerprint, stable_signature
from proxy.guards.structure import same_result
from proxy.guards.volatile import is_opaque, stable_text

PROPERTY = settings(derandomize=True, max_examples=150, deadline=None)

# alphabet -> the shortest id drawn from it: trace and request ids as services mint them (Anthropic's
# `req_011C...` 24 base62, ULIDs 26 Crockford base32, W3C trace ids 32 hex, Datadog's 19 digits)
ALPHABETS = {
    "base62": (string.digits + string.ascii_letters, 20),
    "base58": ("123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz", 20),
    "base32": ("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 24),
    "base32-lower": ("abcdefghijklmnopqrstuvwxyz234567", 24),
    "crockford": ("0123456789ABCDEFGHJKMNPQRSTVWXYZ", 20),
    "base36": (string.digits + string.ascii_lowercase, 20),
    "hex": ("0123456789abcdef", 16),
    "decimal": (string.digits, 12),
}


@st.composite
def ids(draw: st.DrawFn) -> str:
    """A random id as services mint them: a random draw from one alphabet, at a realistic length."""
    name = draw(st.sampled_from(sorted(ALPHABETS)))
    alphabet, shortest = ALPHABETS[name]
    length = draw(st.integers(shortest, 40))
    rng = random.Random(draw(st.integers(0, 2**64)))
    return "".join(rng.choice(alphabet) for _ in range(length))


# words, file names and identifiers an agent sends and reads: never taken for ids
WORDS = (
    "README",
    "config",
    "CrashLoopBackOff",
    "ContainerCreating",
    "ImagePullBackOff",
    "ErrImagePull",
    "HealthCheckFailed",
    "JSONDecodeError",
    "NotImplementedError",
    "KeyboardInterrupt",
    "getIdByName",
    "test2024report",
    "base64encoded",
    "Python311",
    "authentication",
    "internationalization",
    "kubernetes",
    "docker-compose.yml",
    "package-lock.json",
    "test_checkout_total.py",
    "CONTRIBUTING.md",
    "nightly-etl",
    "webapp",
    "registry.acme.io",
)


@st.composite
def names(draw: st.DrawFn) -> str:
    """A word, or an identifier made of words (CamelCase, snake_case, kebab-case), maybe a number
    at its end (a version, a year)."""
    words = [w for w in WORDS if not any(c.isdigit() for c in w)]
    parts = draw(st.lists(st.sampled_from(words), min_size=1, max_size=3))
    style = draw(st.sampled_from(("camel", "snake", "kebab")))
    if style == "camel":
        name = "".join(p[:1].upper() + p[1:] for p in parts)
    else:
        name = ("_" if style == "snake" else "-").join(parts)
    return name + draw(st.sampled_from(("", "2", "16", "2024", "_v3")))


@given(ids(), ids())
@PROPERTY
def test_ids_in_any_alphabet_inside_a_text_are_noise(a: str, b: str) -> None:
    template = "upstream failed: internal error (trace {}), please retry"
    assert stable_text(template.format(a)) == stable_text(template.format(b))
    # compared by structure (one template, one fresh token): the same failure (issue 31)
    assert same_result(error_fingerprint(template.format(a)), error_fingerprint(template.format(b)))
    assert stable_signature("curl", {"cmd": f"curl -H 'X-Request-Id: {a}' https://api"}) == stable_signature(
        "curl", {"cmd": f"curl -H 'X-Request-Id: {b}' https://api"}
    )


@given(ids().filter(lambda s: not all(c in string.hexdigits for c in s)))
@PROPERTY
def test_a_value_that_is_only_an_id_names_a_thing(an_id: str) -> None:
    """A cursor, an object id, a file: `get(cursor=...)` with another cursor is another call.
    (Long hex runs and UUIDs are ids by their shape wherever they are, as before.)"""
    assert stable_text(an_id) == an_id
    assert stable_signature("list", {"cursor": an_id}) != stable_signature("list", {"cursor": an_id + "x"})


@given(ids().filter(lambda s: not all(c in string.hexdigits for c in s)))
@PROPERTY
def test_an_id_in_a_path_or_under_a_key_of_its_own_names_a_thing(an_id: str) -> None:
    """`GET /objects/<id>` and `?cursor=<id>` are about that object, that page: another id is
    another call; `trace_id=<id>` is a tag on the message."""
    other = an_id[::-1]
    for template in (
        "GET https://api.example.com/v1/objects/{} returned 200",
        "list?cursor={}&limit=50",
        "cat /tmp/build-{}/out.log",
    ):
        assert stable_text(template.format(an_id)) != stable_text(template.format(other))
    for template in ("failed: dd.trace_id={} timeout", "failed: requestId={} timeout", "failed (trace {})"):
        assert stable_text(template.format(an_id)) == stable_text(template.format(other))


@given(names())
@PROPERTY
def test_words_identifiers_and_file_names_are_news(name: str) -> None:
    text = f"opened {name} and found nothing"
    assert stable_text(text) == text
    assert result_fingerprint(f"status: {name}") != result_fingerprint("status: Running")


def test_the_id_rule_both_ways_on_known_tokens() -> None:
    for token in ("8fK2mZpQ7xL1vN3a", "JBSWY3DPEHPK3PXP", "01ARZ3NDEKTSV4RRFFQ69G5FAV", "3yZe7d9fJ1sWqkX8"):
        assert is_opaque(token), token
    for token in ("README", "CrashLoopBackOff", "authentication", "test2024report", "getIdByName"):
        assert not is_opaque(token), token
    assert not is_opaque("a7Xk2")  # below 12 characters nothing is taken for an id


# -- timestamps and durations ---------------------------------------------------------------------

T0 = datetime(2026, 3, 2, 9, 14, 7, tzinfo=UTC)

TIME_FORMATS = (
    lambda t: t.isoformat().replace("+00:00", "Z"),  # ISO 8601
    lambda t: t.isoformat(timespec="milliseconds"),
    lambda t: t.strftime("%Y-%m-%d %H:%M:%S,") + f"{t.microsecond // 1000:03d}",  # Python logging
    lambda t: t.strftime("%a, %d %b %Y %H:%M:%S GMT"),  # RFC 7231 (HTTP Date)
    lambda t: t.strftime("%d/%b/%Y:%H:%M:%S +0000"),  # nginx access log
    lambda t: t.strftime("%H:%M:%S"),  # a clock
    lambda t: str(int(t.timestamp())),  # epoch seconds
    lambda t: str(int(t.timestamp() * 1000)),  # epoch milliseconds
    lambda t: f"{int((t - T0).total_seconds() // 60)} minutes ago",  # relative, as a UI shows it
)
DURATION_FORMATS = (
    lambda s: f"{s:.2f}s",
    lambda s: f"{int(s * 1000)}ms",
    lambda s: f"{int(s * 1000)} ms",
    lambda s: f"{s:.1f} seconds",
    lambda s: f"{int(s)} sec",
    lambda s: f"{int(s // 60)}m{s % 60:.1f}s",  # Go's time.Duration
    lambda s: f"{int(s // 3600)}h{int(s % 3600 // 60)}m{int(s % 60)}s",
    lambda s: f"PT{s:.1f}S",  # ISO 8601 duration
    lambda s: f"{int(s // 3600):02d}:{int(s % 3600 // 60):02d}:{int(s % 60):02d}",
)


@given(
    st.sampled_from(range(len(TIME_FORMATS))),
    st.floats(0, 86_400 * 30),
    st.floats(0, 86_400 * 30),
)
@PROPERTY
def test_timestamps_in_common_formats_are_noise(fmt: int, a: float, b: float) -> None:
    render = TIME_FORMATS[fmt]
    first = T0 + timedelta(seconds=a)
    second = T0 + timedelta(seconds=b)
    if fmt in (3, 4):  # formats whose date stands apart keep the day: a date alone names a day (news)
        second = datetime.combine(first.date(), time(), UTC) + timedelta(seconds=b % 86_400)
    one, two = render(first), render(second)
    assert stable_text(f"checked at {one}: healthy") == stable_text(f"checked at {two}: healthy")


@given(st.sampled_from(range(len(DURATION_FORMATS))), st.floats(0.01, 20_000), st.floats(0.01, 20_000))
@PROPERTY
def test_durations_in_common_formats_are_noise(fmt: int, a: float, b: float) -> None:
    render = DURATION_FORMATS[fmt]
    assert stable_text(f"14 passed in {render(a)}") == stable_text(f"14 passed in {render(b)}")


# -- counters and measurements, across calls -------------------------------------------------------

QUIET_PER_TOOL: dict[str, Any] = {"idempotent": (100, 100, 100), "mutating": (100, 100, 100)}


def _poll(results: list[Any], *, errors: bool = False) -> list[tuple[int, Decision]]:
    """One MCP tool called again and again with the same arguments, returning `results` in turn
    (as errors when `errors`): the decisions, by call number."""
    d = LoopDetector(LoopDetectionConfig(**QUIET_PER_TOOL))
    fired: list[tuple[int, Decision]] = []
    for n, result in enumerate(results, 1):
        decisions = d.check_tool_call("job_status", {"job": "j1"}, float(n))
        fired += [(n, x) for x in decisions]
        if strictest(decisions).action >= Action.BLOCK:
            break
        text = result if isinstance(result, str) else str(result)
        if errors:
            d.record_tool_result(
                "job_status", {"job": "j1"}, result_fingerprint({"error": text}), text, float(n)
            )
        else:
            d.record_tool_result("job_status", {"job": "j1"}, result_fingerprint(result), None, float(n))
    return fired


COUNTER_TEXTS = (
    "still running (attempt {n} of 20)",
    "Retry #{n}: upstream returned 503",
    "poll {n}: job queued",
    "call no. {n}; nothing new",
    '{{"status": "queued", "iteration": {n}}}',
    "job queued [#{n}]",
)


@given(st.sampled_from(COUNTER_TEXTS), st.integers(0, 10_000), st.booleans(), ids())
@PROPERTY
def test_a_counter_that_goes_up_by_one_per_call_is_noise(
    template: str, start: int, errors: bool, trace: str
) -> None:
    """The same poll, the same answer but for its counter and a fresh trace id: a loop, caught
    within threshold + 1 calls (retry-without-progress for errors, repetition otherwise)."""
    results = [
        template.format(n=start + i) + f" trace={trace[::-1] if i % 2 else trace} ok" for i in range(8)
    ]
    fired = _poll(results, errors=errors)
    assert fired and fired[0][0] <= 6, fired


MEASUREMENT_TEXTS = (
    "running {n}%",  # progress
    "queue depth: {n} messages",  # a depth
    "reactor temperature {n} C",  # a reading
    "BTC-USD last trade ${n}",  # a price
    "search returned {n} results",  # a count
    '{{"state": "running", "progress": {n}}}',
    '{{"state": "training", "iteration": {n}00}}',  # named like a counter, but it jumps: progress
    "{n} of 500 replicas are available",
    "downloaded 15{n:03d}00000 of 1990000000 bytes",  # a quantity in the epoch range
)


@given(
    st.sampled_from(MEASUREMENT_TEXTS),
    st.lists(st.integers(0, 500), min_size=8, max_size=8, unique=True).filter(
        lambda xs: all(b != a + 1 for a, b in zip(xs, xs[1:], strict=False))
    ),
)
@PROPERTY
def test_a_number_that_measures_something_is_news(template: str, values: list[int]) -> None:
    """A number that moves otherwise than one more per call: every poll learned something."""
    assert _poll([template.format(n=v) for v in values]) == []


def test_progress_that_moves_by_one_is_news_when_it_is_not_named_a_count_of_calls() -> None:
    """`1 of 3 replicas` after `0 of 3` is a measurement, whatever its step; `attempt 2` after
    `attempt 1` is a counter."""
    assert _poll([f"{i} of 8 updated replicas are available" for i in range(8)]) == []
    assert _poll([f"running {10 + i}%" for i in range(8)]) == []
    assert _poll([f"waiting (attempt {i})" for i in range(1, 9)])


def test_a_counter_that_jumps_is_news() -> None:
    assert _poll([f"waiting (attempt {i * 3})" for i in range(1, 9)]) == []


# -- results are folded as arguments are ---------------------------------------------------------


@given(
    st.text(string.ascii_letters + " ", min_size=3, max_size=60).filter(lambda s: s.strip()),
    st.lists(st.sampled_from(("upper", "lower", "title", "spaces", "question")), min_size=1, max_size=3),
)
@PROPERTY
def test_results_are_folded_as_arguments_are(query: str, variations: list[str]) -> None:
    """A search that echoes its query: the query re-sent in another case or spacing is the same
    call, and its echo the same result."""
    varied = query
    for v in variations:
        varied = {
            "upper": varied.upper(),
            "lower": varied.lower(),
            "title": varied.title(),
            "spaces": "  ".join(varied.split()) + " ",
            "question": varied + "?",
        }[v]
    assert stable_signature("search", {"q": query}) == stable_signature("search", {"q": varied})
    assert same_result(
        result_fingerprint({"query": query, "hits": []}), result_fingerprint({"query": varied, "hits": []})
    )
    assert same_result(
        result_fingerprint(f"No results for {query}"), result_fingerprint(f"No results for {varied}")
    )


def test_a_search_re_sent_with_case_variations_whose_result_echoes_it_is_caught() -> None:
    d = LoopDetector(LoopDetectionConfig(**QUIET_PER_TOOL))
    queries = [
        "Tripwire pricing",
        "tripwire PRICING",
        "Tripwire  Pricing?",
        "TRIPWIRE pricing",
        "tripwire pricing.",
    ]
    fired: list[Decision] = []
    for n, q in enumerate(queries * 2, 1):
        fired += d.check_tool_call("search", {"query": q}, float(n))
        d.record_tool_result(
            "search", {"query": q}, result_fingerprint(f'No results found for "{q}".'), None, float(n)
        )
        if fired:
            assert n <= 6
            break
    assert fired and fired[0].kind in ("repetition", "no_progress")


@pytest.mark.parametrize(
    "noise", ["trace 8fK2mZpQ7xL1vN3a", "request JBSWY3DPEHPK3PXP", "id 01ARZ3NDEKTSV4RRFFQ69G5FAV"]
)
def test_the_same_failure_with_a_random_trace_id_and_an_attempt_counter_is_a_retry_loop(noise: str) -> None:
    rng = random.Random(noise)
    alphabet = string.digits + string.ascii_letters
    errors = [
        f"Internal error ({noise.split()[0]} {''.join(rng.choice(alphabet) for _ in range(20))}, attempt {i})"
        for i in range(1, 9)
    ]
    fired = _poll(errors, errors=True)
    assert fired and fired[0][0] <= 5, fired  # the poll's no-progress warning (4), then:
    assert (5, "retry_no_progress") in [(n, d.kind) for n, d in fired]


def test_in_arguments_only_a_count_of_attempts_is_erased() -> None:
    """`#2400` in a query names an issue; `(attempt 3)` counts the agent's tries."""
    assert stable_signature("search", {"q": "issue #2400"}) != stable_signature(
        "search", {"q": "issue #2401"}
    )
    assert stable_signature("search", {"q": "refund done? (attempt 3)"}) == stable_signature(
        "search", {"q": "refund done? (attempt 4)"}
    )
