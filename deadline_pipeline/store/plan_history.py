"""SQL reads of what earlier planning runs left in the store, each answering one question about the
past: the rule version a subscriber's obligations were last planned with, how far a subscriber
knew a rule's series, when an obligation was first planned with reminders, who was ever planned
for per source, and what the outbox did about one rule's deadline.

Separate from the staging and merge statements because none of these reads the staging tables or
writes: they feed the late-policy folds, the escalations of misses left while unwatched, and the
reconciliation check, each by stored obligations and alerts alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import (
    Connection,
    case,
    func,
    select,
    type_coerce,
)

from deadline_pipeline.store.schema import (
    UtcDateTime,
    alerts,
    obligations,
)
from deadline_pipeline.store.upsert import pages


def _per_triple(conn: Connection, triples: set[tuple[int, int, str]], aggregates: list, *conditions):
    """``((subscriber_id, source_id, rule_id), (aggregate values…))`` for each of ``triples`` with a stored
    obligation meeting ``conditions``, the ``aggregates`` taken over its obligations (any status). One
    read per 500 subscribers, by the ``(source_id, rule_id)`` index: it reads every obligation of the
    rules asked about (a row-value ``IN`` was planned as one index scan per triple)."""
    o = obligations
    sources_, rules_ = {t[1] for t in triples}, {t[2] for t in triples}
    for part in pages(sorted({t[0] for t in triples}), 500):
        for sub, src, rid, *values in conn.execute(
            select(o.c.subscriber_id, o.c.source_id, o.c.rule_id, *aggregates)
            .where(o.c.source_id.in_(sources_), o.c.rule_id.in_(rules_), o.c.subscriber_id.in_(part), *conditions)
            .group_by(o.c.subscriber_id, o.c.source_id, o.c.rule_id)
        ):
            if (sub, src, rid) in triples:
                yield (sub, src, rid), values


def planned_rule_versions(conn: Connection, triples: set[tuple[int, int, str]],
                          before: datetime) -> dict[tuple[int, int, str], int]:
    """``(subscriber_id, source_id, rule_id)`` → the newest rule version any obligation of that
    subscriber, source and rule (any status) was last planned with before ``before`` (aware UTC: the
    planning run's instant, so what this run wrote does not count), for those of ``triples`` that
    have one (:func:`_per_triple`)."""
    o = obligations
    return {triple: version for triple, (version,) in _per_triple(
        conn, triples, [func.max(o.c.rule_version)], o.c.planned_at < before)}


def series_known_until(conn: Connection, triples: set[tuple[int, int, str]],
                       before: datetime) -> dict[tuple[int, int, str], datetime]:
    """``(subscriber_id, source_id, rule_id)`` → the instant (aware UTC) up to which the subscriber
    knew that rule's occurrences before ``before`` (the planning window's start): the latest due
    instant before it of any stored obligation of theirs (any status), or, if later, the first time
    one was planned (``min(planned_at)``: occurrences before they watched the rule were never theirs
    to know). Triples without a stored obligation are left out (:func:`_per_triple`)."""
    o = obligations
    return {triple: max(first_planned, last_due) if last_due is not None else first_planned
            for triple, (last_due, first_planned) in _per_triple(
                conn, triples, [type_coerce(func.max(case((o.c.due_at < before, o.c.due_at))), UtcDateTime),
                                type_coerce(func.min(o.c.planned_at), UtcDateTime)])}


def first_planned(conn: Connection, obligation_ids: list[int]) -> dict[int, datetime]:
    """obligation id → when its first alert row was written (aware UTC: when the obligation was first
    planned with reminders), for those of ``obligation_ids`` that have one. One read per 500 ids."""
    found: dict[int, datetime] = {}
    for part in pages(obligation_ids, 500):
        found.update(conn.execute(
            select(alerts.c.obligation_id, type_coerce(func.min(alerts.c.created_at), UtcDateTime))
            .where(alerts.c.obligation_id.in_(part)).group_by(alerts.c.obligation_id)).all())
    return found


def planned_pairs(conn: Connection, source_ids: Sequence[int]) -> set[tuple[int, int]]:
    """(subscriber_id, source_id) of every stored obligation of these sources: who has been planned
    for, per source. No source, no read (the read scans every obligation of its sources)."""
    out: set[tuple[int, int]] = set()
    for part in pages(source_ids, 500):
        out.update((a, b) for a, b in conn.execute(
            select(obligations.c.subscriber_id, obligations.c.source_id).distinct()
            .where(obligations.c.source_id.in_(part))).all())
    return out


def reminder_statuses_of_rule(conn: Connection, source_id: int, rule_id: str, due_at: datetime) -> set[str]:
    """The statuses of every reminder of ``rule_id`` (of ``source_id``) for the due instant
    ``due_at`` (aware UTC), over all subscribers: what the outbox did about that deadline."""
    return set(conn.execute(
        select(alerts.c.status).distinct().join(obligations, obligations.c.id == alerts.c.obligation_id)
        .where(obligations.c.source_id == source_id, obligations.c.rule_id == rule_id,
               alerts.c.kind == "reminder", alerts.c.due_at == due_at)).scalars())
