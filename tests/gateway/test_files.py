"""Files sent in chats, end to end: the fake platforms hand out a PDF or a text file (Telegram's
getFile and /file/, WhatsApp's media URL, Slack's private download URL, Feishu's message resource),
a real worker reads its text, and the fake model is sent it with the message; a file with no text
gets a notice and costs no LLM call."""

from __future__ import annotations

import uuid

from shared.channels.files import MAX_FILE, NOT_READ
from shared.channels.images import UNSEEN
from shared.channels.inbound import UNSEEN_IMAGE
from tests.fakes.llm import FakeLLM, last_user_text
from tests.support.documents import pdf
from tests.support.platforms import ChannelStack


def asked(fake_llm: FakeLLM, marker: str) -> list[str]:
    """The user text of each model call whose newest user message holds `marker`."""
    with fake_llm.lock:
        texts = [last_user_text(r["messages"]) for r in fake_llm.requests]
    return [t for t in texts if marker in t]


def test_a_telegram_pdf_is_read_with_its_caption(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat, marker = d.new_chat(), uuid.uuid4().hex[:8]
    update = tg.document(chat=int(chat), sender=int(d.allowed), content=pdf("Revenue rose", "Costs fell"),
                         name=f"q3-{marker}.pdf", mime="application/pdf", caption="sum it up")
    for _ in range(2):  # and Telegram's retry of it
        assert channels.post("telegram", tg.signed(update)).status_code == 200
    channels.settled(chat)
    assert asked(fake_llm, marker) == [f"sum it up\n\n[file q3-{marker}.pdf]\nRevenue rose\n\nCosts fell"]
    assert len(d.replies(chat)) == 1 and tg.downloads.count(update["message"]["document"]["file_id"]) == 1


def test_a_whatsapp_text_file_alone_is_read(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    wa, w = channels.fakes["whatsapp"], channels.driver("whatsapp")
    number, marker = w.new_chat(), uuid.uuid4().hex[:8]
    doc = wa.document(sender=number, wamid=f"wamid.{marker}", content=f"todo {marker}\n- milk".encode(),
                      name="todo.md", mime="text/markdown")
    assert channels.post("whatsapp", wa.signed(doc)).status_code == 200
    channels.settled(number)
    assert asked(fake_llm, marker) == [f"[file todo.md]\ntodo {marker}\n- milk"]
    assert wa.refused == []  # fetched with the access token


def test_a_slack_message_with_a_photo_and_a_file_reads_the_file_and_names_the_photo(
        channels: ChannelStack, fake_llm: FakeLLM) -> None:
    sl, d = channels.fakes["slack"], channels.driver("slack")
    chat, marker = f"D{uuid.uuid4().hex[:8].upper()}", uuid.uuid4().hex[:8]
    shared = sl.file_share(channel=chat, user=d.allowed, text="compare", event_id=f"Ev{marker}",
                           content=b"\x89PNG\r\n\x1a\n", mimetype="image/png", name="chart.png")
    notes = sl.file_share(channel=chat, user=d.allowed, text="", event_id="x", content=f"a,b\n{marker},2".encode(),
                          mimetype="text/csv", name="data.csv")["event"]["files"]
    shared["event"]["files"] += notes
    assert channels.post("slack", sl.signed(shared)).status_code == 200
    channels.settled(chat)
    # (this stack's model sees no images: the photo is named, the file read all the same)
    assert asked(fake_llm, marker) == [f"{UNSEEN}compare\n\n[file data.csv]\na,b\n{marker},2"]


def test_a_feishu_file_with_no_text_gets_a_notice_and_no_llm_call(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    fs, d = channels.fakes["feishu"], channels.driver("feishu")
    chat, calls = d.new_chat(), fake_llm.calls()
    event = fs.file(chat=chat, sender=d.allowed, event_id=uuid.uuid4().hex, content=pdf(""), name="scan.pdf")
    assert channels.post("feishu", fs.signed(event)).status_code == 200
    channels.settled(chat)
    assert d.replies(chat) == [NOT_READ.format(name="scan.pdf", why="the PDF has no text (a scan, perhaps)")]
    stored = channels.scalar("select count(*) from messages m join conversations c on c.id = m.conversation_id "
                             "where c.chat_id = :c", c=chat)
    assert fake_llm.calls() == calls and stored == 0
    assert fs.refused == []


def test_a_pdf_attached_to_discord_s_ask_is_read(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    dc, d = channels.fakes["discord"], channels.driver("discord")
    chat, marker = d.new_chat(), uuid.uuid4().hex[:8]
    ask = dc.command(channel=chat, user=d.allowed, text="", interaction_id=uuid.uuid4().hex,
                     attached=pdf(f"Minutes {marker}"), filename="minutes.pdf", content_type="application/pdf")
    assert channels.post("discord", dc.signed(ask)).json() == {"type": 5}
    channels.settled(chat)
    assert asked(fake_llm, marker) == [f"[file minutes.pdf]\nMinutes {marker}"]
    assert len(d.replies(chat)) == 1


def _over_the_cap() -> bytes:
    return b"%PDF-1.4 " + b"x" * (MAX_FILE + 1024 * 1024)  # 11 MiB: never downloaded (getFile gives its size)


def test_a_file_over_the_cap_is_not_asked_again_and_its_caption_is_answered(channels: ChannelStack,
                                                                            fake_llm: FakeLLM) -> None:
    """It got "could you send it again?" with the raw limit in bytes, and its caption was dropped."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    alone, captioned, marker = d.new_chat(), d.new_chat(), uuid.uuid4().hex[:8]
    for chat, caption in ((alone, None), (captioned, f"big one {marker}")):
        update = tg.document(chat=int(chat), sender=int(d.allowed), content=_over_the_cap(), name="big.pdf",
                             mime="application/pdf", caption=caption)
        assert channels.post("telegram", tg.signed(update)).status_code == 200
        channels.settled(chat)
    assert d.replies(alone) == ["Sorry, I couldn't get your file from telegram (it is too large: 10 MB at most)."]
    assert asked(fake_llm, marker) == [f"big one {marker}\n\n[file big.pdf: not read, it is too large: 10 MB at most]"]


def test_an_album_with_a_file_too_large_reads_the_rest_and_names_the_one_not_read(channels: ChannelStack,
                                                                                  fake_llm: FakeLLM) -> None:
    """The one item's notice used to be the album's: the caption and the readable file never reached the
    model, and the conversation held no message."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat, marker = d.new_chat(), uuid.uuid4().hex[:8]
    items = [tg.document(chat=int(chat), sender=int(d.allowed), content=_over_the_cap(), name="big.pdf",
                         mime="application/pdf"),
             tg.document(chat=int(chat), sender=int(d.allowed), content=f"Q3 {marker}".encode(), name="q3.txt",
                         mime="text/plain", caption="summarise these reports")]
    for update in items:
        update["message"]["media_group_id"] = f"album-{marker}"
        assert channels.post("telegram", tg.signed(update)).status_code == 200
    channels.settled(chat)
    assert asked(fake_llm, marker) == ["[file big.pdf: not read, it is too large: 10 MB at most]\n\n"
                                       f"summarise these reports\n\n[file q3.txt]\nQ3 {marker}"]
    assert len(d.replies(chat)) == 1 and not [r for r in d.replies(chat) if "Sorry" in r]


def test_an_image_sent_as_a_file_to_a_model_that_sees_none_is_told_images_are_not_seen(
        channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """It was told "I can only read text for now, not a file", though PDFs and text files are read."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat, calls = d.new_chat(), fake_llm.calls()
    update = tg.document(chat=int(chat), sender=int(d.allowed), content=b"\x89PNG\r\n\x1a\n" + b"\x00" * 32,
                         name="chart.png", mime="image/png")
    assert channels.post("telegram", tg.signed(update)).status_code == 200
    channels.settled(chat)
    assert d.replies(chat) == [UNSEEN_IMAGE] and fake_llm.calls() == calls
