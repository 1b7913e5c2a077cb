"""The budget windows' operations of the shared state (proxy/state/windows.py): one contract run
against `MemoryBackend` and `RedisBackend` (a real redis-server), the Lua scripts and their Python
twin deciding alike, in the admission's APPEND and on their own."""

from __future__ import annotations

from typing import Any

from proxy.admission.budget_window.twin import TWIN as WINDOWS
from proxy.guard_log import entries
from proxy.state import keys
from proxy.state.base import Append, CheckAsk, StateBackend
from proxy.state.windows import WindowRequest
from tests.test_state_backend import backend  # noqa: F401 (fixture: memory and redis)

DAY = keys.window("agent:a", "day:2026-11-27")
NOW = 1_795_000_000.0


def header(
    n: int, usd: float, *, max_usd: float = 10.0, seen: float = 0.0, place: bool = True
) -> dict[str, Any]:
    window = {"max_usd": max_usd, "max_tok": -1, "ttl": 60_000, "spent": seen, "tokens": 0, "alerted": False}
    return {
        "id": f"r:{n}",
        "usd": usd,
        "tok": 0,
        "now": NOW,
        "stale": 900,
        "place": place,
        "force": False,
        "w": [window],
    }


def settle(n: int, usd: float, alert_usd: float = -1) -> dict[str, Any]:
    window = {
        "ttl": 60_000,
        "alert_usd": alert_usd,
        "alert_tok": -1,
        "spent": 0.0,
        "tokens": 0,
        "alerted": False,
    }
    return {"id": f"r:{n}", "usd": usd, "tok": 7, "w": [window]}


async def test_reservations_stop_exactly_at_the_limit_then_settle_release_and_reset(
    backend: StateBackend,  # noqa: F811
) -> None:
    store = backend.windows
    answers = [await store.reserve([DAY], header(n, 1.0)) for n in range(12)]
    assert [refused for refused, _ in answers] == [0] * 10 + [1, 1]
    assert answers[10][1] == [(0.0, 0, 10.0, 0, False)]
    # two settle below their reservation, one never reached the upstream: room for 0.5 + 0.5 + 1
    assert await store.settle([DAY], settle(0, 0.5, alert_usd=0.9)) == [(0.5, 7, False)]
    assert await store.settle([DAY], settle(1, 0.5, alert_usd=0.9)) == [(1.0, 14, True)]  # first past 0.9
    assert await store.settle([DAY], settle(2, 0.5, alert_usd=0.9)) == [(1.5, 21, False)]  # once only
    await store.release([DAY], {"id": "r:3"})
    refused, rows = await store.reserve([DAY], header(20, 1.0))
    assert refused == 0 and rows[0][:4] == (1.5, 21, 6.0, 0)
    await store.reset([DAY], {"w": [{"ttl": 60_000}]})
    refused, rows = await store.reserve([DAY], header(21, 0.0, place=False))
    assert refused == 0 and rows[0][:2] == (0.0, 0) and rows[0][2] == 7.0  # in flight kept their holds


async def test_a_window_the_backend_lost_is_put_back_from_what_the_replica_saw(
    backend: StateBackend,  # noqa: F811
) -> None:
    refused, rows = await backend.windows.reserve([DAY], header(1, 1.0, seen=7.0))
    assert refused == 0 and rows[0][0] == 7.0  # the first replica to call saw $7
    refused, rows = await backend.windows.reserve([DAY], header(2, 1.0, seen=9.5))
    assert refused == 1 and rows[0][0] == 9.5  # one that saw more raises it: 9.5 + 1 in flight
    await backend.windows.reserve([DAY], header(3, 1.0, seen=3.0))  # one that saw less lowers nothing
    refused, rows = await backend.windows.reserve([DAY], header(4, 0.0, place=False))
    assert rows[0][0] == 9.5
    # after a reset, what a replica saw before it raises nothing
    await backend.windows.reset([DAY], {"w": [{"ttl": 60_000}]})
    refused, rows = await backend.windows.reserve([DAY], header(5, 1.0, seen=9.5))
    assert refused == 0 and rows[0][0] == 0.0


async def test_the_admission_append_reserves_its_checks_in_their_windows(
    backend: StateBackend,  # noqa: F811
) -> None:
    checks = [entries.tool_check(entries.check_id(), "t", {"n": n}, "s", 0.0) for n in range(3)]
    step = Append(
        "agent:a",
        "run-1",
        checks,
        since=0,
        idle_s=60,
        checks=[CheckAsk(WINDOWS, n + 1, WindowRequest([DAY], header(n, 4.0))) for n in range(3)],
    )
    appended = await backend.append(step)
    assert [refused for refused, _ in appended.answers] == [0, 0, 0]  # 0, 4, 8 in flight: under 10
    assert [rows[0][2] for _, rows in appended.answers] == [0.0, 4.0, 8.0]
    refused, _ = await backend.windows.reserve([DAY], header(9, 1.0))
    assert refused == 1  # 12 in flight
