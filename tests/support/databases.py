"""Databases of a test's own in each state a deployment may leave one in: missing, empty (never
migrated), behind this code's revision, or ahead of it (migrated by a newer nanofleet)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from shared.db import ensure_database, get_engine
from shared.migrate import MIGRATIONS, head, upgrade
from tests.support import services

STATES = ("missing", "empty", "behind", "ahead")
NEWER = "9999"  # a revision no migration here has: what a newer nanofleet's looks like to this one


def previous() -> str:
    """The revision before this code's head."""
    down = ScriptDirectory(str(MIGRATIONS)).get_revision(head()).down_revision
    assert isinstance(down, str), down
    return down


def reason(state: str) -> str:
    """What nanofleet says of a database in `state`, after "the database" (and its URL)."""
    return {
        "missing": "does not exist: run `nanofleet migrate`",
        "empty": "has no nanofleet tables: run `nanofleet migrate`",
        "behind": f"is at revision {previous()}, this nanofleet needs {head()}: run `nanofleet migrate`",
        "ahead": f"is at revision {NEWER}, which this nanofleet does not know: upgrade nanofleet",
    }[state]


@contextmanager
def database_in(state: str) -> Iterator[str]:
    """The URL of a new database in `state` (one of STATES), dropped afterwards."""
    base = make_url(services.postgres_url())
    name = f"nanofleet_{state}_{uuid.uuid4().hex[:8]}"
    url = base.set(database=name).render_as_string(hide_password=False)
    if state != "missing":
        ensure_database(url)
    if state in ("behind", "ahead"):
        upgrade(url, previous() if state == "behind" else "head")
    if state == "ahead":
        engine = create_engine(url)
        with engine.begin() as conn:
            conn.execute(text("update alembic_version set version_num = :v"), {"v": NEWER})
        engine.dispose()
    try:
        yield url
    finally:
        get_engine(url).dispose()  # the connections a gateway under test kept
        admin = create_engine(base.set(database="postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'drop database if exists "{name}" with (force)'))
        admin.dispose()


def locks_for_a_migration(url: str) -> str:
    """What an ALTER TABLE of messages and conversations meets now: "free", or Postgres' refusal
    after waiting 1 s for the locks that an open transaction holds on them."""
    with get_engine(url).connect() as conn:
        conn.execute(text("set local lock_timeout = '1s'"))
        try:
            conn.execute(text("lock table messages, conversations in access exclusive mode"))
            return "free"
        except OperationalError as err:
            return str(err.orig)
        finally:
            conn.rollback()
