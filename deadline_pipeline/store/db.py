"""Engine creation and migrations for the project's store.

The embedded default is a SQLite file under ``$DEADLINE_HOME`` (default ``./.deadline``); production
sets ``DEADLINE_DB_URL=postgresql+psycopg://user@host/db``. The same code runs on both.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from sqlalchemy import Engine, create_engine, event

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def deadline_home() -> Path:
    """The project's home folder for embedded state (``$DEADLINE_HOME``, default ``./.deadline``)."""
    return Path(os.environ.get("DEADLINE_HOME", ".deadline")).resolve()


def default_db_url() -> str:
    """``$DEADLINE_DB_URL`` if set, else a SQLite file ``store.sqlite3`` under :func:`deadline_home`."""
    url = os.environ.get("DEADLINE_DB_URL")
    if url:
        return normalise_url(url)
    home = deadline_home()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'store.sqlite3'}"


def normalise_url(url: str) -> str:
    """Map ``postgresql://`` and ``postgres://`` to the psycopg 3 driver the project ships with."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cur = dbapi_connection.cursor()
    # WAL lets the sensor read while a sweep writes; busy_timeout turns a momentary lock into a
    # wait instead of "database is locked" failing a run.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str | None = None) -> Engine:
    """Create an engine for ``url`` (default :func:`default_db_url`). No migrations are applied."""
    url = normalise_url(url) if url else default_db_url()
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)


def alembic_config(url: str):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # '%' would be read as interpolation by configparser (passwords in URLs contain it).
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(engine_or_url: Engine | str | None = None, revision: str = "heads") -> None:
    """Apply the Alembic migrations up to ``revision`` (default: every head) on the store (idempotent)."""
    from alembic import command

    if isinstance(engine_or_url, Engine):
        cfg = alembic_config(engine_or_url.url.render_as_string(hide_password=False))
        with engine_or_url.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
        return
    url = normalise_url(engine_or_url) if engine_or_url else default_db_url()
    command.upgrade(alembic_config(url), revision)


@lru_cache(maxsize=8)
def _migrated_engine(url: str) -> Engine:
    engine = make_engine(url)
    upgrade(engine)
    return engine


def get_engine(url: str | None = None) -> Engine:
    """An engine for ``url`` with migrations applied, cached per URL for the process."""
    return _migrated_engine(normalise_url(url) if url else default_db_url())
