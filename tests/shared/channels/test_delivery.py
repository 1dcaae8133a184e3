"""Outbound delivery with a real worker and fake platforms: long replies in order, dead letters
and their retry through the API, a lost delivery task recovered by the sweeper, concurrent copies
of one task sending once, and a worker killed mid-send."""

from __future__ import annotations

import contextlib
import signal
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlmodel import Session

from shared.channels.discord import DiscordChannel
from shared.channels.telegram import TelegramChannel
from shared.constants import KEY_SENT, T_OUTBOUND_DELIVER
from shared.db import get_engine
from shared.models import Outbox
from shared.queueing import Producer, make_celery
from tests.fakes.llm import FakeLLM, Reply
from tests.support.platforms import ChannelStack
from tests.support.processes import Proc, wait_until

CODE = "\n".join(f"    step_{i} = compute({i}) * 2  # keep going" for i in range(120))
LONG = ("# Report\n\n" + "Some **bold** text & a <tag>. " * 60 + "\n\n```python\n" + CODE + "\n```\n\n"
        + "Closing words. " * 80)


@pytest.fixture(scope="module")
def beat(channel_stack: ChannelStack) -> Iterator[Proc]:
    """Beat runs the sweeper (and with it the outbox redelivery) for the tests that need it."""
    proc = channel_stack.stack.beat()
    yield proc
    proc.kill()


def reply_with(fake_llm: FakeLLM, text: str) -> None:
    fake_llm.handler = lambda body: Reply(text=text)


def insert_row(channels: ChannelStack, *, channel: str, chat: str, content: str, **fields: Any) -> str:
    row = Outbox(key=f"test:{uuid.uuid4().hex}:0", channel=channel, chat_id=chat, content=content,
                 meta={"chunk": 0, "chunks": 1}, **fields)
    with Session(get_engine(channels.database_url)) as s:
        s.add(row)
        s.commit()
        return row.id


def test_a_long_reply_arrives_in_order_in_valid_chunks(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    reply_with(fake_llm, LONG)
    for name, channel in (("telegram", TelegramChannel), ("discord", DiscordChannel)):
        d = channels.driver(name)
        chat = d.new_chat()
        channels.post(name, d.request(chat=chat, text="report please"))
        expected = channel(channels.stack.settings).chunks(LONG)
        assert len(expected) > 2
        channels.settled(chat, rows=len(expected))
        assert d.replies(chat) == expected, name
        assert channels.fakes[name].refused == []
    ops = [c.op for c in channels.fakes["discord"].sent()]
    assert ops == ["edit_original"] + ["followup"] * (len(ops) - 1)


def test_a_dead_letter_is_listed_and_resent_in_order(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    text = "First part.\n\n" + " ".join(f"word{i}" for i in range(700)) + "\n\nSecond part."
    reply_with(fake_llm, text)
    tg.script("sendMessage", 500, {"ok": False, "error_code": 500, "description": "Internal Server Error"}, times=3)
    chat = d.new_chat()
    channels.post("telegram", d.request(chat=chat, text="go"))
    channels.settled(chat, rows=2)
    failed = channels.api.get("/api/v1/outbox", params={"status": "failed"}).json()
    assert [(r["chatId"], r["meta"]["chunk"]) for r in failed] == [(chat, 1), (chat, 0)]
    first = next(r for r in failed if r["meta"]["chunk"] == 0)
    assert first["attempts"] == 3 and "HTTP 500" in first["lastError"]
    assert tg.sent(chat) == []
    r = channels.api.post(f"/api/v1/outbox/{first['id']}/retry")
    assert r.status_code == 202 and r.json()["status"] == "pending"
    channels.settled(chat, rows=2)
    assert d.replies(chat) == TelegramChannel(channels.stack.settings).chunks(text)
    assert channels.api.get("/api/v1/outbox", params={"status": "failed"}).json() == []
    assert channels.api.post(f"/api/v1/outbox/{first['id']}/retry").status_code == 409
    assert channels.api.post("/api/v1/outbox/nope/retry").status_code == 404


def test_a_refusal_is_dead_lettered_at_once(channels: ChannelStack) -> None:
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    tg.script("sendMessage", 403, {"ok": False, "error_code": 403, "description": "Forbidden: bot was blocked"})
    chat = d.new_chat()
    channels.post("telegram", d.request(chat=chat, text="hi"))
    channels.settled(chat)
    row = channels.api.get("/api/v1/outbox", params={"status": "failed"}).json()[0]
    assert row["attempts"] == 0 and "bot was blocked" in row["lastError"]
    assert len(tg.arrived(chat)) == 1


def test_concurrent_copies_of_a_delivery_task_send_once(channels: ChannelStack) -> None:
    slack = channels.fakes["slack"]
    slack.delay = 0.5
    chat = f"C{uuid.uuid4().hex[:8]}"
    row = insert_row(channels, channel="slack", chat=chat, content="only once")
    producer = Producer(make_celery(channels.stack.settings))
    for _ in range(5):
        producer.send(T_OUTBOUND_DELIVER, row)
    channels.settled(chat)
    assert [c.body["text"] for c in slack.arrived(chat)] == ["only once"]


def test_a_lost_delivery_task_is_recovered_by_the_sweeper(channels: ChannelStack, beat: Proc) -> None:
    chat = f"room-{uuid.uuid4().hex[:8]}"
    insert_row(channels, channel="webhook", chat=chat, content="nobody enqueued me")  # as if the enqueue was lost
    channels.settled(chat)
    assert channels.driver("webhook").replies(chat) == ["nobody enqueued me"]


def test_a_worker_killed_mid_send_recovers_and_feishu_shows_the_message_once(
    channels: ChannelStack, beat: Proc
) -> None:
    """SIGKILL after the platform took the request but before the row was marked delivered: the
    only window that can duplicate. The row is sent again once its claim expires; Feishu drops the
    repeat because it carries the same uuid (Telegram and Slack would show it twice)."""
    feishu, d = channels.fakes["feishu"], channels.driver("feishu")
    feishu.delay = 30.0
    chat = d.new_chat()
    channels.post("feishu", d.request(chat=chat, text="survive"))
    wait_until(lambda: feishu.arrived(chat), message="the send to reach Feishu")
    for proc in channels.stack.procs:
        if proc is not beat:
            proc.kill(signal.SIGKILL)
    feishu.delay = 0.0
    channels.stack.worker(concurrency=8)
    channels.settled(chat)
    assert len(feishu.arrived(chat)) == 2
    assert d.replies(chat) == ["echo: survive"]


@contextlib.contextmanager
def database_down(database_url: str) -> Iterator[None]:
    """Refuse new connections to the test database and drop the open ones, until the block ends."""
    url = make_url(database_url)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    name = url.database
    try:
        with admin.connect() as conn:
            conn.execute(text(f'alter database "{name}" allow_connections false'))
            conn.execute(text("select pg_terminate_backend(pid) from pg_stat_activity "
                              "where datname = :n and pid <> pg_backend_pid()"), {"n": name})
        yield
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'alter database "{name}" allow_connections true'))
        admin.dispose()
        get_engine(database_url).dispose()  # this process's pooled connections were killed above


def worker_logs(channels: ChannelStack) -> str:
    return "".join(p.log() for p in channels.stack.procs)


@pytest.mark.parametrize("outage", ["shorter than the claim", "longer than the claim"])
def test_a_database_outage_right_after_the_send_does_not_resend(
    channels: ChannelStack, beat: Proc, outage: str
) -> None:
    """Slack has no idempotency key, so a resend would show twice. The mark is retried while the
    claim lasts; past it, a marker in Redis tells the next claimant the row already went out."""
    slack = channels.fakes["slack"]
    slack.delay = 0.2  # of the 4 s claim, leave the mark about 1.5 s of retries
    chat = f"C{uuid.uuid4().hex[:8]}"
    row = insert_row(channels, channel="slack", chat=chat, content=f"once despite the outage ({outage})")
    Producer(make_celery(channels.stack.settings)).send(T_OUTBOUND_DELIVER, row)
    wait_until(lambda: slack.arrived(chat), message="the send to reach Slack")
    with database_down(channels.database_url):
        wait_until(lambda: f"outbox {row}: sent; marking it delivered failed" in worker_logs(channels),
                   message="the mark to fail")
        if outage == "longer than the claim":
            wait_until(lambda: f"outbox {row}: sent, but the database could not be told" in worker_logs(channels),
                       timeout=30, message="the worker to give up on the mark")
    channels.settled(chat)
    status = channels.scalar("select status from outbox where id = :i", i=row)
    assert (status, len(slack.arrived(chat))) == ("delivered", 1)
    marker = redis.Redis.from_url(channels.stack.settings.redis_url).exists(KEY_SENT + row)
    assert marker == (outage == "longer than the claim")  # a short outage is bridged by the retry alone
