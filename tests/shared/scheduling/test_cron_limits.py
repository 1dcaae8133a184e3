"""What the model may schedule with the `cron` tool: each firing is a paid LLM run, and a prompt injection
in a fetched page could ask for many jobs or a fast one. Jobs the operator adds (REST API, CLI) are not bound."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlmodel import select

from shared.agent.runtime import Runtime
from shared.models import CronJob, utcnow
from shared.scheduling import jobs
from shared.scheduling.beat import BeatMirror
from shared.tools.base import ErrorCode, ToolContext, ToolResult
from shared.tools.cron import CronArgs, CronTool
from tests.support.scheduling import db, parent_call
from tests.support.stack import Stack

Core = Callable[..., tuple[Stack, Runtime, BeatMirror]]


def cron(ctx: ToolContext, call_id: str = "call_1", **args: Any) -> ToolResult:
    return asyncio.run(CronTool().run(CronArgs(**args), dataclasses.replace(ctx, call_id=call_id)))


def chat_jobs(stack: Stack, ctx: ToolContext) -> list[CronJob]:
    with db(stack) as s:
        return list(s.exec(select(CronJob).where(CronJob.channel == ctx.channel, CronJob.chat_id == ctx.chat_id)))


def test_the_model_cannot_add_a_job_that_fires_more_often_than_the_minimum(core: Core) -> None:
    stack, _, _ = core()
    ctx = parent_call(stack, "cron")
    fast = cron(ctx, action="add", message="check the page", every_seconds=1)
    assert (fast.ok, fast.error) == (False, ErrorCode.INVALID_ARGS)
    assert "at least 60 seconds" in fast.message and "NANOFLEET_SCHEDULER__TOOL_MIN_INTERVAL" in fast.message
    assert cron(ctx, "call_2", action="add", message="check the page", every_seconds=60).ok
    assert cron(ctx, "call_3", action="add", message="each minute", cron_expr="* * * * *").ok  # 60 s apart
    with db(stack) as s:  # the operator (REST API, CLI) keeps every_seconds >= 1
        jobs.create(s, stack.settings, jobs.JobIn(message="poll", every_seconds=1))
    assert sorted(j.every_seconds or 0 for j in chat_jobs(stack, ctx)) == [0, 60]


def test_a_cron_expression_firing_more_often_than_the_minimum_is_refused(core: Core) -> None:
    stack, _, _ = core(SCHEDULER__TOOL_MIN_INTERVAL="3600")
    ctx = parent_call(stack, "cron")
    for n, expr in enumerate(["*/30 * * * *", "0,30 9 * * *", "15,45 */4 * * *", "0,59 0,23 * * *"]):
        refused = cron(ctx, f"call_{n}", action="add", message="m", cron_expr=expr)
        assert (refused.ok, refused.error) == (False, ErrorCode.INVALID_ARGS), expr
        assert "at least 3600 seconds" in refused.message, refused.message
    for n, expr in enumerate(["0 9,10 * * *", "59 23 * * *", "0 */2 * * *"]):
        assert cron(ctx, f"call_ok{n}", action="add", message="m", cron_expr=expr).ok, expr
    every = cron(ctx, "call_10", action="add", message="m", every_seconds=1800)
    assert every.error == ErrorCode.INVALID_ARGS and "every_seconds=1800" in every.message


def test_the_model_adds_at_most_the_maximum_of_jobs_to_a_chat(core: Core) -> None:
    stack, _, _ = core(SCHEDULER__TOOL_MAX_JOBS="3")
    ctx = parent_call(stack, "cron")
    added = [cron(ctx, f"call_{n}", action="add", message=f"job {n}", every_seconds=3600) for n in range(3)]
    assert all(r.ok for r in added), added
    over = cron(ctx, "call_3", action="add", message="one more", every_seconds=3600)
    assert (over.ok, over.error) == (False, ErrorCode.NOT_ALLOWED)
    assert "3 cron jobs" in over.message and "action=remove" in over.message, over.message
    assert cron(ctx, "call_0", action="add", message="job 0", every_seconds=3600).output == added[0].output  # replay
    elsewhere = dataclasses.replace(ctx, chat_id="")  # another chat has its own count
    assert cron(elsewhere, "call_4", action="add", message="other chat", every_seconds=3600).ok
    assert cron(ctx, "call_5", action="remove", job_id=added[0].output["job_id"]).ok
    assert cron(ctx, "call_6", action="add", message="in its place", every_seconds=3600).ok
    assert len(chat_jobs(stack, ctx)) == 3
    with db(stack) as s:  # the operator is not bound
        jobs.create(s, stack.settings, jobs.JobIn(message="ops", every_seconds=3600, chat_id=ctx.chat_id))
    assert len(chat_jobs(stack, ctx)) == 4


def test_another_chats_job_is_refused_as_one_that_does_not_exist(core: Core) -> None:
    """The refusals differed ("... in this chat" against "no cron job X"), telling a chat which ids
    exist in others."""
    stack, _, _ = core()
    ctx = parent_call(stack, "cron")
    theirs = cron(ctx, "call_1", action="add", message="theirs", every_seconds=3600).output["job_id"]
    elsewhere = dataclasses.replace(ctx, chat_id="another")
    for action in ("remove", "disable", "enable"):
        refusals = {cron(elsewhere, f"call_{action}_{job}", action=action, job_id=job).message.replace(job, "ID")
                    for job in (theirs, "nosuchjob123")}
        assert len(refusals) == 1 and refusals.pop() == "no cron job ID in this chat (see action=list)", action
    assert len(chat_jobs(stack, ctx)) == 1


def test_a_maximum_of_zero_turns_adding_off(core: Core) -> None:
    stack, _, _ = core(SCHEDULER__TOOL_MAX_JOBS="0")
    ctx = parent_call(stack, "cron")
    off = cron(ctx, action="add", message="m", every_seconds=3600)
    assert (off.ok, off.error) == (False, ErrorCode.NOT_ALLOWED) and "turned off" in off.message
    fast = cron(ctx, "call_2", action="add", message="m", every_seconds=1)  # not "too often": nothing would let it in
    assert (fast.ok, fast.error) == (False, ErrorCode.NOT_ALLOWED) and "turned off" in fast.message


def test_calls_at_once_do_not_pass_the_maximum_together(core: Core) -> None:
    """One LLM response may hold many cron calls, run in parallel on the tools queue."""
    stack, _, _ = core(SCHEDULER__TOOL_MAX_JOBS="3")
    ctx = parent_call(stack, "cron")
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda n: cron(ctx, f"call_{n}", action="add", message="m", every_seconds=600),
                                range(12)))
    assert sum(r.ok for r in results) == 3 and len(chat_jobs(stack, ctx)) == 3
    assert {r.error for r in results if not r.ok} == {ErrorCode.NOT_ALLOWED}


def test_a_cron_run_cannot_add_jobs(core: Core) -> None:
    """A job that adds jobs multiplies itself at every firing."""
    stack, _, _ = core()
    ctx = dataclasses.replace(parent_call(stack, "cron"), run_kind="cron")
    refused = cron(ctx, action="add", message="and again tomorrow", every_seconds=86_400)
    assert (refused.ok, refused.error) == (False, ErrorCode.NOT_ALLOWED) and "scheduled job" in refused.message
    assert chat_jobs(stack, ctx) == []
    assert cron(ctx, "call_2", action="list").ok
    # nor a later turn of the job's session: the report of a subagent the job spawned starts one
    report = dataclasses.replace(ctx, run_kind="turn", extra={**ctx.extra, "origin": {
        **(ctx.extra.get("origin") or {}), "cron_job_id": "job-1"}})
    refused = cron(report, "call_3", action="add", message="and again tomorrow", every_seconds=86_400)
    assert (refused.ok, refused.error) == (False, ErrorCode.NOT_ALLOWED)
    assert chat_jobs(stack, ctx) == []


MINUTES = ["*", "*/5", "*/15", "*/20", "0", "30", "5,35", "0-10", "59", "*/7", "0,59", "1,58"]
HOURS = ["*", "*/6", "2", "1-3", "9", "0,12", "0,23", "23", "*/2"]


def gaps_in_a_day(expr: str) -> list[int]:
    """The oracle for an expression firing every day: its gaps in seconds, midnight included."""
    minutes, hours = croniter.expand(expr)[0][:2]
    hours = list(range(24)) if hours == ["*"] else hours
    minutes = list(range(60)) if minutes == ["*"] else minutes
    times = sorted(60 * (60 * int(h) + int(m)) for h in hours for m in minutes)
    return [b - a for a, b in pairwise(times)] + [times[0] + 86_400 - times[-1]]


@settings(max_examples=150, deadline=None)
@given(minute=st.sampled_from(MINUTES), hour=st.sampled_from(HOURS),
       minimum=st.sampled_from([60, 61, 300, 600, 1800, 3600, 7200, 43_200, 86_400]),
       start=st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2030, 1, 1)))
def test_the_spacing_guard_finds_every_gap_under_the_minimum(minute: str, hour: str, minimum: int,
                                                             start: datetime) -> None:
    expr = f"{minute} {hour} * * *"
    short = jobs.shorter_gap(expr, "UTC", start.replace(tzinfo=UTC), timedelta(seconds=minimum))
    expected = min(gaps_in_a_day(expr)) < minimum
    assert (short is not None) == expected, (expr, minimum, short)
    if short is not None:
        assert short < timedelta(seconds=minimum)


def test_the_spacing_guard_sees_a_weekly_pattern() -> None:
    now = utcnow()
    assert jobs.shorter_gap("0,59 0,23 * * 1", "Europe/Paris", now, timedelta(hours=1)) is not None
    assert jobs.shorter_gap("0 9 * * 1,2", "Europe/Paris", now, timedelta(hours=24)) is None
    assert jobs.shorter_gap("0 0 31 2 *", "UTC", now, timedelta(days=1)) is None  # never fires: not too often
    fifth = datetime(2026, 1, 5, tzinfo=UTC)  # firing every minute, but only on days more than a week away
    assert jobs.shorter_gap("* * 1 * *", "UTC", fifth, timedelta(minutes=10)) == timedelta(minutes=1)
    assert jobs.shorter_gap("* * * 12 *", "UTC", fifth, timedelta(minutes=10)) == timedelta(minutes=1)
