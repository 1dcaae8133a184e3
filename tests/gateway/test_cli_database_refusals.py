"""Postgres refusing what nanofleet's database needs (a privilege, a table name another application
took) is said in a line naming what to fix, not a traceback; another application's alembic database
(a revision nanofleet does not know, none of its tables) is refused everywhere, not served as a
newer nanofleet's."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from gateway.status import masked
from shared.db import get_engine
from shared.migrate import current, schema_problem, upgrade
from tests.gateway.test_cli_errors import CLOSED_REDIS, _assert_explained, _env, _run
from tests.support import services

SECRET = "s3cret-pw"  # trust auth ignores it; it must show nowhere
OTHER_REVISION = "ae1027a6acf"  # another application's alembic revision
READ_ONLY = "-c role=pg_read_all_data"  # a role with neither CREATEDB nor CREATE on schema public


def _url(name: str, *, options: str | None = None) -> str:
    base = make_url(services.postgres_url())
    url = base.set(database=name, password=base.password or SECRET)
    if options is not None:
        url = url.update_query_dict({"options": options})
    return url.render_as_string(hide_password=False)


@contextmanager
def own_database(*statements: str, create: bool = True) -> Iterator[str]:
    """A database name of this test's own (created when `create`, then `statements` run in it as its
    owner), dropped afterwards."""
    name = f"nanofleet_refused_{uuid.uuid4().hex[:8]}"
    admin = create_engine(make_url(services.postgres_url()).set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        if create:
            with admin.connect() as conn:
                conn.execute(text(f'create database "{name}"'))
            owner = create_engine(_url(name))
            with owner.begin() as conn:
                for statement in statements:
                    conn.execute(text(statement))
            owner.dispose()
        yield name
    finally:
        get_engine(_url(name)).dispose()
        with admin.connect() as conn:
            conn.execute(text(f'drop database if exists "{name}" with (force)'))
        admin.dispose()


@pytest.mark.parametrize("args", [["migrate"], ["agent", "-m", "hello"]], ids=["migrate", "agent"])
def test_a_role_that_may_not_create_the_missing_database_is_told_what_to_do(args: list[str], tmp_path: Path) -> None:
    with own_database(create=False) as name:
        url = _url(name, options=READ_ONLY)
        done = _run(_env(tmp_path, database_url=url, redis_url=CLOSED_REDIS), *args)
    _assert_explained(done, f"nanofleet: the database at {masked(url)}: permission denied to create database: "
                            f"grant the role CREATEDB, or create the database {name} yourself")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_role_that_may_not_create_tables_is_told_what_to_do(tmp_path: Path) -> None:
    with own_database() as name:
        url = _url(name, options=READ_ONLY)
        done = _run(_env(tmp_path, database_url=url, redis_url=CLOSED_REDIS), "migrate")
    _assert_explained(done, f"nanofleet: the database at {masked(url)}: permission denied for schema public: "
                            "grant the role CREATE on schema public, or migrate as the database's owner")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_table_of_another_application_with_one_of_nanofleets_names_is_named(tmp_path: Path) -> None:
    with own_database("create table messages (id int primary key, body text)") as name:
        url = _url(name)
        done = _run(_env(tmp_path, database_url=url, redis_url=CLOSED_REDIS), "migrate")
    _assert_explained(done, 'relation "messages" already exists: the database holds another application\'s tables')
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


ANOTHER_APP = ("create table alembic_version (version_num varchar(32) primary key)",
               f"insert into alembic_version values ('{OTHER_REVISION}')",
               "create table users (id int primary key)")


def test_another_applications_alembic_database_is_refused_everywhere(tmp_path: Path) -> None:
    """It was taken for a newer nanofleet's: migrate left it and succeeded, status said ok then
    failed with a traceback, /readyz was ready and the gateway served 500s."""
    said = (f"belongs to another application (alembic revision {OTHER_REVISION}, no nanofleet tables): "
            "point NANOFLEET_DATABASE_URL at a database of its own")
    with own_database(*ANOTHER_APP) as name:
        url = _url(name)
        env = _env(tmp_path, database_url=url, redis_url=CLOSED_REDIS)
        migrated, status, worker, gateway = (_run(env, *args) for args in (
            ["migrate"], ["status"], ["worker"], ["gateway", "--port", "0"]))
        ready = schema_problem(url)  # what /readyz reports
        assert current(url) == OTHER_REVISION  # left untouched
    for done in (migrated, worker, gateway):
        _assert_explained(done, f"nanofleet: the database at {masked(url)} {said}")
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert status.returncode == 1 and "Traceback" not in status.stderr, status.stderr
    assert f"database   NOT READY: {said}" in status.stdout, status.stdout
    assert ready == said


def test_a_newer_nanofleets_database_is_still_left_alone(tmp_path: Path) -> None:
    """The check above must not refuse a database a newer nanofleet migrated (a rollback)."""
    with own_database() as name:
        url = _url(name)
        upgrade(url)
        with get_engine(url).begin() as conn:
            conn.execute(text("update alembic_version set version_num = 'ffff'"))
        done = _run(_env(tmp_path, database_url=url, redis_url=CLOSED_REDIS), "migrate")
        assert schema_problem(url) is None
    assert done.returncode == 0, done.stderr
    assert "which a newer nanofleet migrated: left as it is" in done.stderr


def test_a_role_never_granted_the_tables_is_told_what_to_do(tmp_path: Path) -> None:
    """Migrated by the owner, run as an application role nobody granted the tables to: a traceback
    from `migrate` and `agent`, and every process started and failed each request."""
    role = f"nanofleet_no_access_{uuid.uuid4().hex[:8]}"
    admin = create_engine(make_url(services.postgres_url()).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'create role "{role}"'))
    try:
        with own_database() as name:
            upgrade(_url(name))
            url = _url(name, options=f"-c role={role}")
            env = _env(tmp_path, database_url=url, redis_url=CLOSED_REDIS)
            for args in (["migrate"], ["agent", "-m", "hello"], ["worker"]):
                _assert_explained(_run(env, *args), "permission denied for table alembic_version: grant the role "
                                                     "access to nanofleet's tables, or use the role that migrated them")
            assert "permission denied for table alembic_version" in (schema_problem(url) or "")
            get_engine(url).dispose()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'drop role if exists "{role}"'))
        admin.dispose()
