"""Operator commands of the ingest stage.

* ``rules diff SOURCE [--from SNAPSHOT --to SNAPSHOT] [--json]``: what changed between two snapshots;
* ``source accept SNAPSHOT``: apply a quarantined snapshot after a human looked at it;
* ``subscribers accept``: withdraw the subscribers a planning run held (its subscriber list left out
  too many at once), after a human looked at the list;
* ``snapshots list SOURCE`` and ``snapshots prune --keep-days N [--dry-run]``: see and prune raw bytes;
* ``validate --format FMT FILE``: parse a file strictly, listing every problem with its position.

Exit codes as everywhere: 0 success; 1 the command ran and found something red (a file with
problems); 2 bad input (unknown source or snapshot, unreadable file or store), with a one-line message
and no traceback.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click

from deadline_pipeline.commands.common import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    EXIT_RED,
    config_option,
    find_config,
    option_instant,
    require_config,
)
from deadline_pipeline.instants import instant_text

# The codes of deadline_pipeline.cli, repeated: importing that module from here would be circular
# (it imports every command module while it loads, also when run as ``python -m``).

_DB_URL = click.option("--db-url", envvar="DEADLINE_DB_URL",
                       help="Store URL (default: $DEADLINE_DB_URL, else the embedded SQLite file).")
_CONFIG = config_option  # the shared rule for finding the configuration (commands/common.py)
_AS_OF = click.option("--as-of", help="Act as if now were this ISO 8601 instant (e.g. 2026-05-01T12:00:00Z).")


class _BadInput(Exception):
    """Reported as ``error: …`` with exit code 2."""


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _engine(db_url: str | None):
    from sqlalchemy.exc import SQLAlchemyError

    from deadline_pipeline.store.db import StoreUrlError, get_engine

    try:
        return get_engine(db_url)
    except StoreUrlError as exc:  # names the URL with its password hidden
        raise _BadInput(f"cannot open the store: {exc}") from None
    except (SQLAlchemyError, OSError) as exc:
        # The driver's message may quote the URL; the URL's password must not reach the terminal.
        raise _BadInput(f"cannot open the store: {exc.__class__.__name__}: {str(exc).splitlines()[0]}") from None


def _existing_store(db_url: str | None):
    """The engine of a store that exists with this release's schema, for a command that only reads it
    (``rules diff``, ``snapshots list``); :class:`_BadInput` naming the store and the command that
    creates or migrates it otherwise. Opened with :func:`_engine`, a mistyped ``DEADLINE_HOME`` or
    ``--db-url`` created and migrated an empty store there and then said the source was unknown."""
    from deadline_pipeline.commands.common import open_store_read_only

    engine, missing = open_store_read_only(db_url, current=True)
    if missing:
        raise _BadInput(missing)
    return engine


def _now(as_of: str | None) -> datetime:
    return datetime.now(UTC) if as_of is None else option_instant(as_of)


def _config(config: str | None):
    from deadline_pipeline.config import ConfigError, load_config

    try:
        return load_config(require_config(config))[0]
    except ConfigError as exc:
        raise _BadInput(str(exc)) from None


def _guarded(fn):
    """Turn the command's bad-input exceptions into one line and exit code 2."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _BadInput as exc:
            _fail(str(exc))

    return wrapper


def _source_row(conn, name: str):
    from deadline_pipeline.store.sources import all_sources, find_source

    row = find_source(conn, name)
    if row is None:
        known = ", ".join(s.name for s in all_sources(conn)) or "none yet"
        raise _BadInput(f"unknown source {name!r}; sources in the store: {known}")
    return row


def _snapshot(conn, snapshot_id: int):
    from sqlalchemy.exc import NoResultFound

    from deadline_pipeline.store.sources import snapshot_meta

    try:
        return snapshot_meta(conn, snapshot_id)
    except NoResultFound:
        raise _BadInput(f"snapshot {snapshot_id} does not exist") from None


def _group(main: click.Group, name: str, help_text: str) -> click.Group:
    """The sub-group ``name`` of ``main``, created unless another module already did."""
    existing = main.commands.get(name)
    if isinstance(existing, click.Group):
        return existing
    group = click.Group(name, help=help_text)
    main.add_command(group)
    return group


# --- rules diff ----------------------------------------------------------------------------------


def _rules_of_snapshot(conn, source_row, snapshot_id: int, default_tz: str | None):
    """The rules a stored snapshot says (parsed again, leniently, as the pipeline did)."""
    from deadline_pipeline.ingest.parsers import ParseError, parse_payload
    from deadline_pipeline.store.sources import snapshot_content

    meta = _snapshot(conn, snapshot_id)
    if meta.source_id != source_row.id:
        raise _BadInput(f"snapshot {snapshot_id} belongs to another source than {source_row.name!r}")
    try:
        parsed = parse_payload(source_row.format, snapshot_content(conn, snapshot_id), source=source_row.name,
                               default_tz=default_tz)
    except ParseError as exc:
        raise _BadInput(f"snapshot {snapshot_id} cannot be compared, it does not parse: {exc}") from None
    except ValueError as exc:  # an unknown format or zone in the configuration
        raise _BadInput(str(exc)) from None
    return parsed


def rules_diff(source: str, from_id: int | None, to_id: int | None, as_json: bool, db_url: str | None,
               config: str | None) -> int:
    """``rules diff``; returns the exit code. Raises :class:`_BadInput` for unusable arguments."""
    from deadline_pipeline.ingest.diff import diff_snapshots, format_diff
    from deadline_pipeline.ingest.service import settings_pending
    from deadline_pipeline.store.sources import latest_snapshot, list_snapshots

    if (from_id is None) != (to_id is None):
        raise _BadInput("give both --from and --to, or neither (default: the last two applied snapshots)")
    engine = _existing_store(db_url)
    with engine.connect() as conn:
        row = _source_row(conn, source)
        # The configured zone for times written without one, so the parse matches the pipeline's.
        default_tz = None
        pending = None
        config = find_config(config)  # optional here: without one, times stay as the snapshot wrote them
        if config is not None:
            try:
                src = _config(config).source(source)
            except KeyError:
                raise _BadInput(f"source {source!r} is in the store but not in the configuration {config}") \
                    from None
            default_tz = src.timezone
            pending = settings_pending(conn, src)
        waiting = None  # a quarantined snapshot newer than every applied one
        if from_id is None:
            applied = list_snapshots(conn, row.id, statuses=("parsed",))
            latest = latest_snapshot(conn, row.id)
            if latest is not None and latest.parse_status == "quarantined":
                # What an operator asks before `source accept`: what would it change? The default
                # compared the two last applied snapshots instead, and with one applied it said
                # "every rule shows as added" while the quarantined snapshot was the point.
                waiting = latest.id
                to_id, from_id = waiting, (applied[0].id if applied else None)
            else:
                if not applied:
                    raise _BadInput(f"source {source!r} has no applied snapshot yet")
                to_id = applied[0].id
                from_id = applied[1].id if len(applied) > 1 else None
        old = _rules_of_snapshot(conn, row, from_id, default_tz) if from_id is not None else None
        new = _rules_of_snapshot(conn, row, to_id, default_tz)
    diff = diff_snapshots(old.rules if old else [], new.rules, new.problems)
    # A skipped record is not a cancelled event: the first is a fault of the feed (its rule held in
    # force), the second the publisher's intent (its rule withdrawn). Counting every parse problem
    # said "1 record(s) … skipped" for a STATUS:CANCELLED event.
    sides = {"from": old.problems if old else [], "to": new.problems}
    skipped = {side: sum(p.skipped for p in problems) for side, problems in sides.items()}
    closed = {side: sum(p.closed for p in problems) for side, problems in sides.items()}
    if pending:
        # This diff reads the snapshots with the configuration's settings; the rules in force are
        # still the old reading, and the diff alone would be taken for what the store holds.
        click.echo(f"note: {pending}", err=True)
    if as_json:
        click.echo(json.dumps({"source": source, "from": from_id, "to": to_id, "to_quarantined": waiting is not None,
                               "skipped_records": skipped, "closed_records": closed, **diff.to_json()},
                              indent=2, ensure_ascii=False))
        return EXIT_OK
    if waiting is not None:
        header = (f"source {source}: snapshot {from_id} (in force) -> {to_id} (quarantined, not applied; "
                  f"'deadline-pipeline source accept {to_id}' applies it)" if from_id is not None
                  else f"source {source}: snapshot {to_id} (quarantined, not applied); no snapshot was applied "
                  "before it, so every rule shows as added")
    else:
        header = (f"source {source}: snapshot {from_id} -> {to_id}" if from_id is not None
                  else f"source {source}: only one applied snapshot ({to_id}); every rule shows as added")
    click.echo(format_diff(diff, header=header))
    _echo_parse_counts(skipped, closed)
    return EXIT_OK


def _echo_parse_counts(skipped: dict[str, int], closed: dict[str, int]) -> None:
    """The notes below a diff: per snapshot (``"from"``, ``"to"``), the records skipped while parsing
    and those their publisher cancelled or completed (:attr:`ParseProblem.closed`)."""
    for side in ("from", "to"):
        if skipped[side]:
            click.echo(f"note: {skipped[side]} record(s) of the '{side}' snapshot were skipped while parsing "
                       "(see the snapshot's parse_error)", err=True)
        if closed[side]:
            click.echo(f"note: {closed[side]} record(s) of the '{side}' snapshot were cancelled or completed by "
                       "their publisher (STATUS:CANCELLED, a completed to-do): not in force, their reminders "
                       "withdrawn", err=True)


# --- source accept -------------------------------------------------------------------------------


def source_accept(snapshot_id: int, db_url: str | None, config: str | None, as_of: str | None) -> int:
    """``source accept``; returns the exit code. Raises :class:`_BadInput` for unusable arguments."""
    from deadline_pipeline.ingest.service import apply_snapshot
    from deadline_pipeline.store.operations import versions_written
    from deadline_pipeline.store.sources import get_source_by_id, latest_snapshot

    now = _now(as_of)
    cfg = _config(config)
    engine = _engine(db_url)
    with engine.connect() as conn:
        meta = _snapshot(conn, snapshot_id)
        row = get_source_by_id(conn, meta.source_id)
        latest = latest_snapshot(conn, row.id)
    report = meta.parse_report or {}
    # A parsed snapshot that skipped records (their rules kept in force) is accepted the same way:
    # the human confirms the skipped records are gone, and their rules are withdrawn.
    incomplete = meta.parse_status == "parsed" and report.get("skipped_count") and not report.get("accepted")
    if meta.parse_status != "quarantined" and not incomplete:
        raise _BadInput(f"snapshot {snapshot_id} of source {row.name!r} is not quarantined "
                        f"(status {meta.parse_status}); only a quarantined snapshot, or one that skipped "
                        "records, can be accepted")
    if latest.id != snapshot_id:
        # Applying an older snapshot over a newer one would roll the source back in time.
        raise _BadInput(f"snapshot {snapshot_id} of source {row.name!r} is no longer the latest (snapshot "
                        f"{latest.id} is); accepting it would roll the source back")
    try:
        src = cfg.source(row.name)
    except KeyError:
        raise _BadInput(f"source {row.name!r} of snapshot {snapshot_id} is not in the configuration") from None
    if src.format != row.format:
        raise _BadInput(f"source {row.name!r} is configured as {src.format!r} but was ingested as {row.format!r}")

    out = apply_snapshot(engine, src, snapshot_id, now, force=True)
    if out.status != "applied":
        click.echo(f"error: snapshot {snapshot_id} of source {row.name!r} was not applied: {out.error}", err=True)
        return EXIT_RED
    click.echo(f"accepted snapshot {snapshot_id} of source {row.name!r}: {out.rules} rule(s); added {out.added}, "
               f"changed {out.changed}, withdrawn {out.withdrawn}, unchanged {out.unchanged}")
    if out.forced_over:
        click.echo(f"quarantine overridden: {out.forced_over}")
    with engine.connect() as conn:
        written = versions_written(conn, snapshot_id, now)
    for rid, version, withdrawn in written:
        what = "withdrawn" if withdrawn else ("added" if version == 1 else f"version {version}")
        click.echo(f"  {what:<10} {rid}")
    for problem in out.problems:
        click.echo(f"  skipped    {problem}")
    click.echo(f"source {row.name!r} is fresh; run the pipeline (or 'deadline-pipeline run') to re-plan")
    return EXIT_OK


# --- subscribers accept --------------------------------------------------------------------------


def subscribers_accept(db_url: str | None, config: str | None) -> int:
    """``subscribers accept``: mirror the configuration's subscriber list as it is, withdrawing the
    subscribers planning held; returns the exit code. Raises :class:`_BadInput` for an unusable
    configuration or store, or a configuration without subscribers or subscriptions."""
    from deadline_pipeline.plan.service import NothingToPlan, sync_configuration

    cfg = _config(config)
    engine = _engine(db_url)
    try:
        hold = sync_configuration(engine, cfg, accept_removals=True)
    except NothingToPlan as exc:
        raise _BadInput(str(exc)) from None
    if hold is None:
        click.echo("no subscriber is held: the subscriber list withdraws at most "
                   f"{cfg.plan.max_subscriber_withdraw_share:.0%} of the subscribers with reminders to send; "
                   "nothing to accept")
        return EXIT_OK
    click.echo(f"accepted {hold.listed_in}: {len(hold.kept)} subscriber(s) missing from it withdrawn "
               f"({hold.removed} of {hold.owed} with reminders to send):")
    for ext in hold.kept:
        click.echo(f"  withdrawn  {ext}")
    click.echo("their reminders are cancelled at the next planning run: run the pipeline "
               "(or 'deadline-pipeline run') to re-plan")
    return EXIT_OK


# --- snapshots -----------------------------------------------------------------------------------


def snapshots_prune(keep_days: int, dry_run: bool, db_url: str | None, as_of: str | None) -> int:
    """``snapshots prune``; returns the exit code."""
    from deadline_pipeline.store.sources import (
        count_prunable_fetches,
        prunable_snapshots,
        prune_fetch_log,
        prune_snapshots,
    )

    if keep_days < 0:
        raise _BadInput(f"--keep-days must be 0 or more, got {keep_days}")
    before = _now(as_of) - timedelta(days=keep_days)
    engine = _engine(db_url)
    with engine.connect() as conn:
        candidates = prunable_snapshots(conn, before)
        fetches = count_prunable_fetches(conn, before)
    if dry_run:
        deleted = {c.id for c in candidates}
    else:
        with engine.begin() as conn:
            # The fetch log first: a snapshot re-fetched within the retention is kept by its log rows.
            fetches = prune_fetch_log(conn, before)
            deleted = set(prune_snapshots(conn, [c.id for c in candidates], before))
    verb = "would prune" if dry_run else "pruned"
    total = 0
    for c in candidates:
        if c.id in deleted:
            total += c.size
            click.echo(f"{verb} snapshot {c.id} of source {c.source}: fetched {instant_text(c.fetched_at)}, "
                       f"{c.size} bytes, {c.parse_status}")
    kept_now = len(candidates) - len(deleted)
    if kept_now:
        click.echo(f"kept {kept_now} snapshot(s) that became referenced or latest while pruning")
    click.echo(f"{verb} {len(deleted)} snapshot(s), {total} bytes, fetched before {instant_text(before)}; "
               "snapshots referenced by a rule version or a source's latest/current one are always kept")
    click.echo(f"{verb} {fetches} fetch log row(s) fetched before {before.isoformat()}; each source's latest is kept")
    return EXIT_OK


def snapshots_list(source: str, db_url: str | None) -> int:
    from deadline_pipeline.store.sources import list_snapshots

    engine = _existing_store(db_url)
    with engine.connect() as conn:
        row = _source_row(conn, source)
        snaps = list_snapshots(conn, row.id)
    click.echo(f"source {source}: status {row.status}, current snapshot {row.current_snapshot_id}, "
               f"last fresh {instant_text(row.last_fresh_at) if row.last_fresh_at else 'never'}")
    for s in snaps:
        err = f"  {s.parse_error.splitlines()[0][:160]}" if s.parse_error else ""
        click.echo(f"  {s.id:>6}  {instant_text(s.fetched_at)}  {s.parse_status:<11} {s.size:>9} B  "
                   f"{s.sha256[:12]}{err}")
    return EXIT_OK


# --- validate ------------------------------------------------------------------------------------


def validate_file(fmt: str, file: str, timezone: str | None) -> int:
    """``validate``: strict parse; every problem printed as ``FILE: position: message``."""
    from deadline_pipeline.ingest.parsers import ParseError, parse_payload

    path = Path(file)
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise _BadInput(f"{file}: cannot read: {exc.strerror}") from None
    try:
        parsed = parse_payload(fmt, content, source=path.name, default_tz=timezone)
    except ParseError as exc:
        click.echo(f"{file}: {exc}")
        click.echo(f"{file}: INVALID (the whole payload is unusable)")
        return EXIT_RED
    except ValueError as exc:  # --timezone unknown
        raise _BadInput(str(exc)) from None
    from deadline_pipeline.ingest.parsers.base import ParseProblem
    from deadline_pipeline.plan.occurrences import over_budget

    verdict = _skipped_as_ingest_counts(parsed.problems)  # the parser's problems, as ingest judges them
    # A rule that planning would skip over the work budget, or plan only up to the occurrence cap, is
    # refused here, before it goes live.
    parsed.problems += [ParseProblem(f"rule {rule_id!r}", message)
                        for rule_id, message in over_budget(parsed.rules, timezone)]
    for p in parsed.problems:
        click.echo(f"{file}: {p.position}: {p.message}")
    if parsed.problems:
        if not parsed.rules:
            click.echo(f"{file}: no rules found")
        click.echo(f"{file}: INVALID: {len(parsed.problems)} problem(s), {len(parsed.rules)} rule(s) readable"
                   + verdict)
        return EXIT_RED
    if not parsed.rules:
        # Said as the reason, not as "0 problem(s)": applied, a file without rules would withdraw
        # every rule in force (the quarantine would hold it).
        click.echo(f"{file}: INVALID: no rules found (no VEVENT, VTODO, entry or row with a due date)")
        return EXIT_RED
    click.echo(f"{file}: OK, {len(parsed.rules)} rule(s)")
    return EXIT_OK


def _skipped_as_ingest_counts(problems: list) -> str:
    """What ingest does with a parser's ``problems`` (:class:`~deadline_pipeline.ingest.parsers.base.ParseProblem`),
    as the tail of validate's verdict line (``""`` for none): ``"; 2 record(s) skipped (…rules_complete is red)"`` for
    those that skip a record as ingest counts them (:func:`~deadline_pipeline.ingest.parsers.base.counted_problems`,
    for a source with no rule in force yet), else that parsing skipped none (every problem is a note).

    The same decision as ``run``'s: a line validate listed while ``run`` planned the component without
    it and kept every check green (an RDATE folded without its space lost an occurrence) is what this
    keeps from happening unseen again."""
    from deadline_pipeline.ingest.parsers.base import counted_problems

    skipped = len(counted_problems(problems, ()))
    if not problems:
        return ""
    if not skipped:
        return "; parsing skipped no record (ingest reads every rule listed as readable; rules_complete green)"
    return (f"; {skipped} record(s) skipped (ingest keeps their rules' last good versions in force and "
            "rules_complete is red)")


# --- registration --------------------------------------------------------------------------------


def register(main: click.Group) -> None:
    """Add ``rules``, ``source``, ``subscribers``, ``snapshots`` and ``validate`` to the command line."""
    from deadline_pipeline.ingest.parsers import PARSERS

    rules = _group(main, "rules", "Rules as the sources state them, and how they change.")
    source = _group(main, "source", "Operate on one configured source.")
    snaps = _group(main, "snapshots", "Raw snapshots fetched from sources.")

    @rules.command("diff")
    @click.argument("source_name", metavar="SOURCE")
    @click.option("--from", "from_id", type=int, help="Older snapshot id (default: the second-last applied).")
    @click.option("--to", "to_id", type=int, help="Newer snapshot id (default: the last applied).")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
    @_DB_URL
    @_CONFIG
    @_guarded
    def diff_cmd(source_name, from_id, to_id, as_json, db_url, config):
        """Show what changed between two snapshots of SOURCE: added, moved (old -> new instant, UTC),
        withdrawn, reworded, renamed (old id -> new id: one rule whose id changed, due at the same
        time and naming the same thing; it keeps its reminders), and unparsed (kept in force: its
        record in the newer snapshot failed to parse, so the last good version stays). A rename
        that cannot be paired unambiguously shows as withdrawn plus added."""
        sys.exit(rules_diff(source_name, from_id, to_id, as_json, db_url, config))

    @source.command("accept")
    @click.argument("snapshot_id", metavar="SNAPSHOT", type=int)
    @_DB_URL
    @_CONFIG
    @_AS_OF
    @_guarded
    def accept_cmd(snapshot_id, db_url, config, as_of):
        """Apply the quarantined SNAPSHOT after a human looked at it, and mark its source fresh."""
        sys.exit(source_accept(snapshot_id, db_url, config, as_of))

    subscribers = _group(main, "subscribers", "The subscribers planning mirrors from the configuration.")

    @subscribers.command("accept")
    @_DB_URL
    @_CONFIG
    @_guarded
    def subscribers_accept_cmd(db_url, config):
        """Withdraw the subscribers planning kept because the subscriber list left out more than
        plan.max_subscriber_withdraw_share of them at once, after a human checked the list (their
        reminders are cancelled at the next planning run)."""
        sys.exit(subscribers_accept(db_url, config))

    @snaps.command("list")
    @click.argument("source_name", metavar="SOURCE")
    @_DB_URL
    @_guarded
    def list_cmd(source_name, db_url):
        """List the snapshots of SOURCE, newest first, with their parse status."""
        sys.exit(snapshots_list(source_name, db_url))

    @snaps.command("prune")
    @click.option("--keep-days", type=int, required=True, help="Keep every snapshot fetched within this many days.")
    @click.option("--dry-run", is_flag=True, help="Only print what would be pruned.")
    @_DB_URL
    @_AS_OF
    @_guarded
    def prune_cmd(keep_days, dry_run, db_url, as_of):
        """Delete old snapshots that no rule version references and that are not a source's latest or
        current snapshot, nor re-fetched within the retention; print each one pruned. Old fetch log
        rows go too (each source's latest is kept)."""
        sys.exit(snapshots_prune(keep_days, dry_run, db_url, as_of))

    @main.command("validate")
    @click.option("--format", "fmt", type=click.Choice(sorted(PARSERS)), required=True, help="The source format.")
    @click.option("--timezone", help="Zone for times written without one (the source's `timezone` setting).")
    @click.argument("file", type=click.Path(dir_okay=False))
    @_guarded
    def validate_cmd(fmt, timezone, file):
        """Parse FILE strictly: exit 1 listing every problem with its position, 0 when it is clean."""
        sys.exit(validate_file(fmt, file, timezone))
