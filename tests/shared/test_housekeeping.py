"""Retention: old operational records go, in batches; the memory and anything unfinished stay.
Real Postgres; the last test runs the pass the way a deployment does (beat and a worker)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
import redis
from sqlmodel import Session, col, func, select, update

from shared import housekeeping
from shared.agent.events import STREAM_TTL, RedisEvents, stream_key
from shared.agent.runtime import Runtime
from shared.channels import saved
from shared.constants import INTERNAL
from shared.db import get_engine
from shared.models import (
    Conversation,
    CronJob,
    CronReceipt,
    InboundEvent,
    Message,
    Outbox,
    OutboxStatus,
    Role,
    Run,
    RunStatus,
    RunStep,
    SentFile,
    ToolCall,
    utcnow,
)
from shared.outbox import FILE
from tests.support.locks import cancelled_with_a_call_running, race_with_late_result
from tests.support.processes import wait_until
from tests.support.stack import Stack

OLD = utcnow() - timedelta(days=40)
NEW = utcnow() - timedelta(days=2)


def _run(s: Session, conv: Conversation, status: RunStatus, when: object) -> Run:
    run = Run(conversation_id=conv.id, status=status, created_at=when,
              finished_at=when if status in (RunStatus.SUCCEEDED, RunStatus.FAILED) else None)
    s.add(run)
    s.flush()
    s.add(RunStep(run_id=run.id, seq=0, started_at=when, finished_at=when))
    s.add(ToolCall(run_id=run.id, step_seq=0, call_id="c1", name="time", created_at=when))
    s.add(Message(conversation_id=conv.id, run_id=run.id, role=Role.ASSISTANT, content=f"{status} answer"))
    return run


def _count(s: Session, table: type) -> int:
    return int(s.exec(select(func.count()).select_from(table)).one())


def _fill(s: Session) -> dict[str, str]:
    conv = Conversation(session_key="api:keep", prompt_tokens=1234, cost=0.5)
    s.add(conv)
    s.flush()
    ids = {"conversation": conv.id, "old_done": _run(s, conv, RunStatus.SUCCEEDED, OLD).id,
           "old_failed": _run(s, conv, RunStatus.FAILED, OLD).id,
           "old_running": _run(s, conv, RunStatus.RUNNING, OLD).id,  # a stuck run is the sweeper's, not ours
           "new_done": _run(s, conv, RunStatus.SUCCEEDED, NEW).id}
    for i in range(5):  # more than one batch of 2
        s.add(InboundEvent(channel="telegram", event_id=f"old{i}", received_at=OLD))
    s.add(InboundEvent(channel="telegram", event_id="new", received_at=NEW))
    # an old event whose message no worker has submitted yet (workers down for days): it stays
    s.add(InboundEvent(channel="telegram", event_id="unsubmitted", received_at=OLD, session_key="telegram:1",
                       message={"content": "still to submit"}))
    for key, status, when in (("o1", OutboxStatus.DELIVERED, OLD), ("o2", OutboxStatus.FAILED, OLD),
                              ("o3", OutboxStatus.PENDING, OLD), ("o4", OutboxStatus.DELIVERED, NEW)):
        meta = {FILE: {"id": "waited-for", "name": "a.pdf", "mime": "application/pdf"}} if key == "o3" else {}
        s.add(Outbox(key=key, channel="telegram", chat_id="1", content="", status=status, created_at=when, meta=meta))
    for file_id, when in (("sent", OLD), ("waited-for", OLD), ("recent", NEW)):  # o3 still waits to send one
        s.add(SentFile(id=file_id, conversation_id=conv.id, name="a.pdf", mime="application/pdf", size=1, data=b"x",
                       created_at=when))
    s.add(CronReceipt(job_id="j", scheduled_for=OLD, created_at=OLD))
    s.add(CronReceipt(job_id="j", scheduled_for=NEW, created_at=NEW))
    s.add(CronJob(id="live", message="every day", every_seconds=86400))
    for key in ("subagent:old", "subagent:new", "subagent:busy", "cron:removed", "cron:live"):
        session = Conversation(session_key=key, channel=INTERNAL, chat_id=key.partition(":")[2],
                               last_active_at=NEW if key == "subagent:new" else OLD)
        s.add(session)
        s.flush()
        s.add(Message(conversation_id=session.id, role=Role.USER, content=f"the task of {key}"))
        if key == "subagent:busy":
            session.active_run_id = _run(s, session, RunStatus.RUNNING, OLD).id
    s.commit()
    return ids


def test_a_pass_deletes_old_finished_records_and_keeps_memory_and_unfinished_work(
        make_stack: Callable[..., Stack]) -> None:
    stack = make_stack()
    rt = Runtime.build(stack.settings)
    with Session(get_engine(stack.settings.database_url)) as s:
        ids = _fill(s)
    counts = housekeeping.prune(rt, batch=2)
    assert counts == {"inbound_events": 5, "outbox": 2, "sent_files": 1, "cron_receipts": 1, "runs": 2,
                      "conversations": 2}
    with Session(get_engine(stack.settings.database_url)) as s:
        assert set(s.exec(select(Run.id).where(Run.conversation_id == ids["conversation"])).all()) == \
            {ids["old_running"], ids["new_done"]}
        assert _count(s, RunStep) == _count(s, ToolCall) == 3  # of those two, and the busy subagent's run
        assert set(s.exec(select(InboundEvent.event_id)).all()) == {"new", "unsubmitted"}
        assert set(s.exec(select(Outbox.key)).all()) == {"o3", "o4"}
        assert set(s.exec(select(SentFile.id)).all()) == {"waited-for", "recent"}
        assert s.exec(select(CronReceipt.created_at)).one() > OLD
        assert _count(s, Message) == 4 + 4  # the transcript is memory: every message stays...
        conv = s.get_one(Conversation, ids["conversation"])
        assert (conv.prompt_tokens, conv.cost) == (1234, 0.5)
        # ...but the sessions nobody will use again go: a subagent's, a removed cron job's
        assert set(s.exec(select(Conversation.session_key)).all()) == {
            "api:keep", "subagent:new", "subagent:busy", "cron:live"}
    assert set(housekeeping.prune(rt).values()) == {0}  # a second pass finds nothing


def test_a_backlog_is_worked_off_over_several_passes(make_stack: Callable[..., Stack],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass stops after MAX_BATCHES batches a table, so that it stays within a task's time limit."""
    stack = make_stack()
    with Session(get_engine(stack.settings.database_url)) as s:
        _fill(s)
    monkeypatch.setattr(housekeeping, "MAX_BATCHES", 2)
    rt = Runtime.build(stack.settings)
    assert housekeeping.prune(rt, batch=2)["inbound_events"] == 4
    assert housekeeping.prune(rt, batch=2)["inbound_events"] == 1


def test_the_inbound_ledger_outlives_the_platforms_retries_whatever_the_setting(
        make_stack: Callable[..., Stack]) -> None:
    stack = make_stack(RETENTION__DAYS="1")
    with Session(get_engine(stack.settings.database_url)) as s:
        s.add(InboundEvent(channel="whatsapp", event_id="5 days", received_at=utcnow() - timedelta(days=5)))
        s.add(InboundEvent(channel="whatsapp", event_id="9 days", received_at=utcnow() - timedelta(days=9)))
        s.commit()
    assert housekeeping.prune(Runtime.build(stack.settings))["inbound_events"] == 1
    with Session(get_engine(stack.settings.database_url)) as s:
        assert s.exec(select(InboundEvent.event_id)).all() == ["5 days"]


def test_zero_days_keeps_everything(make_stack: Callable[..., Stack]) -> None:
    stack = make_stack(RETENTION__DAYS="0")
    with Session(get_engine(stack.settings.database_url)) as s:
        _fill(s)
    assert housekeeping.prune(Runtime.build(stack.settings)) == {}
    with Session(get_engine(stack.settings.database_url)) as s:
        assert (_count(s, Run), _count(s, InboundEvent), _count(s, Outbox), _count(s, Conversation)) == (5, 7, 4, 6)


def test_beat_and_a_worker_run_the_retention_pass(make_stack: Callable[..., Stack]) -> None:
    stack = make_stack(RETENTION__INTERVAL="1")
    with Session(get_engine(stack.settings.database_url)) as s:
        _fill(s)
    stack.worker(queues="scheduler")
    stack.beat()

    def pruned() -> bool:
        with Session(get_engine(stack.settings.database_url)) as s:
            return _count(s, InboundEvent) == 2 and _count(s, Run) == 3 and _count(s, Conversation) == 4

    wait_until(pruned, timeout=60, message="the retention pass to delete the old records")


def test_an_event_stream_expires_a_day_after_its_newest_event(make_stack: Callable[..., Stack]) -> None:
    client = redis.Redis.from_url(make_stack().settings.redis_url)
    RedisEvents(client).publish("conv-ttl", "run.started", {"run_id": "r"})
    assert STREAM_TTL - 60 < client.ttl(stream_key("conv-ttl")) <= STREAM_TTL
    assert client.xlen(stream_key("conv-ttl")) == 1


def test_a_late_tool_result_and_the_retention_of_its_session_do_not_deadlock(
        make_stack: Callable[..., Stack]) -> None:
    """A subagent's session idle for long is deleted while a tool of its cancelled run writes its
    result: the pass took the session, then the call's row, then waited for the run the write holds,
    and Postgres aborted it as a deadlock."""
    rt = Runtime.build(make_stack().settings)
    late = cancelled_with_a_call_running(rt, session_key="subagent:late", channel=INTERNAL)
    with rt.session() as s:  # its run ended just now: the pass leaves the run to a later one, not the session
        s.execute(update(Conversation).where(col(Conversation.id) == late.conversation_id).values(last_active_at=OLD))
    counts: dict[str, int] = {}
    assert race_with_late_result(rt, late, lambda: counts.update(housekeeping.prune(rt))) == {}
    assert counts["conversations"] == 1
    with rt.session() as s:
        assert s.get(Conversation, late.conversation_id) is None and _count(s, ToolCall) == 0


def test_kept_files_go_after_their_own_days_even_where_records_are_kept_for_ever(
        make_stack: Callable[..., Stack]) -> None:
    """RETENTION__DAYS=0 keeps every record; the files users sent still go after SAVE_FILES_DAYS: beat
    schedules the pass for them, and a worker deletes the days before the cutoff."""
    stack = make_stack(RETENTION__DAYS="0", RETENTION__INTERVAL="1", CHANNELS__SAVE_FILES_DAYS="7")
    today = utcnow().date()
    for age in (8, 6):
        saved.save(stack.workspace, "photo.jpg", b"\xff\xd8\xff", today - timedelta(days=age))
    with Session(get_engine(stack.settings.database_url)) as s:
        _fill(s)
    stack.worker(queues="scheduler")
    stack.beat()
    inbox = stack.workspace / "inbox"
    wait_until(lambda: not (inbox / (today - timedelta(days=8)).isoformat()).exists(), timeout=60,
               message="the retention pass to delete the old day's kept files")
    assert sorted(p.name for p in inbox.iterdir()) == [(today - timedelta(days=6)).isoformat()]
    with Session(get_engine(stack.settings.database_url)) as s:
        assert (_count(s, Run), _count(s, InboundEvent), _count(s, Outbox), _count(s, Conversation)) == (5, 7, 4, 6)
