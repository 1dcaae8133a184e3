"""Read models: what the API shows of conversations, messages, runs and tool calls."""

from __future__ import annotations

import json
from typing import Any

from sqlmodel import Session, col, select

from shared.constants import INTERNAL
from shared.models import IMAGES, Conversation, Message, MessageType, Run, RunStep, ToolCall


def tool_result_text(call: ToolCall) -> str:
    result = call.result or {}
    if result.get("ok"):
        output = result.get("output")
        return output if isinstance(output, str) else json.dumps(output, default=str)
    return str(result.get("message") or call.status.value)


def tool_calls(s: Session, run_ids: list[str]) -> list[dict[str, Any]]:
    rows = s.exec(
        select(ToolCall).where(col(ToolCall.run_id).in_(run_ids))
        .order_by(col(ToolCall.created_at), col(ToolCall.step_seq), col(ToolCall.position))
    ).all()
    return [
        {
            "toolName": c.name,
            "status": c.status.value,
            "result": tool_result_text(c),
            "callId": c.call_id,
            "arguments": c.arguments,
            "errorCode": (c.result or {}).get("error"),
            "elapsedMs": c.elapsed_ms,
        }
        for c in rows
    ]


def conversation(c: Conversation) -> dict[str, Any]:
    return {
        "conversationId": c.id,
        "title": c.meta.get("title"),
        "channel": c.channel,
        "chatId": c.chat_id,
        "activeRunId": c.active_run_id,
        "usage": {"promptTokens": c.prompt_tokens, "completionTokens": c.completion_tokens, "cost": c.cost},
        "createdAt": c.created_at.isoformat(),
        "lastActiveAt": c.last_active_at.isoformat(),
    }


def conversations(s: Session, *, channel: str | None = None, query: str | None = None, limit: int = 50,
                  offset: int = 0) -> list[dict[str, Any]]:
    """The most recently active first; `query`: a piece of the title, in any case. The sessions of
    cron jobs, subagents and the heartbeat only when `channel` asks for them (INTERNAL)."""
    rows = select(Conversation).where(Conversation.channel == channel if channel else Conversation.channel != INTERNAL)
    if query:
        rows = rows.where(col(Conversation.meta)["title"].astext.icontains(query, autoescape=True))
    rows = rows.order_by(col(Conversation.last_active_at).desc(), col(Conversation.id)).offset(offset).limit(limit)
    return [conversation(c) for c in s.exec(rows).all()]


def message(m: Message) -> dict[str, Any]:
    return {
        "id": m.id,
        "seq": m.seq,
        "conversationId": m.conversation_id,
        "role": m.role.value,
        "type": m.type.value,
        "content": m.content,
        "toolName": m.tool_name,
        "toolCallId": m.tool_call_id,
        "runId": m.run_id,
        "pending": m.pending,
        "images": int(m.meta.get(IMAGES, 0)),
        "createdAt": m.created_at.isoformat(),
    }


def messages(s: Session, conversation_id: str, *, limit: int = 200, offset: int = 0,
             after: int | None = None) -> list[dict[str, Any]]:
    """In transcript order (`seq`); `after` a seq, for a client that follows the conversation. A
    summary not written yet (a /new's, while the model writes it) is not shown: it has no text."""
    query = select(Message).where(Message.conversation_id == conversation_id,
                                  ~((col(Message.type) == MessageType.SUMMARY) & (col(Message.content) == "")))
    if after is not None:
        query = query.where(col(Message.seq) > after)
    return [message(m) for m in s.exec(query.order_by(col(Message.seq)).offset(offset).limit(limit)).all()]


def run(s: Session, r: Run) -> dict[str, Any]:
    steps = s.exec(select(RunStep).where(RunStep.run_id == r.id).order_by(col(RunStep.seq))).all()
    return {
        "runId": r.id,
        "conversationId": r.conversation_id,
        "kind": r.kind.value,
        "status": r.status.value,
        "phase": r.phase.value,
        "iteration": r.iteration,
        "label": r.label,
        "task": r.task,
        "parentRunId": r.parent_run_id,
        "result": r.final_text,
        "error": r.error,
        "usage": {"promptTokens": r.prompt_tokens, "completionTokens": r.completion_tokens, "cost": r.cost},
        "steps": [
            {"seq": st.seq, "kind": st.kind.value, "model": st.model, "elapsedMs": st.elapsed_ms,
             "promptTokens": st.prompt_tokens, "completionTokens": st.completion_tokens}
            for st in steps
        ],
        "toolCalls": tool_calls(s, [r.id]),
        "createdAt": r.created_at.isoformat(),
        "finishedAt": r.finished_at.isoformat() if r.finished_at else None,
    }
