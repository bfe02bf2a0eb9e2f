"""subscription kinds: rule kinds a subscription includes or excludes

Revision ID: 0010
Revises: 0009

Expand only: two nullable JSON columns. NULL means "no filter", which is what code from before this
revision assumes, so old and new code can share the store during a rollout.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def _json() -> sa.types.TypeEngine:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("subscriptions") as batch:
        batch.add_column(sa.Column("kinds", _json(), nullable=True))
        batch.add_column(sa.Column("exclude_kinds", _json(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("subscriptions") as batch:
        batch.drop_column("exclude_kinds")
        batch.drop_column("kinds")
