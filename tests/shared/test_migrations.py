"""Migrations: up from empty, idempotent, down and up again; they match the models; the ledger's
uniqueness holds."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlmodel import SQLModel

from shared.migrate import alembic_config, current, upgrade
from tests.support import services

TABLES = {"conversations", "messages", "runs", "run_steps", "tool_calls", "inbound_events", "outbox",
          "cron_jobs", "cron_receipts"}


@pytest.fixture
def empty_db() -> Iterator[str]:
    base = make_url(services.postgres_url())
    name = f"nanofleet_mig_{uuid.uuid4().hex[:8]}"
    url = base.set(database=name).render_as_string(hide_password=False)
    yield url
    from shared.db import get_engine

    get_engine.cache_clear()
    admin = create_engine(base.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'drop database if exists "{name}" with (force)'))
    admin.dispose()


def test_up_from_empty_twice_and_back(empty_db: str) -> None:
    upgrade(empty_db)  # also creates the database
    upgrade(empty_db)
    assert current(empty_db) is not None
    engine = create_engine(empty_db)
    assert set(inspect(engine).get_table_names()) >= TABLES
    command.downgrade(alembic_config(empty_db), "base")
    assert not TABLES & set(inspect(engine).get_table_names())
    upgrade(empty_db)
    assert set(inspect(engine).get_table_names()) >= TABLES
    engine.dispose()


def test_inbound_ledger_is_unique_per_channel_and_event(empty_db: str) -> None:
    upgrade(empty_db)
    engine = create_engine(empty_db)
    insert = text("insert into inbound_events (channel, event_id, received_at) values (:c, :e, now())")
    with engine.begin() as conn:
        conn.execute(insert, {"c": "telegram", "e": "1"})
        conn.execute(insert, {"c": "slack", "e": "1"})
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(insert, {"c": "telegram", "e": "1"})
    engine.dispose()


def test_the_migrations_build_exactly_what_the_models_declare(empty_db: str) -> None:
    import shared.models  # noqa: F401  (registers every table on SQLModel.metadata)

    upgrade(empty_db)
    engine = create_engine(empty_db)
    with engine.connect() as conn:
        drift = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
    engine.dispose()
    assert drift == [], "a model changed without a migration (or the other way round)"
