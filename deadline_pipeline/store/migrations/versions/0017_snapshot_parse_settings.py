"""snapshots: the source settings each snapshot was parsed with

Revision ID: 0017
Revises: 0016

A parse depends on the bytes and on the source's configuration (``format``, ``timezone``: the zone
of times written without one). Only the bytes decided whether a snapshot was parsed again, so after
``timezone: Europe/Berlin`` was changed to ``America/New_York`` the rules kept the Berlin instants
(reminders six hours off, every check green) until the file's bytes changed. ``parse_settings``
records the settings of the last parse; ingest parses the latest snapshot again when they differ.

Expand only: a nullable JSON column. NULL (a snapshot parsed before this revision) reads as
"settings not recorded", and the next ingest parses the latest snapshot once more (identical rules
write no version). The previous release ignores the column.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.add_column(sa.Column("parse_settings", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
                                   nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.drop_column("parse_settings")
