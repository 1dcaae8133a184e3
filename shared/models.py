"""SQLModel tables: every piece of durable state lives here."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    LargeBinary,
    Sequence,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy import Enum as SAEnum
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

MESSAGE_SEQ = Sequence("message_seq")


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return uuid.uuid4().hex


def _ts() -> Any:
    """A nullable timestamp column."""
    return Field(default=None, sa_column=Column(DateTime(timezone=True), nullable=True))


def _now(index: bool = False) -> Any:
    """A timestamp column that defaults to now."""
    return Field(default_factory=utcnow, sa_column=Column(DateTime(timezone=True), nullable=False, index=index))


def _enum(enum: type[StrEnum], default: StrEnum, index: bool = False) -> Any:
    """An enum stored as its value in a plain string column (new values need no migration)."""
    sa_type = SAEnum(enum, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e])
    return Field(default=default, sa_type=sa_type, index=index)


def _json(default: Any) -> Any:
    return Field(default_factory=default, sa_column=Column(JSONB, nullable=False))


class Role(StrEnum):
    SYSTEM = "SYSTEM"
    USER = "USER"
    ASSISTANT = "ASSISTANT"
    TOOL = "TOOL"


class MessageType(StrEnum):
    NORMAL = "NORMAL"
    SUMMARY = "SUMMARY"


class RunKind(StrEnum):
    TURN = "turn"
    SUBAGENT = "subagent"
    CRON = "cron"
    HEARTBEAT = "heartbeat"


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
ACTIVE = (RunStatus.QUEUED, RunStatus.RUNNING)


class Phase(StrEnum):
    LLM = "llm"
    TOOLS = "tools"
    DONE = "done"


class ToolStatus(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    REJECTED = "REJECTED"
    FAILED = "FAILED"


class OutboxStatus(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class Conversation(SQLModel, table=True):
    """A session: one chat on one channel (or one API conversation)."""

    __tablename__ = "conversations"
    id: str = Field(default_factory=new_id, primary_key=True)
    session_key: str = Field(unique=True, index=True)
    channel: str = "api"
    chat_id: str = ""
    active_run_id: str | None = None  # the turn lock: at most one active turn
    # A compaction's lease: it writes the summary, with no transaction open across its model call.
    compacting_until: datetime | None = _ts()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    meta: dict[str, Any] = _json(dict)
    created_at: datetime = _now()
    last_active_at: datetime = _now(index=True)


class Message(SQLModel, table=True):
    """One message of a conversation. A USER message with pending=True waits in the mailbox."""

    __tablename__ = "messages"
    # A conversation's latest summary, found at once however long its history (every turn looks);
    # the summaries a /new still waits for (the sweep looks every second): a handful of rows at most.
    __table_args__ = (Index("ix_messages_conv_seq", "conversation_id", "seq"),
                      Index("ix_messages_summaries", "conversation_id", "seq",
                            postgresql_where=text("type = 'SUMMARY'")),
                      Index("ix_messages_summary_due", "conversation_id",
                            postgresql_where=text("type = 'SUMMARY' AND meta ? 'summary_due'")))
    id: int | None = Field(default=None, sa_column=Column(BigInteger, Identity(), primary_key=True))
    # Position in the transcript; re-drawn when a mailbox message is folded into a run.
    seq: int | None = Field(
        default=None, sa_column=Column(BigInteger, MESSAGE_SEQ, server_default=MESSAGE_SEQ.next_value())
    )
    conversation_id: str = Field(foreign_key="conversations.id", index=True)
    run_id: str | None = Field(default=None, index=True)
    role: Role = _enum(Role, Role.USER)
    type: MessageType = _enum(MessageType, MessageType.NORMAL)
    content: str = Field(default="", sa_column=Column(Text, nullable=False))
    tool_name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = Field(default=None, sa_column=Column(JSONB))
    pending: bool = Field(default=False, index=True)
    meta: dict[str, Any] = _json(dict)
    created_at: datetime = _now()


IMAGES = "images"  # a message's meta key: how many photos came with it (MessageImage)


class MessageImage(SQLModel, table=True):
    """A photo a user sent with a message (its `meta` counts them): read only for the model of the
    turn that answers it, and gone with the message."""

    __tablename__ = "message_images"
    message_id: int = Field(sa_column=Column(BigInteger, ForeignKey("messages.id", ondelete="CASCADE"),
                                             primary_key=True))
    position: int = Field(default=0, primary_key=True)
    mime: str
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


class Run(SQLModel, table=True):
    """A unit of durable agent work, advanced one short step at a time."""

    __tablename__ = "runs"
    # The cron and heartbeat results still to post to their chat (reconciliation looks every 30 s):
    # a handful of rows, whatever the size of the table.
    __table_args__ = (Index("ix_runs_results_unannounced", "finished_at",
                            postgresql_where=text("kind IN ('cron', 'heartbeat') AND announced IS FALSE")),)
    id: str = Field(default_factory=new_id, primary_key=True)
    conversation_id: str = Field(foreign_key="conversations.id", index=True)
    kind: RunKind = _enum(RunKind, RunKind.TURN)
    status: RunStatus = _enum(RunStatus, RunStatus.QUEUED, index=True)
    phase: Phase = _enum(Phase, Phase.LLM)
    step_seq: int = 0
    iteration: int = 0
    max_iterations: int = 20
    model: str | None = None
    parent_run_id: str | None = Field(default=None, index=True)
    label: str | None = None
    task: str | None = Field(default=None, sa_column=Column(Text))
    origin: dict[str, Any] = _json(dict)  # where the result goes: channel, chat_id, thread...
    final_text: str | None = Field(default=None, sa_column=Column(Text))
    error: str | None = Field(default=None, sa_column=Column(Text))
    suppress_reply: bool = False  # the message tool already answered the current chat
    announced: bool = False  # a subagent's result has been handed to its parent conversation
    lease_owner: str | None = None
    lease_until: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True), index=True))
    recoveries: int = 0  # times step `recovered_seq` failed: it raised, or its worker died in it
    recovered_seq: int | None = None
    # Written by nothing now; dropping it would fail the queries of a rolling deploy's old workers.
    request_id: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    created_at: datetime = _now()
    started_at: datetime | None = _ts()
    finished_at: datetime | None = _ts()


class RunStep(SQLModel, table=True):
    """One completed step of a run (an LLM call or a batch of tool calls)."""

    __tablename__ = "run_steps"
    __table_args__ = (UniqueConstraint("run_id", "seq"),)
    id: int | None = Field(default=None, sa_column=Column(BigInteger, Identity(), primary_key=True))
    run_id: str = Field(foreign_key="runs.id", index=True)
    seq: int
    kind: Phase = _enum(Phase, Phase.LLM)
    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    elapsed_ms: float = 0.0
    started_at: datetime = _now()
    finished_at: datetime = _now()


class ToolCall(SQLModel, table=True):
    """The side-effect journal: a call whose result is written is never executed again."""

    __tablename__ = "tool_calls"
    __table_args__ = (UniqueConstraint("run_id", "step_seq", "call_id"),)
    id: str = Field(default_factory=new_id, primary_key=True)
    run_id: str = Field(foreign_key="runs.id", index=True)
    step_seq: int
    position: int = 0  # order within the model's response
    call_id: str
    name: str
    arguments: dict[str, Any] = _json(dict)
    status: ToolStatus = _enum(ToolStatus, ToolStatus.PENDING)
    result: dict[str, Any] | None = Field(default=None, sa_column=Column(JSONB))
    attempts: int = 0
    elapsed_ms: float = 0.0
    created_at: datetime = _now()
    started_at: datetime | None = _ts()
    finished_at: datetime | None = _ts()


class InboundEvent(SQLModel, table=True):
    """The inbound ledger: a platform event is recorded once, before the webhook answers, with the
    message it brings until a worker has submitted that message (`message` NULL from then on, and
    for an event whose sender is denied)."""

    __tablename__ = "inbound_events"
    # The messages still to submit, by session (each is submitted after the ones before it).
    __table_args__ = (UniqueConstraint("channel", "event_id"),
                      Index("ix_inbound_events_pending", "session_key", "id",
                            postgresql_where=text("message IS NOT NULL")))
    id: int | None = Field(default=None, sa_column=Column(BigInteger, Identity(), primary_key=True))
    channel: str
    event_id: str
    received_at: datetime = _now()
    message: dict[str, Any] | None = Field(default=None, sa_column=Column(JSONB(none_as_null=True)))  # InboundMessage
    session_key: str | None = None
    recheck_at: datetime | None = _ts()  # when the sweeper enqueues its submission again if it is still here
    # While a worker fetches its attachment ahead of its submission: that worker's lease (shared.agent.lease)
    fetching_until: datetime | None = _ts()
    # A message whose submission raised max_recoveries times is moved from `message` to `set_aside`,
    # with the last error, so that the messages after it in its chat go on
    failures: int = 0
    set_aside: dict[str, Any] | None = Field(default=None, sa_column=Column(JSONB(none_as_null=True)))
    error: str | None = Field(default=None, sa_column=Column(Text))


class Outbox(SQLModel, table=True):
    """One outbound chunk, delivered once by the outbound queue."""

    __tablename__ = "outbox"
    # The rows waiting to be sent, by when they are due: the redelivery sweep (every second) looks
    # at the ones past due only, however many wait for a platform that is down.
    __table_args__ = (Index("ix_outbox_channel_platform_message_id", "channel", "platform_message_id"),
                      Index("ix_outbox_pending_due", text("coalesce(next_attempt_at, created_at)"),
                            postgresql_where=text("status = 'pending'")))
    id: str = Field(default_factory=new_id, primary_key=True)
    key: str = Field(unique=True)  # e.g. "<run id>:<chunk no>"
    channel: str = Field(index=True)
    chat_id: str
    content: str = Field(sa_column=Column(Text, nullable=False))
    meta: dict[str, Any] = _json(dict)  # thread ids, reply-to, interaction tokens
    status: OutboxStatus = _enum(OutboxStatus, OutboxStatus.PENDING, index=True)
    attempts: int = 0
    platform_message_id: str | None = None
    last_error: str | None = Field(default=None, sa_column=Column(Text))
    run_id: str | None = Field(default=None, index=True)
    created_at: datetime = _now()
    next_attempt_at: datetime | None = _ts()
    delivered_at: datetime | None = _ts()


class SentFile(SQLModel, table=True):
    """A file the agent sent (the `message` tool's files): read by its delivery, and by API callers,
    whose chat has no platform to upload to. Gone with its conversation, or after the retention once
    no delivery still waits for it."""

    __tablename__ = "sent_files"
    id: str = Field(primary_key=True)  # derived from the tool call: a replayed call stores nothing new
    conversation_id: str = Field(sa_column=Column(Text, ForeignKey("conversations.id", ondelete="CASCADE"),
                                                  nullable=False, index=True))
    name: str
    mime: str
    size: int
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    created_at: datetime = _now(index=True)


class CronJob(SQLModel, table=True):
    """A scheduled job; Postgres is the source of truth, redbeat mirrors it."""

    __tablename__ = "cron_jobs"
    id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12], primary_key=True)
    name: str = ""
    message: str = Field(sa_column=Column(Text, nullable=False))
    kind: str = "every"  # every | cron | at
    every_seconds: int | None = None
    cron_expr: str | None = None
    tz: str = "UTC"
    at: datetime | None = _ts()
    enabled: bool = True
    missed_policy: str = "skip"  # skip | run_once | catch_up
    channel: str = "api"
    chat_id: str = ""
    origin: dict[str, Any] = _json(dict)
    system: bool = False  # owned by nanofleet (daily summary), not by a user
    # Where its schedule counts from: the latest fire time handled (fired, or skipped by the missed
    # policy), or when it was rescheduled or enabled again (shared.scheduling.jobs.cursor)
    last_fired_at: datetime | None = _ts()
    fired_at: datetime | None = _ts()  # the fire time of the latest firing that ran (the API's lastFiredAt)
    created_at: datetime = _now()


class CronReceipt(SQLModel, table=True):
    """One row per (job, scheduled time): a duplicate fire never runs twice."""

    __tablename__ = "cron_receipts"
    __table_args__ = (UniqueConstraint("job_id", "scheduled_for"),)
    id: int | None = Field(default=None, sa_column=Column(BigInteger, Identity(), primary_key=True))
    job_id: str = Field(index=True)
    scheduled_for: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    run_id: str | None = None
    created_at: datetime = _now()
