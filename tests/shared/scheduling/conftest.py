"""Fixtures for the scheduling tests: one worker shared by the tests that only need a worker (its
own Redis database, spawn and cron allowed, the daily summary on), and in-process runtimes for the
plain core (no Celery)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shared.agent.runtime import Runtime
from shared.scheduling import hooks
from shared.scheduling.beat import BeatMirror, beat_app
from shared.settings import Settings
from tests.fakes.llm import FakeLLM
from tests.support.scheduling import FAST, claimed_redis_db
from tests.support.stack import Stack, clean_db, clean_redis, make_env


def core_runtime(settings: Settings) -> Runtime:
    """The core as a worker runs it, with this issue's finish hooks (outbox deliveries stay queued)."""
    return hooks.install(Runtime.build(settings))


@pytest.fixture(scope="session")
def scheduling_session(database_url: str, redis_server: str, fake_llm: FakeLLM,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root: Path = tmp_path_factory.mktemp("scheduling")
    (root / "workspace").mkdir()
    with claimed_redis_db(redis_server) as redis_url:
        env = make_env(database_url=database_url, redis_url=redis_url, llm_url=fake_llm.url,
                       workspace=root / "workspace", SCHEDULER__DAILY_SUMMARY__ENABLED="true", **FAST)
        stack = Stack(env, root)
        yield stack
        stack.stop()


@pytest.fixture
def sched(scheduling_session: Stack, fake_llm: FakeLLM, database_url: str) -> Stack:
    """The shared scheduling worker, clean: empty tables and queues, default fake LLM, no files."""
    stack = scheduling_session
    clean_db(database_url)
    clean_redis(stack.env["NANOFLEET_REDIS_URL"])
    fake_llm.reset()
    for name in ("executions.log", "HEARTBEAT.md"):
        (stack.workspace / name).unlink(missing_ok=True)
    if not any(p.alive() for p in stack.procs):
        stack.worker(concurrency=16)
    return stack


@pytest.fixture
def core(make_stack: Callable[..., Stack]) -> Callable[..., tuple[Stack, Runtime, BeatMirror]]:
    """A stack without processes, its runtime in this process, and its beat mirror."""

    def factory(**extra: str) -> tuple[Stack, Runtime, BeatMirror]:
        stack = make_stack(**{**FAST, **extra})
        return stack, core_runtime(stack.settings), BeatMirror(beat_app(stack.settings))

    return factory
