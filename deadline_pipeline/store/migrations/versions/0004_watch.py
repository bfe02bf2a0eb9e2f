"""watch: a human's acknowledgement of an escalated alert

Revision ID: 0004
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # batch_alter_table: SQLite cannot ALTER most things in place; Alembic copies the table there.
    with op.batch_alter_table("alerts") as batch:
        batch.add_column(sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("acknowledged_by", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.drop_column("acknowledged_by")
        batch.drop_column("acknowledged_at")
