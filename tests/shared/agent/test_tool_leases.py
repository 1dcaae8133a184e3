"""A tools phase's lease against the sweeper, on real Postgres, in-process: a call whose worker is
alive but late to renew (it took the call from a backlog as the lease ran out, or the database
paused) keeps its result; one whose worker stayed silent for one more lease is taken for dead; a
result the database could not take at once is written when it can."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import exc, text

from shared.agent import conversations, lease, recovery, steps
from shared.agent.runtime import Runtime
from shared.llm_types import LLMResponse, LLMToolCall
from shared.models import Phase, Run, ToolCall, ToolStatus
from tests.support.processes import wait_until
from tests.support.stack import Stack

LEASE = 30.0  # long: the keeper renews every 10 s, so only the test moves the lease


def _tools_phase(rt: Runtime, key: str, calls: int = 1) -> tuple[str, str]:
    """A turn whose first step asked for `calls` `record` calls: (run id, the first call's row id)."""
    with rt.session() as s:
        cid = conversations.get_or_create(s, session_key=key).id
        run_id = conversations.post_message(s, cid, "hi", origin={}, lease_seconds=LEASE).run_id
        assert run_id is not None
    with rt.session() as s:
        assert lease.acquire(s, run_id=run_id, seq=0, phase=Phase.LLM, owner="w", seconds=LEASE)
    asked = [LLMToolCall(id=f"c{i}", name="record", arguments='{"tag": "once", "seconds": 1.5}') for i in range(calls)]
    nxt, *_ = steps._record(rt, run_id, 0, LLMResponse(content="", tool_calls=asked), 1.0)
    return run_id, str(nxt.args[0])


def _expire(rt: Runtime, run_id: str) -> None:
    with rt.session() as s:
        s.execute(text("update runs set lease_until = now() - interval '1 second' where id = :id"), {"id": run_id})


def _state(rt: Runtime, run_id: str, call_id: str) -> tuple[Run, ToolCall]:
    with rt.session() as s:
        return s.get_one(Run, run_id), s.get_one(ToolCall, call_id)


def _executions(s: Stack) -> list[str]:
    log = s.workspace / "executions.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_call_running_when_its_lease_runs_out_keeps_its_result(make_stack: Callable[..., Stack]) -> None:
    """The sweeper took a running call for dead the moment the run's lease ran out: a live worker
    that had not renewed yet (it renews every third of the lease) lost its result, and a message
    the tool had sent was reported as "may or may not have taken effect" (helper's review)."""
    st = make_stack(RUNTIME__LEASE_SECONDS=str(LEASE))
    rt = Runtime.build(st.settings)
    run_id, call_id = _tools_phase(rt, "t:late")
    done: list[Any] = []
    worker = threading.Thread(target=lambda: done.append(steps.tool_step(rt, call_id)))
    worker.start()
    wait_until(lambda: _state(rt, run_id, call_id)[1].status == ToolStatus.RUNNING, timeout=10,
               message="the call to be claimed")
    _expire(rt, run_id)  # the lease runs out before the worker's keeper renews it
    assert recovery.sweep(rt) == []
    run, call = _state(rt, run_id, call_id)
    assert call.status == ToolStatus.RUNNING, call.result
    assert run.lease_owner == lease.STALLED
    worker.join(30)
    run, call = _state(rt, run_id, call_id)
    assert call.status == ToolStatus.SUCCESS and call.result["output"] == "recorded once", call.result
    assert (run.phase, run.step_seq, run.lease_owner) == (Phase.LLM, 2, None)
    assert len(_executions(st)) == 1


def test_a_call_whose_worker_stays_silent_is_taken_for_dead(make_stack: Callable[..., Stack]) -> None:
    st = make_stack(RUNTIME__LEASE_SECONDS=str(LEASE))
    rt = Runtime.build(st.settings)
    run_id, call_id = _tools_phase(rt, "t:dead")
    with rt.session() as s:  # claimed by a worker that died at once
        s.execute(text("update tool_calls set status = 'RUNNING', attempts = 1 where id = :id"), {"id": call_id})
    _expire(rt, run_id)
    recovery.sweep(rt)
    assert _state(rt, run_id, call_id)[1].status == ToolStatus.RUNNING
    _expire(rt, run_id)  # a whole lease more, and no renewal
    recovery.sweep(rt)
    run, call = _state(rt, run_id, call_id)
    assert call.status == ToolStatus.FAILED and "may or may not" in call.result["message"], call.result
    assert run.lease_owner is None
    assert _executions(st) == []


def test_a_result_the_database_cannot_take_at_once_is_written_later(
        make_stack: Callable[..., Stack], monkeypatch: pytest.MonkeyPatch) -> None:
    """The result's write failed on a database error: the task's retry found the call running and
    did nothing, and the sweeper could only report it as maybe done (helper's review)."""
    st = make_stack(RUNTIME__LEASE_SECONDS=str(LEASE))
    rt = Runtime.build(st.settings)
    run_id, call_id = _tools_phase(rt, "t:blip")
    write, failures = steps._write_result, [2]

    def flaky(*args: Any) -> Any:
        if failures[0]:
            failures[0] -= 1
            raise exc.OperationalError("update tool_calls", {}, Exception("server closed the connection"))
        return write(*args)

    monkeypatch.setattr(steps, "_write_result", flaky)
    steps.tool_step(rt, call_id)
    run, call = _state(rt, run_id, call_id)
    assert call.status == ToolStatus.SUCCESS and run.phase == Phase.LLM
    assert failures == [0] and len(_executions(st)) == 1


def test_a_step_that_took_long_to_start_renews_its_lease_at_once(make_stack: Callable[..., Stack]) -> None:
    """A step's prompt took most of the lease to build: the keeper's next round came too late."""
    st = make_stack(RUNTIME__LEASE_SECONDS=str(LEASE))
    rt = Runtime.build(st.settings)
    run_id, _ = _tools_phase(rt, "t:slow-prompt")
    with rt.session() as s:
        s.execute(text("update runs set lease_owner = 'w', lease_until = now() + interval '1 second' "
                       "where id = :id"), {"id": run_id})
    keeper = lease.keeper(st.settings.database_url, LEASE)
    with keeper.hold(run_id, owner="w", taken=time.monotonic() - LEASE / 2), rt.session() as s:
        left = s.execute(text("select extract(epoch from lease_until - now()) from runs where id = :id"),
                         {"id": run_id}).scalar_one()
    assert left > LEASE - 5


def _claimed_and_swept(rt: Runtime, run_id: str, position: int, seconds_ago: int) -> list[str]:
    """Mark the call at `position` claimed `seconds_ago`, let the lease run out, sweep; the calls' statuses."""
    with rt.session() as s:
        s.execute(text("update tool_calls set status = 'RUNNING', attempts = 1, "
                       "started_at = now() - make_interval(secs => :ago) where run_id = :r and position = :p"),
                  {"r": run_id, "p": position, "ago": seconds_ago})
    _expire(rt, run_id)
    recovery.sweep(rt)
    with rt.session() as s:
        return list(s.execute(text("select status from tool_calls where run_id = :r order by position"),
                              {"r": run_id}).scalars())


def test_a_call_claimed_after_the_run_was_marked_stalled_gets_its_own_lease(make_stack: Callable[..., Stack]) -> None:
    """One call's worker died, so the run was marked STALLED; another call, taken from the backlog
    just before the second look, was taken for dead with it, its result lost (helper's review)."""
    st = make_stack(RUNTIME__LEASE_SECONDS=str(LEASE))
    rt = Runtime.build(st.settings)
    run_id, _ = _tools_phase(rt, "t:two", calls=2)
    assert _claimed_and_swept(rt, run_id, 0, seconds_ago=600) == ["RUNNING", "PENDING"]  # its worker died long ago
    keeper = lease.keeper(st.settings.database_url, LEASE)
    keeper.renew([lease.Held(run_id, None, 99)])  # a late worker of another step does not vouch for this one
    assert _claimed_and_swept(rt, run_id, 1, seconds_ago=0) == ["RUNNING", "RUNNING"]  # just taken from the backlog
    with rt.session() as s:
        assert s.get_one(Run, run_id).lease_owner == lease.STALLED
    # a lease on, neither worker renewed
    assert _claimed_and_swept(rt, run_id, 1, seconds_ago=600) == ["FAILED", "FAILED"]
