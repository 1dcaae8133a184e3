"""Database engine and sessions (SQLModel on psycopg 3)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlmodel import Session


@lru_cache(maxsize=8)
def get_engine(url: str, pool_size: int = 10) -> Engine:
    """One pooled engine per URL and process."""
    return create_engine(url, pool_size=pool_size, max_overflow=40, pool_pre_ping=True, pool_recycle=1800)


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


def ping(url: str) -> None:
    """Raise if the database does not answer."""
    with get_engine(url).connect() as conn:
        conn.execute(text("select 1"))


def ensure_database(url: str) -> bool:
    """Create the database named in url if it does not exist; True when created."""
    target = make_url(url)
    admin = create_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(
                text("select 1 from pg_database where datname = :n"), {"n": target.database}
            ).scalar()
            if not exists:
                conn.execute(text(f'create database "{target.database}"'))
            return not exists
    finally:
        admin.dispose()
