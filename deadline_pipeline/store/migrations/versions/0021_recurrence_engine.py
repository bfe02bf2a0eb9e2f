"""recurrence engine: the expansion library that planned each obligation, and each process's

Revision ID: 0021
Revises: 0020

RRULE, RDATE and EXDATE are expanded by python-dateutil. An upgrade that expands a rule differently
moves deadlines as a zone-data or ``holidays`` upgrade does, but nothing recorded which expansion
planned an instant, so the correction a subscriber received named no cause.
``obligations.recurrence_engine`` (``python-dateutil 2.9.0.post0``, only for an instant an RRULE or
RDATE decided) records it beside ``zone_data`` and ``calendar_data``, so a move under another
engine with the rule and the time data unchanged is a revision whose correction names the upgrade.
``heartbeats.recurrence_engine`` records the engine each process imports, so a planner on another
python-dateutil than the checker turns ``time_data_agrees`` red.

Expand only: nullable columns. NULL (a row written before this revision or by the previous release;
for an obligation also a one-off date no expansion decided) is "not recorded" and compared with
nothing; the next plan fills an obligation's in without a correction. The previous release ignores
the columns.
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("obligations") as batch:
        batch.add_column(sa.Column("recurrence_engine", sa.String(40), nullable=True))
    with op.batch_alter_table("heartbeats") as batch:
        batch.add_column(sa.Column("recurrence_engine", sa.String(40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("heartbeats") as batch:
        batch.drop_column("recurrence_engine")
    with op.batch_alter_table("obligations") as batch:
        batch.drop_column("recurrence_engine")
