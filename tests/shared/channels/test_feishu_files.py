"""Feishu sends the agent's files against the fake Open API over real HTTP: a photo uploaded as an
image, anything else as a file, then sent by its key the way a text is (same endpoint, uuid and
error mapping)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from shared.channels.base import OutFile, RateLimited, Rejected
from shared.channels.clients import PlatformError
from shared.channels.feishu import FeishuChannel
from tests.fakes.feishu import FakeFeishu
from tests.shared.channels.test_feishu import on

CHAT = "oc_files"
PDF = OutFile("report.pdf", "application/pdf", b"%PDF-1.4\n" + bytes(range(256)) * 40)
PNG = OutFile("chart.png", "image/png", b"\x89PNG\r\n\x1a\n" + b"\x00\x01pixels" * 300)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeFeishu]:
    fs = FakeFeishu("cli_files", "files-secret", "files-verification", "files-encrypt-key")
    fs.start()
    yield fs
    fs.server.stop()


@pytest.fixture
def channel(fake: FakeFeishu, redis_url: str) -> FeishuChannel:
    fake.reset()
    return on(fake, redis_url)


def meta(outbox_id: str, **reply: Any) -> dict[str, Any]:
    return {**reply, "chunk": 1, "chunks": 1, "outbox_id": outbox_id}


def bodies(fake: FakeFeishu, op: str) -> list[dict[str, Any]]:
    return [c.body for c in fake.calls if c.op == op]


def test_a_pdf_goes_as_a_file_with_its_name_and_bytes(channel: FeishuChannel, fake: FakeFeishu) -> None:
    result = channel.send_file(CHAT, PDF, meta("ob-pdf"))
    assert fake.received_files(CHAT) == [("report.pdf", PDF.data)]
    [message] = fake.sent(CHAT)
    assert message.body["msg_type"] == "file" and result.platform_message_id
    channel.send_file(CHAT, OutFile("notes.csv", "text/csv", b"a,b\n1,2\n"), meta("ob-csv"))
    assert [b["file_type"] for b in bodies(fake, "im.file.create")] == ["pdf", "stream"]
    assert fake.received_files(CHAT)[1] == ("notes.csv", b"a,b\n1,2\n")
    assert bodies(fake, "im.image.create") == [] and fake.refused == []


def test_a_png_goes_as_an_image(channel: FeishuChannel, fake: FakeFeishu) -> None:
    channel.send_file(CHAT, PNG, meta("ob-png"))
    [message] = fake.sent(CHAT)
    assert message.body["msg_type"] == "image" and "image_key" in json.loads(message.body["content"])
    assert fake.received_files(CHAT) == [("chart.png", PNG.data)]
    assert bodies(fake, "im.file.create") == [] and fake.refused == []


def test_a_photo_over_10_mb_goes_as_a_file(channel: FeishuChannel, fake: FakeFeishu) -> None:
    big = OutFile("big.png", "image/png", PNG.data + b"\x00" * (10 * 1024 * 1024))
    assert big.image and len(big.data) <= channel.max_file_bytes == 30 * 1024 * 1024
    channel.send_file(CHAT, big, meta("ob-big"))
    assert [c.body["msg_type"] for c in fake.sent(CHAT)] == ["file"]
    assert fake.received_files(CHAT) == [("big.png", big.data)] and fake.refused == []


def test_a_file_answering_a_message_goes_to_its_chat_as_a_text_does(channel: FeishuChannel,
                                                                     fake: FakeFeishu) -> None:
    answering = meta("ob-reply", message_id="om_in42")
    channel.send(CHAT, "here it is", answering)
    channel.send_file(CHAT, PDF, {**answering, "outbox_id": "ob-reply-file"})
    text, file = fake.sent(CHAT)  # send creates a message in the chat (no reply endpoint): so do files
    assert text.path == file.path == "/im/v1/messages" and file.body["receive_id"] == CHAT
    assert fake.received_files(CHAT) == [("report.pdf", PDF.data)]


def test_the_same_outbox_id_sent_twice_carries_the_same_uuid(channel: FeishuChannel, fake: FakeFeishu) -> None:
    first = channel.send_file(CHAT, PNG, meta("ob-twice"))
    again = channel.send_file(CHAT, PNG, meta("ob-twice"))  # a retry after a lost answer
    channel.send_file(CHAT, PNG, meta("ob-other"))
    assert [b["uuid"] for b in bodies(fake, "im.message.create")] == ["ob-twice", "ob-twice", "ob-other"]
    assert first.platform_message_id == again.platform_message_id
    assert fake.received_files(CHAT) == [("chart.png", PNG.data)] * 2  # the repeat shows once


def test_an_upload_with_a_token_feishu_calls_invalid_goes_again_with_a_fresh_one(
        channel: FeishuChannel, fake: FakeFeishu) -> None:
    channel.tenant_token()  # cached in Redis, then revoked: the upload is refused once
    fake.revoke_tokens()
    channel.send_file(CHAT, PDF, meta("ob-token"))
    assert [c.status for c in fake.calls if c.op == "im.file.create"] == [400, 200]
    assert fake.received_files(CHAT) == [("report.pdf", PDF.data)]


def test_a_rate_limit_raises_rate_limited(channel: FeishuChannel, fake: FakeFeishu) -> None:
    fake.rate_limit()
    with pytest.raises(RateLimited) as err:
        channel.send_file(CHAT, PDF, meta("ob-limited"))
    assert err.value.retry_after == 1.0
    fake.script("im.image.create", 400, {"code": 99991400, "msg": "request trigger frequency limit"})
    with pytest.raises(RateLimited):  # Feishu's throttling answers HTTP 400, the upload's too
        channel.send_file(CHAT, PNG, meta("ob-limited-png"))
    assert fake.received_files(CHAT) == []


def test_a_refusal_raises_rejected(channel: FeishuChannel, fake: FakeFeishu) -> None:
    fake.script("im.file.create", 400, {"code": 234006, "msg": "The file size exceed the max value."})
    with pytest.raises(Rejected):
        channel.send_file(CHAT, PDF, meta("ob-refused"))
    fake.script("im.message.create", 400, {"code": 230002, "msg": "The bot can not be outside the group."})
    with pytest.raises(Rejected):
        channel.send_file(CHAT, PNG, meta("ob-refused-png"))
    assert fake.received_files(CHAT) == []


def test_a_server_error_raises_something_retried(channel: FeishuChannel, fake: FakeFeishu) -> None:
    fake.script("im.image.create", 500, {"code": 1, "msg": "internal error"})
    with pytest.raises(PlatformError):  # neither Rejected nor RateLimited: the worker tries again
        channel.send_file(CHAT, PNG, meta("ob-5xx"))
    fake.script("im.message.create", 503, {"code": 1, "msg": "service unavailable"})
    with pytest.raises(PlatformError):
        channel.send_file(CHAT, PNG, meta("ob-5xx"))
    channel.send_file(CHAT, PNG, meta("ob-5xx"))  # the retry
    assert fake.received_files(CHAT) == [("chart.png", PNG.data)]
