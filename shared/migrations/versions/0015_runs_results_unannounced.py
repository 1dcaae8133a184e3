"""runs: the partial index of results still to post to their chat covers heartbeat runs too (a
heartbeat's result now waits for a chat in the middle of a turn, as a cron job's does)

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-30 02:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The heartbeat runs from before: none of them was ever posted to a chat, and the quiet ones would be
    # posted now ("HEARTBEAT_OK" in a user's conversation)
    op.execute("update runs set announced = true where kind = 'heartbeat' and announced is false")
    # CONCURRENTLY and IF (NOT) EXISTS, as 0004: writes to runs go on, and a retry keeps what an earlier try did.
    with op.get_context().autocommit_block():
        op.create_index("ix_runs_results_unannounced", "runs", ["finished_at"],
                        postgresql_where=sa.text("kind IN ('cron', 'heartbeat') AND announced IS FALSE"),
                        postgresql_concurrently=True, if_not_exists=True)
        op.drop_index("ix_runs_cron_unannounced", table_name="runs", postgresql_concurrently=True, if_exists=True)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index("ix_runs_cron_unannounced", "runs", ["finished_at"],
                        postgresql_where=sa.text("kind = 'cron' AND announced IS FALSE"),
                        postgresql_concurrently=True, if_not_exists=True)
        op.drop_index("ix_runs_results_unannounced", table_name="runs", postgresql_concurrently=True, if_exists=True)
