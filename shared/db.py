"""Database engine and sessions (SQLModel on psycopg 3)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, TypeVar

import psycopg
from sqlalchemy import Connection, Dialect, Engine, Table, Update, bindparam, create_engine, event, insert, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import ConnectionPoolEntry, NullPool
from sqlalchemy.sql.selectable import ExecutableReturnsRows
from sqlmodel import Session, SQLModel, select

from shared.settings import DatabaseSettings

M = TypeVar("M", bound=SQLModel)

IDLE_PING = 1.0  # seconds a pooled connection may sit unused before it is pinged on checkout
CONNECT_TIMEOUT = 10  # seconds; libpq waits as long as the network does (a host that drops packets)
APP_NAME = "nanofleet"  # what pg_stat_activity shows for a process that did not say its role (configure)
# Seconds a transaction may sit open with nothing to do before Postgres ends it and its session. Only
# a process that froze (SIGSTOP, a paused VM or container) or lost its network mid-transaction does:
# nanofleet's transactions are short, none open across a model call or a tool. Its row locks
# held every other worker's steps on those rows, a thread each, until all were stuck.
IDLE_IN_TRANSACTION = 60
# Seconds a statement may wait for a lock, then fails (as the database being unavailable: its task is
# tried again). Without it, a frozen process's other connections queued on a lock it held took the
# lock in turn when its holder was ended, and each held it for IDLE_IN_TRANSACTION more.
LOCK_TIMEOUT = 30


@dataclass(frozen=True)
class Pooling:
    """How this process's engines pool connections, and the application_name they give Postgres."""

    pool_size: int = DatabaseSettings().pool_size
    max_overflow: int = DatabaseSettings().max_overflow
    application_name: str = APP_NAME


_pooling = Pooling()


def configure(database: DatabaseSettings, *, role: str) -> None:
    """Set this process's pool sizes (NANOFLEET_DATABASE__*) and its role, shown as application_name
    `nanofleet-<role>` in pg_stat_activity (gateway, worker, beat, cli). Called once at a process's
    start, before its first get_engine: an engine made before keeps what it had."""
    global _pooling
    wanted = Pooling(database.pool_size, database.max_overflow, f"{APP_NAME}-{role}")
    if wanted != _pooling:
        _pooling = wanted
        get_engine.cache_clear()


def connect_args(url: str) -> dict[str, Any]:
    """libpq's connection options for `url`: a connect timeout and this process's application_name,
    unless the URL gives its own."""
    given = make_url(url).query
    defaults = {"connect_timeout": CONNECT_TIMEOUT, "application_name": _pooling.application_name}
    return {name: value for name, value in defaults.items() if name not in given}


async def async_connect(url: str) -> psycopg.AsyncConnection[tuple[Any, ...]]:
    """A plain psycopg connection in autocommit, for a statement that is its own transaction on an
    event loop (SQLAlchemy's async layer costs more Python than the statement), with the options
    of get_engine's connections."""
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    return await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **connect_args(url))


@lru_cache(maxsize=8)
def get_engine(url: str, pool_size: int | None = None) -> Engine:
    """One pooled engine per URL and process, of the configured size (configure) unless `pool_size`
    says otherwise. A connection idle for IDLE_PING seconds is pinged
    before use and replaced if the server went away (a restart); a busy one is not, because a
    step opens several sessions and a ping is a round trip each. A connection lost mid-use fails
    that statement, SQLAlchemy drops every connection opened before it, and the task is retried
    (workers/base.py)."""
    engine = create_engine(url, pool_size=pool_size or _pooling.pool_size, max_overflow=_pooling.max_overflow,
                           pool_recycle=1800,
                           pool_use_lifo=True,  # the warm connection first; idle ones age and are pinged
                           connect_args=connect_args(url))
    event.listen(engine, "connect", _end_idle_transactions)
    event.listen(engine, "checkin", _checked_in)
    event.listen(engine, "checkout", partial(_ping_if_idle, engine.dialect))
    return engine


def _end_idle_transactions(dbapi: Any, _record: ConnectionPoolEntry) -> None:
    """IDLE_IN_TRANSACTION and LOCK_TIMEOUT, set as statements, not as startup options, which a
    connection pooler (PgBouncer) may refuse; committed, as a SET in a transaction rolled back is undone."""
    with dbapi.cursor() as cursor:
        cursor.execute(f"set idle_in_transaction_session_timeout = {int(IDLE_IN_TRANSACTION * 1000)}")
        cursor.execute(f"set lock_timeout = {int(LOCK_TIMEOUT * 1000)}")
    dbapi.commit()


def _checked_in(_dbapi: Any, record: ConnectionPoolEntry) -> None:
    record.info["idle_since"] = time.monotonic()


def _ping_if_idle(dialect: Dialect, dbapi: Any, record: ConnectionPoolEntry, _proxy: Any) -> None:
    since = record.info.get("idle_since")
    if since is None or time.monotonic() - since < IDLE_PING:
        return
    try:
        dialect.do_ping(dbapi)
    except Exception as err:
        raise DisconnectionError(f"stale connection: {err}") from err  # the pool tries a fresh one


NO_DATABASE = re.compile(r'database ".*" does not exist')  # libpq's reason when connecting to one that is not there


# What the database unreachable or busy raises: through SQLAlchemy, or from psycopg itself (the
# gateway's ledger writer: async_connect)
UNAVAILABLE = (OperationalError, InterfaceError, PoolTimeout, psycopg.OperationalError, psycopg.InterfaceError)


def unavailable(err: BaseException) -> bool:
    """Whether `err` says the database could not be reached, or had no connection free (another
    try may well succeed), rather than that the statement was wrong."""
    return isinstance(err, UNAVAILABLE) or (
        isinstance(err, DBAPIError) and err.connection_invalidated)


def table_of(model: type[SQLModel]) -> Table:
    """A model's table, for Core statements on the hot path (no ORM bulk-statement machinery)."""
    table: Table = model.__table__  # type: ignore[attr-defined]
    return table


def returning_row(model: type[M], statement: Update) -> ExecutableReturnsRows:
    """An UPDATE on `model`'s table that loads the row it changed into the session: built once (with
    bind parameters), run with `updated_row`. Several times cheaper than the ORM's own UPDATE ...
    RETURNING, which matters on the hot path."""
    return select(model).from_statement(statement.returning(*table_of(model).c))


class Inserting:
    """An INSERT of rows of `model`, built once, of every column but the `generated` ones (the
    identity, a sequence's default): a hot path's writes without the unit of work, which costs about
    three times the INSERT (in-process, 0.5 against 0.18 ms a message). Rows go in at once, in order,
    and stay out of the session. A JSON column's None is SQL NULL, as the ORM writes it."""

    def __init__(self, model: type[SQLModel], *, generated: tuple[str, ...] = ("id",)) -> None:
        columns = [c for c in table_of(model).c if c.name not in generated]
        self.generated = set(generated)
        self.statement = insert(table_of(model)).values({
            c.name: bindparam(c.name, type_=JSONB(none_as_null=True)) if isinstance(c.type, JSONB)
            else bindparam(c.name) for c in columns})

    def __call__(self, s: Session, *rows: SQLModel) -> None:
        for row in rows:
            s.execute(self.statement, row.model_dump(exclude=self.generated))


def updated_row(s: Session, query: ExecutableReturnsRows, params: dict[str, Any]) -> Any:
    """The row `query` (a `returning_row`) changed, or None when none matched."""
    return s.execute(query, params).scalars().one_or_none()


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    with Session(get_engine(url), expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


UNIQUE_VIOLATION = "23505"  # CREATE DATABASE beside another one: pg_database's unique name index
INSUFFICIENT_PRIVILEGE = "42501"
LOCK_NOT_AVAILABLE = "55P03"  # a lock not had within lock_timeout


class DatabaseRefused(Exception):
    """Postgres refused what setting up nanofleet's database needs, for a reason only its operator can
    fix (a privilege, another application's tables): said in a line, not a traceback. `reason` is the
    database's own message (its first line: the rest is detail, and none of it holds the password)."""

    def __init__(self, *, url: str, reason: str, advice: str) -> None:
        super().__init__(url, reason, advice)
        self.url, self.reason, self.advice = url, reason, advice

    def __str__(self) -> str:
        return f"{self.reason}: {self.advice}"


def sqlstate(err: DBAPIError) -> str | None:
    """The SQLSTATE of what the database raised, None when it raised none (a lost connection)."""
    return getattr(err.orig, "sqlstate", None)


def first_line(err: DBAPIError) -> str:
    """The database's own message for `err`, without its DETAIL and HINT lines."""
    return (str(err.orig).strip().splitlines() or [type(err.orig).__name__])[0]


def ensure_database(url: str) -> bool:
    """Create the database named in url if it does not exist; True when created. A database that
    answers is not looked up in the `postgres` one: a managed server's role, or a pooler, may not
    be let into that."""
    target = make_url(url)
    probe = create_engine(target, poolclass=NullPool, connect_args=connect_args(url))
    try:
        with probe.connect():
            return False
    except OperationalError as err:
        if not NO_DATABASE.search(str(err.orig)):
            raise
    finally:
        probe.dispose()
    admin = create_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT",
                          connect_args=connect_args(url))
    try:
        with admin.connect() as conn:
            exists = conn.execute(
                text("select 1 from pg_database where datname = :n"), {"n": target.database}
            ).scalar()
            if exists:
                return False
            return _create(conn, url=url, name=str(target.database))
    finally:
        admin.dispose()


def _create(conn: Connection, *, url: str, name: str) -> bool:
    """CREATE DATABASE `name`; False when another migrate created it meanwhile (theirs, then)."""
    try:
        conn.execute(text(f'create database "{name}"'))
    except IntegrityError as err:
        if sqlstate(err) != UNIQUE_VIOLATION:
            raise
        return False
    except DBAPIError as err:
        if sqlstate(err) != INSUFFICIENT_PRIVILEGE:
            raise
        raise DatabaseRefused(url=url, reason=first_line(err), advice=(
            f"grant the role CREATEDB, or create the database {name} yourself (owned by the role)")) from None
    return True
