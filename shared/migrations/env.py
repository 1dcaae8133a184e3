"""Alembic environment: the URL comes from the caller's config, the metadata from shared.models."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool
from sqlmodel import SQLModel

import shared.models  # noqa: F401  (registers the tables)

config = context.config
_url = config.get_main_option("sqlalchemy.url")
if not _url:
    raise RuntimeError("sqlalchemy.url must be set by the caller (shared.migrate)")
url: str = _url


def run_migrations_offline() -> None:
    context.configure(url=url, target_metadata=SQLModel.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=SQLModel.metadata)
        with context.begin_transaction():
            # One migrator at a time, even when several containers start together.
            connection.exec_driver_sql("select pg_advisory_xact_lock(727272)")
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
