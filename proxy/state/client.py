"""The one Redis client of a process (`--state`): the guard state, the approval book and the agent
keys all talk to Redis through it (one pool, one set of timeouts).

Connection problems become `StateUnavailable` quickly in its users: short timeouts by default (the
URL's `socket_timeout` / `socket_connect_timeout` query parameters override them) and one immediate
retry on a dropped connection (a pooled socket that died with a restarted Redis), never a back-off
that would hold a call.
"""

from __future__ import annotations

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

# A reply or a connection slower than this marks Redis down (the failure policy applies until a probe
# gets through). Generous enough that a busy machine is not taken for an outage: 0.5 s connects
# failed under two CPU hogs when 50 calls opened connections at once.
CONNECT_TIMEOUT_S = 2.0
SOCKET_TIMEOUT_S = 2.0
# Connections per replica: concurrent commands beyond this wait for one (no connection storm when
# many calls arrive at once; a run's checks go in one round trip anyway).
MAX_CONNECTIONS = 16


def redis_client(url: str) -> redis.Redis:
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=SOCKET_TIMEOUT_S,  # waiting for a free connection
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        retry_on_error=[RedisConnectionError],
    )
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # aclose() closes the pool too
    return client
