"""outbox: find a sent message by its platform id (WhatsApp reports failures later, by that id)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 03:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # CONCURRENTLY: writes to outbox go on during the build (a plain CREATE INDEX holds them until it
    # ends). IF NOT EXISTS: a retry keeps what an earlier try built; env.py drops what a failed one left.
    with op.get_context().autocommit_block():
        op.create_index("ix_outbox_channel_platform_message_id", "outbox", ["channel", "platform_message_id"],
                        postgresql_concurrently=True, if_not_exists=True)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index("ix_outbox_channel_platform_message_id", table_name="outbox", postgresql_concurrently=True,
                      if_exists=True)
