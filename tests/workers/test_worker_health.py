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
