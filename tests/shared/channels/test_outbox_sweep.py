"""The outbox redelivery sweep's query on real Postgres: with a platform down for hours, tens of
thousands of rows wait for their next attempt, and the sweep (every second) read them all."""

from __future__ import annotations

from sqlalchemy import text
from sqlmodel import Session

from shared.channels import delivery
from shared.db import get_engine
from tests.support.stack import clean_db


def test_the_redelivery_sweep_reads_only_the_rows_past_due(database_url: str) -> None:
    """At 50k pending rows beside 500k sent ones it took 10-20 ms a sweep through the status index;
    through the partial index of pending rows by due time, 0.2 ms (probed by hand)."""
    clean_db(database_url)
    with Session(get_engine(database_url)) as s:
        s.execute(text("""
            insert into outbox (id, key, channel, chat_id, content, meta, status, attempts, created_at,
                                next_attempt_at)
            select md5(i::text), 'run' || i || '\\:0', 'telegram', '42', 'x', '{}',
                   case when i % 10 = 0 then 'pending' else 'delivered' end, 1, now() - interval '1 hour',
                   case when i % 10 = 0 then now() + interval '10 minutes' end
            from generate_series(1, 20000) i"""))
        s.execute(text("analyze outbox"))
        plan = "\n".join(s.execute(text(f"explain {delivery._STALE.text}"), {"grace": 30, "batch": 100}).scalars())
        s.rollback()
    clean_db(database_url)
    assert "ix_outbox_pending_due" in plan, plan
