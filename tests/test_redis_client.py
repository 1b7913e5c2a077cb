"""One Redis client per process (issue 30): the guard state, the approval book and the agent keys
share it (one pool, one set of timeouts), and it is closed once, last, when the engine closes."""

from __future__ import annotations

from proxy.engine import Engine
from proxy.state.client import CONNECT_TIMEOUT_S, SOCKET_TIMEOUT_S
from tests.factories import EngineFactory


async def test_state_approvals_and_keys_share_the_engine_s_one_client(
    engine_factory: EngineFactory, redis_url: str
) -> None:
    engine: Engine = await engine_factory(state={"url": redis_url})
    client = engine.redis
    assert client is not None
    assert engine.shared is not None and engine.shared.backend.client is client  # type: ignore[attr-defined]
    assert engine.approvals.book.client is client  # type: ignore[attr-defined]
    assert engine.agent_keys.client is client  # type: ignore[attr-defined]
    kwargs = client.connection_pool.connection_kwargs
    assert (
        kwargs["socket_timeout"] == SOCKET_TIMEOUT_S and kwargs["socket_connect_timeout"] == CONNECT_TIMEOUT_S
    )
    # each works through it
    key, secret = await engine.agent_keys.create("bot")
    assert secret and (await engine.agent_keys.find(key.hash)) is not None
