"""The connection pool: a connection the server dropped while it sat idle is replaced unseen."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from shared import db


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
