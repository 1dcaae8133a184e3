"""A real worker keeps its liveness file fresh (workers/health.py), and compose's worker healthcheck,
run as the container runs it, reads it: healthy while the worker's heartbeat goes on."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from shared.constants import BEAT_ALIVE_FILE
from tests.support.processes import ROOT, wait_until
from tests.support.stack import Stack
from workers.health import ALIVE_FILE


def _healthcheck(data_dir: Path) -> int:
    test = yaml.safe_load((ROOT / "docker" / "compose.yml").read_text())["x-worker"]["healthcheck"]["test"]
    assert test[:2] == ["CMD", "python"], test
    env = {**os.environ, "NANOFLEET_DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, *test[2:]], env=env, timeout=30, check=False).returncode


def test_a_running_worker_passes_the_compose_healthcheck(make_stack: Callable[..., Stack]) -> None:
    s = make_stack()
    data_dir = s.settings.data_dir
    assert _healthcheck(data_dir) == 1  # no worker yet
    s.worker(queues="scheduler", concurrency=1)
    wait_until(lambda: _healthcheck(data_dir) == 0, timeout=30, message="the worker's first heartbeat")
    old = time.time() - 120  # as if the heartbeat had stopped two minutes ago
    os.utime(data_dir / ALIVE_FILE, (old, old))
    assert _healthcheck(data_dir) == 1
    wait_until(lambda: _healthcheck(data_dir) == 0, timeout=30, message="the next heartbeat to touch the file")


def test_a_running_beat_keeps_its_liveness_file_fresh(make_stack: Callable[..., Stack]) -> None:
    """Compose's beat healthcheck reads it (tests/docker/test_compose.py runs the check itself)."""
    s = make_stack()
    alive = s.settings.data_dir / BEAT_ALIVE_FILE
    s.beat()
    wait_until(alive.exists, timeout=60, message="beat's first tick")
    old = time.time() - 120
    os.utime(alive, (old, old))
    wait_until(lambda: time.time() - alive.stat().st_mtime < 30, timeout=30, message="beat to touch the file again")
