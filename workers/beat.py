"""The Celery app beat runs: `nanofleet beat` (`celery -A workers.beat:app beat`).

The workers' configuration without their task modules: beat sends tasks by name and never runs
one, so it does not import the agent runtime and litellm, and a beat that lost its lock (a Redis
restart) is back in about a second rather than several."""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.signals import beat_init
from redbeat.schedulers import RedBeatScheduler  # imported first: its beat lock handler runs before ours

from shared import db
from shared.constants import BEAT_ALIVE_FILE, T_CRON_RECONCILE
from shared.process_guard import guard_or_warn
from shared.queueing import make_celery
from shared.settings import get_settings
from workers import health, signals

log = logging.getLogger(__name__)
TOUCH_EVERY = 5.0  # seconds between touches of the liveness file
# As soon as celery has loaded this module (`nanofleet beat` exec'd it: the flag did not survive):
# a command exec runs as beat's user on this host must not read the secrets in beat's environment.
guard_or_warn("beat")
db.configure(get_settings().database, role="beat")
app = make_celery(get_settings(), name="nanofleet-beat")
signals.connect()


class Scheduler(RedBeatScheduler):  # type: ignore[misc]  # redbeat has no types
    """redbeat's scheduler, which touches beat's liveness file as it ticks (at most every TOUCH_EVERY
    seconds): compose's beat healthcheck reads its age. A beat stuck (on Redis, say) stops ticking."""

    _touched = 0.0

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if (now := time.monotonic()) - self._touched >= TOUCH_EVERY:
            self._touched = now
            health.touch(BEAT_ALIVE_FILE)
        interval: float = super().tick(*args, **kwargs)
        return interval


@beat_init.connect(weak=False)
def _reconcile_at_start(sender: Any = None, **_: Any) -> None:
    """Once this beat holds the lock (redbeat's handler ran first), write its static entries again
    (a standby beat may have synced them before a Redis flush) and have the cron jobs re-armed
    from Postgres."""
    if isinstance(sender.scheduler, RedBeatScheduler):
        sender.scheduler.setup_schedule()
    sender.app.send_task(T_CRON_RECONCILE)
    log.info("beat: static schedule written; cron reconciliation requested")
