"""The inbound pipeline after a webhook is verified and parsed, in one transaction: record the
event in the ledger (a duplicate stops here), check allow_from (a denied sender stops here, before
any LLM cost), find the conversation by session key, submit the message. The caller enqueues the
returned tasks after the commit."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sqlalchemy import bindparam
from sqlalchemy.dialects.postgresql import insert
from sqlmodel import Session

from shared.agent import conversations
from shared.agent.runtime import Next, Runtime
from shared.agent.service import Submitted, after_commit, command_of, submit
from shared.channels.base import Channel
from shared.contracts import InboundMessage
from shared.db import table_of
from shared.models import InboundEvent, utcnow
from shared.outbox import add_reply

log = logging.getLogger(__name__)
UNSUPPORTED = "Sorry, I can only read text for now, not {what}. Could you write it out?"


LEDGER = table_of(InboundEvent)
RECORD = (insert(LEDGER)  # Core, built once: every webhook runs it
          .values(channel=bindparam("ch"), event_id=bindparam("event"), received_at=bindparam("now"))
          .on_conflict_do_nothing(index_elements=["channel", "event_id"])
          .returning(LEDGER.c.id))


@dataclass
class Ingested:
    """What became of a webhook's messages."""

    nexts: list[Next] = field(default_factory=list)
    accepted: int = 0
    duplicates: int = 0
    denied: int = 0
    submitted: list[Submitted] = field(default_factory=list)


def record(s: Session, channel: str, event_id: str) -> bool:
    """Add the event to the ledger; False when it was there already (a platform retry)."""
    inserted = s.connection().execute(RECORD, {"ch": channel, "event": event_id, "now": utcnow()}).first()
    return inserted is not None


def ingest(rt: Runtime, ch: Channel, messages: list[InboundMessage]) -> Ingested:
    """Record, check and submit `messages` in one transaction; returns the tasks to enqueue."""
    out = Ingested()
    with rt.session() as s:
        for msg in messages:
            _one(rt, s, ch, msg, out)
    for sub in out.submitted:
        after_commit(rt, sub)
    return out


def _one(rt: Runtime, s: Session, ch: Channel, msg: InboundMessage, out: Ingested) -> None:
    if not record(s, msg.channel, msg.event_id):
        out.duplicates += 1
        return
    if not ch.allowed(msg.sender_id):
        out.denied += 1
        log.info("%s: sender %s is not in allow_from; ignored", msg.channel, msg.sender_id)
        return
    out.accepted += 1
    if msg.unsupported:
        out.nexts += add_reply(s, rt.settings, key=f"{msg.channel}:{msg.event_id}", channel=msg.channel,
                               chat_id=msg.chat_id, text=UNSUPPORTED.format(what=msg.unsupported), meta=msg.reply_meta)
        return
    cid = conversations.find(s, msg.key(), keep=not command_of(msg.content)) or \
        conversations.get_or_create(s, session_key=msg.key(), channel=msg.channel, chat_id=msg.chat_id).id
    origin = {"channel": msg.channel, "chat_id": msg.chat_id, "sender_id": msg.sender_id,
              "event_id": msg.event_id, "reply_meta": msg.reply_meta,
              **({"sender_name": msg.sender_name} if msg.sender_name else {}), **({"group": True} if msg.group else {})}
    sub = submit(rt, s, cid, msg.content, origin=origin)
    out.submitted.append(sub)
    out.nexts += sub.nexts
    if sub.reply is not None:  # an in-chat command (/help, /stop, /new) answers at once
        out.nexts += add_reply(s, rt.settings, key=f"{msg.channel}:{msg.event_id}", channel=msg.channel,
                               chat_id=msg.chat_id, text=sub.reply, meta=msg.reply_meta)
