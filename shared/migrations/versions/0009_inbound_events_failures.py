"""inbound_events: how often a message's submission failed, and the message set aside (with the last
error) once it failed runtime.max_recoveries times, so that its chat goes on without it

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 20:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("inbound_events", sa.Column("failures", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("inbound_events", sa.Column("set_aside", JSONB(), nullable=True))
    op.add_column("inbound_events", sa.Column("error", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("inbound_events", "error")
    op.drop_column("inbound_events", "set_aside")
    op.drop_column("inbound_events", "failures")
