"""A command that cannot reach Postgres or Redis says which, where (password masked), why and what
to set, in a line or two and without a traceback; `up` checks both before it starts anything. The
gateway, a worker and beat refuse a database that is not at this code's revision the same way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from gateway.status import masked
from shared.migrate import current
from tests.fakes.server import free_port
from tests.support.databases import NEWER, STATES, database_in, reason
from tests.support.processes import ROOT
from tests.support.stack import make_env

SECRET = "s3cret-pw"


def _env(tmp_path: Path, *, database_url: str, redis_url: str) -> dict[str, str]:
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    return make_env(database_url=database_url, redis_url=redis_url, llm_url="http://127.0.0.1:1",
                    workspace=workspace)


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def _closed_url(scheme: str, path: str) -> str:
    return f"{scheme}://nanofleet:{SECRET}@127.0.0.1:{free_port()}/{path}"


def _assert_explained(done: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and SECRET not in done.stderr + done.stdout
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr
    for text in expected:
        assert text in done.stderr, done.stderr


@pytest.mark.parametrize("args", [["migrate"], ["agent", "-m", "hello"], ["cron", "list"],
                                  ["up", "--port", str(free_port())]], ids=["migrate", "agent", "cron", "up"])
def test_an_unreachable_database_is_named_with_the_reason(args: list[str], redis_server: str,
                                                          tmp_path: Path) -> None:
    url = _closed_url("postgresql+psycopg", "nanofleet")
    done = _run(_env(tmp_path, database_url=url, redis_url=f"{redis_server}/0"), *args)
    _assert_explained(done, f"nanofleet: PostgreSQL at {masked(url)}: Connection refused",
                      "(check NANOFLEET_DATABASE_URL)")
    assert "up at" not in done.stdout


def test_a_role_that_does_not_exist_is_named(database_url: str, tmp_path: Path) -> None:
    url = make_url(database_url).set(username="no_such_role", password=None).render_as_string(hide_password=False)
    done = _run(_env(tmp_path, database_url=url, redis_url="redis://127.0.0.1:1/0"), "migrate")
    _assert_explained(done, 'role "no_such_role" does not exist', "NANOFLEET_DATABASE_URL")


def test_up_checks_redis_before_it_starts_anything(database_url: str, tmp_path: Path) -> None:
    url = _closed_url("redis", "9")
    done = _run(_env(tmp_path, database_url=database_url, redis_url=url), "up", "--port", str(free_port()))
    _assert_explained(done, f"nanofleet: Redis at {masked(url)}: Connection refused", "(check NANOFLEET_REDIS_URL)")
    assert "up at" not in done.stdout and "starting" not in done.stdout


def test_status_names_redis_url_and_reason(database_url: str, tmp_path: Path) -> None:
    url = _closed_url("redis", "9")
    done = _run(_env(tmp_path, database_url=database_url, redis_url=url), "status")
    assert done.returncode == 1
    assert "database   ok" in done.stdout
    assert f"redis      DOWN: {masked(url)}: Connection refused (check NANOFLEET_REDIS_URL)" in done.stdout
    assert SECRET not in done.stdout


CLOSED_REDIS = "redis://127.0.0.1:1/0"  # a refusal must come before Redis is needed


@pytest.mark.parametrize("state", [s for s in STATES if s != "ahead"])  # a newer one's: a rolling upgrade
def test_a_worker_refuses_a_database_not_at_this_codes_revision(state: str, tmp_path: Path) -> None:
    with database_in(state) as url:
        done = _run(_env(tmp_path, database_url=url, redis_url=CLOSED_REDIS), "worker")
    _assert_explained(done, f"nanofleet: the database at {masked(url)} {reason(state)}")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("command", [["gateway", "--port", "0"], ["beat"]], ids=["gateway", "beat"])
def test_the_gateway_and_beat_refuse_a_database_behind(command: list[str], tmp_path: Path) -> None:
    with database_in("behind") as url:
        done = _run(_env(tmp_path, database_url=url, redis_url=CLOSED_REDIS), *command)
    _assert_explained(done, f"nanofleet: the database at {masked(url)} {reason('behind')}")


@pytest.mark.parametrize("args", [["up", "--port", str(free_port())], ["agent", "-m", "hello"]], ids=["up", "agent"])
def test_a_database_a_newer_nanofleet_migrated_is_left_alone(args: list[str], redis_server: str,
                                                             tmp_path: Path) -> None:
    with database_in("ahead") as url:
        done = _run(_env(tmp_path, database_url=url, redis_url=f"{redis_server}/0"), *args)
    _assert_explained(done, f"nanofleet: the database at {masked(url)} {reason('ahead')}")
    assert "up at" not in done.stdout


def test_migrate_leaves_a_database_a_newer_nanofleet_migrated_and_succeeds(tmp_path: Path) -> None:
    """A rollback to an older image: compose starts the app only after `migrate` succeeds."""
    with database_in("ahead") as url:
        done = _run(_env(tmp_path, database_url=url, redis_url=CLOSED_REDIS), "migrate")
        assert done.returncode == 0, done.stderr
        assert done.stderr.strip() == (f"nanofleet: the database at {masked(url)} is at revision {NEWER}, which a "
                                       "newer nanofleet migrated: left as it is (this version serves it, as in a "
                                       "rollback)")
        assert current(url) == NEWER


def test_status_names_a_database_behind(tmp_path: Path) -> None:
    with database_in("behind") as url:
        done = _run(_env(tmp_path, database_url=url, redis_url=CLOSED_REDIS), "status")
    assert done.returncode == 1
    assert f"database   NOT READY: {reason('behind')}" in done.stdout, done.stdout


def test_masked_hides_only_the_password() -> None:
    assert masked(f"redis://:{SECRET}@host:6379/1") == "redis://:***@host:6379/1"
    assert masked(f"postgresql+psycopg://me:{SECRET}@db:5432/x") == "postgresql+psycopg://me:***@db:5432/x"
    assert masked("redis://host:6379/0") == "redis://host:6379/0"
    assert masked(f"postgresql://db/x?sslmode=require&password={SECRET}&PASSWORD={SECRET}") == (
        "postgresql://db/x?sslmode=require&password=***&PASSWORD=***")
    assert masked(f"postgresql://me@db/x?sslpassword={SECRET}&application_name=nf") == (
        "postgresql://me@db/x?sslpassword=***&application_name=nf")


@pytest.mark.parametrize("args", [["gateway", "--port", "99999"], ["up", "--port", "65536"],
                                  ["gateway", "--port", "-1"], ["worker", "--concurrency", "0"],
                                  ["worker", "--concurrency", "100000"]],
                         ids=["gateway", "up", "negative", "concurrency", "concurrency-typo"])
def test_a_port_or_count_out_of_range_is_refused_before_anything_starts(args: list[str], tmp_path: Path) -> None:
    """`--port 99999` was taken modulo 65536 by the resolver: the gateway listened on 34463 and said 99999."""
    done = _run(_env(tmp_path, database_url=_closed_url("postgresql+psycopg", "nanofleet"),
                     redis_url=_closed_url("redis", "0")), *args)
    assert done.returncode == 2 and "Invalid value for '--" in done.stderr, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "up at" not in done.stdout


def test_migrate_says_when_it_created_the_database(tmp_path: Path) -> None:
    """It said only "database at revision 0008" (helper's walkthrough); a second run creates nothing."""
    with database_in("missing") as url:
        env = _env(tmp_path, database_url=url, redis_url=CLOSED_REDIS)
        first, again = _run(env, "migrate"), _run(env, "migrate")
    assert first.returncode == 0 and again.returncode == 0, (first.stderr, again.stderr)
    assert first.stdout.splitlines()[0] == f"created the database at {masked(url)}"
    assert "created" not in again.stdout and "database at revision" in again.stdout


@pytest.mark.parametrize("args", [["migrate"], ["status"], ["cron", "list"]])
def test_commands_without_a_tool_registry_name_a_misspelt_setting(args: list[str], database_url: str,
                                                                   redis_server: str, tmp_path: Path) -> None:
    """The gateway, workers and `agent` warned of NANOFLEET_LLM__MODLE; migrate, status, cron (and beat) did not."""
    env = {**_env(tmp_path, database_url=database_url, redis_url=redis_server), "NANOFLEET_LLM__MODLE": "x/y"}
    done = _run(env, *args)
    assert "NANOFLEET_LLM__MODLE is not a nanofleet setting, so it is ignored: did you mean NANOFLEET_LLM__MODEL?" \
        in done.stderr, (done.returncode, done.stderr)
    assert "x/y" not in done.stderr  # names, never values
