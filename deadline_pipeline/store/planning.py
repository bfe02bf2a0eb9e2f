"""SQL of the planning stage: subscribers, subscriptions, and the keyed upserts of obligations and
alerts. Re-running any of it with the same input changes no row."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import Connection, and_, select, update

from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.store.schema import alerts, obligations, sources, subscribers, subscriptions
from deadline_pipeline.store.sources import latest_versions
from deadline_pipeline.store.upsert import chunks, upsert

OPEN_ALERT_STATES = ("pending", "retry_wait", "claimed")


def sync_subscribers(conn: Connection, rows: list[dict]) -> dict[str, int]:
    """Upsert subscribers (``external_id, tenant, email, webhook_url, timezone``); subscribers absent
    from ``rows`` become inactive (never deleted). Returns external_id → id."""
    for r in rows:
        r.setdefault("active", True)
    upsert(conn, subscribers, rows, conflict=["external_id"],
           update=["tenant", "email", "webhook_url", "timezone", "active"])
    ids = {r["external_id"] for r in rows}
    existing = conn.execute(select(subscribers.c.id, subscribers.c.external_id)).all()
    gone = [i for i, ext in existing if ext not in ids]
    for part in chunks(gone, 500):
        conn.execute(update(subscribers).where(subscribers.c.id.in_(part)).values(active=False))
    return {ext: i for i, ext in existing if ext in ids}


def sync_subscriptions(conn: Connection, rows: list[dict]) -> None:
    """Upsert subscription rows (``name, subscriber_id, source_id, rule_patterns, offsets, channels``);
    rows absent from ``rows`` become inactive."""
    for r in rows:
        r.setdefault("active", True)
    upsert(conn, subscriptions, rows, conflict=["name", "subscriber_id", "source_id"],
           update=["rule_patterns", "offsets", "channels", "active"])
    wanted = {(r["name"], r["subscriber_id"], r["source_id"]) for r in rows}
    existing = conn.execute(select(subscriptions.c.id, subscriptions.c.name, subscriptions.c.subscriber_id,
                                   subscriptions.c.source_id)).all()
    gone = [i for i, n, s, src in existing if (n, s, src) not in wanted]
    for part in chunks(gone, 500):
        conn.execute(update(subscriptions).where(subscriptions.c.id.in_(part)).values(active=False))


def active_targets(conn: Connection):
    """Rows of active subscriptions joined with their active subscriber and source."""
    return conn.execute(
        select(subscriptions.c.rule_patterns, subscriptions.c.offsets, subscriptions.c.channels,
               subscribers.c.id.label("subscriber_id"), subscribers.c.external_id, subscribers.c.tenant,
               subscribers.c.timezone, subscribers.c.email, subscribers.c.webhook_url,
               sources.c.id.label("source_id"), sources.c.name.label("source"))
        .join(subscribers, subscribers.c.id == subscriptions.c.subscriber_id)
        .join(sources, sources.c.id == subscriptions.c.source_id)
        .where(subscriptions.c.active.is_(True), subscribers.c.active.is_(True))
        .order_by(subscribers.c.external_id, sources.c.name)
    ).mappings().all()


def active_rules(conn: Connection, source_id: int) -> tuple[list[tuple[int, RuleRecord]], set[str]]:
    """The latest active version of each rule of a source, and the ids of withdrawn rules."""
    latest = latest_versions(conn, source_id)
    rules = [(v["version"], RuleRecord.from_payload(v["payload"])) for v in latest.values() if not v["withdrawn"]]
    withdrawn = {rid for rid, v in latest.items() if v["withdrawn"]}
    return sorted(rules, key=lambda r: r[1].rule_id), withdrawn


def existing_keys(conn: Connection, keys: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in chunks(list(keys), 500):
        out.update(dict(conn.execute(
            select(obligations.c.obligation_key, obligations.c.id).where(obligations.c.obligation_key.in_(part))
        ).all()))
    return out


def upsert_obligations(conn: Connection, rows: list[dict]) -> tuple[int, int, dict[str, int]]:
    """Upsert obligations on ``obligation_key``. Returns (inserted, updated, key → id)."""
    before = existing_keys(conn, [r["obligation_key"] for r in rows])
    touched = upsert(conn, obligations, rows, conflict=["obligation_key"],
                     update=["rule_version", "title", "due_at", "status", "planned_at"],
                     compare=["rule_version", "title", "due_at", "status"])
    inserted = sum(1 for r in rows if r["obligation_key"] not in before)
    ids = existing_keys(conn, [r["obligation_key"] for r in rows])
    return inserted, touched - inserted, ids


def upsert_alerts(conn: Connection, rows: list[dict]) -> int:
    """Insert new alerts; for existing ones move ``send_at`` only while still open (pending or waiting
    to retry). A delivered alert is history and is never rewritten. Returns rows inserted or moved."""
    return upsert(conn, alerts, rows, conflict=["obligation_id", "offset_seconds", "channel", "kind"],
                  update=["send_at", "updated_at"], compare=["send_at"],
                  extra_where=alerts.c.status.in_(("pending", "retry_wait")))


def open_obligations(conn: Connection, source_ids: list[int], since: datetime):
    """Active obligations of these sources due at or after ``since``: (id, key, rule_id, source_id)."""
    if not source_ids:
        return []
    return conn.execute(
        select(obligations.c.id, obligations.c.obligation_key, obligations.c.rule_id, obligations.c.source_id)
        .where(obligations.c.source_id.in_(source_ids), obligations.c.status == "active",
               obligations.c.due_at >= since)
    ).all()


def withdraw_obligations(conn: Connection, ids: list[int], reason: str, now: datetime) -> int:
    """Mark obligations withdrawn and cancel their open alerts (never delete). Returns alerts cancelled."""
    cancelled = 0
    for part in chunks(ids, 500):
        conn.execute(update(obligations).where(obligations.c.id.in_(part)).values(status="withdrawn",
                                                                                 planned_at=now))
        cancelled += conn.execute(
            update(alerts)
            .where(and_(alerts.c.obligation_id.in_(part), alerts.c.status.in_(("pending", "retry_wait")),
                        # A claimed alert whose lease is live is mid-send; it finishes as delivered.
                        alerts.c.lease_owner.is_(None)))
            .values(status="cancelled", status_reason=reason, updated_at=now)
        ).rowcount or 0
    return cancelled
