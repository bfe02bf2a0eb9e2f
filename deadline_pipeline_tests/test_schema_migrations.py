"""The Alembic migrations build exactly the schema the code describes (``store/schema.py``): a table,
column, type or index added to one and not the other would pass every test that builds its store
from the migrations while the code plans its statements for another schema (an index the code
counts on, missing from every store in production)."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from deadline_pipeline.store.schema import metadata


def _differences(engine) -> list:
    with engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)


def test_the_migrations_build_the_schema_the_code_describes(engine):
    assert _differences(engine) == []


def test_a_missing_index_is_a_difference(engine):
    with engine.begin() as conn:
        conn.execute(text("DROP INDEX ix_obligations_source_id_rule_id"))
    [(op, index)] = _differences(engine)
    assert (op, index.name) == ("add_index", "ix_obligations_source_id_rule_id")
