"""messages: partial indexes of the summaries (a conversation's latest, found without walking its
history) and of the /new summaries still to write

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 23:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # CONCURRENTLY: writes to messages go on during the build (a plain CREATE INDEX holds them until it
    # ends). IF NOT EXISTS: a retry keeps what an earlier try built; env.py drops what a failed one left.
    with op.get_context().autocommit_block():
        op.create_index("ix_messages_summaries", "messages", ["conversation_id", "seq"],
                        postgresql_where=sa.text("type = 'SUMMARY'"),
                        postgresql_concurrently=True, if_not_exists=True)
        op.create_index("ix_messages_summary_due", "messages", ["conversation_id"],
                        postgresql_where=sa.text("type = 'SUMMARY' AND meta ? 'summary_due'"),
                        postgresql_concurrently=True, if_not_exists=True)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index("ix_messages_summary_due", table_name="messages", postgresql_concurrently=True,
                      if_exists=True)
        op.drop_index("ix_messages_summaries", table_name="messages", postgresql_concurrently=True,
                      if_exists=True)
