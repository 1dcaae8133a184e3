"""Shared fixtures: real Postgres and Redis, a fake LLM over HTTP, real worker processes."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from shared.migrate import upgrade
from tests.fakes.llm import FakeLLM
from tests.support import services
from tests.support.stack import Stack, api_client, clean_db, clean_redis, make_env

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    base = make_url(services.postgres_url())
    name = f"nanofleet_test_{uuid.uuid4().hex[:8]}"
    url = base.set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    yield url
    from shared.db import get_engine

    get_engine.cache_clear()
    admin = create_engine(base.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'drop database if exists "{name}" with (force)'))
    admin.dispose()
    services.stop_containers()


@pytest.fixture(scope="session")
def redis_server() -> str:
    return services.redis_base_url()


@pytest.fixture(scope="session")
def redis_dbs(redis_server: str) -> Iterator[tuple[int, int]]:
    """(shared stack's DB, private stacks' DB), reserved for this session."""
    with services.claimed_redis_dbs(redis_server, 2) as (shared, fresh):
        yield shared, fresh


@pytest.fixture(scope="session")
def fake_llm() -> Iterator[FakeLLM]:
    server = FakeLLM().start()
    yield server
    server.server.stop()


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nanofleet")


@pytest.fixture(scope="session")
def shared_stack(database_url: str, redis_server: str, redis_dbs: tuple[int, int], fake_llm: FakeLLM,
                 session_dir: Path) -> Iterator[Stack]:
    """A worker for all queues shared by the tests that need nothing special."""
    workspace = session_dir / "workspace"
    workspace.mkdir()
    redis_url = f"{redis_server}/{redis_dbs[0]}"
    redis.Redis.from_url(redis_url).flushdb()
    stack = Stack(make_env(database_url=database_url, redis_url=redis_url, llm_url=fake_llm.url,
                           workspace=workspace), session_dir)
    yield stack
    stack.stop()


@pytest.fixture
def stack(shared_stack: Stack, fake_llm: FakeLLM, database_url: str) -> Iterator[Stack]:
    """The shared stack, clean: empty tables, no queued tasks, default fake LLM, started worker."""
    clean_db(database_url)
    clean_redis(shared_stack.env["NANOFLEET_REDIS_URL"])
    fake_llm.reset()
    log = shared_stack.workspace / "executions.log"
    log.unlink(missing_ok=True)
    if not any(p.alive() for p in shared_stack.procs):
        shared_stack.worker(concurrency=16)
    yield shared_stack


@pytest.fixture
def make_stack(database_url: str, redis_server: str, redis_dbs: tuple[int, int], fake_llm: FakeLLM,
               tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """A private stack (its own Redis DB and workspace) for tests that start, kill or configure
    their own processes; the shared worker never sees its tasks."""
    made: list[Stack] = []
    clean_db(database_url)
    redis_url = f"{redis_server}/{redis_dbs[1]}"
    redis.Redis.from_url(redis_url).flushdb()
    fake_llm.reset()

    def factory(**extra: Any) -> Stack:
        workspace = tmp_path / f"workspace{len(made)}"
        workspace.mkdir()
        s = Stack(make_env(database_url=database_url, redis_url=redis_url, llm_url=fake_llm.url,
                           workspace=workspace, **extra), tmp_path)
        made.append(s)
        return s

    yield factory
    for s in made:
        s.stop()


@pytest.fixture
def api(stack: Stack) -> Iterator[Any]:
    """The gateway app, in-process, against the shared stack, with a valid API key."""
    yield from api_client(stack.settings)
