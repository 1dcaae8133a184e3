"""Cron jobs in Postgres: create, change, delete and show them; the redbeat mirror follows each change.

Shared by the `cron` tool, the REST API and the CLI. Call `sync` (or `mirror.disarm`) after the
transaction that changed a job has committed; reconciliation repairs a mirror write that was lost.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from croniter import CroniterError, croniter
from pydantic import BaseModel, Field
from sqlalchemy import func
from sqlmodel import Session, col, or_, select

from shared.channels import REGISTRY, get_channel
from shared.channels.base import BaseChannel
from shared.contracts import NO_NUL, Said
from shared.errors import Conflict, NanofleetError, NotFound
from shared.models import Conversation, CronJob, CronReceipt, utcnow
from shared.scheduling import schedules
from shared.scheduling.beat import BeatMirror
from shared.settings import Settings

Policy = Literal["skip", "run_once", "catch_up"]
PAST_SLACK = timedelta(seconds=60)  # an `at` this far in the past still runs (clock skew, slow typing)
MAX_AHEAD = timedelta(seconds=schedules.MAX_EVERY)  # an `at` further ahead is a typo, not a plan (ten years)
API = "api"  # results stay in the job's session, or go into the API conversation its chat id names
TZ_ONLY = "tz applies only to cron expressions and to a new `at` (a time without an offset is read in it)"
GAP_HORIZON = timedelta(days=8)  # a cron expression's firings looked at for spacing: a week and its midnights
GAP_STEPS = 2_000  # at most this many of them


class InvalidJob(NanofleetError):
    """A job that cannot be scheduled as described."""

    status_code = 422


class JobIn(BaseModel):
    """A new job: exactly one of every_seconds, cron_expr or at."""

    message: Said = Field(min_length=1, max_length=10_000, pattern=NO_NUL,
                         description="what the agent is asked at each run")
    name: str = Field(default="", max_length=200, pattern=NO_NUL)
    every_seconds: int | None = Field(default=None, ge=1, le=schedules.MAX_EVERY, description="run every N seconds")
    cron_expr: str | None = Field(default=None, max_length=200, pattern=NO_NUL, description="5-field cron expression")
    tz: str | None = Field(default=None, max_length=64, pattern=NO_NUL,
                           description="IANA timezone for cron_expr (and a naive at)")
    at: datetime | None = Field(default=None, description="one run at this ISO-8601 time")
    missed_policy: Policy | None = Field(default=None, description="skip (default; run_once for at) or catch_up")
    channel: str = Field(default="api", max_length=32, pattern=NO_NUL)
    chat_id: str = Field(default="", max_length=200, pattern=NO_NUL)
    reply_meta: dict[str, Any] = Field(default_factory=dict)
    enabled: bool = True


class JobPatch(BaseModel):
    """Changes to a job; a new schedule replaces the old one and starts from now."""

    message: Said | None = Field(default=None, min_length=1, max_length=10_000, pattern=NO_NUL)
    name: str | None = Field(default=None, max_length=200, pattern=NO_NUL)
    every_seconds: int | None = Field(default=None, ge=1, le=schedules.MAX_EVERY)
    cron_expr: str | None = Field(default=None, max_length=200, pattern=NO_NUL)
    tz: str | None = Field(default=None, max_length=64, pattern=NO_NUL)
    at: datetime | None = None
    missed_policy: Policy | None = None
    channel: str | None = Field(default=None, max_length=32, pattern=NO_NUL)
    chat_id: str | None = Field(default=None, max_length=200, pattern=NO_NUL)
    enabled: bool | None = None


def spec_of(job: CronJob) -> schedules.Spec:
    return schedules.Spec(kind=job.kind, anchor=job.created_at, every_seconds=job.every_seconds,
                          cron_expr=job.cron_expr, tz=job.tz, at=job.at)


def cursor(job: CronJob) -> datetime:
    """The latest fire time already handled (fired, or skipped by the missed policy)."""
    return job.last_fired_at or job.created_at


def upcoming(job: CronJob, now: datetime) -> datetime | None:
    """The next fire time after now, for the mirror; None when the job is off or done."""
    return schedules.next_after(spec_of(job), max(cursor(job), now)) if job.enabled else None


def sync(mirror: BeatMirror, job: CronJob, now: datetime | None = None) -> None:
    """Arm the job's entry for its next fire time, or remove it."""
    nxt = upcoming(job, now or utcnow())
    if nxt is None:
        mirror.disarm(job.id)
    else:
        mirror.arm(job.id, nxt)


def _zone(tz: str) -> ZoneInfo:
    try:
        return schedules.zone(tz)
    except schedules.ScheduleError as err:
        raise InvalidJob(str(err)) from None


def _at(at: datetime, zone: ZoneInfo, now: datetime) -> datetime:
    """A one-shot time as a whole UTC second, not in the past nor absurdly far ahead. A local time the
    clocks skip (02:30 on a spring-forward day) is the end of the gap, as for a cron job's time."""
    try:  # a year-9999 time can leave datetime's range once moved to UTC
        when = schedules.whole_second(at if at.tzinfo else schedules.resolve(at, zone)[0])
    except OverflowError:
        raise InvalidJob(f"at {at.isoformat()} is out of range") from None
    if when < now - PAST_SLACK:
        raise InvalidJob(f"at {when.isoformat()} is in the past")
    if when > now + MAX_AHEAD:
        raise InvalidJob(f"at {when.isoformat()} is too far ahead: at most ten years from now")
    return max(when, schedules.whole_second(now) + timedelta(seconds=1))


def _schedule(settings: Settings, *, every: int | None, expr: str | None, tz: str | None, at: datetime | None,
              now: datetime, tz_given: bool = False) -> dict[str, Any]:
    """Columns for the schedule; raises InvalidJob with the reason. `tz_given`: the caller asked for
    `tz` itself, which is refused for `every`, where it would change nothing."""
    given = [k for k, v in (("every_seconds", every), ("cron_expr", expr), ("at", at)) if v is not None]
    if len(given) != 1:
        raise InvalidJob("give exactly one of every_seconds, cron_expr or at")
    kind = {"every_seconds": "every", "cron_expr": "cron", "at": "at"}[given[0]]
    tz = tz or settings.scheduler.timezone
    zone = _zone(tz)
    if tz_given and kind == "every":
        raise InvalidJob(TZ_ONLY)
    if at is not None:
        at = _at(at, zone, now)
    try:
        expr = schedules.check_cron(expr) if expr is not None else None
        schedules.validate(schedules.Spec(kind=kind, anchor=now, every_seconds=every, cron_expr=expr, tz=tz, at=at))
    except schedules.ScheduleError as err:
        raise InvalidJob(str(err)) from None
    return {"kind": kind, "every_seconds": every, "cron_expr": expr, "tz": tz, "at": at}


def check_target(s: Session, settings: Settings, *, channel: str, chat_id: str) -> None:
    """Refuse a target no result could reach: every firing would pay for a run whose reply is lost."""
    if channel == API:
        _check_api_chat(s, chat_id)
        return
    found = get_channel(channel, settings)
    if found is None:
        raise InvalidJob(f"unknown channel '{channel}': use {API} or one of {', '.join(sorted(REGISTRY))}")
    if not found.enabled():
        missing = found.missing() if isinstance(found, BaseChannel) else []
        to_set = f": set {', '.join(missing)}" if missing else ""
        raise InvalidJob(f"channel '{channel}' is not configured here{to_set}")
    if not chat_id.strip():
        raise InvalidJob(f"channel '{channel}' needs a chat_id: the chat the results go to")


def _check_api_chat(s: Session, chat_id: str) -> None:
    """An `api` chat id names a conversation: its id (the results are posted there), or its session
    key (what the cron tool sets in `nanofleet agent`; the results stay in the job's own session, as
    without a chat id). Anything else is a typo whose results nobody would see."""
    if not chat_id:
        return
    named = or_(col(Conversation.id) == chat_id, col(Conversation.session_key) == chat_id)
    if s.exec(select(Conversation.id).where(named).limit(1)).first() is None:
        raise InvalidJob(f"no conversation '{chat_id}': give the id of one (POST /api/v1/conversations makes one), "
                         "or leave chat_id out to keep the results in the job's own session")


class AlreadyFired(NanofleetError):
    """A replayed add whose job was created, fired and removed before the replay (an `at` job)."""

    status_code = 409


def shorter_gap(expr: str, tz: str, after: datetime, limit: timedelta) -> timedelta | None:
    """A gap shorter than `limit` between two firings of the (valid) cron expression in the week from
    its first firing after `after` (months away, for `* * 1 * *`), as wall-clock times in `tz`; None
    when there is none."""
    walls = croniter(expr, after.astimezone(schedules.zone(tz)).replace(tzinfo=None))
    first: datetime | None = None
    previous: datetime | None = None
    for _ in range(GAP_STEPS):
        try:
            wall = walls.get_next(datetime)
        except CroniterError:
            return None
        if previous is not None and wall - previous < limit:
            return wall - previous
        first = first or wall
        if wall - first > GAP_HORIZON:
            return None
        previous = wall
    return None


def _model_may_add(s: Session, settings: Settings, data: JobIn, columns: dict[str, Any], now: datetime) -> None:
    """The limits on jobs the model adds (each firing is a paid run, and a prompt injection may ask):
    no schedule faster than the minimum, no more than the maximum of jobs in the chat."""
    cfg = settings.scheduler
    if cfg.tool_max_jobs == 0:  # before the rest: no other change to the job would let it in
        raise Conflict("the operator has turned off adding cron jobs here (NANOFLEET_SCHEDULER__TOOL_MAX_JOBS=0)")
    minimum = timedelta(seconds=cfg.tool_min_interval)
    why = f"a job you add must fire at least {cfg.tool_min_interval} seconds apart"
    how = "(NANOFLEET_SCHEDULER__TOOL_MIN_INTERVAL; the operator can add faster ones through the REST API)"
    every = columns["every_seconds"]
    if every is not None and every < cfg.tool_min_interval:
        raise InvalidJob(f"every_seconds={every} is too often: {why} {how}")
    if columns["cron_expr"] and (gap := shorter_gap(columns["cron_expr"], columns["tz"], now, minimum)):
        raise InvalidJob(f"cron_expr '{columns['cron_expr']}' fires {int(gap.total_seconds())} seconds apart: "
                         f"{why} {how}")
    # Calls of one response run at once: each counts under a lock on the chat, held until commit.
    s.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(f"cron:{data.channel}:{data.chat_id}", 0))))
    held = s.exec(select(func.count()).select_from(CronJob).where(
        CronJob.channel == data.channel, CronJob.chat_id == data.chat_id, col(CronJob.system).is_(False))).one()
    if held >= cfg.tool_max_jobs:
        raise Conflict(f"this chat has {held} cron jobs, the most you may add to (NANOFLEET_SCHEDULER__TOOL_MAX_JOBS): "
                       "remove one it no longer needs (action=list, then action=remove) before adding another")


def create(s: Session, settings: Settings, data: JobIn, *, job_id: str | None = None,
           now: datetime | None = None, by_model: bool = False) -> CronJob:
    """Store a new job (or return the one already stored under `job_id`: a replayed call). A replay
    must not bring back a job that has fired since: its `at` would move to now and fire again.
    `by_model`: the cron tool adds it, held to the limits of NANOFLEET_SCHEDULER__TOOL_*."""
    if job_id and (existing := s.get(CronJob, job_id)) is not None:
        return existing
    if job_id and s.exec(select(CronReceipt.id).where(CronReceipt.job_id == job_id)).first() is not None:
        raise AlreadyFired(f"cron job {job_id} was created by this call and has already run")
    now = now or utcnow()
    columns = _schedule(settings, every=data.every_seconds, expr=data.cron_expr, tz=data.tz, at=data.at, now=now,
                        tz_given=data.tz is not None)
    check_target(s, settings, channel=data.channel, chat_id=data.chat_id)
    if by_model:
        _model_may_add(s, settings, data, columns, now)
    policy = data.missed_policy or ("run_once" if columns["kind"] == "at" else "skip")
    origin = {"channel": data.channel, "chat_id": data.chat_id, "reply_meta": data.reply_meta}
    job = CronJob(name=data.name or data.message[:60], message=data.message, missed_policy=policy,
                  channel=data.channel, chat_id=data.chat_id, origin=origin, enabled=data.enabled,
                  created_at=now, **columns)
    if job_id:
        job.id = job_id
    s.add(job)
    s.flush()
    return job


def get(s: Session, job_id: str, *, lock: bool = False) -> CronJob:
    job = s.get(CronJob, job_id, with_for_update=lock)
    if job is None:
        raise NotFound(f"no cron job {job_id}")
    return job


def _user_owned(job: CronJob) -> None:
    if job.system:
        raise Conflict(f"cron job {job.id} belongs to nanofleet; change it through NANOFLEET_SCHEDULER__* settings")


def update(s: Session, settings: Settings, job: CronJob, patch: JobPatch, *, now: datetime | None = None) -> CronJob:
    """Apply a patch; a new schedule, or re-enabling, counts from now (nothing is 'missed')."""
    _user_owned(job)
    now = now or utcnow()
    changes = patch.model_dump(exclude_unset=True)
    _reschedule(settings, job, patch, changes.keys(), now)
    if changes.get("enabled") and not job.enabled:
        _revive(job, now)
    for name in ("message", "name", "missed_policy", "enabled"):
        if changes.get(name) is not None:
            setattr(job, name, changes[name])
    if patch.channel is not None or patch.chat_id is not None:
        job.channel = patch.channel if patch.channel is not None else job.channel
        job.chat_id = patch.chat_id if patch.chat_id is not None else job.chat_id
        check_target(s, settings, channel=job.channel, chat_id=job.chat_id)
        job.origin = {"channel": job.channel, "chat_id": job.chat_id, "reply_meta": {}}
    s.add(job)
    s.flush()
    return job


def _reschedule(settings: Settings, job: CronJob, patch: JobPatch, changed: Any, now: datetime) -> None:
    """A new schedule (or a cron job's new zone) replaces the old one from now; `tz` is always checked."""
    if {"every_seconds", "cron_expr", "at"} & changed:
        columns = _schedule(settings, every=patch.every_seconds, expr=patch.cron_expr, tz=patch.tz or job.tz,
                            at=patch.at, now=now, tz_given=patch.tz is not None)
        for name, value in columns.items():
            setattr(job, name, value)
        job.last_fired_at = now
    elif patch.tz is not None:
        _zone(patch.tz)
        if job.kind != "cron":  # an `at` is stored as an instant: a zone cannot move it
            raise InvalidJob(f"{TZ_ONLY}; to move this {job.kind} job, give a new schedule")
        job.tz = _schedule(settings, every=None, expr=job.cron_expr, tz=patch.tz, at=None, now=now)["tz"]
        job.last_fired_at = now


def _revive(job: CronJob, now: datetime) -> None:
    """Re-enabling counts from now, as if the job were new. A one-shot whose time passed meanwhile
    would then never fire and never be removed: refuse instead, naming the way out."""
    if job.kind == "at" and (job.at is None or job.at <= now):
        at = job.at.isoformat() if job.at else "?"
        raise InvalidJob(f"cron job {job.id} was to run once at {at}, which passed while it was disabled: "
                         "give it a new `at` to enable it, or remove it")
    job.last_fired_at = now


def delete(s: Session, job: CronJob) -> None:
    _user_owned(job)
    s.delete(job)
    s.flush()


def listing(s: Session, *, channel: str | None = None, chat_id: str | None = None,
            include_system: bool = True) -> list[CronJob]:
    query = select(CronJob).order_by(col(CronJob.created_at))
    if channel is not None:
        query = query.where(CronJob.channel == channel)
    if chat_id is not None:
        query = query.where(CronJob.chat_id == chat_id)
    if not include_system:
        query = query.where(col(CronJob.system).is_(False))
    return list(s.exec(query))


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


def view(job: CronJob, now: datetime | None = None) -> dict[str, Any]:
    """A job as the API, the tool and the CLI show it."""
    return {
        "id": job.id, "name": job.name, "message": job.message, "kind": job.kind,
        "everySeconds": job.every_seconds, "cronExpr": job.cron_expr, "tz": job.tz, "at": _iso(job.at),
        "enabled": job.enabled, "missedPolicy": job.missed_policy, "channel": job.channel, "chatId": job.chat_id,
        "system": job.system, "lastFiredAt": _iso(job.fired_at),
        "nextRunAt": _iso(_next_run(job, now or utcnow())), "createdAt": _iso(job.created_at),
    }


def _next_run(job: CronJob, now: datetime) -> datetime | None:
    """When the job runs next: a one-shot job its `at`, even past (it runs however late: no worker was
    up, its session was busy), until it has fired; another its next fire time from now."""
    if job.kind == "at" and job.enabled:
        return schedules.next_after(spec_of(job), cursor(job))
    return upcoming(job, now)
