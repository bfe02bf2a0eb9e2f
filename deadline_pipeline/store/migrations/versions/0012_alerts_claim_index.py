"""alerts index (status, send_at, id) in place of (status, send_at): a claim reads one status at a time in claim order

Revision ID: 0012
Revises: 0011

The claim picks the oldest claimable alerts by ``(send_at, id)`` across the states pending,
retry_wait and claimed (lease expired). With ``status IN (...)`` and only ``(status, send_at)``,
PostgreSQL read and sorted every claimable row on every claim: measured on PostgreSQL 15 with
200,000 claimable alerts, 197,000 rows read and an external sort per claim of 500. The claim now
scans each status in order on ``(status, send_at, id)`` and stops after a batch
(``delivery._pg_pick``); ``id`` is part of the key because alerts planned together share a
``send_at``, and ties are claimed by ``id``. Every query that read ``(status, send_at)`` (the
sensor's count, the watchdog) reads the new index by the same leading columns, so the old one is
dropped rather than maintained on every status change.

``CREATE INDEX`` (not ``CONCURRENTLY``: migrations run in one transaction) blocks writes to
``alerts`` while it builds - about a second per million rows - and not reads. Code of either
revision runs on either index (safe mid-rollout): the previous claim reads the new index as it read
the old one.
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_alerts_status_send_at_id", "alerts", ["status", "send_at", "id"], unique=False)
    op.drop_index("ix_alerts_status_send_at", table_name="alerts")


def downgrade() -> None:
    op.create_index("ix_alerts_status_send_at", "alerts", ["status", "send_at"], unique=False)
    op.drop_index("ix_alerts_status_send_at_id", table_name="alerts")
