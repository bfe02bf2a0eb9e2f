"""Dagster resources: the store, the user's configuration, and the clock."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg
from pydantic import PrivateAttr
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
    """The deadlines configuration file (``$DEADLINE_CONFIG``, ``./deadlines.yaml`` or the examples).

    Within a run the file is read and validated once: Dagster initializes a fresh copy of the
    resource for each run (with the multiprocess executor: each step process) and calls
    :meth:`setup_for_execution` on it, and that copy keeps the configuration its first :meth:`load`
    returned. A change to the file therefore takes effect at the next run, and every asset, check and
    op of one run (and one step) sees the same configuration. Outside a run (the resource built by
    hand) every :meth:`load` reads the file again.
    """

    config_path: str

    _per_run: bool = PrivateAttr(default=False)
    _loaded: DeadlinesConfig | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # Loaded lazily on first use, not here: an invalid file still fails the step that needs it,
        # with the same error as before, and steps that never ask do not read it.
        self._per_run = True
        self._loaded = None

    def load(self) -> DeadlinesConfig:
        """The validated configuration; raises :class:`~deadline_pipeline.config.ConfigError` (and
        ``OSError`` for an unreadable file) like :func:`~deadline_pipeline.config.load_config`."""
        if self._loaded is not None:
            return self._loaded
        cfg = load_config(self.config_path)[0]
        if self._per_run:
            self._loaded = cfg
        return cfg


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


