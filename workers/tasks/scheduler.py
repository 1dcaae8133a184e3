"""Scheduler-queue tasks: the recovery sweeper, a ping for health checks, scheduled jobs."""

from __future__ import annotations

import logging

from celery import shared_task

from shared.agent import recovery
from shared.constants import T_PING, T_SWEEP
from workers.base import NanofleetTask
from workers.runtime import dispatch, runtime

log = logging.getLogger(__name__)


@shared_task(name=T_PING, base=NanofleetTask, ignore_result=False)
def ping(payload: str = "") -> str:
    log.info("ping %s", payload)
    return f"pong {payload}".strip()


@shared_task(name=T_SWEEP, base=NanofleetTask)
def sweep() -> None:
    dispatch(recovery.sweep(runtime()))
