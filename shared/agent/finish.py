"""How a run ends: the final message, the reply, the turn lock, the next turn, cancellation."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, or_, update
from sqlmodel import Session, col, select

from shared.agent import conversations, events, memory
from shared.agent.runtime import Next, Runtime
from shared.channels.delivery import channel_for
from shared.constants import T_AGENT_STEP, T_COMPACT
from shared.models import (
    ACTIVE,
    TERMINAL,
    Conversation,
    Message,
    Outbox,
    Phase,
    Role,
    Run,
    RunKind,
    RunStatus,
    ToolCall,
    ToolStatus,
    utcnow,
)
from shared.outbox import add_reply
from shared.tools.base import ErrorCode, ToolResult

NOT_RUN = "the run was cancelled before this tool ran"
JOINED = "Answered together with your earlier message, in the reply to it."
STOPPED = "Stopped."
CUT_OFF = "the run was cancelled while this tool ran: whether it finished its work is not known"


def finish(
    rt: Runtime, s: Session, run: Run, *, status: RunStatus, text: str, store: bool = True, error: str | None = None
) -> list[Next]:
    """End `run` (locked by the caller) and return what to enqueue after the commit."""
    with s.no_autoflush:  # the run's row is written once, below, with its end
        conv = s.get_one(Conversation, run.conversation_id, with_for_update=True)
    if store and text:
        conversations.add_messages(s, Message(conversation_id=run.conversation_id, run_id=run.id,
                                              role=Role.ASSISTANT, content=text))
    if run.phase == Phase.TOOLS:
        _answer_tool_calls(s, run)
    run.status, run.final_text, run.error = status, text, error
    run.phase, run.finished_at = Phase.DONE, utcnow()
    run.lease_owner, run.lease_until = None, None
    s.add(run)
    if status == RunStatus.CANCELLED and conv.active_run_id == run.id:
        # What the user sent for the turn is stopped with it, as it would have joined it: the message
        # of a turn stopped before its first step (still waiting), one sent just before the /stop. It
        # stays in the transcript, unanswered; left waiting, it would start the next turn at once.
        # A subagent's report waiting for the turn is not the user's to stop: a next turn tells it;
        # unless it is what started the turn, stopped before taking anything in (it would start
        # another at once, and /stop could never stop it).
        took = s.exec(select(Message.id).where(Message.run_id == run.id, Message.role == Role.USER).limit(1)).first()
        conversations.fold_mailbox(s, conv.id, run.id, reports=took is None)
    hook = rt.finish_hooks.get(run.kind.value)
    nexts = hook(rt, s, run) if hook else deliver(rt, s, run)
    nexts += release_turn(rt, s, conv, run)
    if memory.needs_compaction(s, conv.id, rt.settings.memory):
        nexts.append(Next(T_COMPACT, (conv.id,)))
    return nexts


def deliver(rt: Runtime, s: Session, run: Run) -> list[Next]:
    """The reply goes to the chat it came from, unless the message tool already answered there."""
    origin = run.origin or {}
    channel = origin.get("channel", "api")
    if channel == "api":
        return []
    chat_id, meta = str(origin.get("chat_id", "")), origin.get("reply_meta", {})
    nexts: list[Next] = []
    if run.final_text and not run.suppress_reply:
        nexts = add_reply(s, rt.settings, key=run.id, channel=channel, chat_id=chat_id, text=run.final_text,
                          meta=meta, run_id=run.id)
    platform = channel_for(rt.settings, channel)
    if run.kind == RunKind.TURN and platform is not None and platform.placeholder:
        nexts += _end_placeholders(rt, s, run, channel, chat_id, meta)
    return nexts


def _end_placeholders(rt: Runtime, s: Session, run: Run, channel: str, chat_id: str,
                      meta: dict[str, Any]) -> list[Next]:
    """On a platform that shows each message a placeholder until something is sent for it (Discord's
    "thinking..."), a turn ends every one it took: a stopped turn's own, which no reply replaces, and
    those of the messages it took in from the mailbox beside the one it answers (a second /ask while
    it ran), each of which would otherwise think until the platform gives up on it. The turn answered
    if it made a row for its chat (its reply, or what the message tool sent there), not if it had a text."""
    answered = s.exec(select(Outbox.id).where(Outbox.run_id == run.id, Outbox.channel == channel,
                                              Outbox.chat_id == chat_id).limit(1)).first() is not None
    nexts: list[Next] = []
    if not answered:
        nexts += add_reply(s, rt.settings, key=run.id, channel=channel, chat_id=chat_id, text=STOPPED, meta=meta,
                           run_id=run.id)
    joined = s.exec(select(Message.id, Message.meta).where(Message.run_id == run.id, Message.role == Role.USER)
                    .order_by(col(Message.id))).all()
    for message_id, info in joined:
        theirs = ((info or {}).get("origin") or {}).get("reply_meta") or {}
        if theirs and theirs != meta:
            nexts += add_reply(s, rt.settings, key=f"{run.id}:joined:{message_id}", channel=channel,
                               chat_id=chat_id, text=JOINED if answered else STOPPED, meta=theirs, run_id=run.id)
    return nexts


def release_turn(rt: Runtime, s: Session, conv: Conversation, run: Run) -> list[Next]:
    """Free the turn lock; messages that waited in the mailbox start the next turn at once."""
    if conv.active_run_id != run.id:
        return []
    conv.active_run_id = None
    s.add(conv)
    s.flush()
    waiting = conversations.pending_messages(s, conv.id)
    if not waiting:
        return []
    origin = waiting[0].meta.get("origin") or run.origin
    run_id = conversations.try_start_turn(
        s, conv.id, origin=origin, lease_seconds=rt.settings.runtime.lease_seconds,
        model=waiting[0].meta.get("model"), max_iterations=rt.settings.agent.max_iterations,
    )
    return [Next(T_AGENT_STEP, (run_id, 0))] if run_id else []


def publish_final(rt: Runtime, run: Run) -> None:
    """Tell listeners the run ended; called after the commit, so they read the final state."""
    event = events.RUN_FINISHED if run.status == RunStatus.SUCCEEDED else events.RUN_FAILED
    data: dict[str, Any] = {"run_id": run.id, "status": run.status.value, "text": run.final_text}
    rt.events.publish(run.conversation_id, event, data)


def cancel(rt: Runtime, s: Session, run_id: str, reason: str, cancelled: list[Run]) -> list[Next]:
    """Cancel a run and every subagent its conversation started; publish `cancelled` after commit.
    A run that already ended is left as it is, with its conversation's subagents."""
    found = s.exec(select(Run.status, Run.conversation_id).where(Run.id == run_id)).first()
    if found is None or found[0] in TERMINAL:
        return []
    return _cancel_all(rt, s, col(Run.id) == run_id, found[1], reason, cancelled)


def cancel_conversation(rt: Runtime, s: Session, conversation_id: str, cancelled: list[Run]) -> list[Next]:
    """`/stop`: cancel the active turn and the conversation's running subagents."""
    return _cancel_all(rt, s, col(Run.conversation_id) == conversation_id, conversation_id, "stopped by the user",
                       cancelled)


def _cancel_all(rt: Runtime, s: Session, which: ColumnElement[bool], conversation_id: str, reason: str,
                cancelled: list[Run]) -> list[Next]:
    """Cancel the active runs `which` selects and the running subagents of the conversation. Every
    run is locked first, in id order, before any conversation: a run that finishes meanwhile locks
    its run and then conversations, so the two can wait for each other but never deadlock."""
    children = col(Run.parent_run_id).in_(select(Run.id).where(Run.conversation_id == conversation_id))
    # populate_existing: the runs as locked, not a copy the caller's session read before a step moved them
    active = (select(Run).where(col(Run.status).in_(ACTIVE)).order_by(col(Run.id)).with_for_update()
              .execution_options(populate_existing=True))
    runs = list(s.exec(active.where(or_(which, children))).all())
    # A subagent spawned while that statement waited for its parent's lock is not in its snapshot, and
    # would run on: a new statement sees it (the spawn committed before it let the parent go).
    runs += s.exec(active.where(children, col(Run.id).not_in([r.id for r in runs]))).all()
    nexts: list[Next] = []
    for run in runs:
        if run.status not in TERMINAL:  # re-read under the lock
            nexts += finish(rt, s, run, status=RunStatus.CANCELLED, text="", store=False, error=reason)
            cancelled.append(run)
    return nexts


def _answer_tool_calls(s: Session, run: Run) -> None:
    """A run that ends during its tools (a cancel) still answers each call of the step in the
    transcript, as every model provider requires of a history: with its result, or with why there
    is none. A call no worker took yet ends now, failed without running (its
    task then finds nothing to do); a running one goes on and records its result on its row.
    The calls are locked (after the run and its conversation, as everything takes them), so that
    one is not taken by a worker between being read here as waiting and written off as not run."""
    calls = s.exec(select(ToolCall).where(ToolCall.run_id == run.id, ToolCall.step_seq == run.step_seq)
                   .order_by(col(ToolCall.position)).with_for_update()
                   .execution_options(populate_existing=True)).all()
    for call in calls:
        if call.status == ToolStatus.PENDING:
            result = ToolResult.fail(ErrorCode.FAILED, NOT_RUN)
            call.status, call.result, call.finished_at = ToolStatus.FAILED, result.model_dump(mode="json"), utcnow()
            s.add(call)
        elif call.status == ToolStatus.RUNNING:
            result = ToolResult.fail(ErrorCode.FAILED, CUT_OFF)
        else:
            result = recorded(call)
        conversations.add_messages(s, tool_message(run, call, result))


def settle(s: Session, run: Run, call: ToolCall, result: ToolResult) -> None:
    """A call still running when its run ended was answered in the transcript as cut off; once it
    records how it ended, the transcript says that instead (what the model reads next turn)."""
    cut_off = ToolResult.fail(ErrorCode.FAILED, CUT_OFF).for_model()
    s.execute(update(Message).where(col(Message.run_id) == run.id, col(Message.tool_call_id) == call.call_id,
                                    col(Message.role) == Role.TOOL, col(Message.content) == cut_off)
              .values(content=result.for_model()))


def recorded(call: ToolCall) -> ToolResult:
    """The result a finished tool call recorded."""
    return ToolResult.model_validate(call.result or {"ok": False, "message": "no result"})


def tool_message(run: Run, call: ToolCall, result: ToolResult) -> Message:
    """The transcript's answer to one tool call: what the model reads."""
    return Message(conversation_id=run.conversation_id, run_id=run.id, role=Role.TOOL, content=result.for_model(),
                   tool_name=call.name, tool_call_id=call.call_id)
