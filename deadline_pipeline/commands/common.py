"""What every command shares: how the configuration file is found, and the ``--config`` option.

One rule, the same in every command and in every ``--help``: ``--config FILE``, else
``$DEADLINE_CONFIG``, else ``./deadlines.yaml`` in the working directory. There is no silent fallback
to the bundled examples: a command acting on the wrong configuration would plan, send or withdraw
reminders for the wrong people (``deadline-pipeline demo`` is the way to run the examples). Commands
that can work without a configuration (``status``, ``watchdog``) say so in their own help and print a
note when they do.
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import NoReturn

import click

from deadline_pipeline.config import DEFAULT_CONFIG_NAME, ConfigError

# Exit codes of every command: 0 all green, 1 something is red, 2 the input was refused.
EXIT_OK, EXIT_RED, EXIT_BAD_INPUT = 0, 1, 2

CONFIG_HELP = ("Configuration file. Every command finds it the same way: --config FILE, else $DEADLINE_CONFIG, "
               f"else ./{DEFAULT_CONFIG_NAME} in the working directory.")


def config_option(fn):
    """The ``--config`` option (``$DEADLINE_CONFIG`` as its environment variable), identical everywhere."""
    return click.option("--config", "config", envvar="DEADLINE_CONFIG", type=click.Path(dir_okay=False),
                        help=CONFIG_HELP)(fn)


def find_config(explicit: str | None) -> Path | None:
    """The configuration file by the shared rule: ``explicit`` (``--config``, or ``$DEADLINE_CONFIG``
    as click passes it), else ``./deadlines.yaml`` when it exists, else ``None``. An explicit path
    is returned even when missing, so loading it names the missing file."""
    if explicit:
        return Path(explicit)
    local = Path(DEFAULT_CONFIG_NAME)
    return local if local.exists() else None


def require_config(explicit: str | None) -> Path:
    """:func:`find_config`, or :class:`ConfigError` saying how to give one."""
    path = find_config(explicit)
    if path is None:
        raise ConfigError("no configuration: pass --config FILE, set DEADLINE_CONFIG, or create "
                          f"./{DEFAULT_CONFIG_NAME} (examples/deadlines.yaml shows every key; "
                          "`deadline-pipeline demo` runs the examples)")
    return path


def fail_input(message: str) -> NoReturn:
    """Print ``error: <message>`` on standard error and exit with :data:`EXIT_BAD_INPUT` (2)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def option_instant(text: str, option: str = "--as-of") -> datetime:
    """The value ``text`` of the command-line option ``option`` as an aware UTC instant, or exit 2
    naming the option, the value and what is wrong with it (unparseable, no offset, an impossible
    date or time, a year outside :data:`~deadline_pipeline.instants.INSTANT_YEARS`, a fraction of a
    second: see :func:`~deadline_pipeline.instants.whole_second`)."""
    from deadline_pipeline.instants import parse_instant, whole_second

    try:
        return whole_second(parse_instant(text))
    except ValueError as exc:
        fail_input(f"{option} {text!r}: {exc}")


def store_url(db_url: str | None) -> str:
    """The store URL ``--db-url`` / ``DEADLINE_DB_URL`` names (default: the embedded SQLite file),
    normalised and checked (:func:`~deadline_pipeline.store.db.check_store_url`), or exit 2 naming it."""
    from deadline_pipeline.store.db import StoreUrlError, check_store_url, default_db_url, normalise_url

    url = normalise_url(db_url) if db_url else default_db_url()
    try:
        check_store_url(url)
    except StoreUrlError as exc:
        fail_input(f"--db-url / DEADLINE_DB_URL: {exc}")
    return url


def open_store(db_url: str | None):
    """A migrated engine, or exit 2 with a one-line reason (bad URL, server down, unwritable file)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

    from deadline_pipeline.store.db import StoreMigrationError, get_engine

    url = store_url(db_url)
    shown = make_url(url).render_as_string(hide_password=True)
    try:
        return get_engine(db_url)
    except (ArgumentError, NoSuchModuleError) as exc:
        fail_input(f"store {shown}: {exc}")
    except StoreMigrationError as exc:  # already names the store and what to do
        fail_input(str(exc))
    except DBAPIError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        fail_input(f"store {shown}: cannot open: {reason}")


def open_store_read_only(db_url: str | None, *, current: bool = False):
    """``(engine, None)`` for a store with the schema, ``(engine or None, reason)`` for one without;
    exits 2 for a URL that cannot be a store. With ``current``, a store whose migrations are behind
    this release's (:func:`~deadline_pipeline.store.db.latest_heads`) is one without, too.

    A read-only command neither applies migrations nor creates the store (nor the embedded store's
    folder): an embedded SQLite file that does not exist is reported without being opened (opening it
    would leave an empty file behind), and a store without the ``sources`` table is reported in one
    line instead of ``OperationalError: no such table`` and the SQL statement. Each reason names the
    store and the command that creates or migrates it. A store that cannot be reached at all is left
    to the caller (engine returned, no reason): its first statement raises the driver's error."""
    import os

    from sqlalchemy import inspect
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError

    from deadline_pipeline.store.db import (
        StoreUrlError,
        check_store_url,
        deadline_home,
        latest_heads,
        make_engine,
        migration_heads,
        normalise_url,
    )

    # Not store_url()/default_db_url(): those create $DEADLINE_HOME, a write a read-only command must not make.
    url = normalise_url(db_url or os.environ.get("DEADLINE_DB_URL") or
                        f"sqlite:///{deadline_home() / 'store.sqlite3'}")
    try:
        check_store_url(url, folder=False)
    except StoreUrlError as exc:
        fail_input(f"--db-url / DEADLINE_DB_URL: {exc}")
    parsed = make_url(url)
    shown = parsed.render_as_string(hide_password=True)
    missing = (f"the store at {shown} has no schema yet: run `deadline-pipeline db upgrade` or "
               "`deadline-pipeline run` first")
    if (parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:")
            and not parsed.query.get("uri") and not Path(parsed.database).exists()):
        folder = Path(parsed.database).resolve().parent
        if (db_url or os.environ.get("DEADLINE_DB_URL")) and not folder.is_dir():
            # "run db upgrade" would be wrong advice: it refuses a store in a missing folder (only the
            # embedded default's folder is created).
            return None, f"the store at {shown} does not exist: its folder {folder} does not exist"
        return None, missing
    engine = make_engine(url)
    try:
        if not inspect(engine).has_table("sources"):
            return engine, missing
        if current:
            at, latest = migration_heads(engine), latest_heads()
            if at != latest:
                # An older schema lacks columns this release reads: its queries failed with
                # "no such column" deep in the SQL instead of naming the fix.
                return engine, (f"the store at {shown} is at migration {', '.join(at) or 'none'}, not this "
                                f"release's latest ({', '.join(latest)}): run `deadline-pipeline db upgrade` first")
    except DBAPIError:  # unreachable: the command's own error path names it
        pass
    return engine, None
