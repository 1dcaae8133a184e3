"""`nanofleet up`: migrations, gateway, one worker for all queues and beat as child processes,
with embedded Redis and PostgreSQL when none is configured or answering. Their URLs carry
passwords: the children get them in their environment (which they keep from exec: shared/
process_guard.py), other terminals from a 0600 file `up` names, and what `up` prints masks them.

One `up` per data dir: it holds an exclusive lock on ``<data_dir>/up.lock`` for its life (the
kernel lets go if it dies), so a second one refuses at once and never takes the first one's
embedded servers for leftovers. Before starting anything it checks that the port is free and that
the configured (or default) Redis and Postgres answer. Every child gets SIGTERM if `up` dies,
even by SIGKILL or the OOM killer. A child that exits is started again (beat exits by design when
it loses its lock, e.g. after a Redis restart), unless it keeps exiting: a crash loop stops
everything. Ctrl-C stops them all."""

from __future__ import annotations

import fcntl
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from gateway.embedded import EmbeddedService, port_open, start_postgres, start_redis
from gateway.embedded_auth import write_private
from gateway.status import Unavailable, masked, port_problem, require_database, require_redis
from shared.constants import WORKER_ALIVE_FILE
from shared.migrate import upgrade
from shared.process_guard import libc
from shared.settings import Settings

STOP_GRACE = 20.0
RESTARTS = 5  # exits of one child within RESTART_WINDOW seconds that count as a crash loop
RESTART_WINDOW = 60.0
READY_PATIENCE = 60.0  # seconds to wait for the gateway and the worker before saying they are slow
LOCK_FILE = "up.lock"
ENV_FILE = "embedded.env"  # the embedded servers' URLs, with their passwords, for other terminals
_PR_SET_PDEATHSIG = 1  # prctl(2)
_LIBC = libc()  # loaded before any fork

Say = Callable[[str], None]


@contextmanager
def owning(data_dir: Path) -> Iterator[None]:
    """Hold `data_dir`'s lock for the block, or raise Unavailable naming the `up` that holds it."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children
    except OSError as err:
        raise Unavailable(f"cannot use data dir {data_dir} (NANOFLEET_DATA_DIR): {err.strerror or err}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise Unavailable(f"another nanofleet up is already running for data dir {data_dir} "
                              f"(pid {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def _check_port(host: str, port: int) -> None:
    if (problem := port_problem(host, port)) is not None:
        raise Unavailable(problem)


def _default_reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    return port_open(parts.hostname or "127.0.0.1", parts.port or default_port)


def _started(what: str, svc: EmbeddedService, forced: bool, default: str) -> str:
    why = "--embedded" if forced else f"no {what} configured and none answering on {default}"
    return f"nanofleet: {why}: started an embedded {what} at {masked(svc.url)} (data in {svc.log_file.parent})"


def _services(settings: Settings, say: Say, force: bool) -> tuple[dict[str, str], list[EmbeddedService]]:
    """Check the Redis and Postgres to use, then start embedded ones where none is configured and
    none answers (or none is configured, with `force`). Returns env overrides for the children and
    the services to stop at the end; raises Unavailable when one cannot be used."""
    configured = settings.model_fields_set
    own_redis = "redis_url" not in configured and (force or not _default_reachable(settings.redis_url, 6379))
    own_db = "database_url" not in configured and (force or not _default_reachable(settings.database_url, 5432))
    if not own_redis:
        require_redis(settings.redis_url)
    if not own_db:
        require_database(settings.database_url, may_create=True)
    if force and not (own_redis and own_db):
        say("nanofleet: --embedded: the configured NANOFLEET_REDIS_URL / NANOFLEET_DATABASE_URL are used as set")
    env: dict[str, str] = {}
    services: list[EmbeddedService] = []
    try:
        if own_redis:
            services.append(svc := start_redis(settings.data_dir))
            env["NANOFLEET_REDIS_URL"] = svc.url
            say(_started("Redis", svc, force, "127.0.0.1:6379"))
        if own_db:
            services.append(svc := start_postgres(settings.data_dir))
            env["NANOFLEET_DATABASE_URL"] = svc.url
            say(_started("PostgreSQL", svc, force, "127.0.0.1:5432"))
        if env:
            _write_env_file(settings.data_dir / ENV_FILE, env, say)
    except (RuntimeError, OSError) as err:
        for started in reversed(services):
            started.stop()
        raise Unavailable(str(err)) from None
    return env, services


def _write_env_file(path: Path, env: dict[str, str], say: Say) -> None:
    """The URLs carry passwords: they go to a file only this user reads, not to the terminal (or
    the journal that keeps what `up` prints)."""
    write_private(path, "".join(f"export {name}={shlex.quote(url)}\n" for name, url in sorted(env.items())))
    say(f"nanofleet: for `nanofleet status`, `cron` or `agent` in another terminal: . {shlex.quote(str(path))}")


def _die_with(parent: int) -> Callable[[], None]:
    """A preexec_fn: the child gets SIGTERM when the thread that forked it dies (so fork from the
    main thread), and exits at once if `up` died before the call."""

    def preexec() -> None:
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    # Own process groups: Ctrl-C reaches `up` alone, which then stops each child in order.
    return subprocess.Popen([sys.executable, "-m", "gateway.cli", *args], env=env, start_new_session=True,
                            preexec_fn=_die_with(os.getpid()))


def _stop(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    for child in children:
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _not_ready(probe: str, alive: Path, since: float) -> list[str]:
    """What does not answer yet: the gateway (its /healthz), the worker (no heartbeat since `since`)."""
    waiting = [] if _healthy(probe) else [f"the gateway ({probe})"]
    try:
        beat = alive.stat().st_mtime >= since
    except OSError:
        beat = False
    return waiting if beat else [*waiting, "the worker"]


def _probe_url(host: str, port: int) -> str:
    """Where `up` itself asks the gateway for /healthz (a wildcard address is reached on loopback)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/healthz"


class _Supervisor:
    """The children of `up`: started, started again when one exits, stopped together."""

    def __init__(self, roles: list[list[str]], env: dict[str, str], say: Say) -> None:
        self.roles, self.env, self.say = roles, env, say
        self.children = [_spawn(role, env) for role in roles]
        self.exits: list[deque[float]] = [deque(maxlen=RESTARTS) for _ in roles]

    def restart_exited(self) -> bool:
        """Start again each child that exited; False when one is crash-looping."""
        for i, child in enumerate(self.children):
            if child.poll() is None:
                continue
            name, exits = self.roles[i][0], self.exits[i]
            exits.append(time.monotonic())
            if len(exits) == RESTARTS and exits[-1] - exits[0] < RESTART_WINDOW:
                self.say(f"nanofleet: {name} exited {RESTARTS} times within {RESTART_WINDOW:.0f}s "
                         f"(last code {child.returncode}); stopping everything")
                return False
            self.say(f"nanofleet: {name} exited with code {child.returncode}; starting it again")
            self.children[i] = _spawn(self.roles[i], self.env)
        return True

    def stop(self) -> None:
        _stop(self.children)


def run_all(
    settings: Settings, *, host: str, port: int, concurrency: int, embedded: bool = False, say: Say = print,
) -> int:
    """Run everything until Ctrl-C or SIGTERM (0) or a crash loop (1). Call from the main thread:
    the children's parent-death signal follows the thread that started them. Raises Unavailable,
    with nothing started, when the data dir, the port, Redis or Postgres cannot be had."""
    with owning(settings.data_dir):
        _check_port(host, port)
        env_over, services = _services(settings, say, embedded)
        try:
            upgrade(env_over.get("NANOFLEET_DATABASE_URL", settings.database_url))
            _check_port(host, port)  # again: migrations take a while
            return _supervise(host, port, concurrency, {**os.environ, **env_over}, say,
                              alive=settings.data_dir / WORKER_ALIVE_FILE)
        finally:
            for svc in reversed(services):
                svc.stop()
            if services:
                (settings.data_dir / ENV_FILE).unlink(missing_ok=True)


def _supervise(host: str, port: int, concurrency: int, env: dict[str, str], say: Say, *, alive: Path) -> int:
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    roles = [["gateway", "--host", host, "--port", str(port)], ["worker", "--concurrency", str(concurrency)],
             ["beat"]]
    say("nanofleet: starting the gateway, a worker and beat")
    since = time.time()
    children = _Supervisor(roles, env, say)
    probe, started, announced, slow = _probe_url(host, port), time.monotonic(), False, False
    try:
        while not stopping:
            if not children.restart_exited():
                return 1
            if not announced:
                waiting = _not_ready(probe, alive, since)
                if not waiting:
                    announced = True
                    say(f"nanofleet: up at http://{host}:{port} (Ctrl-C to stop)")
                elif not slow and time.monotonic() - started > READY_PATIENCE:
                    slow = True
                    say(f"nanofleet: {' and '.join(waiting)} not ready after {READY_PATIENCE:.0f}s; still waiting")
            time.sleep(0.2)
        return 0
    finally:
        say("nanofleet: stopping")
        children.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
