"""runs: a partial index of the cron results still to post to their API chat

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 04:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # CONCURRENTLY: writes to runs go on during the build (a plain CREATE INDEX holds them until it
    # ends). IF NOT EXISTS: a retry keeps what an earlier try built; env.py drops what a failed one left.
    with op.get_context().autocommit_block():
        op.create_index("ix_runs_cron_unannounced", "runs", ["finished_at"],
                        postgresql_where=sa.text("kind = 'cron' AND announced IS FALSE"),
                        postgresql_concurrently=True, if_not_exists=True)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index("ix_runs_cron_unannounced", table_name="runs", postgresql_concurrently=True, if_exists=True)
