"""Runs: status and cancellation."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException

from gateway.deps import SessionDep, StateDep, require_key
from gateway.schemas import UNAUTHORIZED, Id
from shared.agent import views
from shared.agent.finish import cancel, publish_final
from shared.models import Run, RunKind
from shared.scheduling import subagents

router = APIRouter(prefix="/api/v1/runs", tags=["runs"], dependencies=[Depends(require_key)], responses=UNAUTHORIZED)


@router.get("/{run_id}", responses={404: {"description": "no such run"}})
def get_run(run_id: Id, s: SessionDep) -> dict[str, Any]:
    """A run's status, steps, usage, tool calls and result."""
    run = s.get(Run, run_id)
    if run is None:
        raise HTTPException(404, f"no run {run_id}")
    return views.run(s, run)


@router.post("/{run_id}/cancel", responses={404: {"description": "no such run"}})
def cancel_run(run_id: Id, s: SessionDep, state: StateDep) -> dict[str, Any]:
    """Cancel a run (and the subagents of its conversation); a finished run is left as it is. A
    subagent's run is cancelled as POST /api/v1/subagents/{id}/cancel does it: on its own, so the
    conversation that spawned it is told."""
    run = s.get(Run, run_id)
    if run is None:
        raise HTTPException(404, f"no run {run_id}")
    why = subagents.CANCELLED_ALONE if run.kind == RunKind.SUBAGENT else "cancelled through the API"
    cancelled: list[Run] = []
    nexts = cancel(state.runtime, s, run_id, why, cancelled)
    s.commit()
    for run in cancelled:
        publish_final(state.runtime, run)
    state.dispatch(nexts)
    return {"runId": run_id, "cancelled": [r.id for r in cancelled]}
