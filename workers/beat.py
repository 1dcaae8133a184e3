"""The Celery app beat runs: `nanofleet beat` (`celery -A workers.beat:app beat`).

The workers' configuration without their task modules: beat sends tasks by name and never runs
one, so it does not import the agent runtime and litellm, and a beat that lost its lock (a Redis
restart) is back in about a second rather than several."""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import beat_init
from redbeat.schedulers import RedBeatScheduler  # imported first: its beat lock handler runs before ours

from shared import db
from shared.constants import T_CRON_RECONCILE
from shared.process_guard import guard_or_warn
from shared.queueing import make_celery
from shared.settings import get_settings
from workers import signals

log = logging.getLogger(__name__)
# As soon as celery has loaded this module (`nanofleet beat` exec'd it: the flag did not survive):
# a command exec runs as beat's user on this host must not read the secrets in beat's environment.
guard_or_warn("beat")
db.configure(get_settings().database, role="beat")
app = make_celery(get_settings(), name="nanofleet-beat")
signals.connect()


@beat_init.connect(weak=False)
def _reconcile_at_start(sender: Any = None, **_: Any) -> None:
    """Once this beat holds the lock (redbeat's handler ran first), write its static entries again
    (a standby beat may have synced them before a Redis flush) and have the cron jobs re-armed
    from Postgres."""
    if isinstance(sender.scheduler, RedBeatScheduler):
        sender.scheduler.setup_schedule()
    sender.app.send_task(T_CRON_RECONCILE)
    log.info("beat: static schedule written; cron reconciliation requested")
