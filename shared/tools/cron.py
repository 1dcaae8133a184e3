"""`cron`: add, list, remove, enable or disable scheduled jobs whose results go to this chat."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from shared.db import session_scope
from shared.errors import Conflict, NotFound
from shared.models import CronJob, RunKind
from shared.scheduling import jobs
from shared.scheduling.beat import BeatMirror, beat_app
from shared.scheduling.ids import call_key, derived, is_retry
from shared.scheduling.schedules import MAX_EVERY
from shared.settings import Settings
from shared.tools.base import ErrorCode, Tool, ToolContext, ToolResult

log = logging.getLogger(__name__)


class CronArgs(BaseModel):
    action: Literal["add", "list", "remove", "enable", "disable"]
    message: str | None = Field(default=None, max_length=10_000, description="add: what to do at each run")
    every_seconds: int | None = Field(default=None, ge=1, le=MAX_EVERY, description="add: run every N seconds")
    cron_expr: str | None = Field(default=None, max_length=200, description="add: 5-field cron, e.g. '0 9 * * 1-5'")
    tz: str | None = Field(default=None, max_length=64, description="add: IANA timezone for cron_expr")
    at: datetime | None = Field(default=None, description="add: run once at this ISO-8601 time")
    job_id: str | None = Field(default=None, max_length=64, description="remove, enable, disable: the job")
    name: str | None = Field(default=None, max_length=200, description="add: a short name")
    missed_policy: Literal["skip", "run_once", "catch_up"] | None = Field(
        default=None, description="add: runs missed while the scheduler was down: skip, run_once or catch_up")


class CronTool(Tool):
    """Scheduled jobs of the current chat (Postgres, mirrored into the beat schedule)."""

    name = "cron"
    description = (
        "Schedule messages to yourself that run as tasks later; each run's answer is posted to this chat. "
        "action=add with message and one of every_seconds, cron_expr (+tz) or at (ISO-8601); "
        "action=list; action=remove|enable|disable with job_id. Each run costs a model call: jobs fire at most "
        "once a minute (or as the operator set), a chat holds a limited number, and a scheduled run adds none."
    )
    Args = CronArgs
    group = "scheduling"
    timeout = 30.0
    idempotent = True  # a replayed add finds the job it created (its id derives from this tool call)

    async def run(self, args: CronArgs, ctx: ToolContext) -> ToolResult:
        try:
            return await asyncio.to_thread(self._run, args, ctx)
        except jobs.InvalidJob as err:
            return ToolResult.fail(ErrorCode.INVALID_ARGS, err.message)
        except NotFound as err:
            return ToolResult.fail(ErrorCode.NOT_FOUND, err.message)
        except Conflict as err:
            return ToolResult.fail(ErrorCode.NOT_ALLOWED, err.message)
        except ValidationError as err:
            return ToolResult.fail(ErrorCode.INVALID_ARGS, f"invalid job: {err}")

    def _run(self, args: CronArgs, ctx: ToolContext) -> ToolResult:
        if args.action == "list":
            with session_scope(ctx.settings.database_url) as s:
                found = jobs.listing(s, channel=ctx.channel, chat_id=ctx.chat_id, include_system=False)
                return ToolResult.success({"jobs": [_brief(j) for j in found]})
        if args.action == "add":
            return self._add(args, ctx)
        if not args.job_id:
            return ToolResult.fail(ErrorCode.INVALID_ARGS, f"action={args.action} needs job_id (see action=list)")
        with session_scope(ctx.settings.database_url) as s:
            current = s.get(CronJob, args.job_id, with_for_update=True)
            if current is None and args.action == "remove" and ctx.run_id and is_retry(s, ctx.run_id, ctx.call_id):
                # This call ran before (its worker died before the result was kept): it removed the job.
                out: dict[str, Any] = {"removed": args.job_id, "note": "already removed by this call's first try"}
                kept: CronJob | None = None
            elif args.action == "remove":
                jobs.delete(s, _in_chat(current, args.job_id, ctx))
                out, kept = {"removed": args.job_id}, None
            else:
                kept = jobs.update(s, ctx.settings, _in_chat(current, args.job_id, ctx),
                                   jobs.JobPatch(enabled=args.action == "enable"))
                out = _brief(kept)
        _mirror(ctx.settings, args.job_id, kept)
        return ToolResult.success(out)

    def _add(self, args: CronArgs, ctx: ToolContext) -> ToolResult:
        origin = ctx.extra.get("origin") or {}
        # A job adding jobs would multiply at every firing: its run, or a later turn of its session (the
        # report of a subagent it spawned), whose origin names the job.
        if ctx.run_kind == RunKind.CRON.value or origin.get("cron_job_id"):
            return ToolResult.fail(ErrorCode.NOT_ALLOWED, "a scheduled job's run cannot add cron jobs: say in your "
                                   "answer what should be scheduled, and the user can ask for it in the chat")
        if not args.message:
            return ToolResult.fail(ErrorCode.INVALID_ARGS, "action=add needs message: what to do at each run")
        data = jobs.JobIn(
            message=args.message, name=args.name or "", every_seconds=args.every_seconds, cron_expr=args.cron_expr,
            tz=args.tz, at=args.at, missed_policy=args.missed_policy, channel=ctx.channel, chat_id=ctx.chat_id,
            reply_meta=origin.get("reply_meta") or {},
        )
        with session_scope(ctx.settings.database_url) as s:
            job_id = derived("cron", call_key(s, ctx.run_id, ctx.call_id))[:12] if ctx.run_id else None
            try:
                job = jobs.create(s, ctx.settings, data, job_id=job_id, by_model=True)
            except jobs.AlreadyFired as err:
                return ToolResult.success({"job_id": job_id, "status": "already ran", "note": err.message})
        _mirror(ctx.settings, job.id, job)
        return ToolResult.success(_brief(job))


def _in_chat(job: CronJob | None, job_id: str, ctx: ToolContext) -> CronJob:
    """Jobs of other chats are invisible here: one is refused as a job that does not exist is."""
    if job is None or job.system or (job.channel, job.chat_id) != (ctx.channel, ctx.chat_id):
        raise NotFound(f"no cron job {job_id} in this chat (see action=list)")
    return job


def _brief(job: CronJob) -> dict[str, Any]:
    v = jobs.view(job)
    schedule = {"every": f"every {job.every_seconds} s", "cron": f"cron '{job.cron_expr}' ({job.tz})",
                "at": f"once at {v['at']}"}[job.kind]
    return {"job_id": job.id, "name": job.name, "schedule": schedule, "message": job.message,
            "enabled": job.enabled, "next_run": v["nextRunAt"], "missed_policy": job.missed_policy}


def _mirror(settings: Settings, job_id: str, job: CronJob | None) -> None:
    """Update the beat schedule (None: the job is gone); if Redis is unreachable, reconciliation does it later."""
    try:
        mirror = BeatMirror(beat_app(settings))
        if job is None:
            mirror.disarm(job_id)
        else:
            jobs.sync(mirror, job)
    except Exception as err:
        log.warning("cron job %s: beat schedule not updated now (%s); reconciliation will", job_id, err)
