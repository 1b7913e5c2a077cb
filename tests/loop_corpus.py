"""The loop detector's specification: real-looking agent sessions, stuck and honest (SPEC §5.1).

Every session is data: the tool calls an agent made, with their arguments and what came back,
the user turns between them and the parallel fan-outs of one assistant step. `tests/corpus_runner.py`
feeds each one through the pure guards, as MCP traffic and as function-calling history, and
checks the promise of SPEC §5.1 under the default config:

- an honest session gets no decision at all (no LOOP_WARNING, no refusal);
- a stuck session is caught within max(threshold + 1, 2k) calls of its loop's start, k being the
  calls in one round of its loop (`round_len`, 1 for a plain repetition).

Grow it with every false alarm or miss found in the field: the corpus is the rule.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal


@dataclass(frozen=True)
class Call:
    """One tool call and what it returned (`error` set: the tool failed with that text)."""

    tool: str
    args: dict[str, Any]
    result: Any = "ok"
    error: str | None = None


@dataclass(frozen=True)
class Parallel:
    """One assistant step fanning out several calls (MCP: sent concurrently, answered after)."""

    calls: tuple[Call, ...]


@dataclass(frozen=True)
class User:
    """A new user message: a new turn (MCP-only: a pause longer than turn_gap_s), unless it repeats
    the words that began the turn in force (a harness's nudge, SPEC §5.1)."""

    text: str = "next request"
    seconds: float | None = None  # how long it took to come; None: a person reading (USER_PAUSE_S)


@dataclass(frozen=True)
class Pause:
    """Time passing with nothing sent (seconds)."""

    seconds: float


@dataclass(frozen=True)
class Reply:
    """The model's answer without a tool call, its text (function-calling only: a harness nudges it
    on with a `User` step). Counted as a call of the session, as the request after it is judged."""

    text: str


Step = Call | Parallel | User | Pause | Reply


@dataclass(frozen=True)
class Session:
    name: str
    stuck: bool
    steps: tuple[Step, ...]
    # stuck only: 1-based index, among all the session's tool calls (each call of a Parallel
    # counts), of the first call of the loop, and the calls in one round of it
    loop_start: int | None = None
    round_len: int | None = None
    transport: Literal["both", "mcp", "fc"] = "both"
    # function-calling: the protocol the agent speaks (the requests are read by Tripwire's own parser)
    dialect: Literal["chat", "anthropic", "responses"] = "chat"
    shape: str = ""  # the family it belongs to, for the accuracy table in docs/guards.md
    notes: str = ""


# --- helpers: deterministic volatile values and repetitive data ---------------------------------

_T0 = datetime(2026, 3, 2, 9, 14, 7, tzinfo=UTC)


def _ts(seconds: float) -> str:
    """An ISO-8601 UTC timestamp `seconds` after a fixed base (deterministic)."""
    return (_T0 + timedelta(seconds=seconds)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _uuid(salt: str, i: int) -> str:
    """A random-looking but deterministic UUID4 string."""
    return str(uuid.UUID(bytes=hashlib.md5(f"{salt}:{i}".encode()).digest(), version=4))


def _hex(salt: str, i: int, n: int = 16) -> str:
    """A random-looking but deterministic hex string (nonces, hashes, cursors)."""
    return hashlib.sha256(f"{salt}:{i}".encode()).hexdigest()[:n]


_ISSUE_TOPICS = (
    "Crash when config file is empty",
    "Dark mode toggle resets on reload",
    "Slow query on /api/orders",
    "Typo in onboarding email",
    "CSV export drops unicode",
    "Login redirect loop on Safari",
    "Docs: missing env var for S3",
    "Flaky test test_checkout_total",
    "Pagination off by one in admin list",
    "Memory leak in websocket handler",
    "Support for Postgres 16",
    "Timezone wrong in weekly report",
    "Rate limiter ignores burst setting",
)
_LABELS = ("bug", "enhancement", "docs", "ui", "perf", "ci")


def _issues_page(page: int, per_page: int = 5, total: int = 148) -> list[dict[str, Any]]:
    """Page `page` (1-based) of a repository's open issues, newest first, as a GitHub MCP server lists them."""
    first = (page - 1) * per_page
    return [
        {
            "number": 2400 - n,
            "title": _ISSUE_TOPICS[n % len(_ISSUE_TOPICS)],
            "state": "open",
            "labels": [_LABELS[n % len(_LABELS)]],
            "comments": (n * 7) % 13,
            "updated_at": _ts(-3600 * n),
        }
        for n in range(first, min(first + per_page, total))
    ]


def _pages(n: int) -> tuple[Step, ...]:
    """Paging through `n` pages of issues with one tool; every page differs."""
    return tuple(
        Call(
            "list_issues",
            {"owner": "acme", "repo": "webapp", "state": "open", "page": p, "per_page": 5},
            _issues_page(p),
        )
        for p in range(1, n + 1)
    )


_DOC_SECTIONS = ("getting-started", "configuration", "guards", "api", "deploy")
_DOC_PAGES = ("index", "install", "quickstart", "concepts", "reference", "examples", "faq", "changelog")
_DOC_URLS = tuple(f"https://docs.tripwire.dev/{s}/{p}" for s in _DOC_SECTIONS for p in _DOC_PAGES)


def _doc_page(i: int) -> dict[str, Any]:
    url = _DOC_URLS[i]
    section, page = url.rsplit("/", 2)[-2:]
    return {
        "status": 200,
        "url": url,
        "title": f"{page.replace('-', ' ').title()} - {section.replace('-', ' ').title()} | Tripwire",
        "text": f"# {page.title()}\n\nThis page covers {page} for {section}. ({1200 + 37 * i} words)",
        "links": [_DOC_URLS[(i + 1) % len(_DOC_URLS)], _DOC_URLS[(i + 7) % len(_DOC_URLS)]],
    }


_CITIES = (
    ("Tokyo", 14.2, "clear"),
    ("Delhi", 27.9, "haze"),
    ("Shanghai", 12.1, "overcast"),
    ("Sao Paulo", 23.4, "light rain"),
    ("Mexico City", 19.8, "partly cloudy"),
    ("Cairo", 22.6, "clear"),
    ("Mumbai", 29.3, "humid"),
    ("Beijing", 8.7, "windy"),
    ("Dhaka", 26.1, "haze"),
    ("Osaka", 13.5, "cloudy"),
    ("New York", 6.4, "rain"),
    ("Karachi", 25.0, "clear"),
    ("Buenos Aires", 21.7, "sunny"),
    ("Istanbul", 11.9, "showers"),
    ("Lagos", 31.2, "thunderstorms"),
    ("Paris", 9.3, "drizzle"),
    ("London", 8.1, "overcast"),
    ("Berlin", 5.6, "fog"),
    ("Madrid", 15.4, "sunny"),
    ("Sydney", 24.8, "clear"),
)


def _weather(i: int) -> Call:
    city, temp, cond = _CITIES[i]
    return Call(
        "get_weather",
        {"city": city, "units": "metric"},
        {"city": city, "temp_c": temp, "conditions": cond, "humidity": 40 + (i * 3) % 50},
    )


def _pytest(summary: str, failure: str, seconds: float) -> str:
    """A pytest run's output: the failure block, then the summary line with its timing."""
    return (
        "============================= test session starts ==============================\n"
        "platform linux -- Python 3.11.7, pytest-8.3.4, pluggy-1.5.0\n"
        "collected 14 items\n\n"
        "tests/test_duration.py ............F.                                      [100%]\n\n"
        "=================================== FAILURES ===================================\n"
        f"{failure}\n"
        "=========================== short test summary info ============================\n"
        f"FAILED tests/test_duration.py::test_parse_compound - {summary}\n"
        f"========================= 1 failed, 13 passed in {seconds:.2f}s =========================\n"
    )


def _pytest_fail(error: str, seconds: float) -> str:
    block = (
        "_____________________________ test_parse_compound ______________________________\n"
        "    def test_parse_compound():\n"
        '>       assert parse_duration("1h30m") == 5400\n'
        f"E       {error}\n\n"
        f"tests/test_duration.py:41: {error.split(':')[0]}"
    )
    return _pytest(error.splitlines()[0], block, seconds)


_REPO_FILES = (
    ("pyproject.toml", '[project]\nname = "shopcart"\nversion = "0.9.2"\nrequires-python = ">=3.11"\n'),
    ("README.md", "# shopcart\n\nA small cart service.\n"),
    ("shopcart/__init__.py", ""),
    ("shopcart/app.py", "from fastapi import FastAPI\n\nfrom .routes import router\n\napp = FastAPI()\n"),
    ("shopcart/routes.py", "from fastapi import APIRouter\n\nrouter = APIRouter()\n\n@router.get('/cart')\n"),
    (
        "shopcart/models.py",
        "from pydantic import BaseModel\n\nclass Item(BaseModel):\n    sku: str\n    qty: int\n",
    ),
    (
        "shopcart/pricing.py",
        "def total(items, prices):\n    return sum(prices[i.sku] * i.qty for i in items)\n",
    ),
    ("shopcart/tax.py", "RATES = {'DE': 0.19, 'FR': 0.20}\n\ndef tax(amount, country):\n"),
    ("shopcart/db/__init__.py", ""),
    ("shopcart/db/session.py", "from sqlalchemy.orm import sessionmaker\n\nSession = sessionmaker()\n"),
    (
        "shopcart/db/migrations.py",
        "def upgrade():\n    op.add_column('cart', sa.Column('coupon', sa.String))\n",
    ),
    ("shopcart/services/__init__.py", ""),
    ("shopcart/services/checkout.py", "from ..pricing import total\n\ndef checkout(cart):\n"),
    ("shopcart/services/coupons.py", "def apply(code, amount):\n    if code == 'WELCOME10':\n"),
    ("shopcart/services/inventory.py", "def reserve(sku, qty):\n    ...\n"),
    ("shopcart/config.py", "import os\n\nDATABASE_URL = os.environ['DATABASE_URL']\n"),
    ("shopcart/logging.py", "import logging\n\nlog = logging.getLogger('shopcart')\n"),
    ("tests/conftest.py", "import pytest\n\n@pytest.fixture\ndef cart():\n"),
    ("tests/test_pricing.py", "from shopcart.pricing import total\n\ndef test_total():\n"),
    ("tests/test_checkout.py", "from shopcart.services.checkout import checkout\n"),
    ("tests/test_coupons.py", "from shopcart.services.coupons import apply\n"),
    ("tests/test_tax.py", "from shopcart.tax import tax\n"),
    ("Dockerfile", "FROM python:3.11-slim\nCOPY . /app\nRUN pip install /app\n"),
    (".github/workflows/ci.yml", "name: ci\non: [push]\njobs:\n  test:\n    runs-on: ubuntu-latest\n"),
    ("Makefile", "test:\n\tpytest -q\n"),
)


def _wrv(i: int) -> tuple[Step, ...]:
    """Write, read back and verify one generated file."""
    path = f"migrations/versions/{i:04d}_add_index_{i}.py"
    content = f'"""add index {i}"""\nrevision = "{_hex("rev", i, 12)}"\n\ndef upgrade():\n    op.create_index("ix_{i}", "t{i}", ["c"])\n'
    return (
        Call("write_file", {"path": path, "content": content}, f"Wrote {len(content)} bytes to {path}"),
        Call("read_file", {"path": path}, content),
        Call(
            "bash",
            {"command": f"python -m py_compile {path} && sha256sum {path}"},
            f"{_hex('sha', i, 64)}  {path}\n",
        ),
    )


# --- sessions ------------------------------------------------------------------------------------

_HONEST: list[Session] = [
    Session(
        name="paging_30_pages_of_issues",
        stuck=False,
        shape="pagination",
        steps=_pages(30),
        notes="30 calls of one tool, page number the only change; every page's result differs",
    ),
    Session(
        name="cursor_paging_25_pages",
        stuck=False,
        shape="pagination",
        steps=tuple(
            Call(
                "search_records",
                {
                    "index": "orders",
                    "query": "status:refunded AND created:>2026-01-01",
                    "cursor": None if p == 0 else _hex("cur", p, 24),
                },
                {
                    "hits": [
                        {"id": f"ord_{_hex('ord', p * 4 + j, 10)}", "amount": 1999 + 250 * (p * 4 + j)}
                        for j in range(4)
                    ],
                    "next_cursor": _hex("cur", p + 1, 24) if p < 24 else None,
                },
            )
            for p in range(25)
        ),
    ),
    Session(
        name="sql_paging_with_offset",
        stuck=False,
        shape="pagination",
        steps=(
            Call("list_tables", {"schema": "public"}, ["customers", "orders", "order_items", "refunds"]),
            *(
                Call(
                    "query_db",
                    {
                        "sql": f"SELECT id, email, created_at FROM customers ORDER BY id LIMIT 100 OFFSET {100 * p}"
                    },
                    {
                        "rows": [[100 * p + 1, f"user{100 * p + 1}@example.com", _ts(-86400 * p)], ["..."]],
                        "row_count": 100 if p < 14 else 37,
                    },
                )
                for p in range(15)
            ),
        ),
    ),
    Session(
        name="crawl_40_doc_pages",
        stuck=False,
        shape="crawl",
        steps=tuple(Call("fetch_url", {"url": _DOC_URLS[i]}, _doc_page(i)) for i in range(40)),
    ),
    Session(
        name="link_check_30_urls_all_200",
        stuck=False,
        shape="crawl",
        steps=tuple(Call("check_url", {"url": _DOC_URLS[i], "method": "HEAD"}, "200 OK") for i in range(30)),
        notes="every call returns the identical result, but each checks a different URL",
    ),
    Session(
        name="fan_out_weather_20_cities",
        stuck=False,
        shape="fan-out",
        steps=(Parallel(tuple(_weather(i) for i in range(20))),),
    ),
    Session(
        name="successive_fan_outs",
        stuck=False,
        shape="fan-out",
        steps=(
            Parallel(tuple(_weather(i) for i in range(15, 20))),
            Parallel(
                tuple(
                    Call(
                        "get_forecast",
                        {"city": _CITIES[i][0], "days": 3},
                        [
                            {"day": d, "high_c": _CITIES[i][1] + d, "low_c": _CITIES[i][1] - 6 + d}
                            for d in range(3)
                        ],
                    )
                    for i in range(15, 20)
                )
            ),
            Parallel(
                tuple(
                    Call(
                        "get_air_quality",
                        {"city": _CITIES[i][0]},
                        {"aqi": 20 + 9 * i % 70, "pm25": 4.0 + i % 11},
                    )
                    for i in range(15, 20)
                )
            ),
            Parallel(tuple(_weather(i) for i in range(0, 5))),
        ),
    ),
    Session(
        name="parallel_file_reads_in_steps",
        stuck=False,
        shape="fan-out",
        steps=(
            Parallel(tuple(Call("read_file", {"path": p}, c) for p, c in _REPO_FILES[0:6])),
            Parallel(tuple(Call("read_file", {"path": p}, c) for p, c in _REPO_FILES[6:12])),
            Parallel(
                tuple(
                    Call("grep", {"pattern": pat, "path": "shopcart"}, hits)
                    for pat, hits in (
                        ("def checkout", "shopcart/services/checkout.py:3:def checkout(cart):"),
                        ("DATABASE_URL", "shopcart/config.py:3:DATABASE_URL = os.environ['DATABASE_URL']"),
                        ("WELCOME10", "shopcart/services/coupons.py:2:    if code == 'WELCOME10':"),
                    )
                )
            ),
        ),
        notes="three of the files read are empty __init__.py: same result, different file",
    ),
    Session(
        name="poll_job_progress_changes",
        stuck=False,
        shape="poll (changing)",
        steps=(
            Call(
                "submit_job",
                {"pipeline": "nightly-etl", "params": {"date": "2026-03-01"}},
                {"job_id": "job_7f3a21", "state": "queued"},
            ),
            *(
                Call(
                    "get_job_status",
                    {"job_id": "job_7f3a21"},
                    {
                        "job_id": "job_7f3a21",
                        "state": state,
                        "stage": stage,
                        "progress": pct,
                        "updated_at": _ts(20 * n),
                    },
                )
                for n, (state, stage, pct) in enumerate(
                    (
                        ("queued", None, 0),
                        ("running", "extract", 5),
                        ("running", "extract", 12),
                        ("running", "transform", 31),
                        ("running", "transform", 47),
                        ("running", "transform", 58),
                        ("running", "load", 63),
                        ("running", "load", 80),
                        ("running", "load", 94),
                        ("running", "finalize", 99),
                        ("succeeded", "done", 100),
                    )
                )
            ),
            Call("get_job_result", {"job_id": "job_7f3a21"}, {"rows_loaded": 1823341, "warnings": 2}),
        ),
        notes="progress and stage move on between polls; timestamps change too",
    ),
    Session(
        name="poll_build_with_sleep",
        stuck=False,
        shape="poll (changing)",
        steps=(
            Call("start_build", {"project": "webapp", "ref": "main"}, {"build_id": 5531, "status": "queued"}),
            *(
                step
                for status in (
                    "queued",
                    "running 10%",
                    "running 40%",
                    "running 55%",
                    "running 80%",
                    "running 95%",
                    "succeeded",
                )
                for step in (
                    Call("get_build_status", {"build_id": 5531}, status),
                    *(() if status == "succeeded" else (Call("sleep", {"seconds": 10}, "slept 10s"),)),
                )
            ),
        ),
        notes="sleep(10) returns the same text every time, but the status changes between sleeps",
    ),
    Session(
        name="kubectl_rollout_status_poll",
        stuck=False,
        shape="poll (changing)",
        steps=(
            Call(
                "bash",
                {"command": "kubectl set image deploy/api api=registry.acme.io/api:2.4.1"},
                "deployment.apps/api image updated",
            ),
            *(
                Call("bash", {"command": "kubectl rollout status deploy/api --timeout=5s"}, out)
                for out in (
                    'Waiting for deployment "api" rollout to finish: 0 of 3 updated replicas are available...\n'
                    "error: timed out waiting for the condition",
                    'Waiting for deployment "api" rollout to finish: 1 of 3 updated replicas are available...\n'
                    "error: timed out waiting for the condition",
                    'Waiting for deployment "api" rollout to finish: 2 of 3 updated replicas are available...\n'
                    "error: timed out waiting for the condition",
                    'Waiting for deployment "api" rollout to finish: 1 old replicas are pending termination...\n'
                    "error: timed out waiting for the condition",
                    'deployment "api" successfully rolled out',
                )
            ),
        ),
    ),
    Session(
        name="write_read_verify_10_files",
        stuck=False,
        shape="write/read/verify",
        steps=tuple(step for i in range(10) for step in _wrv(i)),
    ),
    Session(
        name="test_fix_loop_failure_changes",
        stuck=False,
        shape="edit-test",
        steps=(
            Call("read_file", {"path": "src/duration.py"}, "def parse_duration(s):\n    return int(s)\n"),
            Call(
                "run_tests",
                {"path": "tests/test_duration.py"},
                _pytest_fail("ValueError: invalid literal for int() with base 10: '1h30m'", 0.42),
            ),
            Call(
                "edit_file",
                {
                    "path": "src/duration.py",
                    "old_string": "    return int(s)\n",
                    "new_string": "    return sum(int(n) for n in re.findall(r'\\d+', s))\n",
                },
                "Applied 1 edit to src/duration.py",
            ),
            Call(
                "run_tests",
                {"path": "tests/test_duration.py"},
                _pytest_fail("NameError: name 're' is not defined", 0.37),
            ),
            Call(
                "edit_file",
                {
                    "path": "src/duration.py",
                    "old_string": "def parse_duration(s):\n",
                    "new_string": "import re\n\n\ndef parse_duration(s):\n",
                },
                "Applied 1 edit to src/duration.py",
            ),
            Call(
                "run_tests",
                {"path": "tests/test_duration.py"},
                _pytest_fail("AssertionError: assert 31 == 5400", 0.33),
            ),
            Call(
                "edit_file",
                {
                    "path": "src/duration.py",
                    "old_string": "    return sum(int(n) for n in re.findall(r'\\d+', s))\n",
                    "new_string": "    units = {'h': 3600, 'm': 60, 's': 1}\n    return sum(int(n) * units[u] for n, u in re.findall(r'(\\d+)([hms])', s))\n",
                },
                "Applied 1 edit to src/duration.py",
            ),
            Call(
                "run_tests",
                {"path": "tests/test_duration.py"},
                "collected 14 items\n\ntests/test_duration.py ..............  [100%]\n\n============================== 14 passed in 0.29s ==============================\n",
            ),
        ),
    ),
    Session(
        name="edit_then_reread_same_file",
        stuck=False,
        shape="edit-test",
        steps=tuple(
            step
            for i in range(6)
            for step in (
                Call(
                    "read_file",
                    {"path": "CHANGELOG.md"},
                    "# Changelog\n\n" + "".join(f"- entry {j}\n" for j in range(i)),
                ),
                Call(
                    "edit_file",
                    {
                        "path": "CHANGELOG.md",
                        "old_string": "# Changelog\n\n",
                        "new_string": f"# Changelog\n\n- entry {i}\n",
                    },
                    "Applied 1 edit to CHANGELOG.md",
                ),
            )
        ),
        notes="the same read_file call six times, each time after a different edit: the content differs",
    ),
    Session(
        name="flaky_fetch_retried_once_each",
        stuck=False,
        shape="retry",
        steps=tuple(
            step
            for i in range(8)
            for step in (
                Call(
                    "fetch_url",
                    {"url": f"https://api.partner.example.com/v2/catalog/{1000 + i}"},
                    error="ReadTimeout: HTTPSConnectionPool(host='api.partner.example.com', port=443): Read timed out. (read timeout=10)",
                ),
                Call(
                    "fetch_url",
                    {"url": f"https://api.partner.example.com/v2/catalog/{1000 + i}"},
                    {"id": 1000 + i, "name": f"Product {1000 + i}", "price_cents": 1299 + 100 * i},
                ),
            )
        ),
        notes="each input fails once (same timeout text for all) and succeeds on its single retry",
    ),
    Session(
        name="rate_limited_twice_then_ok",
        stuck=False,
        shape="retry",
        steps=(
            Call(
                "call_api",
                {"method": "GET", "path": "/v1/invoices", "params": {"status": "overdue"}},
                error="HTTP 429 Too Many Requests: retry after 2s",
            ),
            Call(
                "call_api",
                {"method": "GET", "path": "/v1/invoices", "params": {"status": "overdue"}},
                error="HTTP 429 Too Many Requests: retry after 2s",
            ),
            Call(
                "call_api",
                {"method": "GET", "path": "/v1/invoices", "params": {"status": "overdue"}},
                {
                    "data": [{"id": "in_1Ox", "amount_due": 4900}, {"id": "in_1Pz", "amount_due": 12900}],
                    "has_more": False,
                },
            ),
            Call(
                "call_api",
                {"method": "POST", "path": "/v1/invoices/in_1Ox/remind", "params": {}},
                {"sent": True},
            ),
            Call(
                "call_api",
                {"method": "POST", "path": "/v1/invoices/in_1Pz/remind", "params": {}},
                {"sent": True},
            ),
        ),
    ),
    Session(
        name="mcp_add_seven_argument_sets",
        stuck=False,
        shape="mcp-only arithmetic",
        transport="mcp",
        steps=tuple(
            step
            for a, b in ((1, 2), (2, 3), (10, 32), (-4, 4), (7, 7), (1.5, 2.25), (100, 250))
            for step in (Call("add", {"a": a, "b": b}, str(a + b)), Pause(1.0))
        ),
    ),
    Session(
        name="mcp_periodic_check_long_pauses",
        stuck=False,
        shape="mcp-only periodic",
        transport="mcp",
        steps=tuple(
            step
            for _ in range(6)
            for step in (
                Call("get_queue_depth", {"queue": "emails"}, {"queue": "emails", "depth": 0}),
                Pause(60.0),
            )
        ),
        notes="an MCP-only monitor checking once a minute: each pause is longer than turn_gap_s, each check its own turn",
    ),
    Session(
        name="mcp_filesystem_client",
        stuck=False,
        shape="mcp-only",
        transport="mcp",
        steps=(
            Call("list_directory", {"path": "/srv/app"}, [p for p, _ in _REPO_FILES[:8]]),
            Pause(2.0),
            *(Call("read_file", {"path": f"/srv/app/{p}"}, c) for p, c in _REPO_FILES[:8]),
            Pause(4.0),
            Call(
                "write_file",
                {"path": "/srv/app/NOTES.md", "content": "reviewed 8 files\n"},
                "Successfully wrote to /srv/app/NOTES.md",
            ),
        ),
    ),
    Session(
        name="same_status_in_five_user_turns",
        stuck=False,
        shape="multi-turn chat",
        steps=(
            User("Is the payments service healthy?"),
            Call(
                "get_service_status",
                {"service": "payments"},
                {"service": "payments", "status": "healthy", "p99_ms": 212},
            ),
            User("Great. Any open incidents this week?"),
            Call("list_incidents", {"since": "2026-02-23", "state": "open"}, []),
            User("Check payments again please, we just deployed."),
            Call(
                "get_service_status",
                {"service": "payments"},
                {"service": "payments", "status": "healthy", "p99_ms": 212},
            ),
            User("And the deploy log?"),
            Call(
                "get_deploy_log",
                {"service": "payments", "limit": 3},
                ["2.4.1 deployed by ci", "2.4.0 deployed by ci", "2.3.9 rolled back"],
            ),
            User("Payments status once more?"),
            Call(
                "get_service_status",
                {"service": "payments"},
                {"service": "payments", "status": "healthy", "p99_ms": 212},
            ),
            User("ok, I'll check back later"),
            User("Back. Still healthy?"),
            Call(
                "get_service_status",
                {"service": "payments"},
                {"service": "payments", "status": "healthy", "p99_ms": 212},
            ),
            User("Last check before I sign off: payments?"),
            Call(
                "get_service_status",
                {"service": "payments"},
                {"service": "payments", "status": "healthy", "p99_ms": 212},
            ),
        ),
        notes="the identical check five times, each asked for by its own user message",
    ),
    Session(
        name="same_three_tools_each_of_six_turns",
        stuck=False,
        shape="multi-turn chat",
        steps=tuple(
            step
            for turn in range(6)
            for step in (
                User(f"Morning check #{turn + 1}: how is prod?" if turn % 2 == 0 else "check prod again"),
                Call(
                    "get_deploy_status",
                    {"env": "prod"},
                    {"env": "prod", "version": "2.4.1", "healthy_replicas": 3},
                ),
                Call("get_error_rate", {"service": "api", "window": "15m"}, {"rate": 0.0012}),
                Call("list_alerts", {"env": "prod", "state": "firing"}, []),
            )
        ),
        notes="a 3-tool sequence repeated with identical results, once per user turn",
    ),
    Session(
        name="near_duplicate_search_queries",
        stuck=False,
        shape="near-duplicate queries",
        steps=tuple(
            Call(
                "web_search",
                {"query": q, "num_results": 3},
                [{"title": t, "url": f"https://example.org/{_hex('s', i, 8)}"} for t in ts],
            )
            for i, (q, ts) in enumerate(
                (
                    ("python asyncio timeout", ["asyncio — Timeouts", "How to time out a coroutine"]),
                    (
                        "python asyncio timeout example",
                        ["asyncio.wait_for example", "Real Python: asyncio timeouts"],
                    ),
                    (
                        "asyncio.timeout context manager python 3.11",
                        ["What's new in 3.11: asyncio.timeout", "PEP 654"],
                    ),
                    ("asyncio wait_for vs timeout", ["wait_for vs timeout (SO)", "Trio-style cancel scopes"]),
                    (
                        "asyncio timeout cancel task cleanup",
                        ["Cancellation and cleanup", "TaskGroup and timeouts"],
                    ),
                    (
                        "asyncio timeout cancelled error handling",
                        ["Handling CancelledError", "Shielding tasks"],
                    ),
                    (
                        "asyncio timeout cancelled error handling 3.12",
                        ["3.12 changelog: uncancel()", "Task.uncancel docs"],
                    ),
                )
            )
        ),
    ),
    Session(
        name="research_search_fetch_alternation",
        stuck=False,
        shape="near-duplicate queries",
        steps=tuple(
            step
            for i, topic in enumerate(
                (
                    "EU AI Act obligations",
                    "AI Act GPAI code of practice",
                    "AI Act high-risk annex III",
                    "AI Act timeline 2026",
                )
            )
            for step in (
                Call(
                    "web_search",
                    {"query": topic},
                    [{"url": f"https://eur-lex.example/{_hex('eu', i, 6)}", "snippet": f"{topic}..."}],
                ),
                Call(
                    "fetch_url",
                    {"url": f"https://eur-lex.example/{_hex('eu', i, 6)}"},
                    {"status": 200, "text": f"Full text about {topic}."},
                ),
            )
        ),
    ),
    Session(
        name="read_many_files_of_repo",
        stuck=False,
        shape="read many files",
        steps=(
            Call("list_directory", {"path": ".", "recursive": True}, [p for p, _ in _REPO_FILES]),
            *(Call("read_file", {"path": p}, c) for p, c in _REPO_FILES),
        ),
        notes="three empty __init__.py files return the same empty string",
    ),
    Session(
        name="db_agent_distinct_queries",
        stuck=False,
        shape="db queries",
        steps=(
            Call("list_tables", {"schema": "public"}, ["customers", "orders", "order_items", "refunds"]),
            *(
                Call("describe_table", {"table": t}, {"table": t, "columns": cols})
                for t, cols in (
                    ("orders", ["id", "customer_id", "total_cents", "created_at"]),
                    ("refunds", ["id", "order_id", "amount_cents", "reason"]),
                    ("customers", ["id", "email", "country", "created_at"]),
                )
            ),
            *(
                Call("query_db", {"sql": sql}, {"rows": rows, "row_count": len(rows)})
                for sql, rows in (
                    ("SELECT count(*) FROM orders WHERE created_at >= '2026-02-01'", [[18234]]),
                    (
                        "SELECT count(*) FROM refunds r JOIN orders o ON o.id = r.order_id WHERE o.created_at >= '2026-02-01'",
                        [[412]],
                    ),
                    (
                        "SELECT reason, count(*) FROM refunds GROUP BY reason ORDER BY 2 DESC LIMIT 5",
                        [["damaged", 150], ["late", 97], ["wrong item", 61]],
                    ),
                    (
                        "SELECT country, sum(total_cents) FROM orders o JOIN customers c ON c.id = o.customer_id GROUP BY 1",
                        [["DE", 9123400], ["FR", 4410200]],
                    ),
                    ("SELECT avg(amount_cents) FROM refunds", [[3811.4]]),
                    ("SELECT max(created_at) FROM orders", [[_ts(-120)]]),
                    (
                        "SELECT count(DISTINCT customer_id) FROM orders WHERE created_at >= '2026-02-01'",
                        [[9120]],
                    ),
                    (
                        "EXPLAIN SELECT * FROM orders WHERE customer_id = 42",
                        [["Index Scan using ix_orders_customer on orders"]],
                    ),
                    ("SELECT id FROM orders WHERE total_cents < 0", []),
                    ("SELECT id FROM refunds WHERE amount_cents > 100000", []),
                )
            ),
        ),
        notes="two different queries both return no rows",
    ),
    Session(
        name="git_workflow_four_commits",
        stuck=False,
        shape="git workflow",
        steps=tuple(
            step
            for i, (path, msg) in enumerate(
                (
                    ("shopcart/tax.py", "tax: add rates for IT and ES"),
                    ("shopcart/services/coupons.py", "coupons: reject expired codes"),
                    ("tests/test_coupons.py", "tests: cover expired coupon"),
                    ("README.md", "docs: document coupon expiry"),
                )
            )
            for step in (
                Call(
                    "edit_file",
                    {"path": path, "old_string": "\n", "new_string": f"\n# change {i}\n", "count": 1},
                    f"Applied 1 edit to {path}",
                ),
                Call(
                    "git_status",
                    {},
                    f"On branch feat/coupons\nChanges not staged for commit:\n\tmodified:   {path}\n",
                ),
                Call(
                    "git_diff",
                    {"path": path},
                    f"diff --git a/{path} b/{path}\n@@ -1,0 +1,1 @@\n+# change {i}\n",
                ),
                Call("git_add", {"paths": [path]}, ""),
                Call(
                    "git_commit",
                    {"message": msg},
                    f"[feat/coupons {_hex('c', i, 7)}] {msg}\n 1 file changed, 1 insertion(+)",
                ),
            )
        )
        + (
            Call(
                "git_push",
                {"remote": "origin", "branch": "feat/coupons"},
                "To github.com:acme/shopcart.git\n * [new branch] feat/coupons",
            ),
        ),
        notes="git_add returns the same empty output each time, with different paths",
    ),
    Session(
        name="forgot_and_read_twice",
        stuck=False,
        shape="repeat twice",
        steps=(
            Call(
                "read_file",
                {"path": "config/settings.yaml"},
                "db:\n  pool_size: 5\n  timeout_s: 30\ncache:\n  ttl_s: 600\n",
            ),
            Call(
                "read_file",
                {"path": "config/settings.yaml"},
                "db:\n  pool_size: 5\n  timeout_s: 30\ncache:\n  ttl_s: 600\n",
            ),
            Call(
                "edit_file",
                {"path": "config/settings.yaml", "old_string": "pool_size: 5", "new_string": "pool_size: 20"},
                "Applied 1 edit to config/settings.yaml",
            ),
            Call(
                "bash",
                {"command": "python -c 'import yaml;print(yaml.safe_load(open(\"config/settings.yaml\")))'"},
                "{'db': {'pool_size': 20, 'timeout_s': 30}, 'cache': {'ttl_s': 600}}\n",
            ),
        ),
    ),
    Session(
        name="send_15_emails_distinct_recipients",
        stuck=False,
        shape="batch writes",
        steps=tuple(
            Call(
                "send_email",
                {
                    "to": f"{name}@customer{i % 4}.example.com",
                    "subject": "Your March invoice",
                    "body": f"Hi {name.title()},\nyour invoice INV-{3100 + i} is ready.",
                },
                {"status": "queued"},
            )
            for i, name in enumerate(
                (
                    "ana",
                    "bo",
                    "chen",
                    "dara",
                    "eli",
                    "fatima",
                    "gus",
                    "hana",
                    "ivan",
                    "jo",
                    "kemal",
                    "lena",
                    "mo",
                    "nia",
                    "oskar",
                )
            )
        ),
        notes="a mutating tool with new arguments every call: each is a new write even though results are identical",
    ),
    Session(
        name="create_tickets_with_idempotency_keys",
        stuck=False,
        shape="batch writes",
        steps=tuple(
            Call(
                "create_ticket",
                {"project": "OPS", "title": title, "priority": "P3", "idempotency_key": _uuid("tk", i)},
                {
                    "key": f"OPS-{812 + i}",
                    "url": f"https://jira.acme.io/browse/OPS-{812 + i}",
                    "created": _ts(i),
                },
            )
            for i, title in enumerate(
                (
                    "Rotate TLS cert for api.acme.io",
                    "Upgrade Postgres to 16.2",
                    "Remove legacy cron on worker-3",
                    "Alert on disk > 85% for db nodes",
                    "Backfill missing invoices Feb 12",
                    "Archive S3 bucket acme-old-logs",
                    "Fix DNS TTL for status page",
                    "Add runbook for queue backlog",
                    "Pin base image digest",
                    "Enable WAF rule 942100",
                    "Review IAM role ci-deployer",
                    "Decommission staging-2",
                )
            )
        ),
    ),
    Session(
        name="translate_into_ten_languages",
        stuck=False,
        shape="batch",
        steps=tuple(
            Call("translate", {"text": "Your order has shipped.", "target_lang": lang}, out)
            for lang, out in (
                ("de", "Ihre Bestellung wurde versandt."),
                ("fr", "Votre commande a été expédiée."),
                ("es", "Tu pedido ha sido enviado."),
                ("it", "Il tuo ordine è stato spedito."),
                ("pt", "Seu pedido foi enviado."),
                ("nl", "Je bestelling is verzonden."),
                ("pl", "Twoje zamówienie zostało wysłane."),
                ("sv", "Din beställning har skickats."),
                ("ja", "ご注文の商品を発送しました。"),
                ("tr", "Siparişiniz kargoya verildi."),
            )
        ),
    ),
    Session(
        name="volatile_request_ids_real_progress",
        stuck=False,
        shape="volatile ids",
        steps=tuple(
            Call(
                "call_api",
                {
                    "method": "GET",
                    "path": "/v1/events",
                    "params": {"offset": 50 * i, "limit": 50},
                    "request_id": _uuid("ev", i),
                },
                {
                    "request_id": _uuid("ev", i),
                    "events": [f"evt_{_hex('evt', 50 * i + j, 8)}" for j in range(3)],
                    "has_more": i < 9,
                },
            )
            for i in range(10)
        ),
        notes="every call carries a fresh request id, and its offset and events also change",
    ),
    Session(
        name="coding_session_mixed_tools",
        stuck=False,
        shape="coding session",
        steps=(
            Call(
                "list_directory",
                {"path": "shopcart"},
                [p for p, _ in _REPO_FILES if p.startswith("shopcart/")],
            ),
            Call(
                "grep",
                {"pattern": "def total", "path": "."},
                "shopcart/pricing.py:1:def total(items, prices):",
            ),
            Call("read_file", {"path": "shopcart/pricing.py"}, _REPO_FILES[6][1]),
            Call("read_file", {"path": "tests/test_pricing.py"}, _REPO_FILES[18][1]),
            Call(
                "run_tests",
                {"path": "tests/test_pricing.py"},
                "1 failed, 3 passed in 0.21s\nFAILED test_total_with_coupon - KeyError: 'coupon'",
            ),
            Call(
                "edit_file",
                {
                    "path": "shopcart/pricing.py",
                    "old_string": "def total(items, prices):",
                    "new_string": "def total(items, prices, coupon=None):",
                },
                "Applied 1 edit to shopcart/pricing.py",
            ),
            Call(
                "run_tests",
                {"path": "tests/test_pricing.py"},
                "1 failed, 3 passed in 0.20s\nFAILED test_total_with_coupon - assert 100 == 90",
            ),
            Call("read_file", {"path": "shopcart/services/coupons.py"}, _REPO_FILES[13][1]),
            Call(
                "edit_file",
                {
                    "path": "shopcart/pricing.py",
                    "old_string": "    return sum(prices[i.sku] * i.qty for i in items)",
                    "new_string": "    amount = sum(prices[i.sku] * i.qty for i in items)\n    return apply(coupon, amount) if coupon else amount",
                },
                "Applied 1 edit to shopcart/pricing.py",
            ),
            Call(
                "run_tests",
                {"path": "tests/test_pricing.py"},
                "1 failed, 3 passed in 0.22s\nFAILED test_total_with_coupon - NameError: name 'apply' is not defined",
            ),
            Call(
                "edit_file",
                {
                    "path": "shopcart/pricing.py",
                    "old_string": "def total(",
                    "new_string": "from .services.coupons import apply\n\n\ndef total(",
                },
                "Applied 1 edit to shopcart/pricing.py",
            ),
            Call("run_tests", {"path": "tests/test_pricing.py"}, "4 passed in 0.19s"),
            Call("run_tests", {"path": "tests"}, "41 passed in 1.87s"),
            Call("git_diff", {}, "diff --git a/shopcart/pricing.py b/shopcart/pricing.py\n..."),
            Call(
                "git_commit",
                {"message": "pricing: apply coupon in total()"},
                "[main 4e1c9a2] pricing: apply coupon in total()",
            ),
        ),
    ),
]


def _same_call_loop(call: Call, n: int) -> tuple[Call, ...]:
    return (call,) * n


_FAILING_EDIT_A = {
    "path": "src/duration.py",
    "old_string": "    return sum(int(n) * units[u] for n, u in parts)\n",
    "new_string": "    return sum(int(n) * units.get(u, 60) for n, u in parts)\n",
}
_FAILING_EDIT_B = {
    "path": "src/duration.py",
    "old_string": "    return sum(int(n) * units.get(u, 60) for n, u in parts)\n",
    "new_string": "    return sum(int(n) * units[u] for n, u in parts)\n",
}
_TIMINGS = (0.31, 0.29, 0.33, 0.30, 0.31, 0.28, 0.32, 0.30, 0.29, 0.31)


def _cycle(calls: tuple[Call, ...], rounds: int) -> tuple[Call, ...]:
    return calls * rounds


def _k8s_round() -> tuple[Call, ...]:
    return (
        Call("list_pods", {"namespace": "prod", "selector": "app=api"}, ["api-7d9f-abcde", "api-7d9f-fghij"]),
        Call(
            "describe_pod",
            {"namespace": "prod", "name": "api-7d9f-abcde"},
            "Status: CrashLoopBackOff\nRestart Count: 14",
        ),
        Call(
            "get_logs",
            {"namespace": "prod", "pod": "api-7d9f-abcde", "tail": 50},
            "KeyError: 'DATABASE_URL'\n",
        ),
        Call(
            "get_events",
            {"namespace": "prod", "object": "pod/api-7d9f-abcde"},
            ["Back-off restarting failed container"],
        ),
        Call(
            "get_node", {"name": "node-pool-a-3"}, {"name": "node-pool-a-3", "ready": True, "pressure": None}
        ),
    )


_HONEST_PREFIX: tuple[Call, ...] = (
    Call("list_directory", {"path": "."}, ["pyproject.toml", "src", "tests", "README.md"]),
    Call("read_file", {"path": "pyproject.toml"}, _REPO_FILES[0][1]),
    Call("read_file", {"path": "README.md"}, _REPO_FILES[1][1]),
    Call("grep", {"pattern": "TODO", "path": "src"}, "src/app.py:88:# TODO: install extras"),
    Call("read_file", {"path": "src/app.py"}, "import orjson\n\n# TODO: install extras\n"),
    Call("run_tests", {"path": "tests"}, "ImportError while importing test module: No module named 'orjson'"),
    Call("bash", {"command": "python --version"}, "Python 3.11.7"),
    Call(
        "bash", {"command": "pip --version"}, "pip 24.0 from /usr/lib/python3/site-packages/pip (python 3.11)"
    ),
    Call("read_file", {"path": "requirements.txt"}, "fastapi==0.110.0\norjson==3.10.0\n"),
    Call("bash", {"command": "pip config list"}, "global.index-url='https://pypi.internal.acme.io/simple'"),
    Call(
        "web_search",
        {"query": "pip install orjson no matching distribution internal index"},
        [{"title": "Mirror missing wheels"}],
    ),
    Call("bash", {"command": "uname -m"}, "aarch64"),
)

_STUCK: list[Session] = [
    Session(
        name="same_read_again_and_again",
        stuck=True,
        shape="repetition",
        loop_start=3,
        round_len=1,
        steps=(
            Call("list_directory", {"path": "src"}, ["app.py", "util.py"]),
            Call("grep", {"pattern": "def main", "path": "src"}, "src/app.py:12:def main():"),
            *_same_call_loop(
                Call("read_file", {"path": "src/app.py"}, "import sys\n\n\ndef main():\n    ...\n"), 12
            ),
        ),
    ),
    Session(
        name="same_weather_call_repeated",
        stuck=True,
        shape="repetition",
        loop_start=1,
        round_len=1,
        steps=_same_call_loop(_weather(15), 10),
    ),
    Session(
        name="repeat_with_fresh_request_id",
        stuck=True,
        shape="volatile ids",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call(
                "search",
                {"query": "refund policy for annual plans", "top_k": 5, "request_id": _uuid("rq", i)},
                [
                    {"doc": "kb/billing/refunds.md", "score": 0.82},
                    {"doc": "kb/billing/annual.md", "score": 0.77},
                ],
            )
            for i in range(12)
        ),
    ),
    Session(
        name="repeat_with_fresh_timestamp",
        stuck=True,
        shape="volatile ids",
        loop_start=2,
        round_len=1,
        steps=(
            Call("list_accounts", {"customer_id": "cus_8812"}, ["acct_main", "acct_savings"]),
            *(
                Call(
                    "get_account_balance",
                    {"account_id": "acct_main", "timestamp": _ts(3 * i)},
                    {"currency": "EUR", "balance": "1042.17"},
                )
                for i in range(12)
            ),
        ),
    ),
    Session(
        name="repeat_with_fresh_nonce",
        stuck=True,
        shape="volatile ids",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call(
                "call_api",
                {"method": "GET", "path": "/v1/orders/8812", "nonce": _hex("nonce", i)},
                {"id": 8812, "status": "pending_payment", "total_cents": 5400},
            )
            for i in range(12)
        ),
    ),
    Session(
        name="attempt_counter_in_args",
        stuck=True,
        shape="volatile ids",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call(
                "deploy",
                {"service": "billing", "version": "3.1.0", "env": "staging", "attempt": i + 1},
                error="DeployError: image registry.acme.io/billing:3.1.0 not found",
            )
            for i in range(11)
        ),
        notes="an increasing attempt counter is the only change",
    ),
    Session(
        name="results_echo_request_id_and_timing",
        stuck=True,
        shape="volatile results",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call(
                "call_api",
                {"method": "GET", "path": "/v1/inventory/sku-1182"},
                {
                    "request_id": f"req_{_hex('inv', i, 20)}",
                    "elapsed_ms": 112 + (i * 37) % 29,
                    "data": {"sku": "sku-1182", "on_hand": 0, "backorder": True},
                },
            )
            for i in range(12)
        ),
    ),
    Session(
        name="status_poll_never_changes",
        stuck=True,
        shape="poll (stuck)",
        loop_start=2,
        round_len=1,
        steps=(
            Call(
                "submit_job",
                {"pipeline": "reindex", "params": {"index": "products"}},
                {"job_id": "job_19cc0e", "state": "queued"},
            ),
            *(
                Call(
                    "get_job_status",
                    {"job_id": "job_19cc0e"},
                    {"job_id": "job_19cc0e", "state": "running", "progress": 42, "checked_at": _ts(5 * i)},
                )
                for i in range(14)
            ),
        ),
        notes="only checked_at changes: the job is hung at 42%",
    ),
    Session(
        name="status_poll_with_sleep_never_changes",
        stuck=True,
        shape="poll (stuck)",
        loop_start=2,
        round_len=2,
        steps=(
            Call(
                "start_build",
                {"project": "webapp", "ref": "release/2.4"},
                {"build_id": 5540, "status": "queued"},
            ),
            *(
                step
                for i in range(9)
                for step in (
                    Call(
                        "get_build_status",
                        {"build_id": 5540},
                        {"status": "queued", "position": 3, "checked_at": _ts(11 * i)},
                    ),
                    Call("sleep", {"seconds": 10}, "slept 10s"),
                )
            ),
        ),
    ),
    Session(
        name="ping_pong_git_status_diff",
        stuck=True,
        shape="cycle 2",
        loop_start=1,
        round_len=2,
        steps=_cycle(
            (
                Call(
                    "git_status",
                    {},
                    "On branch main\nChanges not staged for commit:\n\tmodified:   src/app.py\n",
                ),
                Call(
                    "git_diff",
                    {"path": "src/app.py"},
                    "diff --git a/src/app.py b/src/app.py\n-    retries = 3\n+    retries = 5\n",
                ),
            ),
            8,
        ),
    ),
    Session(
        name="ping_pong_search_fetch",
        stuck=True,
        shape="cycle 2",
        loop_start=2,
        round_len=2,
        steps=(
            Call("read_file", {"path": "task.md"}, "Find the maintainer of libfoo"),
            *_cycle(
                (
                    Call(
                        "web_search",
                        {"query": "libfoo maintainer"},
                        [{"url": "https://github.com/libfoo/libfoo", "title": "libfoo"}],
                    ),
                    Call(
                        "fetch_url",
                        {"url": "https://github.com/libfoo/libfoo"},
                        {"status": 200, "text": "libfoo: a tiny library. 312 stars."},
                    ),
                ),
                8,
            ),
        ),
    ),
    Session(
        name="ping_pong_write_then_read_back",
        stuck=True,
        shape="cycle 2",
        loop_start=1,
        round_len=2,
        steps=_cycle(
            (
                Call(
                    "write_file",
                    {"path": "out/report.md", "content": "# Report\n\nTBD\n"},
                    "Wrote 15 bytes to out/report.md",
                ),
                Call("read_file", {"path": "out/report.md"}, "# Report\n\nTBD\n"),
            ),
            8,
        ),
    ),
    Session(
        name="ping_pong_with_timestamped_results",
        stuck=True,
        shape="cycle 2",
        loop_start=1,
        round_len=2,
        steps=tuple(
            step
            for i in range(8)
            for step in (
                Call(
                    "get_queue_stats",
                    {"queue": "webhooks"},
                    {"depth": 1840, "consumers": 0, "generated_at": _ts(4 * i)},
                ),
                Call(
                    "list_dead_letters",
                    {"queue": "webhooks", "limit": 3},
                    {"items": ["msg_a1", "msg_b2", "msg_c3"], "generated_at": _ts(4 * i + 2)},
                ),
            )
        ),
    ),
    Session(
        name="cycle_of_three_identical",
        stuck=True,
        shape="cycle 3",
        loop_start=1,
        round_len=3,
        steps=_cycle(
            (
                Call("list_files", {"path": "src/handlers"}, ["auth.py", "orders.py"]),
                Call(
                    "read_file",
                    {"path": "src/handlers/orders.py"},
                    "def handle(req):\n    return process(req)\n",
                ),
                Call("grep", {"pattern": "def process", "path": "src"}, ""),
            ),
            6,
        ),
        notes="grep finds nothing, the agent starts over",
    ),
    Session(
        name="cycle_of_three_with_fresh_request_ids",
        stuck=True,
        shape="cycle 3",
        loop_start=1,
        round_len=3,
        steps=tuple(
            step
            for r in range(6)
            for step in (
                Call(
                    "search_kb",
                    {"query": "reset MFA for SSO users", "request_id": _uuid("kb", 3 * r)},
                    [{"article_id": "KB-2231", "title": "Resetting MFA"}],
                ),
                Call(
                    "get_article",
                    {"article_id": "KB-2231", "request_id": _uuid("kb", 3 * r + 1)},
                    {"id": "KB-2231", "body": "Admins can reset MFA in the console."},
                ),
                Call(
                    "get_related",
                    {"article_id": "KB-2231", "request_id": _uuid("kb", 3 * r + 2)},
                    [{"article_id": "KB-1180", "title": "SSO overview"}],
                ),
            )
        ),
        notes="every call carries a fresh request id; arguments are otherwise the same each round",
    ),
    Session(
        name="cycle_of_four_identical",
        stuck=True,
        shape="cycle 4",
        loop_start=1,
        round_len=4,
        steps=_cycle(
            (
                Call(
                    "get_order",
                    {"order_id": "A-1009"},
                    {"id": "A-1009", "status": "shipped", "customer_id": "C-77"},
                ),
                Call(
                    "get_customer", {"customer_id": "C-77"}, {"id": "C-77", "name": "Ada L.", "tier": "gold"}
                ),
                Call(
                    "get_shipment",
                    {"order_id": "A-1009"},
                    {"carrier": "DHL", "tracking": "JD0146", "state": "in_transit"},
                ),
                Call("get_invoice", {"order_id": "A-1009"}, {"id": "INV-5521", "paid": True}),
            ),
            5,
        ),
    ),
    Session(
        name="cycle_of_four_with_timestamps_in_args",
        stuck=True,
        shape="cycle 4",
        loop_start=1,
        round_len=4,
        steps=tuple(
            step
            for r in range(5)
            for step in (
                Call("get_metric", {"name": "cpu", "host": "db-1", "at": _ts(40 * r)}, {"value": 0.97}),
                Call("get_metric", {"name": "mem", "host": "db-1", "at": _ts(40 * r + 1)}, {"value": 0.62}),
                Call(
                    "query_logs",
                    {"host": "db-1", "level": "error", "at": _ts(40 * r + 2)},
                    ["too many connections"],
                ),
                Call(
                    "get_alerts",
                    {"host": "db-1", "at": _ts(40 * r + 3)},
                    [{"name": "HighCPU", "state": "firing"}],
                ),
            )
        ),
    ),
    Session(
        name="cycle_of_five_k8s_debugging",
        stuck=True,
        shape="cycle 5",
        loop_start=1,
        round_len=5,
        steps=_cycle(_k8s_round(), 5),
    ),
    Session(
        name="cycle_of_five_after_honest_start",
        stuck=True,
        shape="cycle 5",
        loop_start=4,
        round_len=5,
        steps=(
            Call("get_cluster_info", {}, {"version": "1.29.4", "nodes": 6}),
            Call("list_namespaces", {}, ["default", "prod", "staging"]),
            Call("get_deployment", {"namespace": "prod", "name": "api"}, {"replicas": 2, "available": 0}),
            *_cycle(_k8s_round(), 5),
        ),
    ),
    Session(
        name="edit_test_alternating_two_edits",
        stuck=True,
        shape="edit-test",
        loop_start=3,
        round_len=4,
        steps=(
            Call(
                "read_file",
                {"path": "src/duration.py"},
                "def parse_duration(s):\n    parts = re.findall(r'(\\d+)([a-z])', s)\n",
            ),
            Call("run_tests", {"path": "tests/test_duration.py"}, _pytest_fail("KeyError: 'h'", 0.34)),
            *(
                step
                for r in range(5)
                for step in (
                    Call("edit_file", _FAILING_EDIT_A, "Applied 1 edit to src/duration.py"),
                    Call(
                        "run_tests",
                        {"path": "tests/test_duration.py"},
                        _pytest_fail("AssertionError: assert 90 == 5400", _TIMINGS[2 * r]),
                    ),
                    Call("edit_file", _FAILING_EDIT_B, "Applied 1 edit to src/duration.py"),
                    Call(
                        "run_tests",
                        {"path": "tests/test_duration.py"},
                        _pytest_fail("AssertionError: assert 90 == 5400", _TIMINGS[2 * r + 1]),
                    ),
                )
            ),
        ),
        notes="the two edits undo each other; the failure is the same but for the timing (in 0.31s / in 0.29s)",
    ),
    Session(
        name="deploy_retry_same_503",
        stuck=True,
        shape="retry",
        loop_start=3,
        round_len=1,
        steps=(
            Call("run_tests", {"path": "tests"}, "212 passed in 14.02s"),
            Call(
                "build_image",
                {"service": "api", "tag": "2.4.1"},
                {"image": "registry.acme.io/api:2.4.1", "digest": "sha256:" + _hex("img", 1, 64)},
            ),
            *_same_call_loop(
                Call(
                    "deploy",
                    {"service": "api", "version": "2.4.1", "env": "prod"},
                    error="HTTP 503 Service Unavailable: deploy-controller is not ready",
                ),
                10,
            ),
        ),
    ),
    Session(
        name="db_query_same_error",
        stuck=True,
        shape="retry",
        loop_start=2,
        round_len=1,
        steps=(
            Call("list_tables", {"schema": "public"}, ["users", "sessions", "events"]),
            *_same_call_loop(
                Call(
                    "query_db",
                    {"sql": "SELECT user_id, count(*) FROM user_sessions GROUP BY 1"},
                    error='ERROR:  relation "user_sessions" does not exist\nLINE 1: SELECT user_id, count(*) FROM user_sessions GROUP BY 1',
                ),
                10,
            ),
        ),
    ),
    Session(
        name="edit_not_found_retried",
        stuck=True,
        shape="retry",
        loop_start=2,
        round_len=1,
        steps=(
            Call(
                "read_file",
                {"path": "src/server.ts"},
                "export const PORT = Number(process.env.PORT ?? 8080);\n",
            ),
            *_same_call_loop(
                Call(
                    "edit_file",
                    {
                        "path": "src/server.ts",
                        "old_string": "const PORT = 8080;",
                        "new_string": "const PORT = 3000;",
                    },
                    error="old_string not found in src/server.ts",
                ),
                10,
            ),
        ),
    ),
    Session(
        name="paging_past_the_end",
        stuck=True,
        shape="pagination",
        loop_start=4,
        round_len=1,
        steps=(
            *(
                Call(
                    "list_issues",
                    {"owner": "acme", "repo": "tiny", "state": "open", "page": p, "per_page": 5},
                    _issues_page(p, total=12),
                )
                for p in (1, 2, 3)
            ),
            *_same_call_loop(
                Call(
                    "list_issues",
                    {"owner": "acme", "repo": "tiny", "state": "open", "page": 4, "per_page": 5},
                    [],
                ),
                10,
            ),
        ),
        notes="page 4 is past the end; the agent keeps asking for it",
    ),
    Session(
        name="same_write_same_content",
        stuck=True,
        shape="repetition",
        loop_start=2,
        round_len=1,
        steps=(
            Call("read_file", {"path": "docker-compose.yml"}, "services:\n  db:\n    image: postgres:15\n"),
            *_same_call_loop(
                Call(
                    "write_file",
                    {"path": "docker-compose.yml", "content": "services:\n  db:\n    image: postgres:16\n"},
                    "Wrote 39 bytes to docker-compose.yml",
                ),
                10,
            ),
        ),
    ),
    Session(
        name="parallel_step_repeated_identically",
        stuck=True,
        shape="identical step",
        loop_start=1,
        round_len=3,
        steps=(Parallel(tuple(_weather(i) for i in (15, 16, 17))),) * 5,
    ),
    Session(
        name="parallel_step_repeated_with_timestamps",
        stuck=True,
        shape="identical step",
        loop_start=3,
        round_len=4,
        steps=(
            Call("get_portfolio", {"user": "u_311"}, {"tickers": ["AAPL", "MSFT", "NVDA", "TSLA"]}),
            Call("get_market_status", {}, {"open": False, "next_open": "2026-03-02T14:30:00Z"}),
            *(
                Parallel(
                    tuple(
                        Call(
                            "get_quote",
                            {"symbol": sym},
                            {"symbol": sym, "price": price, "as_of": _ts(30 * r)},
                        )
                        for sym, price in (
                            ("AAPL", 241.84),
                            ("MSFT", 396.99),
                            ("NVDA", 124.92),
                            ("TSLA", 292.98),
                        )
                    )
                )
                for r in range(6)
            ),
        ),
        notes="the market is closed: the quotes never change, only as_of does",
    ),
    Session(
        name="parallel_pair_with_nonces",
        stuck=True,
        shape="identical step",
        loop_start=1,
        round_len=2,
        steps=tuple(
            Parallel(
                (
                    Call(
                        "get_balance",
                        {"account": "acct_A", "nonce": _hex("nA", r)},
                        {"account": "acct_A", "balance": "0.00"},
                    ),
                    Call(
                        "get_balance",
                        {"account": "acct_B", "nonce": _hex("nB", r)},
                        {"account": "acct_B", "balance": "250.00"},
                    ),
                )
            )
            for r in range(8)
        ),
    ),
    Session(
        name="mcp_stuck_add_with_short_pauses",
        stuck=True,
        shape="mcp-only arithmetic",
        transport="mcp",
        loop_start=2,
        round_len=1,
        steps=(
            Call("add", {"a": 40, "b": 2}, "42"),
            Pause(2.0),
            *(step for _ in range(10) for step in (Call("add", {"a": 17, "b": 25}, "42"), Pause(3.5))),
        ),
        notes="pauses of a few seconds, well under turn_gap_s: all one turn",
    ),
    Session(
        name="mcp_ping_pong_with_pauses",
        stuck=True,
        shape="cycle 2",
        transport="mcp",
        loop_start=1,
        round_len=2,
        steps=tuple(
            step
            for _ in range(8)
            for step in (
                Call("list_resources", {"uri_prefix": "file:///srv/data"}, ["file:///srv/data/a.csv"]),
                Pause(5.0),
                Call("read_resource", {"uri": "file:///srv/data/a.csv"}, "id,value\n1,\n"),
                Pause(4.0),
            )
        ),
    ),
    Session(
        name="install_loop_after_honest_work",
        stuck=True,
        shape="retry",
        loop_start=13,
        round_len=1,
        steps=(
            *_HONEST_PREFIX,
            *_same_call_loop(
                Call(
                    "bash",
                    {"command": "pip install orjson==3.10.0"},
                    error="ERROR: Could not find a version that satisfies the requirement orjson==3.10.0 (from versions: none)\n"
                    "ERROR: No matching distribution found for orjson==3.10.0",
                ),
                10,
            ),
        ),
    ),
    Session(
        name="loop_in_a_later_user_turn",
        stuck=True,
        shape="repetition",
        loop_start=4,
        round_len=1,
        steps=(
            User("Summarise PR 42 for me"),
            Call(
                "get_pull_request",
                {"repo": "acme/webapp", "number": 42},
                {"title": "Add coupon expiry", "state": "open", "checks": "pending"},
            ),
            Call(
                "list_pr_files",
                {"repo": "acme/webapp", "number": 42},
                ["shopcart/services/coupons.py", "tests/test_coupons.py"],
            ),
            Call(
                "get_pr_diff",
                {"repo": "acme/webapp", "number": 42},
                "+    if coupon.expires_at < now:\n+        raise Expired\n",
            ),
            User("Tell me when its checks have passed"),
            Call(
                "get_pr_status",
                {"repo": "acme/webapp", "number": 42},
                {"checks": "pending", "required": 3, "passed": 2},
            ),
            *_same_call_loop(
                Call(
                    "get_pr_status",
                    {"repo": "acme/webapp", "number": 42},
                    {"checks": "pending", "required": 3, "passed": 2},
                ),
                10,
            ),
        ),
        notes="the first turn is honest; the loop starts at the first status check of the second turn",
    ),
]

# --- what counts as news (issue 21): counters and measurements, ids in any alphabet, results folded
# as arguments, harness nudges, and shapes the corpus lacked (Anthropic and Responses-chain dialects,
# writes inside cycles, oscillating patches, results that are only identifiers) ------------------

_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"


def _rid(alphabet: str, salt: str, i: int, n: int = 22) -> str:
    """A random-looking but deterministic id in `alphabet` (a trace or request id, a cursor)."""
    digest = hashlib.sha256(f"{salt}:{i}".encode()).digest() * 2
    return "".join(alphabet[b % len(alphabet)] for b in digest[:n])


def _nudged(calls: tuple[Step, ...], nudge: str = "Continue.") -> tuple[Step, ...]:
    """A harness that answers every step with the same words, at once."""
    return tuple(x for call in calls for x in (call, User(nudge, seconds=0.5)))


_NEWS_HONEST = [
    Session(
        name="poll_percentages_with_poll_counter_and_trace_id",
        stuck=False,
        shape="poll (changing)",
        steps=tuple(
            Call(
                "get_job_status",
                {"job": "etl-2026-03-01"},
                f"job etl-2026-03-01: running {pct}% (poll {n + 1}, trace {_rid(_B62, 'poll', n)})",
            )
            for n, pct in enumerate((5, 20, 20, 35, 60, 60, 75, 90, 100))
        ),
        notes="the percentage is news; the poll counter and the trace id are not (20% twice in a row is"
        " one poll without progress, well under any threshold)",
    ),
    Session(
        name="training_iterations_jump",
        stuck=False,
        shape="poll (changing)",
        steps=tuple(
            Call(
                "get_training_run",
                {"run": "bert-ft-7"},
                {"state": "training", "iteration": 500 * n, "tick": n},
            )
            for n in range(1, 11)
        ),
        notes="`iteration` is named like a counter but jumps by 500: a measurement (a `tick` steps by one)",
    ),
    Session(
        name="queue_drain_depth_goes_down",
        stuck=False,
        shape="queue drain",
        steps=tuple(
            Call("pop_message", {"queue": "invoices"}, f"processed message #{41 + n}; depth {17 - n}")
            for n in range(15)
        ),
        notes="the message number is a counter, the depth a measurement that moves: every pop is news",
    ),
    Session(
        name="rollout_pods_ready_step_by_one",
        stuck=False,
        shape="poll (changing)",
        steps=tuple(
            Call("get_rollout", {"deployment": "api"}, f"{n} of 8 pods ready (attempt {n + 1})")
            for n in range(9)
        ),
        notes="a measurement that happens to step by one per call is news; only a number named as a count"
        " of calls is a counter",
    ),
    Session(
        name="price_and_depth_readings",
        stuck=False,
        shape="sensor readings",
        steps=tuple(
            Call("read_gauges", {"site": "tank-3"}, {"depth_cm": depth, "price_usd_per_m3": price, "req": n})
            for n, (depth, price) in enumerate(
                ((212, 1.43), (209, 1.43), (205, 1.44), (201, 1.44), (198, 1.45), (194, 1.45), (190, 1.46))
            )
        ),
    ),
    Session(
        name="paging_results_that_are_only_ids",
        stuck=False,
        shape="results only ids",
        steps=tuple(
            Call(
                "list_object_ids",
                {"bucket": "scans", "cursor": _rid(_B62, "cursor", p - 1) if p else None},
                {"ids": [_rid(_B58, "obj", 10 * p + j) for j in range(10)], "next": _rid(_B62, "cursor", p)},
            )
            for p in range(12)
        ),
        notes="a page of bare ids and an opaque cursor: a value that is only an id names a thing",
    ),
    Session(
        name="create_records_answered_with_only_ids",
        stuck=False,
        shape="results only ids",
        steps=tuple(
            Call(
                "create_record", {"table": "leads", "email": f"lead{i}@example.com"}, _rid(_B62, "rec", i, 16)
            )
            for i in range(12)
        ),
    ),
    Session(
        name="check_objects_by_url_all_ok",
        stuck=False,
        shape="identical answers",
        steps=tuple(
            Call(
                "http_get",
                {"url": f"https://api.example.com/v1/objects/{_rid(_B62, 'obj-url', i)}"},
                {"status": 200, "body": "ok"},
            )
            for i in range(12)
        ),
        notes="12 objects, one answer: an id in a path names what the call is about",
    ),
    Session(
        name="identical_answers_to_distinct_searches",
        stuck=False,
        shape="identical answers",
        steps=tuple(
            Call("search_code", {"query": q}, f'No results for "{q}" (request {_rid(_B32, "sr", i, 26)})')
            for i, q in enumerate(
                (
                    "parse_duration",
                    "DurationError",
                    "units.get",
                    "def parse(",
                    "import re",
                    "timedelta(",
                    "1h30m",
                    "TIMEOUT_S",
                )
            )
        ),
        notes="distinct calls whose answers differ only by the query they echo and a request id",
    ),
    Session(
        name="new_question_at_every_step",
        stuck=False,
        shape="harness nudges",
        transport="fc",
        steps=tuple(
            x
            for i in range(8)
            for x in (
                User(f"Question {i + 1}: is the payments service healthy now?"),
                Call("get_service_status", {"service": "payments"}, {"status": "healthy"}),
            )
        ),
        notes="the same status check, each time for a new question: each begins a turn",
    ),
    Session(
        name="nudged_poll_that_moves",
        stuck=False,
        shape="harness nudges",
        transport="fc",
        steps=(
            User("Wait for the export and tell me when it is done."),
            *_nudged(
                tuple(
                    Call("get_export", {"export": "q1-report"}, f"export q1-report: {pct}% written")
                    for pct in (0, 10, 25, 40, 55, 70, 85, 95)
                )
            ),
        ),
        notes="the harness answers every step with the same words; the export is moving: no loop",
    ),
    Session(
        name="anthropic_coding_session",
        stuck=False,
        shape="coding session",
        transport="fc",
        dialect="anthropic",
        steps=(
            Call("Read", {"file_path": "src/duration.py"}, "def parse_duration(s):\n    return int(s)\n"),
            Call(
                "Grep",
                {"pattern": "parse_duration", "path": "."},
                "src/duration.py:1\ntests/test_duration.py:3",
            ),
            Call(
                "Read",
                {"file_path": "tests/test_duration.py"},
                "def test_parse():\n    assert parse('1h30m')",
            ),
            Call("Bash", {"command": "pytest -q"}, error=_pytest_fail("ValueError: '1h30m'", 0.41)),
            Call(
                "Edit",
                {"file_path": "src/duration.py", "old_string": "int(s)", "new_string": "_parse(s)"},
                "ok",
            ),
            Call(
                "Bash",
                {"command": "pytest -q"},
                error=_pytest_fail("NameError: name '_parse' is not defined", 0.38),
            ),
            Call(
                "Edit",
                {"file_path": "src/duration.py", "old_string": "def parse", "new_string": "def _parse"},
                "ok",
            ),
            Call("Bash", {"command": "pytest -q"}, error=_pytest_fail("KeyError: 'm'", 0.40)),
            Call(
                "Edit",
                {"file_path": "src/duration.py", "old_string": "units[u]", "new_string": "UNITS[u]"},
                "ok",
            ),
            Call("Bash", {"command": "pytest -q"}, "14 passed in 0.33s"),
            Call("Bash", {"command": "git diff --stat"}, " src/duration.py | 9 ++++++---"),
        ),
    ),
    Session(
        name="responses_chain_research",
        stuck=False,
        shape="research",
        transport="fc",
        dialect="responses",
        steps=tuple(
            x
            for i, topic in enumerate(("pricing", "limits", "regions", "sla", "support", "roadmap"))
            for x in (
                Call("web_search", {"q": f"tripwire {topic}"}, [f"https://tripwire.dev/{topic}"]),
                Call(
                    "fetch",
                    {"url": f"https://tripwire.dev/{topic}"},
                    f"# {topic}\n{100 + 7 * i} words about {topic}",
                ),
            )
        ),
    ),
]

_NEWS_STUCK = [
    Session(
        name="retry_with_base62_trace_and_attempt_counter",
        stuck=True,
        shape="retry",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call(
                "deploy",
                {"service": "api", "version": "2.4.1"},
                error=f"Internal error (trace {_rid(_B62, 'dep', n)}, attempt {n + 1} of 10)",
            )
            for n in range(10)
        ),
    ),
    Session(
        name="retry_with_base32_request_id_and_retry_number",
        stuck=True,
        shape="retry",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call(
                "publish_package",
                {"name": "tripwire-sdk", "version": "0.9.0", "dry_run": n % 2 == 0},
                error=f"Retry #{n + 1}: registry answered 503 Service Unavailable, request {_rid(_B32, 'pub', n, 26)}",
            )
            for n in range(10)
        ),
        notes="the arguments change (dry_run toggles) but the same failure comes back: no progress",
    ),
    Session(
        name="poll_with_base58_trace_and_poll_counter",
        stuck=True,
        shape="poll (stuck)",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call(
                "get_job_status",
                {"job": "etl-2026-03-01"},
                f"job etl-2026-03-01: running 40% (poll {n + 1}, trace {_rid(_B58, 'stuck-poll', n)})",
            )
            for n in range(10)
        ),
    ),
    Session(
        name="decimal_trace_ids_in_errors",
        stuck=True,
        shape="retry",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call(
                "query_metrics",
                {"query": "sum(rate(http_requests_total[5m]))"},
                error=f"upstream timeout, dd.trace_id={_rid('123456789', 'dd', n, 19)}"
                f" span_id={_rid('123456789', 'span', n, 19)}",
            )
            for n in range(10)
        ),
    ),
    Session(
        name="search_echo_case_variations",
        stuck=True,
        shape="near-duplicate queries",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call("search_docs", {"query": q}, {"query": q, "hits": [], "message": f'No results for "{q}".'})
            for q in (
                "tripwire rate limits",
                "Tripwire rate limits",
                "tripwire  rate limits?",
                "TRIPWIRE RATE LIMITS",
                "Tripwire Rate Limits.",
                "tripwire rate  limits",
                "Tripwire rate limits?",
                "tripwire RATE limits",
            )
        ),
        notes="the same search re-sent in other case and spacing; the tool echoes the query",
    ),
    Session(
        name="counter_phrase_in_arguments",
        stuck=True,
        shape="volatile ids",
        loop_start=1,
        round_len=1,
        steps=tuple(
            Call(
                "ask_support_bot",
                {"message": f"Is the refund for order 1182 done? (attempt {n + 1})"},
                "Still processing.",
            )
            for n in range(8)
        ),
    ),
    Session(
        name="harness_continue_repetition",
        stuck=True,
        shape="harness nudges",
        transport="fc",
        loop_start=1,
        round_len=1,
        steps=(
            User("Find out why checkout is slow."),
            *_nudged(
                _same_call_loop(Call("get_trace_summary", {"service": "checkout"}, "p99 2.4s, 91% in db"), 9)
            ),
        ),
        notes="every step answered with 'Continue.': one turn from the first nudge on",
    ),
    Session(
        name="harness_nudge_anthropic_ping_pong",
        stuck=True,
        shape="harness nudges",
        transport="fc",
        dialect="anthropic",
        loop_start=1,
        round_len=2,
        steps=(
            User("Fix the failing test."),
            *_nudged(
                _cycle(
                    (
                        Call(
                            "Read",
                            {"file_path": "src/duration.py"},
                            "def parse_duration(s):\n    return int(s)\n",
                        ),
                        Call(
                            "Bash", {"command": "pytest -q"}, error=_pytest_fail("ValueError: '1h30m'", 0.41)
                        ),
                    ),
                    6,
                ),
                "Keep going until the tests pass.",
            ),
        ),
    ),
    Session(
        name="harness_nudge_responses_chain",
        stuck=True,
        shape="harness nudges",
        transport="fc",
        dialect="responses",
        loop_start=1,
        round_len=1,
        steps=(
            User("Is the nightly export done?"),
            *_nudged(
                _same_call_loop(Call("get_export", {"export": "nightly"}, "export nightly: 40% written"), 9)
            ),
        ),
        notes="a Responses chain: each request carries the output and the nudge, naming the answer before",
    ),
    Session(
        name="anthropic_repeated_read",
        stuck=True,
        shape="repetition",
        dialect="anthropic",
        loop_start=1,
        round_len=1,
        steps=_same_call_loop(Call("Read", {"file_path": "docs/guards.md"}, "# Guards\n..."), 8),
    ),
    Session(
        name="responses_chain_ping_pong",
        stuck=True,
        shape="cycle 2",
        dialect="responses",
        loop_start=1,
        round_len=2,
        steps=_cycle(
            (
                Call("web_search", {"q": "tripwire sla"}, ["https://tripwire.dev/sla"]),
                Call("fetch", {"url": "https://tripwire.dev/sla"}, "# SLA\nSee the pricing page."),
            ),
            6,
        ),
    ),
    Session(
        name="write_inside_cycle_same_content",
        stuck=True,
        shape="write in cycle",
        loop_start=1,
        round_len=3,
        steps=_cycle(
            (
                Call("read_file", {"path": "deploy/values.yaml"}, "replicas: 3\nimage: api:2.4.1\n"),
                Call(
                    "write_file",
                    {"path": "deploy/values.yaml", "content": "replicas: 3\nimage: api:2.4.2\n"},
                    "ok",
                ),
                Call("helm_lint", {"chart": "deploy"}, error="Error: values.yaml: image api:2.4.2 not found"),
            ),
            5,
        ),
        notes="the write changes the file each round, but to the same content it already wrote",
    ),
    Session(
        name="oscillating_patches",
        stuck=True,
        shape="edit-test",
        loop_start=1,
        round_len=4,
        steps=tuple(
            call
            for r in range(4)
            for call in (
                Call("edit_file", _FAILING_EDIT_A, "ok"),
                Call(
                    "run_tests",
                    {"path": "tests/test_duration.py"},
                    error=_pytest_fail("KeyError: 'm'", _TIMINGS[r]),
                ),
                Call("edit_file", _FAILING_EDIT_B, "ok"),
                Call(
                    "run_tests",
                    {"path": "tests/test_duration.py"},
                    error=_pytest_fail("ValueError: '1h30m'", _TIMINGS[r + 4]),
                ),
            )
        ),
        notes="patch A, test, patch B (A undone), test: the same two failures forever",
    ),
    Session(
        name="same_id_looked_up_again_and_again",
        stuck=True,
        shape="results only ids",
        loop_start=1,
        round_len=1,
        steps=_same_call_loop(
            Call("lookup_user_id", {"email": "ana@example.com"}, "usr_8fK2mZpQ7xL1vN3aR"), 8
        ),
    ),
]

SESSIONS: list[Session] = _HONEST + _NEWS_HONEST + _STUCK + _NEWS_STUCK

# issue 31's sessions (news judged by structure), in their own module
from loop_corpus_structure import SESSIONS as _STRUCTURE  # noqa: E402

SESSIONS += _STRUCTURE
