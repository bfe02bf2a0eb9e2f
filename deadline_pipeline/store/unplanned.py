"""SQL of the stored obligations a run did not plan: found by anti-joining the keys and ids the run
planned (``planned_keys``, ``planned_ids``), then withdrawn (their revisable reminders cancelled with
reason :data:`WITHDRAWN_REASON_PREFIX`, which the merge revives when the obligation returns), moved
outside the planning window, or — for a RECURRENCE-ID override's obligations stored under their own
id — re-keyed before planning compares, so the run finds them under the key it plans instead of
withdrawing them.

Separate because withdrawal takes whole obligations away with their reminders: a wrong row here is
a silent miss, so its reads and writes are kept together and apart from the merge.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Connection,
    and_,
    exists,
    or_,
    select,
    update,
)

from deadline_pipeline.states import REVISABLE, AlertState, ObligationState
from deadline_pipeline.store.schema import (
    alerts,
    obligations,
)
from deadline_pipeline.store.staging import planned_ids, planned_keys
from deadline_pipeline.store.upsert import pages

# Cancellations made by planning carry this prefix; only those are undone when an obligation returns.
WITHDRAWN_REASON_PREFIX = "withdrawn: "


def unplanned_obligations(conn: Connection, source_ids: list[int], lo: datetime, hi: datetime,
                          rule_ids: dict[int, frozenset[str] | None] | None = None):
    """Active obligations of these sources due in ``[lo, hi]`` that this run did not plan (neither in
    ``planned_keys`` nor in ``planned_ids``): (id, key, rule_id, source_id, subscriber_id, revision,
    due_at, period). ``rule_ids`` (a scoped re-plan): source id → the only rule ids to look at
    (``None``: all of that source's); a source missing or with an empty set is left out."""
    if rule_ids is not None:
        source_ids = [sid for sid in source_ids if rule_ids.get(sid, frozenset()) != frozenset()]
    if not source_ids:
        return []
    o, s, ids = obligations, planned_keys, planned_ids
    which = [o.c.source_id.in_(source_ids)]
    if rule_ids is not None:
        which = [or_(*(o.c.source_id == sid if rule_ids[sid] is None
                       else and_(o.c.source_id == sid, o.c.rule_id.in_(sorted(rule_ids[sid]))) for sid in source_ids))]
    return conn.execute(
        select(o.c.id, o.c.obligation_key, o.c.rule_id, o.c.source_id, o.c.subscriber_id, o.c.revision,
               o.c.due_at, o.c.period)
        .where(*which, o.c.status == ObligationState.ACTIVE, o.c.due_at >= lo, o.c.due_at <= hi,
               ~exists().where(s.c.obligation_key == o.c.obligation_key), ~exists().where(ids.c.id == o.c.id))
    ).all()


def override_obligations_keyed_once(conn: Connection, rule_ids: dict[int, list[str]]):
    """Active obligations with the period ``once`` of the given rules (``rule_ids``: source id → the
    rule ids of RECURRENCE-ID overrides in force): (id, obligation_key, rule_id, source_id,
    subscriber_id). Empty for no rule id."""
    o = obligations
    which = [and_(o.c.source_id == sid, o.c.rule_id.in_(ids)) for sid, ids in sorted(rule_ids.items()) if ids]
    if not which:
        return []
    return conn.execute(
        select(o.c.id, o.c.obligation_key, o.c.rule_id, o.c.source_id, o.c.subscriber_id)
        .where(or_(*which), o.c.status == ObligationState.ACTIVE, o.c.period == "once")
        .order_by(o.c.id)
    ).all()


def rekey_obligation(conn: Connection, obligation_id: int, key: str, period: str, retired: str) -> bool:
    """Give obligation ``obligation_id`` the key ``key`` and period ``period``, keeping its id and alerts.
    A withdrawn obligation holding ``key`` gets ``retired`` instead (keys stay unique; it keeps its
    history). Returns False, changing nothing, when an active obligation holds ``key``."""
    o = obligations
    holder = conn.execute(select(o.c.id, o.c.status).where(o.c.obligation_key == key)).first()
    if holder is not None and holder.id != obligation_id:
        if holder.status == ObligationState.ACTIVE:
            return False
        conn.execute(update(o).where(o.c.id == holder.id).values(obligation_key=retired))
    conn.execute(update(o).where(o.c.id == obligation_id).values(obligation_key=key, period=period))
    return True


def move_obligation(conn: Connection, obligation_id: int, due_at: datetime, rule_version: int,
                    now: datetime, *, rule_id: str | None = None) -> None:
    """Move one obligation to ``due_at`` (aware UTC) outside the planning window (a move into the
    past, or into a month another partition plans): the revision is bumped and the old instant kept,
    exactly as a merge does for a move. The fingerprint is cleared: the new instant's reminders are
    not planned yet, and the run that plans them reads that as a move
    (:attr:`~deadline_pipeline.store.merge.StagedDiff.moved_before`).
    ``rule_id``: the rule that now plans it, when another (a RECURRENCE-ID override moving its
    master's occurrence), as a merge records it: the checks recompute obligations per rule id."""
    o = obligations
    values = dict(due_at=due_at, previous_due_at=o.c.due_at, revision=o.c.revision + 1, rule_version=rule_version,
                  fingerprint=None, planned_at=now)
    if rule_id is not None:
        values["rule_id"] = rule_id
    conn.execute(update(o).where(o.c.id == obligation_id).values(**values))


def withdraw_obligations(conn: Connection, ids: list[int], reason: str, now: datetime) -> int:
    """Mark obligations withdrawn and cancel their revisable alerts (never delete). Returns alerts cancelled.

    An alert whose lease is live is mid-send and is left alone: it finishes as delivered, and the
    cancellation notice (if any) follows it.
    """
    cancelled = 0
    for part in pages(ids, 500):
        conn.execute(update(obligations).where(obligations.c.id.in_(part)).values(status=ObligationState.WITHDRAWN,
                                                                                 planned_at=now))
        cancelled += len(conn.execute(
            update(alerts)
            .where(alerts.c.obligation_id.in_(part), alerts.c.status.in_(REVISABLE),
                   or_(alerts.c.lease_expires_at.is_(None), alerts.c.lease_expires_at <= now))
            .values(status=AlertState.CANCELLED, status_reason=WITHDRAWN_REASON_PREFIX + reason, updated_at=now)
            .returning(alerts.c.id)
        ).all())
    return cancelled
