"""The relayed WebSockets' bounds on their own (proxy/socket_limits.py): the per-agent slots and their
426 refusal, and the idle watchdog driven with a stand-in relay (no sockets). The whole path through
real sockets is in tests/test_websocket.py."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.socket_limits import IDLE_CLOSE_CODE, IDLE_REASON, REFUSED_STATUS, SocketSlots, close_when_idle


@dataclass
class Call:
    done: asyncio.Future[None]


@dataclass
class Relay:
    last_message: float
    closing: bool = False
    calls: list[Any] = field(default_factory=list)
    closed_with: tuple[int, str] | None = None

    async def close_both(self, code: int, reason: str) -> None:
        self.closing = True
        self.closed_with = (code, reason)


def test_slots_cap_each_agent_on_its_own_and_come_back() -> None:
    slots = SocketSlots(per_agent=2)
    assert slots.take("a") and slots.take("a") and not slots.take("a")
    assert slots.take("b")  # another agent's count is its own
    slots.give_back("a")
    assert slots.take("a") and not slots.take("a")
    for _ in range(3):
        slots.give_back("a")
    slots.give_back("b")
    assert slots.open == {}  # an agent with none open is forgotten


def test_no_cap_takes_every_socket() -> None:
    slots = SocketSlots(per_agent=None)
    assert all(slots.take("a") for _ in range(1000)) and slots.open == {"a": 1000}


def test_the_refusal_is_a_426_in_openais_error_shape() -> None:
    answer = SocketSlots(per_agent=1).refusal("agent-x")
    assert answer.status == REFUSED_STATUS == 426
    assert answer.text is not None
    error = orjson.loads(answer.text)["error"]
    assert error["code"] == "websocket_limit_reached" and "'agent-x'" in error["message"]


async def test_an_idle_socket_is_closed_going_away() -> None:
    relay = Relay(last_message=time.monotonic() - 60)
    await asyncio.wait_for(close_when_idle(relay, idle_timeout_s=30), timeout=10)
    assert relay.closed_with == (IDLE_CLOSE_CODE, IDLE_REASON) and IDLE_CLOSE_CODE == 1001


async def test_a_socket_already_closing_is_left_alone() -> None:
    relay = Relay(last_message=time.monotonic() - 60, closing=True)
    await asyncio.wait_for(close_when_idle(relay, idle_timeout_s=30), timeout=10)
    assert relay.closed_with is None


async def test_a_socket_waiting_for_an_answer_is_not_idle() -> None:
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    relay = Relay(last_message=time.monotonic() - 60, calls=[Call(done)])
    watchdog = asyncio.create_task(close_when_idle(relay, idle_timeout_s=0.01))
    for _ in range(20):  # many of its turns pass with the call open: never closed meanwhile
        await asyncio.sleep(0.01)
    assert relay.closed_with is None and not watchdog.done()

    done.set_result(None)  # the answer came: now it is idle
    await asyncio.wait_for(watchdog, timeout=10)
    assert relay.closed_with == (IDLE_CLOSE_CODE, IDLE_REASON)
