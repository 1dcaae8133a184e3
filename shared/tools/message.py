"""`message`: send text to a chat (by default the run's own) through the outbox. Another chat only
when the operator lists it (tools.message.send_to).

Sent to the run's own chat during a turn, it stands in for the reply: the turn's final answer is
then not sent again (runs.suppress_reply). On the `api` channel there is no platform to deliver
to: the text reaches the API caller as this tool's result and as a `message` event on the run's
stream, and the final reply is kept (it is the chat endpoint's answer).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import update
from sqlmodel import col

from shared.channel_settings import ChannelBase, ChannelsSettings
from shared.channels import get_channel
from shared.db import session_scope
from shared.models import Run
from shared.scheduling.ids import call_key
from shared.tools.base import ErrorCode, Tool, ToolContext, ToolResult

API = "api"
CHANNELS = {API, *(name for name, f in ChannelsSettings.model_fields.items()
                   if isinstance(f.annotation, type) and issubclass(f.annotation, ChannelBase))}


class MessageArgs(BaseModel):
    content: str = Field(min_length=1, max_length=50_000, description="Text to send")
    channel: str | None = Field(default=None, description="Channel name; default: the current chat's channel")
    chat_id: str | None = Field(default=None, description="Chat id on that channel; default: the current chat")


def _target(args: MessageArgs, ctx: ToolContext) -> tuple[str, str] | ToolResult:
    channel = (args.channel or ctx.channel).strip().lower()
    if channel not in CHANNELS:
        return ToolResult.fail(ErrorCode.INVALID_ARGS,
                               f"unknown channel '{channel}'; one of: {', '.join(sorted(CHANNELS))}")
    chat_id = args.chat_id or (ctx.chat_id if channel == ctx.channel else "")
    if not chat_id:
        return ToolResult.fail(ErrorCode.INVALID_ARGS, f"chat_id is required to send to another channel ({channel})")
    platform = get_channel(channel, ctx.settings)
    if platform is not None and not platform.enabled():
        missing: list[str] = getattr(platform, "missing", list)()
        hint = f" (an operator must set {', '.join(missing)})" if missing else ""
        return ToolResult.fail(ErrorCode.FAILED, f"channel '{channel}' is not configured here{hint}")
    if platform is not None and (problem := platform.chat_id_problem(chat_id)):
        return ToolResult.fail(ErrorCode.INVALID_ARGS, f"{channel}: {problem}")
    if (channel, chat_id) != (ctx.channel, ctx.chat_id) and not ctx.settings.tools.message.allows(channel, chat_id):
        return ToolResult.fail(ErrorCode.NOT_ALLOWED, f"sending to {channel}:{chat_id} is not allowed: only to the "
                               "current chat, and to chats an operator lists in NANOFLEET_TOOLS__MESSAGE__SEND_TO")
    return channel, chat_id


def _store(ctx: ToolContext, channel: str, chat_id: str, text: str, own_chat: bool) -> list[Any]:
    """Outbox rows (and the reply suppression) in one transaction; returns the delivery tasks."""
    from shared.outbox import add_reply  # here: shared.outbox imports the agent runtime, which imports tools

    origin = ctx.extra.get("origin") or {}
    meta = {**(origin.get("reply_meta", {}) if own_chat else {}), "run_id": ctx.run_id, "via": "message"}
    with session_scope(ctx.settings.database_url) as s:
        # The call's step in the key: a model that reuses a call id in a later step sends a new message
        key = f"{call_key(s, ctx.run_id, ctx.call_id)}:msg"
        nexts = add_reply(s, ctx.settings, key=key, channel=channel, chat_id=chat_id, text=text, meta=meta,
                          run_id=ctx.run_id or None)
        if own_chat and ctx.run_kind == "turn" and ctx.run_id:
            s.execute(update(Run).where(col(Run.id) == ctx.run_id).values(suppress_reply=True))
    return list(nexts)


class MessageTool(Tool):
    name = "message"
    description = ("Send a message to a chat: by default the current one (then it replaces your final reply "
                   "there), or another the operator allows, with channel and chat_id.")
    Args = MessageArgs
    group = "messaging"
    max_input_bytes = 200_000
    timeout = 30.0
    idempotent = True  # a replayed send finds the outbox rows it wrote (their key derives from this tool call)

    async def run(self, args: MessageArgs, ctx: ToolContext) -> ToolResult:
        target = _target(args, ctx)
        if isinstance(target, ToolResult):
            return target
        channel, chat_id = target
        if channel == API:
            ctx.emit("message", {"call_id": ctx.call_id, "chat_id": chat_id, "content": args.content})
            return ToolResult.success({"channel": API, "chat_id": chat_id, "delivered": "to the API caller",
                                       "content": args.content})
        own_chat = channel == ctx.channel and chat_id == ctx.chat_id
        nexts = await asyncio.to_thread(_store, ctx, channel, chat_id, args.content, own_chat)
        ctx.followups.extend(nexts)
        note = " (this replaces your final reply there)" if own_chat and ctx.run_kind == "turn" else ""
        return ToolResult.success(f"message queued for {channel}:{chat_id}{note}")
