"""Tasks beat starts: the recovery sweeper, a ping for health checks, scheduled jobs (on the
scheduler queue, but for the heartbeat and the daily summary: see shared.constants.TASK_ROUTES)."""

from __future__ import annotations

import logging
import time
from datetime import datetime

from celery import current_app, shared_task

from shared import housekeeping
from shared.agent import recovery
from shared.constants import (
    T_CRON_FIRE,
    T_CRON_RECONCILE,
    T_DAILY_SUMMARY,
    T_HEARTBEAT,
    T_PING,
    T_RETENTION,
    T_SWEEP,
)
from shared.db import unavailable
from shared.scheduling import cron, summary
from shared.scheduling import heartbeat as heartbeat_core
from shared.scheduling.beat import BeatMirror
from workers.base import NanofleetTask
from workers.runtime import dispatch, runtime

log = logging.getLogger(__name__)
OUTAGE_REPEAT = 60.0  # seconds between the sweeper's lines while the database stays down
_outage: dict[str, float] = {}  # "since" and "said": when this process's sweeps found it down, and last said so


@shared_task(name=T_PING, base=NanofleetTask, ignore_result=False)
def ping(payload: str = "") -> str:
    log.info("ping %s", payload)
    return f"pong {payload}".strip()


@shared_task(name=T_SWEEP, base=NanofleetTask)
def sweep() -> None:
    """Beat sends one a second: while the database is down each would log a traceback (18 KB a line,
    a gigabyte and more a day); a line a minute says so instead, and one when it answers again."""
    try:
        dispatch(recovery.sweep(runtime()))
    except Exception as err:
        if not unavailable(err):
            raise
        now = time.monotonic()
        if now - _outage.get("said", -OUTAGE_REPEAT) >= OUTAGE_REPEAT:
            log.warning("sweeper: the database does not answer (%s); it tries again every second",
                        (str(getattr(err, "orig", err)).splitlines() or [type(err).__name__])[0])
            _outage["said"] = now
        _outage.setdefault("since", now)
        return
    if "since" in _outage:
        log.info("sweeper: the database answers again (down %.0f s)", time.monotonic() - _outage["since"])
        _outage.clear()


@shared_task(name=T_RETENTION, base=NanofleetTask)
def retention() -> None:
    housekeeping.prune(runtime())


def _when(iso: str) -> datetime | None:
    return datetime.fromisoformat(iso) if iso else None


@shared_task(name=T_CRON_FIRE, base=NanofleetTask)
def cron_fire(job_id: str, scheduled_for: str = "") -> None:
    dispatch(cron.fire(runtime(), BeatMirror(current_app), job_id, _when(scheduled_for)))


@shared_task(name=T_CRON_RECONCILE, base=NanofleetTask)
def cron_reconcile() -> None:
    dispatch(cron.reconcile(runtime(), BeatMirror(current_app)))


@shared_task(name=T_HEARTBEAT, base=NanofleetTask, bind=True)
def heartbeat(self: NanofleetTask) -> None:
    dispatch(heartbeat_core.beat(runtime(), delivery=self.request.id))  # a redelivery keeps the id


@shared_task(name=T_DAILY_SUMMARY, base=NanofleetTask)
def daily_summary(until: str, conversation_id: str = "") -> None:
    when = datetime.fromisoformat(until)
    if conversation_id:
        summary.summarise(runtime(), conversation_id, when)
    else:
        dispatch(summary.plan(runtime(), when))
