"""planning: obligation revisions and fingerprints, corrections, quiet hours, late policy

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("subscribers") as batch:
        batch.add_column(sa.Column("quiet_hours", sa.String(20), nullable=True))
    with op.batch_alter_table("subscriptions") as batch:
        batch.add_column(sa.Column("late_policy", sa.String(20), nullable=False, server_default="send_latest"))
    with op.batch_alter_table("obligations") as batch:
        batch.add_column(sa.Column("revision", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("previous_due_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("fingerprint", sa.String(64), nullable=True))
    with op.batch_alter_table("alerts") as batch:
        batch.add_column(sa.Column("revision", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("previous_due_at", sa.DateTime(timezone=True), nullable=True))
        batch.drop_constraint("uq_alerts_obligation_id_offset_seconds_channel_kind", type_="unique")
        batch.create_unique_constraint(
            "uq_alerts_obligation_id_offset_seconds_channel_kind_revision",
            ["obligation_id", "offset_seconds", "channel", "kind", "revision"],
        )


def downgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.drop_constraint("uq_alerts_obligation_id_offset_seconds_channel_kind_revision", type_="unique")
        batch.create_unique_constraint("uq_alerts_obligation_id_offset_seconds_channel_kind",
                                       ["obligation_id", "offset_seconds", "channel", "kind"])
        batch.drop_column("previous_due_at")
        batch.drop_column("revision")
    with op.batch_alter_table("obligations") as batch:
        batch.drop_column("fingerprint")
        batch.drop_column("previous_due_at")
        batch.drop_column("revision")
    with op.batch_alter_table("subscriptions") as batch:
        batch.drop_column("late_policy")
    with op.batch_alter_table("subscribers") as batch:
        batch.drop_column("quiet_hours")
