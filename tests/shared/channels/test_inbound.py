"""The two halves of the inbound pipeline on real Postgres: the gateway's record (many events in
one statement) and a worker's submission (each session's messages once, in the order they came);
and, with a real worker and beat, a submission whose task was lost."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from shared.agent.runtime import Next, Runtime
from shared.agent.service import Submitted
from shared.channels import inbound
from shared.channels.inbound import Entry, Recorded
from shared.constants import T_AGENT_STEP, T_INGEST, T_OUTBOUND_DELIVER
from shared.contracts import InboundMessage
from shared.db import async_connect, get_engine
from tests.support.processes import wait_until
from tests.support.stack import Stack


def _msg(content: str, chat: str = "42", event: str | None = None) -> InboundMessage:
    return InboundMessage(channel="telegram", chat_id=chat, sender_id="7", content=content, event_id=event or content)


def _record(rt: Runtime, entries: list[Entry], grace: float = 60) -> Recorded:
    """The gateway's statement, on a connection of its own (as gateway/ledger.py runs it)."""
    async def record() -> Recorded:
        async with await async_connect(rt.settings.database_url) as conn:
            return await inbound.record(conn, entries, grace)

    return asyncio.run(record())


def _rows(rt: Runtime, sql: str, **params: object) -> list[tuple[object, ...]]:
    with get_engine(rt.settings.database_url).connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql), params)]


def test_one_statement_records_a_batch_and_tells_new_events_from_retries(make_stack: Callable[..., Stack]) -> None:
    rt = Runtime.build(make_stack().settings)
    first = _record(rt, [Entry(_msg("a"), True)])
    # a retry of "a", a denied sender, and "b" twice (a retry racing it)
    batch = _record(rt, [Entry(_msg("a"), True), Entry(_msg("denied"), False), Entry(_msg("b"), True),
                         Entry(_msg("b"), True)])
    denied = _record(rt, [Entry(_msg("denied too"), False)])  # only denied senders: no message in the statement
    assert first.new == [True] and batch.new == [False, True, True, False] and denied.new == [True]
    assert denied.to_submit == [] and inbound.submission(denied.to_submit) == []
    assert inbound.submission(batch.to_submit) == [Next(T_INGEST, (batch.to_submit,))] and len(batch.to_submit) == 1
    # the denied event keeps no message, as SQL NULL (a JSON null would count as one still to submit)
    assert _rows(rt, "select event_id from inbound_events where message is null order by id") == \
        [("denied",), ("denied too",)]
    assert _rows(rt, "select message->>'content', session_key from inbound_events where message is not null "
                     "order by id") == [("a", "telegram:42"), ("b", "telegram:42")]


def test_a_sessions_messages_are_submitted_once_each_in_the_order_they_came(
        make_stack: Callable[..., Stack]) -> None:
    """Submissions of one session run one at a time, and the first takes the messages before its
    own: tasks that run out of order (on two workers) keep the chat's order, and replays do nothing."""
    rt = Runtime.build(make_stack().settings)
    ids = _record(rt, [Entry(_msg(c), True) for c in ("one", "two", "three")]
                  + [Entry(_msg("elsewhere", chat="43"), True)]).to_submit
    nexts = inbound.submit_recorded(rt, [ids[1]])  # the second message's task runs first
    [(run_id,)] = _rows(rt, "select id from runs")
    assert nexts == [Next(T_AGENT_STEP, (run_id, 0))]  # "two" waits in the mailbox of the turn "one" started
    assert inbound.submit_recorded(rt, [ids[0], ids[1]]) == []  # replays and late tasks
    assert inbound.submit_recorded(rt, [ids[2], ids[3]]) != []  # "three" to the mailbox; "elsewhere" starts a turn
    assert _rows(rt, "select c.chat_id, m.content from messages m join conversations c on c.id = m.conversation_id "
                     "where m.role = 'USER' order by m.id") == \
        [("42", "one"), ("42", "two"), ("42", "three"), ("43", "elsewhere")]
    assert _rows(rt, "select count(*) from inbound_events where message is not null") == [(0,)]


def test_a_message_that_cannot_be_submitted_holds_up_its_own_chat_only_until_set_aside(
        make_stack: Callable[..., Stack]) -> None:
    """One event that fails (here a stored message no longer readable) is logged and left for the
    sweeper; the other sessions of the same task are submitted all the same. Its own chat's later
    messages wait behind it until it failed max_recoveries times; then it is set aside with the error
    and they go on."""
    rt = Runtime.build(make_stack(RUNTIME__MAX_RECOVERIES="3").settings)
    with get_engine(rt.settings.database_url).begin() as conn:
        [bad] = conn.execute(text("insert into inbound_events (channel, event_id, received_at, message, session_key) "
                                  "values ('telegram', 'bad', now(), '{\"no\": \"message\"}', 'telegram:41') "
                                  "returning id")).scalars()
    good = _record(rt, [Entry(_msg("fine", chat="43"), True)]).to_submit
    after = _record(rt, [Entry(_msg("after it", chat="41"), True)]).to_submit
    assert len(inbound.submit_recorded(rt, [bad, *good])) == 1  # the good one's turn
    assert _rows(rt, "select content from messages where role = 'USER'") == [("fine",)]
    assert inbound.submit_recorded(rt, after) == []  # "after it" waits behind the bad one: its second failure
    assert _rows(rt, "select event_id, failures from inbound_events where message is not null order by id") == \
        [("bad", 2), ("after it", 0)]
    assert len(inbound.submit_recorded(rt, after)) == 1  # the third: set aside; "after it" starts its turn
    assert _rows(rt, "select content from messages where role = 'USER' order by id") == [("fine",), ("after it",)]
    assert _rows(rt, "select event_id, failures, set_aside->>'no', error like '%ValidationError%' from inbound_events "
                     "where set_aside is not null") == [("bad", 3, "message", True)]
    assert _rows(rt, "select count(*) from inbound_events where message is not null") == [(0,)]
    assert _rows(rt, "select count(*) from outbox") == [(0,)]  # nobody to tell: the message cannot be read


def test_a_message_set_aside_is_told_to_its_sender(make_stack: Callable[..., Stack],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A readable message whose submission raises each time (a bug): once set aside, its sender gets
    a notice through the outbox instead of silence. A failure of the database is no fault of the
    message and is not counted."""
    rt = Runtime.build(make_stack(RUNTIME__MAX_RECOVERIES="2").settings)
    one = inbound._one

    def failing(rt: Runtime, s: Session, msg: InboundMessage) -> tuple[Submitted | None, list[Next]]:
        if msg.content == "poison":
            raise RuntimeError("a bug meets this message")
        if msg.content == "database down":
            raise OperationalError("select", {}, Exception("connection refused"))
        return one(rt, s, msg)

    monkeypatch.setattr(inbound, "_one", failing)
    ids = _record(rt, [Entry(_msg("poison"), True), Entry(_msg("database down", chat="44"), True)]).to_submit
    for _ in range(3):
        assert inbound.submit_recorded(rt, [ids[1]]) == []
    assert inbound.submit_recorded(rt, [ids[0]]) == []  # the first failure
    [deliver] = inbound.submit_recorded(rt, [ids[0]])  # the second: set aside, and its sender told
    assert deliver.task == T_OUTBOUND_DELIVER
    assert _rows(rt, "select chat_id, content from outbox") == [("42", inbound.SET_ASIDE)]
    assert _rows(rt, "select event_id, failures, message is null, set_aside->>'content' from inbound_events "
                     "order by id") == [("poison", 2, True, "poison"), ("database down", 0, False, None)]
    assert _rows(rt, "select count(*) from runs") == [(0,)]


def test_a_message_then_stop_do_not_deadlock_with_a_step_ending_the_turn(make_stack: Callable[..., Stack]) -> None:
    """A message keeps its conversation until its transaction ends; a /stop in the same transaction
    then waited for the running turn's run, whose step, ending it, waited for the conversation: a
    deadlock (helper's review). Each message now commits before the next is submitted."""
    rt = Runtime.build(make_stack().settings)
    engine = get_engine(rt.settings.database_url)
    first = _record(rt, [Entry(_msg("start a turn"), True)]).to_submit
    inbound.submit_recorded(rt, first)
    [(cid, turn)] = _rows(rt, "select id, active_run_id from conversations")
    # the user writes again, then stops it: both wait on the ledger
    stop = _record(rt, [Entry(_msg("hello?"), True), Entry(_msg("/stop"), True)]).to_submit[1]
    failed: list[BaseException] = []

    def step_ending_the_turn() -> None:  # as finish() does: the run locked first, then its conversation
        try:
            with engine.begin() as conn:
                conn.execute(text("select id from runs where id = :id for update"), {"id": turn})
                locked.set()
                wait_until(lambda: _rows(rt, "select count(*) from pg_stat_activity where wait_event_type = 'Lock' "
                                             "and datname = current_database()") == [(1,)],
                           timeout=30, message="the submission to wait for the run")
                conn.execute(text("select id from conversations where id = :id for update"), {"id": cid})
        except BaseException as err:
            failed.append(err)

    locked = threading.Event()
    step = threading.Thread(target=step_ending_the_turn)
    step.start()
    assert locked.wait(30)
    inbound.submit_recorded(rt, [stop])  # "hello?", then "/stop", which waits for the step's run
    step.join(60)
    assert failed == []
    assert _rows(rt, "select count(*) from inbound_events where message is not null") == [(0,)]
    assert _rows(rt, "select status from runs where id = :id", id=turn) == [("cancelled",)]
    assert _rows(rt, "select content from messages where role = 'USER' order by id") == [("start a turn",), ("hello?",)]


def test_a_recorded_message_whose_task_was_lost_is_submitted_by_the_sweeper(
        make_stack: Callable[..., Stack]) -> None:
    """A gateway that died between its commit and its enqueue: beat's sweep enqueues the submission,
    and the message gets its turn."""
    stack = make_stack()
    rt = Runtime.build(stack.settings)
    _record(rt, [Entry(_msg("nobody enqueued me"), True)], grace=0)  # and no task is sent
    stack.worker(queues="agent,scheduler")
    stack.beat()
    wait_until(lambda: _rows(rt, "select status from runs") == [("succeeded",)], timeout=60,
               message="the lost submission's turn to finish")
    assert _rows(rt, "select content from messages where role = 'USER'") == [("nobody enqueued me",)]
    assert _rows(rt, "select count(*) from inbound_events where message is not null") == [(0,)]
