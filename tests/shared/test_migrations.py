"""Migrations: up from empty, idempotent, down and up again; they match the models; the ledger's
uniqueness holds; behind a long transaction they neither freeze the application nor hang."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, create_engine, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlmodel import SQLModel

from shared.migrate import MigrationBlocked, alembic_config, current, head, upgrade
from tests.support import services
from tests.support.processes import ROOT, wait_until

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


def test_api_conversations_made_before_0014_get_their_own_id_as_chat_id(empty_db: str) -> None:
    upgrade(empty_db)
    command.downgrade(alembic_config(empty_db), "0013")
    engine = create_engine(empty_db)
    add = text("insert into conversations (id, session_key, channel, chat_id, meta, prompt_tokens, "
               "completion_tokens, cost, created_at, last_active_at) "
               "values (:id, :key, :channel, :chat, '{}', 0, 0, 0, now(), now())")
    with engine.begin() as conn:
        conn.execute(add, {"id": "c1", "key": "api:x1", "channel": "api", "chat": "x1"})  # made by the old gateway
        conn.execute(add, {"id": "c2", "key": "telegram:42", "channel": "telegram", "chat": "42"})
    upgrade(empty_db)
    with engine.connect() as conn:
        rows = conn.execute(text("select id, session_key, chat_id from conversations order by id")).all()
    assert [tuple(r) for r in rows] == [("c1", "api:c1", "c1"), ("c2", "telegram:42", "42")]
    engine.dispose()


def test_heartbeat_runs_made_before_0015_are_not_posted_to_a_chat(empty_db: str) -> None:
    """0015 posts a heartbeat's result that waited for its chat, as a cron job's: the heartbeat runs
    from before were never posted, and the quiet ones would have been ("HEARTBEAT_OK" in a chat)."""
    from sqlmodel import Session, select

    from shared.models import Conversation, Run, RunKind, RunStatus

    upgrade(empty_db)
    command.downgrade(alembic_config(empty_db), "0014")
    engine = create_engine(empty_db)
    with Session(engine) as s:
        s.add(Conversation(id="hb", session_key="heartbeat", channel="internal", chat_id="heartbeat"))
        s.flush()
        for kind, text_ in ((RunKind.HEARTBEAT, "HEARTBEAT_OK"), (RunKind.HEARTBEAT, "done"), (RunKind.CRON, "tea")):
            s.add(Run(conversation_id="hb", kind=kind, status=RunStatus.SUCCEEDED, final_text=text_,
                      origin={"channel": "api", "chat_id": "c1"}))
        s.commit()
    upgrade(empty_db)
    with Session(engine) as s:
        waiting = {(r.kind, r.final_text) for r in s.exec(select(Run).where(Run.announced == False))}  # noqa: E712
    assert waiting == {(RunKind.CRON, "tea")}  # a cron result from before still waits, as it did
    engine.dispose()


def test_the_migrations_build_exactly_what_the_models_declare(empty_db: str) -> None:
    import shared.models  # noqa: F401  (registers every table on SQLModel.metadata)

    upgrade(empty_db)
    engine = create_engine(empty_db)
    with engine.connect() as conn:
        drift = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
    engine.dispose()
    assert drift == [], "a model changed without a migration (or the other way round)"


# What the application may wait behind a migration: its lock timeout (1 s here) and then some.
PROBE_DEADLINE = 5
RUN_ROWS = """
insert into conversations (id, session_key, channel, chat_id, prompt_tokens, completion_tokens, cost, meta,
                           created_at, last_active_at)
values ('c1', 'api:c1', 'api', 'c1', 0, 0, 0, '{}', now(), now());
insert into runs (id, conversation_id, kind, status, phase, step_seq, iteration, max_iterations, origin,
                  suppress_reply, announced, prompt_tokens, completion_tokens, cost, created_at)
select id, 'c1', 'turn', 'queued', 'llm', 0, 0, 10, '{}', false, false, 0, 0, 0, now()
from unnest(array['r7', 'r8']) as id;
"""


def _config(url: str, **attributes: float) -> Config:
    """The shipped migrations with a lock timeout of 1 s where a deployment has 5, to keep tests short."""
    cfg = alembic_config(url)
    cfg.attributes.update({"lock_timeout": 1.0, "pause": 0.1, "tries": 60, **attributes})
    return cfg


def _at(url: str, revision: str) -> None:
    """The database at `revision`, with two runs."""
    upgrade(url, revision)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(RUN_ROWS)
    engine.dispose()


@contextmanager
def _long_transaction(url: str, sql: str) -> Iterator[Connection]:
    """A connection that ran `sql` and keeps its transaction open until the test commits it (or
    leaves the block)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text(sql))
            yield conn
    finally:
        engine.dispose()


def _query(url: str, sql: str, *, timeout: float | None = None) -> object:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            if timeout is not None:
                conn.execute(text(f"set local statement_timeout = '{timeout}s'"))
            result = conn.execute(text(sql))
            return result.scalar() if result.returns_rows else None
    finally:
        engine.dispose()


def _migration_waits_for_a_lock(url: str) -> bool:
    return bool(_query(url, "select count(*) from pg_stat_activity "
                            "where datname = current_database() and wait_event_type = 'Lock'"))


def _probe(url: str, sql: str) -> None:
    """What the application does meanwhile: `sql` must not wait more than PROBE_DEADLINE seconds."""
    try:
        _query(url, sql, timeout=PROBE_DEADLINE)
    except OperationalError as err:
        pytest.fail(f"`{sql}` waited over {PROBE_DEADLINE}s behind the migration: {err.orig}")


def _invalid(url: str, index: str) -> bool:
    return bool(_query(url, f"select count(*) from pg_index where indexrelid = to_regclass('{index}') "
                            "and not indisvalid"))


def _migrate_beside(url: str, *, holding: str, probe: str) -> None:
    """Migrate to head while a transaction that ran `holding` stays open: once the migration waits
    for a lock, `probe` (the application) must get through; the migration ends after that
    transaction does."""
    with ThreadPoolExecutor(1) as pool, _long_transaction(url, holding) as holder:
        migrating = pool.submit(command.upgrade, _config(url), "head")
        wait_until(lambda: _migration_waits_for_a_lock(url), message="the migration to wait for its lock")
        _probe(url, probe)
        holder.commit()
        migrating.result(timeout=60)


def test_a_migration_behind_a_long_transaction_does_not_freeze_the_application(empty_db: str) -> None:
    """0002 alters runs. Queued behind a transaction that read runs, it used to queue every query on
    runs behind itself until that transaction ended; now it gives up after its lock timeout, lets
    them through, and tries again."""
    _at(empty_db, "0001")
    _migrate_beside(empty_db, holding="select count(*) from runs", probe="select status from runs where id = 'r7'")
    assert current(empty_db) == head()


def test_a_migration_that_cannot_take_its_lock_stops_and_names_it(empty_db: str) -> None:
    """Behind a transaction that outlasts every try, migrate stops: one line naming the statement and
    the transaction, and the database stays at the last migration that went through."""
    _at(empty_db, "0001")
    with ThreadPoolExecutor(1) as pool, _long_transaction(empty_db, "select count(*) from runs") as reader:
        pid = reader.execute(text("select pg_backend_pid()")).scalar()
        migrating = pool.submit(command.upgrade, _config(empty_db, lock_timeout=0.2, tries=2), "head")
        with pytest.raises(MigrationBlocked) as blocked:
            migrating.result(timeout=30)
    message = str(blocked.value)
    assert "\n" not in message
    assert message.startswith("migrations stopped at revision 0001: `ALTER TABLE runs ADD COLUMN"), message
    assert "another long transaction holds it" in message and f"pid {pid}," in message, message
    assert current(empty_db) == "0001"


def test_index_builds_let_writers_through(empty_db: str) -> None:
    """0004 builds an index on runs. Behind a transaction that wrote runs, a plain CREATE INDEX
    queued every writer of runs behind itself; CONCURRENTLY lets them through."""
    _at(empty_db, "0003")
    _migrate_beside(empty_db, holding="update runs set iteration = 1 where id = 'r7'",
                    probe="update runs set iteration = 2 where id = 'r8'")
    assert current(empty_db) == head()
    assert not _invalid(empty_db, "ix_runs_results_unannounced")  # (0015's, which took 0004's place)


def test_an_index_build_that_gave_up_is_built_again(empty_db: str) -> None:
    """A concurrent build that gives up leaves its index behind, INVALID; IF NOT EXISTS alone would
    keep it, unused by any query."""
    _at(empty_db, "0003")
    with ThreadPoolExecutor(1) as pool, \
            _long_transaction(empty_db, "update runs set iteration = 1 where id = 'r7'") as writer:
        migrating = pool.submit(command.upgrade, _config(empty_db, lock_timeout=0.2, tries=1), "head")
        with pytest.raises(MigrationBlocked):
            migrating.result(timeout=30)
        assert _invalid(empty_db, "ix_runs_cron_unannounced")
        writer.commit()
    upgrade(empty_db)
    assert current(empty_db) == head()
    assert not _invalid(empty_db, "ix_runs_results_unannounced")
    engine = create_engine(empty_db)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), SQLModel.metadata) == []
    engine.dispose()


def test_two_migrators_at_once_both_finish(empty_db: str) -> None:
    """Two containers migrating at once: the second waits for the first without a statement open.
    One waiting inside pg_advisory_lock holds a snapshot, which the first one's concurrent index
    build waits for while the second waits for the first: a deadlock, and one of them fails."""
    _at(empty_db, "0003")
    with ThreadPoolExecutor(1) as pool, \
            _long_transaction(empty_db, "update runs set iteration = 1 where id = 'r7'") as writer:
        first = pool.submit(command.upgrade, _config(empty_db), "head")
        wait_until(lambda: _invalid(empty_db, "ix_runs_cron_unannounced"), message="the first one's index build waits")
        second = subprocess.Popen([sys.executable, "-c", "import sys; from shared.migrate import upgrade; "
                                   "upgrade(sys.argv[1])", empty_db], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        wait_until(lambda: _query(empty_db, "select count(*) from pg_stat_activity where datname = current_database() "
                                        "and application_name = 'nanofleet migrate'") == 2,
                   message="the second one waits for its turn")
        writer.commit()
        first.result(timeout=60)
        _, errors = second.communicate(timeout=60)
    assert second.returncode == 0, errors
    assert current(empty_db) == head()
