"""`nanofleet up`: migrations, gateway, one worker for all queues and beat as child processes,
with embedded Redis and PostgreSQL when none is configured or answering. A child that exits is
started again (beat exits by design when it loses its lock, e.g. after a Redis restart), unless it
keeps exiting: a crash loop stops everything. Ctrl-C stops them all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from urllib.parse import urlsplit

from gateway.embedded import EmbeddedService, port_open, start_postgres, start_redis
from shared.migrate import upgrade
from shared.settings import Settings

STOP_GRACE = 20.0
RESTARTS = 5  # exits of one child within RESTART_WINDOW seconds that count as a crash loop
RESTART_WINDOW = 60.0


def _default_reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    return port_open(parts.hostname or "127.0.0.1", parts.port or default_port)


def _embedded(
    settings: Settings, say: Callable[[str], None], force: bool
) -> tuple[dict[str, str], list[EmbeddedService]]:
    """Start what is not configured and not answering (or not configured, with `force`);
    returns env overrides for the children and the services to stop at the end."""
    env: dict[str, str] = {}
    services: list[EmbeddedService] = []
    configured = settings.model_fields_set
    if "redis_url" not in configured and (force or not _default_reachable(settings.redis_url, 6379)):
        svc = start_redis(settings.data_dir)
        services.append(svc)
        env["NANOFLEET_REDIS_URL"] = svc.url
        say(f"nanofleet: no Redis configured or answering; started an embedded one at {svc.url}")
    if "database_url" not in configured and (force or not _default_reachable(settings.database_url, 5432)):
        svc = start_postgres(settings.data_dir)
        services.append(svc)
        env["NANOFLEET_DATABASE_URL"] = svc.url
        say(f"nanofleet: no PostgreSQL configured or answering; started an embedded one at {svc.url}")
    return env, services


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    # Own process groups: Ctrl-C reaches `up` alone, which then stops each child in order.
    return subprocess.Popen([sys.executable, "-m", "gateway.cli", *args], env=env, start_new_session=True)


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


def run_all(
    settings: Settings, *, host: str, port: int, concurrency: int, embedded: bool = False,
    say: Callable[[str], None] = print,
) -> int:
    env_over, services = _embedded(settings, say, embedded)
    env = {**os.environ, **env_over}
    children: list[subprocess.Popen[bytes]] = []
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        upgrade(env_over.get("NANOFLEET_DATABASE_URL", settings.database_url))
        roles = [["gateway", "--host", host, "--port", str(port)], ["worker", "--concurrency", str(concurrency)],
                 ["beat"]]
        children = [_spawn(role, env) for role in roles]
        exits: list[deque[float]] = [deque(maxlen=RESTARTS) for _ in roles]
        say(f"nanofleet: up at http://{host}:{port} (Ctrl-C to stop)")
        while not stopping:
            for i, child in enumerate(children):
                if child.poll() is None or stopping:
                    continue
                exits[i].append(time.monotonic())
                if len(exits[i]) == RESTARTS and exits[i][-1] - exits[i][0] < RESTART_WINDOW:
                    say(f"nanofleet: {roles[i][0]} exited {RESTARTS} times within {RESTART_WINDOW:.0f}s "
                        f"(last code {child.returncode}); stopping everything")
                    return 1
                say(f"nanofleet: {roles[i][0]} exited with code {child.returncode}; starting it again")
                children[i] = _spawn(roles[i], env)
            time.sleep(0.2)
        return 0
    finally:
        say("nanofleet: stopping")
        _stop(children)
        for svc in reversed(services):
            svc.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
