"""Subagents-queue tasks: LLM steps of subagent runs."""

from __future__ import annotations

from celery import shared_task

from shared.agent import steps
from shared.constants import T_SUBAGENT_STEP
from workers.base import NanofleetTask
from workers.runtime import dispatch, runtime


@shared_task(name=T_SUBAGENT_STEP, base=NanofleetTask)
def step(run_id: str, seq: int) -> None:
    dispatch(steps.llm_step(runtime(), run_id, seq))
