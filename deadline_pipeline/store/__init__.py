"""The project's store: schema, engine, migrations and the SQL of each stage."""

from deadline_pipeline.store.db import get_engine, make_engine, upgrade

__all__ = ["get_engine", "make_engine", "upgrade"]
