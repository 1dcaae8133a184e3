"""`nanofleet worker` and `beat`: a worker refuses what it was not built for, naming what it takes,
before starting Celery; a standby beat says it waits; help shows no types for flags."""

from __future__ import annotations

import os

import pytest
import redis
from typer.testing import CliRunner

from gateway import cli
from gateway.cli import app
from shared.constants import REDBEAT_PREFIX
from shared.settings import get_settings
from tests.support.processes import wait_until
from tests.support.stack import Stack


@pytest.mark.parametrize(("args", "named"), [
    (["--pool", "gevent"], "unknown pool 'gevent'; known: threads, prefork, solo"),
    (["--queues", "agent,nope"], "unknown queue(s) nope"),
    (["--queues", "agent, nope "], "unknown queue(s) nope;"),
])
def test_worker_refuses_an_unknown_pool_or_queue(args: list[str], named: str) -> None:
    result = CliRunner().invoke(app, ["worker", *args])
    assert result.exit_code == 2 and named in result.output


def test_worker_takes_queue_names_with_spaces(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[list[str]] = []
    monkeypatch.setattr(cli.os, "execvp", lambda _file, argv: started.append(argv))
    result = CliRunner().invoke(app, ["worker", "--queues", "agent, tools"])
    assert result.exit_code == 0, result.output
    [argv] = started
    assert argv[argv.index("-Q") + 1] == "agent,tools"


@pytest.mark.parametrize("command", [["up"], ["worker"], ["cron", "add"]])
def test_help_shows_no_type_for_flags(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    assert "<bool>" not in result.output and "--help" in result.output


def test_a_standby_beat_says_it_waits_for_the_lock(make_stack) -> None:  # type: ignore[no-untyped-def]
    s: Stack = make_stack()
    first = s.beat()
    client = redis.Redis.from_url(s.settings.redis_url)
    wait_until(lambda: not first.alive() or client.exists(f"{REDBEAT_PREFIX}:lock"), timeout=60,
               message="the first beat to take the lock")
    assert first.alive(), first.log()
    saved = dict(os.environ)
    os.environ.update(s.env)
    get_settings.cache_clear()
    started: list[list[str]] = []
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(cli.os, "execvp", lambda _file, argv: started.append(argv))
            result = CliRunner().invoke(app, ["beat"])
    finally:
        os.environ.clear()
        os.environ.update(saved)
        get_settings.cache_clear()
    assert result.exit_code == 0 and started, result.output
    assert f"another beat holds the lock {REDBEAT_PREFIX}:lock; this one waits for it" in result.output
