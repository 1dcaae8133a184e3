"""Apply the Alembic migrations that ship with nanofleet; safe to run any number of times."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from shared.db import ensure_database

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Create the database if missing, then upgrade it to `revision`."""
    ensure_database(url)
    command.upgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    """The revision the database is at, or None when it has never been migrated."""
    from alembic.runtime.migration import MigrationContext

    from shared.db import get_engine

    with get_engine(url).connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
