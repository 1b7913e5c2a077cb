"""Agent sessions: which run a call belongs to, and when a run ends (SPEC §3).

Pure bookkeeping with the clock passed in; the engine does the I/O (RUN_START, RUN_END).
A session is one AgentDbg run. Explicit sessions are named by the agent (header or path).
Otherwise a call belongs to an automatic session, one per episode of the agent (several can be
live at once), found from what the request says about its episode (proxy/episodes.py):

1. an announced episode id decides alone: the run that has that id, else a new run;
2. else lineage: the run that produced the `previous_response_id` it names, or the run that gave
   the newest answer its history carries (else the run that saw the longest prefix of its
   conversation holding that answer); a conversation's first request (no answer in its history)
   continues nothing. Then the agent's latest run if that has seen no conversation yet (only MCP
   calls so far); else a new run;
3. a call with no conversation (MCP, embeddings) joins the agent's most recently used automatic
   run, else a new run.

Every automatic run ends after `idle_timeout` without traffic. A terminated one keeps answering
its own episode with a refusal until it has been quiet for a full idle timeout (refused retries
restart that clock); a new episode of the agent is served in a new run meanwhile.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import replace

from proxy import ids
from proxy.episodes import NO_CONVERSATION, Episode
from proxy.per_agent import PerAgent
from proxy.session_state import (  # (re-exported: the session's state, proxy/session_state.py)
    MAX_HISTORIES_PER_RUN,
    MAX_RESPONSES_PER_RUN,
    UNMATCHED,
    Conversation,
    Lineage,
    PendingToolCall,
    Refused,
    Session,
    SessionKey,
    Unmatched,
)

__all__ = [
    "MAX_HISTORIES_PER_RUN",
    "MAX_RESPONSES_PER_RUN",
    "UNMATCHED",
    "Conversation",
    "Lineage",
    "PendingToolCall",
    "Refused",
    "Session",
    "SessionKey",
    "SessionManager",
    "Unmatched",
]


class SessionManager:
    def __init__(self, *, idle_timeout_s: float, terminated_ttl_s: float) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.terminated_ttl_s = terminated_ttl_s
        self._explicit: dict[SessionKey, Session] = {}
        self._terminated_explicit: dict[SessionKey, float] = {}  # key -> refuse until (monotonic)
        self._by_run: dict[str, Session] = {}  # every session still tracked, by run id
        # automatic sessions: per agent, most recently used last (plain dicts: an OrderedDict's entry
        # costs twice as much, and a stateless service's every call is a session); and the lineage
        # indexes
        self._recent: dict[str, dict[str, Session]] = {}
        self._by_episode: dict[tuple[str, str], Session] = {}  # (agent, announced id)
        # (agent, whole-history digest), one dict per agent (no tuple a key: proxy/per_agent.py)
        self._by_history: PerAgent[bytes, Session] = PerAgent()
        self._by_response: dict[str, Session] = {}  # Responses id -> the run that produced it
        # (agent, answer key) -> the run that gave that answer; once several did (the same answer to
        # the same words: an evaluation batch), those runs by run id, oldest first, and in
        # `_waiting` those of them still waiting for their conversation to go on (`Lineage.waiting`),
        # in the same order. (One run, the usual case, is no dict: issue 33, ~400 bytes a run.)
        self._by_answer: PerAgent[bytes, Session | dict[str, Session]] = PerAgent()
        self._waiting: dict[tuple[str, bytes], dict[str, Session]] = {}
        # the idle sweep's queues, so a sweep reads only the sessions last seen an idle timeout ago or
        # more, not every one (`idle_sessions`): new sessions in the order they started (each queued
        # at its `started_mono`: a deque's slot, where a heap entry and its tie-break were ~100
        # bytes a run, issue 33), and a heap of (last seen when queued, tie-break, session) for
        # those queued again (at their last_seen) when the sweep finds they were used since, resumed
        # ones, and the rare new one whose clock reads earlier than the newest queued
        self._new_queue: deque[Session] = deque()
        self._idle_queue: list[tuple[float, int, Session]] = []
        self._queued = itertools.count()
        self._in_flight: dict[str, Session] = {}  # out of the queue: idle but for a call in flight
        self._ended: set[str] = set()  # run ids of sessions still tracked whose run has ended

    # --- finding the run of a call -----------------------------------------------------------

    def match(self, agent: str, explicit_id: str | None, episode: Episode | None = None) -> Session | None:
        """The tracked session this call belongs to (live, idle or terminated), or None: a new run."""
        if explicit_id is not None:
            return self._explicit.get((agent, explicit_id))
        episode = episode or NO_CONVERSATION
        if episode.announced is not None:
            return self._by_episode.get((agent, episode.announced))
        if episode.has_lineage:
            if episode.previous_response_id is not None:
                parent = self._by_response.get(episode.previous_response_id)
                if parent is not None and parent.agent == agent:
                    return parent
            if episode.answer is not None:
                found = self._answered(agent, episode.answer)
                if found is not None:
                    return found
                # the answer as the client sent it back differs from what the run recorded (an
                # edited message): the longest prefix a run has seen that holds that answer
                for digest in reversed(episode.history[episode.answer_at :]):
                    found = self._by_history.get(agent, digest)
                    if found is not None:
                        return found
            # a new conversation; the agent's latest run may have had only calls with no
            # conversation (MCP tool calls before the first LLM call): it is this episode's
            latest = self._latest(agent)
            if latest is not None and not latest.terminated and latest.lineage.is_empty():
                return latest
            return None
        return self._latest(agent)

    def _answered(self, agent: str, key: bytes) -> Session | None:
        """The run that gave this answer; of several (the same answer to the same words), the
        oldest still waiting for its conversation to go on, else the newest."""
        runs = self._by_answer.get(agent, key)
        if runs is None or not isinstance(runs, dict):
            return runs  # (one run gave it: that one)
        waiting = self._waiting.get((agent, key))
        if waiting:
            return next(iter(waiting.values()))
        return next(reversed(runs.values()))

    def _latest(self, agent: str) -> Session | None:
        """The agent's most recently used automatic session."""
        recent = self._recent.get(agent)
        return next(reversed(recent.values())) if recent else None

    def take_live(
        self, current: Session | None, explicit_id: str | None, episode: Episode | None, now: float
    ) -> Session | None:
        """The session `match` found, taking the call at once when it is live (most calls): not
        idle, ended or terminated, nor an explicit session refused by key. What `expire_matched`
        and then `lookup` conclude for such a session (it goes on, the call attached), without
        their general path; None: ask them."""
        if (
            current is None
            or current.terminated
            or current.ended
            or (current.inflight == 0 and now - current.last_seen >= self.idle_timeout_s)
            or (explicit_id is not None and (current.agent, explicit_id) in self._terminated_explicit)
        ):
            return None
        current.last_seen = now
        self._attach(current, episode or NO_CONVERSATION)
        return current

    def lookup(
        self,
        agent: str,
        explicit_id: str | None,
        *,
        now: float,
        wall: float,
        episode: Episode | None = None,
        run_id: str | None = None,
        matched: Session | None | Unmatched = UNMATCHED,
    ) -> tuple[Session, bool] | Refused:
        """The live session for this call, starting one if needed: (session, created).
        `run_id`: the run the shared state (several replicas) says this session is, for a new one.
        `matched`: what `match` answered for this call, when nothing changed since (`expire`)."""
        key: SessionKey = (agent, explicit_id)
        # only explicit sessions stay refused by key (`terminate`)
        until = self._terminated_explicit.get(key) if explicit_id is not None else None
        if until is not None:
            if now < until:
                return Refused(self._explicit.get(key), "session terminated")
            del self._terminated_explicit[key]
        episode = episode or NO_CONVERSATION
        current = self.match(agent, explicit_id, episode) if isinstance(matched, Unmatched) else matched
        if current is None and run_id is not None:
            # the shared state names a run this replica holds, which the call's own evidence did not
            # find here (another replica gave the answer it carries; a resumed run)
            held = self._by_run.get(run_id)
            if held is not None and held.agent == agent and not held.ended:
                current = held
        if current is not None:
            # a call still in flight (a long stream) keeps its session alive
            idle = current.inflight == 0 and now - current.last_seen >= self.idle_timeout_s
            if current.terminated and not idle:
                # Retrying a terminated session's episode keeps it refused: the idle clock restarts.
                current.last_seen = now
                return Refused(current, "session terminated")
            if not idle and not current.ended:
                current.last_seen = now
                self._attach(current, episode)
                return current, False
            self._forget(current)
        session = Session(
            agent=agent,
            session_id=explicit_id or f"auto-{ids.hex12()}",
            explicit=explicit_id is not None,
            run_id=run_id or ids.uuid4_text(),
            started_wall=wall,
            started_mono=now,
            last_seen=now,
        )
        self._by_run[session.run_id] = session
        new_queue = self._new_queue
        if not new_queue or new_queue[-1].started_mono <= now:
            new_queue.append(session)  # (queued at its started_mono, which is `now`)
        else:
            heapq.heappush(self._idle_queue, (now, next(self._queued), session))
        if session.explicit:
            self._explicit[key] = session
        else:
            if episode.announced is not None:
                session.lineage.announced = episode.announced
                session.lineage.source = episode.source
                self._by_episode[(agent, episode.announced)] = session
            self._attach(session, episode)
        return session, True

    def _attach(self, session: Session, episode: Episode) -> None:
        """An automatic session took a call: it is the agent's most recent, and remembers the
        call's whole history so the calls that continue the conversation find it."""
        if session.explicit:
            return
        recent = self._recent.get(session.agent)
        if recent is None:
            recent = self._recent[session.agent] = {}
        run_id = session.run_id
        # most calls come from the agent's most recent session, with the history it last saw
        if not (recent and next(reversed(recent)) == run_id and recent[run_id] is session):
            recent.pop(run_id, None)
            recent[run_id] = session  # (the most recent last)
        if episode.answer is not None and session.lineage.waiting == episode.answer:
            self._set_waiting(session, None)  # its conversation went on
        if not episode.history:
            return
        own = session.lineage.histories
        digest = episode.history[-1]
        if own.newest() == digest and self._by_history.get(session.agent, digest) is session:
            return  # the same history again (a resent request): already the newest it remembers
        own.add(digest)  # (the newest last)
        self._by_history.set(session.agent, digest, session)
        while len(own) > MAX_HISTORIES_PER_RUN:
            old = own.pop_oldest()
            if self._by_history.get(session.agent, old) is session:
                self._by_history.pop(session.agent, old)

    def note_response(self, session: Session, response_id: str) -> None:
        """A Responses id this automatic session produced (a real answer or a blocked one): a
        request naming it as `previous_response_id` continues this session."""
        if session.explicit or self._by_run.get(session.run_id) is not session:
            return  # explicit sessions are named on every call; a forgotten one continues nothing
        own = session.lineage.responses
        own.add(response_id)  # (the newest last)
        self._by_response[response_id] = session
        while len(own) > MAX_RESPONSES_PER_RUN:
            old = own.pop_oldest()
            if self._by_response.get(old) is session:
                del self._by_response[old]

    def note_answer(self, session: Session, key: bytes) -> None:
        """An automatic session answered a conversation (`episodes.given_answer_key`): a request
        whose history carries that answer continues this session."""
        if session.explicit or self._by_run.get(session.run_id) is not session:
            return
        lineage = session.lineage
        if key not in lineage.answers:
            lineage.answers.add(key)
            self._add_answer(session, key)
        self._set_waiting(session, key)
        while len(lineage.answers) > MAX_HISTORIES_PER_RUN:
            old = lineage.answers.pop_oldest()
            self._drop_answer(session, old)

    def _add_answer(self, session: Session, key: bytes) -> None:
        """`session` gave this answer: the newest of the runs that did."""
        agent = session.agent
        runs = self._by_answer.get(agent, key)
        if runs is None or runs is session:
            self._by_answer.set(agent, key, session)
        elif isinstance(runs, dict):
            runs[session.run_id] = session
        elif runs.run_id == session.run_id:  # (the same run again under another object)
            self._by_answer.set(agent, key, session)
        else:
            # a second run gave it: the runs by id, oldest first, and the first's wait indexed
            self._by_answer.set(agent, key, {runs.run_id: runs, session.run_id: session})
            if runs.lineage.waiting == key:
                self._waiting[(agent, key)] = {runs.run_id: runs}

    def _set_waiting(self, session: Session, key: bytes | None) -> None:
        """The answer a session waits on its conversation to go on from (None: none), kept in the
        `_waiting` index beside `_by_answer` so `_answered` needs no scan of the runs."""
        lineage = session.lineage
        old = lineage.waiting
        if old == key:
            return
        lineage.waiting = key
        agent, run_id = session.agent, session.run_id
        if old is not None:
            self._unwait(agent, old, run_id)
        if key is None or self._by_run.get(run_id) is not session:
            return
        runs = self._by_answer.get(agent, key)
        if not isinstance(runs, dict) or run_id not in runs:
            return  # (one run gave it, or none: nothing to keep in order)
        waiting = self._waiting.setdefault((agent, key), {})
        waiting[run_id] = session
        if len(waiting) > 1 and next(reversed(runs)) != run_id:
            # (rare) an older run waits on this answer again: keep the runs' order, oldest first
            self._waiting[(agent, key)] = {rid: s for rid, s in runs.items() if rid in waiting}

    def _unwait(self, agent: str, key: bytes, run_id: str) -> None:
        waiting = self._waiting.get((agent, key))
        if waiting is not None and waiting.pop(run_id, None) is not None and not waiting:
            del self._waiting[(agent, key)]

    def _drop_answer(self, session: Session, key: bytes) -> None:
        agent = session.agent
        runs = self._by_answer.get(agent, key)
        if runs is session:
            self._by_answer.pop(agent, key)
            return
        if not isinstance(runs, dict) or runs.get(session.run_id) is not session:
            return
        del runs[session.run_id]
        if not runs:
            self._by_answer.pop(agent, key)
        self._unwait(agent, key, session.run_id)

    # --- ending ------------------------------------------------------------------------------

    def expire(
        self,
        agent: str,
        explicit_id: str | None,
        now: float,
        episode: Episode | None = None,
        *,
        run_id: str | None = None,
    ) -> Session | None:
        """The session this call would join if it has gone idle (and is not terminated): the engine
        ends its run before `lookup` starts the next one, so no run is left `running` between sweeps.
        With shared state, a session here that is not the run the replicas share (`run_id`) is over."""
        return self.expire_matched(self.match(agent, explicit_id, episode), now, run_id=run_id)[0]

    def expire_matched(
        self, current: Session | None, now: float, *, run_id: str | None = None
    ) -> tuple[Session | None, Session | None | Unmatched]:
        """`expire` of the session `match` found for the call: (the session whose run to end, or
        None; what `lookup` may take as the call's match, UNMATCHED when a session was forgotten
        here and the call must be matched again)."""
        if current is not None and run_id is not None and current.run_id != run_id:
            self._forget(current)
            return (None if current.ended else current), UNMATCHED
        if (
            current is None
            or current.terminated
            or current.inflight
            or now - current.last_seen < self.idle_timeout_s
        ):
            return None, current
        self._forget(current)
        return (None if current.ended else current), UNMATCHED

    def idle_sessions(self, now: float) -> list[Session]:
        """Sessions past their idle timeout with nothing in flight: the engine ends their runs.

        Reads only the sessions queued an idle timeout ago or more (oldest first): a session's
        last_seen is never before it was queued, so the rest cannot be idle yet. One used since
        it was queued goes back in the queue at its last_seen; one forgotten meanwhile leaves it.
        So a sweep costs what it ends (and the sessions it re-queues, each at most once per idle
        timeout), not every session tracked."""
        out = []
        queue = self._idle_queue
        new_queue = self._new_queue
        timeout = self.idle_timeout_s
        by_run = self._by_run
        due = list(self._in_flight.values())  # idle but for a call in flight: looked at every sweep
        self._in_flight.clear()
        # both queues oldest first, merged in queue time (a new session first on a tie)
        while new_queue and now - new_queue[0].started_mono >= timeout:
            head = new_queue[0].started_mono
            while queue and queue[0][0] < head:
                due.append(heapq.heappop(queue)[2])
            due.append(new_queue.popleft())
        while queue and now - queue[0][0] >= timeout:
            due.append(heapq.heappop(queue)[2])
        forget = self._forget
        for s in due:
            if by_run.get(s.run_id) is not s:
                continue  # forgotten already (expired on a call, resumed, ...)
            if now - s.last_seen < timeout:
                heapq.heappush(queue, (s.last_seen, next(self._queued), s))  # used since it was queued
            elif s.inflight:
                self._in_flight[s.run_id] = s  # a long call keeps it alive
            else:
                forget(s)
                if not s.ended:
                    out.append(s)
        for key, until in list(self._terminated_explicit.items()):
            if until <= now:
                del self._terminated_explicit[key]
        return out

    def terminate(self, session: Session, now: float) -> None:
        session.terminated = True
        if session.explicit:
            self._terminated_explicit[session.key] = now + self.terminated_ttl_s

    def resume(self, old: Session, run_id: str, *, now: float, wall: float) -> Session:
        """A terminated session goes on in a new run (SPEC §5.5a resume): the same session (its
        guards, conversation and lineage, so its episode's next call finds it) under `run_id`,
        live again; the old run is forgotten here and its explicit key no longer refused."""
        self._forget(old)
        self._terminated_explicit.pop(old.key, None)
        new = replace(
            old, run_id=run_id, started_wall=wall, last_seen=now, terminated=False, ended=False, inflight=0
        )
        self._by_run[run_id] = new
        heapq.heappush(self._idle_queue, (now, next(self._queued), new))
        agent = new.agent
        if new.explicit:
            self._explicit[new.key] = new
            return new
        self._recent.setdefault(agent, {})[run_id] = new
        lineage = new.lineage
        if lineage.announced is not None:
            self._by_episode[(agent, lineage.announced)] = new
        for digest in lineage.histories:
            self._by_history.set(agent, digest, new)
        if lineage.has_responses:
            for response_id in lineage.responses:
                self._by_response[response_id] = new
        for key in lineage.answers:
            self._add_answer(new, key)
        waiting, lineage.waiting = lineage.waiting, None
        if waiting is not None:
            self._set_waiting(new, waiting)
        return new

    def drop_refusal(self, session: Session | None, agent: str, explicit_id: str | None) -> None:
        """The session was resumed elsewhere (another replica): this copy no longer refuses; the
        call that follows opens the new run here."""
        if explicit_id is not None:
            self._terminated_explicit.pop((agent, explicit_id), None)
        if session is not None:
            self._forget(session)

    def by_run_id(self, run_id: str) -> Session | None:
        return self._by_run.get(run_id)

    def live(self) -> list[Session]:
        return [s for s in self._by_run.values() if not s.ended]

    def live_count(self) -> int:
        """len(live()) without building the list (the live-sessions metric, per new run)."""
        return len(self._by_run) - len(self._ended)

    def note_ended(self, session: Session) -> None:
        """The session's run has ended (the policy sets `ended`): no longer counted live."""
        if self._by_run.get(session.run_id) is session:
            self._ended.add(session.run_id)

    def known(self) -> list[Session]:
        """Every session this manager still matches calls to: live ones, and ended ones that
        still refuse (terminated, not yet quiet for an idle timeout)."""
        return list(self._by_run.values())

    def terminated_explicit(self, now: float) -> list[tuple[str, str, float]]:
        """(agent, session id, seconds left) of the explicit sessions refused by key."""
        return [
            (agent, sid, until - now)
            for (agent, sid), until in self._terminated_explicit.items()
            if sid is not None and until > now
        ]

    def refuses(self, current: Session | None, agent: str, explicit_id: str | None, now: float) -> bool:
        """Whether `lookup` refuses this call by itself (`current`: what `match` found): its
        explicit session is refused by key, or its session was terminated and has not been quiet
        for an idle timeout."""
        if explicit_id is not None and self._terminated_explicit.get((agent, explicit_id), now) > now:
            return True
        return (
            current is not None
            and current.terminated
            and (current.inflight > 0 or now - current.last_seen < self.idle_timeout_s)
        )

    def _forget(self, session: Session) -> None:
        run_id = session.run_id
        by_run = self._by_run
        if by_run.get(run_id) is not session:
            return
        del by_run[run_id]
        if self._ended:
            self._ended.discard(run_id)
        agent = session.agent
        if session.explicit:
            if self._explicit.get(session.key) is session:
                del self._explicit[session.key]
            return
        recent = self._recent.get(agent)
        if recent is not None:
            recent.pop(run_id, None)
            if not recent:
                del self._recent[agent]
        lineage = session.lineage
        if lineage.announced is not None and self._by_episode.get((agent, lineage.announced)) is session:
            del self._by_episode[(agent, lineage.announced)]
        by_history = self._by_history.of(agent)
        if by_history is not None:
            for digest in lineage.histories:
                if by_history.get(digest) is session:
                    del by_history[digest]
            self._by_history.drop_empty(agent)
        if lineage.has_responses:
            by_response = self._by_response
            for response_id in lineage.responses:
                if by_response.get(response_id) is session:
                    del by_response[response_id]
        for key in lineage.answers:
            self._drop_answer(session, key)
