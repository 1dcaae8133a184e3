"""Alembic environment: the URL comes from the caller's config, the metadata from shared.models.

Online, the application keeps serving while migrations run (compose migrates on every `up -d`, next
to the old containers). DDL that waits for a lock queues every later query on its table behind
it, so each statement waits at most `lock_timeout` for a lock; the run is tried again a few times,
then stops with MigrationBlocked. Each migration commits on its own and index builds run
CONCURRENTLY, outside a transaction, so a later try starts where the last one stopped."""

from __future__ import annotations

import textwrap
import time

from alembic import context
from psycopg.errors import LockNotAvailable
from sqlalchemy import Connection, create_engine, pool, text
from sqlalchemy.exc import OperationalError
from sqlmodel import SQLModel

import shared.models  # noqa: F401  (registers the tables)
from shared.migrate import MigrationBlocked

MIGRATION_LOCK = 727272  # advisory lock key: one migrator at a time
LOCK_TIMEOUT = 5.0  # seconds a statement may wait for a lock; the application's queries wait behind it
TRIES = 4
PAUSE = 2.0  # seconds between tries: the queries that queued behind the last one get through
POLL = 1.0  # seconds between looks at the migration lock while another migrator holds it
APPLICATION_NAME = "nanofleet migrate"  # how pg_stat_activity shows a migrator

INVALID_INDEXES = text("select c.relname from pg_index i join pg_class c on c.oid = i.indexrelid "
                       "where not i.indisvalid and c.relnamespace = current_schema()::regnamespace")
OLDEST_TRANSACTION = text(
    "select pid, state, extract(epoch from now() - xact_start)::int as age, "
    "left(regexp_replace(query, '\\s+', ' ', 'g'), 80) as query from pg_stat_activity "
    "where datname = current_database() and backend_type = 'client backend' and pid <> pg_backend_pid() "
    "and xact_start is not null order by xact_start limit 1")

config = context.config
_url = config.get_main_option("sqlalchemy.url")
if not _url:
    raise RuntimeError("sqlalchemy.url must be set by the caller (shared.migrate)")
url: str = _url
# Tests pass shorter ones through Config.attributes.
lock_timeout: float = config.attributes.get("lock_timeout", LOCK_TIMEOUT)
tries: int = config.attributes.get("tries", TRIES)
pause: float = config.attributes.get("pause", PAUSE)


def run_migrations_offline() -> None:
    context.configure(url=url, target_metadata=SQLModel.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(url, poolclass=pool.NullPool, connect_args={"application_name": APPLICATION_NAME})
    with engine.connect() as connection:
        _take_migration_lock(connection)
        try:
            connection.exec_driver_sql(f"set lock_timeout = '{round(lock_timeout * 1000)}ms'")
            connection.commit()  # alembic must find no transaction open, or it runs every migration in it
            context.configure(connection=connection, target_metadata=SQLModel.metadata,
                              transaction_per_migration=True)
            _migrate(connection)
        finally:
            connection.rollback()
            connection.exec_driver_sql(f"select pg_advisory_unlock({MIGRATION_LOCK})")
            connection.commit()
    engine.dispose()


def _take_migration_lock(connection: Connection) -> None:
    """A session lock, so it outlives each migration's commit. Polled, not waited for: a migrator
    waiting inside a statement holds a snapshot, which the other's CREATE INDEX CONCURRENTLY waits
    for while that one holds the lock this one waits for (a deadlock)."""
    while not connection.exec_driver_sql(f"select pg_try_advisory_lock({MIGRATION_LOCK})").scalar():
        connection.commit()
        time.sleep(POLL)
    connection.commit()


def _migrate(connection: Connection) -> None:
    """Run the pending migrations. A lock timeout rolls back only the migration it hit; those
    before it are committed, so the next try starts there."""
    for attempt in range(1, tries + 1):
        try:
            _drop_failed_index_builds(connection)
            context.run_migrations()
            return
        except OperationalError as err:
            connection.rollback()
            if not isinstance(err.orig, LockNotAvailable):
                raise
            if attempt == tries:
                raise _blocked(connection, err) from err
        time.sleep(pause)


def _drop_failed_index_builds(connection: Connection) -> None:
    """A CREATE INDEX CONCURRENTLY that failed (a lock timeout, a cancel) leaves its index behind,
    INVALID: no query uses it, every write still updates it, and the retried build's IF NOT EXISTS
    would keep it. With the migration lock held, an invalid index the models declare is such a
    leftover, not a build in progress, so it goes and the migration builds it again."""
    declared = {index.name for table in SQLModel.metadata.tables.values() for index in table.indexes}
    leftovers = [name for name in connection.execute(INVALID_INDEXES).scalars() if name in declared]
    connection.commit()
    if not leftovers:
        return
    quote = connection.dialect.identifier_preparer.quote
    with context.get_context().autocommit_block():
        for name in leftovers:
            connection.exec_driver_sql(f"drop index concurrently if exists {quote(name)}")


def _blocked(connection: Connection, err: OperationalError) -> MigrationBlocked:
    """What stopped: the statement, where the database stays, and the likeliest holder (the lock's
    holder is gone from pg_locks once the wait is over, so the oldest open transaction)."""
    revision = context.get_context().get_current_revision()
    oldest = connection.execute(OLDEST_TRANSACTION).mappings().first()
    connection.rollback()
    holder = "it has ended since" if oldest is None else (
        f"oldest open: pid {oldest['pid']}, {oldest['state']} for {oldest['age']}s, {oldest['query']}")
    statement = textwrap.shorten(str(err.statement), width=100, placeholder=" ...")
    return MigrationBlocked(revision=revision, statement=statement, tries=tries, lock_timeout=lock_timeout,
                            holder=holder)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
