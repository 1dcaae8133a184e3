"""Voice messages with a transcription model set, end to end: the fake Telegram and WhatsApp hand out
the audio (getFile and /file/, the Graph API's media URL), the fake model transcribes it over
litellm's transcription call, the gateway and a real worker do the rest. The tests' "audio" is the
spoken words themselves, which the fake model hands back."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.channels.voice import HEARD, MAX_AUDIO, NO_WORDS
from tests.fakes.llm import FakeLLM
from tests.support.platforms import ChannelStack, llm_requests_with, started_channel_stack
from tests.support.processes import wait_until

MODEL = "openai/whisper-test"


@pytest.fixture(scope="module")
def channel_stack(database_url: str, redis_server: str, fake_llm: FakeLLM,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChannelStack]:
    """The channel stack of the other webhook tests, with transcription on."""
    with started_channel_stack(database_url, redis_server, fake_llm, tmp_path_factory.mktemp("voice"),
                               LLM__TRANSCRIPTION_MODEL=MODEL) as stack:
        yield stack


def _telegram_voice(channels: ChannelStack, audio: bytes) -> str:
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat = d.new_chat()
    update = tg.signed(tg.voice(chat=int(chat), sender=int(d.allowed), audio=audio))
    for _ in range(2):  # and Telegram's retry of it
        assert channels.post("telegram", update).status_code == 200
    channels.settled(chat)
    return chat


def test_a_telegram_voice_message_is_transcribed_and_answered(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    chat = _telegram_voice(channels, "what time is it in São Paulo".encode())
    said = HEARD + "what time is it in São Paulo"
    assert channels.driver("telegram").replies(chat) == [f"echo: {said}"]
    assert [(t["model"], t["filename"]) for t in fake_llm.transcriptions] == [("whisper-test", "voice1.oga")]
    assert llm_requests_with(fake_llm, said) == 1
    assert channels.scalar("select content from messages where role = 'USER'") == said


def test_a_voice_message_s_caption_and_a_reply_to_a_voice_message_keep_their_words(channels: ChannelStack,
                                                                                  fake_llm: FakeLLM) -> None:
    """A captioned voice message was read as its caption alone, and a reply to one as the reply alone."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat = d.new_chat()
    captioned = tg.voice(chat=int(chat), sender=int(d.allowed), audio=b"meet at noon")
    captioned["message"]["caption"] = "from Ann"
    assert channels.post("telegram", tg.signed(captioned)).status_code == 200
    channels.settled(chat)
    earlier = tg.voice(chat=int(chat), sender=int(d.allowed), audio=b"the code is 4711")["message"]
    reply = tg.update(chat=int(chat), sender=int(d.allowed), text="what was the code?", reply_to_message=earlier)
    assert channels.post("telegram", tg.signed(reply)).status_code == 200
    channels.settled(chat, rows=2)
    assert d.replies(chat) == [f"echo: from Ann\n\n{HEARD}meet at noon",
                               f"echo: what was the code?\n\n{HEARD}the code is 4711"]


def test_a_whatsapp_voice_note_is_transcribed_and_answered(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    wa, w = channels.fakes["whatsapp"], channels.driver("whatsapp")
    number = w.new_chat()
    assert channels.post("whatsapp", wa.signed(wa.voice(sender=number, wamid="wamid.v1",
                                                        audio=b"book a table for two"))).status_code == 200
    channels.settled(number)
    assert w.replies(number)[-1] == f"echo: {HEARD}book a table for two"
    assert [t["filename"] for t in fake_llm.transcriptions] == ["media1.ogg"]
    assert wa.refused == []  # the download carried the access token


def test_a_slack_audio_clip_in_a_direct_message_is_transcribed(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    sl, d = channels.fakes["slack"], channels.driver("slack")
    chat = f"D{uuid.uuid4().hex[:8].upper()}"
    clip = sl.file_share(channel=chat, user=d.allowed, text="", event_id="EvA1", content=b"call me back",
                         mimetype="audio/webm", name="audio_message.webm")
    assert channels.post("slack", sl.signed(clip)).status_code == 200
    channels.settled(chat)
    assert d.replies(chat) == [f"echo: {HEARD}call me back"]
    assert [t["filename"] for t in fake_llm.transcriptions] == ["audio_message.webm"] and sl.refused == []


def test_silence_a_failing_model_and_a_file_too_large_each_get_a_notice(channels: ChannelStack,
                                                                          fake_llm: FakeLLM) -> None:
    tg = channels.driver("telegram")
    assert tg.replies(_telegram_voice(channels, b"   ")) == [NO_WORDS]
    fake_llm.transcription_status = 401
    [refused] = tg.replies(_telegram_voice(channels, b"hello"))
    assert "AuthenticationError" in refused and "API key" in refused
    fake_llm.transcription_status = 200
    [too_large] = tg.replies(_telegram_voice(channels, b"x" * (MAX_AUDIO + 1)))
    assert too_large == ("Sorry, I couldn't get your voice message from telegram (it is too large: 20 MB at most). "
                         "Could you write it out?")
    assert len(fake_llm.transcriptions) == 2  # the file over the limit was not even downloaded
    assert fake_llm.calls() == 0 and channels.scalar("select count(*) from runs") == 0


def _messages(event: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = event["entry"][0]["changes"][0]["value"]["messages"]
    return messages


def test_a_slow_transcription_holds_up_no_other_chat_of_its_batch(channels: ChannelStack, fake_llm: FakeLLM) -> None:
    """One webhook with a voice note from one person and a text from another: one ledger write, one
    submission task; the voice note goes to a task of its own, and the text is answered meanwhile."""
    wa, w = channels.fakes["whatsapp"], channels.driver("whatsapp")
    speaker, writer = w.new_chat(), w.new_chat()
    fake_llm.transcription_delay = 4
    both = wa.voice(sender=speaker, wamid="wamid.v2", audio=b"slow words")
    _messages(both).append(_messages(wa.event(sender=writer, text="quick words", wamid="wamid.t2"))[0])
    assert channels.post("whatsapp", wa.signed(both)).status_code == 200
    channels.settled(writer)
    assert w.replies(writer)[-1] == "echo: quick words"
    assert w.replies(speaker) == []  # still being transcribed
    channels.settled(speaker)
    assert w.replies(speaker)[-1] == f"echo: {HEARD}slow words"


def test_a_message_sent_while_the_one_before_it_is_transcribed_comes_after_it(channels: ChannelStack,
                                                                               fake_llm: FakeLLM) -> None:
    """The text's submission leaves the voice message to the worker transcribing it, which goes on
    with the text after: one transcription (they cost money and seconds), both in the order sent.
    The text comes once the lease the worker took has run out (RUNTIME__LEASE_SECONDS, 4): it renews it."""
    tg, d = channels.fakes["telegram"], channels.driver("telegram")
    chat = d.new_chat()
    fake_llm.transcription_delay = 8
    assert channels.post("telegram", tg.signed(tg.voice(chat=int(chat), sender=int(d.allowed),
                                                          audio=b"first, spoken"))).status_code == 200
    wait_until(lambda: len(fake_llm.transcriptions) == 1, timeout=20, message="the transcription to start")
    wait_until(lambda: channels.scalar("select bool_or(fetching_until > now() and now() > received_at + "
                                       "interval '5 seconds') from inbound_events"),
               timeout=20, message="the fetch's lease to be renewed past its first term")
    assert channels.post("telegram", d.request(chat=chat, text="second, written")).status_code == 200
    channels.settled(chat)
    said = channels.scalar("select string_agg(content, ' | ' order by seq) from messages where role = 'USER'")
    assert said == f"{HEARD}first, spoken | second, written"
    assert len(fake_llm.transcriptions) == 1


def test_a_worker_killed_while_it_transcribes_leaves_the_message_to_another(
        database_url: str, redis_server: str, fake_llm: FakeLLM, tmp_path: Path) -> None:
    """SIGKILL the worker while the model transcribes: its lease on the message runs out, the sweeper
    enqueues the message again, and another worker transcribes and answers it, once."""
    fake_llm.reset()
    with started_channel_stack(database_url, redis_server, fake_llm, tmp_path, LLM__TRANSCRIPTION_MODEL=MODEL,
                               RUNTIME__REQUEUE_GRACE="2") as cs:
        tg, d = cs.fakes["telegram"], cs.driver("telegram")
        chat = d.new_chat()
        fake_llm.transcription_delay = 60  # the first worker never hears back
        assert cs.post("telegram", tg.signed(tg.voice(chat=int(chat), sender=int(d.allowed),
                                                    audio=b"still here"))).status_code == 200
        wait_until(lambda: len(fake_llm.transcriptions) == 1, timeout=20, message="the transcription to start")
        [worker] = cs.stack.procs
        worker.kill(signal.SIGKILL)
        fake_llm.transcription_delay = 0
        cs.stack.worker(concurrency=2)
        cs.stack.beat()  # the sweeper
        cs.settled(chat, timeout=60)
        assert d.replies(chat) == [f"echo: {HEARD}still here"]
        assert len(fake_llm.transcriptions) == 2
