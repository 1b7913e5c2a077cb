"""The pure rules of budgets over time (proxy/guards/budget_window.py): calendar windows in a
timezone, reservations, soft alert, reset; the clock passed in."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from proxy.guard_backend.windows import LocalWindows
from proxy.guards.budget_window import AgentWindows, window_of
from proxy.guards.config import BudgetWindowConfig, GuardConfig

NY = "America/New_York"


def ts(*args: int, tz: str = "UTC") -> float:
    return dt.datetime(*args, tzinfo=ZoneInfo(tz)).timestamp()


def test_a_day_is_the_local_calendar_day() -> None:
    w = window_of("day", "UTC", ts(2026, 11, 27, 12))
    assert w.key == "day:2026-11-27"
    assert w.start == ts(2026, 11, 27) and w.end == ts(2026, 11, 28)
    assert w.resets_at() == "2026-11-28T00:00:00Z"
    # 23:30 in New York is already tomorrow in UTC: the agent's day is New York's
    late = ts(2026, 11, 27, 23, 30, tz=NY)
    assert window_of("day", NY, late).key == "day:2026-11-27"
    assert window_of("day", "UTC", late).key == "day:2026-11-28"
    assert window_of("day", NY, late).resets_at() == "2026-11-28T05:00:00Z"


def test_days_across_daylight_saving_changes_are_23_and_25_hours_and_leave_no_gap() -> None:
    spring = window_of("day", NY, ts(2026, 3, 8, 12, tz=NY))
    autumn = window_of("day", NY, ts(2026, 11, 1, 12, tz=NY))
    assert spring.end - spring.start == 23 * 3600
    assert autumn.end - autumn.start == 25 * 3600
    # consecutive windows meet exactly
    before = window_of("day", NY, spring.start - 1)
    after = window_of("day", NY, spring.end)
    assert before.end == spring.start and after.start == spring.end
    assert after.key == "day:2026-03-09"


def test_a_day_whose_midnight_does_not_exist_still_meets_its_neighbours() -> None:
    # Santiago moves its clocks at local midnight: 2026-09-06 00:00 does not exist there
    tz = "America/Santiago"
    first = window_of("day", tz, ts(2026, 9, 5, 12, tz=tz))
    second = window_of("day", tz, first.end)
    assert second.start == first.end and second.key == "day:2026-09-06"
    assert window_of("day", tz, first.end - 1).key == "day:2026-09-05"


def test_weeks_are_iso_weeks_starting_monday_and_months_roll_over_the_year() -> None:
    week = window_of("week", "UTC", ts(2026, 11, 27, 12))  # a Friday
    assert week.key == "week:2026-W48"
    assert week.start == ts(2026, 11, 23) and week.end == ts(2026, 11, 30)
    assert window_of("week", "UTC", ts(2027, 1, 1)).key == "week:2026-W53"  # ISO year of its Monday
    december = window_of("month", "UTC", ts(2026, 12, 31, 23, 59))
    assert december.key == "month:2026-12" and december.end == ts(2027, 1, 1)
    assert window_of("month", "UTC", december.end).key == "month:2027-01"


def day(**kw: float) -> tuple[BudgetWindowConfig, ...]:
    return GuardConfig.model_validate({"budget_windows": [{"period": "day", **kw}]}).budget_windows


NOON = ts(2026, 11, 27, 12)


def test_reservations_of_calls_in_flight_stop_concurrent_calls_exactly_at_the_limit() -> None:
    windows = AgentWindows()
    configs = day(max_cost_usd=10)
    holds = []
    refusals = []
    for _ in range(50):  # 50 calls admitted before any answer
        refusal, hold = windows.check(configs, "UTC", 1.0, 0, NOON)
        if hold is not None:
            holds.append(hold)
        else:
            refusals.append(refusal)
    assert len(holds) == 10 and len(refusals) == 40
    refusal = refusals[0]
    assert refusal is not None and refusal.guard == "budget_window_exceeded"
    assert refusal.resets_at == "2026-11-28T00:00:00Z" and refusal.threshold == 10
    # one answer cheaper than reserved frees room for exactly what it did not spend
    windows.settle(holds[0], 0.5, 0, configs, "UTC", NOON)
    refused, hold = windows.check(configs, "UTC", 0.5, 0, NOON)
    assert refused is None and hold is not None
    assert windows.check(configs, "UTC", 0.01, 0, NOON)[0] is not None
    windows.release(hold)  # never forwarded: its reservation goes back
    assert windows.check(configs, "UTC", 0.5, 0, NOON)[0] is None


def test_the_window_resets_by_itself_at_the_boundary_and_by_reset() -> None:
    windows = AgentWindows()
    configs = day(max_tokens=100)
    _, hold = windows.check(configs, "UTC", 0.0, 100, NOON)
    assert hold is not None
    windows.settle(hold, 0.0, 100, configs, "UTC", NOON)
    assert windows.check(configs, "UTC", 0.0, 1, NOON)[0] is not None
    tomorrow = NOON + 86_400
    assert windows.check(configs, "UTC", 0.0, 1, tomorrow)[0] is None
    _, hold = windows.check(configs, "UTC", 0.0, 0, tomorrow)
    assert hold is not None
    windows.settle(hold, 0.0, 100, configs, "UTC", tomorrow)
    assert windows.check(configs, "UTC", 0.0, 1, tomorrow)[0] is not None
    windows.reset("week")  # another period: the day stays spent
    assert windows.check(configs, "UTC", 0.0, 1, tomorrow)[0] is not None
    windows.reset()
    assert windows.check(configs, "UTC", 0.0, 1, tomorrow)[0] is None


def test_a_call_settling_after_its_window_ended_is_charged_to_no_other_window() -> None:
    windows = AgentWindows()
    configs = day(max_cost_usd=1)
    _, hold = windows.check(configs, "UTC", 0.5, 0, NOON)
    assert hold is not None
    tomorrow = NOON + 86_400
    windows.check(configs, "UTC", 0.0, 0, tomorrow)  # tomorrow's window is the current one now
    windows.settle(hold, 5.0, 0, configs, "UTC", tomorrow)
    assert windows.check(configs, "UTC", 0.0, 0, tomorrow)[0] is None


def test_the_soft_alert_fires_once_per_window() -> None:
    windows = AgentWindows()
    configs = day(max_cost_usd=10, soft_alert_pct=50)
    alerts = []
    for now in (NOON, NOON, NOON, NOON + 86_400, NOON + 86_400):
        _, hold = windows.check(configs, "UTC", 3.0, 0, now)
        assert hold is not None
        alerts += windows.settle(hold, 3.0, 0, configs, "UTC", now)
    # $3, $6 (alert), $9 today; $3, $6 (alert) tomorrow
    assert [a.guard for a in alerts] == ["budget_window_soft_alert"] * 2
    assert alerts[0].threshold == 5 and alerts[0].actual == 6
    assert alerts[1].resets_at == "2026-11-29T00:00:00Z"


def test_settled_spend_survives_dump_and_load_but_reservations_do_not() -> None:
    windows = AgentWindows()
    configs = day(max_cost_usd=10, soft_alert_pct=50)
    _, hold = windows.check(configs, "UTC", 6.0, 0, NOON)
    assert hold is not None
    windows.settle(hold, 6.0, 42, configs, "UTC", NOON)
    windows.check(configs, "UTC", 3.0, 0, NOON)  # in flight at the restart: not kept
    again = AgentWindows.load(windows.dump())
    spend = again.spends["day"]
    assert (spend.key, spend.spent_usd, spend.tokens, spend.alerted) == ("day:2026-11-27", 6.0, 42, True)
    assert spend.reserved == {}


@pytest.mark.parametrize("bad", [{"period": "year", "max_cost_usd": 1}, {"period": "day"}])
def test_an_unknown_period_or_a_window_without_a_limit_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        GuardConfig.model_validate({"budget_windows": [bad]})


async def test_the_local_book_writes_settled_spend_soon_and_a_new_process_reads_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "budget-windows.json"
    config = GuardConfig.model_validate({"budget_windows": [{"period": "day", "max_cost_usd": 2}]})
    book = LocalWindows(path)
    book.clock = lambda: NOON
    await book.start()
    try:
        refusal, hold = await book.reserve("a", config, 1.5, 0)
        assert refusal is None and hold is not None
        await book.settle("a", config, hold, 1.5, 30)
        for _ in range(400):  # written by the debounced writer, without close()
            if path.exists() and json.loads(path.read_text())["agents"].get("a"):
                break
            await asyncio.sleep(0.05)
        again = LocalWindows(path)
        again.clock = lambda: NOON
        assert (await again.spend("a", config))[0]["spent_usd"] == 1.5
        assert (await again.reserve("a", config, 0.5, 0))[0] is None  # $1.50 settled: one more goes
        assert (await again.reserve("a", config, 0.5, 0))[0] is not None  # + $0.50 in flight: $2 reached
    finally:
        await book.close()
    # an unreadable file: logged, and the book starts from zero rather than refusing to start
    path.write_text("{not json")
    with caplog.at_level(logging.ERROR, logger="tripwire.windows"):
        fresh = LocalWindows(path)
    assert fresh.agents == {} and "budget_windows.unreadable" in caplog.text
