"""``deadline-pipeline alerts retry|cancel|acknowledge ID…``: a human acting on single alerts."""

from __future__ import annotations

import os
import sys

import click


def register(main: click.Group) -> None:
    @main.group()
    def alerts() -> None:
        """Act on single alerts by id (ids are in the checks' offenders and in `status`)."""

    def _common(fn):
        fn = click.argument("alert_ids", nargs=-1, type=int, required=True)(fn)
        fn = click.option("--by", default=lambda: os.environ.get("USER", "unknown"), show_default="$USER",
                          help="Who acts (recorded in the alert).")(fn)
        fn = click.option("--db-url", envvar="DEADLINE_DB_URL",
                          help="Store URL (default: the embedded SQLite file).")(fn)
        return click.option("--as-of", help="Record the action at this ISO 8601 instant.")(fn)

    def _act(action, alert_ids, by, db_url, as_of, verb: str, others: str) -> None:
        from deadline_pipeline.cli import EXIT_RED, open_store
        from deadline_pipeline.commands.ops_cmds import _now

        now = _now(as_of)
        with open_store(db_url).begin() as conn:
            done = action(conn, list(alert_ids), by=by, now=now)
        click.echo(f"{verb} {done} of {len(alert_ids)} alert(s) as {by}")
        if done < len(alert_ids):
            click.echo(others, err=True)
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
