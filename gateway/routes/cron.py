"""Cron jobs: list, create, show, change, delete. Postgres holds them; the beat schedule follows."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Response
from pydantic import Field
from sqlmodel import col, select

from gateway.deps import SessionDep, StateDep, only_params, require_key
from gateway.schemas import BAD_BODY, UNAUTHORIZED, JobMessage, RequestBody
from gateway.state import AppState
from shared.contracts import NO_NUL
from shared.models import CronJob, CronReceipt
from shared.scheduling import jobs
from shared.scheduling.beat import BeatMirror
from shared.scheduling.schedules import MAX_EVERY

log = logging.getLogger(__name__)
router = APIRouter(prefix="/api/v1/cron", tags=["cron"], dependencies=[Depends(require_key)], responses=UNAUTHORIZED)
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no such job"}}
JobId = Annotated[str, Path(pattern=NO_NUL, max_length=64)]


class CronIn(RequestBody):
    """A new job: `message` and exactly one of everySeconds, cronExpr (with tz) or at."""

    message: JobMessage
    name: str = Field(default="", max_length=200, pattern=NO_NUL)
    every_seconds: int | None = Field(default=None, ge=1, le=MAX_EVERY)
    cron_expr: str | None = Field(default=None, max_length=200, pattern=NO_NUL)
    tz: str | None = Field(default=None, max_length=64, pattern=NO_NUL)
    at: datetime | None = None
    missed_policy: jobs.Policy | None = None
    channel: str = Field(default="api", max_length=32, pattern=NO_NUL,
                         description="where results go: api, or a configured platform (telegram, slack, ...)")
    chat_id: str = Field(default="", max_length=200, pattern=NO_NUL,
                         description="the platform's chat (required there); for api, a conversation id or empty")
    enabled: bool = True


class CronPatch(RequestBody):
    """Fields to change; a new schedule replaces the old one."""

    message: JobMessage | None = None
    name: str | None = Field(default=None, max_length=200, pattern=NO_NUL)
    every_seconds: int | None = Field(default=None, ge=1, le=MAX_EVERY)
    cron_expr: str | None = Field(default=None, max_length=200, pattern=NO_NUL)
    tz: str | None = Field(default=None, max_length=64, pattern=NO_NUL)
    at: datetime | None = None
    missed_policy: jobs.Policy | None = None
    channel: str | None = Field(default=None, max_length=32, pattern=NO_NUL)
    chat_id: str | None = Field(default=None, max_length=200, pattern=NO_NUL)
    enabled: bool | None = None


def follow_in_beat(state: AppState, job: CronJob | None, job_id: str) -> None:
    """Follow the change in the beat schedule; if Redis fails now, reconciliation catches up."""
    try:
        mirror = BeatMirror(state.producer.app)
        if job is None:
            mirror.disarm(job_id)
        else:
            jobs.sync(mirror, job)
    except Exception as err:
        log.warning("cron job %s: beat schedule not updated now (%s); reconciliation will", job_id, err)


@router.get("", dependencies=[Depends(only_params("channel", "chatId"))])
def list_jobs(
    s: SessionDep,
    channel: Annotated[str | None, Query(pattern=NO_NUL)] = None,
    chat_id: Annotated[str | None, Query(alias="chatId", pattern=NO_NUL)] = None,
) -> list[dict[str, Any]]:
    """Every job (system jobs included), oldest first; filter by target channel and chat."""
    return [jobs.view(j) for j in jobs.listing(s, channel=channel, chat_id=chat_id)]


@router.post("", status_code=201, responses={**BAD_BODY, 422: {"description": "invalid schedule"}})
def create_job(body: CronIn, s: SessionDep, state: StateDep) -> dict[str, Any]:
    """Schedule a job; its results go to `channel`/`chatId`: a configured platform's chat, or for `api`
    the API conversation `chatId` names (empty: they stay in the job's own session)."""
    job = jobs.create(s, state.settings, jobs.JobIn.model_validate(body.model_dump(by_alias=False)))
    s.commit()
    follow_in_beat(state, job, job.id)
    return jobs.view(job)


@router.get("/{job_id}", responses=NOT_FOUND)
def get_job(job_id: JobId, s: SessionDep) -> dict[str, Any]:
    """A job, with its latest firings (fire time and the run it started)."""
    job = jobs.get(s, job_id)
    receipts = s.exec(select(CronReceipt).where(CronReceipt.job_id == job_id)
                      .order_by(col(CronReceipt.scheduled_for).desc()).limit(20)).all()
    firings = [{"scheduledFor": r.scheduled_for.isoformat(), "runId": r.run_id} for r in receipts]
    return {**jobs.view(job), "firings": firings}


@router.patch("/{job_id}", responses={**BAD_BODY, **NOT_FOUND, 409: {"description": "a system job"}})
def update_job(job_id: JobId, body: CronPatch, s: SessionDep, state: StateDep) -> dict[str, Any]:
    """Change a job: enable or disable it, or give it a new message, schedule or target."""
    job = jobs.get(s, job_id, lock=True)
    patch = jobs.JobPatch.model_validate(body.model_dump(by_alias=False, exclude_unset=True))
    job = jobs.update(s, state.settings, job, patch)
    s.commit()
    follow_in_beat(state, job, job.id)
    return jobs.view(job)


@router.delete("/{job_id}", status_code=204, responses={**NOT_FOUND, 409: {"description": "a system job"}})
def delete_job(job_id: JobId, s: SessionDep, state: StateDep) -> Response:
    """Remove a job; a firing already under way finishes, no further one starts."""
    jobs.delete(s, jobs.get(s, job_id, lock=True))
    s.commit()
    follow_in_beat(state, None, job_id)
    return Response(status_code=204)
