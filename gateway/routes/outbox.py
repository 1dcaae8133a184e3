"""The outbox: replies waiting, delivered or dead-lettered; a dead letter can be sent again."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import ConfigDict
from sqlmodel import col, select

from gateway.deps import SessionDep, StateDep, only_params, require_key
from gateway.schemas import UNAUTHORIZED, CamelModel, Id
from shared.channels import delivery
from shared.models import Outbox, OutboxStatus

router = APIRouter(prefix="/api/v1/outbox", tags=["outbox"], dependencies=[Depends(require_key)],
                   responses=UNAUTHORIZED)


class OutboxOut(CamelModel):
    """One outbound chunk."""

    model_config = ConfigDict(from_attributes=True)
    id: str
    key: str
    channel: str
    chat_id: str
    content: str
    status: str
    attempts: int
    last_error: str | None = None
    platform_message_id: str | None = None
    run_id: str | None = None
    meta: dict[str, Any]
    created_at: datetime
    next_attempt_at: datetime | None = None
    delivered_at: datetime | None = None


@router.get("", response_model=list[OutboxOut], dependencies=[Depends(only_params("status", "limit"))])
def list_outbox(
    s: SessionDep,
    status: Literal["pending", "delivered", "failed"] | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[OutboxOut]:
    """Outbox rows, newest first; `?status=failed` lists the dead letters."""
    query = select(Outbox).order_by(col(Outbox.created_at).desc()).limit(limit)
    if status is not None:
        query = query.where(Outbox.status == OutboxStatus(status))
    return [OutboxOut.model_validate(row) for row in s.exec(query)]


@router.post("/{outbox_id}/retry", status_code=202, response_model=OutboxOut,
             responses={404: {"description": "no such row"},
                        409: {"description": "not a dead letter: delivered, or pending (maybe being sent)"}})
def retry(outbox_id: Id, s: SessionDep, state: StateDep) -> OutboxOut:
    """Send a dead-lettered reply again from its first failed chunk: attempts start from zero."""
    row = s.get(Outbox, outbox_id, with_for_update=True)
    if row is None:
        raise HTTPException(404, f"no outbox row {outbox_id}")
    if row.status != OutboxStatus.FAILED:  # resending a pending row could send it twice
        raise HTTPException(409, f"outbox row {outbox_id} is {row.status.value}: only a failed row can be retried")
    nexts = delivery.retry(s, row)
    s.commit()
    state.dispatch(nexts)
    s.refresh(row)
    return OutboxOut.model_validate(row)
