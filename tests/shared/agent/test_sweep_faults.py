"""The sweeper on real Postgres, in-process: a run it cannot recover, or a part of the pass that
fails, is logged and left for later; every other run is still recovered in the same pass."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from shared.agent import conversations, recovery
from shared.agent.runtime import Next, Runtime
from shared.models import Run
from tests.support.stack import Stack


def _expired_turn(rt: Runtime, key: str) -> str:
    """A turn whose worker died in its first step: queued, its lease run out."""
    with rt.session() as s:
        cid = conversations.get_or_create(s, session_key=key).id
        run_id = conversations.post_message(s, cid, "hello", origin={},
                                            lease_seconds=rt.settings.runtime.lease_seconds).run_id
        assert run_id is not None
        s.execute(text("update runs set lease_until = now() - interval '1 second' where id = :id"), {"id": run_id})
    return run_id


def test_one_run_the_sweep_cannot_recover_does_not_hold_up_the_others(
        make_stack: Callable[..., Stack], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An error recovering one run (bad data, a bug) rolled the whole pass back, every second:
    no run anywhere was recovered again (helper's review)."""
    rt = Runtime.build(make_stack().settings)
    broken, fine = _expired_turn(rt, "t:broken"), _expired_turn(rt, "t:fine")
    recover = recovery._recover

    def failing_for_one(rt: Runtime, s: Any, run: Run, *args: Any) -> list[Next]:
        if run.id == broken:
            s.execute(text("update runs set label = 'half-done' where id = :id"), {"id": run.id})
            raise RuntimeError("a bug")
        return recover(rt, s, run, *args)

    def failing_extra(rt: Runtime) -> list[Next]:
        raise RuntimeError("an extra sweep's bug")

    monkeypatch.setattr(recovery, "_recover", failing_for_one)
    monkeypatch.setattr(recovery, "EXTRA_SWEEPS", [failing_extra])
    nexts = recovery.sweep(rt)
    assert [n.args for n in nexts] == [(fine, 0)]
    with rt.session() as s:
        left = s.get_one(Run, broken)
        assert left.label is None  # what the failed recovery wrote is undone...
        assert s.execute(text("select lease_until > now() from runs where id = :id"), {"id": broken}).scalar()
    assert recovery.sweep(rt) == []  # ...and the run is left alone for a grace, its error said once
    assert sum("could not recover" in r.message for r in caplog.records) == 1
    assert any("an extra sweep's bug" in (r.exc_text or str(r.exc_info)) for r in caplog.records)
