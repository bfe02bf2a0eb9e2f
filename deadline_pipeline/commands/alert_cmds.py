"""``deadline-pipeline alerts retry|cancel|acknowledge ID…``: a human acting on single alerts."""

from __future__ import annotations

import getpass
import sys
from datetime import datetime

import click

from deadline_pipeline.instants import instant_text


def actor(by: str | None) -> str:
    """Who acts: ``--by`` when given, else the operating-system user (``getpass.getuser()``: $LOGNAME,
    $USER, $LNAME, $USERNAME, then the password database). Exits 2 when neither is known: an action
    recorded as "unknown" cannot be followed up."""
    if by is not None:
        if not by.strip():
            _bad_input("--by: empty; give the name of who acts")
        return by.strip()
    try:
        name = getpass.getuser()
    except (OSError, KeyError):  # no variable and no passwd entry (a container with a bare uid)
        name = ""
    if not name:
        _bad_input("cannot tell who you are (no $USER/$LOGNAME and no user name for this uid); pass --by NAME")
    return name


def _bad_input(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def _ids(ids: list[int]) -> str:
    return ", ".join(str(i) for i in ids)


def blocked_reason(state: tuple | None, now: datetime) -> str:
    """Why an alert was left alone, from its state before the action: ``"no such alert"``, ``"it is
    delivered"``, ``"it is pending and being sent right now (lease held until …)"``, ``"it is escalated,
    already acknowledged by alice at …"``."""
    if state is None:
        return "no such alert"
    status, _updated, ack_at, ack_by, lease = state
    text = f"it is {status}"
    if lease is not None and lease > now:
        text += f" and being sent right now (lease held until {instant_text(lease)})"
    if ack_at is not None:
        text += f", already acknowledged by {ack_by} at {instant_text(ack_at)}"
    return text


def register(main: click.Group) -> None:
    @main.group()
    def alerts() -> None:
        """Act on single alerts by id (ids are in the checks' offenders and in `status`)."""

    def _common(fn):
        fn = click.argument("alert_ids", nargs=-1, type=int, required=True)(fn)
        fn = click.option("--by", help="Who acts (recorded in the alert); default: the operating-system user "
                          "running the command. Required when that cannot be told.")(fn)
        fn = click.option("--db-url", envvar="DEADLINE_DB_URL",
                          help="Store URL (default: the embedded SQLite file).")(fn)
        return click.option("--as-of", help="Record the action at this ISO 8601 instant.")(fn)

    def _act(action, alert_ids, by, db_url, as_of, verb: str, others: str) -> None:
        from deadline_pipeline.commands.common import EXIT_RED, open_store
        from deadline_pipeline.commands.ops_cmds import _now
        from deadline_pipeline.store.operations import alert_states

        by = actor(by)
        now = _now(as_of)
        ids = list(dict.fromkeys(alert_ids))  # an id given twice is acted on, and reported, once
        with open_store(db_url).begin() as conn:
            before = alert_states(conn, ids)
            action(conn, ids, by=by, now=now)
            after = alert_states(conn, ids)
        done = [i for i in ids if i in before and after.get(i) != before[i]]
        click.echo(f"{verb} {len(done)} of {len(ids)} alert(s) as {by}" + (f": {_ids(done)}" if done else ""))
        refused = [i for i in ids if i not in done]
        for i in refused:
            click.echo(f"alert {i}: {blocked_reason(before.get(i), now)}", err=True)
        if any(before.get(i) is not None for i in refused):
            # Only about alerts that exist: after "alert 999: no such alert" alone it read as if
            # some other alert had been left alone.
            click.echo(others, err=True)
        if refused:
            sys.exit(EXIT_RED)

    @alerts.command("retry")
    @_common
    def retry(alert_ids, by, db_url, as_of) -> None:
        """Queue escalated, cancelled or skipped alerts again, due now, with a fresh attempt budget
        (same idempotency key; who and when are recorded on the alert)."""
        from deadline_pipeline.store.health import retry_alerts

        _act(retry_alerts, alert_ids, by, db_url, as_of, "queued",
             "the others are not escalated, cancelled or skipped")

    @alerts.command("cancel")
    @_common
    def cancel(alert_ids, by, db_url, as_of) -> None:
        """Cancel open alerts (pending, waiting to retry, skipped) that are not being sent right now."""
        from deadline_pipeline.store.health import cancel_alerts

        _act(cancel_alerts, alert_ids, by, db_url, as_of, "cancelled",
             "the others are delivered, escalated, already cancelled, or being sent (lease held)")

    @alerts.command("acknowledge")
    @_common
    def acknowledge(alert_ids, by, db_url, as_of) -> None:
        """Acknowledge escalated alerts (the escalations_acknowledged check stops counting them)."""
        from deadline_pipeline.store.health import acknowledge as ack

        _act(ack, alert_ids, by, db_url, as_of, "acknowledged",
             "the others are not escalated or were already acknowledged")
