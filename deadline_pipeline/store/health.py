"""SQL the watchers read: heartbeats and the reconciliation of due alerts."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, func, select

from deadline_pipeline.store.schema import alerts, heartbeats, obligations, subscribers
from deadline_pipeline.store.upsert import upsert

HANDLED_STATES = ("delivered", "escalated", "cancelled", "superseded", "skipped")


def beat(conn: Connection, component: str, *, started_at: datetime, completed_at: datetime, outcome: str,
         detail: str | None = None) -> None:
    """Record the end of one run of ``component`` (also when it found nothing to do)."""
    upsert(conn, heartbeats, [dict(component=component, last_started_at=started_at,
                                   last_completed_at=completed_at, last_outcome=outcome, detail=detail)],
           conflict=["component"], update=["last_started_at", "last_completed_at", "last_outcome", "detail"])


def read_heartbeats(conn: Connection) -> dict[str, dict]:
    return {r["component"]: dict(r) for r in conn.execute(select(*heartbeats.c)).mappings().all()}


def overdue_alerts(conn: Connection, cutoff: datetime, limit: int = 10) -> tuple[int, list[dict]]:
    """Alerts whose ``send_at`` is before ``cutoff`` and that are neither delivered, escalated nor
    otherwise handled: (count, the oldest ``limit`` of them)."""
    cond = (alerts.c.send_at < cutoff) & alerts.c.status.not_in(HANDLED_STATES)
    count = conn.execute(select(func.count()).select_from(alerts).where(cond)).scalar_one()
    rows = conn.execute(
        select(alerts.c.id, alerts.c.send_at, alerts.c.status, alerts.c.channel, alerts.c.attempts,
               alerts.c.last_error, obligations.c.title, subscribers.c.external_id.label("subscriber"))
        .join(obligations, obligations.c.id == alerts.c.obligation_id)
        .join(subscribers, subscribers.c.id == obligations.c.subscriber_id)
        .where(cond).order_by(alerts.c.send_at, alerts.c.id).limit(limit)
    ).mappings().all()
    return count, [dict(r) for r in rows]


def alerts_by_state(conn: Connection) -> dict[str, int]:
    return dict(conn.execute(select(alerts.c.status, func.count()).group_by(alerts.c.status)).all())
