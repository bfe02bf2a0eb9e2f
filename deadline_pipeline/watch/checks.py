"""The invariants the watchers evaluate, as plain functions of the store and a clock.

Both the Dagster asset checks and the ``watchdog`` command call these, so the UI and cron agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Engine

from deadline_pipeline.store import health


@dataclass
class CheckOutcome:
    """``passed``; ``count`` of offenders; ``offenders``: the worst few, JSON-safe; ``summary``: one line."""

    name: str
    passed: bool
    count: int
    summary: str
    offenders: list[dict] = field(default_factory=list)


def alerts_reconciled(engine: Engine, now: datetime, grace: timedelta = timedelta(minutes=30)) -> CheckOutcome:
    """Alerts due before ``now - grace`` that are neither delivered, escalated, cancelled nor skipped
    must be zero: each one is a reminder that should have gone out and did not."""
    with engine.connect() as conn:
        count, oldest = health.overdue_alerts(conn, now - grace)
    offenders = [
        {"alert_id": r["id"], "send_at": r["send_at"].isoformat(), "status": r["status"],
         "channel": r["channel"], "subscriber": r["subscriber"], "title": r["title"],
         "attempts": r["attempts"], "last_error": r["last_error"]}
        for r in oldest
    ]
    if count:
        summary = (f"{count} alert(s) overdue by more than {grace}; oldest due {oldest[0]['send_at'].isoformat()}"
                   f" ({oldest[0]['status']})")
    else:
        summary = f"every alert due before {(now - grace).isoformat()} is delivered, escalated or cancelled"
    return CheckOutcome("alerts_reconciled", count == 0, count, summary, offenders)
