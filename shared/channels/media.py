"""What a message's attachment (InboundMessage.media) becomes before the message is submitted: a
voice message's words become its content (voice.py), a photo goes with it (images.py). The worker
that submits it fetches it from the platform before the submission's transaction where it can
(ahead), with no database connection held through the download or the model's seconds, and writes
the result into the ledger; a submitter that comes to the message first (one of a later message of
its chat) prepares it in its transaction, under its chat's lock, so the messages sent after it still
wait for it, in order."""

from __future__ import annotations

import logging

from sqlalchemy import ColumnElement, select, update

from shared.agent.runtime import Runtime
from shared.channels import images, voice
from shared.contracts import InboundMessage
from shared.db import table_of
from shared.models import InboundEvent

log = logging.getLogger(__name__)
LEDGER = table_of(InboundEvent)
AUDIO = ("voice", "audio")
UNPREPARED = LEDGER.c.message["media"].astext.is_not(None)  # pending, its attachment not fetched yet


def _kinds(rt: Runtime) -> list[str]:
    """The kinds of attachment fetched here: audio with a transcription model, photos with a model that sees."""
    return [*(AUDIO if rt.settings.llm.transcription_model else ()), *(("photo",) if images.wanted(rt) else ())]


def _to_fetch(kinds: list[str]) -> ColumnElement[bool]:
    kind: ColumnElement[bool] = LEDGER.c.message["media"]["kind"].astext.in_(kinds)
    return kind


def unprepared(rt: Runtime, event_ids: list[int]) -> set[int]:
    """Those of the events whose attachment is still to fetch (none when nothing is fetched)."""
    if not (kinds := _kinds(rt)):
        return set()
    with rt.session() as s:
        return set(s.execute(select(LEDGER.c.id).where(LEDGER.c.id.in_(event_ids), _to_fetch(kinds))).scalars())


def ahead(rt: Runtime, event_id: int) -> None:
    """Prepare the attachment of this ledger event, if it holds one still to fetch, and store the
    result in its place. A fault is left to the submission, which tries it again and counts it
    (shared.channels.inbound)."""
    if not (kinds := _kinds(rt)):
        return
    with rt.session() as s:
        stored = s.execute(select(LEDGER.c.message).where(LEDGER.c.id == event_id, _to_fetch(kinds))).scalar()
    if stored is None:
        return
    try:
        done = prepared(rt, InboundMessage.model_validate(stored))
    except Exception as err:
        log.warning("inbound event %s: its attachment was not fetched ahead of its submission (%s: %s)", event_id,
                    type(err).__name__, err)
        return
    with rt.session() as s:  # unless a submitter got there first
        s.execute(update(LEDGER).where(LEDGER.c.id == event_id, UNPREPARED)
                  .values(message=done.model_dump(mode="json")))


def prepared(rt: Runtime, msg: InboundMessage) -> InboundMessage:
    """`msg` with its attachment made into what the model takes, or with the notice its sender gets."""
    kind = (msg.media or {}).get("kind")
    if kind in AUDIO and rt.settings.llm.transcription_model:
        return voice.transcribed(rt, msg)
    if kind == "photo":
        return images.fetched(rt, msg) if images.wanted(rt) else images.unseen(msg)
    return msg.model_copy(update={"media": None})  # its notice says that only text is read
