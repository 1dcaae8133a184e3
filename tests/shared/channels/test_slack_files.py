"""Slack sends the agent's files against the fake Web API over real HTTP, by Slack's external upload:
files.getUploadURLExternal, the bytes to the upload URL it gives, files.completeUploadExternal sharing
the file in the chat (in the thread a reply would go to), errors mapped as chat.postMessage's are."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shared.channels.base import OutFile, RateLimited, Rejected
from shared.channels.clients import PlatformError
from shared.channels.slack import SlackChannel
from shared.settings import Settings
from tests.fakes.slack import FakeSlack

CHAT = "C0FILES01"
PDF = OutFile("Q3 report.pdf", "application/pdf", b"%PDF-1.4\n" + bytes(range(256)) * 40)
PNG = OutFile("chart.png", "image/png", b"\x89PNG\r\n\x1a\n" + b"\x00\x01pixels" * 300)
STEPS = ("files.getUploadURLExternal", "upload", "files.completeUploadExternal")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeSlack]:
    sl = FakeSlack("xoxb-files-unit", "files-signing-secret")
    sl.start()
    yield sl
    sl.server.stop()


@pytest.fixture
def channel(fake: FakeSlack) -> SlackChannel:
    fake.reset()
    return on(fake)


def on(fake: FakeSlack, *, bot_token: str | None = None) -> SlackChannel:
    return SlackChannel(Settings(channels={"slack": {
        "bot_token": bot_token or fake.bot_token, "signing_secret": fake.signing_secret, "api_base": fake.url,
        "allow_from": ["*"]}}))


def meta(outbox_id: str, **reply: Any) -> dict[str, Any]:
    return {**reply, "chunk": 1, "chunks": 1, "outbox_id": outbox_id}


def completions(fake: FakeSlack) -> list[dict[str, Any]]:
    return [c.body for c in fake.calls if c.op == "files.completeUploadExternal" and c.status == 200]


def test_files_reach_the_chat_with_their_names_and_bytes(channel: SlackChannel, fake: FakeSlack) -> None:
    first = channel.send_file(CHAT, PDF, meta("ob-pdf"))
    channel.send_file(CHAT, PNG, meta("ob-png"))
    assert fake.received_files(CHAT) == [(PDF.name, PDF.data), (PNG.name, PNG.data)]
    assert fake.refused == []
    [shared, _] = completions(fake)
    assert shared["files"] == [{"id": first.platform_message_id, "title": PDF.name}]
    assert "thread_ts" not in shared  # a plain DM: no thread
    uploads = [c for c in fake.calls if c.op == "upload"]
    assert len(uploads) == 2 and all("authorization" not in c.headers for c in uploads)  # the token stays with the API


def test_a_file_answering_a_thread_goes_into_the_thread(channel: SlackChannel, fake: FakeSlack) -> None:
    channel.send_file(CHAT, PDF, meta("ob-thread", thread_ts="1700000000.000100"))
    assert fake.received_files(CHAT) == [(PDF.name, PDF.data)]
    [shared] = completions(fake)
    assert (shared["channel_id"], shared.get("thread_ts")) == (CHAT, "1700000000.000100")


@pytest.mark.parametrize("step", STEPS)
def test_a_429_at_any_step_raises_rate_limited_with_slacks_wait(channel: SlackChannel, fake: FakeSlack,
                                                                step: str) -> None:
    fake.rate_limit(retry_after=7, op=step)
    with pytest.raises(RateLimited) as limited:
        channel.send_file(CHAT, PDF, meta(f"ob-429-{step}"))
    assert limited.value.retry_after == 7
    assert fake.received_files(CHAT) == []


@pytest.mark.parametrize("error", ["channel_not_found", "not_in_channel", "is_archived"])
def test_a_chat_slack_refuses_raises_rejected(channel: SlackChannel, fake: FakeSlack, error: str) -> None:
    fake.script("files.completeUploadExternal", 200, {"ok": False, "error": error})
    with pytest.raises(Rejected, match=error):
        channel.send_file(CHAT, PDF, meta(f"ob-{error}"))
    assert fake.received_files(CHAT) == []


def test_a_wrong_bot_token_is_rejected(fake: FakeSlack) -> None:
    fake.reset()
    with pytest.raises(Rejected, match="invalid_auth"):
        on(fake, bot_token="xoxb-revoked").send_file(CHAT, PDF, meta("ob-auth"))
    assert fake.refused == ["files.getUploadURLExternal without the bot token"]


@pytest.mark.parametrize("step", STEPS)
def test_a_5xx_at_any_step_is_retried_and_the_retry_delivers(channel: SlackChannel, fake: FakeSlack,
                                                             step: str) -> None:
    fake.script(step, 503, {"ok": False, "error": "service_unavailable"})
    with pytest.raises(PlatformError):  # not Rejected: the delivery worker tries again
        channel.send_file(CHAT, PDF, meta("ob-5xx"))
    channel.send_file(CHAT, PDF, meta("ob-5xx"))
    assert fake.received_files(CHAT) == [(PDF.name, PDF.data)]


def test_a_transient_error_slack_answers_with_200_is_retried(channel: SlackChannel, fake: FakeSlack) -> None:
    fake.script("files.completeUploadExternal", 200, {"ok": False, "error": "internal_error"})
    with pytest.raises(PlatformError, match="internal_error"):
        channel.send_file(CHAT, PNG, meta("ob-internal"))
    assert fake.received_files(CHAT) == []
