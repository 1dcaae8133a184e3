"""inbound_events.fetching_until: the lease of a worker fetching a message's attachment ahead of its
submission (a voice message's transcription, a photo's download), so that no other worker fetches it
again meanwhile

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29 18:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("inbound_events", sa.Column("fetching_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("inbound_events", "fetching_until")
