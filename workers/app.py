"""The Celery app the workers run: `celery -A workers.app:app worker` (or `nanofleet worker`)."""

from __future__ import annotations

from shared import db
from shared.queueing import make_celery
from shared.settings import get_settings
from workers import signals

TASK_MODULES = [
    "workers.tasks.agent",
    "workers.tasks.tools",
    "workers.tasks.subagents",
    "workers.tasks.outbound",
    "workers.tasks.scheduler",
]

db.configure(get_settings().database, role="worker")  # Flower imports this module too: it opens no connection
app = make_celery(get_settings(), name="nanofleet-worker", include=TASK_MODULES)
signals.connect()
