"""time data: the zone-data and working-day calendar versions that planned each obligation

Revision ID: 0014
Revises: 0013

A due instant depends on inputs that are not sources: the IANA time-zone database and the holiday
calendar library. ``obligations.zone_data`` (an IANA version, ``2026f``) and
``obligations.calendar_data`` (``holidays 0.109``, only for rules rolled by a business-day
calendar) record which ones planned the due instant in force, so a change of either is a revision
whose correction names it. ``heartbeats.zone_data`` records the version each process computed with,
so processes that disagree turn a check red.

Expand only: nullable columns. NULL means "planned before versions were recorded", which the next
plan fills in without a correction (a NULL is not a version to compare with).
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("obligations") as batch:
        batch.add_column(sa.Column("zone_data", sa.String(20), nullable=True))
        batch.add_column(sa.Column("calendar_data", sa.String(40), nullable=True))
    with op.batch_alter_table("heartbeats") as batch:
        batch.add_column(sa.Column("zone_data", sa.String(20), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("heartbeats") as batch:
        batch.drop_column("zone_data")
    with op.batch_alter_table("obligations") as batch:
        batch.drop_column("calendar_data")
        batch.drop_column("zone_data")
