"""heartbeats: each process's clock offset against the store's

Revision ID: 0020
Revises: 0019

The sweep decides what is due by its own host's clock, and ``clock_agrees`` compared only the clock
of the host it ran on with the store's: a sweeper (or planner, or Celery worker) on another host whose
clock ran 3 hours behind claimed nothing due, while ``alerts_reconciled`` and ``sweep_alive``, judged
by that same clock, stayed green. ``heartbeats.clock_offset_seconds`` is the store's clock minus the
writing process's clock (seconds, float) measured in the transaction that writes the heartbeat;
``clock_agrees`` is red when a recent one is beyond ``CLOCK_SKEW``.

Expand only: a nullable column. NULL (a replay's heartbeat, one written before this revision, or by
the previous release) is "not measured" and judged by nothing. The previous release ignores the column.
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("heartbeats") as batch:
        batch.add_column(sa.Column("clock_offset_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("heartbeats") as batch:
        batch.drop_column("clock_offset_seconds")
