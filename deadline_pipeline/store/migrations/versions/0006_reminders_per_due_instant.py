"""reminders are owed per due instant: alerts.due_at joins the alert identity; snapshots keep
their parse report (skipped records, rules held in force); rule_versions.lineage carries a renamed
rule's first id

A reminder delivered for a deadline's old instant must not stand in for the reminder owed for its
new instant, so the due instant an alert was planned for becomes part of the unique constraint.
History is kept: every existing row gets the instant it was most likely planned for.

Revision ID: 0006
Revises: 0005
"""

from datetime import timedelta

import sqlalchemy as sa
import sqlalchemy.dialects.postgresql
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

OLD_UQ = "uq_alerts_obligation_id_offset_seconds_channel_kind_revision"
NEW_UQ = "uq_alerts_identity"
# States in which a reminder row is history: it may have been planned for an instant before the
# obligation's last move (open rows were always moved along with their obligation).
CLOSED = ("claimed", "delivered", "escalated", "cancelled", "superseded")


def upgrade() -> None:
    with op.batch_alter_table("rule_versions") as batch:
        batch.add_column(sa.Column("lineage", sa.String(500), nullable=True))
    with op.batch_alter_table("snapshots") as batch:
        batch.add_column(sa.Column("parse_report", sa.JSON().with_variant(
            sa.dialects.postgresql.JSONB(), "postgresql"), nullable=True))
    # Nullable (expand): code that predates the column may still insert rows while both run.
    with op.batch_alter_table("alerts") as batch:
        batch.add_column(sa.Column("due_at", sa.DateTime(timezone=True), nullable=True))
    conn = op.get_bind()
    # Every row first takes its obligation's current instant (one statement, both engines) ...
    conn.execute(sa.text("UPDATE alerts SET due_at = (SELECT o.due_at FROM obligations o "
                         "WHERE o.id = alerts.obligation_id)"))
    # ... then the closed reminders of moved obligations take the previous instant when their send
    # time fits it better (a delivered reminder for the old date must stay history of the old date,
    # or the reminder owed for the new date would be taken as already sent).
    rows = conn.execute(sa.text(
        "SELECT a.id, a.offset_seconds, a.send_at, o.due_at, o.previous_due_at FROM alerts a "
        "JOIN obligations o ON o.id = a.obligation_id WHERE a.kind = 'reminder' AND o.revision > 0 "
        "AND o.previous_due_at IS NOT NULL AND a.status IN :closed"
    ).bindparams(sa.bindparam("closed", expanding=True)), {"closed": list(CLOSED)}).all()
    fixes = []
    for alert_id, offset, send_at, due, previous in rows:
        send_at, due, previous = (_dt(v) for v in (send_at, due, previous))
        planned = send_at - timedelta(seconds=offset)
        if abs(planned - previous) < abs(planned - due):
            fixes.append({"i": alert_id, "d": previous})
    for i in range(0, len(fixes), 1000):
        conn.execute(sa.text("UPDATE alerts SET due_at = :d WHERE id = :i"), fixes[i:i + 1000])
    with op.batch_alter_table("alerts") as batch:
        batch.drop_constraint(OLD_UQ, type_="unique")
        batch.create_unique_constraint(NEW_UQ, ["obligation_id", "offset_seconds", "channel", "kind", "revision",
                                                "due_at"])


def _dt(value):
    """SQLite hands datetimes back as text through a raw statement."""
    from datetime import datetime

    return datetime.fromisoformat(value) if isinstance(value, str) else value


def downgrade() -> None:
    # Keeps one row per old identity only if no instant was re-armed; refuse rather than lose rows.
    conn = op.get_bind()
    clash = conn.execute(sa.text(
        "SELECT COUNT(*) FROM (SELECT obligation_id, offset_seconds, channel, kind, revision FROM alerts "
        "GROUP BY obligation_id, offset_seconds, channel, kind, revision HAVING COUNT(*) > 1) c")).scalar()
    if clash:
        raise RuntimeError(f"cannot downgrade: {clash} reminder(s) were re-armed for a moved deadline; the old "
                           "identity cannot hold both the old and the new instant's rows")
    with op.batch_alter_table("alerts") as batch:
        batch.drop_constraint(NEW_UQ, type_="unique")
        batch.create_unique_constraint(OLD_UQ, ["obligation_id", "offset_seconds", "channel", "kind", "revision"])
        batch.drop_column("due_at")
    with op.batch_alter_table("snapshots") as batch:
        batch.drop_column("parse_report")
    with op.batch_alter_table("rule_versions") as batch:
        batch.drop_column("lineage")
