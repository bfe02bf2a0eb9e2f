"""delivery: who gave an alert a fresh attempt budget, and when

Expand-only: two nullable columns. Sweepers of the previous release never read or write them, so
they keep running on the migrated store during a rolling deploy.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.add_column(sa.Column("retried_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("retried_by", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.drop_column("retried_by")
        batch.drop_column("retried_at")
