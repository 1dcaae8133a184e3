"""Files both ways, end to end. Sent: the model's message tool names workspace files, a real worker
reads them and keeps them in Postgres, and the outbound queue uploads each to the fake platform after
the text, as that platform takes files; an API caller gets links and fetches them from the gateway.
Received (NANOFLEET_CHANNELS__SAVE_FILES): a file a user sends is kept in the workspace and the model
told where, even one it cannot read as text."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.fakes.llm import FakeLLM, last_user_text
from tests.gateway.test_images import png
from tests.support.platforms import ChannelStack, started_channel_stack

PLATFORMS = ["telegram", "slack", "whatsapp", "feishu", "discord", "webhook"]


@pytest.fixture(scope="module")
def channel_stack(database_url: str, redis_server: str, fake_llm: FakeLLM,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChannelStack]:
    """The channel stack of the other webhook tests, its model allowed the message tool and FS_READ, the
    files users send kept."""
    with started_channel_stack(database_url, redis_server, fake_llm, tmp_path_factory.mktemp("sent-files"),
                               TOOLS__ALLOWED=json.dumps(["message"]),
                               PERMISSIONS__GRANTED=json.dumps(["FS_READ"]), CHANNELS__SAVE_FILES="true") as stack:
        yield stack


def workspace(channels: ChannelStack) -> Path:
    return Path(channels.stack.env["NANOFLEET_WORKSPACE"])


def asking(**args: object) -> str:
    """What makes the fake model call the message tool with these arguments."""
    return f"call:message{json.dumps(args)}"


@pytest.mark.parametrize("name", PLATFORMS)
def test_files_the_model_sends_reach_the_chat_after_the_text(channels: ChannelStack, name: str) -> None:
    d, marker = channels.driver(name), uuid.uuid4().hex[:8]
    chat, report, chart = d.new_chat(), f"a,b\n{marker},2\n".encode(), png(30, 20)
    (workspace(channels) / f"report-{marker}.csv").write_bytes(report)
    (workspace(channels) / "chart.png").write_bytes(chart)
    ask = asking(content=f"Here it is {marker}", files=[f"report-{marker}.csv", "chart.png"])
    assert channels.post(name, d.request(chat=chat, text=ask)).status_code == 200
    channels.settled(chat, rows=3)
    assert d.fake.received_files(chat) == [(f"report-{marker}.csv", report), ("chart.png", chart)]
    assert d.replies(chat)[0] == f"Here it is {marker}"  # the text first; the model's final reply replaced
    sent = channels.scalar("select count(*) from outbox where chat_id = :c and status = 'delivered'", c=chat)
    assert sent == 3 and d.fake.refused == []


def test_a_file_the_platform_refuses_is_dead_lettered_after_the_text(channels: ChannelStack) -> None:
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat = d.new_chat()
    (workspace(channels) / "notes.txt").write_text("notes")
    tg.script("sendDocument", 400, {"ok": False, "error_code": 400, "description": "Bad Request: chat not found"})
    assert channels.post("telegram", d.request(chat=chat, text=asking(content="notes", files=["notes.txt"]))
                         ).status_code == 200
    channels.settled(chat, rows=2)
    assert d.replies(chat) == ["notes"] and tg.received_files(chat) == []
    failed = channels.scalar("select last_error from outbox where chat_id = :c and status = 'failed'", c=chat)
    assert "chat not found" in failed


def test_an_api_caller_fetches_the_files_by_their_links(channels: ChannelStack) -> None:
    marker = uuid.uuid4().hex[:8]
    (workspace(channels) / f"{marker} résumé.pdf").write_bytes(b"%PDF-1.4 " + marker.encode())
    conversation = channels.api.post("/api/v1/conversations", json={}).json()["conversationId"]
    answer = channels.api.post(f"/api/v1/conversations/{conversation}/chat",
                               json={"message": asking(content="attached", files=[f"{marker} résumé.pdf"])})
    assert answer.status_code == 200, answer.text
    [call] = answer.json()["toolCalls"]
    [link] = json.loads(call["result"])["files"]
    assert (link["name"], link["mime"], link["size"]) == (f"{marker} résumé.pdf", "application/pdf", 17)
    got = channels.api.get(link["url"])
    assert got.status_code == 200 and got.content == b"%PDF-1.4 " + marker.encode()
    assert got.headers["content-type"] == "application/pdf" and got.headers["x-content-type-options"] == "nosniff"
    assert got.headers["content-disposition"] == f"attachment; filename*=UTF-8''{marker}%20r%C3%A9sum%C3%A9.pdf"
    assert channels.http.get(link["url"]).status_code == 401  # the API key is needed
    assert channels.api.get("/api/v1/files/nope").status_code == 404
    assert channels.api.delete(f"/api/v1/conversations/{conversation}").status_code == 204
    assert channels.api.get(link["url"]).status_code == 404  # gone with its conversation


def test_a_file_a_user_sends_is_kept_and_the_model_told_where_even_one_it_cannot_read(
        channels: ChannelStack, fake_llm: FakeLLM) -> None:
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat, sheet = d.new_chat(), b"PK\x03\x04" + uuid.uuid4().bytes * 8  # a spreadsheet: a zip, no text
    day = datetime.now(UTC).date().isoformat()
    for _ in range(2):  # sent twice: kept once
        update = tg.document(chat=int(chat), sender=int(d.allowed), content=sheet, name="../q3 sales.xlsx",
                             mime="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet")
        assert channels.post("telegram", tg.signed(update)).status_code == 200
        channels.settled(chat, rows=len(d.replies(chat)) + 1)
    kept = f"inbox/{day}/q3 sales.xlsx"
    assert (workspace(channels) / kept).read_bytes() == sheet
    assert sorted(p.name for p in (workspace(channels) / "inbox" / day).iterdir()) == ["q3 sales.xlsx"]
    with fake_llm.lock:
        asked = [last_user_text(r["messages"]) for r in fake_llm.requests]
    said = f"[file ../q3 sales.xlsx: not read, it is neither a PDF nor a text file; saved as {kept}]"
    assert asked.count(said) == 2  # answered by the model, not with a notice


def test_photos_and_voice_messages_a_user_sends_are_kept_for_a_model_that_sees_and_hears_neither(
        channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """The stack's model sees no images and no transcription model is set: without kept files a photo's
    caption goes on saying a photo came (a photo or voice message alone gets a notice and no model).
    Kept, each goes to the model with its place in the workspace, for its tools to open."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat, day = d.new_chat(), datetime.now(UTC).date().isoformat()
    photo, alone = png(8, 5), png(4, 4)
    sent = [tg.photo(chat=int(chat), sender=int(d.allowed), image=photo, caption="crop this"),
            tg.photo(chat=int(chat), sender=int(d.allowed), image=alone)]
    tg.files["v9"] = b"OggS" + uuid.uuid4().bytes
    sent.append(tg.update(chat=int(chat), sender=int(d.allowed), text="", voice={"file_id": "v9", "duration": 2}))
    for update in sent:
        assert channels.post("telegram", tg.signed(update)).status_code == 200
        channels.settled(chat, rows=len(d.replies(chat)) + 1)
    inbox = workspace(channels) / "inbox" / day
    kept = {p.name: p.read_bytes() for p in inbox.iterdir() if p.name.startswith(("photo", "v9"))}
    names = {data: f"inbox/{day}/{name}" for name, data in kept.items()}
    assert set(kept.values()) == {photo, alone, tg.files["v9"]}
    assert all(name.endswith((".jpg", ".oga")) for name in kept)  # as Telegram's getFile names them
    with fake_llm.lock:
        asked = [last_user_text(r["messages"]) for r in fake_llm.requests[-3:]]
    assert asked == [f"crop this\n\n[The user sent a photo, saved as {names[photo]}; you cannot see images.]",
                     f"[The user sent a photo, saved as {names[alone]}; you cannot see images.]",
                     f"[The user sent a voice message, saved as {names[tg.files['v9']]}; it was not transcribed.]"]
    assert not [r for r in d.replies(chat) if "only read text" in r or "Sorry" in r]


def test_an_album_of_six_photos_fetches_and_keeps_only_the_four_the_model_is_given(
        channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """Every photo was fetched and kept, and the model shown where all six were, then told it was not
    given two of them."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat, marker, fetched = d.new_chat(), uuid.uuid4().hex[:8], len(tg.downloads)
    updates = [tg.photo(chat=int(chat), sender=int(d.allowed), image=png(60 + i, 3), album=f"album-{marker}",
                        caption=f"which? {marker}" if i == 0 else None) for i in range(6)]
    for update in updates:
        assert channels.post("telegram", tg.signed(update)).status_code == 200
    channels.settled(chat)
    ids = [u["message"]["photo"][-1]["file_id"] for u in updates]
    assert sorted(tg.downloads[fetched:]) == sorted(ids[:4])
    with fake_llm.lock:
        [said] = [t for t in (last_user_text(r["messages"]) for r in fake_llm.requests) if marker in t]
    assert said.count("saved as inbox/") == 4 and said.startswith(f"which? {marker}")
    assert said.endswith("[2 more item(s) came with this message that you were not given: 4 are read at most.]")
