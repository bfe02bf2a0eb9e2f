"""SQL of the delivery stage: the claimable question, the leased batch claim, and result writes that
only a lease holder may make.

Lease rules (DESIGN.md, "Alert lifecycle"): a claim sets ``lease_owner`` and ``lease_expires_at``;
only expiry frees a lease; a result is written with ``WHERE lease_owner = :me`` so that a sender
whose lease was taken over records its attempt but never overwrites the new owner's state.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection, and_, func, insert, or_, select, update

from deadline_pipeline.store.schema import (
    alerts,
    delivery_attempts,
    obligations,
    rule_versions,
    sources,
    subscribers,
)

CLAIMABLE_STATES = ("pending", "retry_wait", "claimed")
FINAL_STATES = ("delivered", "escalated", "cancelled", "superseded", "skipped")


def claimable(now: datetime):
    """The admission condition of an alert at ``now`` (aware UTC), null-safe throughout."""
    return and_(
        alerts.c.status.in_(CLAIMABLE_STATES),
        or_(alerts.c.lease_expires_at.is_(None), alerts.c.lease_expires_at <= now),
        alerts.c.send_at <= now,
        or_(alerts.c.next_attempt_at.is_(None), alerts.c.next_attempt_at <= now),
    )


def count_claimable(conn: Connection, now: datetime) -> int:
    """The sensor's one cheap indexed question: how many alerts could be claimed now."""
    return conn.execute(select(func.count()).select_from(alerts).where(claimable(now))).scalar_one()


def claim_batch(conn: Connection, *, owner: str, now: datetime, lease_seconds: float, limit: int) -> list[int]:
    """Claim up to ``limit`` due alerts in one statement; returns their ids.

    PostgreSQL selects with ``FOR UPDATE SKIP LOCKED`` so concurrent sweeps take disjoint rows without
    waiting; SQLite serialises writers, and the outer ``WHERE`` re-checks admission, which makes the
    statement a compare-and-swap there.
    """
    pick = select(alerts.c.id).where(claimable(now)).order_by(alerts.c.send_at, alerts.c.id).limit(limit)
    if conn.dialect.name == "postgresql":
        pick = pick.with_for_update(skip_locked=True)
    stmt = (
        update(alerts)
        .where(alerts.c.id.in_(pick.scalar_subquery()), claimable(now))
        .values(status="claimed", lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_seconds),
                updated_at=now)
        .returning(alerts.c.id)
    )
    return sorted(r[0] for r in conn.execute(stmt).all())


def load_claimed(conn: Connection, ids: list[int]) -> list[dict]:
    """Everything a channel needs to send each claimed alert."""
    if not ids:
        return []
    rows = conn.execute(
        select(alerts.c.id, alerts.c.dedup_key, alerts.c.kind, alerts.c.channel, alerts.c.offset_seconds,
               alerts.c.attempts, alerts.c.send_at, obligations.c.title, obligations.c.rule_id,
               obligations.c.due_at, subscribers.c.external_id.label("subscriber"), subscribers.c.email,
               subscribers.c.webhook_url, subscribers.c.timezone, sources.c.name.label("source"),
               obligations.c.rule_version, obligations.c.source_id, rule_versions.c.payload)
        .join(obligations, obligations.c.id == alerts.c.obligation_id)
        # The rule version the obligation was planned from gives the link and note to show.
        .outerjoin(rule_versions, and_(rule_versions.c.source_id == obligations.c.source_id,
                                       rule_versions.c.rule_id == obligations.c.rule_id,
                                       rule_versions.c.version == obligations.c.rule_version))
        .join(subscribers, subscribers.c.id == obligations.c.subscriber_id)
        .join(sources, sources.c.id == obligations.c.source_id)
        .where(alerts.c.id.in_(ids))
        .order_by(alerts.c.send_at, alerts.c.id)
    ).mappings().all()
    return [dict(r) for r in rows]


def start_attempt(conn: Connection, *, alert_id: int, attempt: int, owner: str, now: datetime) -> int:
    """Record that a send is about to start (before any network I/O, so a crash leaves a trace)."""
    res = conn.execute(insert(delivery_attempts).values(alert_id=alert_id, attempt=attempt, lease_owner=owner,
                                                        started_at=now))
    return res.inserted_primary_key[0]


def finish_attempt(conn: Connection, attempt_id: int, *, now: datetime, outcome: str,
                   provider_message_id: str | None = None, error: str | None = None) -> None:
    conn.execute(update(delivery_attempts).where(delivery_attempts.c.id == attempt_id).values(
        finished_at=now, outcome=outcome, provider_message_id=provider_message_id, error=error))


def mark_delivered(conn: Connection, alert_id: int, *, owner: str, now: datetime, provider_message_id: str) -> bool:
    """Mark delivered if ``owner`` still holds the lease. Returns False when the lease was lost."""
    res = conn.execute(
        update(alerts)
        .where(alerts.c.id == alert_id, alerts.c.lease_owner == owner, alerts.c.status == "claimed")
        .values(status="delivered", provider_message_id=provider_message_id, delivered_at=now,
                attempts=alerts.c.attempts + 1, lease_owner=None, lease_expires_at=None, last_error=None,
                next_attempt_at=None, updated_at=now)
    )
    return res.rowcount == 1


def mark_failed(conn: Connection, alert_id: int, *, owner: str, now: datetime, error: str,
                next_attempt_at: datetime | None, escalate: bool) -> bool:
    """Record one consumed attempt: back to ``retry_wait`` until ``next_attempt_at``, or ``escalated``.
    Only while ``owner`` holds the lease; returns False when it was lost."""
    res = conn.execute(
        update(alerts)
        .where(alerts.c.id == alert_id, alerts.c.lease_owner == owner, alerts.c.status == "claimed")
        .values(status="escalated" if escalate else "retry_wait", attempts=alerts.c.attempts + 1,
                last_error=error[:4000], next_attempt_at=None if escalate else next_attempt_at,
                status_reason=error[:4000] if escalate else None,
                lease_owner=None, lease_expires_at=None, updated_at=now)
    )
    return res.rowcount == 1
