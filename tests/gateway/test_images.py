"""Photos sent in a chat, with a model that sees images (NANOFLEET_LLM__VISION), end to end: the fake
Telegram and WhatsApp hand out the photo (getFile and /file/, the Graph API's media URL), the gateway
and a real worker take it in, and the fake model reads it from the data URL litellm sends, as a vision
model would, and names its type, size and sha256 in its echo."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Iterator

import pytest

from shared.agent.prompt import NOT_SHOWN
from shared.channels.images import NOT_AN_IMAGE
from tests.fakes.llm import FakeLLM
from tests.support.platforms import ChannelStack, started_channel_stack


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


def test_a_file_that_is_no_image_gets_a_notice_and_no_llm_call(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat = d.new_chat()
    update = tg.photo(chat=int(chat), sender=int(d.allowed), image=b"<html>not a photo</html>", caption="look")
    assert channels.post("telegram", tg.signed(update)).status_code == 200
    channels.settled(chat)
    assert d.replies(chat) == [NOT_AN_IMAGE]
    assert fake_llm.calls() == 0 and channels.scalar("select count(*) from messages") == 0
