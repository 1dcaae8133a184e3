"""Retention: deletes the operational records older than `retention.days`, so that a deployment
that runs for years keeps tables of the same size. What goes: the inbound ledger (kept at least
LEDGER_DAYS: platforms retry for hours, WhatsApp for up to a week), delivered and dead-lettered
outbox rows, the files the agent sent (once no delivery waits for them), cron receipts (a job's
cursor is past them), finished runs with their steps and tool calls, and the sessions nobody will
use again: a subagent's, and a removed cron job's, idle that long. What stays: every other
conversation, its messages (the memory) and usage totals, and every unfinished record. The files
users sent, kept in the workspace's inbox, go after a setting of their own
(`channels.save_files_days`; shared.channels.saved).

Each batch is one short transaction, so a pass never holds locks for long, and two passes at once
(a redelivered task) skip each other's rows (sessions: the second waits for the first's batch, and
finds them gone)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Select, delete, func
from sqlalchemy.orm import Mapped, QueryableAttribute
from sqlmodel import Session, col, select
from sqlmodel.sql.expression import SelectOfScalar

from shared.agent import conversations
from shared.agent.runtime import Runtime
from shared.channels import saved
from shared.constants import INTERNAL
from shared.errors import NotFound
from shared.models import (
    TERMINAL,
    Conversation,
    CronJob,
    CronReceipt,
    InboundEvent,
    Outbox,
    OutboxStatus,
    Run,
    RunStep,
    SentFile,
    ToolCall,
    utcnow,
)
from shared.outbox import FILE
from shared.scheduling import cron, subagents

log = logging.getLogger(__name__)
BATCH = 2000
# The inbound ledger is kept at least this long whatever `days` says: platforms retry an event for
# up to a week (WhatsApp), and a retry the ledger has forgotten would start a second turn.
LEDGER_DAYS = 8
# Batches per table and pass: a long backlog (the first pass over a year of records) is worked off
# over several passes, each well within a task's time limit.
MAX_BATCHES = 50

# One batch of a table: deletes up to `limit` rows older than the cutoff; returns how many went.
Batch = Callable[[Session, datetime, int], int]


def prune(rt: Runtime, *, now: datetime | None = None, batch: int = BATCH) -> dict[str, int]:
    """One retention pass; returns the rows deleted per table (none when `days` is 0), and the kept
    files deleted ("kept_files", when they are kept for a number of days)."""
    days, kept_days = rt.settings.retention.days, rt.settings.channels.save_files_days
    now = now or utcnow()
    counts = {name: _drain(rt, step, now - timedelta(days=max(days, floor)), batch)
              for name, (step, floor) in BATCHES.items()} if days > 0 else {}
    if kept_days > 0:
        counts["kept_files"] = saved.prune(rt.settings.workspace, (now - timedelta(days=kept_days)).date())
    if any(counts.values()):
        log.info("retention (%d days, kept files %d): deleted %s", days, kept_days,
                 ", ".join(f"{n} {name}" for name, n in counts.items() if n))
    return counts


def _drain(rt: Runtime, step: Batch, cutoff: datetime, batch: int) -> int:
    total = 0
    for _ in range(MAX_BATCHES):
        with rt.session() as s:
            n = step(s, cutoff, batch)
        total += n
        if n < batch:
            break
    return total


def _inbound(s: Session, cutoff: datetime, limit: int) -> int:
    key = col(InboundEvent.id)
    old = select(key).where(col(InboundEvent.received_at) < cutoff, col(InboundEvent.message).is_(None))  # submitted
    return _delete(s, key, _ids(s, old, limit))


def _outbox(s: Session, cutoff: datetime, limit: int) -> int:
    key = col(Outbox.id)
    done = col(Outbox.status).in_((OutboxStatus.DELIVERED, OutboxStatus.FAILED))
    return _delete(s, key, _ids(s, select(key).where(done, col(Outbox.created_at) < cutoff), limit))


def _files(s: Session, cutoff: datetime, limit: int) -> int:
    """Files the agent sent, unless a delivery still waits for one."""
    key = col(SentFile.id)
    waiting = select(Outbox.id).where(col(Outbox.status) == OutboxStatus.PENDING,
                                      func.jsonb_extract_path_text(col(Outbox.meta), FILE, "id") == key).exists()
    return _delete(s, key, _ids(s, select(key).where(col(SentFile.created_at) < cutoff, ~waiting), limit))


def _receipts(s: Session, cutoff: datetime, limit: int) -> int:
    key = col(CronReceipt.id)
    return _delete(s, key, _ids(s, select(key).where(col(CronReceipt.created_at) < cutoff), limit))


def _runs(s: Session, cutoff: datetime, limit: int) -> int:
    """Finished runs, with their steps and tool calls (the journal of a run that can never replay)."""
    key = col(Run.id)
    ids = _ids(s, select(key).where(col(Run.status).in_(TERMINAL), col(Run.finished_at) < cutoff), limit)
    _delete(s, col(ToolCall.run_id), ids)
    _delete(s, col(RunStep.run_id), ids)
    return _delete(s, key, ids)


def _sessions(s: Session, cutoff: datetime, limit: int) -> int:
    """Subagents' sessions, and sessions of cron jobs since removed, idle since `cutoff`, with what
    they hold; one whose run is still going is left for later."""
    key, session = col(Conversation.id), col(Conversation.session_key)
    removed_job = session.startswith(cron.SESSION_PREFIX) & ~select(CronJob.id).where(
        col(CronJob.id) == col(Conversation.chat_id)).exists()
    idle = select(key).where(col(Conversation.channel) == INTERNAL, col(Conversation.active_run_id).is_(None),
                             func.coalesce(col(Conversation.last_active_at), col(Conversation.created_at)) < cutoff,
                             session.startswith(subagents.SESSION_PREFIX) | removed_job)
    return sum(_delete_idle(s, cid, idle) for cid in s.exec(idle.limit(limit)).all())


def _delete_idle(s: Session, conversation_id: str, idle: SelectOfScalar[str]) -> int:
    """Delete a session `idle` picked (without a lock: a deletion locks runs before conversations,
    conversations.lock_for_deletion), if it still is once locked; how many sessions went."""
    try:
        with s.begin_nested():
            ids = conversations.lock_for_deletion(s, conversation_id)
            if s.exec(idle.where(col(Conversation.id) == conversation_id)).first() is None:
                return 0  # used again since it was picked
            conversations.purge(s, ids)
    except (conversations.Busy, NotFound):  # a run of it still going, or gone with its parent's
        return 0
    return len(ids)


def _ids(s: Session, query: Select[Any], limit: int) -> list[Any]:
    """Up to `limit` keys of the query's rows, locked (rows another pass holds are skipped)."""
    return list(s.execute(query.limit(limit).with_for_update(skip_locked=True)).scalars())


def _delete(s: Session, key: Mapped[Any], ids: list[Any]) -> int:
    """Delete the rows of `key`'s table whose `key` is one of `ids`."""
    if ids:
        s.execute(delete(cast(QueryableAttribute[Any], key).class_).where(key.in_(ids)))
    return len(ids)


# Per table: its batch, and the fewest days its rows are kept whatever `days` says.
BATCHES: dict[str, tuple[Batch, int]] = {
    "inbound_events": (_inbound, LEDGER_DAYS),
    "outbox": (_outbox, 0),
    "sent_files": (_files, 0),
    "cron_receipts": (_receipts, 0),
    "runs": (_runs, 0),
    "conversations": (_sessions, 0),
}
