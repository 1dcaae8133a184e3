"""outbox: a partial index of the rows waiting to be sent, by when they are due (the redelivery
sweep scanned every pending row each second)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 03:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # CONCURRENTLY and IF NOT EXISTS, as in 0005: outbox writes go on during the build.
    with op.get_context().autocommit_block():
        op.create_index("ix_outbox_pending_due", "outbox", [sa.text("coalesce(next_attempt_at, created_at)")],
                        postgresql_where=sa.text("status = 'pending'"), postgresql_concurrently=True,
                        if_not_exists=True)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index("ix_outbox_pending_due", table_name="outbox", postgresql_concurrently=True, if_exists=True)
