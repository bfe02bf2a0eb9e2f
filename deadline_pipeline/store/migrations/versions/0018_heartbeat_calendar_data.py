"""heartbeats: the holiday-calendar data each process computes with

Revision ID: 0018
Revises: 0017

Business-day rolls come from the ``holidays`` library's release (``holidays 0.109``), as UTC offsets
come from the IANA zone data. Each obligation recorded the release that rolled it, but no process said
which release it reads: a planner (or a Celery worker) on another release than the checker's planned
other working days, and the horizon was re-planned with a new release only at its next scheduled run.
``heartbeats.calendar_data`` is recorded beside ``zone_data``; ``time_data_agrees`` compares both and
``replan_on_time_data`` re-plans the horizon when either changed.

Expand only: a nullable column. NULL (a heartbeat written before this revision, or by the previous
release) is "not recorded" and compared with nothing. The previous release ignores the column.
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("heartbeats") as batch:
        batch.add_column(sa.Column("calendar_data", sa.String(40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("heartbeats") as batch:
        batch.drop_column("calendar_data")
