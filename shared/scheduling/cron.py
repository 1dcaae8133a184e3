"""Cron firings and reconciliation.

A firing locks the job row, works out which fire times are due under the job's missed policy,
and for each writes a receipt unique per (job, fire time) before anything else: a duplicate fire
(two beats after a lock loss, a replayed task, reconciliation racing beat) finds the receipt and
does nothing. Each firing becomes a run of kind `cron` in the session `cron:<job id>`; its result
goes to the job's target chat (the finish hook): through the outbox to a platform, or, for `api`,
into the API conversation the chat id names; either way the chat's conversation keeps it. A job
never runs twice at once: while its run is going, due times wait and the finish hook checks again.
Reconciliation makes the redbeat mirror match Postgres (at beat start-up and periodically), fires
what was missed, posts results that waited for a busy conversation, and re-sends a daily summary
whose firing was lost after its receipt.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert
from sqlmodel import Session, col, select
from sqlmodel.sql.expression import SelectOfScalar

from shared.agent import conversations
from shared.agent.finish import deliver
from shared.agent.runtime import Next, Runtime
from shared.constants import HEARTBEAT_QUIET, INTERNAL, T_AGENT_STEP, T_CRON_FIRE, T_CRON_RECONCILE, T_DAILY_SUMMARY
from shared.models import (
    TERMINAL,
    Conversation,
    CronJob,
    CronReceipt,
    Message,
    Role,
    Run,
    RunKind,
    ToolCall,
    ToolStatus,
    utcnow,
)
from shared.scheduling import schedules
from shared.scheduling.beat import BeatMirror
from shared.scheduling.jobs import API, cursor, spec_of, upcoming
from shared.settings import Settings

log = logging.getLogger(__name__)
SESSION_PREFIX = "cron:"
RECONCILE_SLACK = timedelta(seconds=3)  # beat fires on time; reconciliation only steps in later
DAILY_SUMMARY_ID = "sys-daily-summary"
PLANNED_ID = DAILY_SUMMARY_ID + ":planned"  # receipts of the daily summaries whose fan-out ran
PLAN_GRACE = timedelta(minutes=1)  # a daily firing's fan-out task normally runs well within this
PLAN_LOOKBACK = timedelta(hours=24)  # older daily firings are not re-sent
POST_RETRY = 5.0  # seconds before a result that waited for a busy conversation is tried again
POST_WINDOW = timedelta(hours=1)  # a result not posted within this is given up (logged)
KEPT_RESULTS = (RunKind.CRON, RunKind.HEARTBEAT)  # the runs whose results their chat's conversation keeps


def receipt(s: Session, job_id: str, scheduled_for: datetime) -> CronReceipt | None:
    """Record the firing; None when it was recorded before (a duplicate)."""
    new_id = s.execute(
        insert(CronReceipt)
        .values(job_id=job_id, scheduled_for=scheduled_for, created_at=utcnow())
        .on_conflict_do_nothing(index_elements=["job_id", "scheduled_for"])
        .returning(col(CronReceipt.id))
    ).scalar()
    return s.get(CronReceipt, new_id) if new_id is not None else None


def _busy(s: Session, job: CronJob) -> bool:
    """Whether the job's session has a turn running; if not, none can start there (a subagent's
    report, a waiting message) before this transaction ends: its row is locked."""
    conv = s.exec(select(Conversation).where(Conversation.session_key == SESSION_PREFIX + job.id)
                  .with_for_update()).first()
    return conv is not None and conv.active_run_id is not None


def _prompt(job: CronJob, at: datetime) -> str:
    local = at.astimezone(schedules.zone(job.tz)).isoformat(timespec="minutes")
    return (f"[scheduled job '{job.name}' ({job.id}), due {local}; not typed by the user just now. "
            f"Do it and answer with what the user should get.]\n{job.message}")


def _start(rt: Runtime, s: Session, job: CronJob, at: datetime, rec: CronReceipt) -> list[Next]:
    """The work of one firing: a cron run, or the system job's own task."""
    if job.system:
        return [Next(T_DAILY_SUMMARY, (at.isoformat(),))] if job.id == DAILY_SUMMARY_ID else []
    conv = conversations.get_or_create(s, session_key=SESSION_PREFIX + job.id, channel=INTERNAL, chat_id=job.id)
    origin = {**job.origin, "cron_job_id": job.id}
    run_id = conversations.try_start_turn(
        s, conv.id, origin=origin, lease_seconds=rt.settings.runtime.lease_seconds, kind=RunKind.CRON,
        max_iterations=rt.settings.agent.max_iterations, task=job.message,
    )
    if run_id is None:
        log.warning("cron job %s: its session is busy; the firing for %s is dropped", job.id, at.isoformat())
        return []
    s.add(Message(conversation_id=conv.id, run_id=run_id, role=Role.USER, content=_prompt(job, at),
                  meta={"origin": origin, "cron_job_id": job.id, "scheduled_for": at.isoformat()}))
    rec.run_id = run_id
    s.add(rec)
    return [Next(T_AGENT_STEP, (run_id, 0))]


def _fire_locked(rt: Runtime, s: Session, job: CronJob, until: datetime) -> tuple[list[Next], bool]:
    """Fire what is due for a locked, enabled job; returns the tasks and whether the job is done."""
    if not job.system and _busy(s, job):
        return [], False
    times = schedules.due(spec_of(job), cursor(job), until)
    chosen = schedules.pick(job.missed_policy, times, until)
    if job.missed_policy == "catch_up" and not job.system:
        chosen = chosen[:1]  # one run at a time: the finish hook fires the next missed one
    if len(chosen) < len(times) and job.missed_policy != "catch_up":
        log.info("cron job %s: %d missed firing(s) skipped (policy %s)", job.id, len(times) - len(chosen),
                 job.missed_policy)
    nexts: list[Next] = []
    for at in chosen:
        rec = receipt(s, job.id, at)
        if rec is None:
            log.info("cron job %s: the firing for %s already ran", job.id, at.isoformat())
            continue
        started = _start(rt, s, job, at, rec)
        if started or job.system:
            job.fired_at = at
        nexts += started
    if times:
        job.last_fired_at = chosen[0] if job.missed_policy == "catch_up" and chosen else times[-1]
        s.add(job)
    done = job.kind == "at" and schedules.next_after(spec_of(job), cursor(job)) is None
    if done:
        s.delete(job)  # an `at` job is removed once it has fired (its receipts stay, for the retention period)
    return nexts, done


def fire(rt: Runtime, mirror: BeatMirror, job_id: str, hinted: datetime | None = None,
         now: datetime | None = None) -> list[Next]:
    """Handle a cron fire for `job_id` (`hinted`: the fire time beat armed; None: whatever is due)."""
    now = now or utcnow()
    until = max(now, hinted) if hinted else now  # beat's clock said it is due: trust it
    nexts: list[Next] = []
    nxt: datetime | None = None
    with rt.session() as s:
        job = s.get(CronJob, job_id, with_for_update=True)
        if job is not None and job.enabled:
            nexts, done = _fire_locked(rt, s, job, until)
            nxt = None if done else upcoming(job, until)
    if nxt is None:
        mirror.disarm(job_id)
    else:
        mirror.arm(job_id, nxt)
    return nexts


def overdue(job: CronJob, now: datetime) -> bool:
    """A fire time is due and beat has had time to fire it."""
    nxt = schedules.next_after(spec_of(job), cursor(job))
    return job.enabled and nxt is not None and nxt <= now - RECONCILE_SLACK


def ensure_system_jobs(s: Session, settings: Settings, now: datetime) -> None:
    """The daily summary job exists exactly when it is enabled, with the configured schedule."""
    cfg = settings.scheduler.daily_summary
    job = s.get(CronJob, DAILY_SUMMARY_ID, with_for_update=True)
    if not cfg.enabled:
        if job is not None:
            s.delete(job)
        return
    try:
        expr, tz = schedules.check_cron(cfg.cron), schedules.zone(settings.scheduler.timezone).key
    except schedules.ScheduleError as err:
        log.error("daily summary not scheduled: NANOFLEET_SCHEDULER__DAILY_SUMMARY__CRON / TIMEZONE: %s", err)
        return
    if job is None:
        s.execute(insert(CronJob).values(
            id=DAILY_SUMMARY_ID, name="daily summary", kind="cron", cron_expr=expr, tz=tz, system=True,
            message="Summarise the last 24 hours of each active conversation.", enabled=True,
            missed_policy="skip", channel=INTERNAL, chat_id="", origin={}, created_at=now,
        ).on_conflict_do_nothing(index_elements=["id"]))
    elif (job.cron_expr, job.tz, job.enabled) != (expr, tz, True):
        job.cron_expr, job.tz, job.enabled, job.last_fired_at = expr, tz, True, now
        s.add(job)


def reconcile(rt: Runtime, mirror: BeatMirror, now: datetime | None = None) -> list[Next]:
    """Make redbeat match Postgres and fire what is overdue; one bad job never stops the others."""
    now = now or utcnow()
    with rt.session() as s:
        ensure_system_jobs(s, rt.settings, now)
    with rt.session() as s:
        jobs = list(s.exec(select(CronJob).order_by(col(CronJob.created_at))))
        busy = set(s.exec(select(col(Run.origin)["cron_job_id"].astext).where(
            Run.kind == RunKind.CRON, col(Run.status).in_(("queued", "running")))).all())
    nexts: list[Next] = []
    wanted: set[str] = set()
    for job in jobs:
        try:
            if overdue(job, now) and job.id not in busy:
                nexts.append(Next(T_CRON_FIRE, (job.id, "")))
            due = upcoming(job, now)
            if due is not None:
                wanted.add(job.id)
                if not mirror.is_armed_for(job.id, due):
                    mirror.arm(job.id, due)
        except Exception:
            log.exception("cron job %s: could not reconcile", job.id)
    for stale in _stale(rt, mirror.job_ids() - wanted):
        mirror.disarm(stale)
    post_waiting(rt, now)
    return nexts + unplanned_summaries(rt, now)


def _stale(rt: Runtime, armed: set[str]) -> set[str]:
    """Of the entries no job read at the start of the pass wanted, those no enabled job has now: a
    job made, or switched on, since then was armed by whoever did it."""
    if not armed:
        return armed
    with rt.session() as s:
        return armed - set(s.exec(select(CronJob.id).where(col(CronJob.id).in_(armed), col(CronJob.enabled))).all())


def unplanned_summaries(rt: Runtime, now: datetime) -> list[Next]:
    """Daily firings whose receipt committed but whose fan-out never ran (the task was lost between
    the firing's commit and its enqueue): send them again. The fan-out and each summary are idempotent."""
    if not rt.settings.scheduler.daily_summary.enabled:
        return []
    planned = select(CronReceipt.scheduled_for).where(CronReceipt.job_id == PLANNED_ID)
    with rt.session() as s:
        lost = s.exec(select(CronReceipt.scheduled_for).where(
            CronReceipt.job_id == DAILY_SUMMARY_ID, col(CronReceipt.created_at) >= now - PLAN_LOOKBACK,
            col(CronReceipt.created_at) <= now - PLAN_GRACE, col(CronReceipt.scheduled_for).not_in(planned),
        )).all()
    for at in lost:
        log.warning("daily summary for %s: its fan-out never ran; sending it again", at.isoformat())
    return [Next(T_DAILY_SUMMARY, (at.isoformat(),)) for at in lost]


def on_finish(rt: Runtime, s: Session, run: Run) -> list[Next]:
    """A cron run ended: its result goes to the job's target; fire times that waited go next."""
    nexts = deliver(rt, s, run) + post_result(s, run)
    job_id = (run.origin or {}).get("cron_job_id")
    job = s.get(CronJob, job_id) if job_id else None
    if job is not None and job.enabled:
        nxt = schedules.next_after(spec_of(job), cursor(job))
        if nxt is not None and nxt <= utcnow():
            nexts.append(Next(T_CRON_FIRE, (job.id, "")))
    return nexts


def quiet(run: Run) -> bool:
    """Whether a heartbeat run had nothing to tell anyone: it answered HEARTBEAT_OK and nothing else
    (markup and punctuation aside). "HEARTBEAT_OK for most, but the backup FAILED" is sent."""
    return re.fullmatch(rf"\W*{HEARTBEAT_QUIET}\W*", (run.final_text or "").upper()) is not None


def post_result(s: Session, run: Run) -> list[Next]:
    """A job's result goes into the conversation of the chat it was sent to, once (run.announced,
    set in the same transaction): what the run sent that chat with the `message` tool, then its
    answer. An `api` job's chat reads it there; a platform chat got it through the outbox, and its
    conversation keeps it, so that a reply to a reminder is read with the reminder. As plain
    assistant messages: a reminder should read as the assistant's own words and cost no second LLM
    call. A conversation in the middle of a turn gets them later (reconciliation), so they never
    land between a tool call and its result."""
    origin = run.origin or {}
    if run.announced or (run.kind == RunKind.HEARTBEAT and quiet(run)):  # (a worker from before 0015 left it so)
        return []
    conv = _target(s, origin)
    if conv is not None and conv.id != run.conversation_id:
        answer = "" if run.suppress_reply else run.final_text or ""
        texts = [*_sent(s, run, origin), *([answer] if answer else [])]
        if texts and conv.active_run_id is not None:
            return [Next(T_CRON_RECONCILE, countdown=POST_RETRY)]
        for text in texts:
            s.add(Message(conversation_id=conv.id, role=Role.ASSISTANT, content=text, meta={
                "kind": f"{run.kind.value}_result", "cron_job_id": origin.get("cron_job_id"), "cron_run_id": run.id}))
    run.announced = True  # posted, or nothing to post here (which also keeps it out of ix_runs_results_unannounced)
    s.add(run)
    return []


def _target(s: Session, origin: dict[str, Any]) -> Conversation | None:
    """The conversation of the chat a job's results go to (locked), if it has one: an API
    conversation by its id; a platform chat's by its chat, or its thread or topic where it has one."""
    channel, chat_id = origin.get("channel", API), str(origin.get("chat_id") or "")
    if not chat_id or channel == INTERNAL:
        return None
    if channel == API:
        conv = s.get(Conversation, chat_id, with_for_update=True)
        return conv if conv is not None and conv.channel == API else None
    meta = origin.get("reply_meta") or {}
    thread = meta.get("message_thread_id") or meta.get("thread_ts")  # a Telegram topic, a Slack thread
    found = conversations.find(s, f"{channel}:{chat_id}" + (f":{thread}" if thread else ""), keep=False)
    return s.get(Conversation, found, with_for_update=True) if found else None


def _sent(s: Session, run: Run, origin: dict[str, Any]) -> list[str]:
    """The texts the run's `message` calls sent to the job's chat, in the order of the calls; a file
    as its name (and where the API serves it)."""
    channel, chat_id = origin.get("channel", API), str(origin.get("chat_id") or "")
    calls = s.exec(select(ToolCall.arguments, ToolCall.result).where(
        ToolCall.run_id == run.id, ToolCall.name == "message", ToolCall.status == ToolStatus.SUCCESS)
        .order_by(col(ToolCall.step_seq), col(ToolCall.position))).all()
    texts = []
    for args, result in calls:
        out = (result or {}).get("output")
        if not isinstance(out, dict):  # sent to a platform: as the model asked (its chat by default)
            out = {"channel": (args.get("channel") or channel).strip().lower(),  # as the tool reads it
                   "chat_id": args.get("chat_id") or chat_id, "content": args.get("content") or "",
                   "files": [{"name": f} for f in args.get("files") or []]}
        if out.get("channel") == channel and str(out.get("chat_id")) == chat_id:
            files = [": ".join(filter(None, (f.get("name"), f.get("url")))) for f in out.get("files", [])]
            texts.append("\n".join([out.get("content", ""), *files]).strip())
    return [t for t in texts if t]


def _waiting() -> SelectOfScalar[str]:
    return select(Run.id).where(
        col(Run.kind).in_(KEPT_RESULTS), col(Run.announced).is_(False), col(Run.status).in_(TERMINAL),
        col(Run.origin)["chat_id"].astext != "",
    )


def post_waiting(rt: Runtime, now: datetime) -> None:
    """Post the results that waited for a busy conversation (each run locked, then its target)."""
    with rt.session() as s:
        ids = s.exec(_waiting().where(col(Run.finished_at) >= now - POST_WINDOW)).all()
        late = _waiting().where(col(Run.finished_at) < now - POST_WINDOW)
        given_up = s.execute(update(Run).where(col(Run.id).in_(late)).values(announced=True)).rowcount  # type: ignore[attr-defined]
    if given_up:
        log.warning("%d cron or heartbeat result(s) waited over %s for their conversation; not posted",
                    given_up, POST_WINDOW)
    for run_id in ids:
        try:
            with rt.session() as s:
                post_result(s, s.get_one(Run, run_id, with_for_update=True))  # still busy: next time
        except Exception:
            log.exception("cron run %s: could not post its result", run_id)
