"""Subagents: list them, show one (status, steps, usage, result), cancel one."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query

from gateway.deps import SessionDep, StateDep, only_params, require_key
from gateway.schemas import BIGINT_MAX, UNAUTHORIZED
from shared.agent.finish import cancel, publish_final
from shared.contracts import NO_NUL
from shared.models import Run, RunKind, RunStatus
from shared.scheduling import subagents

SubagentId = Annotated[str, Path(pattern=NO_NUL, max_length=64)]
router = APIRouter(prefix="/api/v1/subagents", tags=["subagents"], dependencies=[Depends(require_key)],
                   responses=UNAUTHORIZED)


def _subagent(s: SessionDep, subagent_id: str) -> Run:
    run = s.get(Run, subagent_id)
    if run is None or run.kind != RunKind.SUBAGENT:
        raise HTTPException(404, f"no subagent {subagent_id}")
    return run


@router.get("", dependencies=[Depends(only_params("conversationId", "status", "limit", "offset"))])
def list_subagents(
    s: SessionDep,
    conversation_id: Annotated[str | None, Query(alias="conversationId", pattern=NO_NUL,
                                                 description="the parent conversation")] = None,
    status: Annotated[RunStatus | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=BIGINT_MAX)] = 0,
) -> list[dict[str, Any]]:
    """Subagents, newest first; filter by the conversation that spawned them and by status."""
    rows = subagents.listing(s, conversation_id=conversation_id, status=status, limit=limit, offset=offset)
    return [subagents.summary(r) for r in rows]


@router.get("/{subagent_id}", responses={404: {"description": "no such subagent"}})
def get_subagent(subagent_id: SubagentId, s: SessionDep) -> dict[str, Any]:
    """A subagent's status, steps, usage, tool calls and result."""
    return subagents.detail(s, _subagent(s, subagent_id))


@router.post("/{subagent_id}/cancel", responses={404: {"description": "no such subagent"}})
def cancel_subagent(subagent_id: SubagentId, s: SessionDep, state: StateDep) -> dict[str, Any]:
    """Stop a subagent; one that already ended is left as it is. Its conversation is told it was
    cancelled (a report and a turn, as when it ends)."""
    _subagent(s, subagent_id)
    cancelled: list[Run] = []
    nexts = cancel(state.runtime, s, subagent_id, subagents.CANCELLED_ALONE, cancelled)
    s.commit()
    for run in cancelled:
        publish_final(state.runtime, run)
    state.dispatch(nexts)
    run = _subagent(s, subagent_id)
    return {"subagentId": subagent_id, "status": run.status.value, "cancelled": bool(cancelled)}
