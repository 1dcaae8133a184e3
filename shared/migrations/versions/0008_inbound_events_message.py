"""inbound_events: the message an event brings, kept until a worker submits it (the gateway only
records; conversations and runs are a worker's work)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("inbound_events", sa.Column("message", JSONB(), nullable=True))
    op.add_column("inbound_events", sa.Column("session_key", sa.String(), nullable=True))
    op.add_column("inbound_events", sa.Column("recheck_at", sa.DateTime(timezone=True), nullable=True))
    # Every row there is was submitted already (message NULL): the partial index starts empty.
    op.create_index("ix_inbound_events_pending", "inbound_events", ["session_key", "id"],
                    postgresql_where=sa.text("message IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("ix_inbound_events_pending", table_name="inbound_events")
    op.drop_column("inbound_events", "recheck_at")
    op.drop_column("inbound_events", "session_key")
    op.drop_column("inbound_events", "message")
