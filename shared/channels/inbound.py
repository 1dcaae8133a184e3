"""The inbound pipeline after a webhook is verified and parsed, in two halves.

The gateway records: many webhooks' events go to the ledger in one statement, each with its message
(a duplicate stops here; a denied sender's event is recorded without one, so it costs no LLM call),
and one task is enqueued to submit the new messages. A worker submits: per session, in the order
the messages came (an album's items as one: shared.channels.albums), it finds the conversation by
session key and submits the message (a command is answered at once, an unsupported one gets a
notice), and takes the message off the ledger in the same transaction. The sweeper enqueues again a
submission whose task was lost."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from sqlalchemy import Row, func, select, update
from sqlmodel import Session

from shared.agent import conversations
from shared.agent.runtime import Next, Runtime
from shared.agent.service import Submitted, after_commit, command_of, submit
from shared.agent.steps import transient
from shared.channels import albums, debounce, media
from shared.constants import T_INGEST
from shared.contracts import InboundMessage
from shared.db import table_of
from shared.models import InboundEvent
from shared.outbox import add_reply

log = logging.getLogger(__name__)
UNSUPPORTED = "Sorry, I can only read text for now, not {what}. Could you write it out?"
# An image (a photo, or one sent as a file) no model here sees: files such as PDFs are read, so "only text" misleads
UNSEEN_IMAGE = "Sorry, I can't see images, only read text and files such as PDFs. Could you write out what it shows?"
SET_ASIDE = ("Sorry, I couldn't take in your message: something went wrong on my side each time I tried. "
             "Send it again, or put it differently; if it keeps happening, the operator can find the error "
             "in the worker log.")
RESUBMIT_BATCH = 500

LEDGER = table_of(InboundEvent)
# Every webhook runs this, many at once: one statement of constant text (prepared once per connection)
# whatever the number of events, which arrive as one JSON array of [channel, event id, message, session
# key] (one C-encoded parameter: text arrays cost Python work per element). A duplicate, in the ledger or
# the batch, is skipped. One statement alone needs no transaction around it: the gateway runs it in
# autocommit, a single round trip.
RECORD = """
    INSERT INTO inbound_events (channel, event_id, message, session_key, received_at, recheck_at)
    SELECT e.doc->>0, e.doc->>1, (e.doc->>2)::jsonb, e.doc->>3, now(), now() + make_interval(secs => %(grace)s)
    FROM jsonb_array_elements(CAST(%(events)s AS jsonb)) WITH ORDINALITY AS e(doc, n)
    ORDER BY e.n
    ON CONFLICT (channel, event_id) DO NOTHING
    RETURNING id, channel, event_id"""
PENDING = LEDGER.c.message.is_not(None)
AGE = func.extract("epoch", func.now() - LEDGER.c.received_at).label("age")  # seconds since the event came


@dataclass(frozen=True)
class Entry:
    """An event to record: its message, and whether its sender is allowed (else it is only recorded)."""

    message: InboundMessage
    allowed: bool


@dataclass
class Recorded:
    """What became of a batch of entries: per entry, whether it is new (not a platform retry), and
    the ledger ids of the new messages to submit."""

    new: list[bool]
    to_submit: list[int]


async def record(conn: psycopg.AsyncConnection[tuple[Any, ...]], entries: list[Entry], grace: float) -> Recorded:
    """Add `entries` to the ledger in one statement (in the caller's transaction, or its own in
    autocommit); the task that submits the new messages is `submission(recorded.to_submit)`,
    enqueued after the commit."""
    events = [[e.message.channel, e.message.event_id, e.message.model_dump_json() if e.allowed else None,
               e.message.key() if e.allowed else None] for e in entries]
    cursor = await conn.execute(RECORD, {"events": json.dumps(events), "grace": grace}, prepare=True)
    ids = {(channel, event_id): ledger_id for ledger_id, channel, event_id in await cursor.fetchall()}
    new: list[bool] = []
    to_submit: list[int] = []
    for e in entries:  # the same event twice in one batch (a retry racing the first) is new once
        ledger_id = ids.pop((e.message.channel, e.message.event_id), None)
        new.append(ledger_id is not None)
        if ledger_id is not None and e.allowed:
            to_submit.append(ledger_id)
    return Recorded(new, to_submit)


def submission(event_ids: list[int]) -> list[Next]:
    """The task that submits the messages of these ledger events (none for none)."""
    return [Next(T_INGEST, (event_ids,))] if event_ids else []


def submit_recorded(rt: Runtime, event_ids: list[int]) -> list[Next]:
    """Submit the messages of these ledger events, each after its session's earlier ones; returns the
    tasks to enqueue. Each message is its own transaction, and a session whose message fails (logged)
    leaves the others to go on: its messages stay on the ledger for the sweeper to enqueue again, until
    the failing one is set aside (_failed). A voice message or photo still to fetch in a batch of several
    goes to a task of its own: it takes seconds, which the batch's other chats need not wait for."""
    nexts: list[Next] = []
    alone = len(event_ids) == 1
    if not alone and (attached := media.unprepared(rt, event_ids)):
        nexts += [Next(T_INGEST, ([event_id],)) for event_id in attached]
        event_ids = [event_id for event_id in event_ids if event_id not in attached]
    for event_id in event_ids:
        try:  # (the others of a batch have no attachment still to fetch)
            _submit_through(rt, _fetched_through(rt, event_id) if alone else event_id, nexts)
        except Exception:
            log.exception("inbound event %s: could not submit its message; the sweeper tries again", event_id)
    return nexts


def _fetched_through(rt: Runtime, event_id: int) -> int:
    """Fetch the event's attachment ahead of its submission (media.ahead); the submission goes on
    through the event's own message, or, when this worker fetched it, through its chat's last one:
    their submissions left the chat to this worker while it fetched."""
    if not media.ahead(rt, event_id):
        return event_id
    session = select(LEDGER.c.session_key).where(LEDGER.c.id == event_id).scalar_subquery()
    with rt.session() as s:
        last = s.execute(select(func.max(LEDGER.c.id)).where(LEDGER.c.session_key == session, PENDING)).scalar()
    return last or event_id


def _submit_through(rt: Runtime, event_id: int, nexts: list[Next]) -> None:
    """Submit, in order, the session's messages still on the ledger up to `event_id`, adding the tasks
    to enqueue to `nexts` as each commits. One submitter per session at a time (an advisory lock), so
    a message is submitted once, after those before it. One transaction per message: a message keeps
    its conversation until its transaction ends, and a /stop after it in the same one would then lock
    runs, an order that deadlocks with a step ending its run (conversations.find)."""
    while True:
        taking: int | None = None
        taken: list[int] = []
        try:
            with rt.session() as s:
                row = _next_row(s, event_id)
                if row is None:  # submitted (with an earlier one of its session, by a replay, or by another
                    return  # submitter while this one waited for the lock)
                taking = row.id
                found = _taken_in(rt, s, row, event_id, nexts)
                if found is None:  # the rest of its album or burst may still come: its chat waits
                    return
                msg, taken = found
                submitted, added = (None, []) if msg is None else _one(rt, s, msg)
                s.execute(update(LEDGER).where(LEDGER.c.id.in_(taken)).values(message=None))
        except Exception as err:
            told = None if taking is None or transient(err) else _failed(rt, taking, err)
            if told is None:
                raise
            nexts += told
            if taking == event_id:
                return
            continue
        nexts += added
        if submitted is not None:
            after_commit(rt, submitted)
        if event_id in taken:
            return


def _next_row(s: Session, event_id: int) -> Row[Any] | None:
    """The first message of the event's session still on the ledger up to `event_id`, with the
    session's submission lock taken until the transaction ends, and the row locked (an ahead fetch
    of its attachment waits for the transaction: shared.channels.media)."""
    key = _locked_session(s, event_id)
    return None if key is None else s.execute(
        select(LEDGER.c.id, LEDGER.c.session_key, LEDGER.c.message, AGE, media.FETCHING.label("fetching"))
        .where(LEDGER.c.session_key == key, PENDING, LEDGER.c.id <= event_id).order_by(LEDGER.c.id).limit(1)
        .with_for_update()).first()


def _taken_in(rt: Runtime, s: Session, row: Row[Any], event_id: int,
              nexts: list[Next]) -> tuple[InboundMessage | None, list[int]] | None:
    """The message of ledger row `row` to submit (None: an album no item of which addresses the bot),
    and the ledger events it takes: its own, and those of the items of its album, or of its burst
    (shared.channels.debounce), that came since. None while more of them may still come (the task
    that goes on then, through `event_id`, as a message after them waits for them, is added to
    `nexts`), or while a worker fetches an attachment of theirs (it goes on with the chat after)."""
    if row.fetching:
        return None
    msg = InboundMessage.model_validate(row.message)
    wait = debounce.wait(rt.settings.channels, msg)
    if not msg.album and not wait:
        return msg, [row.id]
    if msg.album and row.age < albums.ALBUM_WAIT:
        nexts.append(Next(T_INGEST, ([event_id],), countdown=albums.ALBUM_WAIT - float(row.age)))
        return None
    same = [LEDGER.c.session_key == row.session_key, PENDING, LEDGER.c.id > row.id]
    if msg.album:  # its items, locked as its first is (their attachments may be prepared here)
        items = s.execute(select(LEDGER.c.id, LEDGER.c.message, AGE, media.FETCHING.label("fetching"))
                          .where(*same, LEDGER.c.message["album"].astext == msg.album).order_by(LEDGER.c.id)
                          .with_for_update()).all()
        if hold := albums.waiting(float(row.age), float((items[-1] if items else row).age)):
            nexts.append(Next(T_INGEST, ([event_id],), countdown=hold))  # an item came less than ALBUM_WAIT ago
            return None
        ids = [row.id, *(r.id for r in items)]
        album = [msg, *(InboundMessage.model_validate(r.message) for r in items)]
        if not albums.addressed(album):
            return None, ids
        if any(r.fetching for r in items):
            return None
        return albums.merged(album, lambda item: media.as_ahead(rt, item)), ids
    later = s.execute(select(LEDGER.c.id, LEDGER.c.message, AGE).where(*same).order_by(LEDGER.c.id)).all()
    burst, over = debounce.burst(msg, (InboundMessage.model_validate(r.message) for r in later))
    quiet = float(later[len(burst) - 2].age if len(burst) > 1 else row.age)  # since its last message
    if hold := debounce.holding(wait, over, quiet, float(row.age)):
        nexts.append(Next(T_INGEST, ([event_id],), countdown=hold))
        return None
    return debounce.joined(burst), [row.id, *(r.id for r in later[:len(burst) - 1])]


def _locked_session(s: Session, event_id: int) -> str | None:
    """The session of the event, if its message is still to submit, with the session's submission
    lock taken until the transaction ends."""
    key = s.execute(select(LEDGER.c.session_key).where(LEDGER.c.id == event_id, PENDING)).scalar()
    if key is not None:
        s.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(f"inbound:{key}", 0))))
    return key


def _failed(rt: Runtime, event_id: int, err: Exception) -> list[Next] | None:
    """Count a failure to submit the event's message (not one of the database or the broker: those
    are no fault of the message). At max_recoveries failures the message is set aside with the error,
    its sender is told, and its chat goes on with the messages after it: the tasks that tell them
    (none when another submitter took it meanwhile). None while the chat waits for the next try."""
    bound = rt.settings.runtime.max_recoveries
    with rt.session() as s:
        row = None if _locked_session(s, event_id) is None else s.execute(
            update(LEDGER).where(LEDGER.c.id == event_id, PENDING).values(failures=LEDGER.c.failures + 1)
            .returning(LEDGER.c.failures, LEDGER.c.message, LEDGER.c.channel)).first()
        if row is None:  # another submitter took it meanwhile (before the lock, or while this one waited for it)
            return []
        if row.failures < bound:
            log.warning("inbound event %s: its message could not be submitted (%d of %d tries): %r",
                        event_id, row.failures, bound, err)
            return None
        s.execute(update(LEDGER).where(LEDGER.c.id == event_id)
                  .values(message=None, set_aside=row.message, error=f"{type(err).__name__}: {err}"[:1000]))
        told = _tell_set_aside(rt, s, row.channel, event_id, row.message)
    log.error("inbound event %s: its message failed %d times and is set aside (inbound_events.set_aside); "
              "its chat goes on: %r", event_id, row.failures, err)
    return told


def _tell_set_aside(rt: Runtime, s: Session, channel: str, event_id: int, stored: object) -> list[Next]:
    """The sender's notice that their message was set aside; none when it cannot even be read."""
    try:
        msg = InboundMessage.model_validate(stored)
    except ValueError:
        log.error("inbound event %s on %s: the message set aside cannot be read; its sender is not told",
                  event_id, channel)
        return []
    return add_reply(s, rt.settings, key=f"{msg.channel}:{msg.event_id}", channel=msg.channel, chat_id=msg.chat_id,
                     text=SET_ASIDE, meta=msg.reply_meta)


def _one(rt: Runtime, s: Session, msg: InboundMessage) -> tuple[Submitted | None, list[Next]]:
    """Submit one message in the caller's transaction: what became of it (None for a notice), and the
    tasks to enqueue after the commit."""
    image = (msg.media or {}).get("kind") == "photo"
    if msg.media:  # not prepared ahead (media.ahead)
        msg = media.prepared(rt, msg)
    if msg.notice or msg.unsupported:
        said = UNSEEN_IMAGE if image else UNSUPPORTED.format(what=msg.unsupported)
        return None, add_reply(s, rt.settings, key=f"{msg.channel}:{msg.event_id}", channel=msg.channel,
                               chat_id=msg.chat_id, text=msg.notice or said, meta=msg.reply_meta)
    cid = conversations.find(s, msg.key(), keep=not command_of(msg.content)) or \
        conversations.get_or_create(s, session_key=msg.key(), channel=msg.channel, chat_id=msg.chat_id).id
    origin = {"channel": msg.channel, "chat_id": msg.chat_id, "sender_id": msg.sender_id,
              "event_id": msg.event_id, "reply_meta": msg.reply_meta,
              **({"sender_name": msg.sender_name} if msg.sender_name else {}), **({"group": True} if msg.group else {})}
    sub = submit(rt, s, cid, msg.content, origin=origin, images=msg.images)
    if sub.reply is None:
        return sub, sub.nexts
    # an in-chat command (/help, /stop, /new) answers at once
    return sub, sub.nexts + add_reply(s, rt.settings, key=f"{msg.channel}:{msg.event_id}", channel=msg.channel,
                                      chat_id=msg.chat_id, text=sub.reply, meta=msg.reply_meta)


def resubmit(rt: Runtime) -> list[Next]:
    """A sweep part: the submissions whose task was lost (a gateway that died between its commit and
    its enqueue, a worker killed in one, a broker that lost it) are enqueued again, each at most once
    per `requeue_grace`. One whose attachment a live worker is fetching is left to it."""
    grace = timedelta(seconds=rt.settings.runtime.requeue_grace)
    due = (select(LEDGER.c.id).where(PENDING, LEDGER.c.recheck_at < func.now(), ~media.FETCHING)
           .order_by(LEDGER.c.id).limit(RESUBMIT_BATCH).with_for_update(skip_locked=True))
    with rt.session() as s:
        ids = list(s.execute(update(LEDGER).where(LEDGER.c.id.in_(due.scalar_subquery()))
                             .values(recheck_at=func.now() + grace).returning(LEDGER.c.id)).scalars())
    if ids:
        log.warning("%d inbound message(s) waited too long to be submitted; enqueued again", len(ids))
    return submission(sorted(ids))
