from typing import Any

from proxy import episodes
from proxy.dialects.base import LLMRequest, LLMResult
from proxy.episodes import Episode, history_digests
from proxy.sessions import MAX_HISTORIES_PER_RUN, Refused, Session, SessionManager


def mgr() -> SessionManager:
    return SessionManager(idle_timeout_s=300, terminated_ttl_s=3600)


def test_automatic_session_is_reused_until_idle_timeout() -> None:
    m = mgr()
    s1, created = m.lookup("a", None, now=0, wall=0)
    assert created
    s2, created = m.lookup("a", None, now=299, wall=0)
    assert s2 is s1 and not created
    s3, created = m.lookup("a", None, now=299 + 300, wall=0)
    assert created and s3.run_id != s1.run_id


def test_agents_and_explicit_sessions_are_separate_runs() -> None:
    m = mgr()
    a, _ = m.lookup("a", None, now=0, wall=0)
    b, _ = m.lookup("b", None, now=0, wall=0)
    x, _ = m.lookup("a", "x", now=0, wall=0)
    assert len({a.run_id, b.run_id, x.run_id}) == 3
    assert x.session_id == "x" and x.explicit


def test_idle_sessions_are_reported_once_and_not_while_in_flight() -> None:
    m = mgr()
    s, _ = m.lookup("a", None, now=0, wall=0)
    s.inflight = 1
    assert m.idle_sessions(1000) == []
    s.inflight = 0
    assert m.idle_sessions(1000) == [s]
    assert m.idle_sessions(2000) == []


def test_terminated_explicit_session_refuses_until_ttl() -> None:
    m = mgr()
    s, _ = m.lookup("a", "x", now=0, wall=0)
    m.terminate(s, now=10)
    assert isinstance(m.lookup("a", "x", now=11, wall=0), Refused)
    assert isinstance(m.lookup("a", "x", now=10 + 3599, wall=0), Refused)
    fresh, created = m.lookup("a", "x", now=10 + 3600, wall=0)
    assert created and fresh.run_id != s.run_id


def test_terminated_automatic_session_refuses_until_a_full_quiet_idle_timeout() -> None:
    m = mgr()
    s, _ = m.lookup("a", None, now=0, wall=0)
    m.terminate(s, now=0)
    assert isinstance(m.lookup("a", None, now=200, wall=0), Refused)
    # retrying at 400 is within 300 s of the refused retry at 200: still refused
    assert isinstance(m.lookup("a", None, now=400, wall=0), Refused)
    fresh, created = m.lookup("a", None, now=701, wall=0)
    assert created and fresh.run_id != s.run_id


def test_by_run_id() -> None:
    m = mgr()
    s, _ = m.lookup("a", None, now=0, wall=0)
    assert m.by_run_id(s.run_id) is s
    assert m.by_run_id("nope") is None


def test_a_call_in_flight_keeps_the_session_alive_past_the_idle_timeout() -> None:
    m = mgr()
    s, _ = m.lookup("a", None, now=0, wall=0)
    s.inflight = 1  # a long stream
    same, created = m.lookup("a", None, now=1000, wall=0)
    assert same is s and not created


def test_expire_hands_over_an_idle_session_once() -> None:
    m = mgr()
    s, _ = m.lookup("a", None, now=0, wall=0)
    assert m.expire("a", None, now=100) is None
    assert m.expire("a", None, now=301) is s
    assert m.expire("a", None, now=302) is None
    fresh, created = m.lookup("a", None, now=302, wall=0)
    assert created and fresh is not s


# --- automatic sessions: one per episode (SPEC §3 "Session") ---------------------------------


def said(episode_id: str) -> Episode:
    return Episode(announced=episode_id, source="test")


def chat_messages(*texts: str) -> list[dict[str, Any]]:
    """A chat history as a client sends it: the user's messages and the answers, in turn."""
    return [{"role": "assistant" if i % 2 else "user", "content": t} for i, t in enumerate(texts)]


def request(*texts: str) -> LLMRequest:
    return LLMRequest("openai_chat", "m", False, chat_messages(*texts), None, None, [], [], 0)


def chat(*texts: str) -> Episode:
    """The episode evidence of a chat request whose history is `texts` (user first, then in turn)."""
    return episodes.for_llm({}, {}, request(*texts))


def answered(m: SessionManager, session: Session, *texts: str) -> None:
    """`session` answered the request whose history is texts[:-1] with texts[-1] (as the session
    stage notes it after the answer)."""
    result = LLMResult(model="m", text=texts[-1], tool_calls=[], usage=None, stop_reason="stop")
    key = episodes.given_answer_key(request(*texts[:-1]), result, None)
    assert key is not None
    m.note_answer(session, key)


def test_an_announced_episode_id_alone_decides_the_run() -> None:
    m = mgr()
    a, created = m.lookup("a", None, now=0, wall=0, episode=said("e1"))
    assert created and a.lineage.announced == "e1"
    b, created = m.lookup("a", None, now=1, wall=0, episode=said("e2"))
    assert created and b is not a
    # same id: same run, whatever the request's history (a sub-agent, a compacted history)
    again, created = m.lookup("a", None, now=2, wall=0, episode=said("e1"))
    assert again is a and not created
    # the same id under another agent is another agent's episode
    other, created = m.lookup("b", None, now=3, wall=0, episode=said("e1"))
    assert created and other is not a
    assert len(m.live()) == 3


def test_lineage_a_conversation_that_continues_joins_its_run_and_a_new_one_starts_a_run() -> None:
    m = mgr()
    a, _ = m.lookup("a", None, now=0, wall=0, episode=chat("task A"))
    answered(m, a, "task A", "answer")
    b, created = m.lookup("a", None, now=1, wall=0, episode=chat("task B"))
    assert created and b is not a
    answered(m, b, "task B", "answer")
    # A goes on (its history carries the answer A's run gave), interleaved with B going on
    a2, created = m.lookup("a", None, now=2, wall=0, episode=chat("task A", "answer", "more A"))
    assert a2 is a and not created
    answered(m, a, "task A", "answer", "more A", "x")
    b2, created = m.lookup("a", None, now=3, wall=0, episode=chat("task B", "answer", "more B"))
    assert b2 is b and not created
    a3, _ = m.lookup("a", None, now=4, wall=0, episode=chat("task A", "answer", "more A", "x", "y"))
    assert a3 is a
    # a retry of a later request is the same conversation
    assert m.lookup("a", None, now=5, wall=0, episode=chat("task B", "answer", "more B"))[0] is b


def test_identical_first_requests_start_a_run_each_and_each_goes_on_in_its_own() -> None:
    """An evaluation batch (SPEC §3): the same first request six times is six runs, even when every
    answer is the same; each conversation's next request goes to a run still waiting for it."""
    m = mgr()
    runs = []
    for i in range(6):
        s, created = m.lookup("a", None, now=i, wall=0, episode=chat("solve the task"))
        assert created
        answered(m, s, "solve the task", "the same answer")
        runs.append(s)
    assert len({s.run_id for s in runs}) == 6
    went_on = [
        m.lookup("a", None, now=10 + i, wall=0, episode=chat("solve the task", "the same answer", "go on"))[0]
        for i in range(6)
    ]
    assert [s.run_id for s in went_on] == [s.run_id for s in runs]


def test_lineage_by_previous_response_id() -> None:
    m = mgr()
    a, _ = m.lookup("a", None, now=0, wall=0, episode=chat("first"))
    m.note_response(a, "resp_1")
    cont, created = m.lookup(
        "a",
        None,
        now=1,
        wall=0,
        episode=Episode(history=history_digests(["tool output"]), previous_response_id="resp_1"),
    )
    assert cont is a and not created
    # another agent naming the id does not join another agent's run
    other, created = m.lookup("b", None, now=2, wall=0, episode=Episode(previous_response_id="resp_1"))
    assert created and other is not a
    unknown, created = m.lookup("a", None, now=3, wall=0, episode=Episode(previous_response_id="resp_x"))
    assert created and unknown is not a


def test_a_call_with_no_conversation_joins_the_agents_most_recently_used_run() -> None:
    m = mgr()
    # none yet: it starts one (an agent whose only traffic is MCP has a run too)
    first, created = m.lookup("a", None, now=0, wall=0)
    assert created
    a, _ = m.lookup("a", None, now=1, wall=0, episode=said("e1"))
    assert a is not first  # an announced episode is never joined by id-less traffic's run
    b, _ = m.lookup("a", None, now=2, wall=0, episode=said("e2"))
    assert m.lookup("a", None, now=3, wall=0)[0] is b
    m.lookup("a", None, now=4, wall=0, episode=said("e1"))
    assert m.lookup("a", None, now=5, wall=0)[0] is a


def test_a_terminated_episode_refuses_its_own_calls_while_a_new_episode_is_served() -> None:
    m = mgr()
    a, _ = m.lookup("a", None, now=0, wall=0, episode=chat("task A"))
    answered(m, a, "task A", "ans")
    m.terminate(a, now=10)
    assert isinstance(m.lookup("a", None, now=11, wall=0, episode=chat("task A", "ans", "again")), Refused)
    fresh, created = m.lookup("a", None, now=13, wall=0, episode=chat("task B"))
    assert created and fresh is not a
    # a first request continues no conversation: served in a run of its own, whatever its words
    again, created = m.lookup("a", None, now=14, wall=0, episode=chat("task A"))
    assert created and again is not a
    # the announced kind: the same id refused, a new id served
    e, _ = m.lookup("a", None, now=20, wall=0, episode=said("e1"))
    m.terminate(e, now=20)
    assert isinstance(m.lookup("a", None, now=21, wall=0, episode=said("e1")), Refused)
    assert m.lookup("a", None, now=22, wall=0, episode=said("e2"))[1]
    # refused retries restart the idle clock; a full quiet idle timeout lets the episode start over
    assert isinstance(m.lookup("a", None, now=300, wall=0, episode=said("e1")), Refused)
    again, created = m.lookup("a", None, now=601, wall=0, episode=said("e1"))
    assert created and again is not e


def test_an_idle_episode_ends_and_the_same_episode_starts_a_new_run() -> None:
    m = mgr()
    a, _ = m.lookup("a", None, now=0, wall=0, episode=said("e1"))
    assert m.expire("a", None, 100, said("e1")) is None
    assert m.expire("a", None, 301, said("e1")) is a
    fresh, created = m.lookup("a", None, now=301, wall=0, episode=said("e1"))
    assert created and fresh is not a
    # the idle sweep forgets an episode's lineage with its run
    b, _ = m.lookup("a", None, now=400, wall=0, episode=chat("task B"))
    m.note_response(b, "resp_b")
    assert b in m.idle_sessions(now=1000)
    assert m.lookup("a", None, now=1000, wall=0, episode=chat("task B", "x", "y"))[1]
    assert m.lookup("a", None, now=1000, wall=0, episode=Episode(previous_response_id="resp_b"))[1]


def test_a_runs_lineage_memory_is_bounded() -> None:
    m = mgr()
    a, _ = m.lookup("a", None, now=0, wall=0, episode=chat("m0"))
    answered(m, a, "m0", "m1")
    for i in range(2, 2 * MAX_HISTORIES_PER_RUN + 20, 2):
        texts = [f"m{j}" for j in range(i + 1)]
        assert m.lookup("a", None, now=0, wall=0, episode=chat(*texts))[0] is a
        answered(m, a, *texts, f"m{i + 1}")
    assert len(a.lineage.histories) == MAX_HISTORIES_PER_RUN
    assert len(m._by_history) == MAX_HISTORIES_PER_RUN
    assert len(a.lineage.answers) == MAX_HISTORIES_PER_RUN
    assert len(m._by_answer) == MAX_HISTORIES_PER_RUN
    m.idle_sessions(now=1000)  # forgotten with its run
    assert not m._by_history and not m._by_answer


def test_an_explicit_session_ignores_the_episode() -> None:
    m = mgr()
    x, _ = m.lookup("a", "x", now=0, wall=0, episode=said("e1"))
    same, created = m.lookup("a", "x", now=1, wall=0, episode=said("e2"))
    assert same is x and not created
    auto, created = m.lookup("a", None, now=2, wall=0, episode=said("e1"))
    assert created and auto is not x


def test_the_first_conversation_adopts_a_run_that_had_only_calls_with_no_conversation() -> None:
    m = mgr()
    mcp, _ = m.lookup("a", None, now=0, wall=0)  # an MCP tool call before any LLM call
    first, created = m.lookup("a", None, now=1, wall=0, episode=chat("task A"))
    assert first is mcp and not created
    # that run now has a conversation: another one is another episode
    second, created = m.lookup("a", None, now=2, wall=0, episode=chat("task B"))
    assert created and second is not mcp
    # an announced episode never adopts: its id decides
    m2 = mgr()
    tools, _ = m2.lookup("a", None, now=0, wall=0)
    assert m2.lookup("a", None, now=1, wall=0, episode=said("e1"))[0] is not tools


def test_take_live_goes_on_exactly_where_lookup_would_go_on_with_the_same_session() -> None:
    """The engine's short way for a live session: it takes the call (attached, clock moved) where
    `lookup` answers (that session, not created), and leaves every other case to `lookup`."""
    history = chat("hi", "hello", "more")

    def both(setup: object, explicit: str | None, now: float) -> tuple[bool, object]:
        fast, slow = mgr(), mgr()
        first = []
        for m in (fast, slow):
            s, _ = m.lookup("a", explicit, now=0, wall=0, episode=chat("hi"))
            answered(m, s, "hi", "hello")
            m.lookup("a", explicit, now=0, wall=0, episode=history)
            setup(m, s)  # type: ignore[operator]
            first.append(s)
        current = fast.match("a", explicit, history)
        took = fast.take_live(current, explicit, history, now) is not None
        opened = slow.lookup("a", explicit, now=now, wall=0, episode=history)
        went_on = not isinstance(opened, Refused) and opened == (first[1], False)
        if took:
            assert current is first[0] and current.last_seen == now
            if explicit is None:  # (explicit sessions keep no lineage)
                assert fast._by_history[("a", history.history[-1])] is current
        return took, went_on

    def nothing(m: SessionManager, s: object) -> None: ...

    def terminated(m: SessionManager, s: object) -> None:
        m.terminate(s, now=0)  # type: ignore[arg-type]

    def ended(m: SessionManager, s: object) -> None:
        s.ended = True  # type: ignore[attr-defined]

    def in_flight(m: SessionManager, s: object) -> None:
        s.inflight = 1  # type: ignore[attr-defined]

    for explicit in (None, "x"):
        assert both(nothing, explicit, 10) == (True, True)
        assert both(in_flight, explicit, 1000) == (True, True)  # in flight: alive past the timeout
        assert both(nothing, explicit, 1000) == (False, False)  # idle: lookup starts a new run
        assert both(terminated, explicit, 10)[0] is False
        assert both(ended, explicit, 10)[0] is False


# --- what a run costs (issue 33): indexes, not scans ------------------------------------------


class _CountingSession(Session):
    """A session that counts reads of what the idle sweep judges it by."""

    __slots__ = ()  # Session's layout (slots), so that a session's __class__ can become this one
    reads = 0

    def __getattribute__(self, name: str) -> Any:
        if name in ("last_seen", "inflight"):
            _CountingSession.reads += 1
        return super().__getattribute__(name)


def test_a_sweep_reads_only_the_sessions_whose_idle_timeout_can_have_passed() -> None:
    """One-call runs pile up for a whole idle timeout (a stateless service): a sweep looks at the
    sessions last seen a timeout ago, not at every session tracked (which made expiry O(N) per
    sweep)."""
    m = mgr()
    made = [m.lookup("a", None, now=float(i), wall=0, episode=chat(f"task {i}"))[0] for i in range(1000)]
    for s in made:
        s.__class__ = _CountingSession
    _CountingSession.reads = 0
    assert m.idle_sessions(now=250.0) == []
    assert _CountingSession.reads == 0  # nothing can be due before t=300
    ended = m.idle_sessions(now=310.0)  # those last seen at 0..10
    assert ended == made[:11]
    assert _CountingSession.reads <= 3 * len(ended)
    assert len(m.known()) == 1000 - 11


def test_the_sweep_follows_last_seen_however_it_was_updated() -> None:
    m = mgr()
    a, _ = m.lookup("a", None, now=0, wall=0, episode=chat("task A"))
    b, _ = m.lookup("a", None, now=0, wall=0, episode=chat("task B"))
    c, _ = m.lookup("a", None, now=0, wall=0, episode=chat("task C"))
    a.last_seen = 100  # as the session stage's finish sets it
    c.inflight = 1
    assert m.idle_sessions(now=350) == [b]
    assert m.idle_sessions(now=399) == []
    assert m.idle_sessions(now=400) == [a]
    c.inflight = 0  # its long call ended: the next sweep ends it
    assert m.idle_sessions(now=401) == [c]


def test_the_oldest_run_waiting_for_an_answer_is_found_among_many_that_gave_it() -> None:
    """An evaluation batch of 500 identical first requests: the continuations go to the runs in
    the order they were answered, with no scan of the runs whose conversation went on already."""
    m = mgr()
    batch = []
    for _ in range(500):
        s, created = m.lookup("a", None, now=0, wall=0, episode=chat("solve"))
        assert created
        answered(m, s, "solve", "same")
        batch.append(s)
    for i in range(500):
        went_on, created = m.lookup("a", None, now=1, wall=0, episode=chat("solve", "same", f"go on {i}"))
        assert went_on is batch[i] and not created
    # none waits any more: the newest that gave the answer
    assert m.lookup("a", None, now=2, wall=0, episode=chat("solve", "same", "again"))[0] is batch[-1]
    # an older run that gives the same answer again waits again, ahead of the newer ones
    answered(m, batch[3], "solve", "same")
    answered(m, batch[1], "solve", "same")
    assert m.lookup("a", None, now=3, wall=0, episode=chat("solve", "same", "next"))[0] is batch[1]
    assert m.lookup("a", None, now=4, wall=0, episode=chat("solve", "same", "next"))[0] is batch[3]
    # expiry forgets each run's place in the index
    m.idle_sessions(now=10_000)
    assert not m._by_answer and not m._waiting


def test_the_first_run_keeps_its_place_when_a_second_gives_the_same_answer() -> None:
    """An answer one run gave is indexed by that run alone, and by the runs in order once another
    gives it too: the first still waiting is found first, one whose conversation went on is not."""
    m = mgr()
    a, _ = m.lookup("a", None, now=0, wall=0, episode=chat("solve"))
    answered(m, a, "solve", "same")
    assert m._by_answer[("a", next(iter(a.lineage.answers)))] is a  # one run: no dict of runs
    b, _ = m.lookup("a", None, now=1, wall=0, episode=chat("solve"))
    answered(m, b, "solve", "same")
    assert m.lookup("a", None, now=2, wall=0, episode=chat("solve", "same", "go on"))[0] is a
    assert m.lookup("a", None, now=3, wall=0, episode=chat("solve", "same", "go on"))[0] is b
    # a's and b's conversations went on before c gave the answer: c is the one waiting
    c, _ = m.lookup("a", None, now=4, wall=0, episode=chat("solve"))
    answered(m, c, "solve", "same")
    assert m.lookup("a", None, now=5, wall=0, episode=chat("solve", "same", "next"))[0] is c
    m.idle_sessions(now=10_000)
    assert not m._by_answer and not m._waiting


def test_a_resumed_session_keeps_waiting_for_its_answer() -> None:
    m = mgr()
    a, _ = m.lookup("a", None, now=0, wall=0, episode=chat("solve"))
    answered(m, a, "solve", "same")
    b, _ = m.lookup("a", None, now=1, wall=0, episode=chat("solve"))
    answered(m, b, "solve", "same")
    m.terminate(a, now=2)
    a.ended = True
    resumed = m.resume(a, "00000000-0000-4000-8000-000000000001", now=3, wall=0)
    # (it answered before the resume: in the index again behind b, which still waits too)
    assert m.lookup("a", None, now=4, wall=0, episode=chat("solve", "same", "go on"))[0] is b
    assert m.lookup("a", None, now=5, wall=0, episode=chat("solve", "same", "go on"))[0] is resumed


def test_the_live_count_is_that_of_live() -> None:
    m = mgr()
    sessions = [m.lookup("a", None, now=0, wall=0, episode=chat(f"t{i}"))[0] for i in range(5)]
    x, _ = m.lookup("a", "x", now=0, wall=0)
    assert m.live_count() == len(m.live()) == 6
    m.terminate(sessions[0], now=1)
    sessions[0].ended = True
    m.note_ended(sessions[0])  # as SessionPolicy.end does
    assert m.live_count() == len(m.live()) == 5
    m.idle_sessions(now=200)
    assert m.live_count() == len(m.live()) == 5
    m.idle_sessions(now=400)  # every one idle; the terminated one quiet for a timeout too
    assert m.live_count() == len(m.live()) == 0
