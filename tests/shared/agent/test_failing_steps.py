"""A step that raises is tried again; one that keeps raising fails its run with a reply and frees
the conversation for the next message. Errors of the database or the broker never count against it.
A turn stopped before its first step takes its waiting message with it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from sqlalchemy import exc, text
from sqlmodel import col, select

from shared.agent import conversations, prompt, recovery, service, steps
from shared.agent.local import drain
from shared.agent.runtime import Next, Runtime
from shared.constants import T_AGENT_STEP
from shared.models import TERMINAL, Conversation, Message, Run, RunStatus
from shared.settings import Settings
from tests.fakes.llm import FakeLLM
from tests.support.stack import Stack

MAX_RECOVERIES = 3


class Faults:
    """A system-prompt section that raises the errors queued here, one per step: a fault before the
    step's LLM call, as an unreadable workspace file once was."""

    def __init__(self) -> None:
        self.queue: list[Exception] = []

    def __call__(self, settings: Settings) -> str:
        if self.queue:
            raise self.queue.pop(0)
        return ""


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Faults:
    found = Faults()
    monkeypatch.setattr(prompt, "SECTIONS", [*prompt.SECTIONS, found])
    return found


@pytest.fixture
def rt(make_stack: Callable[..., Stack]) -> Runtime:
    """The core in this process (no broker: what a step enqueues is run by `work`)."""
    return Runtime.build(make_stack(RUNTIME__MAX_RECOVERIES=str(MAX_RECOVERIES)).settings)


def post(rt: Runtime, conversation_id: str, message: str) -> str | None:
    """Post a message as the API does; the run it started, if no turn was active."""
    with rt.session() as s:
        return conversations.post_message(s, conversation_id, message, origin={},
                                          lease_seconds=rt.settings.runtime.lease_seconds).run_id


def new_conversation(rt: Runtime) -> str:
    with rt.session() as s:
        return conversations.get_or_create(s, session_key="t:failing").id


def run_of(rt: Runtime, run_id: str) -> Run:
    with rt.session() as s:
        return s.get_one(Run, run_id)


def work(rt: Runtime, run_id: str, conversation_id: str, limit: int = 3 * MAX_RECOVERIES) -> int:
    """Work on the run as workers and the sweeper do: run its step and what follows; when that
    raised, let the lease expire and sweep. Returns the tries it took to end the run (`limit`: it
    did not end)."""
    nexts = [Next(T_AGENT_STEP, (run_id, 0))]
    for tries in range(1, limit + 1):
        with contextlib.suppress(Exception):  # a worker logs it; the sweeper takes the step back
            drain(rt, nexts, retries=0)
        if run_of(rt, run_id).status in TERMINAL:
            return tries
        with rt.session() as s:
            s.execute(text("update runs set lease_until = now() - interval '1 second' where id = :id"),
                      {"id": run_id})
        nexts = recovery.sweep(rt, conversation_id)
    return limit


def answers(rt: Runtime, conversation_id: str) -> list[str]:
    with rt.session() as s:
        return list(s.exec(select(Message.content).where(Message.conversation_id == conversation_id,
                                                         Message.role == "ASSISTANT").order_by(col(Message.seq))))


def test_a_step_that_keeps_raising_fails_its_run_and_the_next_message_is_answered(
        rt: Runtime, faults: Faults, fake_llm: FakeLLM) -> None:
    cid = new_conversation(rt)
    run_id = post(rt, cid, "hello")
    assert run_id is not None and post(rt, cid, "are you there?") is None  # waits for the turn
    faults.queue = [RuntimeError("the prompt cannot be built")] * MAX_RECOVERIES
    assert work(rt, run_id, cid) == MAX_RECOVERIES
    run = run_of(rt, run_id)
    assert (run.status, run.final_text) == (RunStatus.FAILED, steps.FAILED_STEP)  # the reply says so
    assert f"failed {MAX_RECOVERIES} times" in (run.error or "") and "RuntimeError" in (run.error or "")
    with rt.session() as s:
        assert s.get_one(Conversation, cid).active_run_id is None  # the turn lock is free
        assert conversations.pending_messages(s, cid) == []  # what the failed turn took starts no turn that fails again
    assert fake_llm.calls() == 0 and answers(rt, cid) == []  # the apology is a reply, not the agent's history
    next_run = post(rt, cid, "again")
    assert next_run is not None and work(rt, next_run, cid) == 1
    assert answers(rt, cid) == ["echo: again"]


def test_a_step_that_raises_less_often_than_the_bound_goes_on(rt: Runtime, faults: Faults) -> None:
    cid = new_conversation(rt)
    run_id = post(rt, cid, "hello")
    assert run_id is not None
    faults.queue = [RuntimeError("a hiccup")] * (MAX_RECOVERIES - 1)
    assert work(rt, run_id, cid) == MAX_RECOVERIES
    assert run_of(rt, run_id).status == RunStatus.SUCCEEDED and answers(rt, cid) == ["echo: hello"]


def test_database_and_broker_errors_never_count_against_a_step(rt: Runtime, faults: Faults) -> None:
    """However often the database or the broker is away, the step is tried again, as before."""
    lost = exc.OperationalError("select 1", {}, Exception("server closed the connection unexpectedly"))
    invalidated = exc.DBAPIError("select 1", {}, Exception("connection reset"), connection_invalidated=True)
    faults.queue = [lost, invalidated, ConnectionError("broker"), lost] * MAX_RECOVERIES
    cid = new_conversation(rt)
    run_id = post(rt, cid, "hello")
    assert run_id is not None
    tries = len(faults.queue) + 1
    assert work(rt, run_id, cid, limit=tries) == tries
    run = run_of(rt, run_id)
    assert run.status == RunStatus.SUCCEEDED and run.recoveries == 0
    assert answers(rt, cid) == ["echo: hello"]


def test_a_message_stopped_before_its_turn_took_it_in_is_not_answered(rt: Runtime, fake_llm: FakeLLM) -> None:
    """A burst (debounced) submitted just before a /stop: the turn was cancelled before its first step,
    its message still waited in the mailbox, and the released turn lock started a new turn for it,
    which answered after "Stopped 1 running task(s)." (a QA pass, 3 times out of 3)."""
    cid = new_conversation(rt)
    run_id = post(rt, cid, "please do the thing")
    assert run_id is not None
    with rt.session() as s:
        out = service.submit(rt, s, cid, "/stop", origin={})
    assert out.reply == "Stopped 1 running task(s)." and out.nexts == []
    with rt.session() as s:
        assert conversations.pending_messages(s, cid) == []
        [message] = s.exec(select(Message).where(Message.conversation_id == cid)).all()
        assert (message.content, message.run_id) == ("please do the thing", run_id)  # kept, in the stopped turn
        assert s.get_one(Conversation, cid).active_run_id is None
    drain(rt, [Next(T_AGENT_STEP, (run_id, 0))])  # the stopped turn's step, if its task still comes
    assert fake_llm.calls() == 0 and answers(rt, cid) == []
    next_run = post(rt, cid, "and now this")  # the chat goes on
    assert next_run is not None and work(rt, next_run, cid) == 1
    assert answers(rt, cid)[-1] == "echo: and now this"
