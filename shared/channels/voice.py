"""Voice messages: with a transcription model set (NANOFLEET_LLM__TRANSCRIPTION_MODEL), the worker that
submits a voice message fetches its audio from the platform and the model's transcript becomes the
message. That happens before the submission's transaction, with no database connection held through
the model's seconds (ahead), and the transcript is written into the ledger; a submitter that comes to
the message first (one of a later message of its chat) transcribes it in its transaction, under its
chat's lock, so the messages sent after it still wait for it, in order."""

from __future__ import annotations

import logging

from sqlalchemy import select, update

from shared.agent.runtime import Runtime
from shared.channels.base import Rejected
from shared.channels.delivery import channel_for
from shared.contracts import InboundMessage
from shared.db import table_of
from shared.llm import LLMError
from shared.models import InboundEvent

log = logging.getLogger(__name__)
LEDGER = table_of(InboundEvent)
UNHEARD = LEDGER.c.message["media"].astext.is_not(None)  # pending, with audio not transcribed yet
MAX_AUDIO = 20 * 1024 * 1024  # bytes: what Telegram's Bot API hands out, under the Whisper APIs' 25 MB
HEARD = "[voice message] "  # so the model knows the words were spoken, and may be misheard
NOT_FETCHED = "Sorry, I couldn't get your voice message from {channel} ({why}). Could you write it out?"
NO_WORDS = "Sorry, I couldn't make out any words in your voice message. Could you write it out?"


def unheard(rt: Runtime, event_ids: list[int]) -> set[int]:
    """Those of the events whose voice message is still to transcribe (none when nothing transcribes)."""
    if not rt.settings.llm.transcription_model:
        return set()
    with rt.session() as s:
        return set(s.execute(select(LEDGER.c.id).where(LEDGER.c.id.in_(event_ids), UNHEARD)).scalars())


def ahead(rt: Runtime, event_id: int) -> None:
    """Transcribe the voice message of this ledger event, if it holds one still to transcribe, and
    store the result in its place. A fault is left to the submission, which tries it again and
    counts it (shared.channels.inbound)."""
    if not rt.settings.llm.transcription_model:
        return
    with rt.session() as s:
        stored = s.execute(select(LEDGER.c.message).where(LEDGER.c.id == event_id, UNHEARD)).scalar()
    if stored is None:
        return
    try:
        heard = transcribed(rt, InboundMessage.model_validate(stored))
    except Exception as err:
        log.warning("inbound event %s: no transcript ahead of its submission (%s: %s)", event_id,
                    type(err).__name__, err)
        return
    with rt.session() as s:  # unless a submitter got there first
        s.execute(update(LEDGER).where(LEDGER.c.id == event_id, UNHEARD).values(message=heard.model_dump(mode="json")))


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
