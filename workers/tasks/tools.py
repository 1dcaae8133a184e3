"""Tools-queue tasks: one task per tool call."""

from __future__ import annotations

from celery import shared_task

from shared.agent import steps
from shared.constants import T_TOOL_EXECUTE
from workers.base import NanofleetTask
from workers.runtime import dispatch, runtime


@shared_task(name=T_TOOL_EXECUTE, base=NanofleetTask)
def execute(tool_call_id: str) -> None:
    dispatch(steps.tool_step(runtime(), tool_call_id))
