"""The chat platform tests' world: the six fake platforms, a stack configured to use them (one
worker per test module, the gateway on a real loopback port), and a driver per platform that
knows how to sign an event, forge one, and find the replies."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from nacl.signing import SigningKey
from sqlalchemy import text

from gateway.app import create_app
from shared.constants import KEY_PREFIX, QUEUES, REDBEAT_PREFIX
from shared.db import get_engine
from tests.fakes.discord import FakeDiscord
from tests.fakes.feishu import FakeFeishu
from tests.fakes.llm import FakeLLM
from tests.fakes.platform import FakePlatform
from tests.fakes.server import ThreadServer
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram
from tests.fakes.webhook import FakeWebhookReceiver
from tests.fakes.whatsapp import FakeWhatsApp
from tests.support import services
from tests.support.processes import wait_until
from tests.support.stack import API_KEY, Stack, clean_db, make_env

Request = tuple[bytes, dict[str, str]]
WA_POOL = [f"1555000{n:04d}" for n in range(200)]  # WhatsApp chats are senders: allow a pool of them


def tamper(req: Request) -> Request:
    raw, headers = req
    return raw.replace(b"}", b" }", 1), headers


def without(req: Request, *names: str) -> Request:
    return req[0], {k: v for k, v in req[1].items() if k not in names}


class Driver:
    """How a test talks to one platform."""

    name: str
    allowed: str
    denied: str
    accepted: dict[str, Any] = {"ok": True}  # what the webhook answers an accepted message

    def __init__(self, fake: Any) -> None:
        self.fake: Any = fake

    def new_chat(self) -> str:
        return f"chat-{uuid.uuid4().hex[:10]}"

    def request(self, *, chat: str, text: str, sender: str | None = None, event_id: str | None = None) -> Request:
        raise NotImplementedError

    def forgeries(self, chat: str, text: str) -> dict[str, Request]:
        raise NotImplementedError

    def rate_limit(self) -> None:
        self.fake.rate_limit()

    def replies(self, chat: str) -> list[str]:
        return [str(t) for t in self.fake.texts(chat)]


class TelegramDriver(Driver):
    name, allowed, denied = "telegram", "1001", "666"
    fake: FakeTelegram

    def new_chat(self) -> str:
        return str(uuid.uuid4().int % 10**9 + 10**6)

    def request(self, *, chat: str, text: str, sender: str | None = None, event_id: str | None = None) -> Request:
        update_id = int(event_id) if event_id else None
        return self.fake.signed(self.fake.update(chat=int(chat), sender=int(sender or self.allowed), text=text,
                                                 update_id=update_id))

    def forgeries(self, chat: str, text: str) -> dict[str, Request]:
        payload = self.fake.update(chat=int(chat), sender=int(self.allowed), text=text)
        good = self.fake.signed(payload)
        return {"wrong secret": self.fake.signed(payload, secret="not-the-secret"),
                "no secret header": without(good, "X-Telegram-Bot-Api-Secret-Token")}


class SlackDriver(Driver):
    name, allowed, denied = "slack", "UALLOWED", "UDENIED"
    fake: FakeSlack

    def request(self, *, chat: str, text: str, sender: str | None = None, event_id: str | None = None) -> Request:
        return self.fake.signed(self.fake.event(channel=chat, user=sender or self.allowed, text=f"<@UBOT0001> {text}",
                                                event_id=event_id or f"Ev{uuid.uuid4().hex[:10]}"))

    def forgeries(self, chat: str, text: str) -> dict[str, Request]:
        payload = self.fake.event(channel=chat, user=self.allowed, text=text, event_id=f"Ev{uuid.uuid4().hex[:10]}")
        good = self.fake.signed(payload)
        return {"wrong secret": self.fake.signed(payload, secret="not-the-secret"),
                "stale timestamp": self.fake.signed(payload, timestamp=int(good[1]["X-Slack-Request-Timestamp"]) - 600),
                "body changed": tamper(good), "no signature": without(good, "X-Slack-Signature")}


class WhatsAppDriver(Driver):
    name, allowed, denied = "whatsapp", WA_POOL[0], "15559999999"
    fake: FakeWhatsApp
    _pool = itertools.cycle(WA_POOL)

    def new_chat(self) -> str:
        return next(self._pool)

    def request(self, *, chat: str, text: str, sender: str | None = None, event_id: str | None = None) -> Request:
        return self.fake.signed(self.fake.event(sender=sender or chat, text=text,
                                                wamid=event_id or f"wamid.{uuid.uuid4().hex}"))

    def forgeries(self, chat: str, text: str) -> dict[str, Request]:
        payload = self.fake.event(sender=chat, text=text, wamid=f"wamid.{uuid.uuid4().hex}")
        good = self.fake.signed(payload)
        return {"wrong secret": self.fake.signed(payload, secret="not-the-secret"), "body changed": tamper(good),
                "no signature": without(good, "X-Hub-Signature-256")}


class FeishuDriver(Driver):
    name, allowed, denied = "feishu", "ou_allowed", "ou_denied"
    fake: FakeFeishu

    def new_chat(self) -> str:
        return f"oc_{uuid.uuid4().hex[:12]}"

    def request(self, *, chat: str, text: str, sender: str | None = None, event_id: str | None = None) -> Request:
        return self.fake.signed(self.fake.event(chat=chat, sender=sender or self.allowed, text=text,
                                                event_id=event_id or uuid.uuid4().hex))

    def forgeries(self, chat: str, text: str) -> dict[str, Request]:
        payload = self.fake.event(chat=chat, sender=self.allowed, text=text, event_id=uuid.uuid4().hex)
        good = self.fake.signed(payload)
        wrong_token = {**payload, "header": {**payload["header"], "token": "not-the-token"}}
        return {"encrypted with another key": self.fake.signed(payload, key="another-key-entirely"),
                "stale timestamp": self.fake.signed(payload, timestamp=int(good[1]["X-Lark-Request-Timestamp"]) - 600),
                "body changed": tamper(good), "unsigned": self.fake.signed(payload, signed=False),
                "wrong verification token": self.fake.signed(wrong_token),
                "forged signature": (good[0], {**good[1], "X-Lark-Signature": "0" * 64})}


class DiscordDriver(Driver):
    name, allowed, denied = "discord", "1001", "666"
    fake: FakeDiscord
    accepted = {"type": 5}

    def new_chat(self) -> str:
        return str(uuid.uuid4().int % 10**17 + 10**17)

    def request(self, *, chat: str, text: str, sender: str | None = None, event_id: str | None = None) -> Request:
        return self.fake.signed(self.fake.command(channel=chat, user=sender or self.allowed, text=text,
                                                  interaction_id=event_id or uuid.uuid4().hex))

    def forgeries(self, chat: str, text: str) -> dict[str, Request]:
        payload = self.fake.command(channel=chat, user=self.allowed, text=text, interaction_id=uuid.uuid4().hex)
        good = self.fake.signed(payload)
        return {"signed with another key": self.fake.signed(payload, key=SigningKey.generate()),
                "stale timestamp": self.fake.signed(payload, timestamp=int(good[1]["X-Signature-Timestamp"]) - 600),
                "body changed": tamper(good), "no signature": without(good, "X-Signature-Ed25519")}


class WebhookDriver(Driver):
    name, allowed, denied = "webhook", "alice", "mallory"
    fake: FakeWebhookReceiver

    def request(self, *, chat: str, text: str, sender: str | None = None, event_id: str | None = None) -> Request:
        return self.fake.signed(self.fake.message(chat=chat, sender=sender or self.allowed, text=text,
                                                  event_id=event_id or uuid.uuid4().hex))

    def forgeries(self, chat: str, text: str) -> dict[str, Request]:
        payload = self.fake.message(chat=chat, sender=self.allowed, text=text, event_id=uuid.uuid4().hex)
        good = self.fake.signed(payload)
        return {"wrong secret": self.fake.signed(payload, secret="not-the-secret"),
                "stale timestamp": self.fake.signed(payload, timestamp=int(good[1]["X-Nanofleet-Timestamp"]) - 600),
                "body changed": tamper(good), "no signature": without(good, "X-Nanofleet-Signature")}


def make_fakes() -> dict[str, FakePlatform]:
    return {
        "telegram": FakeTelegram("123456:test-bot-token", "tg-webhook-secret"),
        "slack": FakeSlack("xoxb-test-token", "slack-signing-secret"),
        "whatsapp": FakeWhatsApp("wa-access-token", "wa-app-secret", "PHONE1"),
        "feishu": FakeFeishu("cli_test", "feishu-app-secret", "feishu-verification", "feishu-encrypt-key"),
        "discord": FakeDiscord("APP1", "discord-bot-token"),
        "webhook": FakeWebhookReceiver("webhook-shared-secret"),
    }


DRIVERS: dict[str, type[Driver]] = {
    "telegram": TelegramDriver, "slack": SlackDriver, "whatsapp": WhatsAppDriver,
    "feishu": FeishuDriver, "discord": DiscordDriver, "webhook": WebhookDriver,
}


def channel_env(fakes: dict[str, Any]) -> dict[str, str]:
    """NANOFLEET_CHANNELS__* for a stack that talks to the fakes."""
    tg, sl, wa, fs, dc, wh = (fakes[n] for n in DRIVERS)
    env = {
        "TELEGRAM__TOKEN": tg.token, "TELEGRAM__WEBHOOK_SECRET": tg.secret, "TELEGRAM__API_BASE": tg.url,
        "TELEGRAM__BOT_USERNAME": "nanofleet_bot",
        "SLACK__BOT_TOKEN": sl.bot_token, "SLACK__SIGNING_SECRET": sl.signing_secret, "SLACK__API_BASE": sl.url,
        "WHATSAPP__ACCESS_TOKEN": wa.access_token, "WHATSAPP__APP_SECRET": wa.app_secret,
        "WHATSAPP__VERIFY_TOKEN": "wa-verify-token", "WHATSAPP__PHONE_NUMBER_ID": wa.phone_number_id,
        "WHATSAPP__API_BASE": wa.url, "WHATSAPP__ALLOW_FROM": json.dumps(WA_POOL),
        "FEISHU__APP_ID": fs.app_id, "FEISHU__APP_SECRET": fs.app_secret, "FEISHU__API_BASE": fs.url,
        "FEISHU__VERIFICATION_TOKEN": fs.verification_token, "FEISHU__ENCRYPT_KEY": fs.encrypt_key,
        "DISCORD__APPLICATION_ID": dc.application_id, "DISCORD__PUBLIC_KEY": dc.public_key,
        "DISCORD__BOT_TOKEN": dc.bot_token, "DISCORD__API_BASE": dc.url,
        "WEBHOOK__SECRET": wh.secret, "WEBHOOK__CALLBACK_URL": wh.callback_url,
        "DELIVERY__SEND_TIMEOUT": "3", "DELIVERY__CLAIM_SECONDS": "4", "DELIVERY__MAX_ATTEMPTS": "3",
        "DELIVERY__RETRY_BASE_DELAY": "0.05", "DELIVERY__RETRY_MAX_DELAY": "0.2", "DELIVERY__REDELIVER_AFTER": "1",
    }
    for name, driver in DRIVERS.items():
        if name != "whatsapp":
            env[f"{name.upper()}__ALLOW_FROM"] = json.dumps([driver.allowed])
    return {f"CHANNELS__{k}": v for k, v in env.items()}


@dataclass
class ChannelStack:
    """A stack wired to the fake platforms, with its gateway reachable over HTTP."""

    stack: Stack
    fakes: dict[str, Any]
    http: httpx.Client
    api: httpx.Client
    database_url: str

    def driver(self, name: str) -> Driver:
        return DRIVERS[name](self.fakes[name])

    def post(self, name: str, req: Request) -> httpx.Response:
        return self.http.post(f"/webhooks/{name}", content=req[0], headers=req[1])

    def scalar(self, sql: str, **params: Any) -> Any:
        with get_engine(self.database_url).connect() as conn:
            return conn.execute(text(sql), params).scalar()

    def stored(self, marker: str) -> int:
        """Messages, events and outbox rows that mention `marker` (all zero: nothing was stored)."""
        return int(self.scalar("select count(*) from messages where content like :m", m=f"%{marker}%")) + int(
            self.scalar("select count(*) from outbox where content like :m", m=f"%{marker}%"))

    def settled(self, chat: str, *, rows: int = 1, timeout: float = 30) -> None:
        """Wait until the chat's runs ended and at least `rows` of its outbox rows left pending."""
        def done() -> bool:
            active = self.scalar("select count(*) from runs r join conversations c on c.id = r.conversation_id "
                                 "where c.chat_id = :c and r.status in ('queued', 'running')", c=chat)
            left = self.scalar("select count(*) from outbox where chat_id = :c and status <> 'pending'", c=chat)
            pending = self.scalar("select count(*) from outbox where chat_id = :c and status = 'pending'", c=chat)
            return bool(active == 0 and left >= rows and pending == 0)
        wait_until(done, timeout=timeout, message=f"chat {chat} to settle")


def llm_requests_with(fake_llm: FakeLLM, marker: str) -> int:
    with fake_llm.lock:
        return sum(1 for r in fake_llm.requests
                   if any(marker in str(m.get("content")) for m in r.get("messages", []) if m.get("role") == "user"))


@pytest.fixture(scope="module")
def channel_stack(database_url: str, redis_server: str, fake_llm: FakeLLM,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChannelStack]:
    with started_channel_stack(database_url, redis_server, fake_llm, tmp_path_factory.mktemp("channels")) as stack:
        yield stack


@contextmanager
def started_channel_stack(database_url: str, redis_server: str, fake_llm: FakeLLM, log_dir: Path,
                          **extra: str) -> Iterator[ChannelStack]:
    """The fake platforms, a gateway in-process and a worker, with `extra` settings (NANOFLEET_ left off)."""
    fakes = make_fakes()
    for fake in fakes.values():
        fake.start()
    (log_dir / "workspace").mkdir()
    with services.claimed_redis_dbs(redis_server, 1) as (db,):
        clean_db(database_url)
        stack = Stack(make_env(database_url=database_url, redis_url=f"{redis_server}/{db}", llm_url=fake_llm.url,
                               workspace=log_dir / "workspace", **channel_env(fakes), **extra), log_dir)
        gateway = ThreadServer(create_app(stack.settings)).start()
        headers = {"Authorization": f"Bearer {API_KEY}"}
        with httpx.Client(base_url=gateway.url, timeout=30) as client, \
                httpx.Client(base_url=gateway.url, timeout=30, headers=headers) as api:
            stack.worker(concurrency=8)
            yield ChannelStack(stack, fakes, client, api, database_url)
        stack.stop()
    servers = [gateway, *(fake.server for fake in fakes.values())]
    for server in servers:
        server.server.should_exit = True
    for server in servers:
        server.stop()


def clean_redis_but_beat(url: str) -> None:
    """Like tests.support.stack.clean_redis, but a module's beat keeps its redbeat lock."""
    client = redis.Redis.from_url(url)
    keys = [k for k in client.scan_iter(count=1000)
            if (k.startswith(KEY_PREFIX.encode()) and not k.startswith(REDBEAT_PREFIX.encode()))
            or k in (b"unacked", b"unacked_index") or k.decode() in QUEUES]
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def channels(channel_stack: ChannelStack, fake_llm: FakeLLM) -> ChannelStack:
    """The module's stack, clean: empty tables and Redis, fakes and the fake LLM reset."""
    clean_db(channel_stack.database_url)
    clean_redis_but_beat(channel_stack.stack.env["NANOFLEET_REDIS_URL"])
    for fake in channel_stack.fakes.values():
        fake.reset()
    fake_llm.reset()
    return channel_stack
