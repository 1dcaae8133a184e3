"""Real nanofleet processes for the tests: Celery workers and beat as subprocesses."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from shared.queueing import make_celery
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def wait_until(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.05,
               message: str = "condition") -> object:
    """Poll `predicate` until it returns something truthy; fail with `message` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


class Proc:
    """A child process with its own process group and a log file."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.popen = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                      start_new_session=True)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole group (a prefork worker's children too)."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        self._log.close()

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


def start_worker(env: dict[str, str], settings: Settings, log_dir: Path, *, queues: str | None = None,
                 pool: str = "threads", concurrency: int = 8, wait: bool = True) -> Proc:
    """A worker process; with `wait`, once it answers a ping (it may die meanwhile only without)."""
    name = f"test-{uuid.uuid4().hex[:6]}@%h"
    queues = queues or "agent,tools,subagents,outbound,scheduler"
    argv = [sys.executable, "-m", "celery", "-A", "workers.app:app", "worker", "-Q", queues, "-P", pool,
            "-c", str(concurrency), "-n", name, "--without-mingle", "--without-gossip", "-l", "INFO"]
    proc = Proc(argv, env, log_dir / f"worker-{name.split('@')[0]}.log")
    control = make_celery(settings).control
    full = name.replace("%h", os.uname().nodename)

    def answered() -> bool:
        if not proc.alive():
            raise AssertionError(f"worker exited at start:\n{proc.log()[-3000:]}")
        return bool(control.ping(destination=[full], timeout=0.5))

    if wait:
        wait_until(answered, timeout=60, message="the worker to answer a ping")
    return proc


def start_beat(env: dict[str, str], log_dir: Path) -> Proc:
    argv = [sys.executable, "-m", "celery", "-A", "workers.beat:app", "beat", "-S", "workers.beat:Scheduler",
            "--max-interval", "1", "-l", "INFO"]
    return Proc(argv, env, log_dir / f"beat-{uuid.uuid4().hex[:6]}.log")


def last_line_printed(code: str) -> str:
    """The last line `code` prints, run by a fresh interpreter without NANOFLEET_ settings (what a
    command imports, say)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NANOFLEET_")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]
