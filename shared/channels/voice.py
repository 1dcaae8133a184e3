"""Voice messages: with a transcription model set (NANOFLEET_LLM__TRANSCRIPTION_MODEL), the worker that
submits a voice message fetches its audio from the platform and the model's transcript becomes the
message (when, and the fetching: shared.channels.media)."""

from __future__ import annotations

import logging

from shared.agent.runtime import Runtime
from shared.contracts import InboundMessage
from shared.llm import LLMError

log = logging.getLogger(__name__)
MAX_AUDIO = 20 * 1024 * 1024  # bytes: what Telegram's Bot API hands out, under the Whisper APIs' 25 MB
HEARD = "[voice message] "  # so the model knows the words were spoken, and may be misheard
NO_WORDS = "Sorry, I couldn't make out any words in your voice message. Could you write it out?"


def transcribed(rt: Runtime, msg: InboundMessage, audio: bytes, filename: str) -> InboundMessage:
    """`msg` with the words of its audio (fetched by shared.channels.media) as content, or with the
    notice its sender gets instead."""
    kind = (msg.media or {}).get("kind")
    try:
        words = rt.llm.transcribe(audio, filename)
    except LLMError as err:
        log.warning("inbound event %s: its %s could not be transcribed: %s", msg.event_id, kind, err)
        return msg.answered(err.user_message)
    log.info("inbound event %s: %s of %d bytes transcribed (%d characters)", msg.event_id, kind, len(audio),
             len(words))
    if not words:
        return msg.answered(NO_WORDS)
    return msg.model_copy(update={"content": HEARD + words, "unsupported": None, "media": None})
