"""Voice messages: with a transcription model set (NANOFLEET_LLM__TRANSCRIPTION_MODEL), the worker that
submits a voice message fetches its audio from the platform and the model's transcript becomes the
message (when: shared.channels.media)."""

from __future__ import annotations

import logging

from shared.agent.runtime import Runtime
from shared.channels.base import Rejected
from shared.channels.delivery import channel_for
from shared.contracts import InboundMessage
from shared.llm import LLMError

log = logging.getLogger(__name__)
MAX_AUDIO = 20 * 1024 * 1024  # bytes: what Telegram's Bot API hands out, under the Whisper APIs' 25 MB
HEARD = "[voice message] "  # so the model knows the words were spoken, and may be misheard
NOT_FETCHED = "Sorry, I couldn't get your voice message from {channel} ({why}). Could you write it out?"
NO_WORDS = "Sorry, I couldn't make out any words in your voice message. Could you write it out?"


def transcribed(rt: Runtime, msg: InboundMessage) -> InboundMessage:
    """`msg` with its audio's words as content, or with the notice its sender gets instead. A fault
    that may pass (the platform or the network) raises, and the submission is tried again."""
    assert msg.media is not None
    kind, ch = msg.media["kind"], channel_for(rt.settings, msg.channel)
    try:
        if ch is None:
            raise Rejected(f"{msg.channel} is not configured here")
        audio, filename = ch.fetch_media(msg.media, MAX_AUDIO)
    except Rejected as err:
        log.warning("inbound event %s: its %s could not be fetched: %s", msg.event_id, kind, err)
        return _instead(msg, NOT_FETCHED.format(channel=msg.channel, why=str(err).split(": ", 1)[-1][:200]))
    try:
        words = rt.llm.transcribe(audio, filename)
    except LLMError as err:
        log.warning("inbound event %s: its %s could not be transcribed: %s", msg.event_id, kind, err)
        return _instead(msg, err.user_message)
    log.info("inbound event %s: %s of %d bytes transcribed (%d characters)", msg.event_id, kind, len(audio),
             len(words))
    if not words:
        return _instead(msg, NO_WORDS)
    return msg.model_copy(update={"content": HEARD + words, "unsupported": None, "media": None})


def _instead(msg: InboundMessage, notice: str) -> InboundMessage:
    return msg.model_copy(update={"media": None, "notice": notice})
