"""alerts: drop the (status, send_at) index; a partial index of escalated alerts instead

Revision ID: 0013
Revises: 0012

Every alert changes ``status`` twice on its way to delivered (claimed, then delivered), and each
change inserted a new entry into ``ix_alerts_status_send_at``. In a backlog whose alerts share a
``send_at`` (every subscriber's reminder of one deadline), those entries all carry the same key:
keeping that index cost PostgreSQL about 100 µs of CPU per delivered alert, 40% of its part of a
delivery (``benchmarks/deliver.py``, one-process sweep of 20,000 alerts: 233-249 µs of server CPU
per alert with the index, 139-145 µs without).

It also misled the record statement: believing few alerts claimed, the planner found the batch's
rows through ``status = 'claimed'`` on this index and read every claimed alert's entry, live or
dead, on every batch (455,636 entries for 20,000 alerts).

What read it: the claim and the sensor read the partial claim index (0012); the health questions
about open alerts and delivered ones without a receipt read most of the table whichever index
exists (``NOT IN``, and delivered history is the bulk of it). The escalated alerts, few and asked
for by every watchdog run, get a partial index of their own, which normal deliveries never write.

``CREATE INDEX`` (not ``CONCURRENTLY``: migrations run in one transaction) blocks writes to
``alerts`` for one scan of the table; only escalated rows are written to the index. Either release
runs on either revision: the previous release's queries only lose an index path.
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# Written out, not imported: a migration keeps the meaning it had when it was written.
_ESCALATED = sa.text("status = 'escalated'")


def upgrade() -> None:
    with op.batch_alter_table("alerts") as batch_op:
        batch_op.drop_index("ix_alerts_status_send_at")
    op.create_index("ix_alerts_escalated_updated_at_id", "alerts", ["updated_at", "id"], unique=False,
                    postgresql_where=_ESCALATED, sqlite_where=_ESCALATED)


def downgrade() -> None:
    op.drop_index("ix_alerts_escalated_updated_at_id", table_name="alerts")
    with op.batch_alter_table("alerts") as batch_op:
        batch_op.create_index("ix_alerts_status_send_at", ["status", "send_at"], unique=False)
