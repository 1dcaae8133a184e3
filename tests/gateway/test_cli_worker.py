"""`nanofleet worker` and `beat`: a worker refuses what it was not built for, naming what it takes,
before starting Celery; each worker has a node name of its own; a standby beat says it waits; help
shows no types for flags; on a database at this code's revision the gateway, a worker and beat start
(tests/gateway/test_cli_errors.py has the refusals)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import uvicorn
from typer.testing import CliRunner

from gateway import cli
from gateway.cli import app
from shared.constants import BEAT_ALIVE_FILE, REDBEAT_PREFIX
from shared.queueing import make_celery
from shared.settings import get_settings
from tests.fakes.server import free_port
from tests.support import services
from tests.support.processes import Proc, wait_until
from tests.support.stack import Stack


@pytest.mark.parametrize(("args", "named"), [
    (["--pool", "gevent"], "unknown pool 'gevent'; known: threads, prefork, solo"),
    (["--queues", "agent,nope"], "unknown queue(s) nope"),
    (["--queues", "agent, nope "], "unknown queue(s) nope;"),
])
def test_worker_refuses_an_unknown_pool_or_queue(args: list[str], named: str) -> None:
    result = CliRunner().invoke(app, ["worker", *args])
    assert result.exit_code == 2 and named in result.output


@pytest.fixture
def migrated(monkeypatch: pytest.MonkeyPatch, database_url: str) -> Iterator[list[list[str]]]:
    """The CLI's settings name the tests' database (at this code's revision) and a closed Redis;
    yields the command lines the CLI would have run (Celery's, or ["uvicorn"])."""
    monkeypatch.setenv("NANOFLEET_DATABASE_URL", database_url)
    monkeypatch.setenv("NANOFLEET_REDIS_URL", "redis://127.0.0.1:1/0")
    started: list[list[str]] = []
    monkeypatch.setattr(cli.os, "execvp", lambda _file, argv: started.append(argv))
    monkeypatch.setattr(uvicorn, "run", lambda *_a, **_kw: started.append(["uvicorn"]))
    get_settings.cache_clear()
    yield started
    get_settings.cache_clear()


@pytest.mark.parametrize("command", [["gateway", "--port", "0"], ["worker"], ["beat"]], ids=lambda c: c[0])
def test_at_this_codes_revision_the_processes_start(command: list[str], migrated: list[list[str]], redis_server: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with services.claimed_redis_dbs(redis_server, 1) as (db,):
        if command == ["beat"]:  # beat waits for Redis (test_a_beat_started_while_redis_is_down_waits_for_it)
            monkeypatch.setenv("NANOFLEET_REDIS_URL", f"{redis_server}/{db}")
            get_settings.cache_clear()
        result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output
    assert len(migrated) == 1 and result.output == ""


def test_beat_on_a_redis_database_that_does_not_exist_says_so_in_a_line(migrated: list[list[str]], redis_server: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Redis error other than a refused password or no answer (no such database number, no Redis at
    that port) escaped as a traceback."""
    monkeypatch.setenv("NANOFLEET_REDIS_URL", f"{redis_server}/99")
    get_settings.cache_clear()
    result = CliRunner().invoke(app, ["beat"])
    assert result.exit_code == 1 and not migrated
    assert "refused beat: DB index is out of range (check NANOFLEET_REDIS_URL)" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_worker_takes_queue_names_with_spaces(migrated: list[list[str]]) -> None:
    result = CliRunner().invoke(app, ["worker", "--queues", "agent, tools"])
    assert result.exit_code == 0, result.output
    [argv] = migrated
    assert argv[argv.index("-Q") + 1] == "agent,tools"


def _node_name(argv: list[str]) -> str:
    return argv[argv.index("-n") + 1]


def test_each_worker_gets_a_node_name_of_its_own(migrated: list[list[str]]) -> None:
    """Two workers for the same queues on one host must not share a Celery node name (Flower,
    `celery inspect` and remote control would take them for one); the name still shows the queues."""
    for _ in range(2):
        assert CliRunner().invoke(app, ["worker", "--queues", "agent,tools"]).exit_code == 0
    first, second = (_node_name(argv) for argv in migrated)
    assert first != second
    for name in (first, second):
        assert name.startswith("nanofleet-agent-tools-") and name.endswith("@%h"), name


def test_a_worker_node_name_given_is_used_as_given(migrated: list[list[str]]) -> None:
    assert CliRunner().invoke(app, ["worker", "--hostname", "agents-1@box"]).exit_code == 0
    [argv] = migrated
    assert _node_name(argv) == "agents-1@box"


def test_two_workers_on_one_host_answer_as_two(make_stack) -> None:  # type: ignore[no-untyped-def]
    """`nanofleet worker` twice with the same queues, as one scales on one machine: both answer a
    ping, under different names (`nanofleet status` counts them from these replies)."""
    s: Stack = make_stack()
    argv = [sys.executable, "-m", "gateway.cli", "worker", "--queues", "scheduler", "--concurrency", "1"]
    procs = [Proc(argv, s.env, s.log_dir / f"cli-worker-{i}.log") for i in range(2)]
    s.procs.extend(procs)
    control = make_celery(s.settings).control

    names: list[str] = []

    def both_answer() -> bool:
        for proc in procs:
            assert proc.alive(), proc.log()[-3000:]
        names[:] = [name for reply in control.ping(timeout=0.5) or [] for name in reply]
        return len(names) >= 2

    wait_until(both_answer, timeout=60, message="both workers to answer a ping")
    assert len(set(names)) == 2, names


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


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_a_beat_started_while_redis_is_down_waits_for_it(make_stack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """celery beat exits at once without Redis; `nanofleet up` starts it again after an outage, and
    took the exits for a crash loop: it stopped everything (a 10 s Redis restart did)."""
    s: Stack = make_stack()
    port = free_port()
    env = {**s.env, "NANOFLEET_REDIS_URL": f"redis://127.0.0.1:{port}/0"}
    beat = Proc([sys.executable, "-m", "gateway.cli", "beat"], env, tmp_path / "beat.log")
    server: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: "beat waits for it" in beat.log(), timeout=30, message="beat to say it waits for Redis")
        assert beat.alive(), beat.log()
        server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=port)
        wait_until(lambda: client.exists(f"{REDBEAT_PREFIX}:lock"), timeout=60,
                   message="beat to start once Redis answers, and take its lock")
        assert beat.alive() and "Redis answers; beat starts" in beat.log(), beat.log()
    finally:
        beat.kill()
        if server is not None:
            server.kill()
            server.wait()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_a_beat_outlives_a_redis_restart_and_takes_its_lock_again(make_stack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Beat exited on the first tick Redis did not answer, and when Redis came back empty it had lost
    its lock: until something restarted it, stuck runs stayed stuck and cron did not fire."""
    s: Stack = make_stack()
    port = free_port()

    def redis_server() -> subprocess.Popen[bytes]:
        return subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    server = redis_server()
    client = redis.Redis(port=port)
    beat = Proc([sys.executable, "-m", "gateway.cli", "beat"], {**s.env, "NANOFLEET_REDIS_URL": f"redis://127.0.0.1:{port}/0"},
                tmp_path / "beat.log")
    try:
        alive = s.settings.data_dir / BEAT_ALIVE_FILE  # touched by its first tick, after its start-up's sends
        wait_until(lambda: client.exists(f"{REDBEAT_PREFIX}:lock") and alive.exists(), timeout=60,
                   message="beat to take its lock and tick")
        server.kill()
        server.wait()
        # It notices in a tick (which waits the outage out), or in a send that tick made (which retries)
        wait_until(lambda: "Redis does not answer" in beat.log() or "beat: Connection error" in beat.log()
                   or not beat.alive(), timeout=30, message="beat to notice")
        assert beat.alive(), beat.log()
        server = redis_server()  # back, empty: the lock and the schedule are gone
        wait_until(lambda: client.exists(f"{REDBEAT_PREFIX}:lock", f"{REDBEAT_PREFIX}nanofleet-sweep") == 2,
                   timeout=60, message="beat to take its lock again and write its schedule")
        assert beat.alive() and "taken again" in beat.log(), beat.log()
    finally:
        beat.kill()
        server.kill()
        server.wait()
