"""An API conversation's chatId is its own id (the id a cron job or the message tool names it by):
it was another random id, which nothing took

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29 23:40:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("update conversations set chat_id = id, session_key = 'api:' || id "
               "where channel = 'api' and session_key = 'api:' || chat_id and chat_id <> id")


def downgrade() -> None:
    pass  # the old ids were random and used by nothing
