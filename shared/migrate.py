"""Apply the Alembic migrations that ship with nanofleet; safe to run any number of times. Also says
whether a database is at the revision this code needs, for the commands that refuse one that is not."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, inspect, text
from sqlalchemy.pool import NullPool

from shared.db import ensure_database, get_engine

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


def upgrade(url: str, revision: str = "head") -> bool:
    """Create the database if missing, then upgrade it to `revision`; True when it was created.
    Raises UnknownRevision for a database a newer nanofleet migrated (this one cannot tell what it holds)."""
    created = ensure_database(url)
    engine = create_engine(url, poolclass=NullPool)  # as the migrations connect: nothing kept open after
    try:
        with engine.connect() as conn:
            found = revision_at(conn)
    finally:
        engine.dispose()
    if found is not None and found not in _known():
        raise UnknownRevision(url, found)
    command.upgrade(alembic_config(url), revision)
    return created


VERSION_TABLE = "alembic_version"  # alembic's default: where a database's revision is kept


def revision_at(conn: Connection) -> str | None:
    """The revision the database of `conn` is at, or None when it has never been migrated. Read from
    alembic's table itself: a migration context logs two INFO lines each time, and /readyz asks this
    every few seconds."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    revision: str | None = conn.execute(text(f"select version_num from {VERSION_TABLE}")).scalar()
    return revision


def current(url: str) -> str | None:
    """The revision the database is at, or None when it has never been migrated."""
    with get_engine(url).connect() as conn:
        return revision_at(conn)


def schema_problem(url: str) -> str | None:
    """Why this code cannot use the database at `url` as it is (see revision_problem), or None.
    Raises what connecting raises when the database does not answer."""
    return revision_problem(current(url), serving=True)
