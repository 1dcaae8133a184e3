"""Voice messages: with a transcription model set (NANOFLEET_LLM__TRANSCRIPTION_MODEL), the worker that
submits a voice message fetches its audio from the platform and the model's transcript becomes the
message (when, and the fetching: shared.channels.media). Where files are kept
(NANOFLEET_CHANNELS__SAVE_FILES), the audio is kept in the workspace too, transcribed or not, and the
model told where."""

from __future__ import annotations

import logging

from shared.agent.runtime import Runtime
from shared.contracts import InboundMessage
from shared.llm_types import LLMError

log = logging.getLogger(__name__)
MAX_AUDIO = 20 * 1024 * 1024  # bytes: what Telegram's Bot API hands out, under the Whisper APIs' 25 MB
HEARD = "[voice message] "  # so the model knows the words were spoken, and may be misheard
HEARD_KEPT = "[voice message, saved as {path}] "
NOT_HEARD = "[The user sent {kind}, saved as {path}; it was not transcribed.]"
NO_WORDS = "Sorry, I couldn't make out any words in your voice message. Could you write it out?"


def transcribed(rt: Runtime, msg: InboundMessage, audio: bytes, filename: str, *,
                kept: str | None = None) -> InboundMessage:
    """`msg` with the words of its audio (fetched by shared.channels.media) after its text (a caption,
    or a reply's words when the audio is the message it replies to), and where the audio was kept in
    the workspace (`kept`) if it was; or with the notice its sender gets instead."""
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
    heard = (HEARD_KEPT.format(path=kept) if kept else HEARD) + words
    content = f"{msg.content}\n\n{heard}" if msg.content.strip() else heard  # after a caption, or a reply's text
    return msg.model_copy(update={"content": content, "unsupported": None, "media": None})


def untranscribed(msg: InboundMessage, kept: str) -> InboundMessage:
    """`msg` with its audio kept in the workspace and no transcription model: it goes to the model,
    saying where (its tools may open it), after any caption."""
    kind = "a voice message" if (msg.media or {}).get("kind") == "voice" else "an audio file"
    note = NOT_HEARD.format(kind=kind, path=kept)
    content = f"{msg.content}\n\n{note}" if msg.content.strip() else note
    return msg.model_copy(update={"content": content, "unsupported": None, "media": None})
