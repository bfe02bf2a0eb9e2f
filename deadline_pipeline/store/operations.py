"""SQL that only the command line reads: the state of alerts around a hand action, the ``status``
and ``run`` summaries' counts, a subscriber's outbox for ``reminders``, and the rule versions an
accepted snapshot wrote. Every instant is aware UTC; nothing here writes."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Connection, and_, func, or_, select

from deadline_pipeline.states import OPEN, ObligationState
from deadline_pipeline.store.schema import alerts, obligations, rule_versions, sources, subscribers

# The tables whose growth over a run ``deadline-pipeline run`` reports, by the names it prints.
_COUNTED = {"rule_versions": rule_versions, "obligations": obligations, "alerts": alerts}


def alert_states(conn: Connection, ids: list[int]) -> dict[int, tuple]:
    """``{id: (status, updated_at, acknowledged_at, acknowledged_by, lease_expires_at)}`` of the
    alerts among ``ids`` that exist (instants aware UTC or None); ``{}`` for no ids. Comparing it
    before and after a hand action tells which ids the action took."""
    if not ids:
        return {}
    rows = conn.execute(select(alerts.c.id, alerts.c.status, alerts.c.updated_at, alerts.c.acknowledged_at,
                               alerts.c.acknowledged_by, alerts.c.lease_expires_at)
                        .where(alerts.c.id.in_(ids))).all()
    return {r.id: (r.status, r.updated_at, r.acknowledged_at, r.acknowledged_by, r.lease_expires_at) for r in rows}


def row_counts(conn: Connection, names: tuple[str, ...] = tuple(_COUNTED)) -> dict[str, int]:
    """table name → its number of rows, for ``names`` among ``rule_versions``, ``obligations`` and
    ``alerts`` (default: all three), one count query each."""
    return {name: conn.execute(select(func.count()).select_from(_COUNTED[name])).scalar_one() for name in names}


def obligations_by_state(conn: Connection) -> dict[str, int]:
    """obligation status → how many obligations have it (statuses with none are absent)."""
    return dict(conn.execute(select(obligations.c.status, func.count()).group_by(obligations.c.status)).all())


def rule_version_counts(conn: Connection) -> dict[tuple[int, bool], int]:
    """(source_id, withdrawn) → how many rule versions of that source are withdrawals (True) or
    not (False); pairs with none are absent."""
    return {(sid, bool(w)): n for sid, w, n in conn.execute(
        select(rule_versions.c.source_id, rule_versions.c.withdrawn, func.count())
        .group_by(rule_versions.c.source_id, rule_versions.c.withdrawn)).all()}


def count_active_obligations_due(conn: Connection, lo: datetime, hi: datetime) -> int:
    """How many active obligations are due in ``[lo, hi]`` (aware UTC)."""
    return conn.execute(select(func.count()).select_from(obligations).where(
        obligations.c.status == ObligationState.ACTIVE, obligations.c.due_at >= lo,
        obligations.c.due_at <= hi)).scalar_one()


def _subscriber_alert_rows(conn: Connection, subscriber_id: str, condition) -> list[dict]:
    """The rows :func:`subscriber_alerts` describes, of the alerts matching ``condition``."""
    rows = conn.execute(
        select(alerts.c.id, alerts.c.dedup_key, alerts.c.kind, alerts.c.channel, alerts.c.offset_seconds,
               alerts.c.send_at, alerts.c.status, alerts.c.status_reason, alerts.c.delivered_at, alerts.c.attempts,
               alerts.c.last_error, alerts.c.next_attempt_at, obligations.c.obligation_key, obligations.c.title,
               obligations.c.rule_id,
               # The instant the alert was planned for, not the obligation's: after a move the
               # obligation's new instant was shown beside a superseded or delivered reminder that
               # was planned (and sent) for the old one. NULL only in rows predating the column.
               func.coalesce(alerts.c.due_at, obligations.c.due_at).label("due_at"),
               obligations.c.due_at.label("obligation_due_at"), sources.c.name.label("source"),
               subscribers.c.timezone)
        .join(obligations, obligations.c.id == alerts.c.obligation_id)
        .join(subscribers, subscribers.c.id == obligations.c.subscriber_id)
        .join(sources, sources.c.id == obligations.c.source_id)
        .where(subscribers.c.external_id == subscriber_id, condition)
        .order_by(alerts.c.send_at, alerts.c.id)
    ).mappings().all()
    return [dict(r) for r in rows]


def subscriber_alerts(conn: Connection, subscriber_id: str, start: datetime, end: datetime) -> list[dict]:
    """Alerts of the subscriber with external id ``subscriber_id`` whose send instant or delivery lies
    in ``[start, end)`` (aware UTC), plus those still open (:data:`~deadline_pipeline.states.OPEN`)
    from before ``start``, ordered by ``send_at`` then id. Each a dict of the alert's ``id, dedup_key,
    kind, channel, offset_seconds, send_at, status, status_reason, delivered_at, attempts, last_error,
    next_attempt_at`` (the offset from the due instant in seconds), ``due_at``: the due instant the
    alert was planned for (a correction: the new one; the obligation's for a row written before
    alerts recorded it), its obligation's ``obligation_key, title, rule_id`` and current due instant
    ``obligation_due_at`` (another instant than ``due_at`` once the deadline moved), the ``source`` name and the
    subscriber's ``timezone`` (IANA name)."""
    in_window = or_(and_(alerts.c.send_at >= start, alerts.c.send_at < end),
                    and_(alerts.c.delivered_at >= start, alerts.c.delivered_at < end),
                    and_(alerts.c.send_at < start, alerts.c.status.in_(OPEN)))
    return _subscriber_alert_rows(conn, subscriber_id, in_window)


def subscriber_alerts_by_key(conn: Connection, subscriber_id: str, dedup_keys: Sequence[str]) -> list[dict]:
    """The alerts of the subscriber with external id ``subscriber_id`` whose ``dedup_key`` is one of
    ``dedup_keys``, wherever their times lie, as :func:`subscriber_alerts` gives them (the keys
    asked in chunks of 500 bound parameters)."""
    keys = list(dict.fromkeys(dedup_keys))
    out: list[dict] = []
    for i in range(0, len(keys), 500):
        out += _subscriber_alert_rows(conn, subscriber_id, alerts.c.dedup_key.in_(keys[i:i + 500]))
    return sorted(out, key=lambda r: (r["send_at"], r["id"]))


def versions_written(conn: Connection, snapshot_id: int, valid_from: datetime) -> list:
    """The rule versions that snapshot ``snapshot_id`` wrote at ``valid_from`` (aware UTC), as rows of
    ``(rule_id, version, withdrawn)``: withdrawals first, then by rule id."""
    return conn.execute(
        select(rule_versions.c.rule_id, rule_versions.c.version, rule_versions.c.withdrawn)
        .where(rule_versions.c.snapshot_id == snapshot_id, rule_versions.c.valid_from == valid_from)
        .order_by(rule_versions.c.withdrawn.desc(), rule_versions.c.rule_id)
    ).all()
