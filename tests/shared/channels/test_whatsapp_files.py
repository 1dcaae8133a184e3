"""WhatsApp sends the agent's files against the fake Cloud API over real HTTP: each is uploaded to /media,
then sent by its id, a JPEG or PNG within 5 MB as a photo and anything else as a document under its name."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from shared.channels.base import OutFile, RateLimited, Rejected
from shared.channels.whatsapp import PHOTO_LIMIT, WhatsAppChannel
from shared.settings import Settings
from tests.fakes.whatsapp import FakeWhatsApp
from tests.support.documents import pdf
from tests.support.platforms import ChannelStack

CHAT = "15550001111"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + b"pixels" * 100


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeWhatsApp]:
    wa = FakeWhatsApp("wa-unit-token", "wa-unit-secret", "PHONE_UNIT")
    wa.start()
    yield wa
    wa.server.stop()


@pytest.fixture
def channel(fake: FakeWhatsApp) -> WhatsAppChannel:
    fake.reset()
    return WhatsAppChannel(Settings(channels={"whatsapp": {
        "access_token": fake.access_token, "app_secret": fake.app_secret, "verify_token": "unit-verify",
        "phone_number_id": fake.phone_number_id, "api_base": fake.url, "allow_from": ["*"]}}))


def messages(fake: FakeWhatsApp) -> list[dict[str, object]]:
    """The bodies of the messages that reached CHAT, in order."""
    return [c.body for c in fake.sent(CHAT)]


def test_a_pdf_goes_as_a_document_with_its_name_and_bytes(channel: WhatsAppChannel, fake: FakeWhatsApp) -> None:
    report, wamid = pdf("Revenue rose"), fake.next_wamid()
    result = channel.send_file(CHAT, OutFile("Q3 report.pdf", "application/pdf", report), {})
    assert fake.received_files(CHAT) == [("Q3 report.pdf", report)]
    assert [m["type"] for m in messages(fake)] == ["document"] and result.platform_message_id == wamid
    assert fake.refused == [] and fake.texts(CHAT) == []


def test_a_png_goes_as_a_photo_whatever_type_it_was_named_as(channel: WhatsAppChannel, fake: FakeWhatsApp) -> None:
    channel.send_file(CHAT, OutFile("chart", "application/octet-stream", PNG), {})
    assert [m["type"] for m in messages(fake)] == ["image"]
    assert fake.received_files(CHAT) == [("chart", PNG)]  # the name WhatsApp was given with the upload
    assert fake.refused == []


def test_a_png_over_the_photo_limit_goes_as_a_document(channel: WhatsAppChannel, fake: FakeWhatsApp) -> None:
    big = PNG + b"\x00" * PHOTO_LIMIT
    channel.send_file(CHAT, OutFile("scan.png", "image/png", big), {})
    assert [m["type"] for m in messages(fake)] == ["document"]
    assert fake.received_files(CHAT) == [("scan.png", big)] and fake.refused == []


def test_a_text_file_of_a_type_whatsapp_does_not_list_goes_as_plain_text(channel: WhatsAppChannel,
                                                                         fake: FakeWhatsApp) -> None:
    for name, mime in (("notes.md", "text/markdown"), ("data.json", "application/json; charset=utf-8")):
        channel.send_file(CHAT, OutFile(name, mime, b"# Notes\n"), {})
    assert fake.received_files(CHAT) == [("notes.md", b"# Notes\n"), ("data.json", b"# Notes\n")]
    assert fake.refused == []


def test_a_reply_s_first_file_quotes_the_message_it_answers(channel: WhatsAppChannel, fake: FakeWhatsApp) -> None:
    meta = {"reply_to": "wamid.in1", "chunks": 2}
    channel.send_file(CHAT, OutFile("a.pdf", "application/pdf", pdf("a")), {**meta, "chunk": 0})
    channel.send_file(CHAT, OutFile("b.png", "image/png", PNG), {**meta, "chunk": 1})
    assert [m.get("context") for m in messages(fake)] == [{"message_id": "wamid.in1"}, None]


def test_a_429_from_the_upload_or_the_message_is_rate_limited(channel: WhatsAppChannel, fake: FakeWhatsApp) -> None:
    file = OutFile("a.pdf", "application/pdf", pdf("a"))
    fake.script("upload", 400, {"error": {"message": "(#4) Application request limit reached", "code": 4}})
    with pytest.raises(RateLimited) as err:
        channel.send_file(CHAT, file, {})
    assert err.value.retry_after == 60.0
    fake.rate_limit()  # the message: HTTP 429, code 130429
    with pytest.raises(RateLimited):
        channel.send_file(CHAT, file, {})
    assert fake.received_files(CHAT) == []


def test_a_file_whatsapp_refuses_is_rejected(channel: WhatsAppChannel, fake: FakeWhatsApp) -> None:
    with pytest.raises(Rejected, match="HTTP 400"):
        channel.send_file(CHAT, OutFile("site.zip", "application/zip", b"PK\x03\x04zip"), {})
    assert fake.refused == ["a media upload of type 'application/zip'"]
    fake.script("messages", 400, {"error": {"message": "(#131047) Re-engagement message", "code": 131047}})
    with pytest.raises(Rejected, match="HTTP 400"):
        channel.send_file(CHAT, OutFile("a.pdf", "application/pdf", pdf("a")), {})
    assert fake.received_files(CHAT) == []


def test_a_5xx_is_retried_and_the_retry_uploads_again(channel: WhatsAppChannel, fake: FakeWhatsApp) -> None:
    file = OutFile("a.pdf", "application/pdf", pdf("a"))
    for op in ("upload", "messages"):
        fake.script(op, 500, {"error": {"message": "An unknown error occurred", "code": 1}})
        with pytest.raises(Exception) as err:
            channel.send_file(CHAT, file, {})
        assert not isinstance(err.value, (Rejected, RateLimited)), op
    channel.send_file(CHAT, file, {})  # the retry after the message failed: a fresh upload, then the message
    assert fake.received_files(CHAT) == [("a.pdf", file.data)] and fake.uploads() == 2


def test_a_file_whatsapp_will_not_hand_out_gets_a_plain_reason(channels: ChannelStack) -> None:
    """A WhatsApp user was shown the Graph API's error body (an expired token's, with its trace id) and
    asked to send the photo again (a QA pass). The notice gives a plain reason, and asks for nothing when
    the fault is the bot's; the worker log keeps the status and the body, without the token."""
    wa, w = channels.fakes["whatsapp"], channels.driver("whatsapp")
    expired = {"error": {"message": f"Error validating access token: Session has expired ({wa.access_token})",
                         "type": "OAuthException", "code": 190, "error_subcode": 463, "fbtrace_id": "AtRaCe42"}}
    told = {}
    for status, answer in ((401, expired), (404, {"error": {"message": "Unsupported get request", "code": 100}})):
        number = w.new_chat()
        wa.script("media", status, answer)
        doc = wa.document(sender=number, wamid=f"wamid.{uuid.uuid4().hex}", content=b"notes", name="notes.txt",
                          mime="text/plain")
        assert channels.post("whatsapp", wa.signed(doc)).status_code == 200
        channels.settled(number)
        told[status] = w.replies(number)
    assert told == {
        401: ["Sorry, I couldn't get your file from whatsapp (I can't fetch it right now; the problem is on my "
              "side, not yours)."],
        404: ["Sorry, I couldn't get your file from whatsapp (it is no longer available). Could you send it again?"]}
    logs = "".join(p.log() for p in channels.stack.procs)
    assert "could not be fetched: whatsapp media: HTTP 401: " in logs and "AtRaCe42" in logs
    assert wa.access_token not in logs
