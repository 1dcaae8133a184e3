"""Conversations, the mailbox and the turn lock: at most one active turn per conversation."""

from __future__ import annotations

from base64 import b64decode
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, delete, func, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlmodel import Session, col, select

from shared.agent import lease
from shared.constants import REPORT
from shared.db import Inserting, table_of
from shared.errors import Conflict, NotFound
from shared.models import (
    ACTIVE,
    IMAGES,
    Conversation,
    Message,
    MessageImage,
    MessageType,
    Outbox,
    Phase,
    Role,
    Run,
    RunKind,
    RunStatus,
    RunStep,
    ToolCall,
    new_id,
    utcnow,
)

CONVERSATIONS, MESSAGES, RUNS = table_of(Conversation), table_of(Message), table_of(Run)
MODEL = "model"  # the conversation's meta key of its /model choice
# Every inbound message runs these: Core statements built once (no unit of work, no statement building)
FIND = select(CONVERSATIONS.c.id).where(CONVERSATIONS.c.session_key == bindparam("key"))
# FOR KEY SHARE, what the foreign key of the message posted next takes anyway, only sooner: it waits
# for a deletion of the conversation going on, and then finds nothing (the message starts the chat
# afresh); it does not wait for turns taken or usage added (FOR NO KEY UPDATE).
FIND_KEEPING = FIND.with_for_update(read=True, key_share=True)
POST = insert(MESSAGES).values(
    conversation_id=bindparam("cid"), role=Role.USER, type=MessageType.NORMAL, content=bindparam("text"),
    pending=True, meta=bindparam("info"), created_at=bindparam("now"),
).returning(MESSAGES.c.id)
# The messages a run writes (its answers, its tool results), as they come: each takes the next seq.
add_messages = Inserting(Message, generated=("id", "seq"))
TAKE_TURN = (update(CONVERSATIONS)
             .where(CONVERSATIONS.c.id == bindparam("cid"), CONVERSATIONS.c.active_run_id.is_(None))
             .values(active_run_id=bindparam("rid"), last_active_at=func.now()))
# The model a chat chose with /model (a profile's name), for a turn that names none of its own.
CHOSEN_MODEL = select(CONVERSATIONS.c.meta[MODEL].astext).where(CONVERSATIONS.c.id == bindparam("cid"))
# Every column a new run has (the model's defaults, written out: Core applies no Python ones). Its lease
# is the sweeper's cue if the enqueue of its first step is lost, on Postgres's clock.
START_RUN = insert(RUNS).values(
    id=bindparam("rid"), conversation_id=bindparam("cid"), kind=bindparam("kind"), status=RunStatus.QUEUED,
    phase=Phase.LLM, step_seq=0, iteration=0, max_iterations=bindparam("max_iterations"),
    model=func.coalesce(bindparam("model"), CHOSEN_MODEL.scalar_subquery()),
    task=bindparam("task"), origin=bindparam("origin"), suppress_reply=False, announced=False, recoveries=0,
    prompt_tokens=0, completion_tokens=0, cost=0.0, created_at=bindparam("now"),
    lease_until=lease.until_param("lease"),
)


@dataclass(frozen=True)
class Posted:
    """Where a posted message went: the new turn it started, or the mailbox of a busy conversation."""

    message_id: int
    conversation_id: str
    run_id: str | None  # a new turn, or None when it waits for the active one


def find(s: Session, session_key: str, *, keep: bool) -> str | None:
    """The id of the conversation with this session key, if there is one; with `keep`, it stays
    until the transaction ends. A command (/stop locks runs, and runs lock their conversation after)
    must not keep it first: that order could deadlock with a step ending its run."""
    found: str | None = s.connection().execute(FIND_KEEPING if keep else FIND, {"key": session_key}).scalar()
    return found


def get_or_create(
    s: Session, *, session_key: str, channel: str = "api", chat_id: str = "", meta: dict[str, Any] | None = None,
    conversation_id: str | None = None,
) -> Conversation:
    now = utcnow()
    s.execute(
        insert(Conversation)
        .values(
            id=conversation_id or new_id(), session_key=session_key, channel=channel, chat_id=chat_id, meta=meta or {},
            active_run_id=None, prompt_tokens=0, completion_tokens=0, cost=0.0,
            created_at=now, last_active_at=now,
        )
        .on_conflict_do_nothing(index_elements=["session_key"])
    )
    return s.exec(select(Conversation).where(Conversation.session_key == session_key)).one()


def post_message(
    s: Session,
    conversation_id: str,
    content: str,
    *,
    origin: dict[str, Any],
    lease_seconds: float,
    meta: dict[str, Any] | None = None,
    max_iterations: int = 20,
    images: list[dict[str, str]] | None = None,
) -> Posted:
    """Store a user message in the mailbox, with the photos sent with it ({"mime", "data": base64}),
    and start a turn unless one is running."""
    meta = {**(meta or {}), **({IMAGES: len(images)} if images else {})}
    message_id = s.connection().execute(
        POST, {"cid": conversation_id, "text": content, "info": meta, "now": utcnow()}).scalar_one()
    if images:
        s.connection().execute(insert(MessageImage), [
            {"message_id": message_id, "position": i, "mime": image["mime"], "data": b64decode(image["data"])}
            for i, image in enumerate(images)])
    run_id = try_start_turn(
        s, conversation_id, origin=origin, lease_seconds=lease_seconds,
        model=(meta or {}).get("model"), max_iterations=max_iterations,
    )
    return Posted(message_id=message_id, conversation_id=conversation_id, run_id=run_id)


def try_start_turn(
    s: Session,
    conversation_id: str,
    *,
    origin: dict[str, Any],
    lease_seconds: float,
    kind: RunKind = RunKind.TURN,
    model: str | None = None,
    max_iterations: int = 20,
    task: str | None = None,
) -> str | None:
    """Take the conversation's turn lock and create the run; its id, or None when a turn is active.
    Core, not the unit of work (the hot path of every message): a Conversation loaded in this session
    keeps its old active_run_id (the lock is the row's), and objects added to the session are not
    flushed by it."""
    if kind == RunKind.TURN and origin.get("cron_job_id"):  # a turn in a job's session (a subagent's report)
        kind = RunKind.CRON  # is the job's: its answer goes where the job's results go
    run_id = new_id()
    conn = s.connection()
    if conn.execute(TAKE_TURN, {"cid": conversation_id, "rid": run_id}).rowcount != 1:
        return None
    conn.execute(START_RUN, {"rid": run_id, "cid": conversation_id, "kind": kind, "max_iterations": max_iterations,
                             "model": model, "task": task, "origin": origin, "now": utcnow(), "lease": lease_seconds})
    return run_id


def chosen_model(s: Session, conversation_id: str) -> str | None:
    """The profile the chat chose with /model, if it chose one."""
    chosen: str | None = s.connection().execute(CHOSEN_MODEL, {"cid": conversation_id}).scalar()
    return chosen


def set_model(s: Session, conversation_id: str, name: str | None) -> None:
    """The chat's /model choice (None: the default), in one statement: its other settings stay."""
    patch = update(CONVERSATIONS).where(CONVERSATIONS.c.id == conversation_id)
    cleared = CONVERSATIONS.c.meta.op("-")(MODEL)
    s.execute(patch.values(meta=cleared if name is None else cleared.op("||")(func.jsonb_build_object(MODEL, name))))


MAILBOX = (select(Message).where(Message.conversation_id == bindparam("cid"), col(Message.pending).is_(True))
           .order_by(col(Message.id)))


def pending_messages(s: Session, conversation_id: str) -> list[Message]:
    return list(s.exec(MAILBOX, params={"cid": conversation_id}))


# Waiting messages join the transcript at its end, in arrival order: a fresh seq each, drawn in id order.
FOLD = """
update messages m set pending = false, run_id = :run_id, seq = drawn.seq
from (select id, nextval('message_seq') as seq
      from (select id from messages where conversation_id = :cid and pending {only} order by id for update) waiting
     ) drawn
where m.id = drawn.id
"""
FOLD_ALL = text(FOLD.format(only=""))
FOLD_USERS = text(FOLD.format(only=f"and coalesce(meta->>'kind', '') <> '{REPORT}'"))


def fold_mailbox(s: Session, conversation_id: str, run_id: str, *, reports: bool = True) -> int:
    """Move waiting messages into the transcript, at its end, as part of this run (one statement);
    without `reports`, the users' only (subagents' reports wait for the next turn)."""
    fold = FOLD_ALL if reports else FOLD_USERS
    return int(s.execute(fold, {"cid": conversation_id, "run_id": run_id}).rowcount)  # type: ignore[attr-defined]


class Busy(Conflict):
    """The conversation, or a subagent of it, has a run that has not ended."""

    def __init__(self, run_ids: list[str]) -> None:
        super().__init__(f"a turn or subagent of the conversation is still going ({', '.join(run_ids)}): stop it "
                         "first (/stop in the chat, or POST /api/v1/runs/{id}/cancel)", runIds=run_ids)


def delete_conversation(s: Session, conversation_id: str) -> list[str]:
    """Delete a conversation and its subagents' sessions, with their messages, runs, steps, tool
    calls and outbox rows not sent yet (the ledger of platform event ids stays: it holds no
    content). Raises NotFound, or Busy while one of their runs has not ended. Returns the ids deleted."""
    ids = lock_for_deletion(s, conversation_id)
    purge(s, ids)
    return ids


def lock_for_deletion(s: Session, conversation_id: str) -> list[str]:
    """Lock a conversation and its subagents' sessions, and their runs, so that nothing of theirs
    starts or moves meanwhile; raises NotFound, or Busy while one of their runs has not ended.
    Returns the conversations' ids. The runs first, in id order, then the conversations, as
    cancellation and a step ending its run take them: a late tool result (of a cancelled run) locks
    its run, then its call's row, and a deletion that held the call's row and waited for the run
    deadlocked with it."""
    ids = family(s, conversation_id)
    if conversation_id not in _lock(s, ids):
        raise NotFound(f"no conversation {conversation_id}")
    # Complete now: a subagent's session is made, as a turn starts, under its parent conversation's lock.
    ids = family(s, conversation_id)
    going = s.exec(select(Run.id).where(col(Run.conversation_id).in_(ids), col(Run.status).in_(ACTIVE))).all()
    if going:
        raise Busy(sorted(going))
    # Runs and sessions that started and ended since the first lock: nobody holding a run that has
    # ended waits for a conversation, so taking them after the conversations cannot deadlock.
    _lock(s, ids)
    return ids


def family(s: Session, conversation_id: str) -> list[str]:
    """The conversation and its subagents' sessions (which name their parent's conversation, however old)."""
    ids, frontier = [conversation_id], [conversation_id]
    while frontier:
        frontier = [c for c in s.exec(select(Conversation.id).where(
            col(Conversation.meta)["parent_conversation_id"].astext.in_(frontier))) if c not in ids]
        ids += frontier
    return ids


def _lock(s: Session, ids: list[str]) -> set[str]:
    """Lock the conversations' runs, then the conversations, each in id order; returns the
    conversations found."""
    s.exec(select(Run.id).where(col(Run.conversation_id).in_(ids)).order_by(col(Run.id)).with_for_update()).all()
    return set(s.exec(select(Conversation.id).where(col(Conversation.id).in_(ids))
                      .order_by(col(Conversation.id)).with_for_update()).all())


def purge(s: Session, ids: list[str]) -> None:
    """Delete the conversations `ids` (locked by lock_for_deletion) and everything of theirs."""
    runs = select(Run.id).where(col(Run.conversation_id).in_(ids))
    for table, which in ((ToolCall, col(ToolCall.run_id).in_(runs)), (RunStep, col(RunStep.run_id).in_(runs)),
                         (Outbox, col(Outbox.run_id).in_(runs)), (Message, col(Message.conversation_id).in_(ids)),
                         (Run, col(Run.conversation_id).in_(ids)), (Conversation, col(Conversation.id).in_(ids))):
        s.execute(delete(table).where(which))
