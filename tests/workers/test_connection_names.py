"""Who holds the Postgres connections: each process's say `nanofleet-<role>` in pg_stat_activity
(application_name), and its pool is sized by NANOFLEET_DATABASE__*. Real worker and gateway processes."""

from __future__ import annotations

from collections.abc import Callable

import psutil
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from tests.support.processes import Proc, wait_until
from tests.support.stack import Stack, gateway_process


def _names_by_port(database_url: str) -> dict[int, str]:
    """application_name of every TCP connection to the test database, by the client's port."""
    engine = create_engine(database_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("select client_port, application_name from pg_stat_activity "
                                     "where datname = current_database() and client_port > 0")).all()
    finally:
        engine.dispose()
    return {int(port): str(name) for port, name in rows}


def _names_of(proc: Proc, database_url: str) -> set[str]:
    """The application_names of the connections `proc` holds to the test database."""
    ports = {c.laddr.port for c in psutil.Process(proc.pid).net_connections(kind="tcp") if c.raddr}
    return {name for port, name in _names_by_port(database_url).items() if port in ports}


def test_each_process_names_its_role_to_postgres(make_stack: Callable[..., Stack], database_url: str) -> None:
    s = make_stack(DATABASE__POOL_SIZE="2", DATABASE__MAX_OVERFLOW="1")
    worker = s.worker(concurrency=2)
    with gateway_process(s) as (gateway, client):
        cid = client.post("/api/v1/conversations").json()["conversationId"]
        reply = client.post(f"/api/v1/conversations/{cid}/chat", json={"message": "who holds the pool?"})
        assert reply.status_code == 200, reply.text
        wait_until(lambda: _names_of(worker, database_url), timeout=30, message="the worker's pooled connections")
        assert _names_of(worker, database_url) == {"nanofleet-worker"}
        assert _names_of(gateway, database_url) == {"nanofleet-gateway"}
