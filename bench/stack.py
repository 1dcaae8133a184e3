"""The system under measurement: dedicated servers, the environment, real gateway/worker/beat
processes (each in its own process group), and a teardown that runs on error, Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import psutil
from sqlalchemy import Engine, text

from bench.services import DedicatedPostgres, DedicatedRedis, RedisClaim, free_port
from shared.db import get_engine
from shared.migrate import upgrade
from shared.settings import LLMSettings
from tests.fakes.llm import FakeLLM
from tests.support.processes import Proc, wait_until
from tests.support.stack import API_KEY, Stack, make_env

TELEGRAM_TOKEN = "123456:bench-token-abcdefghijklmnop"
TELEGRAM_SECRET = "bench-webhook-secret-0123456789"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


class Teardown:
    """Callbacks run in reverse order exactly once; SIGTERM/SIGHUP become SystemExit so `finally`
    blocks run (Ctrl-C is KeyboardInterrupt already)."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[], None]] = []

    def add(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def run(self) -> None:
        while self._callbacks:
            callback = self._callbacks.pop()
            try:
                callback()
            except Exception as err:  # keep tearing down the rest
                print(f"teardown: {type(err).__name__}: {err}", file=sys.stderr)

    @staticmethod
    def install_signals() -> None:
        def _exit(signum: int, _frame: FrameType | None) -> None:
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, _exit)
        signal.signal(signal.SIGHUP, _exit)


class BenchStack(Stack):
    """A Stack (tests.support) plus a gateway process and environment variants sharing one
    process list, so one teardown stops everything."""

    def __init__(self, env: dict[str, str], log_dir: Path, procs: list[Proc] | None = None) -> None:
        super().__init__(env, log_dir)
        if procs is not None:
            self.procs = procs
        self.gateway_url = ""

    def derive(self, **extra: Any) -> BenchStack:
        """The same stack with some NANOFLEET_ settings changed (for processes started from it)."""
        env = {**self.env, **{k if k.startswith("NANOFLEET_") else f"NANOFLEET_{k}": str(v)
                              for k, v in extra.items()}}
        child = BenchStack(env, self.log_dir, self.procs)
        child.gateway_url = self.gateway_url
        return child

    @property
    def engine(self) -> Engine:
        return get_engine(self.settings.database_url)

    def gateway(self, port: int | None = None, workers: int = 1) -> Proc:
        port = port or free_port()
        argv = [sys.executable, "-m", "gateway.cli", "gateway", "--port", str(port), "--workers", str(workers)]
        proc = Proc(argv, self.env, self.log_dir / f"gateway-{uuid.uuid4().hex[:6]}.log")
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            if not proc.alive():
                raise RuntimeError(f"gateway exited at start:\n{proc.log()[-3000:]}")
            try:
                return httpx.get(url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, timeout=60, interval=0.1, message="the gateway to answer /healthz")
        self.gateway_url = self.gateway_url or url  # the first gateway is the stack's
        return proc

    def workers(self, n: int, **kw: Any) -> list[Proc]:
        return [self.worker(**kw) for _ in range(n)]

    def stop_procs(self, procs: list[Proc]) -> None:
        for proc in procs:
            proc.kill()
            with contextlib.suppress(ValueError):
                self.procs.remove(proc)

    def reset_data(self) -> None:
        """Empty tables and this stack's Redis DB (between items)."""
        with self.engine.begin() as conn:
            tables = conn.execute(text(
                "select string_agg(quote_ident(tablename), ',') from pg_tables "
                "where schemaname = 'public' and tablename <> 'alembic_version'")).scalar()
            conn.execute(text(f"truncate {tables} restart identity cascade"))
        import redis

        redis.Redis.from_url(self.settings.redis_url).flushdb()
        (self.workspace / "executions.log").unlink(missing_ok=True)

    def has_route(self, path: str) -> bool:
        """True when the running gateway's OpenAPI lists `path` (how optional features are found)."""
        spec = httpx.get(self.gateway_url + "/openapi.json", timeout=10).json()
        return path in spec.get("paths", {})


def tree_memory(pid: int, *, pss: bool = False) -> int:
    """Resident memory of a process and all its descendants, in bytes; with `pss`, the proportional
    set size (pages shared between them, as a prefork pool's with its parent, count once)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_full_info().pss if pss else p.memory_info().rss
    return total


def owner_of_port(procs: list[Proc], port: int) -> Proc | None:
    """The process (tree) holding a local TCP port: which worker made an HTTP call."""
    for proc in procs:
        try:
            root = psutil.Process(proc.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in tree:
            with contextlib.suppress(psutil.Error):
                if any(c.laddr and c.laddr.port == port for c in p.net_connections(kind="tcp")):
                    return proc
    return None


@contextlib.contextmanager
def bench_stack(*, teardown: Teardown, shared_postgres: str | None, shared_redis: str | None, llm: FakeLLM, name: str,
                telegram_url: str = "", **extra: Any) -> Iterator[BenchStack]:
    """Servers, database and environment for one run; everything is undone by `teardown`."""
    root = Path(tempfile.mkdtemp(prefix=f"nanofleet-{name}-"))
    root.chmod(0o755)  # the postgres user must traverse it
    database_url, redis_url = _database(teardown, root, shared_postgres), _redis(teardown, root, shared_redis)
    upgrade(database_url)
    workspace = root / "workspace"
    workspace.mkdir()
    env = make_env(database_url=database_url, redis_url=redis_url, llm_url=llm.url, workspace=workspace,
                   **{**bench_defaults(telegram_url), **extra})
    stack = BenchStack(child_env(env), root / "logs")
    stack.log_dir.mkdir()
    teardown.add(lambda: stack.stop())
    yield stack


def child_env(env: dict[str, str]) -> dict[str, str]:
    """Children may cache bytecode (this sandbox sets PYTHONDONTWRITEBYTECODE, which makes every worker
    start compile its imports again; the Docker image compiles them at build time)."""
    return {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}


def bench_defaults(telegram_url: str) -> dict[str, str]:
    """Production defaults where the test environment shortens them or names a model litellm does not
    know (pricing an unknown model, litellm looks for it in vain on every call), and a Telegram bot."""
    return {
        "LLM__MODEL": str(LLMSettings.model_fields["model"].default),
        "RUNTIME__LEASE_SECONDS": "4", "RUNTIME__SWEEP_INTERVAL": "1", "AGENT__CHAT_TIMEOUT": "120",
        "CHANNELS__TELEGRAM__TOKEN": TELEGRAM_TOKEN, "CHANNELS__TELEGRAM__WEBHOOK_SECRET": TELEGRAM_SECRET,
        "CHANNELS__TELEGRAM__ALLOW_FROM": json.dumps(["*"]),
        "CHANNELS__TELEGRAM__API_BASE": telegram_url or "http://127.0.0.1:9",
    }


def _database(teardown: Teardown, root: Path, shared_postgres: str | None) -> str:
    if shared_postgres:
        from sqlalchemy import create_engine
        from sqlalchemy.engine import make_url

        base = make_url(shared_postgres)
        name = f"nanofleet_bench_{uuid.uuid4().hex[:8]}"

        def drop() -> None:
            get_engine.cache_clear()
            admin = create_engine(base.set(database="postgres"), isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(text(f'drop database if exists "{name}" with (force)'))
            admin.dispose()

        teardown.add(drop)
        return base.set(database=name).render_as_string(hide_password=False)
    pg = DedicatedPostgres(root / "pg")
    teardown.add(pg.stop)
    return pg.start()


def _redis(teardown: Teardown, root: Path, shared_redis: str | None) -> str:
    """A private redis-server (default: other sessions' flushes and restarts of the machine's Redis
    cannot touch the run), or a claimed database number on `shared_redis`."""
    if shared_redis:
        claim = RedisClaim(shared_redis)
        teardown.add(claim.release)
        return claim.claim()
    server = DedicatedRedis(root / "redis")
    teardown.add(server.stop)
    return server.start()


def elapsed_since(started: float) -> float:
    return time.monotonic() - started
