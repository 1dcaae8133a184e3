"""Feishu against the fake Open API over real HTTP: in groups only a mention of the bot (its open_id
learned from bot/v3/info) is for the bot, and only the bot's mention is dropped from the text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from shared.channels import feishu, feishu_crypto
from shared.channels.base import MAX_IMAGES, Rejected, WebhookError
from shared.channels.feishu import FeishuChannel
from shared.settings import Settings
from tests.fakes.feishu import FakeFeishu
from tests.fakes.server import free_port

BOB = "ou_bob"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeFeishu]:
    fs = FakeFeishu("cli_unit", "unit-secret", "unit-verification", "unit-encrypt-key", bot_open_id="ou_bot_unit")
    fs.start()
    yield fs
    fs.server.stop()


@pytest.fixture
def channel(fake: FakeFeishu, redis_url: str) -> FeishuChannel:
    fake.reset()
    return on(fake, redis_url)


def on(fake: FakeFeishu, redis_url: str, *, api_base: str | None = None) -> FeishuChannel:
    return FeishuChannel(Settings(redis_url=redis_url, channels={"feishu": {
        "app_id": fake.app_id, "app_secret": fake.app_secret, "verification_token": fake.verification_token,
        "encrypt_key": fake.encrypt_key, "api_base": api_base or fake.url, "allow_from": ["*"]}}))


def taken(ch: FeishuChannel, fake: FakeFeishu, text: str, *mentions: dict[str, Any],
          chat_type: str = "group") -> list[str]:
    event = fake.event(chat="oc_1", sender="ou_1", text=text, event_id="ev", chat_type=chat_type,
                       mentions=list(mentions))
    return [m.content for m in ch.parse({}, fake.signed(event)[0]).messages]


def test_a_group_message_is_for_the_bot_only_when_it_mentions_the_bot(channel: FeishuChannel,
                                                                       fake: FakeFeishu) -> None:
    bot, bob = fake.mention(1), fake.mention(1, open_id=BOB, name="Bob")
    assert taken(channel, fake, "@_user_1 can you review this?", bob) == []  # for Bob, not for us
    assert taken(channel, fake, "no mention at all") == []
    assert taken(channel, fake, "@_user_1 do it", bot) == ["do it"]
    bob2 = fake.mention(2, open_id=BOB, name="Bob")
    assert taken(channel, fake, "@_user_1 ask @_user_2 about it", bot, bob2) == ["ask @Bob about it"]
    assert taken(channel, fake, "@_user_1 @_user_2 what do you think?", bob, fake.mention(2)) == \
        ["@Bob what do you think?"]  # Bob is named first, the bot second: only the bot's mention goes
    assert taken(channel, fake, "thanks @_user_2 for this", bob, fake.mention(2)) == ["thanks for this"]
    many = [fake.mention(1), *(fake.mention(n, open_id=f"ou_p{n}", name=f"P{n}") for n in (2, 10))]
    assert taken(channel, fake, "@_user_1 ask @_user_10, @_user_2", *many) == ["ask @P10, @P2"]
    assert fake.bot_info_calls() == 1  # asked once, then remembered
    assert fake.refused == []


def test_a_private_chat_needs_no_bot_info(channel: FeishuChannel, fake: FakeFeishu) -> None:
    assert taken(channel, fake, "hello", chat_type="p2p") == ["hello"]
    assert fake.bot_info_calls() == 0 and channel.bot_open_id(ask=False) == ""


def test_a_private_chat_that_mentions_the_bot_reads_without_it(channel: FeishuChannel, fake: FakeFeishu) -> None:
    assert taken(channel, fake, "@_user_1 hello", fake.mention(1), chat_type="p2p") == ["hello"]
    assert taken(channel, fake, "ask @_user_1", fake.mention(1, open_id=BOB, name="Bob"), chat_type="p2p") == \
        ["ask @Bob"]
    assert fake.bot_info_calls() == 1


def test_bot_info_with_a_token_feishu_calls_invalid_fetches_a_fresh_one(channel: FeishuChannel,
                                                                        fake: FakeFeishu) -> None:
    channel.tenant_token()  # cached in Redis, then revoked: the next call is refused once
    fake.revoke_tokens()
    assert taken(channel, fake, "@_user_1 hi", fake.mention(1)) == ["hi"]
    assert [c.status for c in fake.calls if c.op == "bot.info"] == [400, 200]
    assert channel.bot_open_id(ask=False)


def test_when_bot_info_fails_the_event_is_refused_for_feishu_to_send_again(
        channel: FeishuChannel, fake: FakeFeishu, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    event = fake.event(chat="oc_1", sender="ou_1", text="@_user_1 hello", event_id="ev", chat_type="group",
                       mentions=[fake.mention(1)])
    raw = fake.signed(event)[0]
    with pytest.raises(WebhookError) as err:
        on(fake, redis_url, api_base=f"http://127.0.0.1:{free_port()}").parse({}, raw)
    assert err.value.status_code == 503
    fake.script("bot.info", 500, {"code": 1, "msg": "internal error"})
    for _ in range(2):  # not asked again at once: each event would wait for it
        with pytest.raises(WebhookError) as err:
            channel.parse({}, raw)
        assert err.value.status_code == 503 and fake.app_secret not in err.value.message
    assert fake.bot_info_calls() == 1
    monkeypatch.setattr(feishu, "BOT_INFO_PAUSE", 0.0)
    ch = on(fake, redis_url)
    assert [m.content for m in ch.parse({}, raw).messages] == ["hello"]  # Feishu's resend, bot info back


def test_a_rich_text_post_is_read_as_text_with_its_links_code_and_photos(channel: FeishuChannel,
                                                                         fake: FakeFeishu) -> None:
    paragraphs = [
        [{"tag": "at", "user_id": "@_user_1", "user_name": "bot"}, {"tag": "text", "text": " please read "},
         {"tag": "a", "text": "the spec", "href": "https://example.com/spec"}, {"tag": "text", "text": " and "},
         {"tag": "at", "user_id": "@_user_2", "user_name": "Bob"}, {"tag": "emotion", "emoji_type": "SMILE"}],
        [{"tag": "code_block", "language": "PYTHON", "text": "print(1)\n"}],
        [{"tag": "hr"}],
        [{"tag": "a", "text": "https://example.com", "href": "https://example.com"}],
        [{"tag": "media", "file_key": "f", "image_key": "i"}],
    ]
    mentions = [fake.mention(1), fake.mention(2, open_id=BOB, name="Bob")]
    images = tuple(b"photo %d" % n for n in range(MAX_IMAGES + 1))
    event = fake.post(chat="oc_1", sender="ou_1", event_id="ev", title="Review", paragraphs=paragraphs,
                      images=images, chat_type="group", mentions=mentions)
    [msg] = channel.parse({}, fake.signed(event)[0]).messages
    assert msg.content == ("Review\nplease read [the spec](https://example.com/spec) and @Bob[SMILE]\n"
                           "\n```python\nprint(1)\n```\n\n\n---\n\nhttps://example.com\n[a video]")
    message_id = msg.reply_meta["message_id"]
    keys = [k for (m, k) in fake.resources if m == message_id]
    assert [msg.media, *msg.more_media] == [{"kind": "photo", "id": k, "message": message_id}
                                           for k in keys[:MAX_IMAGES]]  # the fifth passed over
    assert msg.unsupported is None and msg.group


def test_a_post_in_a_group_is_for_the_bot_only_when_it_mentions_the_bot(channel: FeishuChannel,
                                                                        fake: FakeFeishu) -> None:
    def parsed(paragraphs: list[list[dict[str, Any]]], *mentions: dict[str, Any],
               chat_type: str = "group", images: tuple[bytes, ...] = ()) -> list[Any]:
        event = fake.post(chat="oc_1", sender="ou_1", event_id="ev", paragraphs=paragraphs, images=images,
                          chat_type=chat_type, mentions=list(mentions))
        return channel.parse({}, fake.signed(event)[0]).messages

    at_bob = [[{"tag": "at", "user_id": "@_user_1", "user_name": "Bob"}, {"tag": "text", "text": " hi"}]]
    assert parsed(at_bob, fake.mention(1, open_id=BOB, name="Bob")) == []
    assert parsed([[{"tag": "text", "text": "no mention"}]]) == []
    [photo_only] = parsed([[{"tag": "at", "user_id": "@_user_1"}]], fake.mention(1), images=(b"x",))
    assert (photo_only.content, photo_only.unsupported, photo_only.more_media) == ("", "a photo", [])
    assert parsed([], chat_type="p2p") == []  # an empty post: nothing to answer
    [private] = parsed([[{"tag": "text", "text": "hello"}]], chat_type="p2p")
    assert private.content == "hello" and not private.group


def test_a_post_in_a_language_as_the_send_api_writes_it_is_read_too(channel: FeishuChannel,
                                                                    fake: FakeFeishu) -> None:
    event = fake.event(chat="oc_1", sender="ou_1", text="", event_id="ev", chat_type="p2p")
    event["event"]["message"].update(message_type="post", content=json.dumps(
        {"en_us": {"title": "", "content": [[{"tag": "text", "text": "hi"}], [{"tag": "md", "text": "**b**"}]]}}))
    assert [m.content for m in channel.parse({}, fake.signed(event)[0]).messages] == ["hi\n**b**"]
    event["event"]["message"]["content"] = '{"en_us": 3}'
    with pytest.raises(WebhookError) as err:
        channel.parse({}, fake.signed(event)[0])
    assert err.value.status_code == 400 and "post content" in err.value.message


def test_content_that_is_no_json_object_is_read_as_nothing(channel: FeishuChannel, fake: FakeFeishu) -> None:
    for kind, content in (("image", {"image_key": "k"}), ("image", "[" * 100_000 + "]" * 100_000),
                          ("post", "[" * 100_000 + "]" * 100_000), ("post", '["a"]')):
        event = fake.event(chat="oc_1", sender="ou_1", text="", event_id="ev", chat_type="p2p")
        event["event"]["message"].update(message_type=kind, content=content)
        if kind == "image":  # a notice that it was not read
            [told] = channel.parse({}, fake.signed(event)[0]).messages
            assert (told.unsupported, told.media) == ("a photo", None)
        else:
            with pytest.raises(WebhookError) as err:
                channel.parse({}, fake.signed(event)[0])
            assert err.value.status_code == 400


def test_a_reply_whose_post_feishu_refuses_for_its_content_goes_as_text(channel: FeishuChannel,
                                                                         fake: FakeFeishu) -> None:
    fake.refuse_posts = True  # 400, code 230001: as Feishu answers a post it cannot read
    assert channel.send("oc_content", "**bold**", {"outbox_id": "content-1"}).platform_message_id
    assert [c.body["msg_type"] for c in fake.sent("oc_content")] == ["text"]


def test_a_token_failure_is_no_reason_to_send_a_reply_as_text(channel: FeishuChannel, fake: FakeFeishu,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """The QA repro: the cached token revoked, and a fresh one refused once. The send fails (the outbox
    retries or dead-letters it) rather than deliver the reply as text, its markdown shown as written."""
    channel.tenant_token()
    fake.revoke_tokens()
    fake.script("tenant_access_token", 400, {"code": 10003, "msg": "invalid param"})
    with pytest.raises(Rejected, match="tenant_access_token"):
        channel.send("oc_token", "**bold**", {"outbox_id": "token-1"})
    assert [c.body["msg_type"] for c in fake.arrived("oc_token")] == ["post"]  # (refused: token invalid)
    assert "as text" not in caplog.text
    channel.send("oc_token", "**bold**", {"outbox_id": "token-1"})  # the outbox's retry, the token back
    assert [c.body["msg_type"] for c in fake.sent("oc_token")] == ["post"]


@pytest.mark.parametrize(("code", "msg"), [(230002, "Bot/User can NOT be out of the chat."),
                                           (230027, "Lack of necessary permissions."),
                                           (230006, "Bot ability is not activated."),
                                           (99991672, "Access denied. One of the following scopes is required")])
def test_a_refusal_of_the_bot_or_its_permissions_fails_the_reply_as_it_is(
        channel: FeishuChannel, fake: FakeFeishu, code: int, msg: str) -> None:
    fake.script("im.message.create", 400, {"code": code, "msg": msg})
    with pytest.raises(Rejected, match=str(code)):
        channel.send("oc_denied", "**bold**", {"outbox_id": f"denied-{code}"})
    assert [c.body["msg_type"] for c in fake.arrived("oc_denied")] == ["post"]  # no text after it


def test_an_encrypted_event_without_an_encrypt_key_is_refused_naming_the_setting(
        fake: FakeFeishu, redis_url: str, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """It was "bad verification token", sending the operator to check a token that is right (and that
    cannot be read without the key). Logged once, not once per event Feishu sends and sends again."""
    monkeypatch.setattr(feishu_crypto, "_warned_at", None)
    keyless = FeishuChannel(Settings(redis_url=redis_url, channels={"feishu": {
        "app_id": fake.app_id, "app_secret": fake.app_secret, "verification_token": fake.verification_token,
        "api_base": fake.url, "allow_from": ["*"]}}))
    event = fake.event(chat="oc_1", sender="ou_1", text="hello", event_id="ev-keyless")
    challenge = {"challenge": "ch-1", "token": fake.verification_token, "type": "url_verification"}
    for raw, headers in (fake.signed(event), fake.signed(event), fake.signed(challenge, signed=False)):
        with pytest.raises(WebhookError) as err:
            keyless.verify({k.lower(): v for k, v in headers.items()}, raw)
        assert err.value.status_code == 401
        assert "encrypted" in err.value.message and "NANOFLEET_CHANNELS__FEISHU__ENCRYPT_KEY" in err.value.message
        assert "verification token" not in err.value.message
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "ENCRYPT_KEY" in r.getMessage()]
    assert len(warnings) == 1
    keyless.verify({}, json.dumps(event).encode())  # a plain event still passes on its verification token
    assert [m.content for m in keyless.parse({}, json.dumps(event).encode()).messages] == ["hello"]
