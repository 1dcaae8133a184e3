"""Parsing and normalising each platform's events into InboundMessage (no network, no database)."""

from __future__ import annotations

import json
import logging
import time

import pytest

from shared.channels.albums import BURST
from shared.channels.base import MAX_IMAGE, WebhookError
from shared.channels.discord import NOT_OUR_COMMAND, NOT_OURS, DiscordChannel
from shared.channels.feishu import FeishuChannel, decrypt
from shared.channels.slack import SlackChannel
from shared.channels.telegram import TelegramChannel
from shared.channels.webhook import WebhookChannel
from shared.channels.whatsapp import WhatsAppChannel
from shared.settings import Settings, SettingsError, load_settings
from tests.fakes.discord import FakeDiscord
from tests.fakes.feishu import FakeFeishu, encrypt
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram
from tests.fakes.whatsapp import FakeWhatsApp

S = Settings(channels={
    "telegram": {"bot_username": "nanofleet_bot", "allow_from": ["1"]},
    "feishu": {"encrypt_key": "k", "allow_from": ["*"]},
    "whatsapp": {"verify_token": "vt", "phone_number_id": "P1"},
})


def body(payload: object) -> bytes:
    return json.dumps(payload).encode()


def malformed(parse: object, payload: object) -> int:
    with pytest.raises(WebhookError) as err:
        parse({}, body(payload))  # type: ignore[operator]
    return err.value.status_code


def test_a_telegram_command_is_a_command_as_a_reply_and_addressed_in_a_private_chat() -> None:
    """`/stop` sent as a reply to the bot went to the model quoted ("> echo: hi\n\n/stop"), and the
    turn ran on; `/stop@bot` in a private chat went to the model while the bot's username was not
    known yet (none configured, no group message seen)."""
    tg, ch = FakeTelegram("1:t", "s"), TelegramChannel(S)
    reply = tg.update(chat=5, sender=1, text="/stop", reply_to_message={"text": "echo: hi"})
    assert ch.parse({}, body(reply)).messages[0].content == "/stop"
    unnamed = TelegramChannel(Settings(channels={"telegram": {"allow_from": ["1"]}}))
    for text, seen in (("/stop@nanofleet_bot", "/stop"), ("/model@nanofleet_bot fast", "/model fast"),
                       ("mail me@example.com", "mail me@example.com")):
        assert unnamed.parse({}, body(tg.update(chat=5, sender=1, text=text))).messages[0].content == seen


def test_a_telegram_message_of_a_kind_not_read_gets_the_notice_and_service_ones_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    """A story, a game or paid media got no answer at all in a private chat, as did any kind the Bot
    API adds; what Telegram itself writes there still gets none."""
    tg, ch = FakeTelegram("1:t", "s"), TelegramChannel(S)
    told = []
    with caplog.at_level(logging.INFO, logger="shared.channels.telegram"):
        for key in ("story", "game", "paid_media", "a_kind_from_2027"):
            update = tg.update(chat=5, sender=1, text="", **{key: {"id": 3}})
            del update["message"]["text"]  # (a blank text is a text message: not answered)
            [msg] = ch.parse({}, body(update)).messages
            told.append(msg.unsupported)
    assert told == ["a story", "a game", "paid media", "that kind of message"]
    assert "a_kind_from_2027" in caplog.text  # the log says which, for whoever adds it
    for service in ("write_access_allowed", "successful_payment", "pinned_message"):
        assert ch.parse({}, body(tg.update(chat=5, sender=1, text="", **{service: {}}))).messages == []
    in_group = tg.update(chat=-7, sender=1, text="", story={"id": 3}, chat_type="group")
    assert ch.parse({}, body(in_group)).messages == []


def test_a_telegram_command_for_another_bot_is_not_ours_even_in_a_reply_to_us() -> None:
    tg, ch = FakeTelegram("1:t", "s"), TelegramChannel(S)
    ours = {"text": "echo: hi", "from": {"id": 9, "is_bot": True, "username": "nanofleet_bot"}}
    for text, addressed in (("/stop@otherbot", False), ("/stop@nanofleet_bot", True), ("/stop", True)):
        update = tg.update(chat=-7, sender=1, text=text, chat_type="group", reply_to_message=ours)
        assert bool(ch.parse({}, body(update)).messages) is addressed, text


def test_telegram_text_captions_replies_groups_and_topics() -> None:
    tg, ch = FakeTelegram("1:t", "s"), TelegramChannel(S)
    [msg] = ch.parse({}, body(tg.update(chat=5, sender=1, text="hi", update_id=42))).messages
    assert (msg.chat_id, msg.sender_id, msg.event_id, msg.key(), msg.reply_meta) == ("5", "1", "42", "telegram:5", {})
    assert not msg.group
    captioned = tg.update(chat=5, sender=1, text="", caption="look at this")
    assert ch.parse({}, body(captioned)).messages[0].content == "look at this"
    reply = tg.update(chat=5, sender=1, text="why?", reply_to_message={"text": "the sky is blue\nsays me"})
    assert ch.parse({}, body(reply)).messages[0].content == "> the sky is blue\n> says me\n\nwhy?"
    ignored = tg.update(chat=-7, sender=1, text="talking among ourselves", chat_type="supergroup")
    assert ch.parse({}, body(ignored)).messages == []
    mention = tg.update(chat=-7, sender=1, text="@NanoFleet_Bot what time is it", chat_type="supergroup",
                        is_topic_message=True, message_thread_id=9)
    [msg] = ch.parse({}, body(mention)).messages
    assert msg.content == "what time is it" and msg.key() == "telegram:-7:9" and msg.group
    assert msg.reply_meta == {"reply_to_message_id": mention["message"]["message_id"], "message_thread_id": 9}
    assert ch.parse({}, body({"update_id": 3, "edited_message": {"text": "x"}})).messages == []
    [voice] = ch.parse({}, body(tg.update(chat=5, sender=1, text="", voice={"file_id": "v"}))).messages
    assert (voice.content, voice.unsupported, voice.media) == ("", "a voice message", {"kind": "voice", "id": "v"})
    in_group = tg.update(chat=-7, sender=1, text="", photo=[{"file_id": "p"}], chat_type="group")
    assert ch.parse({}, body(in_group)).messages == []  # nothing without text is addressed to the bot there
    joined = tg.update(chat=5, sender=1, text="", new_chat_members=[{"id": 2}])
    assert ch.parse({}, body(joined)).messages == []  # service messages get no answer
    assert malformed(ch.parse, {"update_id": 1, "message": {"text": "no chat"}}) == 400
    assert malformed(ch.parse, {"message": {}}) == 400
    assert malformed(ch.parse, [1, 2]) == 400


def test_telegram_photos_name_their_largest_size_under_the_limit_or_an_image_file() -> None:
    tg, ch = FakeTelegram("1:t", "s"), TelegramChannel(S)
    sizes = [{"file_id": "small", "file_size": 900}, {"file_id": "large", "file_size": 90_000},
             {"file_id": "huge", "file_size": MAX_IMAGE + 1}]
    [photo] = ch.parse({}, body(tg.update(chat=5, sender=1, text="", photo=sizes))).messages
    assert (photo.content, photo.unsupported, photo.media) == ("", "a photo", {"kind": "photo", "id": "large"})
    captioned = tg.update(chat=5, sender=1, text="", caption="what is it?", photo=sizes)
    del captioned["message"]["text"]
    [photo] = ch.parse({}, body(captioned)).messages
    assert (photo.content, photo.unsupported, photo.media) == ("what is it?", None, {"kind": "photo", "id": "large"})
    as_file = tg.update(chat=5, sender=1, text="", document={"file_id": "d", "mime_type": "image/png"})
    assert ch.parse({}, body(as_file)).messages[0].media == {"kind": "photo", "id": "d"}
    named = tg.update(chat=5, sender=1, text="", document={"file_id": "d", "mime_type": "image/png",
                                                           "file_name": "plan.png"})
    assert ch.parse({}, body(named)).messages[0].media == {"kind": "photo", "id": "d", "name": "plan.png"}
    pdf = tg.update(chat=5, sender=1, text="", caption="sum it up",
                    document={"file_id": "d", "mime_type": "application/pdf", "file_name": "q3.pdf"})
    del pdf["message"]["text"]
    [doc] = ch.parse({}, body(pdf)).messages  # (its text is read: shared.channels.files)
    assert (doc.content, doc.media) == ("sum it up", {"kind": "file", "id": "d", "name": "q3.pdf"})
    film = tg.update(chat=5, sender=1, text="", document={"file_id": "v", "mime_type": "video/mp4"})
    assert ch.parse({}, body(film)).messages[0].media is None  # (not fetched: the notice)


def test_a_telegram_reply_to_a_photo_or_file_brings_it() -> None:
    tg, ch = FakeTelegram("1:t", "s"), TelegramChannel(S)
    reply = tg.update(chat=5, sender=1, text="what is this?")
    reply["message"]["reply_to_message"] = {"message_id": 3, "caption": "from the trip",
                                            "photo": [{"file_id": "p-small"}, {"file_id": "p-large"}]}
    [msg] = ch.parse({}, body(reply)).messages
    assert (msg.content, msg.media) == ("> from the trip\n\nwhat is this?", {"kind": "photo", "id": "p-large"})
    reply["message"]["reply_to_message"] = {"message_id": 4, "document": {
        "file_id": "d", "mime_type": "application/pdf", "file_name": "q3.pdf"}}
    assert ch.parse({}, body(reply)).messages[0].media == {"kind": "file", "id": "d", "name": "q3.pdf"}
    reply["message"]["reply_to_message"] = {"message_id": 5, "text": "an answer of the bot"}
    assert ch.parse({}, body(reply)).messages[0].media is None


def test_telegram_album_items_name_their_album_and_in_groups_follow_the_captioned_one() -> None:
    tg, ch = FakeTelegram("1:t", "s"), TelegramChannel(S)
    item = tg.update(chat=5, sender=1, text="", photo=[{"file_id": "p"}], media_group_id="1357")
    captioned = tg.update(chat=5, sender=1, text="", caption="these", photo=[{"file_id": "q"}], media_group_id="1357")
    del item["message"]["text"], captioned["message"]["text"]
    parsed = [ch.parse({}, body(u)).messages[0] for u in (item, captioned)]
    assert [(m.album, m.follower) for m in parsed] == [("1357", False), ("1357", False)]
    in_group = tg.update(chat=-7, sender=1, text="", caption="@nanofleet_bot these", photo=[{"file_id": "p"}],
                         chat_type="group", media_group_id="2468", is_topic_message=True, message_thread_id=9)
    uncaptioned = tg.update(chat=-7, sender=1, text="", photo=[{"file_id": "r"}], chat_type="group",
                            media_group_id="2468", is_topic_message=True, message_thread_id=9)
    del in_group["message"]["text"], uncaptioned["message"]["text"]
    [addressed] = ch.parse({}, body(in_group)).messages
    assert (addressed.content, addressed.album, addressed.follower) == ("these", "2468", False)
    [follower] = ch.parse({}, body(uncaptioned)).messages  # in its conversation (the topic), answered as a reply
    assert (follower.album, follower.follower, follower.media) == ("2468", True, {"kind": "photo", "id": "r"})
    assert (follower.key(), follower.group, follower.reply_meta) == (
        "telegram:-7:9", True, {"reply_to_message_id": uncaptioned["message"]["message_id"], "message_thread_id": 9})
    alone = tg.update(chat=-7, sender=1, text="", photo=[{"file_id": "s"}], chat_type="group")
    del alone["message"]["text"]
    assert ch.parse({}, body(alone)).messages == []  # a photo alone, uncaptioned, addresses nobody in a group
    single = tg.update(chat=5, sender=1, text="", photo=[{"file_id": "p"}])
    assert ch.parse({}, body(single)).messages[0].album is None


def test_telegram_ignores_messages_from_bots() -> None:
    """Telegram delivers other bots' messages in groups: answering them, two bots would talk forever."""
    tg, ch = FakeTelegram("1:t", "s"), TelegramChannel(S)
    for chat, kind in ((5, "private"), (-7, "supergroup")):
        update = tg.update(chat=chat, sender=99, text="@nanofleet_bot /help", chat_type=kind)
        update["message"]["from"]["is_bot"] = True
        assert ch.parse({}, body(update)).messages == [], kind
    anonymous = tg.update(chat=-7, sender=1087968824, text="@nanofleet_bot status?", chat_type="supergroup",
                          sender_chat={"id": -7, "type": "supergroup"})  # an admin posting as the group
    anonymous["message"]["from"].update(is_bot=True, username="GroupAnonymousBot")
    assert [m.content for m in ch.parse({}, body(anonymous)).messages] == ["status?"]


def test_telegram_allow_from_is_by_user_id() -> None:
    ch = TelegramChannel(S)
    assert ch.allowed("1") and not ch.allowed("2") and not ch.allowed("nanofleet_bot")
    assert not TelegramChannel(Settings()).allowed("1")  # default deny


def test_slack_dms_mentions_threads_and_what_is_ignored() -> None:
    sl, ch = FakeSlack("x", "s"), SlackChannel(S)
    dm = sl.event(channel="D1", user="U1", text="hello", event_id="Ev1", kind="message")
    [msg] = ch.parse({}, body(dm)).messages
    assert (msg.key(), msg.reply_meta, msg.content, msg.group) == ("slack:D1", {}, "hello", False)
    mention = sl.event(channel="C1", user="U1", text="<@UBOT0001> summarise <@U2>'s idea", event_id="Ev2")
    [msg] = ch.parse({}, body(mention)).messages
    root = mention["event"]["ts"]
    assert (msg.key(), msg.reply_meta, msg.group) == (f"slack:C1:{root}", {"thread_ts": root}, True)
    assert msg.content == "summarise @U2's idea"
    assert msg.event_id == f"C1:{root}"  # the ledger's key: the message, whatever the event's id
    edited = sl.event(channel="C1", user="U1", text="<@UBOT0001> summarise it", event_id="Ev9", ts=root,
                      edited={"user": "U1", "ts": "9.9"})
    assert ch.parse({}, body(edited)).messages[0].event_id == msg.event_id  # Slack sends an edit again
    in_dm = sl.event(channel="D1", user="U1", text="<@UBOT0001> hi", event_id="Ev8")  # also as message.im
    [msg] = ch.parse({}, body(in_dm)).messages
    assert (msg.key(), msg.reply_meta, msg.content, msg.group) == ("slack:D1", {}, "hi", False)
    escaped = sl.event(channel="D1", user="U1", kind="message", event_id="Ev7",
                       text="is a &lt; b &amp;&amp; b &gt; c? see <https://x.io/a|the doc>, <http://y.io|y.io>, "
                            "<@U2|bob>, <#C1|general>, <!here>")
    assert ch.parse({}, body(escaped)).messages[0].content == \
        "is a < b && b > c? see the doc (https://x.io/a), y.io, @bob, #general, @here"
    threaded = sl.event(channel="C1", user="U1", text="<@UBOT0001> more", event_id="Ev3", thread_ts="1.5")
    assert ch.parse({}, body(threaded)).messages[0].key() == "slack:C1:1.5"
    for ignored in (sl.event(channel="C1", user="U1", text="x", event_id="E", bot_id="B"),
                    sl.event(channel="C1", user="U1", text="x", event_id="E", subtype="message_changed"),
                    sl.event(channel="C1", user="U1", text="x", event_id="E", kind="message", channel_type="channel"),
                    {"type": "app_rate_limited"}):
        assert ch.parse({}, body(ignored)).messages == []
    assert ch.parse({}, body({"type": "url_verification", "challenge": "abc"})).response == {"challenge": "abc"}
    assert malformed(ch.parse, {"type": "event_callback", "event_id": "E", "event": {"type": "app_mention"}}) == 400


def test_whatsapp_messages_captions_statuses_and_handshake() -> None:
    wa, ch = FakeWhatsApp("t", "s", "P1"), WhatsAppChannel(S)
    payload = wa.event(sender="155501", text="hola", wamid="wamid.1")
    value = payload["entry"][0]["changes"][0]["value"]
    value["messages"].append({"from": "155502", "id": "wamid.2", "type": "image", "image": {"caption": "a cat",
                                                                                          "id": "m2"}})
    value["messages"].append({"from": "155503", "id": "wamid.3", "type": "sticker", "sticker": {}})
    value["messages"].append({"from": "155503", "id": "wamid.4", "type": "reaction", "reaction": {"emoji": "+1"}})
    value["statuses"] = [{"id": "wamid.out", "status": "read"}]
    parsed = ch.parse({}, body(payload))
    assert [(m.chat_id, m.content, m.event_id, m.sender_name, m.unsupported) for m in parsed.messages] == [
        ("155501", "hola", "wamid.1", "Ann", None), ("155502", "a cat", "wamid.2", None, None),
        ("155503", "", "wamid.3", None, "a sticker")]  # a reaction gets no answer
    assert [m.media for m in parsed.messages] == [None, {"kind": "photo", "id": "m2"}, None]
    assert [m.album for m in parsed.messages] == [None, BURST, None]  # photos sent together are one message
    assert parsed.undelivered == {}
    failed = ch.parse({}, body(wa.status(recipient="155501", wamid="wamid.out7", status="failed")))
    assert failed.messages == []
    assert failed.undelivered["wamid.out7"].startswith("WhatsApp error 131047: Re-engagement message: More than 24")
    assert ch.parse({}, body({"object": "page"})).messages == []
    assert malformed(ch.parse, {"object": "whatsapp_business_account", "entry": "nope"}) == 400
    assert ch.handshake({"hub.mode": "subscribe", "hub.verify_token": "vt", "hub.challenge": "42"}) == "42"
    assert ch.handshake({"hub.mode": "subscribe", "hub.verify_token": "no", "hub.challenge": "42"}) is None


def test_whatsapp_ignores_what_was_sent_to_another_number_of_the_business() -> None:
    """One app can be subscribed for several numbers: what reaches the others is not ours to answer."""
    ch = WhatsAppChannel(S)
    other = FakeWhatsApp("t", "s", "P2")
    assert ch.parse({}, body(other.event(sender="155501", text="hola", wamid="wamid.9"))).messages == []
    failed = other.status(recipient="155501", wamid="wamid.out9", status="failed")
    assert ch.parse({}, body(failed)).undelivered == {}
    ours = FakeWhatsApp("t", "s", "P1").event(sender="155501", text="hola", wamid="wamid.10")
    ours["entry"][0]["changes"].insert(0, other.event(sender="155502", text="x", wamid="wamid.11")["entry"][0]
                                       ["changes"][0])
    assert [m.event_id for m in ch.parse({}, body(ours)).messages] == ["wamid.10"]


def test_a_whatsapp_message_older_than_its_retry_window_is_a_replay_and_ignored() -> None:
    """WhatsApp signs no timestamp, and the ledger forgets ids after its retention: a signed request
    captured once must not start a turn again weeks later."""
    wa, ch = FakeWhatsApp("t", "s", "P1"), WhatsAppChannel(S)
    payload = wa.event(sender="155501", text="pay Bob", wamid="wamid.old")
    message = payload["entry"][0]["changes"][0]["value"]["messages"][0]
    message["timestamp"] = str(int(time.time()) - 8 * 24 * 3600)
    assert ch.parse({}, body(payload)).messages == []
    message["timestamp"] = str(int(time.time()) - 6 * 24 * 3600)  # still within WhatsApp's retries
    assert [m.event_id for m in ch.parse({}, body(payload)).messages] == ["wamid.old"]


def test_feishu_decrypts_and_keeps_text_addressed_to_the_bot_and_private_attachments() -> None:
    fs, ch = FakeFeishu("cli", "s", "tok", "k"), FeishuChannel(S)
    assert decrypt(encrypt(b'{"a": 1}', "k"), "k") == b'{"a": 1}'
    raw, _ = fs.signed(fs.event(chat="oc_1", sender="ou_1", text="hi there", event_id="ev1"))
    [msg] = ch.parse({}, raw).messages
    assert (msg.chat_id, msg.sender_id, msg.content, msg.event_id, msg.group) == ("oc_1", "ou_1", "hi there", "ev1",
                                                                                  False)
    group = fs.event(chat="oc_2", sender="ou_1", text="no mention", event_id="ev2", chat_type="group")
    assert ch.parse({}, fs.signed(group)[0]).messages == []  # (mentions: tests/shared/channels/test_feishu.py)
    [image] = ch.parse({}, fs.signed(fs.image(chat="oc_1", sender="ou_1", event_id="ev3", image=b"x"))[0]).messages
    message_id = image.reply_meta["message_id"]
    assert (image.content, image.unsupported, image.media) == ("", "a photo", {"kind": "photo", "id": "img_v2_4",
                                                                               "message": message_id, "name": ""})
    assert image.album == BURST
    sticker = fs.event(chat="oc_1", sender="ou_1", text="x", event_id="ev4")
    sticker["event"]["message"].update(message_type="sticker", content='{"file_key": "s"}')
    [told] = ch.parse({}, fs.signed(sticker)[0]).messages
    assert (told.unsupported, told.media) == ("a sticker", None)  # (a notice)
    in_group = fs.image(chat="oc_2", sender="ou_1", event_id="ev5", image=b"x")
    in_group["event"]["message"]["chat_type"] = "group"
    assert ch.parse({}, fs.signed(in_group)[0]).messages == []  # addressed to nobody
    with pytest.raises(WebhookError):
        ch.parse({}, body({"encrypt": "bm90IGEgY2lwaGVydGV4dA=="}))


def test_discord_ping_commands_and_usage() -> None:
    ch = DiscordChannel(S)
    assert ch.parse({}, body({"type": 1})).response == {"type": 1}
    command = {"id": "I1", "type": 2, "token": "tok", "channel_id": "C9", "application_id": "APP",
               "user": {"id": "7", "username": "ann"},
               "data": {"name": "ask", "options": [{"name": "question", "type": 3, "value": " why? "}]}}
    parsed = ch.parse({}, body(command))
    assert parsed.response == {"type": 5} and parsed.denied_response and parsed.denied_response["type"] == 4
    [msg] = parsed.messages
    assert (msg.content, msg.sender_id, msg.reply_meta) == ("why?", "7", {"interaction_token": "tok",
                                                                          "application_id": "APP"})
    assert not msg.group  # a DM with the app; in a server channel it is a group chat
    assert ch.parse({}, body({**command, "guild_id": "G1"})).messages[0].group
    empty = {**command, "data": {"name": "ask"}}
    assert ch.parse({}, body(empty)).response["type"] == 4  # type: ignore[index]
    # another command of the application, a slash one or a message's context menu: not a question
    for data in ({"name": "weather", "type": 1, "options": [{"name": "city", "type": 3, "value": "Paris"}]},
                 {"name": "Summarise", "type": 3, "target_id": "M1"}):
        other = ch.parse({}, body({**command, "data": data}))
        assert other.messages == [] and other.response == {"type": 4, "data": {"content": NOT_OUR_COMMAND,
                                                                                 "flags": 64}}
    assert ch.parse({}, body({"type": 3})).messages == []
    answers = {kind: ch.parse({}, body({"type": kind, "id": "I", "token": "t"})).response for kind in (3, 4, 5, 99)}
    assert answers == {3: {"type": 6}, 4: {"type": 8, "data": {"choices": []}}, 99: None,
                       5: {"type": 4, "data": {"content": NOT_OURS, "flags": 64}}}  # a modal of a slash command
    assert malformed(ch.parse, {"type": 2, "id": "I"}) == 400


def test_a_discord_command_s_file_option_is_fetched_not_read_as_its_question() -> None:
    fd, ch = FakeDiscord("APP", "bot"), DiscordChannel(S)
    photo = fd.command(channel="C9", user="7", text="", interaction_id="I2", attached=b"p")
    [alone] = ch.parse({}, body(photo)).messages
    assert (alone.content, alone.unsupported) == ("", "a photo")  # not the attachment's id
    assert alone.media and alone.media["kind"] == "photo" and alone.media["url"].endswith("hm=ab")
    other = fd.command(channel="C9", user="7", text="what?", interaction_id="I3", attached=b"<svg/>",
                       content_type="image/svg+xml")
    [asked] = ch.parse({}, body(other)).messages
    assert (asked.content, asked.media) == ("what?", None)  # no image a model takes: the question alone
    report = fd.command(channel="C9", user="7", text="", interaction_id="I4", attached=b"%PDF-", filename="q3.pdf",
                        content_type="application/pdf")
    [doc] = ch.parse({}, body(report)).messages
    assert (doc.unsupported, doc.media and doc.media["kind"], doc.media and doc.media["name"]) == \
        ("a file", "file", "q3.pdf")


def test_generic_webhook_fields() -> None:
    ch = WebhookChannel(S)
    ok = {"id": "e1", "chat_id": "c", "sender_id": "s", "text": "t", "meta": {"thread": 3}}
    [msg] = ch.parse({}, body(ok)).messages
    assert msg.reply_meta == {"in_reply_to": "e1", "meta": {"thread": 3}}
    assert malformed(ch.parse, {**ok, "text": ""}) == 400
    assert malformed(ch.parse, {**ok, "meta": {"x": "y" * 5000}}) == 400


def test_channel_secrets_that_look_like_placeholders_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NANOFLEET_CHANNELS__SLACK__SIGNING_SECRET", "changeme")
    with pytest.raises(SettingsError, match="NANOFLEET_CHANNELS__SLACK__SIGNING_SECRET"):
        load_settings()


def test_a_channel_is_on_only_with_its_secrets() -> None:
    ch = TelegramChannel(Settings(channels={"telegram": {"token": "1:t"}}))
    assert not ch.enabled() and ch.missing() == ["NANOFLEET_CHANNELS__TELEGRAM__WEBHOOK_SECRET"]


def test_telegram_groups_take_only_commands_for_this_bot() -> None:
    tg, ch = FakeTelegram("1:t", "s"), TelegramChannel(S)

    def taken(text: str) -> list[str]:
        update = tg.update(chat=-7, sender=1, text=text, chat_type="supergroup")
        return [m.content for m in ch.parse({}, body(update)).messages]

    assert taken("/start@otherbot") == [] and taken("/help@other_bot please") == []
    assert taken("/start@nanofleet_botx") == [] and taken("hello @nanofleet_bot2") == []
    assert taken("/help") == ["/help"] and taken("/new@NanoFleet_Bot") == ["/new"] and taken("/help.") == ["/help."]
    assert taken("/ask@nanofleet_bot why?") == ["/ask why?"]
    assert taken("/start@otherbot and you too @nanofleet_bot") == ["/start@otherbot and you too"]


def test_slack_keeps_user_messages_with_a_subtype_and_drops_the_rest() -> None:
    sl, ch = FakeSlack("x", "s"), SlackChannel(S)
    dm_file = sl.event(channel="D1", user="U1", text="what is in this file?", event_id="Ev1", kind="message",
                       subtype="file_share", files=[{"id": "F1", "name": "report.pdf"}])
    assert [m.content for m in ch.parse({}, body(dm_file)).messages] == ["what is in this file?"]
    broadcast = sl.event(channel="D1", user="U1", text="also in the channel", event_id="Ev2", kind="message",
                         subtype="thread_broadcast", thread_ts="1.5")
    [msg] = ch.parse({}, body(broadcast)).messages
    assert (msg.content, msg.reply_meta) == ("also in the channel", {"thread_ts": "1.5"})
    for subtype in ("bot_message", "message_changed", "message_deleted", "channel_join", "channel_leave",
                    "channel_topic", "pinned_item"):
        dropped = sl.event(channel="D1", user="U1", text="x", event_id="Ev3", kind="message", subtype=subtype)
        assert ch.parse({}, body(dropped)).messages == [], subtype
    only_a_file = sl.event(channel="D1", user="U1", text="", event_id="Ev4", kind="message", subtype="file_share")
    [notice] = ch.parse({}, body(only_a_file)).messages  # no text for the model: the sender is told so
    assert (notice.content, notice.unsupported) == ("", "a file")
    own = sl.event(channel="D1", user="U1", text="x", event_id="Ev5", kind="message", subtype="file_share",
                   bot_id="B1")
    assert ch.parse({}, body(own)).messages == []
