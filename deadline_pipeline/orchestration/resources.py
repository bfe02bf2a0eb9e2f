"""Dagster resources: the store, the user's configuration, and the clock."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg
from sqlalchemy import Engine

from deadline_pipeline.config import DeadlinesConfig, load_config
from deadline_pipeline.instants import parse_instant
from deadline_pipeline.store.db import get_engine


class StoreResource(dg.ConfigurableResource):
    """The project's store. ``db_url`` empty means ``$DEADLINE_DB_URL`` or the embedded SQLite file."""

    db_url: str | None = None

    def engine(self) -> Engine:
        """A migrated engine (migrations are applied once per process)."""
        return get_engine(self.db_url)


class SettingsResource(dg.ConfigurableResource):
    """The deadlines configuration file (``$DEADLINE_CONFIG``, ``./deadlines.yaml`` or the examples)."""

    config_path: str

    def load(self) -> DeadlinesConfig:
        return load_config(self.config_path)[0]


class ClockResource(dg.ConfigurableResource):
    """"Now" for every clock-dependent step. ``as_of`` (ISO 8601 with offset) replays an instant;
    empty means the real clock."""

    as_of: str | None = None

    def now(self) -> datetime:
        """Aware UTC."""
        if self.as_of:
            return parse_instant(self.as_of)
        return datetime.now(UTC)

    @property
    def frozen(self) -> bool:
        return bool(self.as_of)


