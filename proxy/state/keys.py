"""Key names of the shared guard state (docs/scaling.md lists them).

Every key starts with `tripwire:`; names that come from clients (agent, session and episode ids)
are escaped so `:` inside them cannot make two different names one key.
"""

from __future__ import annotations

PREFIX = "tripwire:"
CONFIG_REVISION = PREFIX + "config:rev"
CONFIG_SNAPSHOT = PREFIX + "config:"  # + revision
BREAKER_INDEX = PREFIX + "breakers"  # set of every breaker key (for the open-circuits metric)
# an id of the data set, never expiring: a replica that finds it gone or changed knows Redis lost
# what was shared (restarted empty, FLUSHALL) and puts back what it knows
DATASET = PREFIX + "dataset"
LOG_GRACE_MS = 60_000  # a run's log outlives its idle clock a little: replicas read its tail


def ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def slot_ttl_ms(idle_s: float) -> int:
    """Slots (session id, episode, history digest -> run) outlive the run's idle clock: liveness is
    the run hash's; a slot only has to point at the run as long as it can be live."""
    return ms(idle_s) * 2 + LOG_GRACE_MS


def part(name: str) -> str:
    """A client-supplied name as one key segment."""
    return name.replace("%", "%25").replace(":", "%3A")


def agent_prefix(agent: str) -> str:
    return f"{PREFIX}a:{part(agent)}:"


def chain_link(agent: str, response_id: str) -> str:
    """A Responses answer's link (proxy/responses_chain.py), a hash {b: blob, p: parent id}."""
    return f"{agent_prefix(agent)}chain:{part(response_id)}"


def run(agent: str, run_id: str) -> str:
    """Hash of the run's marks; its expiry is the run's idle clock (SPEC §3)."""
    return f"{agent_prefix(agent)}run:{part(run_id)}"


def log(agent: str, run_id: str) -> str:
    return run(agent, run_id) + ":log"


def pending(agent: str, run_id: str) -> str:
    return run(agent, run_id) + ":pending"


def mcp_signatures(agent: str, run_id: str) -> str:
    return run(agent, run_id) + ":mcpsig"


# Slots: what names a run (explicit id, announced episode, history digest, Responses id, latest).
def slot_explicit(agent: str, session_id: str) -> str:
    return f"{agent_prefix(agent)}x:{part(session_id)}"


def slot_explicit_terminated(agent: str, session_id: str) -> str:
    return f"{agent_prefix(agent)}xterm:{part(session_id)}"


def slot_episode(agent: str, announced: str) -> str:
    return f"{agent_prefix(agent)}ep:{part(announced)}"


def slot_history(agent: str, digest: str) -> str:
    return f"{agent_prefix(agent)}h:{part(digest)}"


def slot_response(agent: str, response_id: str) -> str:
    return f"{agent_prefix(agent)}resp:{part(response_id)}"


def slot_latest(agent: str) -> str:
    return f"{agent_prefix(agent)}latest"


def resumed_as(agent: str, run_id: str) -> str:
    """A run resumed (SPEC §5.5a): the run its session goes on in, for replicas still refusing it."""
    return run(agent, run_id) + ":resumed"


def breaker(agent: str, upstream: str) -> str:
    return f"{PREFIX}breaker:{part(agent)}:{part(upstream)}"


def window(agent: str, window_key: str) -> str:
    """An agent's budget window (SPEC §9): `tripwire:window:<agent>:<period>:<first day>`."""
    return f"{PREFIX}window:{part(agent)}:{window_key}"


def rate(agent: str, rule_key: str) -> str:
    """The sliding window of one agent's rate-limit rule: a sorted set of admitted checks by time."""
    return f"{PREFIX}rate:{part(agent)}:{part(rule_key)}"


def concurrent(agent: str) -> str:
    """One agent's calls in flight (SPEC §9 `max_concurrent_calls`): a sorted set of call ids by
    the time their lease ends."""
    return f"{PREFIX}concurrent:{part(agent)}"
