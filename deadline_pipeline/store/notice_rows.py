"""SQL of the rows planning writes besides reminders: correction, cancellation and missed-reminder
notices inserted once (an existing one is kept, so a re-plan never sends a second notice for the same
change), the cancellation of notices not yet sent, and obligations inserted only if their key is not
stored (the escalations of misses left while unwatched).

Separate because these are insert-if-absent writes with their own idempotence rule, not keyed
upserts of a staged chunk.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Connection,
    select,
    update,
)

from deadline_pipeline.states import PLANNED, UNSENT, AlertState
from deadline_pipeline.store.schema import (
    alerts,
    obligations,
)
from deadline_pipeline.store.upsert import dialect_insert, pages


def set_alert_status(conn: Connection, alert_id: int, status: str, reason: str | None, now: datetime) -> None:
    conn.execute(update(alerts).where(alerts.c.id == alert_id, alerts.c.status.in_(PLANNED))
                 .values(status=status, status_reason=reason, updated_at=now))


def insert_notices(conn: Connection, rows: list[dict]) -> int:
    """Insert correction / cancellation alerts; an existing one (same obligation revision) is kept,
    so a re-plan never sends a second notice for the same change. Returns rows inserted."""
    if not rows:
        return 0
    n = 0
    for part in pages(rows, 500):
        stmt = dialect_insert(conn, alerts).values(list(part)).on_conflict_do_nothing().returning(alerts.c.id)
        n += len(conn.execute(stmt).all())
    return n


def cancellation_notices(conn: Connection, obligation_ids: list[int]) -> list[tuple[int, int, str, str, int]]:
    """``(alert id, obligation id, channel, status, revision)`` of the cancellation notices of these
    obligations for their current revision (the withdrawal they announced), in id order."""
    a, o = alerts, obligations
    out: list[tuple[int, int, str, str, int]] = []
    for part in pages(obligation_ids, 500):
        out.extend(tuple(r) for r in conn.execute(
            select(a.c.id, a.c.obligation_id, a.c.channel, a.c.status, a.c.revision)
            .join(o, o.c.id == a.c.obligation_id)
            .where(a.c.obligation_id.in_(part), a.c.kind == "cancellation", a.c.revision == o.c.revision)
            .order_by(a.c.id)).all())
    return out


def cancel_unsent_notices(conn: Connection, alert_ids: list[int], reason: str, now: datetime) -> int:
    """Cancel these alerts where no send has begun (``pending`` or ``retry_wait``; a ``claimed`` one is
    its sender's), with ``reason``. Returns how many."""
    n = 0
    for part in pages(alert_ids, 500):
        n += conn.execute(update(alerts).where(
            alerts.c.id.in_(part), alerts.c.status.in_(UNSENT)
        ).values(status=AlertState.CANCELLED, status_reason=reason, updated_at=now)).rowcount
    return n


def insert_obligations_if_new(conn: Connection, rows: list[dict]) -> dict[str, int]:
    """Insert obligation rows (``obligations`` columns) whose key is not stored yet; an existing key
    is left as it is. Returns obligation_key → id of the rows inserted."""
    out: dict[str, int] = {}
    for part in pages(rows, 500):
        stmt = (dialect_insert(conn, obligations).values(list(part)).on_conflict_do_nothing()
                .returning(obligations.c.id, obligations.c.obligation_key))
        out.update({key: i for i, key in conn.execute(stmt).all()})
    return out
