"""Agent-queue tasks: LLM steps of turns, cron and heartbeat runs; compaction."""

from __future__ import annotations

from celery import shared_task

from shared.agent import memory, steps
from shared.constants import T_AGENT_STEP, T_COMPACT
from workers.base import NanofleetTask
from workers.runtime import dispatch, runtime


@shared_task(name=T_AGENT_STEP, base=NanofleetTask)
def step(run_id: str, seq: int) -> None:
    dispatch(steps.llm_step(runtime(), run_id, seq))


@shared_task(name=T_COMPACT, base=NanofleetTask)
def compact(conversation_id: str, everything: bool = False, keep: int | None = None) -> None:
    memory.compact(runtime(), conversation_id, everything=everything, keep=keep)
