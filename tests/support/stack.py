"""A test's view of the system: environment, settings, workspace, its processes, a gateway client."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis
from sqlalchemy import text

from shared.constants import KEY_PREFIX, QUEUES
from shared.settings import Settings, load_settings
from tests.fakes.server import free_port
from tests.support.processes import Proc, start_beat, start_worker, wait_until
from tests.support.tools import PLUGINS

API_KEY = "test-key-0123456789"


def make_env(*, database_url: str, redis_url: str, llm_url: str, workspace: Path, **extra: Any) -> dict[str, str]:
    """The environment of a nanofleet process under test; `extra` keys are NANOFLEET_ names."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NANOFLEET_")}
    env.update({
        "NANOFLEET_DATABASE_URL": database_url,
        "NANOFLEET_REDIS_URL": redis_url,
        "NANOFLEET_API_KEYS": json.dumps([API_KEY]),
        "NANOFLEET_WORKSPACE": str(workspace),
        "NANOFLEET_DATA_DIR": str(workspace.parent / "data"),
        "NANOFLEET_LLM__MODEL": "openai/fake-model",
        "NANOFLEET_LLM__API_BASE": llm_url,
        "NANOFLEET_LLM__API_KEY": "sk-fake-key-for-tests",
        "NANOFLEET_LLM__MAX_RETRIES": "2",
        "NANOFLEET_LLM__RETRY_BASE_DELAY": "0.05",
        "NANOFLEET_TOOLS__ALLOWED": json.dumps(["time", "record", "sleepy", "needs_shell"]),
        "NANOFLEET_TOOLS__PLUGINS": json.dumps(PLUGINS),
        "NANOFLEET_RUNTIME__LEASE_SECONDS": "2",
        "NANOFLEET_RUNTIME__SWEEP_INTERVAL": "0.5",
        "NANOFLEET_AGENT__CHAT_TIMEOUT": "30",
        "NANOFLEET_HEARTBEAT__ENABLED": "false",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "PYTHONUNBUFFERED": "1",
    })
    env.update({k if k.startswith("NANOFLEET_") else f"NANOFLEET_{k}": str(v) for k, v in extra.items()})
    return env


def settings_from(env: dict[str, str]) -> Settings:
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        return load_settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def clean_redis(url: str) -> None:
    client = redis.Redis.from_url(url)
    keys = [k for k in client.scan_iter(count=1000)
            if k.startswith(KEY_PREFIX.encode()) or k in (b"unacked", b"unacked_index") or k.decode() in QUEUES]
    if keys:
        client.delete(*keys)
    client.close()


def clean_db(url: str, attempts: int = 5) -> None:
    """Empty every table. A live worker's sweep can lock rows in another order than TRUNCATE takes
    its table locks; Postgres then aborts one side as a deadlock, and we try again."""
    from sqlalchemy.exc import OperationalError

    from shared.db import get_engine

    for attempt in range(attempts):
        try:
            with get_engine(url).begin() as conn:
                tables = conn.execute(text(
                    "select string_agg(quote_ident(tablename), ',') from pg_tables "
                    "where schemaname = 'public' and tablename <> 'alembic_version'")).scalar()
                conn.execute(text(f"truncate {tables} restart identity cascade"))
            return
        except OperationalError as err:
            if "deadlock" not in str(err) or attempt == attempts - 1:
                raise


class Stack:
    """One test's view of the system: env, settings, workspace, process starters."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.settings = settings_from(env)
        self.log_dir = log_dir
        self.procs: list[Proc] = []

    @property
    def workspace(self) -> Path:
        return self.settings.workspace

    def worker(self, **kw: Any) -> Proc:
        proc = start_worker(self.env, self.settings, self.log_dir, **kw)
        self.procs.append(proc)
        return proc

    def beat(self) -> Proc:
        proc = start_beat(self.env, self.log_dir)
        self.procs.append(proc)
        return proc

    def executions(self) -> list[str]:
        path = self.workspace / "executions.log"
        return path.read_text().splitlines() if path.exists() else []

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()


def api_client(settings: Settings) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from gateway.app import create_app

    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {API_KEY}"}) as client:
        yield client


@contextmanager
def gateway_process(s: Stack) -> Iterator[tuple[Proc, httpx.Client]]:
    """`nanofleet gateway` as a process of the stack, and a client of its API, once it answers."""
    port = free_port()
    proc = Proc([sys.executable, "-m", "gateway.cli", "gateway", "--port", str(port)], s.env,
                s.log_dir / f"gateway-{port}.log")
    s.procs.append(proc)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=30) as client:
        wait_until(lambda: not proc.alive() or answers(client), timeout=60, message="the gateway to answer")
        assert proc.alive(), proc.log()
        yield proc, client


def answers(client: httpx.Client, timeout: float = 5.0) -> bool:
    """Whether the gateway's /healthz answers within `timeout` seconds."""
    try:
        return client.get("/healthz", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False
