"""obligations: an index on (source_id, rule_id)

Revision ID: 0016
Revises: 0015

A re-plan scoped to the rules a revision changed (``replan_on_revision``'s runs) withdraws only the
obligations of those rules that it did not plan again. Without an index that leads with the rule,
PostgreSQL found them by reading every obligation of the source: 30-45 ms at 240,000 obligations
and ten times that at 2.4 million, in a run whose own writes take a few hundred milliseconds. With
it, the read costs the changed rules' obligations.

Planning writes each obligation once, so the index adds one entry per planned obligation (its keys
repeat: a source's rules, in the order planning writes them). ``CREATE INDEX`` (not
``CONCURRENTLY``: migrations run in one transaction) blocks writes to ``obligations`` for one scan
of the table. Either release runs on either revision: the previous release only lacks the index path.
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_obligations_source_id_rule_id", "obligations", ["source_id", "rule_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_obligations_source_id_rule_id", table_name="obligations")
