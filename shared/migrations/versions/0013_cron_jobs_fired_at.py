"""cron_jobs.fired_at: the fire time of a job's latest firing that ran, which the API shows as
lastFiredAt (it showed last_fired_at, where the schedule counts from: moved by a reschedule, a
re-enable or a firing the missed policy skipped, none of which ran); filled from the receipts

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29 18:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("cron_jobs", sa.Column("fired_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("update cron_jobs j set fired_at = (select max(r.scheduled_for) from cron_receipts r "
               "where r.job_id = j.id and (r.run_id is not null or j.system))")


def downgrade() -> None:
    op.drop_column("cron_jobs", "fired_at")
