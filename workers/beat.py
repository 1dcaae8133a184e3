"""The Celery app beat runs: `nanofleet beat` (`celery -A workers.beat:app beat`).

The workers' configuration without their task modules: beat sends tasks by name and never runs
one, so it does not import the agent runtime and litellm, and a beat that lost its lock (a Redis
restart) is back in about a second rather than several."""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from celery.signals import beat_init
from redbeat.schedulers import RedBeatScheduler  # imported first: its beat lock handler runs before ours
from redis.exceptions import LockNotOwnedError

from shared import db
from shared.constants import BEAT_ALIVE_FILE, T_CRON_RECONCILE
from shared.process_guard import guard_or_warn
from shared.queueing import make_celery
from shared.settings import get_settings
from workers import health, signals

log = logging.getLogger(__name__)
TOUCH_EVERY = 5.0  # seconds between touches of the liveness file
REDIS_RETRY = 1.0  # seconds between ticks while Redis does not answer
# As soon as celery has loaded this module (`nanofleet beat` exec'd it: the flag did not survive):
# a command exec runs as beat's user on this host must not read the secrets in beat's environment.
guard_or_warn("beat")
db.configure(get_settings().database, role="beat")
app = make_celery(get_settings(), name="nanofleet-beat")
signals.connect()


class Scheduler(RedBeatScheduler):  # type: ignore[misc]  # redbeat has no types
    """redbeat's scheduler, which touches beat's liveness file as it ticks (at most every TOUCH_EVERY
    seconds): compose's beat healthcheck reads its age. A beat stuck (on Redis, say) stops ticking.

    Redis not answering for a while (a restart, a stall) is waited out: celery beat exits on any
    error in a tick, and until something restarted it, runs stuck by a dead worker stayed stuck and
    cron did not fire. A restart that emptied Redis took the lock with it: this beat takes it again
    if nobody else did (and writes its schedule again, as at start), or exits for the beat that did."""

    _touched = 0.0
    _waiting = False

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if (now := time.monotonic()) - self._touched >= TOUCH_EVERY:
            self._touched = now
            health.touch(BEAT_ALIVE_FILE)
        try:
            interval: float = super().tick(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as err:
            if not self._waiting:
                log.warning("beat: Redis does not answer (%s); waiting for it", err)
            self._waiting = True
            return REDIS_RETRY
        except LockNotOwnedError:
            if not self.lock.acquire(blocking=False):
                raise  # another beat holds it now: it schedules, this one ends
            log.warning("beat: the lock was gone (Redis restarted empty); taken again, schedule written again")
            write_schedule(self)
            return REDIS_RETRY
        if self._waiting:
            log.info("beat: Redis answers again")
            self._waiting = False
        return interval


@beat_init.connect(weak=False)
def _reconcile_at_start(sender: Any = None, **_: Any) -> None:
    """Once this beat holds the lock (redbeat's handler ran first), write its schedule again."""
    if isinstance(sender.scheduler, RedBeatScheduler):
        write_schedule(sender.scheduler)
    else:
        sender.app.send_task(T_CRON_RECONCILE)


def write_schedule(scheduler: RedBeatScheduler) -> None:
    """Write the static entries again (a standby beat may have synced them before a Redis flush)
    and have the cron jobs re-armed from Postgres."""
    scheduler.setup_schedule()
    scheduler.app.send_task(T_CRON_RECONCILE)
    log.info("beat: static schedule written; cron reconciliation requested")
