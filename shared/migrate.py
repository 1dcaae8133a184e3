"""Apply the Alembic migrations that ship with nanofleet; safe to run any number of times. Also says
whether a database is at the revision this code needs, for the commands that refuse one that is not."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, inspect, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from shared.db import INSUFFICIENT_PRIVILEGE, DatabaseRefused, ensure_database, first_line, get_engine, sqlstate

MIGRATIONS = Path(__file__).parent / "migrations"


class MigrationBlocked(Exception):
    """A migration statement waited for a lock past its lock timeout, try after try: another long
    transaction holds it. The migrations before it are applied; run them again once it ends."""

    def __init__(self, *, revision: str | None, statement: str, tries: int, lock_timeout: float, holder: str) -> None:
        super().__init__(revision, statement, tries, lock_timeout, holder)
        self.revision, self.statement, self.holder = revision, statement, holder
        self.tries, self.lock_timeout = tries, lock_timeout

    def __str__(self) -> str:
        return (f"migrations stopped at revision {self.revision or 'none'}: `{self.statement}` could not take its "
                f"lock within {self.lock_timeout:g}s, {self.tries} tries: another long transaction holds it "
                f"({self.holder}); end that transaction and migrate again")


class UnknownRevision(Exception):
    """The database is at a revision this code does not know: a newer nanofleet migrated it."""

    def __init__(self, url: str, revision: str) -> None:
        super().__init__(revision_problem(revision))
        self.url, self.revision = url, revision


class ForeignDatabase(Exception):
    """The database is at an alembic revision this code does not know and holds none of nanofleet's
    tables: another application's, not one a newer nanofleet migrated. Nothing here may touch it."""

    def __init__(self, url: str, revision: str) -> None:
        super().__init__(foreign_problem(revision))
        self.url, self.revision = url, revision


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


@lru_cache(maxsize=1)
def _scripts() -> ScriptDirectory:
    return ScriptDirectory(str(MIGRATIONS))


@lru_cache(maxsize=1)
def _known() -> frozenset[str]:
    return frozenset(script.revision for script in _scripts().walk_revisions())


def head() -> str:
    """The revision this code's migrations end at (the one its models are written for)."""
    return _scripts().get_current_head() or "base"


def revision_problem(revision: str | None, *, serving: bool = False) -> str | None:
    """Why this code cannot use a database at `revision` (None: the database is at head), worded to
    follow "the database": what it is at and what to run. `serving`: a newer nanofleet's revision is
    no problem (during a rolling upgrade the new version migrates while this one still serves; its
    migrations keep the old schema usable), only for migrating."""
    if revision == head():
        return None
    if revision is None:
        return "has no nanofleet tables: run `nanofleet migrate`"
    if revision not in _known():
        return None if serving else f"is at revision {revision}, which this nanofleet does not know: upgrade nanofleet"
    return f"is at revision {revision}, this nanofleet needs {head()}: run `nanofleet migrate`"


def foreign_problem(revision: str) -> str:
    """What is said, after "the database", of another application's (see ForeignDatabase)."""
    return (f"belongs to another application (alembic revision {revision}, no nanofleet tables): "
            "point NANOFLEET_DATABASE_URL at a database of its own")


# Tables every nanofleet revision has had: a database at an unknown revision with them is a newer
# nanofleet's; without them, another application's that uses alembic too.
OWN_TABLES = ("runs", "conversations", "messages", "outbox")
_HAS_OWN_TABLES = text("select " + " and ".join(f"to_regclass('{name}') is not null" for name in OWN_TABLES))


def foreign(conn: Connection, revision: str | None) -> bool:
    """Whether the database of `conn`, at `revision`, is another application's (see ForeignDatabase)."""
    return revision is not None and revision not in _known() and not conn.execute(_HAS_OWN_TABLES).scalar()


def problem_at(conn: Connection, revision: str | None) -> str | None:
    """revision_problem for serving (a newer nanofleet's revision is fine), unless the database of
    `conn` is another application's: that is refused."""
    if revision is not None and foreign(conn, revision):
        return foreign_problem(revision)
    return revision_problem(revision, serving=True)


# What Postgres refuses in a migration that only the operator can fix, and what to do about it
REFUSALS = {
    INSUFFICIENT_PRIVILEGE: "grant the role CREATE on schema public, or migrate as the database's owner",
    "42P07": "the database holds another application's tables: point NANOFLEET_DATABASE_URL at an empty database",
    "42710": "the database holds another application's objects: point NANOFLEET_DATABASE_URL at an empty database",
}


def upgrade(url: str, revision: str = "head") -> bool:
    """Create the database if missing, then upgrade it to `revision`; True when it was created.
    Raises UnknownRevision for a database a newer nanofleet migrated (this one cannot tell what it
    holds), ForeignDatabase for another application's, DatabaseRefused for a privilege missing or a
    table taken."""
    created = ensure_database(url)
    engine = create_engine(url, poolclass=NullPool)  # as the migrations connect: nothing kept open after
    try:
        with engine.connect() as conn:
            found = revision_at(conn)
            if foreign(conn, found):
                raise ForeignDatabase(url, str(found))
    finally:
        engine.dispose()
    if found is not None and found not in _known():
        raise UnknownRevision(url, found)
    try:
        command.upgrade(alembic_config(url), revision)
    except DBAPIError as err:
        if (advice := REFUSALS.get(sqlstate(err) or "")) is None:
            raise
        raise DatabaseRefused(url=url, reason=first_line(err), advice=advice) from None
    return created


VERSION_TABLE = "alembic_version"  # alembic's default: where a database's revision is kept


def revision_at(conn: Connection) -> str | None:
    """The revision the database of `conn` is at, or None when it has never been migrated. Read from
    alembic's table itself: a migration context logs two INFO lines each time, and /readyz asks this
    every few seconds."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    try:
        revision: str | None = conn.execute(text(f"select version_num from {VERSION_TABLE}")).scalar()
    except DBAPIError as err:  # a role the tables were never granted to (migrated by another, the owner)
        if sqlstate(err) != INSUFFICIENT_PRIVILEGE:
            raise
        raise DatabaseRefused(url=conn.engine.url.render_as_string(hide_password=False), reason=first_line(err),
                              advice="grant the role access to nanofleet's tables, or use the role that "
                                     "migrated them") from None
    return revision


def current(url: str) -> str | None:
    """The revision the database is at, or None when it has never been migrated."""
    with get_engine(url).connect() as conn:
        return revision_at(conn)


def schema_problem(url: str) -> str | None:
    """Why this code cannot use the database at `url` as it is (see problem_at), or None.
    Raises what connecting raises when the database does not answer."""
    with get_engine(url).connect() as conn:
        try:
            return problem_at(conn, revision_at(conn))
        except DatabaseRefused as err:
            return str(err)
