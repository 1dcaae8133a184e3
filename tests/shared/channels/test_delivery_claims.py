"""The delivery core on real Postgres and Redis, one step at a time (a worker's send is two calls
here, so another task can run between them): a row another worker is sending is never
dead-lettered under it, and a "sent" marker counts once."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import text
from sqlmodel import Session

from shared.agent.runtime import Runtime
from shared.channels import delivery
from shared.channels.base import Bucket, SendResult
from shared.constants import KEY_SENT
from shared.db import get_engine
from shared.errors import Retryable
from shared.models import Outbox, OutboxStatus
from shared.settings import load_settings
from tests.support.stack import clean_db


class Recording:
    """A platform that takes every send and, like WhatsApp, may report one failed later."""

    name = "whatsapp"
    reports_failures = True

    def __init__(self) -> None:
        self.sent: list[str] = []

    def enabled(self) -> bool:
        return True

    def rate_limits(self, chat_id: str) -> list[Any]:
        return []

    def send(self, chat_id: str, text: str, meta: dict[str, Any]) -> SendResult:
        self.sent.append(text)
        return SendResult(f"wamid.{len(self.sent)}")


@pytest.fixture
def rt(database_url: str, redis_server: str, redis_dbs: tuple[int, int]) -> Iterator[Runtime]:
    clean_db(database_url)
    settings = load_settings(database_url=database_url, redis_url=f"{redis_server}/{redis_dbs[1]}",
                             llm={"api_key": "sk-unused"})
    delivery._channels[("whatsapp", id(settings))] = Recording()  # type: ignore[assignment]
    yield Runtime.build(settings)
    del delivery._channels[("whatsapp", id(settings))]


def platform(rt: Runtime) -> Recording:
    ch = delivery.channel_for(rt.settings, "whatsapp")
    assert isinstance(ch, Recording)
    return ch


def reply(rt: Runtime, *chunks: str, delivered: int = 0) -> list[str]:
    """A reply's rows, its first `delivered` chunks already sent."""
    key = f"run-{uuid.uuid4().hex[:8]}"
    rows = [Outbox(key=f"{key}:{i}", channel="whatsapp", chat_id="155", content=c,
                   meta={"chunk": i, "chunks": len(chunks)}) for i, c in enumerate(chunks)]
    for i, row in enumerate(rows[:delivered]):
        row.status, row.platform_message_id = OutboxStatus.DELIVERED, f"wamid.old{i}"
    with Session(get_engine(rt.settings.database_url), expire_on_commit=False) as s:
        s.add_all(rows)
        s.commit()
    return [r.id for r in rows]


def status(rt: Runtime, row_id: str) -> tuple[str, str | None]:
    with Session(get_engine(rt.settings.database_url)) as s:
        row = s.get_one(Outbox, row_id)
        return row.status, row.platform_message_id


def test_a_chunk_being_sent_is_not_dead_lettered_under_its_sender(rt: Runtime) -> None:
    """Worker A was sending chunk 1 when the platform reported chunk 0 failed; a second task for
    chunk 1 dead-lettered it, A's mark found no pending row, and a retry sent it again (helper's review)."""
    first, second = reply(rt, "chunk 0", "chunk 1", delivered=1)
    row = delivery._due(rt, second)  # worker A: due, claimed, in the platform's hands
    assert row is not None and delivery._claim(rt, second)
    delivery.undelivered(rt, "whatsapp", {"wamid.old0": "131047 re-engagement"})
    assert delivery.deliver(rt, second) == []  # another task for the row, meanwhile
    delivery._delivered(rt, row, platform(rt).send(row.chat_id, row.content, {}), 0.0)
    assert status(rt, second) == (OutboxStatus.DELIVERED, "wamid.1")
    with Session(get_engine(rt.settings.database_url)) as s:  # the operator resends the failed chunk
        resend = delivery.retry(s, s.get_one(Outbox, first))
        s.commit()
    for nxt in resend:
        delivery.deliver(rt, *nxt.args)
    assert platform(rt).sent == ["chunk 1", "chunk 0"]


def test_a_sent_marker_counts_once(rt: Runtime) -> None:
    """A send whose mark the database missed leaves a marker the next claimant uses. It stayed for 7
    days: once an operator resent the row, its next attempt found it and counted the row delivered
    without sending it (helper's review)."""
    [row_id] = reply(rt, "hello")
    marker = redis.Redis.from_url(rt.settings.redis_url)
    marker.set(KEY_SENT + row_id, json.dumps({"platform_message_id": "wamid.first"}), ex=3600)
    with Session(get_engine(rt.settings.database_url)) as s:  # the worker that sent it died with its claim
        s.execute(text("update outbox set next_attempt_at = now() - interval '1 second' where id = :i"), {"i": row_id})
        s.commit()
    delivery.deliver(rt, row_id)
    assert status(rt, row_id) == (OutboxStatus.DELIVERED, "wamid.first") and platform(rt).sent == []
    delivery.undelivered(rt, "whatsapp", {"wamid.first": "131047 re-engagement"})  # reported failed later
    with Session(get_engine(rt.settings.database_url)) as s:
        delivery.retry(s, s.get_one(Outbox, row_id))
        s.execute(text("update outbox set next_attempt_at = now() - interval '1 second' where id = :i"), {"i": row_id})
        s.commit()  # (a claim of the resend that lapsed: the next attempt looks for a marker)
    delivery.deliver(rt, row_id)
    assert platform(rt).sent == ["hello"] and status(rt, row_id) == (OutboxStatus.DELIVERED, "wamid.1")


class Limited(Recording):
    """A platform with a rate limit: the send asks Redis first."""

    def rate_limits(self, chat_id: str) -> list[Bucket]:
        return [Bucket(f"whatsapp:to:{chat_id}", 6.0, 20)]


def test_redis_failing_before_the_send_frees_the_row_soon(rt: Runtime) -> None:
    """Redis down at the rate limit's look-up: nothing was sent, and the row (with the chat's later
    replies behind it) stayed claimed for the whole claim, 60 s, before anyone tried it again."""
    [row_id] = reply(rt, "hello")
    down = load_settings(database_url=rt.settings.database_url, redis_url="redis://127.0.0.1:1/0",
                         llm={"api_key": "sk-unused"})
    delivery._channels[("whatsapp", id(down))] = Limited()  # type: ignore[assignment]
    try:
        with pytest.raises(Retryable) as raised:
            delivery.deliver(Runtime.build(down), row_id)
    finally:
        del delivery._channels[("whatsapp", id(down))]
    assert raised.value.delay == down.channels.delivery.retry_base_delay
    with Session(get_engine(rt.settings.database_url)) as s:
        row = s.get_one(Outbox, row_id)
        free_in = s.execute(text("select extract(epoch from next_attempt_at - now()) from outbox where id = :i"),
                            {"i": row_id}).scalar_one()
    assert row.status == OutboxStatus.PENDING and row.attempts == 0 and free_in <= raised.value.delay
