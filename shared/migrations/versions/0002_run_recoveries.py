"""run recoveries: how often the sweeper took the current step back from a dead worker

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 15:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("recoveries", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("runs", sa.Column("recovered_seq", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "recovered_seq")
    op.drop_column("runs", "recoveries")
