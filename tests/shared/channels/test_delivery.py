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
from shared.models import Outbox, OutboxStatus
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


def insert_row(channels: ChannelStack, *, channel: str, chat: str, content: str, key: str | None = None,
               meta: dict[str, Any] | None = None, **fields: Any) -> str:
    row = Outbox(key=key or f"test:{uuid.uuid4().hex}:0", channel=channel, chat_id=chat, content=content,
                 meta={"chunk": 0, "chunks": 1, **(meta or {})}, **fields)
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


def test_dead_letters_resent_in_the_listed_order_arrive_in_order(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """The list is newest first, so an operator retrying down it asks for the last chunk first:
    the reply restarts from its first failed chunk, and each chunk still arrives once, in order."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    text = "\n\n".join(f"Part {n}. " + " ".join(f"w{n}x{i}" for i in range(500)) for n in range(3))
    expected = TelegramChannel(channels.stack.settings).chunks(text)
    assert len(expected) == 3
    reply_with(fake_llm, text)
    tg.script("sendMessage", 200, {"ok": True, "result": {"message_id": 1}})
    tg.script("sendMessage", 403, {"ok": False, "error_code": 403, "description": "Forbidden: bot was blocked"})
    chat = d.new_chat()
    channels.post("telegram", d.request(chat=chat, text="go"))
    channels.settled(chat, rows=3)
    failed = channels.api.get("/api/v1/outbox", params={"status": "failed"}).json()
    assert [r["meta"]["chunk"] for r in failed] == [2, 1]
    codes = []
    for row in failed:
        codes.append(channels.api.post(f"/api/v1/outbox/{row['id']}/retry").status_code)
        channels.settled(chat, rows=3)
    assert codes == [202, 409]  # the first retry took the whole rest of the reply
    assert d.replies(chat) == expected


def test_a_chunk_whose_previous_chunk_failed_is_not_sent(channels: ChannelStack) -> None:
    chat, prefix = f"room-{uuid.uuid4().hex[:8]}", f"test:{uuid.uuid4().hex}"
    first = insert_row(channels, channel="webhook", chat=chat, content="one", key=f"{prefix}:0",
                       meta={"chunks": 2}, status=OutboxStatus.FAILED)
    second = insert_row(channels, channel="webhook", chat=chat, content="two", key=f"{prefix}:1",
                        meta={"chunk": 1, "chunks": 2})
    Producer(make_celery(channels.stack.settings)).send(T_OUTBOUND_DELIVER, second)
    channels.settled(chat, rows=2)
    assert channels.driver("webhook").replies(chat) == []
    assert channels.scalar("select status from outbox where id = :i", i=second) == "failed"
    assert channels.api.post(f"/api/v1/outbox/{second}/retry").status_code == 202
    channels.settled(chat, rows=2)
    assert channels.driver("webhook").replies(chat) == ["one", "two"]
    assert channels.scalar("select status from outbox where id = :i", i=first) == "delivered"


def test_a_later_reply_waits_for_an_earlier_one_still_going_out_to_its_chat(channels: ChannelStack) -> None:
    """A long reply's first chunk waited out the platform's rate limit while a later, short reply to
    the same chat went out: the short one arrived first, or between the long one's chunks (a QA pass
    on Telegram, in a private chat and in a group)."""
    chat, prefix = f"room-{uuid.uuid4().hex[:8]}", f"test:{uuid.uuid4().hex}"
    channels.fakes["webhook"].script("callback", 429, {"error": "slow down"}, headers={"Retry-After": "1"})
    first = insert_row(channels, channel="webhook", chat=chat, content="long one", key=f"{prefix}:0",
                       meta={"chunks": 2})
    insert_row(channels, channel="webhook", chat=chat, content="long two", key=f"{prefix}:1",
               meta={"chunk": 1, "chunks": 2})
    later = insert_row(channels, channel="webhook", chat=chat, content="short")
    producer = Producer(make_celery(channels.stack.settings))
    producer.send(T_OUTBOUND_DELIVER, first)
    wait_until(lambda: channels.fakes["webhook"].arrived(chat), timeout=30, message="the first send (throttled)")
    producer.send(T_OUTBOUND_DELIVER, later)
    channels.settled(chat, rows=3)
    assert channels.driver("webhook").replies(chat) == ["long one", "long two", "short"]


def test_retrying_a_row_that_is_being_sent_is_refused(channels: ChannelStack) -> None:
    slack = channels.fakes["slack"]
    slack.delay = 1.0
    chat = f"C{uuid.uuid4().hex[:8]}"
    row = insert_row(channels, channel="slack", chat=chat, content="only once")
    Producer(make_celery(channels.stack.settings)).send(T_OUTBOUND_DELIVER, row)
    wait_until(lambda: slack.arrived(chat), message="the send to reach Slack")
    r = channels.api.post(f"/api/v1/outbox/{row}/retry")
    assert r.status_code == 409 and "pending" in r.json()["detail"]
    channels.settled(chat)
    assert [c.body["text"] for c in slack.arrived(chat)] == ["only once"]


def test_a_discord_interaction_shows_its_first_reply_and_later_ones_follow(channels: ChannelStack) -> None:
    """The /ask reply replaces "thinking..."; a report that inherited the interaction's reply_meta
    (a subagent's, a cron job's, another `message` call's) follows it instead of overwriting it, and
    once the token is gone goes to the channel as a bot message."""
    discord, d = channels.fakes["discord"], channels.driver("discord")
    producer = Producer(make_celery(channels.stack.settings))
    chat = d.new_chat()
    payload = discord.command(channel=chat, user=d.allowed, text="question", interaction_id=uuid.uuid4().hex)
    channels.post("discord", discord.signed(payload))
    channels.settled(chat)
    meta = {"interaction_token": payload["token"], "application_id": discord.application_id}
    producer.send(T_OUTBOUND_DELIVER, insert_row(channels, channel="discord", chat=chat, content="report", meta=meta))
    channels.settled(chat, rows=2)
    del discord.interactions[payload["token"]]  # the token expired
    producer.send(T_OUTBOUND_DELIVER, insert_row(channels, channel="discord", chat=chat, content="later", meta=meta))
    channels.settled(chat, rows=3)
    assert [(c.op, c.body["content"]) for c in discord.sent()] == [  # sent(chat) maps calls by live tokens
        ("edit_original", "echo: question"), ("followup", "report"), ("channel_message", "later")]


def test_of_two_replies_sent_at_once_for_an_interaction_one_replaces_thinking(channels: ChannelStack) -> None:
    discord, d = channels.fakes["discord"], channels.driver("discord")
    producer = Producer(make_celery(channels.stack.settings))
    chat = d.new_chat()
    token = discord.command(channel=chat, user=d.allowed, text="q", interaction_id=uuid.uuid4().hex)["token"]
    meta = {"interaction_token": token, "application_id": discord.application_id}
    rows = [insert_row(channels, channel="discord", chat=chat, content=f"note {n}", meta=meta) for n in range(4)]
    for row in rows:
        producer.send(T_OUTBOUND_DELIVER, row)
    channels.settled(chat, rows=4)
    assert sorted(c.op for c in discord.sent(chat)) == ["edit_original"] + ["followup"] * 3


def test_throttling_is_not_a_failed_attempt_but_is_bounded(channels: ChannelStack) -> None:
    """MAX_ATTEMPTS is 3 here: five 429s in a row still deliver; a platform that never stops
    throttling dead-letters the row after ten times as many."""
    receiver = channels.fakes["webhook"]

    def throttle(times: int) -> None:
        receiver.script("callback", 429, {"error": "slow down"}, headers={"Retry-After": "0"}, times=times)

    producer = Producer(make_celery(channels.stack.settings))
    chat, stuck = f"room-{uuid.uuid4().hex[:8]}", f"room-{uuid.uuid4().hex[:8]}"
    throttle(5)
    producer.send(T_OUTBOUND_DELIVER, insert_row(channels, channel="webhook", chat=chat, content="patience"))
    channels.settled(chat)
    assert [c.status for c in receiver.arrived(chat)] == [429] * 5 + [200]
    assert channels.scalar("select attempts from outbox where chat_id = :c", c=chat) == 0
    throttle(100)
    row = insert_row(channels, channel="webhook", chat=stuck, content="never")
    producer.send(T_OUTBOUND_DELIVER, row)
    channels.settled(stuck)
    assert len(receiver.arrived(stuck)) == 30 and receiver.sent(stuck) == []
    failed = channels.api.get("/api/v1/outbox", params={"status": "failed"}).json()
    assert [(r["id"], r["attempts"]) for r in failed] == [(row, 0)] and "30 times" in failed[0]["lastError"]


def test_a_refusal_is_dead_lettered_at_once(channels: ChannelStack) -> None:
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    tg.script("sendMessage", 403, {"ok": False, "error_code": 403, "description": "Forbidden: bot was blocked"})
    chat = d.new_chat()
    channels.post("telegram", d.request(chat=chat, text="hi"))
    channels.settled(chat)
    row = channels.api.get("/api/v1/outbox", params={"status": "failed"}).json()[0]
    assert row["attempts"] == 1 and "bot was blocked" in row["lastError"]  # the one send it made
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
    # A short outage is bridged by the retry alone; past the claim, the next claimant took the marker
    # (a marker left behind would count a later resend of the row as sent: test_delivery_claims.py)
    assert not redis.Redis.from_url(channels.stack.settings.redis_url).exists(KEY_SENT + row)


def test_a_redirect_is_no_delivery_and_is_not_followed(channels: ChannelStack) -> None:
    """The webhook's callback answering 308 (http to https, a trailing slash) and WhatsApp answering 301
    left the row delivered with no error, and the user never got the reply (a QA pass). Only a 2xx is a
    delivery: the row is dead-lettered, its error naming the Location and the setting to give it in, and
    the POST is not sent on (the callback's Location here would have taken it)."""
    receiver, wa = channels.fakes["webhook"], channels.fakes["whatsapp"]
    receiver.script("callback", 308, {}, headers={"Location": receiver.callback_url + "?moved=1"})
    wa.script("messages", 301, {}, headers={"Location": f"https://graph.facebook.com/v22.0/{wa.phone_number_id}/messages"})
    room, number = f"room-{uuid.uuid4().hex[:8]}", channels.driver("whatsapp").new_chat()
    producer = Producer(make_celery(channels.stack.settings))
    for channel, chat in (("webhook", room), ("whatsapp", number)):
        producer.send(T_OUTBOUND_DELIVER, insert_row(channels, channel=channel, chat=chat, content="the answer"))
        channels.settled(chat)
    failed = {r["channel"]: (r["attempts"], r["lastError"])
              for r in channels.api.get("/api/v1/outbox", params={"status": "failed"}).json()}
    assert failed == {
        "webhook": (1, f"webhook callback: HTTP 308: redirected to {receiver.callback_url}?…: "
                       "set the final URL in NANOFLEET_CHANNELS__WEBHOOK__CALLBACK_URL"),
        "whatsapp": (1, f"whatsapp messages: HTTP 301: redirected to https://graph.facebook.com/v22.0/"
                        f"{wa.phone_number_id}/messages: set the final URL in NANOFLEET_CHANNELS__WHATSAPP__API_BASE")}
    assert [c.status for c in receiver.arrived(room)] == [308] and [c.status for c in wa.arrived(number)] == [301]
    # A 303 (See Other) is how a receiver says it took a POST and where to look: a delivery
    receiver.script("callback", 303, {}, headers={"Location": "/thanks"})
    taken = f"room-{uuid.uuid4().hex[:8]}"
    producer.send(T_OUTBOUND_DELIVER, insert_row(channels, channel="webhook", chat=taken, content="the answer"))
    channels.settled(taken)
    delivered = channels.api.get("/api/v1/outbox", params={"status": "delivered"}).json()
    assert [r["chatId"] for r in delivered if r["chatId"] == taken] == [taken]
