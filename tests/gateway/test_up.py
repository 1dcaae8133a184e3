"""`nanofleet up`: the whole system in one command, ready, and gone after Ctrl-C or when `up` dies;
one per data dir and port."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from gateway.status import Unavailable
from gateway.supervisor import owning
from tests.fakes.server import free_port
from tests.support.processes import ROOT, wait_until
from tests.support.stack import Stack


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _start_up(env: dict[str, str], log: Path, port: int, *extra: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "gateway.cli", "up", "--port", str(port),
                                 "--concurrency", "4", *extra], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)


def _wait_up(proc: subprocess.Popen[bytes], log: Path, port: int) -> None:
    """`up` says it is up once its gateway answers, then it becomes ready."""
    wait_until(lambda: proc.poll() is not None or "nanofleet: up at" in log.read_text(), timeout=120,
               message="`up` to say it is up")
    assert proc.poll() is None, log.read_text()
    assert _ready(f"http://127.0.0.1:{port}/healthz"), "`up at` was printed before the gateway answered"
    wait_until(lambda: proc.poll() is not None or _ready(f"http://127.0.0.1:{port}/readyz"), timeout=120,
               message="/readyz to answer 200")
    assert proc.poll() is None, log.read_text()


def _up_and_down(env: dict[str, str], log: Path, *extra: str,
                 while_up: Callable[[psutil.Process, Path], None] | None = None) -> str:
    port = free_port()
    proc = _start_up(env, log, port, *extra)
    try:
        _wait_up(proc, log, port)
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


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def _servers_of(data_dir: Path) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"])
            if str(data_dir) in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE]


def _second_up_and_another_terminal(env: dict[str, str], data_dir: Path) -> Callable[[psutil.Process, Path], None]:
    def check(up: psutil.Process, log: Path) -> None:
        servers = [p for p in up.children() if p.name() in ("redis-server", "postgres")]
        assert len(servers) == 2, up.children()
        second = _cli(env, "up", "--embedded", "--port", str(free_port()))
        assert second.returncode == 1
        assert f"another nanofleet up is already running for data dir {data_dir} (pid {up.pid})" in second.stderr
        assert all(p.is_running() for p in servers), "the second `up` stopped the first one's servers"

        exports = dict(line.removeprefix("export ").split("=", 1) for line in log.read_text().splitlines()
                       if line.startswith("export NANOFLEET_"))
        assert set(exports) == {"NANOFLEET_DATABASE_URL", "NANOFLEET_REDIS_URL"}, log.read_text()
        other = {k: v for k, v in env.items() if k != "NANOFLEET_DATA_DIR"} | exports
        status = _cli(other, "status")
        assert "database   ok" in status.stdout and "redis      ok" in status.stdout, status.stdout + status.stderr

    return check


def test_up_starts_embedded_servers_when_none_is_configured(make_stack, open_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s: Stack = make_stack()
    env = {k: v for k, v in s.env.items() if k not in ("NANOFLEET_REDIS_URL", "NANOFLEET_DATABASE_URL")}
    env["NANOFLEET_DATA_DIR"] = str(open_dir)
    output = _up_and_down(env, tmp_path / "up.log", "--embedded",
                          while_up=_second_up_and_another_terminal(env, open_dir))
    assert "--embedded: started an embedded Redis at redis://" in output
    assert "--embedded: started an embedded PostgreSQL at postgresql" in output
    assert "configured or answering" not in output  # with --embedded, whether one answers does not matter
    assert not _servers_of(open_dir), "an embedded server outlived `up`"


def test_every_child_dies_with_up(make_stack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`kill -9` (or the OOM killer) of `up`: its gateway, worker and beat stop too and free the port."""
    s: Stack = make_stack()
    port, log = free_port(), tmp_path / "up.log"
    proc = _start_up(s.env, log, port)
    family: list[psutil.Process] = []
    try:
        _wait_up(proc, log, port)
        family = psutil.Process(proc.pid).children(recursive=True)
        assert len(family) >= 3
        proc.kill()
        proc.wait(30)
        wait_until(lambda: not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE],
                   timeout=60, message="every child of the killed `up` to exit")
        assert not _ready(f"http://127.0.0.1:{port}/healthz")
    finally:
        if proc.poll() is None:
            family = psutil.Process(proc.pid).children(recursive=True)
            proc.kill()
        for p in family:
            with contextlib.suppress(psutil.Error):
                p.kill()


def test_up_and_gateway_refuse_a_port_in_use(make_stack) -> None:  # type: ignore[no-untyped-def]
    s: Stack = make_stack()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for command in ("up", "gateway"):
            done = _cli(s.env, command, "--port", str(port))
            assert done.returncode == 1, (command, done.stdout, done.stderr)
            assert f"nanofleet: port {port} on 127.0.0.1 is in use" in done.stderr
            assert "Traceback" not in done.stderr and "up at" not in done.stdout


def test_data_dir_lock_names_its_holder(tmp_path: Path) -> None:
    held = pytest.raises(Unavailable, match=rf"already running for data dir .*data \(pid {os.getpid()}\)")
    with owning(tmp_path / "data"), held, owning(tmp_path / "data"):
        pass
    with owning(tmp_path / "data"):  # free again once the holder let go
        pass
