"""subscriber contacts for the caldav and apprise channels

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Expand only: two nullable columns; code that does not know them keeps working.
    with op.batch_alter_table("subscribers") as batch:
        batch.add_column(sa.Column("caldav_url", sa.Text(), nullable=True))
        batch.add_column(sa.Column("apprise_target", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("subscribers") as batch:
        batch.drop_column("apprise_target")
        batch.drop_column("caldav_url")
