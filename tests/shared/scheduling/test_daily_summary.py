"""The daily summary: through a real worker, the flag makes the job and its firing summarises each
conversation active in the last 24 hours; as plain functions, what it reads and how it recovers."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlmodel import col, select

from shared.agent import conversations
from shared.agent.runtime import Runtime
from shared.constants import T_CRON_FIRE, T_CRON_RECONCILE, T_DAILY_SUMMARY
from shared.errors import Retryable
from shared.models import CronJob, Message, MessageType, Role, utcnow
from shared.queueing import Producer, make_celery
from shared.scheduling import cron, jobs, summary
from shared.scheduling.beat import BeatMirror
from tests.fakes.llm import FakeLLM, Reply, default_handler
from tests.support.databases import locks_for_a_migration
from tests.support.processes import wait_until
from tests.support.scheduling import client, db, job, new_conversation
from tests.support.stack import Stack

Core = Callable[..., tuple[Stack, Runtime, BeatMirror]]


def daily_summaries(stack: Stack) -> list[Message]:
    with db(stack) as s:
        return list(s.exec(select(Message).where(Message.type == MessageType.SUMMARY,
                                                 col(Message.meta).has_key("daily_summary"))))  # type: ignore[attr-defined]


def test_daily_summary_flag_on_summaries_appear(sched: Stack) -> None:
    stack = sched  # its settings turn the daily summary on
    producer = Producer(make_celery(stack.settings))
    with client(stack) as api:
        chats = [new_conversation(api) for _ in range(2)]
        for cid in chats:
            assert api.post(f"/api/v1/conversations/{cid}/chat", json={"message": f"hello {cid}"}).status_code == 200
        producer.send(T_CRON_RECONCILE)  # what beat does at start-up
        wait_until(lambda: job(stack, cron.DAILY_SUMMARY_ID), message="the daily summary job")
        view = api.get(f"/api/v1/cron/{cron.DAILY_SUMMARY_ID}").json()
        assert (view["system"], view["cronExpr"]) == (True, "0 9 * * *")
        assert api.delete(f"/api/v1/cron/{cron.DAILY_SUMMARY_ID}").status_code == 409  # owned by nanofleet
        producer.send(T_CRON_FIRE, cron.DAILY_SUMMARY_ID, view["nextRunAt"])  # beat, at its time
        wait_until(lambda: len(daily_summaries(stack)) == 2, message="a summary per conversation")
    assert {m.conversation_id for m in daily_summaries(stack)} == set(chats)
    assert all(m.content.startswith("SUMMARY: ") and m.role.value == "SYSTEM" for m in daily_summaries(stack))


def chat_with(stack: Stack, texts: list[str]) -> str:
    with db(stack) as s:
        conv = conversations.get_or_create(s, session_key="api:daily", chat_id="daily")
        s.add_all(Message(conversation_id=conv.id, role=Role.USER if i % 2 == 0 else Role.ASSISTANT, content=t)
                  for i, t in enumerate(texts))
        return conv.id


def test_a_firing_lost_after_its_receipt_is_sent_again(core: Core) -> None:
    """The worker died between the firing's commit (its receipt) and the enqueue of its fan-out."""
    stack, rt, mirror = core(SCHEDULER__DAILY_SUMMARY__ENABLED="true")
    cid = chat_with(stack, ["plan the trip", "booked the train"])
    cron.reconcile(rt, mirror)
    with db(stack) as s:
        due = jobs.upcoming(s.get_one(CronJob, cron.DAILY_SUMMARY_ID), utcnow())
    assert due is not None
    [lost] = cron.fire(rt, mirror, cron.DAILY_SUMMARY_ID, due, now=due)  # never enqueued
    assert lost.task == T_DAILY_SUMMARY and daily_summaries(stack) == []
    assert not [n for n in cron.reconcile(rt, mirror) if n.task == T_DAILY_SUMMARY]  # its task may still come
    later = utcnow() + timedelta(minutes=5)
    [again] = [n for n in cron.reconcile(rt, mirror, now=later) if n.task == T_DAILY_SUMMARY]
    assert again == lost
    for per_chat in summary.plan(rt, datetime.fromisoformat(str(again.args[0]))):
        summary.summarise(rt, str(per_chat.args[1]), datetime.fromisoformat(str(per_chat.args[0])))
    assert [m.conversation_id for m in daily_summaries(stack)] == [cid]
    assert not [n for n in cron.reconcile(rt, mirror, now=later) if n.task == T_DAILY_SUMMARY]


def test_a_summary_is_retried_when_the_model_fails(core: Core, fake_llm: FakeLLM) -> None:
    stack, rt, _ = core()
    cid = chat_with(stack, ["plan the trip", "booked the train"])
    until = utcnow() + timedelta(minutes=1)
    fake_llm.handler = lambda body: Reply(status=503)
    with pytest.raises(Retryable):
        summary.summarise(rt, cid, until)
    assert daily_summaries(stack) == []
    fake_llm.handler = default_handler
    assert summary.summarise(rt, cid, until) and len(daily_summaries(stack)) == 1


def test_the_summary_reads_the_newest_messages_that_fit(core: Core, fake_llm: FakeLLM) -> None:
    stack, rt, _ = core(LLM__CONTEXT_WINDOW="4000", LLM__MAX_TOKENS="500")
    cid = chat_with(stack, [f"message {i:03d} " + "word " * 60 for i in range(500)])
    assert summary.summarise(rt, cid, utcnow() + timedelta(minutes=1))
    [request] = fake_llm.requests
    prompt = request["messages"][0]["content"]
    shown = [int(n) for n in re.findall(r"message (\d{3}) ", prompt)]
    assert shown == list(range(shown[0], 500)) and 0 < len(shown) < summary.MAX_MESSAGES  # the newest, in order
    assert rt.llm.count_tokens(request["messages"]) <= 4000 - 500


def test_the_summary_keeps_the_newest_messages_of_a_long_day(core: Core, fake_llm: FakeLLM) -> None:
    stack, rt, _ = core()
    cid = chat_with(stack, [f"message {i:03d}" for i in range(summary.MAX_MESSAGES + 100)])
    assert summary.summarise(rt, cid, utcnow() + timedelta(minutes=1))
    shown = [int(n) for n in re.findall(r"message (\d{3})", fake_llm.requests[0]["messages"][0]["content"])]
    assert shown == list(range(100, summary.MAX_MESSAGES + 100))


def test_no_transaction_stays_open_while_the_model_writes_and_an_overlapping_duplicate_writes_nothing(
        core: Core) -> None:
    """The model call runs outside any transaction (its locks made a migration's ALTER TABLE wait);
    a duplicate of the task that ran meanwhile has written the summary, and this one adds none."""
    stack, rt, _ = core()
    cid = chat_with(stack, ["plan the trip", "booked the train"])
    until = utcnow() + timedelta(minutes=1)
    complete, seen = rt.llm.complete, []

    def meanwhile(*args: Any, **kwargs: Any) -> Any:
        seen.append(locks_for_a_migration(stack.settings.database_url))
        rt.llm.complete = complete  # type: ignore[method-assign]
        assert summary.summarise(rt, cid, until)  # the duplicate
        return complete(*args, **kwargs)

    rt.llm.complete = meanwhile  # type: ignore[method-assign]
    assert not summary.summarise(rt, cid, until)
    assert seen == ["free"] and len(daily_summaries(stack)) == 1


def test_a_conversation_deleted_while_its_summary_is_written_gets_none(core: Core) -> None:
    stack, rt, _ = core()
    cid = chat_with(stack, ["plan the trip", "booked the train"])
    complete = rt.llm.complete

    def deleted_meanwhile(*args: Any, **kwargs: Any) -> Any:
        with db(stack) as s:
            conversations.delete_conversation(s, cid)
        return complete(*args, **kwargs)

    rt.llm.complete = deleted_meanwhile  # type: ignore[method-assign]
    assert not summary.summarise(rt, cid, utcnow() + timedelta(minutes=1))
    assert daily_summaries(stack) == []
