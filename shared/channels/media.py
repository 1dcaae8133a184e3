"""What a message's attachments (InboundMessage.media, then more_media) become before the message is
submitted: a voice message's words become its content (voice.py), a photo goes with it (images.py),
a file's text joins its content (files.py); where files are kept (NANOFLEET_CHANNELS__SAVE_FILES), each
of them is kept in the workspace too (saved.py), and the model told where. The worker that submits
it fetches them from the platform before the submission's transaction where it can (ahead), with no
database connection held through the download or the model's seconds, and writes the result into the
ledger; a submitter that comes to the message first (one of a later message of its chat) prepares it
in its transaction, under its chat's lock, so the messages sent after it still wait for it, in order.
Each is fetched once: the ahead fetch holds a lease on the message's ledger row (a submitter that
comes to it meanwhile leaves it to that worker, which goes on with its chat after), and a submitter
preparing it holds the row locked (an ahead fetch starting then finds it taken)."""

from __future__ import annotations

import logging
import re

from sqlalchemy import ColumnElement, func, select, update

from shared.agent import lease
from shared.agent.runtime import Runtime
from shared.channels import files, images, saved, voice
from shared.channels.base import MAX_IMAGE, MAX_IMAGES, Rejected
from shared.channels.delivery import channel_for
from shared.contracts import InboundMessage
from shared.db import table_of
from shared.models import InboundEvent, utcnow

log = logging.getLogger(__name__)
LEDGER = table_of(InboundEvent)
EARLIER = LEDGER.alias("earlier")  # an album's items before the one at hand
AUDIO = ("voice", "audio")
UNPREPARED = LEDGER.c.message["media"].astext.is_not(None)  # pending, its attachment not fetched yet
# A worker is fetching its attachment ahead (its lease live); never NULL, so it may be negated
FETCHING = UNPREPARED & LEDGER.c.fetching_until.is_not(None) & (LEDGER.c.fetching_until > func.now())
NOT_FETCHED = "Sorry, I couldn't get your {what} from {channel} ({why})."
RESEND = "Could you send it again?"
# What the sender is told of an HTTP refusal, by its status; the platform's own words (its error body) are
# for the log. A redirect, a token expired or refused: the bot's fault, and sending again cannot help.
BOT_SIDE = "I can't fetch it right now; the problem is on my side, not yours"
GONE = "it is no longer available"
TOO_LARGE = "it is too large: {mb} MB at most"
OVER_LIMIT = re.compile(r"\bis over [\d,]+ bytes$")  # how a download over its limit is refused (shared.channels)
MB = 1024 * 1024
# What the model is told, after the caption, of an attachment that could not be fetched
UNFETCHED = "[{what}: not read, {why}]"
NOT_NOW = "I couldn't fetch it right now"


def _kinds(rt: Runtime) -> list[str]:
    """The kinds of attachment fetched here: files; audio with a transcription model, photos with a
    model that sees, both where files are kept."""
    keep = rt.settings.channels.save_files
    return ["file", *(AUDIO if keep or rt.settings.llm.transcription_model else ()),
            *(("photo",) if keep or images.wanted(rt) else ())]


def _to_fetch(kinds: list[str]) -> ColumnElement[bool]:
    """An attachment of these kinds, not a follower's (it is fetched only if its album addresses the
    bot), nor an album item's past the MAX_IMAGES the model is given (shared.channels.albums)."""
    album = LEDGER.c.message["album"].astext
    before = select(func.count()).where(EARLIER.c.session_key == LEDGER.c.session_key,
                                        EARLIER.c.message["album"].astext == album, EARLIER.c.id < LEDGER.c.id,
                                        EARLIER.c.message.is_not(None)).scalar_subquery()
    kind: ColumnElement[bool] = LEDGER.c.message["media"]["kind"].astext.in_(kinds) & \
        LEDGER.c.message["follower"].astext.is_distinct_from("true") & (album.is_(None) | (before < MAX_IMAGES))
    return kind


def unprepared(rt: Runtime, event_ids: list[int]) -> set[int]:
    """Those of the events whose attachment is still to fetch (none when nothing is fetched)."""
    if not (kinds := _kinds(rt)):
        return set()
    with rt.session() as s:
        return set(s.execute(select(LEDGER.c.id).where(LEDGER.c.id.in_(event_ids), _to_fetch(kinds))).scalars())


def ahead(rt: Runtime, event_id: int) -> bool:
    """Prepare the attachment of this ledger event, if it holds one still to fetch that nobody else
    is fetching or preparing, and store the result in its place; whether this worker took it (the
    submissions of later messages of its chat may have left them to it meanwhile). A fault is left to
    the submission, which tries it again and counts it (shared.channels.inbound)."""
    if not (kinds := _kinds(rt)):
        return False
    seconds = rt.settings.runtime.lease_seconds
    with rt.session() as s:
        stored = s.execute(update(LEDGER).where(LEDGER.c.id == event_id, _to_fetch(kinds), ~FETCHING)
                           .values(fetching_until=lease.until(seconds)).returning(LEDGER.c.message)).scalar()
    if stored is None:
        return False
    done: InboundMessage | None = None
    with lease.keeper(rt.settings.database_url, seconds).fetching(event_id):
        try:
            done = prepared(rt, InboundMessage.model_validate(stored))
        except Exception as err:
            log.warning("inbound event %s: its attachment was not fetched ahead of its submission (%s: %s)",
                        event_id, type(err).__name__, err)
    with rt.session() as s:  # unless a submitter took it over, once the lease ran out
        s.execute(update(LEDGER).where(LEDGER.c.id == event_id, UNPREPARED).values(
            fetching_until=None, **({"message": done.model_dump(mode="json")} if done else {})))
    return True


def as_ahead(rt: Runtime, msg: InboundMessage) -> InboundMessage:
    """`msg` as `ahead` leaves it: its attachment prepared if it is of a kind fetched ahead. An album's
    items whose ahead fetch has not happened yet are prepared so before they are merged, or the
    photos fetched ahead would come before them, out of the order they were sent in."""
    return prepared(rt, msg) if (msg.media or {}).get("kind") in _kinds(rt) else msg


def prepared(rt: Runtime, msg: InboundMessage) -> InboundMessage:
    """`msg` with its attachments made into what the model takes, or with the notice its sender gets
    (for the first that could not be)."""
    msg = _prepared(rt, msg)
    while msg.more_media and msg.notice is None:
        msg = _prepared(rt, msg.model_copy(update={"media": msg.more_media[0], "more_media": msg.more_media[1:]}))
    return msg


def _prepared(rt: Runtime, msg: InboundMessage) -> InboundMessage:
    """`msg` with its attachment `media` done with."""
    kind, keep = (msg.media or {}).get("kind"), rt.settings.channels.save_files
    if kind in AUDIO and (keep or rt.settings.llm.transcription_model):
        audio = _fetch(rt, msg, voice.MAX_AUDIO, "voice message", "Could you write it out?")
        if isinstance(audio, InboundMessage):
            return audio
        sound, fetched_as = audio
        kept = _kept(rt, msg, files.named(msg, fetched_as), sound)
        if rt.settings.llm.transcription_model:
            return voice.transcribed(rt, msg, sound, fetched_as, kept=kept)
        return voice.untranscribed(msg, kept) if kept else _unread(msg)
    if kind == "photo":
        seen = images.wanted(rt)
        if not seen and not keep:
            return images.unseen(msg)
        photo = _fetch(rt, msg, MAX_IMAGE, "photo", RESEND)
        if isinstance(photo, InboundMessage):
            return photo
        image, fetched_as = photo
        kept = _kept(rt, msg, images.named(files.named(msg, fetched_as), image), image)
        if seen:
            return images.attached(msg, image, kept)
        return images.unseen_kept(msg, kept) if kept else images.unseen(msg)
    if kind == "file":
        file = _fetch(rt, msg, files.MAX_FILE, "file", RESEND)
        if isinstance(file, InboundMessage):
            return file
        data, fetched_as = file
        return files.read(msg, data, fetched_as, _kept(rt, msg, files.named(msg, fetched_as), data))
    return _unread(msg)


def _unread(msg: InboundMessage) -> InboundMessage:
    """`msg` without its attachments: its notice says that only text is read."""
    return msg.model_copy(update={"media": None, "more_media": []})


def _kept(rt: Runtime, msg: InboundMessage, name: str, data: bytes) -> str | None:
    """Where the file was kept in the workspace, when files are (NANOFLEET_CHANNELS__SAVE_FILES) and it
    could be: one that could not still goes to the model as it would have, with the log saying why."""
    if not rt.settings.channels.save_files:
        return None
    try:
        return saved.save(rt.settings.workspace, name, data, utcnow().date())
    except saved.NotKept as err:
        log.warning("inbound event %s: file %r not kept in the workspace: %s", msg.event_id, name, err)
        return None


def _fetch(rt: Runtime, msg: InboundMessage, limit: int, what: str, ask: str) -> tuple[bytes, str] | InboundMessage:
    """The attachment's bytes and file name, or `msg` with the notice its sender gets when the platform
    refuses it (too large, gone), `ask` saying what they may do. A fault that may pass (the platform or
    the network) raises, and the submission is tried again."""
    assert msg.media is not None
    ch = channel_for(rt.settings, msg.channel)
    try:
        if ch is None:
            raise Rejected(f"{msg.channel} is not configured here")
        return ch.fetch_media(msg.media, limit)
    except Rejected as err:
        log.warning("inbound event %s: its %s could not be fetched: %s", msg.event_id, what, err)  # (secrets masked)
        why, resend = _why(err, limit)
        ask = ask if resend or ask != RESEND else ""  # (writing a voice message out still gets it through)
        return _not_fetched(msg, what, why, " ".join([NOT_FETCHED.format(what=what, channel=msg.channel, why=why),
                                                      ask]).strip())


def _not_fetched(msg: InboundMessage, what: str, why: str, notice: str) -> InboundMessage:
    """`msg` without the attachment that could not be fetched, the model told which and why after its
    caption (UNFETCHED). Only a message with nothing else to answer (no caption, no photo) gets the notice
    instead; it keeps that line all the same, for the album it may be an item of (shared.channels.albums)."""
    name = (msg.media or {}).get("name")
    line = UNFETCHED.format(what=f"{what} {' '.join(name.split())[:200]}" if name else what, why=why)
    rest = msg.model_copy(update={"media": None, "unsupported": None,
                                  "content": f"{msg.content}\n\n{line}" if msg.content.strip() else line})
    return rest if msg.content.strip() or msg.images else rest.answered(notice)


def _why(err: Rejected, limit: int) -> tuple[str, bool]:
    """What the sender is told of a refusal, and whether sending the attachment again may help. A file
    too large for our limit (`limit` bytes) or the platform's will be too large again; another refusal
    of ours (not on the platform's host) says why in plain words already; an HTTP refusal's body (an
    expired token's error, a trace id) is not for them."""
    status, said = err.status, str(err)
    if status == 413 or "too big" in said.lower() or (status is None and OVER_LIMIT.search(said)):
        # (Telegram's getFile: "Bad Request: file is too big"; ours: "...: the file is over 10,485,760 bytes")
        return TOO_LARGE.format(mb=limit // MB), False
    if status is None:
        return said.split(": ", 1)[-1][:200], True
    if 300 <= status < 400 or status in (401, 403, 407):
        return BOT_SIDE, False
    if status in (404, 410):
        return GONE, True
    return NOT_NOW, True
