"""What people send besides text, photos, files and voice, as each platform sends it (parsed by the
channel, in-process): a tapped button, a dice roll, a GIF, a video under a caption, forwarded chat
history. Each used to be dropped without a word, or read as if the model had seen the video."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from shared.channels.feishu import FeishuChannel
from shared.channels.telegram import TelegramChannel
from shared.channels.whatsapp import WhatsAppChannel
from shared.settings import Settings
from tests.fakes.feishu import FakeFeishu
from tests.fakes.telegram import FakeTelegram
from tests.fakes.whatsapp import FakeWhatsApp

S = Settings(channels={"telegram": {"bot_username": "nanofleet_bot"}, "feishu": {"encrypt_key": "k"},
                       "whatsapp": {"phone_number_id": "P1"}})
UNSEEN_VIDEO = "[The user sent a video with this message; you cannot see it.]\n"


def body(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload).encode()


def whatsapp(kind: str, part: dict[str, Any]) -> dict[str, Any]:
    event = FakeWhatsApp("t", "s", "P1").event(sender="155501", text="", wamid=f"wamid.{kind}")
    message = event["entry"][0]["changes"][0]["value"]["messages"][0]
    del message["text"]
    message.update({"type": kind, kind: part})
    return event


def test_whatsapp_buttons_and_list_items_tapped_are_their_words() -> None:
    ch = WhatsAppChannel(S)
    taps = [whatsapp("button", {"text": "Yes, book it", "payload": "BOOK"}),
            whatsapp("interactive", {"type": "button_reply", "button_reply": {"id": "b1", "title": "Tomorrow"}}),
            whatsapp("interactive", {"type": "list_reply", "list_reply": {"id": "l2", "title": "Paris",
                                                                          "description": "CDG"}})]
    assert [ch.parse({}, body(t)).messages[0].content for t in taps] == ["Yes, book it", "Tomorrow", "Paris"]
    [told] = ch.parse({}, body(whatsapp("unsupported", {}))).messages  # (a poll: the Cloud API passes on nothing)
    assert (told.content, told.unsupported) == ("", "that kind of message")
    [video] = ch.parse({}, body(whatsapp("video", {"id": "v1", "caption": "what happens here?"}))).messages
    assert (video.content, video.media, video.unsupported) == (UNSEEN_VIDEO + "what happens here?", None, None)


def test_telegram_dice_gifs_and_captioned_videos() -> None:
    tg, ch = FakeTelegram("1:t", "s"), TelegramChannel(S)
    [rolled] = ch.parse({}, body(tg.update(chat=5, sender=1, text="", dice={"emoji": "🎲", "value": 4}))).messages
    assert rolled.content == "[The user rolled 🎲: 4]"
    gif = tg.update(chat=5, sender=1, text="", animation={"file_id": "a"},
                    document={"file_id": "a", "mime_type": "video/mp4"})
    [told] = ch.parse({}, body(gif)).messages
    assert (told.unsupported, told.media) == ("a GIF", None)
    for kind in ("video", "animation"):
        captioned = tg.update(chat=5, sender=1, text="", caption="what happens here?", **{kind: {"file_id": "v"}})
        [msg] = ch.parse({}, body(captioned)).messages
        what = "a video" if kind == "video" else "a GIF"
        assert msg.content == f"[The user sent {what} with this message; you cannot see it.]\nwhat happens here?"


def test_a_telegram_group_email_address_or_domain_with_the_bot_s_name_is_no_mention() -> None:
    tg, ch = FakeTelegram("1:t", "s"), TelegramChannel(S)

    def taken(text: str) -> list[str]:
        update = tg.update(chat=-7, sender=1, text=text, chat_type="supergroup")
        return [m.content for m in ch.parse({}, body(update)).messages]

    assert taken("email me at ann@nanofleet_bot.example.com") == []
    assert taken("see @nanofleet_bot.example.com") == []
    assert taken("(@NanoFleet_Bot) what now?") == ["() what now?"]
    assert taken("what now, @nanofleet_bot.") == ["what now, ."]


def test_feishu_other_kinds_in_a_private_chat_get_a_notice_and_system_messages_nothing() -> None:
    fs, ch = FakeFeishu("cli", "s", "tok", "k"), FeishuChannel(S)

    def sent(kind: str) -> list[str | None]:
        event = fs.event(chat="oc_1", sender="ou_1", text="x", event_id=f"ev-{kind}")
        event["event"]["message"].update(message_type=kind, content="{}")
        return [m.unsupported for m in ch.parse({}, fs.signed(event)[0]).messages]

    assert sent("merge_forward") == ["forwarded chat history"]
    assert sent("share_chat") == ["a shared group"]
    assert sent("hongbao") == ["that kind of message"]
    assert sent("system") == []


def test_a_whatsapp_message_of_a_type_not_read_gets_the_notice_and_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    """An order, an interactive message other than a tapped button or list item, or a type Meta added
    later got no answer and no log line (a QA pass): each gets the "that kind of message" notice, logged
    at INFO; a reaction, a system message or someone opening the chat still gets nothing."""
    ch = WhatsAppChannel(S)

    def told(kind: str, part: dict[str, Any]) -> list[str | None]:
        return [m.unsupported for m in ch.parse({}, body(whatsapp(kind, part))).messages]

    other = ["that kind of message"]
    with caplog.at_level(logging.INFO, logger="shared.channels.whatsapp"):
        assert told("order", {"catalog_id": "c1", "product_items": [{"product_retailer_id": "p1", "quantity": 2}]}) \
            == other
        assert told("interactive", {"type": "nfm_reply", "nfm_reply": {"response_json": "{}"}}) == other
        assert told("hologram", {"id": "h1"}) == other  # whatever Meta adds next
        assert told("reaction", {"message_id": "wamid.earlier", "emoji": "👍"}) == []
        assert told("system", {"body": "Ann changed her number", "type": "user_changed_number"}) == []
        assert told("request_welcome", {}) == []
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(logged) == 3
    assert all(f"wamid.{kind} is of type {kind!r}" in line for kind, line in zip(("order", "interactive", "hologram"),
                                                                                  logged, strict=True))
