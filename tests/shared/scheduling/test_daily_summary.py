"""The daily summary through a real worker: the flag makes the job, its firing summarises each
conversation active in the last 24 hours."""

from __future__ import annotations

from sqlmodel import col, select

from shared.constants import T_CRON_FIRE, T_CRON_RECONCILE
from shared.models import Message, MessageType
from shared.queueing import Producer, make_celery
from shared.scheduling import cron
from tests.support.processes import wait_until
from tests.support.scheduling import client, db, job, new_conversation
from tests.support.stack import Stack


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
