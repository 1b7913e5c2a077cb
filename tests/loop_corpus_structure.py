"""Corpus sessions of issue 31: news judged by structure, not by guessing which strings are ids.

Measured on realistic sessions, the id heuristics moved errors around: an honest agent paging
UUIDs with opaque base64 cursors was blocked, a CI poll whose status moves every poll or two was
warned, and failures carrying a request id in a short alphabet, a base62 trace id or a request log
URL, a build loop differing only by a temp object file, a test run only by its random seed, kubectl
output only by ages, a page number or a path that grows while the answer stays the same, and a
model repeating its text on every "Continue." were never caught. Each is a session here, honest
and stuck, over the three dialects and MCP through the aggregate `/mcp` (tools named
`SERVER__TOOL`). Imported by `loop_corpus.py` into SESSIONS.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import orjson
from loop_corpus import Call, Reply, Session, Step, User, _rid, _uuid

_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_HEX_UPPER = "0123456789ABCDEF"


def _short_alphabet_id(i: int) -> str:
    """GitHub's `X-GitHub-Request-Id` shape: hex groups joined by colons (`C8F3:2B1A:1F3E6D9`)."""
    digest = hashlib.sha256(f"gh:{i}".encode()).hexdigest().upper()
    return f"{digest[:4]}:{digest[4:8]}:{digest[8:15]}:{digest[15:22]}:{digest[22:30]}"


def _clock(i: int) -> str:
    return f"{9 + i // 60:02d}:{i % 60:02d}:{(i * 7) % 60:02d}"


def _seed(i: int) -> int:
    return int(hashlib.sha256(f"seed:{i}".encode()).hexdigest(), 16) % 9_000_000_000 + 1_000_000_000


def _temp(i: int) -> str:
    """gcc's temporary object file: `/tmp/cc` and six random letters and digits."""
    return "cc" + _rid(_B62, "tmp", i, 6)


def _cursor(offset: int) -> str:
    """An opaque base64 cursor, as many APIs hand them out (`eyJvZmZzZXQiOiAyMH0=`)."""
    return base64.b64encode(orjson.dumps({"offset": offset, "sort": "created"})).decode()


# --- stuck ----------------------------------------------------------------------------------------

_SEARCH_HITS = [
    {"path": "src/billing/invoice.py", "line": 88, "text": "def total(self) -> Decimal:"},
    {"path": "src/billing/tax.py", "line": 12, "text": "def total_with_tax(amount):"},
    {"path": "tests/test_invoice.py", "line": 40, "text": "assert invoice.total() == 120"},
    {"path": "src/cart/cart.py", "line": 7, "text": "def total(items):"},
]
_LISTING = "README.md\nbin/\nconfig.yaml\ncurrent -> .\ndata/\nlogs/\n"


def _pods(ages: tuple[str, str, str], ready: tuple[str, str, str] = ("0/1", "0/1", "0/1")) -> str:
    status = ["CrashLoopBackOff" if r == "0/1" else "Running" for r in ready]
    rows = [
        f"api-7d9f8b6c5-{s}   {r}     {st:<16} 5          {a}"
        for s, r, st, a in zip(("x2k9p", "m4q7z", "t8w3n"), ready, status, ages, strict=True)
    ]
    return "NAME                 READY   STATUS           RESTARTS   AGE\n" + "\n".join(rows) + "\n"


_POD_AGES = [("12m", "12m", "11m"), ("13m", "13m", "12m"), ("14m", "14m", "13m"), ("16m", "16m", "15m")]
_POD_AGES += [("19m", "19m", "18m"), ("25m", "25m", "24m"), ("1h2m", "1h2m", "61m"), ("3h4m", "3h4m", "3h3m")]


def _pytest_seeded(seed: int, seconds: float, failure: str = "AssertionError: 3 != 4") -> str:
    return (
        f"Using --randomly-seed={seed}\n"
        "============================= test session starts ==============================\n"
        "collected 48 items\n\n"
        "tests/test_cart.py ........F.......\n\n"
        "FAILED tests/test_cart.py::test_discount_applies_once - " + failure + "\n"
        f"========================= 1 failed, 47 passed in {seconds:.2f}s =========================\n"
    )


def _gcc(i: int, error: str = "undefined reference to `parse_header'") -> str:
    return (
        f"[{_clock(i)}] gcc -O2 -o server main.c http.c\n"
        f"/usr/bin/ld: /tmp/{_temp(i)}.o: in function `handle_request':\n"
        f"main.c:(.text+0x1a4): {error}\n"
        "collect2: error: ld returned 1 exit status\n"
        f"[{_clock(i + 1)}] build failed (exit 1)\n"
    )


STUCK: list[Session] = [
    Session(
        name="error_with_short_alphabet_request_id",
        stuck=True,
        shape="retry (ids in errors)",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call(
                "create_release",
                {"repo": "acme/api", "tag": "v2.4.1"},
                error="Server Error: 502 Bad Gateway. Please retry. "
                f"(X-GitHub-Request-Id: {_short_alphabet_id(i)})",
            )
            for i in range(8)
        ),
        notes="GitHub's request ids: hex groups joined by colons, each group too short to be an id alone",
    ),
    Session(
        name="error_with_short_base62_trace_id",
        stuck=True,
        shape="retry (ids in errors)",
        dialect="anthropic",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call(
                "query_metrics",
                {"expr": "rate(http_requests_total[5m])"},
                error=f"query failed: upstream timeout (trace {_rid(_B62, 'tr', i, 10)}, retry later)",
            )
            for i in range(8)
        ),
    ),
    Session(
        name="error_with_request_log_url",
        stuck=True,
        shape="retry (ids in errors)",
        dialect="responses",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call(
                "charge_card",
                {"customer": "cus_42", "amount_cents": 1999},
                error="Your card was declined. Request log: "
                f"https://dashboard.stripe.com/test/logs/req_{_rid(_B62, 'req', i, 14)}",
            )
            for i in range(8)
        ),
    ),
    Session(
        name="aggregate_error_with_request_log_url",
        stuck=True,
        shape="retry (ids in errors)",
        transport="mcp",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call(
                "stripe__create_refund",
                {"charge": "ch_3PqR", "amount": 500},
                error=f"No such charge: 'ch_3PqR' (request log https://dashboard.stripe.com/logs/req_{_rid(_B62, 'rf', i, 14)})",
            )
            for i in range(8)
        ),
        notes="MCP through the aggregate /mcp: the tool is named SERVER__TOOL",
    ),
    Session(
        name="build_loop_temp_object_and_clock",
        stuck=True,
        shape="build loop",
        loop_start=1,
        round_len=1,
        steps=tuple(Call("bash", {"command": "make server"}, _gcc(i)) for i in range(8)),
        notes="the linker names a fresh /tmp/ccXXXXXX.o and the build log prints clock times",
    ),
    Session(
        name="build_loop_temp_object_anthropic",
        stuck=True,
        shape="build loop",
        dialect="anthropic",
        loop_start=1,
        round_len=1,
        steps=tuple(Call("Bash", {"command": "make server 2>&1"}, _gcc(20 + 3 * i)) for i in range(8)),
    ),
    Session(
        name="test_run_random_seed",
        stuck=True,
        shape="test loop",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call("run_tests", {"path": "tests/test_cart.py"}, _pytest_seeded(_seed(i), 2.31 + i / 50))
            for i in range(8)
        ),
        notes="pytest-randomly prints a fresh 10-digit seed each run; the failure is the same",
    ),
    Session(
        name="test_run_random_seed_responses",
        stuck=True,
        shape="test loop",
        dialect="responses",
        transport="fc",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call(
                "shell",
                {"command": ["pytest", "-q", "tests/test_cart.py"]},
                _pytest_seeded(_seed(40 + i), 1.9),
            )
            for i in range(8)
        ),
    ),
    Session(
        name="kubectl_ages_only",
        stuck=True,
        shape="poll (stuck)",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call("kubectl", {"args": "get pods -n shop -l app=api"}, _pods(ages)) for ages in _POD_AGES
        ),
        notes="CrashLoopBackOff forever: only the AGE column moves (12m, 3h4m)",
    ),
    Session(
        name="aggregate_kubectl_ages_only",
        stuck=True,
        shape="poll (stuck)",
        transport="mcp",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call("k8s__pods_list", {"namespace": "shop", "selector": "app=api"}, _pods(ages))
            for ages in _POD_AGES
        ),
    ),
    Session(
        name="search_page_grows_same_results",
        stuck=True,
        shape="pagination (stuck)",
        loop_start=2,
        round_len=1,
        steps=tuple(
            Call("search_code", {"query": "def total", "page": p}, {"total_count": 4, "items": _SEARCH_HITS})
            for p in range(1, 10)
        ),
        notes="the API ignores the page past the last one: page 2, 3, 4... return page 1",
    ),
    Session(
        name="search_page_grows_same_results_anthropic",
        stuck=True,
        shape="pagination (stuck)",
        dialect="anthropic",
        transport="fc",
        loop_start=2,
        round_len=1,
        steps=tuple(
            Call(
                "WebSearch",
                {"query": "tripwire proxy loop detection", "page": p},
                orjson.dumps(_SEARCH_HITS).decode(),
            )
            for p in range(1, 10)
        ),
    ),
    Session(
        name="path_grows_same_listing",
        stuck=True,
        shape="path loop",
        loop_start=2,
        round_len=1,
        steps=tuple(
            Call("list_directory", {"path": "/srv/app" + "/current" * d}, _LISTING) for d in range(9)
        ),
        notes="`current` links to `.`: every deeper path lists the same directory",
    ),
    Session(
        name="aggregate_path_grows_same_listing",
        stuck=True,
        shape="path loop",
        transport="mcp",
        loop_start=2,
        round_len=1,
        steps=tuple(
            Call("files__list_directory", {"path": "/srv/app" + "/current" * d}, _LISTING) for d in range(9)
        ),
    ),
    Session(
        name="query_case_and_whitespace",
        stuck=True,
        shape="near-duplicate queries",
        dialect="responses",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call("run_sql", {"sql": q}, "id | email\n---+------\n(0 rows)\n")
            for q in (
                "SELECT id, email FROM users WHERE email = 'ana@example.com'",
                "select id, email from users where email='ana@example.com'",
                "SELECT id,email FROM users WHERE email = 'ana@example.com'",
                "select id , email from users where email = 'ana@example.com' ",
                "SELECT  id, email  FROM users  WHERE email='ana@example.com'",
                "Select id, email From users Where email = 'ana@example.com'",
                "select id, email from users where email = 'ana@example.com'",
                "SELECT id, email FROM users WHERE email='ana@example.com'",
            )
        ),
    ),
    Session(
        name="float_jitter_ping_pong",
        stuck=True,
        shape="cycle 2",
        loop_start=1,
        round_len=2,
        steps=tuple(
            c
            for i in range(5)
            for c in (
                Call(
                    "set_price",
                    {"sku": "TSHIRT-M", "price": 19.99 if i % 2 else 19.990000000000002},
                    f"price of TSHIRT-M set to {19.99 if i % 2 else 19.990000000000002}",
                ),
                Call(
                    "get_price",
                    {"sku": "TSHIRT-M"},
                    {"sku": "TSHIRT-M", "price": 19.989999999999998 if i % 2 else 19.99},
                ),
            )
        ),
        notes="float artifacts of the agent's own arithmetic: 19.99 and 19.990000000000002 are one price",
    ),
]

# --- honest ---------------------------------------------------------------------------------------


def _uuid_page(p: int, size: int = 10) -> dict[str, Any]:
    return {
        "data": [{"id": _uuid("item", p * size + j), "object": "file"} for j in range(size)],
        "has_more": p < 29,
        "next_cursor": _cursor((p + 1) * size) if p < 29 else None,
    }


def _ci(status: str, i: int) -> dict[str, Any]:
    return {
        "pipeline": 88412,
        "status": status,
        "updated_at": f"2026-03-02T09:{i:02d}:07Z",
        "web_url": "https://gitlab.example.com/acme/api/-/pipelines/88412",
    }


_CI_STATUSES = (
    "created pending pending running running build:passed build:passed test:running test:running "
    "test:passed deploy:pending deploy:running deploy:running deploy:running success"
).split()
_CI_EVERY_THREE = [
    s for s in ("queued", "preparing", "building", "testing", "packaging", "done") for _ in range(3)
]

HONEST: list[Session] = [
    Session(
        name="paging_30_pages_of_uuids_base64_cursors",
        stuck=False,
        shape="pagination",
        steps=tuple(
            Call("list_files", {"limit": 10, **({"cursor": _cursor(p * 10)} if p else {})}, _uuid_page(p))
            for p in range(30)
        ),
        notes="issue 31: warned at page 14 and blocked, a result made only of ids became noise",
    ),
    Session(
        name="aggregate_paging_uuids_base64_cursors",
        stuck=False,
        shape="pagination",
        transport="mcp",
        steps=tuple(
            Call(
                "drive__list_files",
                {"limit": 10, **({"cursor": _cursor(p * 10)} if p else {})},
                _uuid_page(p),
            )
            for p in range(30)
        ),
    ),
    Session(
        name="paging_uuids_anthropic",
        stuck=False,
        shape="pagination",
        dialect="anthropic",
        transport="fc",
        steps=tuple(
            Call("list_files", {"limit": 10, **({"cursor": _cursor(p * 10)} if p else {})}, _uuid_page(p))
            for p in range(20)
        ),
    ),
    Session(
        name="ci_poll_status_moves_every_one_or_two_polls",
        stuck=False,
        shape="poll (changing)",
        steps=tuple(Call("get_pipeline", {"id": 88412}, _ci(s, i)) for i, s in enumerate(_CI_STATUSES)),
        notes="issue 31: warned at poll 9-12 and blocked at 18 when per_tool counted the whole turn",
    ),
    Session(
        name="ci_poll_status_moves_every_three_polls_responses",
        stuck=False,
        shape="poll (changing)",
        dialect="responses",
        steps=tuple(Call("get_job", {"job": "build-7"}, _ci(s, i)) for i, s in enumerate(_CI_EVERY_THREE)),
    ),
    Session(
        name="aggregate_ci_poll_moves",
        stuck=False,
        shape="poll (changing)",
        transport="mcp",
        steps=tuple(
            Call("gitlab__get_pipeline", {"id": 88412}, _ci(s, i)) for i, s in enumerate(_CI_STATUSES)
        ),
    ),
    Session(
        name="kubectl_pods_become_ready",
        stuck=False,
        shape="poll (changing)",
        steps=tuple(
            Call("kubectl", {"args": "get pods -n shop -l app=api"}, _pods(ages, ready))
            for ages, ready in zip(
                _POD_AGES,
                [("0/1", "0/1", "0/1")] * 2
                + [("1/1", "0/1", "0/1")] * 2
                + [("1/1", "1/1", "0/1")] * 2
                + [("1/1", "1/1", "1/1")],
                strict=False,
            )
        ),
    ),
    Session(
        name="test_runs_with_seeds_failure_changes",
        stuck=False,
        shape="edit-test",
        steps=tuple(
            c
            for i, failure in enumerate(
                (
                    "AssertionError: 3 != 4",
                    "KeyError: 'discount'",
                    "TypeError: unsupported operand",
                    "AssertionError: 4 != 5",
                )
            )
            for c in (
                Call("edit_file", {"path": "src/cart.py", "patch": f"fix {i}"}, "ok"),
                Call(
                    "run_tests", {"path": "tests/test_cart.py"}, _pytest_seeded(_seed(80 + i), 2.2, failure)
                ),
            )
        ),
    ),
    Session(
        name="build_errors_change_with_temp_files",
        stuck=False,
        shape="build loop",
        dialect="anthropic",
        steps=tuple(
            c
            for i, error in enumerate(
                (
                    "undefined reference to `parse_header'",
                    "undefined reference to `send_all'",
                    "undefined reference to `log_line'",
                )
            )
            for c in (
                Call(
                    "Edit",
                    {"file_path": "http.c", "old_string": f"v{i}", "new_string": f"v{i + 1}"},
                    "updated",
                ),
                Call("Bash", {"command": "make server 2>&1"}, _gcc(i * 5, error)),
            )
        )
        + (Call("Bash", {"command": "make server 2>&1"}, "[09:30:01] build ok\n"),),
    ),
    Session(
        name="retry_with_request_ids_then_ok",
        stuck=False,
        shape="retry",
        steps=(
            Call(
                "create_release",
                {"repo": "acme/api", "tag": "v2.4.1"},
                error=f"Server Error: 502 Bad Gateway (X-GitHub-Request-Id: {_short_alphabet_id(90)})",
            ),
            Call(
                "create_release",
                {"repo": "acme/api", "tag": "v2.4.1"},
                error=f"Server Error: 502 Bad Gateway (X-GitHub-Request-Id: {_short_alphabet_id(91)})",
            ),
            Call("create_release", {"repo": "acme/api", "tag": "v2.4.1"}, {"id": 1882, "tag": "v2.4.1"}),
            Call("get_release", {"repo": "acme/api", "tag": "v2.4.1"}, {"id": 1882, "assets": []}),
        ),
    ),
    Session(
        name="crawl_following_links",
        stuck=False,
        shape="crawl",
        dialect="responses",
        steps=tuple(
            Call(
                "fetch",
                {"url": f"https://wiki.example.com/p/{_rid(_B62, 'wiki', i, 12)}"},
                "Page body.\nSee also: " + f"https://wiki.example.com/p/{_rid(_B62, 'wiki', i + 1, 12)}",
            )
            for i in range(15)
        ),
        notes="each page's body is the same boilerplate; the link it names is the next call: following news",
    ),
    Session(
        name="jobs_created_then_followed",
        stuck=False,
        shape="results only ids",
        steps=tuple(
            c
            for i in range(8)
            for c in (
                Call("submit_job", {"image": "etl:3", "shard": i}, {"job_id": _uuid("job", i)}),
                Call("get_job", {"job_id": _uuid("job", i)}, {"job_id": _uuid("job", i), "state": "queued"}),
            )
        ),
    ),
    Session(
        name="prices_that_move",
        stuck=False,
        shape="sensor readings",
        steps=tuple(
            Call("get_price", {"sku": "TSHIRT-M"}, {"sku": "TSHIRT-M", "price": round(19.99 + 0.1 * i, 2)})
            for i in range(10)
        ),
    ),
    Session(
        name="aggregate_fan_out_search_distinct",
        stuck=False,
        shape="near-duplicate queries",
        transport="mcp",
        steps=tuple(
            Call(
                "github__search_issues",
                {"q": f"repo:acme/api label:{label}"},
                {
                    "total_count": n,
                    "items": [{"number": 2000 + n * 3 + j, "title": f"{label} issue {j}"} for j in range(n)],
                },
            )
            for n, label in enumerate(("bug", "perf", "docs", "ci", "ui", "security", "infra"), start=1)
        ),
    ),
]

# --- the model's own text, on every nudge ---------------------------------------------------------

_SAME_TEXT = "I have reviewed the migration plan. Shall I continue with the next step?"


def _replies(texts: list[str], nudge: str = "continue") -> tuple[Step, ...]:
    return tuple(x for text in texts for x in (Reply(text), User(nudge, seconds=0.5)))


REPLIES: list[Session] = (
    [
        Session(
            name=f"same_reply_to_continue_{dialect}",
            stuck=True,
            shape="repeated reply",
            transport="fc",
            dialect=dialect,  # type: ignore[arg-type]
            loop_start=1,
            round_len=1,
            steps=(
                User("Migrate the orders table to the new schema."),
                *_replies([_SAME_TEXT if i % 2 else _SAME_TEXT.upper() + "  " for i in range(8)]),
            ),
            notes="no tool call at all: the same text (case and spaces aside) on every 'continue'",
        )
        for dialect in ("chat", "anthropic", "responses")
    ]
    + [
        Session(
            name=f"long_answer_in_parts_{dialect}",
            stuck=False,
            shape="repeated reply",
            transport="fc",
            dialect=dialect,  # type: ignore[arg-type]
            steps=(
                User("Write the migration guide."),
                *_replies(
                    [
                        f"Part {i + 1}: step {i + 1} of the migration moves the {t} table."
                        for i, t in enumerate(
                            (
                                "orders",
                                "users",
                                "invoices",
                                "payments",
                                "refunds",
                                "carts",
                                "coupons",
                                "audit",
                            )
                        )
                    ]
                ),
            ),
        )
        for dialect in ("chat", "anthropic", "responses")
    ]
    + [
        Session(
            name="same_reply_after_tool_work",
            stuck=True,
            shape="repeated reply",
            transport="fc",
            loop_start=3,
            round_len=1,
            steps=(
                User("Summarise the open incidents."),
                Call("list_incidents", {"state": "open"}, [{"id": 12, "title": "db latency"}]),
                Call(
                    "get_incident", {"id": 12}, {"id": 12, "title": "db latency", "status": "investigating"}
                ),
                *_replies(["Incident 12 (db latency) is being investigated."] * 8),
            ),
        ),
    ]
)

SESSIONS: list[Session] = STUCK + HONEST + REPLIES
