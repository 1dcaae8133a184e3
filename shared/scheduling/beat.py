"""The redbeat mirror of cron jobs: one entry per enabled job, armed for its next fire time.

Each entry is a one-shot (an rrule with count=1 at the exact UTC second) whose args name the job
and the fire time, so a fire carries the key of its receipt. After a fire the entry goes dormant
(redbeat scores it -1) until the fire task arms it for the following time. Arming overwrites the
definition, the meta and the score in one MULTI, so a stale entry never survives a re-arm.
Postgres stays the source of truth: reconciliation re-arms whatever Redis lost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery import Celery
from redbeat.decoder import RedBeatJSONEncoder, to_timestamp
from redbeat.schedulers import ensure_conf, get_redis
from redbeat.schedules import rrule

from shared.constants import T_CRON_FIRE
from shared.models import utcnow
from shared.queueing import make_celery
from shared.settings import Settings

ENTRY_PREFIX = "cron:"
_apps: dict[str, Celery] = {}


def beat_app(settings: Settings) -> Celery:
    """A producer app configured like the workers' (redbeat prefix and Redis), one per Redis URL."""
    if settings.redis_url not in _apps:
        _apps[settings.redis_url] = make_celery(settings, name="nanofleet-scheduling")
    return _apps[settings.redis_url]


@dataclass(frozen=True)
class Armed:
    """What an entry in Redis says: the fire time it is armed for, and its score (-1: dormant)."""

    due: str | None
    score: float | None


class BeatMirror:
    """Writes and reads cron entries in redbeat's format, under the app's redbeat key prefix."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.conf = ensure_conf(app)

    @property
    def client(self) -> Any:
        return get_redis(self.app)

    def key(self, job_id: str) -> str:
        return f"{self.conf.key_prefix}{ENTRY_PREFIX}{job_id}"

    def arm(self, job_id: str, due: datetime) -> None:
        """Make the job's entry fire once at `due` (a whole UTC second), replacing any other."""
        name = f"{ENTRY_PREFIX}{job_id}"
        definition = {
            "name": name, "task": T_CRON_FIRE, "args": [job_id, due.isoformat()], "kwargs": {},
            "options": {}, "schedule": rrule("SECONDLY", dtstart=due, count=1, app=self.app), "enabled": True,
        }
        # last_run_at before `due` makes redbeat's rrule see `due` as the next occurrence.
        meta = {"last_run_at": min(utcnow(), due - timedelta(seconds=1))}
        with self.client.pipeline() as pipe:
            pipe.hset(self.key(job_id), mapping={
                "definition": json.dumps(definition, cls=RedBeatJSONEncoder),
                "meta": json.dumps(meta, cls=RedBeatJSONEncoder),
            })
            pipe.zadd(self.conf.schedule_key, {self.key(job_id): to_timestamp(due)})
            pipe.execute()

    def disarm(self, job_id: str) -> None:
        with self.client.pipeline() as pipe:
            pipe.zrem(self.conf.schedule_key, self.key(job_id))
            pipe.delete(self.key(job_id))
            pipe.execute()

    def armed(self, job_id: str) -> Armed | None:
        """The entry as Redis has it, or None when there is none."""
        with self.client.pipeline() as pipe:
            pipe.hget(self.key(job_id), "definition")
            pipe.zscore(self.conf.schedule_key, self.key(job_id))
            raw, score = pipe.execute()
        if not raw:
            return None
        args = json.loads(raw).get("args") or []
        return Armed(due=args[1] if len(args) > 1 else None, score=score)

    def is_armed_for(self, job_id: str, due: datetime) -> bool:
        entry = self.armed(job_id)
        return entry is not None and entry.due == due.isoformat() and entry.score == to_timestamp(due)

    def job_ids(self) -> set[str]:
        """Jobs that have an entry in the schedule."""
        prefix = self.key("")
        return {k[len(prefix):] for k in self.client.zrange(self.conf.schedule_key, 0, -1) if k.startswith(prefix)}
