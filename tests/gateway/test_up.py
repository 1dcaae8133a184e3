"""`nanofleet up`: the whole system in one command, ready, and gone after Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.fakes.server import free_port
from tests.support.processes import ROOT, wait_until
from tests.support.stack import Stack


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _up_and_down(env: dict[str, str], log: Path, *extra: str,
                 while_up: Callable[[psutil.Process, Path], None] | None = None) -> str:
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "up", "--port", str(port),
                                 "--concurrency", "4", *extra], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: proc.poll() is not None or _ready(f"http://127.0.0.1:{port}/readyz"), timeout=120,
                   message="/readyz to answer 200")
        assert proc.poll() is None, log.read_text()
        family = psutil.Process(proc.pid).children(recursive=True)
        assert len(family) >= 3  # gateway, worker, beat (and their own children)
        if while_up is not None:
            while_up(psutil.Process(proc.pid), log)
            family = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, log.read_text()
        wait_until(lambda: not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE],
                   timeout=30, message="every child process to exit")
    finally:
        if proc.poll() is None:
            proc.kill()
    return log.read_text()


def test_up_on_configured_services(make_stack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s: Stack = make_stack()
    output = _up_and_down(s.env, tmp_path / "up.log")
    assert "embedded" not in output


def _kill_beat(up: psutil.Process, log: Path) -> None:
    """Beat exits by design when it loses its lock (a Redis restart): `up` starts it again."""
    def beats() -> list[psutil.Process]:
        found = []
        for child in up.children():
            with contextlib.suppress(psutil.Error):  # the killed one is a zombie until `up` reaps it
                if "beat" in child.cmdline():
                    found.append(child)
        return found

    [beat] = beats()
    os.killpg(beat.pid, signal.SIGKILL)
    wait_until(lambda: [b for b in beats() if b.pid != beat.pid], timeout=30, message="a new beat")
    assert "beat exited with code -9; starting it again" in log.read_text()


def test_up_starts_a_child_again_when_it_exits(make_stack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s: Stack = make_stack()
    _up_and_down(s.env, tmp_path / "up.log", while_up=_kill_beat)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A data dir the unprivileged PostgreSQL user can reach (pytest's tmp dirs are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="nanofleet-up-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_up_starts_embedded_servers_when_none_is_configured(make_stack, open_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s: Stack = make_stack()
    env = {k: v for k, v in s.env.items() if k not in ("NANOFLEET_REDIS_URL", "NANOFLEET_DATABASE_URL")}
    env["NANOFLEET_DATA_DIR"] = str(open_dir)
    output = _up_and_down(env, tmp_path / "up.log", "--embedded")
    assert "embedded one at redis://" in output and "embedded one at postgresql" in output
    assert not [p for p in psutil.process_iter(["cmdline"])
                if str(open_dir) in " ".join(p.info["cmdline"] or [])], "an embedded server outlived `up`"
