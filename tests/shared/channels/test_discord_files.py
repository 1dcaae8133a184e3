"""Discord sends the agent's files against the fake API over real HTTP, as its multipart form
(payload_json plus files[0]) wherever a text would go: a bot message in the channel, the interaction's
deferred "thinking..." (a file may be the whole reply) or a follow-up; 429, 4xx and 5xx map as send's."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shared.channels.base import OutFile, RateLimited, Rejected
from shared.channels.clients import PlatformError
from shared.channels.discord import DiscordChannel
from shared.settings import Settings
from tests.fakes.discord import FakeDiscord, message_of

CHAT = "112233445566778899"
PDF = OutFile("quarterly report é.pdf", "application/pdf", b"%PDF-1.7\n" + bytes(range(256)) * 40)
PNG = OutFile("chart.png", "image/png", b"\x89PNG\r\n\x1a\n" + b"\x00pixels" * 100)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeDiscord]:
    dc = FakeDiscord("APP7", "unit-bot-token")
    dc.start()
    yield dc
    dc.server.stop()


@pytest.fixture
def channel(fake: FakeDiscord, redis_url: str) -> DiscordChannel:
    fake.reset()
    return DiscordChannel(Settings(redis_url=redis_url, channels={"discord": {
        "application_id": fake.application_id, "public_key": fake.public_key, "bot_token": fake.bot_token,
        "api_base": fake.url, "allow_from": ["*"]}}))


def row(chunk: int = 0, chunks: int = 1, **reply_meta: Any) -> dict[str, Any]:
    """What the delivery worker passes as meta: the reply_meta plus chunk, chunks and outbox_id."""
    return {**reply_meta, "chunk": chunk, "chunks": chunks, "outbox_id": uuid.uuid4().hex}


def interaction(fake: FakeDiscord, chat: str = CHAT) -> dict[str, str]:
    """The reply_meta of a fresh /ask in `chat`, whose response is "thinking..."."""
    token = fake.command(channel=chat, user="1001", text="q", interaction_id=uuid.uuid4().hex)["token"]
    return {"interaction_token": token, "application_id": fake.application_id}


def test_a_file_reaches_the_channel_as_a_bot_message(channel: DiscordChannel, fake: FakeDiscord) -> None:
    meta = row(0, 2)
    assert channel.send_file(CHAT, PDF, meta).platform_message_id
    assert channel.send_file(CHAT, PNG, row(1, 2)).platform_message_id
    assert fake.received_files(CHAT) == [(PDF.name, PDF.data), (PNG.name, PNG.data)]
    first = fake.sent(CHAT)[0]
    assert (first.op, first.headers["authorization"]) == ("channel_message", f"Bot {fake.bot_token}")
    sent = message_of(first)
    assert (sent["nonce"], sent["enforce_nonce"]) == (meta["outbox_id"][:25], True)  # a resend is dropped
    assert sent["allowed_mentions"] == {"parse": []}
    assert fake.refused == []


def test_a_file_that_is_the_first_reply_replaces_thinking(channel: DiscordChannel, fake: FakeDiscord) -> None:
    """A reply of files only: its first file is the interaction's response, no "thinking..." is left."""
    reply = interaction(fake)
    first, second = row(0, 2, **reply), row(1, 2, **reply)
    channel.send_file(CHAT, PNG, first)
    channel.send_file(CHAT, PNG, first)  # a resend of the same row edits it again, it adds nothing
    channel.send_file(CHAT, PDF, second)
    assert [c.op for c in fake.sent(CHAT)] == ["edit_original", "edit_original", "followup"]
    assert fake.received_files(CHAT)[1:] == [(PNG.name, PNG.data), (PDF.name, PDF.data)]
    assert fake.refused == []


def test_a_file_after_the_text_follows_it(channel: DiscordChannel, fake: FakeDiscord) -> None:
    reply = interaction(fake)
    channel.send(CHAT, "here is the report", row(0, 2, **reply))
    channel.send_file(CHAT, PDF, row(1, 2, **reply))
    assert [(c.op, fake.text_of(c)) for c in fake.sent(CHAT)] == [
        ("edit_original", "here is the report"), ("followup", "")]
    assert fake.received_files(CHAT) == [(PDF.name, PDF.data)]
    assert fake.sent(CHAT)[1].path == f"/webhooks/{fake.application_id}/{reply['interaction_token']}"


def test_a_file_for_an_expired_interaction_goes_to_the_channel(channel: DiscordChannel, fake: FakeDiscord) -> None:
    reply = interaction(fake)
    del fake.interactions[reply["interaction_token"]]  # 15 minutes went by
    channel.send_file(CHAT, PDF, row(0, 1, **reply))
    assert [(c.op, c.status) for c in fake.calls] == [("edit_original", 401), ("channel_message", 200)]
    assert fake.received_files(CHAT) == [(PDF.name, PDF.data)]


def test_a_reply_the_interaction_refuses_for_itself_is_not_posted_in_the_channel(channel: DiscordChannel,
                                                                                  fake: FakeDiscord) -> None:
    """Any 4xx on the interaction's webhook sent the reply again as a bot message: one Discord refused
    for what it held would be refused there too, or, had the first taken it after all, shown twice.
    Only an expired token (401, 404) goes to the channel."""
    reply = interaction(fake)
    fake.script("edit_original", 400, {"message": "Invalid Form Body", "code": 50035})
    with pytest.raises(Rejected, match="400"):
        channel.send(CHAT, "the answer", row(0, 1, **reply))
    assert [(c.op, c.status) for c in fake.calls] == [("edit_original", 400)]


def test_a_file_up_to_the_limit_is_sent_and_a_larger_one_is_rejected(channel: DiscordChannel,
                                                                     fake: FakeDiscord) -> None:
    assert channel.max_file_bytes == 10 * 1024 * 1024
    largest = OutFile("big.bin", "application/octet-stream", b"x" * channel.max_file_bytes)
    channel.send_file(CHAT, largest, row())
    with pytest.raises(Rejected, match="413"):
        channel.send_file(CHAT, OutFile("big.bin", largest.mime, largest.data + b"x"), row())
    assert [len(data) for _, data in fake.received_files(CHAT)] == [channel.max_file_bytes]


def test_a_429_raises_rate_limited_with_discords_wait(channel: DiscordChannel, fake: FakeDiscord) -> None:
    fake.rate_limit("channel_message", retry_after=0.7)
    with pytest.raises(RateLimited) as err:
        channel.send_file(CHAT, PDF, row())
    assert err.value.retry_after == 0.7
    reply = interaction(fake)
    fake.rate_limit("edit_original", retry_after=1.5)
    with pytest.raises(RateLimited) as err:  # not sent to the channel instead: it waits its turn
        channel.send_file(CHAT, PDF, row(0, 1, **reply))
    assert err.value.retry_after == 1.5
    assert fake.received_files(CHAT) == []


def test_a_server_error_is_retried_and_not_rejected(channel: DiscordChannel, fake: FakeDiscord) -> None:
    fake.script("channel_message", 502, {"message": "Bad Gateway"})
    meta = row()
    with pytest.raises(PlatformError) as err:
        channel.send_file(CHAT, PDF, meta)
    assert not isinstance(err.value, Rejected | RateLimited)
    channel.send_file(CHAT, PDF, meta)  # the retry
    assert fake.received_files(CHAT) == [(PDF.name, PDF.data)]


def test_the_fake_refuses_a_form_discord_would_refuse(fake: FakeDiscord) -> None:
    """The shapes above are checked: a form whose attachment names no part, whose payload_json is no
    JSON, or that has nothing to show is refused as Discord refuses it."""
    fake.reset()
    url, auth = f"{fake.url}/channels/{CHAT}/messages", {"Authorization": f"Bot {fake.bot_token}"}

    def post(payload: str, parts: dict[str, tuple[str, bytes]]) -> int:
        form: dict[str, tuple[str | None, bytes]] = {"payload_json": (None, payload.encode()), **parts}
        return httpx.post(url, files=form, headers=auth).status_code

    one = {"files[0]": ("a.txt", b"a")}
    assert post(json.dumps({"attachments": [{"id": 1, "filename": "a.txt"}]}), one) == 400
    assert post("{not json", one) == 400
    assert post(json.dumps({"content": " "}), {}) == 400
    assert post(json.dumps({"attachments": [{"id": 0, "filename": "b.txt"}]}), one) == 200
    assert len(fake.refused) == 3 and fake.received_files(CHAT) == [("b.txt", b"a")]  # named as its attachment says
