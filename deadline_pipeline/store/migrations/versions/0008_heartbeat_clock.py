"""heartbeats: which clock wrote each heartbeat (live or an --as-of replay), and each component's first completion

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Expand only: rows written before this column existed came from the real clock ("live"), and
    # old code that does not write the column keeps writing "live" through the server default.
    with op.batch_alter_table("heartbeats") as batch:
        batch.add_column(sa.Column("clock", sa.String(10), nullable=False, server_default="live"))
        batch.add_column(sa.Column("first_completed_at", sa.DateTime(timezone=True), nullable=True))
    # The earliest completion known for rows that predate the column is their last one.
    op.execute("UPDATE heartbeats SET first_completed_at = last_completed_at WHERE first_completed_at IS NULL")


def downgrade() -> None:
    with op.batch_alter_table("heartbeats") as batch:
        batch.drop_column("first_completed_at")
        batch.drop_column("clock")
