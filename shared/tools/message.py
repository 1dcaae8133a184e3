"""`message`: send text to a chat (by default the run's own) through the outbox. Another chat only
when the operator lists it (tools.message.send_to).

Sent to the run's own chat during a turn, it stands in for the reply: the turn's final answer is
then not sent again (runs.suppress_reply). On the `api` channel there is no platform to deliver
to: the text reaches the API caller as this tool's result and as a `message` event on the run's
stream, and the final reply is kept (it is the chat endpoint's answer); a cron job's run posts it
into the API conversation its results go to, before its answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import mimetypes
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, Field, model_validator
from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert
from sqlmodel import Session, col

from shared.channel_settings import ChannelBase, ChannelsSettings
from shared.channels import get_channel
from shared.channels.base import OutFile, image_type
from shared.db import session_scope
from shared.models import Run, SentFile, utcnow
from shared.scheduling.ids import call_key
from shared.settings import Permission
from shared.tools.base import ErrorCode, Tool, ToolContext, ToolResult
from shared.tools.workspace import NotAFile, OutsideWorkspace, read_start

API = "api"
MAX_FILES = 10
OURS = "the most this bot sends (NANOFLEET_TOOLS__MESSAGE__MAX_FILE_BYTES)"
THEIRS = "the most that can be sent to {channel}"
CHANNELS = {API, *(name for name, f in ChannelsSettings.model_fields.items()
                   if isinstance(f.annotation, type) and issubclass(f.annotation, ChannelBase))}


class MessageArgs(BaseModel):
    content: str = Field(default="", max_length=50_000, description="Text to send (may be left out with files)")
    files: list[str] = Field(default_factory=list, max_length=MAX_FILES,
                             description="Workspace paths of files to send after the text (documents, photos)")
    channel: str | None = Field(default=None, description="Channel name; default: the current chat's channel")
    chat_id: str | None = Field(default=None, description="Chat id on that channel; default: the current chat")

    @model_validator(mode="after")
    def _something(self) -> MessageArgs:
        if not self.content.strip() and not self.files:
            raise ValueError("give content, files, or both")
        return self


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


def _load(ctx: ToolContext, channel: str, paths: list[str]) -> list[OutFile] | ToolResult:
    """The workspace files to send, each within the operator's and the platform's size limit."""
    if not paths:
        return []
    if Permission.FS_READ not in ctx.settings.permissions.granted:
        return ToolResult.fail(ErrorCode.PERMISSION_DENIED, "sending files reads the workspace: it needs "
                               "permission FS_READ, which is not granted")
    platform = get_channel(channel, ctx.settings)
    limit = ctx.settings.tools.message.max_file_bytes
    whose = OURS  # the smaller limit is named: raising the setting cannot pass the platform's
    if platform is not None:
        if not platform.max_file_bytes:
            return ToolResult.fail(ErrorCode.INVALID_ARGS, f"files cannot be sent to {channel}")
        if platform.max_file_bytes < limit:
            limit, whose = platform.max_file_bytes, THEIRS.format(channel=channel)
    files = []
    for path in paths:
        loaded = _read(ctx, path, limit, whose)
        if isinstance(loaded, ToolResult):
            return loaded
        files.append(loaded)
    return files


def _read(ctx: ToolContext, path: str, limit: int, whose: str) -> OutFile | ToolResult:
    """The file at `path`, or the refusal the model reads: larger than `limit`, `whose` limit it is."""
    try:
        data, more = read_start(ctx.workspace, path, limit)
    except OutsideWorkspace as err:
        return err.result()
    except (FileNotFoundError, NotADirectoryError):
        return ToolResult.fail(ErrorCode.NOT_FOUND, f"no such file: {path}")
    except NotAFile:
        return ToolResult.fail(ErrorCode.INVALID_ARGS, f"not a file: {path}")
    except OSError as err:
        return ToolResult.fail(ErrorCode.FAILED, f"cannot read {path}: {err.strerror or err}")
    if more:
        return ToolResult.fail(ErrorCode.TOO_LARGE, f"{path} is larger than {limit:,} bytes, {whose}")
    name = PurePosixPath(path).name
    return OutFile(name, image_type(data) or mimetypes.guess_type(name)[0] or "application/octet-stream", data)


def _key(s: Session, ctx: ToolContext) -> str:
    """The call's rows' key. The call's step is in it: a model that reuses a call id in a later step
    sends a new message."""
    return f"{call_key(s, ctx.run_id, ctx.call_id)}:msg"


def _keep(s: Session, ctx: ToolContext, key: str, files: list[OutFile]) -> list[dict[str, str]]:
    """SentFile rows for `files` (ids derived from `key`: a replayed call adds none); their id, name and mime."""
    named = []
    for i, f in enumerate(files):
        file_id = hashlib.sha256(f"{key}:{i}".encode()).hexdigest()[:32]
        s.execute(insert(SentFile).values(id=file_id, conversation_id=ctx.conversation_id, name=f.name, mime=f.mime,
                                          size=len(f.data), data=f.data, created_at=utcnow())
                  .on_conflict_do_nothing(index_elements=["id"]))
        named.append({"id": file_id, "name": f.name, "mime": f.mime})
    return named


def _store(ctx: ToolContext, channel: str, chat_id: str, text: str, files: list[OutFile],
           own_chat: bool) -> list[Any]:
    """The files, the outbox rows (and the reply suppression) in one transaction; returns the delivery tasks."""
    from shared.outbox import add_reply  # here: shared.outbox imports the agent runtime, which imports tools

    origin = ctx.extra.get("origin") or {}
    meta = {**(origin.get("reply_meta", {}) if own_chat else {}), "run_id": ctx.run_id, "via": "message"}
    with session_scope(ctx.settings.database_url) as s:
        key = _key(s, ctx)
        nexts = add_reply(s, ctx.settings, key=key, channel=channel, chat_id=chat_id, text=text, meta=meta,
                          run_id=ctx.run_id or None, files=_keep(s, ctx, key, files))
        if own_chat and ctx.run_kind == "turn" and ctx.run_id:
            s.execute(update(Run).where(col(Run.id) == ctx.run_id).values(suppress_reply=True))
    return list(nexts)


def _to_caller(ctx: ToolContext, files: list[OutFile]) -> list[dict[str, Any]]:
    """The API channel's files: kept for the caller to fetch (GET /api/v1/files/{id})."""
    with session_scope(ctx.settings.database_url) as s:
        named = _keep(s, ctx, _key(s, ctx), files)
    return [{**n, "size": len(f.data), "url": f"/api/v1/files/{n['id']}"} for n, f in zip(named, files, strict=True)]


def _delivered(ctx: ToolContext, chat_id: str) -> str:
    """Where an `api` message goes: to the caller of this run, or, from a cron job's run into the API
    conversation its results go to, into that conversation with the run's answer (shared.scheduling.cron)."""
    if ctx.run_kind == "cron" and chat_id != ctx.conversation_id:
        return "with this job's result, when this run ends"
    return "to the API caller"


class MessageTool(Tool):
    name = "message"
    description = ("Send a message to a chat: by default the current one (then it replaces your final reply "
                   "there), or another the operator allows, with channel and chat_id. `files` sends workspace "
                   "files with it (a report, a chart, a photo).")
    Args = MessageArgs
    group = "messaging"
    max_input_bytes = 200_000
    timeout = 60.0
    idempotent = True  # a replayed send finds the outbox rows it wrote (their key derives from this tool call)

    async def run(self, args: MessageArgs, ctx: ToolContext) -> ToolResult:
        target = _target(args, ctx)
        if isinstance(target, ToolResult):
            return target
        channel, chat_id = target
        files = await asyncio.to_thread(_load, ctx, channel, args.files)
        if isinstance(files, ToolResult):
            return files
        if channel == API:
            sent = {"files": await asyncio.to_thread(_to_caller, ctx, files)} if files else {}
            ctx.emit("message", {"call_id": ctx.call_id, "chat_id": chat_id, "content": args.content, **sent})
            return ToolResult.success({"channel": API, "chat_id": chat_id, "delivered": _delivered(ctx, chat_id),
                                       "content": args.content, **sent})
        own_chat = channel == ctx.channel and chat_id == ctx.chat_id
        nexts = await asyncio.to_thread(_store, ctx, channel, chat_id, args.content, files, own_chat)
        ctx.followups.extend(nexts)
        note = " (this replaces your final reply there)" if own_chat and ctx.run_kind == "turn" else ""
        what = f"message with {len(files)} file(s)" if files else "message"
        return ToolResult.success(f"{what} queued for {channel}:{chat_id}{note}")
