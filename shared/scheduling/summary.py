"""The daily summary: for each conversation active in the last 24 hours, one SUMMARY message.

Fan-out: the cron firing plans one task per conversation, so one failure never stops the others.
Daily summaries are records for people (and the API), not memory: they carry `daily_summary` in
their meta, and the prompt's compaction summary (prompt.latest_summary) ignores them, so the
conversation's memory and its `covers_until_seq` stay exactly as compaction left them.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlmodel import col, select

from shared.agent.runtime import Next, Runtime
from shared.constants import T_DAILY_SUMMARY
from shared.models import Conversation, Message, MessageType, Role
from shared.scheduling.cron import INTERNAL

log = logging.getLogger(__name__)
PERIOD = timedelta(hours=24)
MAX_MESSAGES = 400
TRIM_CHARS = 1500
META_KEY = "daily_summary"

PROMPT = """Summarise the conversation below: what was asked, what was done or decided, and what is
still open. Write for the user, at most 200 words. Period: {since} to {until}.

Conversation:
{transcript}"""


def _recent(until: datetime) -> object:
    return select(Message.conversation_id).where(
        col(Message.created_at) >= until - PERIOD, col(Message.created_at) < until,
        Message.type == MessageType.NORMAL, col(Message.role).in_((Role.USER, Role.ASSISTANT)),
        col(Message.pending).is_(False),
    )


def plan(rt: Runtime, until: datetime) -> list[Next]:
    """One summary task per conversation with messages in the 24 hours before `until`."""
    with rt.session() as s:
        ids = s.exec(select(Conversation.id).where(
            Conversation.channel != INTERNAL, col(Conversation.id).in_(_recent(until)),  # type: ignore[arg-type]
        )).all()
    log.info("daily summary for %s: %d conversation(s)", until.isoformat(), len(ids))
    return [Next(T_DAILY_SUMMARY, (until.isoformat(), cid)) for cid in ids]


def summarise(rt: Runtime, conversation_id: str, until: datetime) -> bool:
    """Write the conversation's summary for the period ending `until`; False if it exists or is empty."""
    key = until.isoformat()
    with rt.session() as s:
        if not s.execute(text("select pg_try_advisory_xact_lock(hashtext(:k))"),
                         {"k": f"daily:{conversation_id}"}).scalar():
            return False
        exists = s.exec(select(Message.id).where(
            Message.conversation_id == conversation_id, Message.type == MessageType.SUMMARY,
            col(Message.meta)[META_KEY].astext == key,
        )).first()
        if exists is not None:
            return False
        rows = list(s.exec(select(Message).where(
            Message.conversation_id == conversation_id, col(Message.id).in_(
                _recent(until).with_only_columns(col(Message.id))),  # type: ignore[attr-defined]
        ).order_by(col(Message.seq)).limit(MAX_MESSAGES)))
        lines = [f"{m.role.value}: {m.content[:TRIM_CHARS]}" for m in rows if m.content]
        if not lines:
            return False
        prompt = PROMPT.format(since=(until - PERIOD).isoformat(), until=key, transcript="\n".join(lines))
        response = rt.llm.complete([{"role": "user", "content": prompt}])
        s.add(Message(conversation_id=conversation_id, role=Role.SYSTEM, type=MessageType.SUMMARY,
                      content=response.content, meta={META_KEY: key, "since": (until - PERIOD).isoformat()}))
    return True
