"""Dagster resources: the store, the user's configuration, and the clock."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg
from sqlalchemy import Engine

from deadline_pipeline.config import DeadlinesConfig, load_config
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


def parse_instant(text: str) -> datetime:
    """Parse an ISO 8601 instant (``2026-05-01T12:00:00Z``). A value without an offset is refused
    (``ValueError``): a replayed "now" must not depend on the machine's zone."""
    value = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(f"instant {text!r} has no offset; write e.g. 2026-05-01T12:00:00Z")
    return value.astimezone(UTC)
