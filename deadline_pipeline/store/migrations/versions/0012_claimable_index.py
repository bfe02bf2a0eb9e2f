"""alerts: a partial index on (send_at, id) of the claimable alerts, read by the claim in claim order

Revision ID: 0012
Revises: 0011

The claim picks the oldest claimable alerts by ``(send_at, id)`` across the states pending,
retry_wait and claimed (lease expired): ``status IN (...) ... ORDER BY send_at, id LIMIT n FOR
UPDATE SKIP LOCKED``. With only ``(status, send_at)`` no index gives rows of three statuses in that
order, and PostgreSQL read and sorted every claimable row on every claim (PostgreSQL 15, a claim of
500: 16 ms with 20,000 claimable, 72 ms with 200,000, 0.5 s with 1,000,000). This index holds just
the claimable rows in claim order; the claim reads it and stops after the batch (about 1 ms at any
of those sizes), locking only rows it claims. ``id`` is part of the key because alerts planned
together share a ``send_at`` and ties are claimed by ``id``.

``(status, send_at)`` stays: the watchdog and health queries ask by status and send_at.

``CREATE INDEX`` (not ``CONCURRENTLY``: migrations run in one transaction) blocks writes to
``alerts``, not reads, for one scan of the table; only claimable rows are written to the index.
Either release runs on either revision (safe mid-rollout): the previous release's claim reads the
index when its statistics favour it, and this release's claim without the index reads and sorts as
before.
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# Written out, not imported: a migration keeps the meaning it had when it was written.
_CLAIMABLE = sa.text("status IN ('pending', 'retry_wait', 'claimed')")


def upgrade() -> None:
    op.create_index("ix_alerts_claimable_send_at_id", "alerts", ["send_at", "id"], unique=False,
                    postgresql_where=_CLAIMABLE, sqlite_where=_CLAIMABLE)


def downgrade() -> None:
    op.drop_index("ix_alerts_claimable_send_at_id", table_name="alerts")
