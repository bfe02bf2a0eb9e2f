"""SQL of the compare and merge of a staged chunk (steps 2–4 of a plan write, see
:mod:`~deadline_pipeline.store.staging`): which staged obligations are new, moved or changed, the
keyed upserts of obligations and reminders (a reminder cancelled by a withdrawal or superseded by a
move revived when it is asked for again), and the cancellation of reminders no subscription asks
for any more.

Separate because these statements decide what a re-plan changes: re-running them with the same
staged rows changes no row, and they are the only ones that read the staging tables to write.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import (
    Boolean,
    Connection,
    String,
    and_,
    case,
    exists,
    func,
    literal,
    literal_column,
    or_,
    select,
    true,
    update,
)

from deadline_pipeline.states import REVISABLE, AlertState, ObligationState
from deadline_pipeline.store.new_rows import NEW_ALERT_COLUMNS
from deadline_pipeline.store.schema import (
    UtcDateTime,
    alerts,
    obligations,
)
from deadline_pipeline.store.staging import OB_COLS, stage_alerts, stage_obligations
from deadline_pipeline.store.supersession import MOVED_REASON_PREFIX
from deadline_pipeline.store.unplanned import WITHDRAWN_REASON_PREFIX
from deadline_pipeline.store.upsert import dialect_insert, pages

# The alert identity (the unique constraint): a reminder is owed per due instant.
ALERT_IDENTITY = ["obligation_id", "offset_seconds", "channel", "kind", "revision", "due_at"]


@dataclass
class StagedDiff:
    """How the staged chunk differs from the stored obligations (see :func:`compare_staged`)."""

    new: list[str] = field(default_factory=list)
    # id, obligation_key, revision (before the merge), old_due_at, new_due_at, and the stored
    # rule_version, zone_data, calendar_data and recurrence_engine (what planned the old instant) of
    # each moved one.
    moved: list[dict] = field(default_factory=list)
    changed: int = 0
    need_alerts: set[str] = field(default_factory=set)
    # Withdrawn obligations back under a newer rule version (the source withdrew the deadline and
    # restored it): their subscribers knew them. Not one back under the same version (its subscriber
    # or subscription came back: new to them).
    restored: set[str] = field(default_factory=set)
    # obligation_key → the instant it was due before: obligations a run of another partition moved
    # here (:func:`~deadline_pipeline.store.unplanned.move_obligation`, fingerprint cleared) without
    # planning their new instant's reminders, which this run plans as those of a moved deadline.
    moved_before: dict[str, datetime] = field(default_factory=dict)
    # Every obligation coming back from withdrawn (``restored`` or not): while withdrawn, its subscriber
    # was owed none of its reminders.
    reactivated: set[str] = field(default_factory=set)


def _differs(o, s):
    """Whether stored obligation ``o`` differs from staged/excluded ``s`` in anything planning writes."""
    return or_(o.c.due_at.is_distinct_from(s.due_at), o.c.fingerprint.is_distinct_from(s.fingerprint),
               o.c.status != ObligationState.ACTIVE, o.c.rule_version.is_distinct_from(s.rule_version),
               o.c.title.is_distinct_from(s.title), o.c.rule_id != s.rule_id,
               # A new zone-data, calendar or engine version is recorded even where it moved nothing.
               o.c.zone_data.is_distinct_from(s.zone_data), o.c.calendar_data.is_distinct_from(s.calendar_data),
               o.c.recurrence_engine.is_distinct_from(s.recurrence_engine))


def compare_staged(conn: Connection) -> StagedDiff:
    """Compare the staged obligations with the stored ones, before the merge, in one read: which are
    ``new``, ``moved`` (due instant changed), ``changed`` (anything else planning writes:
    fingerprint, rule version, title, rule id, reactivation) and which ``need_alerts`` (new,
    fingerprint changed, or coming back from withdrawn). Unchanged rows are not returned at all."""
    s, o = stage_obligations, obligations
    diff = StagedDiff()
    for (key, oid, revision, old_due, new_due, fp_differs, inactive, version, zone, cal, engine, new_version,
         moved_from) in conn.execute(
        select(s.c.obligation_key, o.c.id, o.c.revision, o.c.due_at, s.c.due_at,
               o.c.fingerprint.is_distinct_from(s.c.fingerprint), o.c.status != ObligationState.ACTIVE,
               o.c.rule_version, o.c.zone_data, o.c.calendar_data, o.c.recurrence_engine, s.c.rule_version,
               case((o.c.fingerprint.is_(None), o.c.previous_due_at), else_=None))
        .select_from(s.outerjoin(o, o.c.obligation_key == s.c.obligation_key))
        .where(or_(o.c.id.is_(None), _differs(o, s.c)))
    ):
        if oid is None:
            diff.new.append(key)
            diff.need_alerts.add(key)
            continue
        if old_due != new_due:
            diff.moved.append(dict(id=oid, obligation_key=key, revision=revision, old_due_at=old_due,
                                   new_due_at=new_due, rule_version=version, zone_data=zone,
                                   calendar_data=cal, recurrence_engine=engine))
        else:
            diff.changed += 1
        if fp_differs or inactive:
            diff.need_alerts.add(key)
        if inactive:
            diff.reactivated.add(key)
        if inactive and version < new_version:
            diff.restored.add(key)
        if moved_from is not None and old_due == new_due:
            diff.moved_before[key] = moved_from
    return diff


def merge_obligations(conn: Connection, now: datetime) -> dict[str, int]:
    """Merge the staged obligations that differ from the stored ones into ``obligations`` (unchanged
    ones are not even offered to the upsert, so they are neither locked nor rewritten). A changed due
    instant bumps ``revision`` and keeps the old instant in ``previous_due_at``. Returns
    obligation_key → id of every row inserted or updated. (Counts come from :func:`compare_staged`.)"""
    s, o = stage_obligations, obligations
    stored = o.alias("stored")
    cols = OB_COLS + ["status", "planned_at", "revision"]
    sel = (select(*[s.c[c] for c in OB_COLS], literal(ObligationState.ACTIVE, String).label("status"),
                  literal(now, UtcDateTime).label("planned_at"), literal(0).label("revision"))
           .select_from(s.outerjoin(stored, stored.c.obligation_key == s.c.obligation_key))
           .where(or_(stored.c.id.is_(None), _differs(stored, s.c))))
    ins = dialect_insert(conn, o).from_select(cols, sel)
    ex = ins.excluded
    due_moved = o.c.due_at.is_distinct_from(ex.due_at)
    stmt = ins.on_conflict_do_update(
        index_elements=["obligation_key"],
        set_={
            # A renamed rule keeps its obligation (same key, via the lineage) under its new id.
            "rule_id": ex.rule_id,
            "rule_version": ex.rule_version, "title": ex.title, "due_at": ex.due_at, "status": ex.status,
            "fingerprint": ex.fingerprint, "planned_at": ex.planned_at,
            "zone_data": ex.zone_data, "calendar_data": ex.calendar_data, "recurrence_engine": ex.recurrence_engine,
            "revision": case((due_moved, o.c.revision + 1), else_=o.c.revision),
            "previous_due_at": case((due_moved, o.c.due_at), else_=o.c.previous_due_at),
        },
        where=_differs(o, ex),
    )
    return dict(conn.execute(stmt.returning(o.c.obligation_key, o.c.id)).all())


def merge_alerts(conn: Connection, now: datetime) -> tuple[int, int]:
    """Merge staged reminder alerts. New rows are inserted with their planned status; an existing
    row's ``send_at`` moves only while it is still revisable
    (:data:`~deadline_pipeline.states.REVISABLE`: pending, waiting to retry or skipped) — a delivered
    alert is history and is never rewritten. Returns (inserted, moved)."""
    sa, o, a = stage_alerts, obligations, alerts
    if not conn.execute(select(exists().select_from(sa))).scalar():
        return 0, 0  # nothing staged: a no-op re-plan never touches the alerts table
    cols = NEW_ALERT_COLUMNS
    sel = (
        select(o.c.id, sa.c.offset_seconds, sa.c.channel, sa.c.kind, literal(0), sa.c.dedup_key, sa.c.send_at,
               sa.c.status, sa.c.status_reason, literal(0), literal(now, UtcDateTime), literal(now, UtcDateTime),
               sa.c.due_at)
        .join(o, o.c.obligation_key == sa.c.obligation_key)
        .where(true())
    )
    ins = dialect_insert(conn, a).from_select(cols, sel)
    # A reminder cancelled because its obligation was withdrawn comes back with the obligation (a
    # source that drops a rule and restores it must not leave its reminders cancelled for good).
    # Likewise a reminder superseded when its deadline moved away comes back when the deadline moves
    # back to that instant (a delivered one stays delivered: a flapping source never repeats a reminder).
    revived = or_(and_(a.c.status == AlertState.CANCELLED, a.c.status_reason.like(f"{WITHDRAWN_REASON_PREFIX}%")),
                  and_(a.c.status == AlertState.SUPERSEDED, a.c.status_reason.like(f"{MOVED_REASON_PREFIX}%")))
    stmt = ins.on_conflict_do_update(
        index_elements=ALERT_IDENTITY,
        set_={"send_at": ins.excluded.send_at, "updated_at": ins.excluded.updated_at,
              "status": case((revived, ins.excluded.status), else_=a.c.status),
              "status_reason": case((revived, ins.excluded.status_reason), else_=a.c.status_reason)},
        where=or_(and_(a.c.status.in_(REVISABLE),
                       a.c.send_at.is_distinct_from(ins.excluded.send_at)), revived),
    )
    if conn.dialect.name == "postgresql":
        return _upsert_counted(conn, stmt)
    # SQLite: counted around the merge (driver rowcounts of INSERT … SELECT … ON CONFLICT are not
    # reliable), from the alerts of the staged obligations only (by index), not of the whole table.
    of_staged = (select(func.count()).select_from(a)
                 .where(a.c.obligation_id.in_(select(o.c.id).join(sa, sa.c.obligation_key == o.c.obligation_key))))
    before = conn.execute(of_staged).scalar_one()
    moved = conn.execute(
        select(func.count()).select_from(
            sa.join(o, o.c.obligation_key == sa.c.obligation_key).join(
                a, and_(a.c.obligation_id == o.c.id, a.c.offset_seconds == sa.c.offset_seconds,
                        a.c.channel == sa.c.channel, a.c.kind == sa.c.kind, a.c.revision == 0,
                        a.c.due_at == sa.c.due_at)))
        .where(a.c.status.in_(REVISABLE), a.c.send_at.is_distinct_from(sa.c.send_at))
    ).scalar_one()
    conn.execute(stmt)
    return conn.execute(of_staged).scalar_one() - before, moved


def _upsert_counted(conn: Connection, stmt) -> tuple[int, int]:
    """Run the alerts upsert ``stmt`` on PostgreSQL and count, in the same statement, the rows it
    inserted and the revisable ones whose ``send_at`` it moved: (inserted, moved).

    ``xmax = 0`` tells an inserted row from an updated one in ``RETURNING``. An updated row was
    either moved (revisable before) or revived (cancelled or superseded before); the outer query
    reads the row as it was before the upsert, because a data-modifying ``WITH`` and its outer query
    share one snapshot (PostgreSQL manual, "Data-Modifying Statements in WITH"). The before-image is
    read by primary key for updated rows only. This replaced two counts of every alert of the
    chunk's obligations and a five-way join: three reads that cost a scoped re-plan more than its
    own insert."""
    merged = stmt.returning(alerts.c.id, literal_column("xmax = 0", Boolean).label("inserted")).cte("merged")
    before = select(alerts.c.status).where(alerts.c.id == merged.c.id).scalar_subquery()
    inserted, moved = conn.execute(
        select(func.count().filter(merged.c.inserted),
               # AND evaluates left to right and stops at false: no look-up for an inserted row.
               func.count().filter(and_(~merged.c.inserted, before.in_(REVISABLE))))
    ).one()
    return inserted, moved


# Why a reminder no subscription asks for any more is cancelled. It starts with the withdrawal
# prefix on purpose: the merge revives such a reminder when a later plan asks for it again (an
# offset removed and put back must not stay cancelled, which would be a silent miss).
UNWANTED_REASON = WITHDRAWN_REASON_PREFIX + "no subscription asks for this reminder any more"


def cancel_unwanted_reminders(conn: Connection, keys: Sequence[str], now: datetime) -> int:
    """Cancel the open reminders (:data:`~deadline_pipeline.states.REVISABLE`) of the obligations with
    these ``keys``, planned for their current due instant, whose (offset, channel) the staged
    reminders no longer contain: an offset or channel taken out of the subscription, a rule pattern
    narrowed while another subscription still wants the obligation. Call after :func:`merge_alerts`,
    with ``stage_alerts`` holding every reminder of each of these obligations, and only for
    obligations that kept their due instant (a moved one's current-instant reminders are the staged
    ones; its old ones are superseded). A leased alert is mid-send and left alone; delivered ones are
    history. Returns alerts cancelled.

    Before, such a reminder stayed pending and was sent although nobody asked for it (an offset
    removed from ``-P30D, -P7D`` still mailed its ``-P30D`` reminder), and ``fanout_complete`` stayed
    red with no run able to clear it. The comparison is made here, per batch of keys, not as one
    anti-join: PostgreSQL planned that as a nested loop over the unindexed staging table (3 s for a
    chunk of 9,600 reminders, quadratic in the chunk)."""
    sa, o, a = stage_alerts, obligations, alerts
    unwanted: list[int] = []
    for part in pages(keys, 500):
        wanted = set(conn.execute(select(sa.c.obligation_key, sa.c.offset_seconds, sa.c.channel)
                                  .where(sa.c.obligation_key.in_(part), sa.c.kind == "reminder")).all())
        unwanted.extend(i for i, *slot in conn.execute(
            select(a.c.id, o.c.obligation_key, a.c.offset_seconds, a.c.channel)
            .join(o, o.c.id == a.c.obligation_id)
            .where(o.c.obligation_key.in_(part), a.c.kind == "reminder", a.c.status.in_(REVISABLE),
                   a.c.due_at == o.c.due_at, or_(a.c.lease_expires_at.is_(None), a.c.lease_expires_at <= now))
        ) if tuple(slot) not in wanted)
    cancelled = 0
    for part in pages(unwanted, 500):
        cancelled += len(conn.execute(
            update(a).where(a.c.id.in_(part), a.c.status.in_(REVISABLE))
            .values(status=AlertState.CANCELLED, status_reason=UNWANTED_REASON, updated_at=now)
            .returning(a.c.id)).all())
    return cancelled
