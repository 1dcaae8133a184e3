"""The worker's liveness file, which compose's worker healthcheck reads (docker/compose.yml).

Celery's event heartbeat (every 2 s) runs on the worker's event loop while its consumer is connected
to the broker; each one touches <NANOFLEET_DATA_DIR>/worker.alive. A file older than a few heartbeats
says the worker takes no tasks: its broker connection is down (the consumer restarts and its
heartbeat stops until it is back), its event loop is stuck, or it is shutting down. Reading its age
costs the healthcheck a stat, where `celery inspect ping` would load the whole app (litellm: seconds
of CPU) and broadcast over Redis at every check."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from celery.signals import heartbeat_sent

from shared.constants import WORKER_ALIVE_FILE
from shared.settings import get_settings

ALIVE_FILE = WORKER_ALIVE_FILE
_warned: list[Path] = []  # the liveness file this process could not touch, once said

log = logging.getLogger(__name__)


def alive_file(name: str = ALIVE_FILE) -> Path:
    return get_settings().data_dir / name


def touch(name: str = ALIVE_FILE) -> None:
    """Touch the liveness file `name` in the data dir (beat's is BEAT_ALIVE_FILE)."""
    path = alive_file(name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError as err:  # a read-only data dir: the healthcheck reports the process, which goes on
        if path not in _warned:  # once, not at every heartbeat (every 2 s)
            _warned.append(path)
            log.warning("cannot touch the liveness file %s (the compose healthcheck will call this process "
                        "unhealthy): %s", path, err)


def _touch(**_: Any) -> None:
    touch()


def connect() -> None:
    """Before the worker's consumer starts: the heartbeat looks for receivers once, when it is made."""
    heartbeat_sent.connect(_touch, weak=False)
