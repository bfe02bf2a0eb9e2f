"""``deadline-pipeline``: the operations command line.

Exit codes: 0 success; 1 the run finished but something is red (a failed step or check);
2 bad input (configuration, arguments) — the message names the file, key and problem.
130 ``run`` or ``demo`` stopped by Ctrl-C (SIGINT), said in one line (:func:`interrupted_text`).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

import click

from deadline_pipeline.commands.common import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    EXIT_RED,
    config_option,
    open_store,
    option_instant,
)
from deadline_pipeline.commands.common import fail_input as _fail_input
from deadline_pipeline.config import ConfigError


def _check_as_of(as_of: str | None) -> None:
    if as_of is not None:
        option_instant(as_of)


class _Main(click.Group):
    """The command group, with the last line of defence against tracebacks: an error that escapes a
    command is printed as one line naming its kind (the traceback only with ``-v``)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except BrokenPipeError:
            # The reader went away (`deadline-pipeline snapshots list SRC | head -3`): not an error
            # of the command, which printed "error: BrokenPipeError". As the Python documentation
            # advises (signal module, "Note on SIGPIPE"): point stdout at devnull so the flush at
            # exit does not raise again, and exit 1.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except Exception as exc:  # noqa: BLE001 - reported, never swallowed: exit code says it failed
            from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

            bad_input = isinstance(exc, (OverflowError, RecursionError, ValueError, OSError, ImportError,
                                         ArgumentError, DBAPIError, NoSuchModuleError))
            from deadline_pipeline.security.redact import redact

            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            # Printed, not logged: redacted here (a library's error may quote a URL with its token).
            click.echo(redact(f"error: {exc.__class__.__name__}: {first}"), err=True)
            if logging.getLogger().isEnabledFor(logging.INFO):
                logging.getLogger(__name__).exception("details")
            else:
                click.echo("(run with -v for the details)", err=True)
            sys.exit(EXIT_BAD_INPUT if bad_input else EXIT_RED)


def _version_text() -> str:
    """``deadline-pipeline 0.1.0 (dagster 1.13.27, Python 3.11.9)``: the versions a bug report needs,
    read from the installed distributions without importing Dagster (slow to import)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def of(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    from deadline_pipeline.zone_data import time_data_text

    return (f"deadline-pipeline {of('deadline_pipeline')} (dagster {of('dagster')}, Python {platform.python_version()})"
            f"\n{time_data_text()}")


def _print_version(ctx: click.Context, _param, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_version_text())
        ctx.exit(EXIT_OK)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print the version of deadline-pipeline, Dagster and Python, and exit.")
@click.option("--verbose", "-v", is_flag=True, help="Log at INFO level.")
def main(verbose: bool) -> None:
    """deadline_pipeline: ingest deadlines, plan reminders, deliver them, and watch it all."""
    from deadline_pipeline.security.redact import install

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    # Every line redacted, and httpx & co. quiet even at -v: their INFO line prints the request URL,
    # which for an incoming webhook is the credential itself.
    install()


@main.group()
def db() -> None:
    """The project's store (SQLite by default, $DEADLINE_DB_URL for PostgreSQL)."""


@db.command("upgrade")
@click.option("--db-url", envvar="DEADLINE_DB_URL", help="Store URL (default: the embedded SQLite file).")
def db_upgrade(db_url: str | None) -> None:
    """Apply the Alembic migrations (idempotent) and say which: the revisions before and after, or
    that the store was already at the latest one (the same line for both read as if nothing ran)."""
    from deadline_pipeline.store.db import migration_heads

    before = _heads_before_upgrade(db_url)
    engine = open_store(db_url)  # applies the migrations
    after = migration_heads(engine)
    shown = engine.url.render_as_string(hide_password=True)
    at = ", ".join(after)
    if before == after:
        click.echo(f"store at {shown} was already at the latest migration ({at}); nothing to apply")
    elif not before:
        click.echo(f"store at {shown} created at the latest migration ({at})")
    else:
        click.echo(f"store at {shown} migrated from {', '.join(before)} to the latest migration ({at})")


def _heads_before_upgrade(db_url: str | None) -> tuple[str, ...] | None:
    """The store's migration revisions before `db upgrade` (empty for a new store); ``None`` when they
    cannot be read (server down, unusable file): :func:`open_store` then names the reason and exits.
    A URL that cannot be a store exits 2 here, as :func:`open_store` would."""
    from sqlalchemy.exc import SQLAlchemyError

    from deadline_pipeline.commands.common import store_url
    from deadline_pipeline.store.db import make_engine, migration_heads

    try:
        engine = make_engine(store_url(db_url))
    except SQLAlchemyError:
        return None
    try:
        return migration_heads(engine)
    except SQLAlchemyError:
        return None
    finally:
        engine.dispose()


def quiet_dagster() -> None:
    """Dagster announces beta/preview APIs on every load; operators need the pipeline's own output.
    Imported only by the commands that run Dagster, so the others (watchdog, status) start fast and
    share nothing with it."""
    import warnings

    import dagster as dg

    for category in (dg.BetaWarning, dg.PreviewWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)


def _refuse_replay_into_live_store(engine, cfg, as_of: str) -> None:
    """Exit 2 when a running pipeline wrote heartbeats into this store recently (within the planning
    interval plus the heartbeat grace, on the real clock): a replay would write heartbeats at the
    replayed instant, and a future one made the watchdog report a dead sweep as healthy."""
    from datetime import UTC, datetime, timedelta

    from deadline_pipeline.instants import instant_text
    from deadline_pipeline.store import health

    window = timedelta(minutes=cfg.watch.plan_interval_minutes + cfg.watch.heartbeat_grace_minutes)
    with engine.connect() as conn:
        live = health.live_heartbeats(conn, datetime.now(UTC), window)
    if live:
        newest = max(live.values())
        _fail_input(f"--as-of {as_of}: the store {engine.url.render_as_string(hide_password=True)} is live "
                    f"({len(live)} heartbeat(s) of the running pipeline, newest {instant_text(newest)}: "
                    f"{', '.join(sorted(live))}); a replay would write its made-up instants among them. "
                    "Replay into another store (--db-url, or another DEADLINE_HOME), or pass --force-replay "
                    "if you mean it")


def _run(config: str | None, as_of: str | None, db_url: str | None, dagster_home: str | None,
         force_replay: bool = False) -> int:
    quiet_dagster()
    from deadline_pipeline.orchestration.runner import dagster_instance, run_chain
    from deadline_pipeline.store.db import deadline_home

    _check_as_of(as_of)
    home = Path(dagster_home or os.environ.get("DAGSTER_HOME") or deadline_home() / "dagster_home")
    try:
        from deadline_pipeline.commands.common import require_config
        from deadline_pipeline.config import load_config

        config_path = require_config(config)
        cfg = load_config(config_path)[0]  # refuse a bad file before touching any store
    except ConfigError as exc:
        _fail_input(str(exc))
    from deadline_pipeline.deliver.channels.environment import require_env

    try:
        # A missing credential found at send time escalated every due alert of its channel; here it
        # stops the run before anything is sent, and the alerts stay due for the next run.
        require_env(cfg)
    except ConfigError as exc:
        _fail_input(f"{Path(config_path).resolve()}: {exc}")
    engine = open_store(db_url)
    if as_of and not force_replay:
        _refuse_replay_into_live_store(engine, cfg, as_of)
    try:
        instance = dagster_instance(home)
    except OSError as exc:
        _fail_input(f"Dagster home {home}: {exc}")
    before = store_counts(engine)
    from deadline_pipeline.orchestration.runner import RunInterrupted

    try:
        summary = run_chain(config_path, instance=instance, db_url=db_url, as_of=as_of)
    except ConfigError as exc:
        _fail_input(str(exc))
    except RunInterrupted as exc:
        _exit_interrupted(f"during {exc.job}" if exc.job else "before its first job", cfg.delivery.lease_seconds)
    _print_summary(engine, summary, as_of, before)
    click.echo(f"\nDagster home: {home}\nbrowse the runs: {ui_command(home, Path(config_path), db_url)}")
    red = not summary.success or any(not ok for ok, _ in summary.checks.values())
    return EXIT_RED if red else EXIT_OK


#: The exit code of a command stopped by Ctrl-C (SIGINT): 128 + the signal's number, as a shell reports it.
EXIT_INTERRUPTED = 130


def interrupted_text(when: str, lease_seconds: int | None) -> str:
    """The one line ``run`` prints when Ctrl-C stopped it: when (``"during deliver_job"``, ``"before
    its first job"``), and why nothing is lost (docs/commands.md, "Interrupting a run"), with the
    configuration's ``delivery.lease_seconds`` when it was read (None: not yet)."""
    lease = f"delivery.lease_seconds, {lease_seconds} s" if lease_seconds is not None else "delivery.lease_seconds"
    return (f"interrupted {when}: the run stopped and started nothing more. Nothing is lost: what was "
            "recorded stays, and alerts not sent stay due for the next run; a send cut off mid-way is sent "
            f"again once its lease expires ({lease}), so it may arrive twice")


def _exit_interrupted(when: str, lease_seconds: int | None) -> NoReturn:
    """Print :func:`interrupted_text` on standard error and exit :data:`EXIT_INTERRUPTED` (130).

    The sweep has already stopped like a crash (every claim and recording committed or rolled back),
    but a send it cut off may still block its thread in a socket call, up to the channel's timeout,
    and the interpreter waits for such threads at exit: Ctrl-C would then seem to do nothing for
    that long. With such a thread alive the process ends at once (``os._exit``), which is what a
    crash does and what the leases are for."""
    import threading

    click.echo(interrupted_text(when, lease_seconds), err=True)
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)
    sys.exit(EXIT_INTERRUPTED)


def ui_command(dagster_home: Path, config_path: Path, db_url: str | None = None) -> str:
    """The shell command that opens the Dagster UI on what ``run`` just did, working from any folder.

    Absolute paths only, and the code location named by module (``-m deadline_pipeline.definitions``,
    which the installed package provides) rather than by ``workspace.yaml``: a relative
    ``-w workspace.yaml`` failed with "Path 'workspace.yaml' does not exist" everywhere but the
    repository's root. It starts in the project's home folder so a ``dagster.yaml`` in the current
    folder does not shadow ``DAGSTER_HOME``. A store given by ``--db-url`` (not already
    ``$DEADLINE_DB_URL``) is passed as ``DEADLINE_DB_URL`` with its password shown as ``***``."""
    import shlex

    from deadline_pipeline.store.db import deadline_home

    home = deadline_home()
    q = shlex.quote
    store = ""
    if db_url and db_url != os.environ.get("DEADLINE_DB_URL"):
        from sqlalchemy.engine import make_url

        store = f"DEADLINE_DB_URL={q(make_url(db_url).render_as_string(hide_password=True))} "
    return (f"cd {q(str(home))} && DEADLINE_HOME={q(str(home))} DAGSTER_HOME={q(str(dagster_home.resolve()))} "
            f"DEADLINE_CONFIG={q(str(config_path.resolve()))} {store}"
            "dg dev -m deadline_pipeline.definitions -a defs")


def store_counts(engine) -> dict[str, int]:
    """Row counts of the store: ``rule_versions``, ``obligations``, ``alerts`` (rows planned). Their
    growth over a run is what *every* writer of the store added meanwhile, this run included."""
    from deadline_pipeline.store.operations import row_counts

    with engine.connect() as conn:
        return row_counts(conn)


def this_run_text(delivery: dict[str, int] | None, before: dict[str, int], after: dict[str, int]) -> str:
    """What the run did, as lines. ``delivery``: the counts its own delivery sweep recorded
    (:attr:`RunSummary.delivery`), None when it recorded none; ``before`` / ``after``:
    :func:`store_counts` around the run.

    The delivery figures are this run's alone: store differences taken around the run counted the
    sends of any other run or sweep on the same store meanwhile as this run's. Failed attempts are
    counted because a run whose every send failed (a closed port, a refused address) otherwise read
    "sent 0" like a run with nothing due. No per-run source gives the planning figures as
    rows, so they stay differences, labelled as the store's growth."""
    if delivery is None:
        # Said, not left out: a missing line read like a run with nothing due.
        lines = ["this run: its delivery sweep recorded no counts (the delivery step failed without "
                 "recording them; see the failed step below)"]
    else:
        lines = [f"this run: sent {delivery.get('sent', 0)}, failed attempts {delivery.get('failed', 0)}, "
                 f"escalated {delivery.get('escalated', 0)}"]
        unsent = delivery.get("escalation_notice_failures", 0)
        if unsent:
            lines.append(f"WARNING: {unsent} escalation notice(s) could not be sent this run: the on-call was "
                         "not told of those escalated alerts. Fix the escalation channel (the run's log names "
                         "each error), tell the on-call yourself: `deadline-pipeline watchdog` lists the "
                         "escalated alerts not acknowledged; acknowledge each once handled "
                         "(`deadline-pipeline alerts acknowledge ID`).")
    grew = {k: after[k] - before.get(k, 0) for k in after}
    lines.append(f"store grew by (every writer during the run, this one included): rule versions "
                 f"{grew['rule_versions']}, obligations {grew['obligations']}, alerts {grew['alerts']}")
    return "\n".join(lines)


def _print_summary(engine, summary, as_of: str | None, before: dict[str, int] | None = None) -> None:
    from deadline_pipeline.store import health
    from deadline_pipeline.store.operations import obligations_by_state, row_counts
    from deadline_pipeline.store.sources import all_sources

    with engine.connect() as conn:
        srcs = all_sources(conn)
        versions = row_counts(conn, ("rule_versions",))["rule_versions"]
        obs = obligations_by_state(conn)
        states = health.alerts_by_state(conn)
    from deadline_pipeline.instants import instant_text, parse_instant
    from deadline_pipeline.zone_data import time_data_text

    # The instant the run used, as every other line writes one (an --as-of given with a fraction or
    # another offset was echoed as typed).
    click.echo(f"as of {instant_text(parse_instant(as_of)) if as_of else 'now'}; {time_data_text()}")
    if before is not None:
        click.echo(this_run_text(summary.delivery, before, store_counts(engine)))
    click.echo("sources:")
    for s in srcs:
        err = f" — {s.last_error}" if s.last_error else ""
        fresh = instant_text(s.last_fresh_at) if s.last_fresh_at else "never"
        click.echo(f"  {s.name:<24} {s.status:<8} last fresh {fresh}{err}")
    click.echo("store totals (all runs):")
    click.echo(f"  rule versions: {versions}")
    click.echo("  obligations: " + (", ".join(f"{k} {v}" for k, v in sorted(obs.items())) or "none"))
    click.echo("  alerts: " + (", ".join(f"{k} {v}" for k, v in sorted(states.items())) or "none"))
    click.echo("checks:")
    for name, (ok, desc) in sorted(summary.checks.items()):
        click.echo(f"  {name:<38} {'PASS' if ok else 'FAIL'}  {desc}")
    from deadline_pipeline.security.redact import redact

    for f in summary.failures:
        click.echo(redact(f"failed step: {f}"), err=True)


@main.command()
@config_option
@click.option("--as-of", help="Evaluate as if now were this ISO 8601 instant (e.g. 2026-05-01T12:00:00Z).")
@click.option("--db-url", envvar="DEADLINE_DB_URL", help="Store URL (default: the embedded SQLite file).")
@click.option("--dagster-home", help="Dagster instance folder (default: $DAGSTER_HOME, else .deadline/dagster_home).")
@click.option("--force-replay", is_flag=True,
              help="Allow --as-of on a store a running pipeline wrote heartbeats into recently.")
def run(config: str | None, as_of: str | None, db_url: str | None, dagster_home: str | None,
        force_replay: bool) -> None:
    """Run the chain once: ingest every source, plan, deliver what is due, run the checks."""
    try:
        code = _run(config, as_of, db_url, dagster_home, force_replay)
    except KeyboardInterrupt:  # before the chain started (loading, migrating): said as during it
        _exit_interrupted("before its first job", None)
    sys.exit(code)


@main.command()
@click.option("--as-of", help="Evaluate as if now were this ISO 8601 instant.")
@click.option("--force-replay", is_flag=True,
              help="Allow --as-of on a store a running pipeline wrote heartbeats into recently.")
def demo(as_of: str | None, force_replay: bool) -> None:
    """`run` on the bundled examples, delivering to a maildir under .deadline/."""
    from deadline_pipeline.orchestration.build import EXAMPLES_CONFIG
    from deadline_pipeline.store.db import deadline_home

    if not EXAMPLES_CONFIG.exists():
        _fail_input(f"the bundled examples are missing at {EXAMPLES_CONFIG}; install the project from a clone "
                    "with 'pip install -e .'")
    maildir = deadline_home() / "maildir"
    held = _maildir_count(maildir)
    try:
        code = _run(str(EXAMPLES_CONFIG), as_of, None, None, force_replay)
    except KeyboardInterrupt:  # before the chain started (loading, migrating): said as during it
        _exit_interrupted("before its first job", None)
    count = _maildir_count(maildir)
    click.echo(f"maildir: {maildir} holds {count} message(s), {count - held} new this run")
    sys.exit(code)


def _maildir_count(maildir: Path) -> int:
    return sum(1 for sub in ("new", "cur") if (maildir / sub).is_dir() for _ in (maildir / sub).iterdir())


def _register_commands() -> None:
    import importlib

    from deadline_pipeline.commands import COMMAND_MODULES

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(main)


_register_commands()

if __name__ == "__main__":  # pragma: no cover
    main()
