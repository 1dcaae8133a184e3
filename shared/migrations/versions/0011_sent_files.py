"""sent_files: the files the agent sends (the message tool's `files`), kept in Postgres so that any
outbound worker can deliver them and API callers can fetch them

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29 09:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sent_files",
        sa.Column("id", sa.String(), primary_key=True),
        sa.Column("conversation_id", sa.Text(), sa.ForeignKey("conversations.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("mime", sa.String(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_sent_files_conversation_id", "sent_files", ["conversation_id"])
    op.create_index("ix_sent_files_created_at", "sent_files", ["created_at"])


def downgrade() -> None:
    op.drop_table("sent_files")
