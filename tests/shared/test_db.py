"""The connection pool: a connection the server dropped while it sat idle is replaced unseen; which
errors say the database is unavailable, rather than that a statement was wrong."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import create_engine, exc, text
from sqlalchemy.engine import make_url

from shared import db
from shared.settings import DatabaseSettings
from tests.support.processes import wait_until


def test_a_connection_dropped_while_idle_is_replaced_before_use(database_url: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db, "IDLE_PING", 0.0)  # every checkout counts as idle
    engine = db.get_engine(database_url, pool_size=1)
    with engine.connect() as conn:
        first = conn.execute(text("select pg_backend_pid()")).scalar_one()
    admin = create_engine(make_url(database_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:  # as a database restart would
        assert conn.execute(text("select pg_terminate_backend(:p)"), {"p": first}).scalar_one()
    admin.dispose()
    with engine.connect() as conn:
        assert conn.execute(text("select pg_backend_pid()")).scalar_one() != first
    engine.dispose()


def test_a_transaction_its_process_left_open_is_ended_with_its_locks(database_url: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker frozen mid-transaction (SIGSTOP, a paused VM) held its row locks for as long as it
    stayed frozen, and every other worker's steps on those rows waited with it, a thread each."""
    monkeypatch.setattr(db, "IDLE_IN_TRANSACTION", 0.5)
    engine = db.get_engine(database_url, pool_size=2)  # an engine of its own: made with the setting
    other = create_engine(database_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as frozen:
            frozen.execute(text("select pg_advisory_xact_lock(4242)"))  # held until its transaction ends

            def free() -> bool:
                with other.connect() as conn:
                    return bool(conn.execute(text("select pg_try_advisory_lock(4242)")).scalar_one())

            wait_until(free, timeout=30, message="the frozen transaction's lock to be let go")
            with pytest.raises(exc.DBAPIError) as ended:
                frozen.execute(text("select 1"))  # its session was ended: once awake, its task is tried again
            assert db.unavailable(ended.value), ended.value
    finally:
        engine.dispose()
        other.dispose()
        db.get_engine.cache_clear()


def test_a_statement_waits_for_a_lock_only_so_long(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Queued behind a frozen process's lock, a statement would take the lock when its holder was
    ended, and hold it for as long again: it gives up instead, and its task is tried again."""
    monkeypatch.setattr(db, "LOCK_TIMEOUT", 0.3)
    engine = db.get_engine(database_url, pool_size=3)  # an engine of its own: made with the setting
    other = create_engine(database_url)
    try:
        with other.connect() as holder:
            holder.execute(text("select pg_advisory_xact_lock(4343)"))
            with pytest.raises(exc.DBAPIError) as waited, engine.connect() as conn:
                conn.execute(text("select pg_advisory_xact_lock(4343)"))
            assert db.unavailable(waited.value) and "lock timeout" in str(waited.value)
    finally:
        engine.dispose()
        other.dispose()
        db.get_engine.cache_clear()


def test_what_counts_as_the_database_being_unavailable(database_url: str) -> None:
    """Another try may succeed: the server unreachable, or no pooled connection free in time (a
    worker's threads hold them all). Not: a statement the server refused."""
    def error_of(engine: Any, sql: str = "select 1") -> BaseException:
        with pytest.raises(exc.SQLAlchemyError) as err, engine.connect() as conn:
            conn.execute(text(sql))
        return err.value

    busy = create_engine(database_url, pool_size=1, max_overflow=0, pool_timeout=0.1)
    with busy.connect():
        assert db.unavailable(error_of(busy))  # sqlalchemy.exc.TimeoutError
    assert db.unavailable(error_of(create_engine(make_url(database_url).set(port=1))))  # refused
    assert not db.unavailable(error_of(busy, "select no_such_column"))
    busy.dispose()


def test_a_database_that_answers_is_not_looked_up_in_the_postgres_one(
        database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A managed server's role, or a pooler, may not be let into the `postgres` database: `migrate`
    failed there with "permission denied for database postgres" (operator's review)."""
    opened: list[str | None] = []
    real = db.create_engine

    def recording(url: Any, **kw: Any) -> Any:
        opened.append(make_url(url).database)
        return real(url, **kw)

    monkeypatch.setattr(db, "create_engine", recording)
    assert db.ensure_database(database_url) is False
    assert "postgres" not in opened
    missing = make_url(database_url).set(database=f"nanofleet_new_{uuid.uuid4().hex[:8]}")
    try:
        assert db.ensure_database(missing.render_as_string(hide_password=False)) is True
        assert "postgres" in opened  # created from there
    finally:
        admin = real(make_url(database_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'drop database if exists "{missing.database}"'))
        admin.dispose()


def test_databases_created_side_by_side_are_each_created_once_without_an_error(database_url: str) -> None:
    """Two or three `nanofleet migrate` at once on a database that is not there yet: the ones that lost
    the race to CREATE DATABASE failed with a UniqueViolation traceback, about half of them."""
    names = [f"nanofleet_race_{uuid.uuid4().hex[:8]}" for _ in range(4)]
    urls = [make_url(database_url).set(database=name).render_as_string(hide_password=False) for name in names]
    try:
        with ThreadPoolExecutor(8) as pool:
            created = list(pool.map(db.ensure_database, [u for u in urls for _ in range(2)]))
        assert sum(created) == len(names)  # each by one of the two, the other found it there
    finally:
        admin = db.create_engine(make_url(database_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            for name in names:
                conn.execute(text(f'drop database if exists "{name}"'))
        admin.dispose()


@pytest.fixture
def own_pooling() -> Any:
    """This test may configure the process's pool; the next test gets the pooling there was."""
    saved = db._pooling
    yield
    db._pooling = saved
    db.get_engine.cache_clear()


def _app_name(engine: Any) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("select application_name from pg_stat_activity where pid = pg_backend_pid()"))
                   .scalar_one())


def test_the_pool_is_sized_by_the_settings_and_says_the_processs_role(database_url: str, own_pooling: Any) -> None:
    db.configure(DatabaseSettings(pool_size=3, max_overflow=2), role="worker")
    engine = db.get_engine(database_url)
    assert (engine.pool.size(), engine.pool._max_overflow) == (3, 2)  # type: ignore[attr-defined]
    assert _app_name(engine) == "nanofleet-worker"
    assert db.get_engine(database_url, pool_size=1).pool.size() == 1  # the lease renewer's own
    db.configure(DatabaseSettings(), role="beat")
    assert _app_name(db.get_engine(database_url)) == "nanofleet-beat"
    named = make_url(database_url).update_query_dict({"application_name": "mine"}).render_as_string(
        hide_password=False)
    assert _app_name(db.get_engine(named)) == "mine"  # the URL's own wins
