"""The scheduling core as plain functions (no Celery): missed-run policies, the receipt guard,
reconciliation, the daily summary job, replayed spawn and cron calls."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlmodel import select

from shared.agent import conversations, prompt
from shared.agent.finish import cancel, cancel_conversation
from shared.agent.local import drain
from shared.agent.runtime import Next, Runtime
from shared.constants import T_CRON_FIRE
from shared.models import CronJob, Message, MessageType, Role, RunKind, RunStatus, utcnow
from shared.scheduling import cron, jobs, subagents, summary
from shared.scheduling.beat import BeatMirror
from shared.scheduling.schedules import whole_second
from shared.tools.base import ErrorCode
from shared.tools.cron import CronArgs, CronTool
from shared.tools.spawn import SpawnArgs, SpawnTool
from tests.support.processes import wait_until
from tests.support.scheduling import call, db, parent_call, receipts, runs
from tests.support.stack import Stack

Core = Callable[..., tuple[Stack, Runtime, BeatMirror]]


def fire_until_idle(rt: Runtime, mirror: BeatMirror, job_id: str) -> None:
    """Fire, run what it started in-process, and fire again when a finish hook asks (catch-up)."""
    pending = [job_id]
    while pending:
        left = drain(rt, cron.fire(rt, mirror, pending.pop()))
        pending += [str(n.args[0]) for n in left if n.task == T_CRON_FIRE]


def add_job(stack: Stack, data: jobs.JobIn, now: datetime | None = None) -> str:
    with db(stack) as s:
        return jobs.create(s, stack.settings, data, now=now).id


def test_missed_runs_follow_the_policy(core: Core) -> None:
    stack, rt, mirror = core()
    now = utcnow()
    daily = (now - timedelta(hours=3)).replace(second=0, microsecond=0)
    expr = f"{daily.minute} {daily.hour} * * *"  # last fired three hours ago: late, whatever the policy
    missed = [daily - timedelta(days=d) for d in (3, 2, 1, 0)]
    ids = {policy: add_job(stack, jobs.JobIn(message=call("record", tag=policy), cron_expr=expr, tz="UTC",
                                             missed_policy=policy), now=now - timedelta(days=4, hours=1))
           for policy in ("skip", "run_once", "catch_up")}
    for jid in ids.values():
        fire_until_idle(rt, mirror, jid)
    assert receipts(stack, ids["skip"]) == []
    assert [r.scheduled_for for r in receipts(stack, ids["run_once"])] == missed[-1:]
    assert [r.scheduled_for for r in receipts(stack, ids["catch_up"])] == missed  # one by one, oldest first
    assert sorted(line.split()[-1] for line in stack.executions()) == ["catch_up"] * 4 + ["run_once"]
    for jid in ids.values():
        assert mirror.is_armed_for(jid, daily + timedelta(days=1))
        assert whole_second(jobs.cursor(jobs_row(stack, jid))) == daily


def jobs_row(stack: Stack, jid: str) -> CronJob:
    with db(stack) as s:
        return s.get_one(CronJob, jid)


def test_last_fired_at_is_when_the_job_last_ran_not_where_its_schedule_counts_from(core: Core) -> None:
    """A job whose firings were skipped, then rescheduled, disabled and enabled again, never ran: its
    lastFiredAt said it had (the time of the skip, the reschedule, the re-enable). A firing sets it."""
    stack, rt, mirror = core()
    now = utcnow()
    daily = (now - timedelta(hours=3)).replace(second=0, microsecond=0)
    jid = add_job(stack, jobs.JobIn(message=call("record", tag="ran"), cron_expr=f"{daily.minute} {daily.hour} * * *",
                                    tz="UTC", missed_policy="skip"), now=now - timedelta(days=2))
    fire_until_idle(rt, mirror, jid)  # yesterday's and today's firings missed, and skipped
    with db(stack) as s:
        job = jobs.get(s, jid, lock=True)
        for patch in ({"every_seconds": 60}, {"enabled": False}, {"enabled": True}):
            jobs.update(s, stack.settings, job, jobs.JobPatch(**patch))  # type: ignore[arg-type]
        assert jobs.view(job)["lastFiredAt"] is None and job.last_fired_at is not None
    due = jobs.upcoming(jobs_row(stack, jid), utcnow())
    assert due is not None
    drain(rt, cron.fire(rt, mirror, jid, due))
    assert jobs.view(jobs_row(stack, jid))["lastFiredAt"] == due.isoformat()
    assert stack.executions()[-1].endswith(" ran")


def test_the_receipt_stops_a_replayed_firing(core: Core) -> None:
    stack, rt, mirror = core()
    jid = add_job(stack, jobs.JobIn(message=call("record", tag="r"), every_seconds=3600))
    due = jobs.upcoming(jobs_row(stack, jid), utcnow())
    assert due is not None
    drain(rt, cron.fire(rt, mirror, jid, due))
    with db(stack) as s:  # as if the job row were restored from before the firing
        s.get_one(CronJob, jid).last_fired_at = None
    assert cron.fire(rt, mirror, jid, due) == []
    assert len(receipts(stack, jid)) == 1 and len(runs(stack, kind=RunKind.CRON)) == 1
    assert stack.executions()[0].endswith(" r") and len(stack.executions()) == 1


def test_reconcile_repairs_the_mirror_and_one_bad_job_stops_nothing(core: Core) -> None:
    stack, rt, mirror = core()
    late = add_job(stack, jobs.JobIn(message="late", every_seconds=1), now=utcnow() - timedelta(seconds=30))
    fine = add_job(stack, jobs.JobIn(message="fine", every_seconds=3600))
    with db(stack) as s:
        s.add(CronJob(id="broken", message="x", kind="cron", cron_expr="not a cron", created_at=utcnow()))
    mirror.arm("ghost", whole_second(utcnow()) + timedelta(hours=1))
    nexts = cron.reconcile(rt, mirror)
    assert Next(T_CRON_FIRE, (late, "")) in nexts and all(n.args[0] != "broken" for n in nexts)
    assert mirror.armed(late) is not None and mirror.armed(fine) is not None
    assert mirror.armed("broken") is None and mirror.armed("ghost") is None
    assert cron.reconcile(rt, mirror) == [Next(T_CRON_FIRE, (late, ""))]  # idempotent


def test_reconcile_leaves_the_entry_of_a_job_made_while_it_ran(core: Core, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass reads the jobs, then the entries: a job the API made (and armed) in between was taken
    for a stale entry and disarmed, to fire only after the next pass (helper's review)."""
    stack, rt, mirror = core()
    made: list[str] = []
    entries = mirror.job_ids

    def a_job_made_meanwhile() -> set[str]:
        with db(stack) as s:
            job = jobs.create(s, stack.settings, jobs.JobIn(message="hi", every_seconds=3600))
        jobs.sync(mirror, job)
        made.append(job.id)
        return entries()

    monkeypatch.setattr(mirror, "job_ids", a_job_made_meanwhile)
    mirror.arm("ghost", whole_second(utcnow()) + timedelta(hours=1))
    cron.reconcile(rt, mirror)
    assert mirror.armed(made[0]) is not None and mirror.armed("ghost") is None


def test_daily_summary_job_exists_exactly_when_enabled(core: Core) -> None:
    stack, rt, mirror = core(SCHEDULER__DAILY_SUMMARY__ENABLED="true", SCHEDULER__DAILY_SUMMARY__CRON="15 8 * * *",
                             SCHEDULER__TIMEZONE="Europe/Paris")
    cron.reconcile(rt, mirror)
    job = jobs_row(stack, cron.DAILY_SUMMARY_ID)
    assert (job.system, job.kind, job.cron_expr, job.tz) == (True, "cron", "15 8 * * *", "Europe/Paris")
    assert mirror.armed(job.id) is not None
    off = Runtime.build(stack.settings.model_copy(update={"scheduler": stack.settings.scheduler.model_copy(
        update={"daily_summary": stack.settings.scheduler.daily_summary.model_copy(update={"enabled": False})})}))
    cron.reconcile(off, mirror)
    with db(stack) as s:
        assert s.exec(select(CronJob).where(CronJob.system)).all() == []
    assert mirror.armed(cron.DAILY_SUMMARY_ID) is None


def test_daily_summaries_are_records_not_memory(core: Core) -> None:
    stack, rt, _ = core()
    with db(stack) as s:
        conv = conversations.get_or_create(s, session_key="api:x", chat_id="x")
        s.add(Message(conversation_id=conv.id, role=Role.USER, content="plan the trip"))
        s.add(Message(conversation_id=conv.id, role=Role.ASSISTANT, content="booked the train"))
        s.add(Message(conversation_id=conv.id, role=Role.SYSTEM, type=MessageType.SUMMARY, content="compacted",
                      meta={"covers_until_seq": 0}))
        cid = conv.id
    until = utcnow() + timedelta(minutes=1)
    assert [n.args for n in summary.plan(rt, until)] == [(until.isoformat(), cid)]
    assert summary.plan(rt, until) == []  # a copy of the firing's task: its fan-out would call the model again
    assert summary.summarise(rt, cid, until) and not summary.summarise(rt, cid, until)  # once per period
    with db(stack) as s:
        daily = s.exec(select(Message).where(Message.conversation_id == cid, Message.type == MessageType.SUMMARY)
                       .where(Message.content.startswith("SUMMARY:"))).all()
        assert len(daily) == 1 and daily[0].meta["daily_summary"] == until.isoformat()
        assert prompt.latest_summary(s, cid).content == "compacted"  # type: ignore[union-attr]


def test_a_replayed_spawn_finds_its_child(core: Core) -> None:
    stack, rt, _ = core()
    ctx = parent_call(stack, "spawn")
    first = subagents.spawn(stack.settings, parent_run_id=ctx.run_id, call_id="call_1", task="t", label=None)
    again = subagents.spawn(stack.settings, parent_run_id=ctx.run_id, call_id="call_1", task="t", label=None)
    assert (again.run_id, again.replayed, first.replayed) == (first.run_id, True, False)
    [child] = runs(stack, kind=RunKind.SUBAGENT)
    with db(stack) as s:  # cancelled before its first step: its task must not start a turn of its own
        drain(rt, cancel(rt, s, child.id, "test", []))
    assert [r.id for r in runs(stack, conversation_id=child.conversation_id)] == [child.id]
    assert runs(stack, kind=RunKind.SUBAGENT)[0].status == RunStatus.CANCELLED


def test_a_spawn_kept_waiting_on_its_turns_locks_starts_nothing(core: Core, monkeypatch: pytest.MonkeyPatch) -> None:
    """The spawn tool's timeout cannot stop the thread that spawns: one that waited out a lock held
    longer made its child after its call was reported failed and retryable, and the retry another."""
    stack, _, _ = core()
    ctx = parent_call(stack, "spawn")
    monkeypatch.setattr(subagents, "LOCK_WAIT", 0.3)
    with db(stack) as s:  # a step of the parent run holds it
        s.execute(text("select 1 from runs where id = :id for update"), {"id": ctx.run_id})
        result = asyncio.run(SpawnTool().run(SpawnArgs(task="t"), ctx))
    assert not result.ok and result.error == ErrorCode.FAILED and result.retryable
    assert "no subagent was started" in result.message and runs(stack, kind=RunKind.SUBAGENT) == []


def test_a_replayed_cron_add_finds_its_job(core: Core) -> None:
    stack, _, mirror = core()
    ctx = parent_call(stack, "cron")
    args = CronArgs(action="add", message="standup notes", cron_expr="0 9 * * 1-5", tz="Europe/Berlin")
    first, again = (asyncio.run(CronTool().run(args, ctx)) for _ in range(2))
    assert first.ok and again.ok and first.output["job_id"] == again.output["job_id"]
    with db(stack) as s:
        [job] = s.exec(select(CronJob)).all()
    assert (job.channel, job.chat_id, job.missed_policy) == ("api", ctx.chat_id, "skip")
    assert mirror.armed(job.id) is not None


def test_a_cron_add_replayed_after_its_job_fired_does_not_fire_it_again(core: Core) -> None:
    """The replay comes after the `at` passed: re-creating the job would move `at` to now (a new
    fire time, so a new receipt) and run it a second time."""
    stack, rt, mirror = core()
    ctx = parent_call(stack, "cron")
    at = utcnow() + timedelta(seconds=30)
    args = CronArgs(action="add", message=call("record", tag="once"), at=at)
    first = asyncio.run(CronTool().run(args, ctx))
    assert first.ok
    jid = first.output["job_id"]
    fire_until_idle(rt, mirror, jid)  # nothing due yet
    drain(rt, cron.fire(rt, mirror, jid, whole_second(at)))  # beat fires it; the job is removed
    assert jobs_row_or_none(stack, jid) is None
    again = asyncio.run(CronTool().run(args, ctx))  # the tool call's result was lost: it runs again
    with db(stack) as s:
        left = list(s.exec(select(CronJob)).all())
    for job in left:  # whatever the replay scheduled, beat fires it
        drain(rt, cron.fire(rt, mirror, job.id, job.at))
    assert [line.split()[-1] for line in stack.executions()] == ["once"]
    assert left == [] and len(receipts(stack, jid)) == 1
    assert again.ok and again.output.get("status") == "already ran"


def jobs_row_or_none(stack: Stack, jid: str) -> CronJob | None:
    with db(stack) as s:
        return s.get(CronJob, jid)


def test_a_spawn_after_stop_starts_nothing(core: Core) -> None:
    """The /stop came while the turn's spawn call was on its way: the call must not outlive it."""
    stack, rt, _ = core()
    ctx = parent_call(stack, "spawn")
    with db(stack) as s:
        drain(rt, cancel_conversation(rt, s, ctx.conversation_id, []))
    result = asyncio.run(SpawnTool().run(SpawnArgs(task="t"), ctx))
    assert (result.ok, result.error) == (False, ErrorCode.NOT_ALLOWED) and "the turn was stopped" in result.message
    assert ctx.followups == [] and runs(stack, kind=RunKind.SUBAGENT) == []


def test_a_stop_that_waited_for_a_spawn_stops_the_new_subagent_too(core: Core,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The /stop's statement waited for the parent run, which the spawn held; its snapshot predated
    the child, so the parent was cancelled and the child ran on and reported (helper's review)."""
    stack, rt, _ = core()
    ctx = parent_call(stack, "spawn")
    counted, holding = subagents.running, threading.Event()

    def running_while_stop_waits(s: Any, cid: str) -> int:  # the spawn holds the parent run's lock here
        holding.set()
        wait_until(lambda: waiting_on_a_lock(stack) == 1, timeout=30, message="the /stop to wait for the parent")
        return counted(s, cid)

    monkeypatch.setattr(subagents, "running", running_while_stop_waits)
    with ThreadPoolExecutor(1) as pool:
        spawning = pool.submit(subagents.spawn, stack.settings, parent_run_id=ctx.run_id, call_id=ctx.call_id,
                               task="a long job", label=None)
        assert holding.wait(30)
        cancelled: list[Any] = []
        with db(stack) as s:
            drain(rt, cancel_conversation(rt, s, ctx.conversation_id, cancelled))
        child = spawning.result(30).run_id
    assert {r.id for r in cancelled} == {ctx.run_id, child}
    assert {r.id: r.status for r in runs(stack)} == {ctx.run_id: RunStatus.CANCELLED, child: RunStatus.CANCELLED}


def waiting_on_a_lock(stack: Stack) -> int:
    with db(stack) as s:
        return int(s.exec(text("select count(*) from pg_stat_activity where wait_event_type = 'Lock' "
                               "and datname = current_database()")).one()[0])
