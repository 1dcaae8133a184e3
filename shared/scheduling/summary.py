"""The daily summary: for each conversation active in the last 24 hours, one SUMMARY message.

Fan-out: the cron firing plans one task per conversation, so one failure never stops the others.
Planning leaves a receipt, so reconciliation can re-send a firing whose plan task was lost; planning
again, and summarising again, are harmless (each summary is written once per period).
Daily summaries are records for people (and the API), not memory: they carry `daily_summary` in
their meta, and the prompt's compaction summary (prompt.latest_summary) ignores them, so the
conversation's memory and its `covers_until_seq` stay exactly as compaction left them.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlmodel import Session, col, select

from shared.agent.runtime import Next, Runtime
from shared.constants import INTERNAL, T_DAILY_SUMMARY
from shared.errors import Retryable
from shared.llm_types import LLMError
from shared.models import Conversation, Message, MessageType, Role
from shared.scheduling.cron import PLANNED_ID, receipt

log = logging.getLogger(__name__)
PERIOD = timedelta(hours=24)
MAX_MESSAGES = 400  # the newest ones: what is still open matters more than how the day began
TRIM_CHARS = 1500
CHARS_PER_TOKEN = 4  # a first cut by characters; the tokenizer has the last word
ANSWER_TOKENS = 1024  # room kept for the summary when the model sets no max_tokens
RETRY_DELAY = 60.0  # the model is down or refusing: try again in a minute, for about half an hour
RETRIES = 30
META_KEY = "daily_summary"

PROMPT = """Summarise the conversation below: what was asked, what was done or decided, and what is
still open. Write for the user, at most 200 words. Period: {since} to {until}.

Conversation:
{transcript}"""


def _recent(until: datetime) -> object:
    return select(Message.conversation_id).where(
        col(Message.created_at) >= until - PERIOD, col(Message.created_at) < until,
        Message.type == MessageType.NORMAL, col(Message.role).in_((Role.USER, Role.ASSISTANT)),
        col(Message.pending).is_(False), col(Message.content) != "",
    )


def plan(rt: Runtime, until: datetime) -> list[Next]:
    """One summary task per conversation with messages in the 24 hours before `until`; none from a
    copy of the task that finds the firing planned (reconcile sent it again while the first copy
    waited in a backed-up agent queue: each would ask the model again for every conversation)."""
    with rt.session() as s:
        if receipt(s, PLANNED_ID, until) is None:  # reconciliation stops re-sending this firing
            log.info("daily summary for %s: planned already", until.isoformat())
            return []
        ids = s.exec(select(Conversation.id).where(
            Conversation.channel != INTERNAL, col(Conversation.id).in_(_recent(until)),  # type: ignore[arg-type]
        )).all()
    log.info("daily summary for %s: %d conversation(s)", until.isoformat(), len(ids))
    return [Next(T_DAILY_SUMMARY, (until.isoformat(), cid)) for cid in ids]


def _transcript(rt: Runtime, rows: list[Message], since: str, until: str) -> str:
    """The prompt for the newest of `rows` (oldest first) that fit the model's context window."""
    budget = rt.llm.prompt_budget(answer=ANSWER_TOKENS)
    kept: list[str] = []
    chars = len(PROMPT)
    for m in reversed(rows):
        line = f"{m.role.value}: {m.content[:TRIM_CHARS]}"
        chars += len(line) + 1
        if kept and chars > budget * CHARS_PER_TOKEN:  # the newest line goes in whatever it costs
            break
        kept.append(line)
    kept.reverse()
    while True:  # a script with more tokens per character than English: drop the oldest quarter
        prompt = PROMPT.format(since=since, until=until, transcript="\n".join(kept))
        if len(kept) <= 1 or rt.llm.count_tokens([{"role": "user", "content": prompt}]) <= budget:
            return prompt
        kept = kept[len(kept) // 4 or 1:]


def summarise(rt: Runtime, conversation_id: str, until: datetime) -> bool:
    """Write the conversation's summary for the period ending `until`; False if it exists or is empty.
    Raises Retryable when the model fails: nothing is written, the task comes again. No transaction
    stays open across the model call; a duplicate task that overlapped it finds the summary written."""
    key, since = until.isoformat(), (until - PERIOD).isoformat()
    with rt.session() as s:
        if _written(s, conversation_id, key):
            return False
        rows = list(s.exec(select(Message).where(
            Message.conversation_id == conversation_id, col(Message.id).in_(
                _recent(until).with_only_columns(col(Message.id))),  # type: ignore[attr-defined]
        ).order_by(col(Message.seq).desc()).limit(MAX_MESSAGES)))
    if not rows:
        return False
    rows.reverse()
    try:
        response = rt.llm.complete([{"role": "user", "content": _transcript(rt, rows, since, key)}])
    except LLMError as err:
        raise Retryable(f"daily summary of {conversation_id}: {err}", delay=RETRY_DELAY,
                        max_retries=RETRIES) from err
    with rt.session() as s:  # a conversation deleted meanwhile takes its summary with it
        gone = s.get(Conversation, conversation_id, with_for_update={"read": True, "key_share": True}) is None
        if gone or _written(s, conversation_id, key):
            return False
        s.add(Message(conversation_id=conversation_id, role=Role.SYSTEM, type=MessageType.SUMMARY,
                      content=response.content, meta={META_KEY: key, "since": since}))
    return True


def _written(s: Session, conversation_id: str, key: str) -> bool:
    """Whether the summary for `key` exists, under a lock that the one writing it holds too (its
    key is the one earlier versions held: during a rolling upgrade they exclude each other)."""
    s.execute(text("select pg_advisory_xact_lock(hashtext(:k))"), {"k": f"daily:{conversation_id}"})
    return s.exec(select(Message.id).where(
        Message.conversation_id == conversation_id, Message.type == MessageType.SUMMARY,
        col(Message.meta)[META_KEY].astext == key,
    )).first() is not None
