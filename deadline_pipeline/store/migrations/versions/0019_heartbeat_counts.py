"""heartbeats: the counts a run records for the checks that read it back

Revision ID: 0019
Revises: 0018

Planning's gap-rule fallbacks (quiet-window edges read by the gap rule) reached ``plan_complete``
as text appended to the ``plan`` heartbeat's ``detail``, parsed back with a regular expression, and
counted by a process-wide counter that took another run's fallbacks in the same process as its own.
``counts`` holds them as name → count, each run's own, with what folding RECURRENCE-ID overrides
left loose or took out (``orphan_overrides``, ``cancelled_occurrences``, ``override_rrule_ignored``).

Expand only: a nullable JSON column. NULL (a heartbeat written before this revision, or by a
component that records no counts) reads as nothing counted; the next planning run records its
counts. The previous release ignores the column.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("heartbeats") as batch:
        batch.add_column(sa.Column("counts", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
                                   nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("heartbeats") as batch:
        batch.drop_column("counts")
