"""fetch log: one row per fetch of a source, not only per content change

Revision ID: 0015
Revises: 0014

A snapshot is stored only when a source's bytes change; an unchanged fetch moved
``sources.last_fresh_at`` and left no trace. So a rule first seen after its deadline had passed
could not be judged: published late by the source (the PWC ismir20 abstract deadline, due
2020-04-11 and first published 2020-04-17), or missed while nothing was fetched. ``fetch_log``
keeps every fetch: time (UTC), outcome, HTTP status (None for a file), sha256, the snapshot used,
and the error of a failed one.

Expand only: a new table. Earlier fetches are not backfilled (unchanged fetches were never
recorded): a deadline due before a source's first logged fetch is judged "not watched", never paged.
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fetch_log",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("source_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  sa.ForeignKey("sources.id", name="fk_fetch_log_source_id_sources"), nullable=False),
        sa.Column("fetched_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.String(20), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("sha256", sa.String(64), nullable=True),
        sa.Column("snapshot_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  sa.ForeignKey("snapshots.id", name="fk_fetch_log_snapshot_id_snapshots", ondelete="SET NULL"),
                  nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_fetch_log"),
    )
    op.create_index("ix_fetch_log_source_id_fetched_at", "fetch_log", ["source_id", "fetched_at"])


def downgrade() -> None:
    op.drop_index("ix_fetch_log_source_id_fetched_at", table_name="fetch_log")
    op.drop_table("fetch_log")
