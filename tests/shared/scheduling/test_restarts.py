"""Crashes and restarts: a worker SIGKILLed mid-subagent, every process killed with Redis flushed
under a subagent and an `at` job, a standby beat taking over from one that died."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import redis

from shared.models import TERMINAL, RunKind, RunStatus, utcnow
from tests.fakes.llm import FakeLLM
from tests.support.processes import wait_until
from tests.support.scheduling import (
    FAST,
    assert_reported_once,
    call,
    child_of,
    client,
    job,
    new_conversation,
    receipts,
    reported,
    runs,
    scheduling_stack,
    spawn,
    subagents,
)
from tests.support.stack import Stack


def subagent_mid_step(stack: Stack, fake_llm: FakeLLM) -> bool:
    return fake_llm.in_flight > 0 and subagents(stack)[0].status == RunStatus.RUNNING


def test_worker_killed_during_a_subagent(make_stack: Callable[..., Stack], fake_llm: FakeLLM) -> None:
    stack = scheduling_stack(make_stack, beat=True)
    with client(stack) as api:
        cid = new_conversation(api)
        child_id = child_of(spawn(api, cid, "sleep:1.5\n" + call("record", tag="kill"))[0])
        wait_until(lambda: subagent_mid_step(stack, fake_llm), message="the subagent's LLM call")
        stack.procs[0].kill()  # SIGKILL, mid-step: the lease runs out and the sweeper re-enqueues the step
        stack.worker(concurrency=16)
        wait_until(lambda: reported(stack, cid, child_id), timeout=90, message="the subagent's report")
    assert_reported_once(stack, cid, child_id, "kill")


def test_everything_restarted_with_redis_flushed(make_stack: Callable[..., Stack], fake_llm: FakeLLM) -> None:
    stack = scheduling_stack(make_stack, beat=True)
    with client(stack) as api:
        cid = new_conversation(api)
        child_id = child_of(spawn(api, cid, "sleep:1.5\n" + call("record", tag="flush"))[0])
        at = (utcnow() + timedelta(seconds=3)).isoformat()
        jid = api.post("/api/v1/cron", json={"message": call("record", tag="at"), "at": at}).json()["id"]
        wait_until(lambda: subagent_mid_step(stack, fake_llm), message="the subagent's LLM call")
        for proc in stack.procs:
            proc.kill()
        redis.Redis.from_url(stack.settings.redis_url).flushdb()  # queues, beat schedule, lock: all gone
        stack.beat()
        stack.worker(concurrency=16)
        wait_until(lambda: reported(stack, cid, child_id), timeout=90, message="the subagent's report")
        wait_until(lambda: [r for r in runs(stack, kind=RunKind.CRON) if r.status in TERMINAL],
                   timeout=60, message="the at job's run")
    assert_reported_once(stack, cid, child_id, "flush")
    assert sorted(line.split()[-1] for line in stack.executions()) == ["at", "flush"]
    assert len(receipts(stack, jid)) == 1 and job(stack, jid) is None  # fired once, then removed


def test_a_standby_beat_takes_over_when_the_first_dies(make_stack: Callable[..., Stack]) -> None:
    stack = make_stack(**FAST)
    beats = [stack.beat(), stack.beat()]
    stack.worker(concurrency=16)
    first = wait_until(lambda: next((b for b in beats if "Acquired lock" in b.log()), None),
                       message="a beat to take the lock")
    second = next(b for b in beats if b is not first)
    with client(stack) as api:
        jid = api.post("/api/v1/cron", json={"message": call("record", tag="t"), "everySeconds": 1}).json()["id"]
    wait_until(lambda: len(receipts(stack, jid)) >= 2, message="firings under the first beat")
    assert "Starting" in second.log() and "Acquired lock" not in second.log()  # it waits while the first lives
    first.kill()  # type: ignore[attr-defined]
    seen = len(receipts(stack, jid))
    wait_until(lambda: "Acquired lock" in second.log(), timeout=60, message="the standby beat to take over")
    wait_until(lambda: len(receipts(stack, jid)) >= seen + 2, timeout=60, message="firings under the second beat")
    times = [r.scheduled_for for r in receipts(stack, jid)]
    assert times == sorted(set(times))  # every fire time at most once
