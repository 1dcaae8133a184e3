"""Leases are written and read on Postgres's clock, the one the sweeper compares them with, in-process
on real Postgres with the worker's clock an hour behind: a run handed on from a step, a new turn and
a new subagent get a lease from now, not one that ran out an hour ago (the sweeper would re-enqueue
them at once, beside the step already sent)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from shared import models
from shared.agent import conversations, finish, recovery, steps
from shared.agent.runtime import Runtime
from shared.models import Run, RunKind
from shared.scheduling import subagents
from tests.support.locks import tools_phase
from tests.support.stack import Stack

LEASE = 30.0
BEHIND = timedelta(hours=1)


@pytest.fixture
def rt(make_stack: Callable[..., Stack], monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    """A runtime whose worker's clock is an hour behind Postgres's."""
    runtime = Runtime.build(make_stack(RUNTIME__LEASE_SECONDS=str(LEASE)).settings)
    for module in (models, steps, conversations, subagents, finish, recovery):
        monkeypatch.setattr(module, "utcnow", lambda: datetime.now(UTC) - BEHIND, raising=False)
    yield runtime


def _left(rt: Runtime, run_id: str) -> float:
    """Seconds the run's lease has left, on Postgres's clock."""
    with rt.session() as s:
        return float(s.execute(text("select extract(epoch from lease_until - now()) from runs where id = :id"),
                               {"id": run_id}).scalar_one())


def _a_lease_from_now(left: float) -> bool:
    return LEASE - 10 < left <= LEASE


def test_a_new_turn_and_a_run_handed_on_between_steps_lease_from_postgres_now(rt: Runtime) -> None:
    _, run_id, call_id = tools_phase(rt, session_key="t:clock")  # a turn started, its step handed on to its tools
    assert _a_lease_from_now(_left(rt, run_id))
    with rt.session() as s:
        s.execute(text("update runs set lease_until = now() - interval '1 hour' where id = :id"), {"id": run_id})
    assert _a_lease_from_now(_left(rt, run_id)) is False
    steps.tool_step(rt, call_id)  # its tools handed on to the next LLM step
    assert _a_lease_from_now(_left(rt, run_id))
    with rt.session() as s:
        cid = conversations.get_or_create(s, session_key="t:clock-new").id
        posted = conversations.post_message(s, cid, "hi", origin={}, lease_seconds=LEASE)
    assert posted.run_id is not None and _a_lease_from_now(_left(rt, posted.run_id))


def test_a_step_that_failed_hands_its_run_on_with_a_lease_from_postgres_now(rt: Runtime) -> None:
    """And another worker's lease is taken for run out on Postgres's clock: a step that failed
    after it (the other worker died) counts the failure."""
    _, run_id, _ = tools_phase(rt, session_key="t:clock-failed")
    with rt.session() as s:
        s.execute(text("update runs set phase = 'llm', lease_owner = 'dead', lease_until = now() - interval '1 second' "
                       "where id = :id"), {"id": run_id})
        seq = s.get_one(Run, run_id).step_seq
    assert steps._failed(rt, run_id, seq, "me", RuntimeError("boom")) is None
    with rt.session() as s:
        run = s.get_one(Run, run_id)
        assert (run.recoveries, run.lease_owner) == (1, None)
    assert _a_lease_from_now(_left(rt, run_id))


def test_a_new_subagent_leases_from_postgres_now(rt: Runtime) -> None:
    _, run_id, _ = tools_phase(rt, session_key="t:clock-parent", tool="spawn", arguments='{"task": "look"}')
    spawned = subagents.spawn(rt.settings, parent_run_id=run_id, call_id="c0", task="look", label=None)
    assert _a_lease_from_now(_left(rt, spawned.run_id))


def test_a_new_run_has_every_default_of_the_model(rt: Runtime) -> None:
    """A turn is started with a Core INSERT that spells out the model's defaults: a column added to
    Run with a default of its own must be added there too, or new runs would lack it."""
    with rt.session() as s:
        cid = conversations.get_or_create(s, session_key="t:defaults").id
        run_id = conversations.try_start_turn(s, cid, origin={"channel": "api"}, lease_seconds=LEASE,
                                              kind=RunKind.CRON, model="m", max_iterations=7, task="do")
    assert run_id is not None
    with rt.session() as s:
        stored = s.get_one(Run, run_id).model_dump()
    expected = Run(id=run_id, conversation_id=cid, origin={"channel": "api"}, kind=RunKind.CRON, model="m",
                   max_iterations=7, task="do").model_dump()
    assert set(stored) == set(expected)
    differ = {k for k in stored if stored[k] != expected[k]}
    assert differ == {"created_at", "lease_until"}  # now, on each clock
