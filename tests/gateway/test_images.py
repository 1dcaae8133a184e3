"""Photos sent in a chat or to the API, with a model that sees images (NANOFLEET_LLM__VISION), end to
end: the fake platforms hand out the photo (Telegram's getFile and /file/, WhatsApp's media URL, Slack's
private download URL, Feishu's message resource), the gateway and a real worker take it in, and the
fake model reads it from the data URL litellm sends, as a vision model would, and names its type, size
and sha256 in its echo."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import time
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.channels.images import NOT_AN_IMAGE
from shared.llm_images import NOT_SHOWN
from tests.fakes.llm import FakeLLM
from tests.support.platforms import ChannelStack, started_channel_stack
from tests.support.processes import wait_until


def png(width: int = 3, height: int = 2) -> bytes:
    """A real PNG: the signature, IHDR, one IDAT of grey pixels, IEND."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def seen(image: bytes, mime: str = "image/png") -> str:
    return f"[image {mime}, {len(image)} bytes, {hashlib.sha256(image).hexdigest()}]"


@pytest.fixture(scope="module")
def channel_stack(database_url: str, redis_server: str, fake_llm: FakeLLM,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChannelStack]:
    """The channel stack of the other webhook tests, with a model that sees images."""
    with started_channel_stack(database_url, redis_server, fake_llm, tmp_path_factory.mktemp("images"),
                               LLM__VISION="true") as stack:
        yield stack


def said(channels: ChannelStack, chat: str) -> list[list[Any]]:
    """The chat's messages to the agent, in order: each one's text and how many photos came with it."""
    return list(channels.scalar(
        "select coalesce(json_agg(json_build_array(m.content, (select count(*) from message_images i where "
        "i.message_id = m.id)) order by m.seq), '[]') from messages m join conversations c on c.id = m.conversation_id "
        "where c.chat_id = :c and m.role = 'USER'", c=chat))


def test_a_telegram_photo_is_shown_to_the_model_with_its_caption_then_named(channels: ChannelStack,
                                                                            fake_llm: FakeLLM) -> None:
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat, image = d.new_chat(), png(40, 30)
    update = tg.signed(tg.photo(chat=int(chat), sender=int(d.allowed), image=image, caption="what is this?"))
    for _ in range(2):  # and Telegram's retry of it
        assert channels.post("telegram", update).status_code == 200
    channels.settled(chat)
    assert d.replies(chat) == [f"echo: what is this? {seen(image)}"]
    assert tg.downloads == [f"photo{len(tg.files)}x"]  # the large size, once; not the thumbnail
    assert channels.scalar("select count(*) from message_images") == 1
    assert channels.scalar("select data from message_images") == image

    assert channels.post("telegram", d.request(chat=chat, text="and now?")).status_code == 200
    channels.settled(chat, rows=2)
    with fake_llm.lock:
        later = fake_llm.requests[-1]["messages"]
    assert {"role": "user", "content": f"{NOT_SHOWN.format(n=1)}\nwhat is this?"} in later  # named, not resent
    assert "image_url" not in json.dumps(later)

    conversation = channels.scalar("select id from conversations where chat_id = :c", c=chat)
    listed = channels.api.get(f"/api/v1/conversations/{conversation}/messages").json()
    assert [(m["content"], m["images"]) for m in listed if m["role"] == "USER"] == [("what is this?", 1),
                                                                                      ("and now?", 0)]
    assert channels.api.delete(f"/api/v1/conversations/{conversation}").status_code == 204
    assert channels.scalar("select count(*) from message_images") == 0  # gone with its message


def test_a_whatsapp_photo_alone_is_answered(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    wa, w = channels.fakes["whatsapp"], channels.driver("whatsapp")
    number, image = w.new_chat(), png()
    photo = wa.photo(sender=number, wamid="wamid.p1", image=image)
    assert channels.post("whatsapp", wa.signed(photo)).status_code == 200
    channels.settled(number)
    assert w.replies(number)[-1] == f"echo: {seen(image)}"
    assert wa.refused == []  # the download carried the access token


def test_photos_sent_together_on_whatsapp_or_feishu_are_one_message(channels: ChannelStack,
                                                                    fake_llm: FakeLLM) -> None:
    """Both send each photo picked together as a message of its own, with no album id: each used to get
    an answer of its own (or the later ones one answer together, after the first's)."""
    wa, w = channels.fakes["whatsapp"], channels.driver("whatsapp")
    number, photos, calls = w.new_chat(), [png(11, 3), png(12, 3), png(13, 3)], fake_llm.calls()
    for i, image in enumerate(photos):
        update = wa.photo(sender=number, wamid=f"wamid.b{uuid.uuid4().hex[:8]}", image=image,
                          caption="which is widest?" if i == 0 else None)
        assert channels.post("whatsapp", wa.signed(update)).status_code == 200
    fs, f = channels.fakes["feishu"], channels.driver("feishu")
    chat = f.new_chat()
    for image in photos[:2]:
        assert channels.post("feishu", fs.signed(fs.image(chat=chat, sender=f.allowed, event_id=uuid.uuid4().hex,
                                                          image=image))).status_code == 200
    channels.settled(number)
    channels.settled(chat)
    assert w.replies(number) == ["echo: which is widest? " + " ".join(seen(p) for p in photos)]
    assert f.replies(chat) == [f"echo: {seen(photos[0])} {seen(photos[1])}"]
    assert fake_llm.calls() == calls + 2


def test_photos_a_phone_sends_one_by_one_over_a_second_apart_in_all_are_one_message(
        channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """A phone on a slow network sends the photos picked together as each is uploaded: half a second
    apart, two seconds from the first to the last. The first waited a second from its own arrival, and
    the later ones got an answer of their own, without the caption; it now waits for a quiet second."""
    wa, w = channels.fakes["whatsapp"], channels.driver("whatsapp")
    number, photos = w.new_chat(), [png(14 + i, 3) for i in range(4)]
    for i, image in enumerate(photos):
        if i:
            time.sleep(0.5)  # the pace of the uploads (this test's subject, not a wait for a result)
        update = wa.photo(sender=number, wamid=f"wamid.s{uuid.uuid4().hex[:8]}", image=image,
                          caption="which one is brightest?" if i == 0 else None)
        assert channels.post("whatsapp", wa.signed(update)).status_code == 200
    channels.settled(number)
    assert w.replies(number) == ["echo: which one is brightest? " + " ".join(seen(p) for p in photos)]


def test_a_file_that_is_no_image_gets_a_notice_and_no_llm_call(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat = d.new_chat()
    update = tg.photo(chat=int(chat), sender=int(d.allowed), image=b"<html>not a photo</html>", caption="look")
    assert channels.post("telegram", tg.signed(update)).status_code == 200
    channels.settled(chat)
    assert d.replies(chat) == [NOT_AN_IMAGE]
    assert fake_llm.calls() == 0 and channels.scalar("select count(*) from messages") == 0


def test_the_api_takes_photos_as_data_urls(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    cid = channels.api.post("/api/v1/conversations").json()["conversationId"]
    image, large = png(), png(1500, 1000) + b"\0" * (3 * 1024 * 1024)  # (a body over the old 2 MiB limit)
    urls = [f"data:image/png;base64,{base64.b64encode(i).decode()}" for i in (image, large)]
    answer = channels.api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "compare", "images": urls})
    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["assistantMessage"] == f"echo: compare {seen(image)} {seen(large)}"
    alone = channels.api.post(f"/api/v1/conversations/{cid}/chat", json={"images": urls[:1]})
    assert alone.json()["assistantMessage"] == f"echo: {seen(image)}"

    refused = {
        "not a data URL": ({"message": "x", "images": ["https://example.com/cat.png"]}, "images[0] is not a data URL"),
        "the wrong type": ({"message": "x", "images": [urls[0].replace("png", "jpeg", 1)]}, "not the type its URL"),
        "no image": ({"message": "x", "images": ["data:image/png;base64," + base64.b64encode(b"hi").decode()]},
                     "no image/jpeg"),
        "too many": ({"message": "x", "images": urls[:1] * 5}, "at most 4 items"),
        "nothing": ({}, "message is empty"),
    }
    for why, (body, says) in refused.items():
        answer = channels.api.post(f"/api/v1/conversations/{cid}/messages", json=body)
        assert answer.status_code == 422 and says in answer.text, (why, answer.text[:300])
    assert channels.scalar("select count(*) from messages where conversation_id = :c and role = 'USER'", c=cid) == 2


def test_a_slack_photo_is_fetched_with_the_bot_token_from_slack_only(channels: ChannelStack,
                                                                      fake_llm: FakeLLM) -> None:
    sl, d = channels.fakes["slack"], channels.driver("slack")
    chat, image = f"D{uuid.uuid4().hex[:8].upper()}", png(5, 5)
    shared = sl.file_share(channel=chat, user=d.allowed, text="", event_id="EvP1", content=image,
                           mimetype="image/png", name="cat.png")
    assert channels.post("slack", sl.signed(shared)).status_code == 200
    channels.settled(chat)
    assert d.replies(chat) == [f"echo: {seen(image)}"]
    assert sl.refused == [] and len(sl.downloads) == 1

    elsewhere = sl.file_share(channel=chat, user=d.allowed, text="", event_id="EvP2", content=image,
                              mimetype="image/png", name="dog.png")
    elsewhere["event"]["files"][0]["url_private_download"] = "http://127.0.0.2:9/files-pri/T1-F9/download/dog.png"
    assert channels.post("slack", sl.signed(elsewhere)).status_code == 200
    channels.settled(chat, rows=2)
    assert d.replies(chat)[-1] == "Sorry, I couldn't get your photo from slack (not on files.slack.com). " \
                                  "Could you send it again?"
    assert len(sl.downloads) == 1 and fake_llm.calls() == 1  # the bot token went nowhere else


def test_a_feishu_image_is_fetched_as_its_message_resource(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    fs, d = channels.fakes["feishu"], channels.driver("feishu")
    chat, image = d.new_chat(), png(7, 7)
    event = fs.image(chat=chat, sender=d.allowed, event_id=uuid.uuid4().hex, image=image)
    assert channels.post("feishu", fs.signed(event)).status_code == 200
    channels.settled(chat)
    assert d.replies(chat) == [f"echo: {seen(image)}"]
    assert fs.refused == []  # with the tenant token, as type=image


def test_a_feishu_post_in_a_group_is_read_with_its_links_and_every_photo(channels: ChannelStack,
                                                                         fake_llm: FakeLLM) -> None:
    fs, d = channels.fakes["feishu"], channels.driver("feishu")
    group, first, second = f"oc_{uuid.uuid4().hex[:10]}", png(4, 4), png(6, 2)
    paragraphs = [[{"tag": "at", "user_id": "@_user_1", "user_name": "bot"}, {"tag": "text", "text": " compare "},
                   {"tag": "a", "text": "these", "href": "https://example.com/a"}]]
    post = fs.post(chat=group, sender=d.allowed, event_id=uuid.uuid4().hex, paragraphs=paragraphs,
                   images=(first, second), chat_type="group", mentions=[fs.mention(1)])
    for _ in range(2):  # and Feishu's resend of it
        assert channels.post("feishu", fs.signed(post)).status_code == 200
    channels.settled(group)
    # (the model read the link as Markdown, and the reply, a post's markdown, keeps it)
    assert d.replies(group) == [f"echo: compare [these](https://example.com/a) {seen(first)} {seen(second)}"]
    assert channels.scalar("select count(*) from message_images i join messages m on m.id = i.message_id "
                           "join conversations c on c.id = m.conversation_id where c.chat_id = :g", g=group) == 2
    assert fs.refused == [] and fake_llm.calls() == 1


def test_a_slack_message_with_several_photos_shows_the_model_each(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    sl, d = channels.fakes["slack"], channels.driver("slack")
    chat, photos, before = f"D{uuid.uuid4().hex[:8].upper()}", (png(2, 2), png(3, 3), png(4, 4)), len(sl.downloads)
    shared = sl.file_share(channel=chat, user=d.allowed, text="which is larger?", event_id="EvM1",
                           content=photos[0], mimetype="image/png", name="a.png", also=photos[1:])
    assert channels.post("slack", sl.signed(shared)).status_code == 200
    channels.settled(chat)
    assert d.replies(chat) == ["echo: which is larger? " + " ".join(seen(p) for p in photos)]
    assert sl.refused == [] and len(sl.downloads) == before + 3


def test_a_discord_ask_with_a_photo_fetches_it_from_the_cdn_only(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    dc, d = channels.fakes["discord"], channels.driver("discord")
    chat, image, before = d.new_chat(), png(9, 9), len(dc.downloads)
    ask = dc.command(channel=chat, user=d.allowed, text="what's this?", interaction_id=uuid.uuid4().hex, attached=image)
    assert channels.post("discord", dc.signed(ask)).json() == {"type": 5}
    channels.settled(chat)
    assert d.replies(chat) == [f"echo: what's this? {seen(image)}"]
    assert len(dc.downloads) == before + 1

    elsewhere = dc.command(channel=chat, user=d.allowed, text="", interaction_id=uuid.uuid4().hex, attached=image)
    attachment = next(iter(elsewhere["data"]["resolved"]["attachments"].values()))
    attachment["url"] = "https://attacker.example/x.png"
    assert channels.post("discord", dc.signed(elsewhere)).status_code == 200
    channels.settled(chat, rows=2)
    assert d.replies(chat)[-1] == "Sorry, I couldn't get your photo from discord (not on cdn.discordapp.com). " \
                                  "Could you send it again?"
    assert len(dc.downloads) == before + 1 and fake_llm.calls() == 1


def test_a_regenerated_answer_is_shown_the_photos_again(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    cid = channels.api.post("/api/v1/conversations").json()["conversationId"]
    image = png(8, 3)
    url = f"data:image/png;base64,{base64.b64encode(image).decode()}"
    first = channels.api.post(f"/api/v1/conversations/{cid}/chat", json={"message": "what?", "images": [url]})
    assert first.json()["assistantMessage"] == f"echo: what? {seen(image)}"
    again = channels.api.post(f"/api/v1/conversations/{cid}/regenerate", json={"message": "and in French?"})
    assert again.status_code == 202, again.text
    run_id = again.json()["runId"]
    wait_until(lambda: channels.scalar("select status from runs where id = :r", r=run_id) == "succeeded",
               timeout=30, message="the regenerated answer")
    assert channels.scalar("select final_text from runs where id = :r", r=run_id) == \
        f"echo: and in French? {seen(image)}"  # the turn that answers it is shown them


def test_a_telegram_album_is_one_message_shown_with_every_photo(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """An album comes as one update per photo, the caption with the first: each used to be a message
    of its own, answered on its own."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat, photos = d.new_chat(), [png(10 + i, 10) for i in range(3)]
    calls = fake_llm.calls()
    for i, image in enumerate(photos):
        update = tg.photo(chat=int(chat), sender=int(d.allowed), image=image, caption="which is largest?" if i == 0
                          else None, album="album-1")
        assert channels.post("telegram", tg.signed(update)).status_code == 200
    wait_until(lambda: channels.scalar("select count(*) from inbound_events where message is not null") == 0,
               message="the album submitted")
    channels.settled(chat)
    assert d.replies(chat) == ["echo: which is largest? " + " ".join(seen(p) for p in photos)]
    assert fake_llm.calls() == calls + 1
    assert channels.scalar("select count(*) from messages m join conversations c on c.id = m.conversation_id "
                           "where c.chat_id = :c and m.role = 'USER'", c=chat) == 1
    assert channels.scalar("select count(*) from message_images i join messages m on m.id = i.message_id join "
                           "conversations c on c.id = m.conversation_id where c.chat_id = :c", c=chat) == 3


def test_an_album_keeps_its_order_when_an_item_is_slow_to_fetch(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """Each item is fetched ahead of the album's submission where it can be; the photos fetched ahead
    came first, before those the submission fetched itself, out of the order they were sent in. The
    submission leaves the slow item to the worker fetching it: each photo is downloaded once."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat, photos, fetched = d.new_chat(), [png(40 + i, 5) for i in range(3)], len(tg.downloads)
    updates = [tg.photo(chat=int(chat), sender=int(d.allowed), image=image, caption="in order?" if i == 0 else None,
                        album="album-slow") for i, image in enumerate(photos)]
    tg.slow_once[updates[0]["message"]["photo"][-1]["file_id"]] = 4.0  # past the album's second
    for update in updates:
        assert channels.post("telegram", tg.signed(update)).status_code == 200
    channels.settled(chat)
    assert d.replies(chat) == ["echo: in order? " + " ".join(seen(p) for p in photos)]
    assert sorted(tg.downloads[fetched:]) == sorted(u["message"]["photo"][-1]["file_id"] for u in updates)


def test_a_message_sent_right_after_an_album_is_answered_after_it(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """The message waited for the album's second to pass, and then for the sweeper to enqueue it again
    (15 s later; no beat runs here): the album's submission went no further than the album."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat, photos = d.new_chat(), [png(30 + i, 10) for i in range(2)]
    for i, image in enumerate(photos):
        update = tg.photo(chat=int(chat), sender=int(d.allowed), image=image, caption="which?" if i == 0 else None,
                          album="album-then-text")
        assert channels.post("telegram", tg.signed(update)).status_code == 200
    assert channels.post("telegram", d.request(chat=chat, text="and thanks")).status_code == 200
    # (one turn may answer both: the text may reach the album's turn before its first step)
    wait_until(lambda: said(channels, chat) == [["which?", 2], ["and thanks", 0]], message="both taken in, in order")


def test_a_group_album_whose_caption_addresses_the_bot_is_shown_with_every_photo(channels: ChannelStack,
                                                                                fake_llm: FakeLLM) -> None:
    """In a group only an album's captioned item can address the bot: the others were dropped, and the
    model saw one photo of three. An album that addresses nobody is neither fetched nor answered."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    group, photos = "-" + d.new_chat(), [png(20 + i, 10) for i in range(3)]
    calls, fetched = fake_llm.calls(), len(tg.downloads)
    updates = [tg.photo(chat=int(group), sender=int(d.allowed), image=image, chat_type="group", album="album-g1",
                        caption="@nanofleet_bot which is largest?" if i == 1 else None)  # some before, some after
               for i, image in enumerate(photos)]
    updates += [tg.photo(chat=int(group), sender=int(d.allowed), image=image, chat_type="group", album="album-g2")
                for image in photos]
    for update in updates:
        assert channels.post("telegram", tg.signed(update)).status_code == 200
    wait_until(lambda: channels.scalar("select count(*) from inbound_events where message is not null") == 0,
               message="both albums taken in")
    channels.settled(group)
    [reply] = tg.sent(group)
    assert reply.body["text"] == "echo: which is largest? " + " ".join(seen(photos[i]) for i in (1, 0, 2))
    assert reply.body["reply_parameters"]["message_id"] == updates[1]["message"]["message_id"]
    addressed, nobodys = ({u["message"]["photo"][-1]["file_id"] for u in album} for album in (updates[:3], updates[3:]))
    downloaded = tg.downloads[fetched:]
    assert sorted(downloaded) == sorted(addressed) and not set(downloaded) & nobodys  # each once
    assert fake_llm.calls() == calls + 1


# A text message, or an album: its items, which one has the caption (None: none), whether the caption
# addresses the bot (in a group)
POSTS = st.one_of(st.just(("text", 0, None, True)),
                  st.tuples(st.just("album"), st.integers(1, 3), st.none() | st.integers(0, 2), st.booleans()))


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(group=st.booleans(), posts=st.lists(POSTS, min_size=1, max_size=3))
def test_messages_and_albums_are_taken_in_once_each_in_order(channels: ChannelStack, group: bool,
                                                            posts: list[tuple[str, int, int | None, bool]]) -> None:
    """However texts and albums follow one another in a chat, each is one message of the conversation,
    in the order sent, with every photo of its album; in a group, an album only if its caption
    addresses the bot."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat, kind = ("-" if group else "") + d.new_chat(), "group" if group else "private"
    expected: list[tuple[str, int]] = []  # each message of the conversation: its text, its photos
    for n, (what, items, caption_at, addressed) in enumerate(posts):
        marker = f"m{n}-{uuid.uuid4().hex[:6]}"
        written = f"@nanofleet_bot {marker}" if group and addressed else marker
        if what == "text":
            update = tg.update(chat=int(chat), sender=int(d.allowed), text=written, chat_type=kind)
            assert channels.post("telegram", tg.signed(update)).status_code == 200
            expected.append((marker, 0))
            continue
        caption = None if caption_at is None else min(caption_at, items - 1)
        album = f"album-{uuid.uuid4().hex[:8]}"
        for i in range(items):
            update = tg.photo(chat=int(chat), sender=int(d.allowed), image=png(5 + i, 4), chat_type=kind, album=album,
                              caption=written if i == caption else None)
            assert channels.post("telegram", tg.signed(update)).status_code == 200
        if not group:
            expected.append((marker if caption is not None else "", items))
        elif caption is not None and addressed:
            expected.append((marker, items))
    wait_until(lambda: channels.scalar("select count(*) from inbound_events where message is not null") == 0,
               message="every message taken in")
    wait_until(lambda: channels.scalar("select count(*) from runs r join conversations c on c.id = r.conversation_id "
                                       "where c.chat_id = :c and r.status in ('queued', 'running')", c=chat) == 0,
               message="the chat's turns ended")
    assert [(content, photos) for content, photos in said(channels, chat)] == expected


def test_a_telegram_reply_to_a_photo_shows_the_model_that_photo(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """ "What is this?" answering a photo sent earlier (before the model could see, or by someone else in a
    group) used to reach the model without the photo."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat, image = d.new_chat(), png(7, 5)
    earlier = tg.photo(chat=int(chat), sender=int(d.allowed), image=image, caption="from the trip")["message"]
    reply = tg.update(chat=int(chat), sender=int(d.allowed), text="what is this?", reply_to_message=earlier)
    assert channels.post("telegram", tg.signed(reply)).status_code == 200
    channels.settled(chat)
    assert d.replies(chat) == [f"echo: &gt; from the trip\n\nwhat is this? {seen(image)}"]  # (the quote, as HTML)
