"""Engine creation and migrations for the project's store.

The embedded default is a SQLite file under ``$DEADLINE_HOME`` (default ``./.deadline``); production
sets ``DEADLINE_DB_URL=postgresql+psycopg://user@host/db``. The same code runs on both.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import time
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

from sqlalchemy import Connection, Engine, create_engine, event

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_log = logging.getLogger(__name__)


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


class StoreUrlError(ValueError):
    """A store URL the project cannot open: not a URL, a database other than PostgreSQL or SQLite,
    or a SQLite file in a folder that does not exist. The message names the URL (password hidden)."""


# The databases the store runs on (DESIGN.md: SQLite embedded, PostgreSQL in production).
SUPPORTED_BACKENDS = ("postgresql", "sqlite")
_URL_EXAMPLES = "postgresql://user@host/db or sqlite:///path/store.sqlite3"


def check_store_url(url: str, *, folder: bool = True) -> None:
    """Raise :class:`StoreUrlError` when ``url`` cannot be a store; return ``None`` when it may be.
    ``folder=False`` leaves a SQLite file's folder unchecked (read-only commands report a store that
    does not exist yet themselves).

    Checked before any driver is imported or file opened, because those fail far from the cause: a
    ``mysql://`` URL raised ``ModuleNotFoundError: No module named 'MySQLdb'``, and a SQLite file in
    a missing folder ``FileNotFoundError`` on the migration lock file next to it. The server being
    down or the file unwritable is not judged here (the driver's own error names that).
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number ('host:notaport')
        # Not parsed, so SQLAlchemy cannot hide its password: whatever stands between a ':' and the
        # '@' is masked here ('postgresql//admin:S3cret@host/db' printed the password in full).
        shown = re.sub(r"(?<=:)[^:@/]*(?=@)", "***", url)
        raise StoreUrlError(f"{shown!r} is not a database URL (e.g. {_URL_EXAMPLES})") from None
    backend = parsed.get_backend_name()
    # A SQLite URL holds no password, and rendered it escapes the path ('sqlite:///%3Amemory%3A').
    shown = url if backend == "sqlite" else parsed.render_as_string(hide_password=True)
    if backend not in SUPPORTED_BACKENDS:
        raise StoreUrlError(f"store {shown}: {backend!r} is not supported; the store runs on PostgreSQL or "
                            f"SQLite (e.g. {_URL_EXAMPLES})")
    if backend != "sqlite":
        return
    database = parsed.database or ""
    if database in ("", ":memory:") or parsed.query.get("mode") == "memory":
        # Each connection of an in-memory database is a database of its own: the sweep's threads
        # found no tables, and nothing survived the command ('db upgrade' said it had migrated).
        raise StoreUrlError(f"store {shown}: an in-memory SQLite database keeps nothing between connections "
                            "or commands; name a file (sqlite:///path/store.sqlite3)")
    if database.startswith("file:"):  # a URI filename (?uri=true): the path is the URI's
        database = urlsplit(database).path
    if database.startswith("~"):
        # SQLite opens '~/x' as a folder named '~': the check above passed and the store failed later.
        raise StoreUrlError(f"store {shown}: '~' is not expanded in a SQLite URL; write the full path "
                            f"(sqlite:///{Path(database).expanduser()})")
    if folder:
        parent = Path(database).resolve().parent
        if not parent.is_dir():
            raise StoreUrlError(f"store {shown}: the folder {parent} does not exist (create it, or name a "
                                "SQLite file in an existing folder)")


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


def migration_heads(engine: Engine) -> tuple[str, ...]:
    """The Alembic revisions the store is at (sorted; empty for a store no migration has touched).

    Raises what the driver raises when the store cannot be reached (``sqlalchemy.exc.DBAPIError``)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return tuple(sorted(MigrationContext.configure(conn).get_current_heads()))


def latest_heads() -> tuple[str, ...]:
    """The Alembic revisions of this release's migrations (sorted): what :func:`migration_heads` of a
    store :func:`upgrade` has brought up to date returns. Reads the migration scripts only."""
    from alembic.script import ScriptDirectory

    return tuple(sorted(ScriptDirectory(str(MIGRATIONS_DIR)).get_heads()))


# Key of the PostgreSQL advisory lock every migration run takes (any constant bigint; this one is
# the first 8 bytes of sha256("deadline_pipeline migrations"), unlikely to meet another tool's key).
MIGRATION_LOCK_KEY = 0x1B8C_4E2A_77D1_5F03


def db_clock(conn: Connection) -> datetime:
    """The database server's current time, aware UTC: the one clock every sweeper shares.

    PostgreSQL: ``clock_timestamp()`` (the real time of the statement, not the transaction start
    that ``now()`` returns, so a long transaction does not read an old instant). SQLite is a file
    opened by processes on this host, so its clock *is* the host clock; it is read through SQLite
    (``strftime('%Y-%m-%d %H:%M:%f', 'now')``, millisecond resolution) so that both engines take
    lease time from the same place in the code. Leases are judged by this clock, never by a
    sweeper's own: two sweepers whose clocks disagree by more than a lease would otherwise each
    think the other's lease expired and send everything twice.
    """
    if conn.dialect.name == "postgresql":
        value = conn.exec_driver_sql("SELECT clock_timestamp()").scalar_one()
        return value.astimezone(UTC)
    text = conn.exec_driver_sql("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')").scalar_one()
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)


@contextlib.contextmanager
def _migration_lock(url: str):
    """Serialise migration runs across processes.

    Without it two processes opening a fresh PostgreSQL store at once both run the first migration;
    the second fails with a duplicate-key error on the catalog (``pg_type``) and exits. PostgreSQL:
    a session-level ``pg_advisory_lock`` on a connection of its own, held until every migration has
    committed. SQLite: an exclusive ``flock`` on a ``<file>.migrate.lock`` file next to the store
    (SQLite runs DDL outside a transaction in Python's driver, so its own locks do not cover a run).
    The second process waits, then finds nothing left to do.
    """
    if url.startswith("postgresql"):
        from sqlalchemy.pool import NullPool

        locker = create_engine(url, poolclass=NullPool)
        try:
            with locker.connect() as conn:
                conn.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})")
                conn.commit()
                try:
                    yield
                finally:
                    conn.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})")
                    conn.commit()
        finally:
            locker.dispose()
        return
    from sqlalchemy.engine import make_url

    database = make_url(url).database if url.startswith("sqlite") else None
    if not database or database == ":memory:":
        yield  # an in-memory store has one user
        return
    import fcntl

    with open(f"{database}.migrate.lock", "a+") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


class StoreMigrationError(RuntimeError):
    """A migration that could not take its table locks within :data:`MIGRATION_ATTEMPTS` attempts:
    live transactions kept holding the tables it alters. Nothing was changed (PostgreSQL runs the
    whole upgrade in one transaction, rolled back on every failed attempt); the message names the
    store (password hidden) and the last lock conflict."""


# How long one migration attempt waits for a table lock before giving up and retrying (PostgreSQL
# ``lock_timeout``, seconds). A migration's ACCESS EXCLUSIVE request queued behind one long sweeper
# transaction blocks every later reader of that table too: all sweepers stop until it is granted.
MIGRATION_LOCK_TIMEOUT_S = 5.0
# Attempts before :class:`StoreMigrationError`; with the backoff below about two minutes of trying.
MIGRATION_ATTEMPTS = 20
# PostgreSQL SQLSTATEs of a lost lock race: deadlock_detected and lock_not_available (lock_timeout).
_LOCK_CONFLICTS = ("40P01", "55P03")


def upgrade(engine_or_url: Engine | str | None = None, revision: str = "heads") -> None:
    """Apply the Alembic migrations up to ``revision`` (default: every head) on the store (idempotent).

    Holds the migration lock (:func:`_migration_lock`) for the whole run, so concurrent first use of
    a store by several processes is safe. Migrations are expand-then-contract: a release only adds
    (nullable columns, tables, indexes), so sweepers of the previous release keep working on the
    migrated store during a rolling deploy; removing what no release reads is a later migration.

    On PostgreSQL the migrations run in one transaction that waits at most
    :data:`MIGRATION_LOCK_TIMEOUT_S` for each table lock; a lost lock race (deadlock or lock timeout
    against live sweepers) rolls the whole attempt back and retries it after a backoff, logged as a
    warning. A rolling deploy failed this way: the migration held ``rule_versions`` and waited for
    ``alerts`` while an old sweeper held ``alerts`` and waited for ``rule_versions``; PostgreSQL
    aborted the migration with ``deadlock detected`` and the deploy stopped. Raises
    :class:`StoreUrlError` for a URL that cannot be a store, :class:`StoreMigrationError` when every
    attempt lost, else what the driver raises.
    """
    if isinstance(engine_or_url, Engine):
        url = engine_or_url.url.render_as_string(hide_password=False)
        with _migration_lock(url):
            _upgrade_with_retries(engine_or_url, url, revision)
        return
    url = normalise_url(engine_or_url) if engine_or_url else default_db_url()
    check_store_url(url)
    engine = make_engine(url)
    try:
        with _migration_lock(url):
            _upgrade_with_retries(engine, url, revision)
    finally:
        engine.dispose()


def _upgrade_with_retries(engine: Engine, url: str, revision: str) -> None:
    """Run ``alembic upgrade revision`` in one transaction, retrying lost lock races (see :func:`upgrade`)."""
    from alembic import command
    from sqlalchemy.exc import DBAPIError

    for attempt in range(1, MIGRATION_ATTEMPTS + 1):
        try:
            with engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    timeout_ms = max(1, round(MIGRATION_LOCK_TIMEOUT_S * 1000))
                    conn.exec_driver_sql(f"SET LOCAL lock_timeout = {timeout_ms}")
                cfg = alembic_config(url)
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
            return
        except DBAPIError as exc:
            sqlstate = getattr(exc.orig, "sqlstate", None)
            if sqlstate not in _LOCK_CONFLICTS:
                raise
            shown = engine.url.render_as_string(hide_password=True)
            cause = str(exc.orig).splitlines()[0]
            if attempt == MIGRATION_ATTEMPTS:
                raise StoreMigrationError(
                    f"store {shown}: the migration to {revision} lost {attempt} lock races against live "
                    f"transactions and gave up (last: {cause}); nothing was changed. Retry when the "
                    "sweepers are idle, or stop them for the upgrade") from exc
            delay = min(5.0, 0.25 * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
            _log.warning("store %s: migration attempt %d of %d lost a lock race (%s: %s); rolled back, "
                         "retrying in %.1f s", shown, attempt, MIGRATION_ATTEMPTS, sqlstate, cause, delay)
            time.sleep(delay)


@lru_cache(maxsize=8)
def _migrated_engine(url: str) -> Engine:
    check_store_url(url)
    engine = make_engine(url)
    upgrade(engine)
    return engine


def get_engine(url: str | None = None) -> Engine:
    """An engine for ``url`` with migrations applied, cached per URL for the process.

    Raises :class:`StoreUrlError` for a URL that cannot be a store (see :func:`check_store_url`),
    else what the driver raises (``sqlalchemy.exc.DBAPIError``: server down, file unwritable).
    """
    return _migrated_engine(normalise_url(url) if url else default_db_url())
