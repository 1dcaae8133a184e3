"""Agent-queue tasks: the submission of messages webhooks recorded, LLM steps of turns, cron and
heartbeat runs; compaction."""

from __future__ import annotations

from celery import shared_task

from shared.agent import memory, steps
from shared.channels import inbound
from shared.constants import T_AGENT_STEP, T_COMPACT, T_INGEST
from workers.base import NanofleetTask
from workers.runtime import dispatch, runtime


@shared_task(name=T_INGEST, base=NanofleetTask)
def ingest(event_ids: list[int]) -> None:
    dispatch(inbound.submit_recorded(runtime(), event_ids))


@shared_task(name=T_AGENT_STEP, base=NanofleetTask)
def step(run_id: str, seq: int) -> None:
    dispatch(steps.llm_step(runtime(), run_id, seq))


@shared_task(name=T_COMPACT, base=NanofleetTask)
def compact(conversation_id: str, everything: bool = False, keep: int | None = None) -> None:
    memory.compact(runtime(), conversation_id, everything=everything, keep=keep)
