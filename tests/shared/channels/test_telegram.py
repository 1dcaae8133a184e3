"""Telegram against the fake Bot API over real HTTP: the bot's username learned from getMe when it is
not configured (groups then answer only what is addressed to the bot), and replies whose length
Telegram counts in UTF-16 code units."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from shared.channels import telegram
from shared.channels.base import OutFile, WebhookError
from shared.channels.clients import MustAsk, may_ask
from shared.channels.telegram import TelegramChannel
from shared.settings import Settings
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.server import free_port
from tests.fakes.telegram import FakeTelegram
from tests.support.platforms import ChannelStack, llm_requests_with

BAD_GATEWAY = {"ok": False, "error_code": 502, "description": "Bad Gateway"}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeTelegram]:
    tg = FakeTelegram("4242:fake-token", "s", username="Fleet_Helper_Bot")
    tg.start()
    yield tg
    tg.server.stop()


def without_username(fake: FakeTelegram, *, api_base: str | None = None, token: str | None = None) -> TelegramChannel:
    return TelegramChannel(Settings(channels={"telegram": {
        "token": token or fake.token, "webhook_secret": fake.secret, "api_base": api_base or fake.url,
        "allow_from": ["*"]}}))


def get_mes(fake: FakeTelegram) -> int:
    with fake.lock:
        return sum(1 for c in fake.calls if c.op == "getMe")


def test_without_a_configured_username_groups_take_only_what_is_addressed_to_the_bot(fake: FakeTelegram) -> None:
    fake.reset()
    ch = without_username(fake)

    def taken(text: str, **message: object) -> list[str]:
        update = fake.update(chat=-7, sender=1, text=text, chat_type="supergroup", **message)
        return [m.content for m in ch.parse({}, json.dumps(update).encode()).messages]

    assert taken("just chatting among ourselves") == []
    assert taken("@fleet_helper_bot what time is it") == ["what time is it"]
    assert taken("/help") == ["/help"] and taken("/new@Fleet_Helper_Bot") == ["/new"]
    assert taken("/start@otherbot") == [] and taken("hello @fleet_helper_bot2") == []
    to_bot = {"text": "It is noon.", "from": {"id": 4242, "is_bot": True, "username": "Fleet_Helper_Bot"}}
    assert taken("and in Tokyo?", reply_to_message=to_bot) == ["> It is noon.\n\nand in Tokyo?"]
    to_someone = {"text": "lunch?", "from": {"id": 2, "is_bot": False, "username": "u2"}}
    assert taken("sure", reply_to_message=to_someone) == []
    assert get_mes(fake) == 1  # asked once, then remembered
    assert fake.refused == []


def test_a_private_chat_needs_no_username(fake: FakeTelegram) -> None:
    fake.reset()
    update = fake.update(chat=5, sender=1, text="hi")
    assert [m.content for m in without_username(fake).parse({}, json.dumps(update).encode()).messages] == ["hi"]
    assert get_mes(fake) == 0


def test_where_asking_is_forbidden_a_group_update_says_it_must_ask_and_a_private_one_parses(
        fake: FakeTelegram) -> None:
    """The gateway parses on its event loop with asking forbidden: a private chat's update parses there
    (no thread hop), and a group's, while the username is unknown, raises MustAsk to be parsed again in
    a thread, where getMe may block."""
    fake.reset()
    ch = without_username(fake)
    private = json.dumps(fake.update(chat=5, sender=1, text="hi")).encode()
    group = json.dumps(fake.update(chat=-7, sender=1, text="@fleet_helper_bot hi", chat_type="group")).encode()
    token = may_ask.set(False)
    try:
        assert [m.content for m in ch.parse({}, private).messages] == ["hi"]
        with pytest.raises(MustAsk):
            ch.parse({}, group)
    finally:
        may_ask.reset(token)
    assert get_mes(fake) == 0
    assert [m.content for m in ch.parse({}, group).messages] == ["hi"] and get_mes(fake) == 1


def test_when_getme_fails_the_update_is_refused_for_telegram_to_send_again(
        fake: FakeTelegram, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.reset()
    update = json.dumps(fake.update(chat=-7, sender=1, text="@fleet_helper_bot hello", chat_type="group")).encode()
    down = f"http://127.0.0.1:{free_port()}"
    for ch in (without_username(fake, api_base=down), without_username(fake, token="4242:revoked")):
        with pytest.raises(WebhookError) as err:
            ch.parse({}, update)
        assert err.value.status_code == 503 and "4242" not in err.value.message  # never the token
    ch, asked = without_username(fake), get_mes(fake)
    fake.script("getMe", 502, BAD_GATEWAY)
    with pytest.raises(WebhookError):
        ch.parse({}, update)
    with pytest.raises(WebhookError):  # not asked again at once: each update would wait for it
        ch.parse({}, update)
    assert get_mes(fake) == asked + 1
    monkeypatch.setattr(telegram, "GETME_PAUSE", 0.0)
    ch = without_username(fake)
    assert [m.content for m in ch.parse({}, update).messages] == ["hello"]  # the redelivery, getMe back


def test_a_gateway_without_bot_username_answers_mentions_only_and_503s_while_getme_fails(
    channels: ChannelStack, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(telegram, "GETME_PAUSE", 0.0)
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    settings = channels.stack.settings
    bare = settings.channels.telegram.model_copy(update={"bot_username": None})
    settings = settings.model_copy(update={"channels": settings.channels.model_copy(update={"telegram": bare})})
    group, text = "-" + d.new_chat(), f"hello-{uuid.uuid4().hex[:8]}"
    mention = tg.signed(tg.update(chat=int(group), sender=int(d.allowed), text=f"@{tg.username} {text}",
                                  chat_type="group"))
    chatter = tg.signed(tg.update(chat=int(group), sender=int(d.allowed), text=f"chatter {text}", chat_type="group"))
    tg.script("getMe", 502, BAD_GATEWAY)
    with TestClient(create_app(settings)) as client:
        r = client.post("/webhooks/telegram", content=mention[0], headers=mention[1])
        assert r.status_code == 503, r.text
        assert channels.scalar("select count(*) from inbound_events") == 0 and channels.stored(text) == 0
        assert client.post("/webhooks/telegram", content=mention[0], headers=mention[1]).status_code == 200
        assert client.post("/webhooks/telegram", content=chatter[0], headers=chatter[1]).status_code == 200
    channels.settled(group)
    assert d.replies(group) == [f"echo: {text}"]
    assert llm_requests_with(fake_llm, text) == 1  # the chatter cost nothing
    assert channels.scalar("select count(*) from messages where content like 'chatter%'") == 0
    assert sum(1 for c in tg.calls if c.op == "getMe") == 2


def test_an_emoji_heavy_long_reply_is_delivered_whole(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """Each emoji is two of Telegram's 4096 units: chunks cut by characters were refused as too long."""
    text = "\n\n".join(f"Day {n}: " + "🎉 " * 700 for n in range(4))
    fake_llm.handler = lambda body: Reply(text=text)
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat = d.new_chat()
    assert channels.post("telegram", d.request(chat=chat, text="celebrate")).status_code == 200
    expected = TelegramChannel(channels.stack.settings).chunks(text)
    channels.settled(chat, rows=len(expected))
    assert d.replies(chat) == expected and "".join(expected).count("🎉") == 2800
    assert tg.refused == []


def test_a_file_s_first_row_quotes_the_message_and_a_photo_telegram_refuses_goes_as_a_document(
        fake: FakeTelegram) -> None:
    ch, chat = without_username(fake), str(uuid.uuid4().int % 10**9)
    photo = OutFile("chart.png", "image/png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    meta = {"reply_to_message_id": 9, "message_thread_id": 3, "chunk": 0, "outbox_id": "o1"}
    fake.script("sendPhoto", 400, {"ok": False, "error_code": 400,
                                   "description": "Bad Request: PHOTO_INVALID_DIMENSIONS"})
    ch.send_file(chat, photo, meta)
    ch.send_file(chat, photo, {**meta, "chunk": 1})
    with fake.lock:
        sent = [(c.op, c.status, c.body.get("reply_parameters"), c.body.get("message_thread_id"))
                for c in fake.calls if str(c.body.get("chat_id")) == chat]
    quoted = json.dumps({"message_id": 9, "allow_sending_without_reply": True})  # JSON, as the Bot API reads it
    assert sent == [("sendPhoto", 400, quoted, "3"), ("sendDocument", 200, quoted, "3"), ("sendPhoto", 200, None, "3")]
    assert fake.received_files(chat) == [("chart.png", photo.data)] * 2


def test_a_reply_to_a_group_that_became_a_supergroup_goes_to_the_supergroup(fake: FakeTelegram) -> None:
    """Telegram refuses a message to the old group with a 400 naming the supergroup's id: the reply
    in flight was dead-lettered (a QA pass)."""
    ch, old, new = without_username(fake), "-4001", -1004001
    fake.script("sendMessage", 400, {"ok": False, "error_code": 400, "parameters": {"migrate_to_chat_id": new},
                                     "description": "Bad Request: group chat was upgraded to a supergroup chat"})
    ch.send(old, "the codeword is tea", {"reply_to_message_id": 5, "chunk": 0, "outbox_id": "o-m"})
    with fake.lock:
        sent = [(str(c.body.get("chat_id")), c.status) for c in fake.calls if c.op == "sendMessage"][-2:]
    assert sent == [(old, 400), (str(new), 200)]
    assert [fake.text_of(c) for c in fake.sent(str(new))][-1] == "the codeword is tea"


def test_a_reply_telegram_cannot_parse_goes_as_plain_text_with_its_links(fake: FakeTelegram) -> None:
    """The last resort dropped every tag, a link's URL with it: "see the docs"."""
    ch = without_username(fake)
    fake.script("sendMessage", 400, {"ok": False, "error_code": 400,
                                     "description": "Bad Request: can't parse entities: unsupported start tag"})
    [html] = ch.chunks("see [the docs](https://example.com/setup?a=1&b=2), https://example.com/x and `a<b`")
    ch.send("4002", html, {"chunk": 0, "outbox_id": "o-links"})
    [sent] = fake.sent("4002")
    assert "parse_mode" not in sent.body
    assert sent.body["text"] == "see the docs (https://example.com/setup?a=1&b=2), https://example.com/x and a<b"
