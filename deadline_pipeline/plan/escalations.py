"""Deadlines planning leaves for the delivery sweep to escalate as missed, found outside the
chunks' merge: one that passed while its source was not fetched (:mod:`.first_seen`), and the
occurrences of a recurring series a revision moved into the past (:mod:`.series_moved`). Each is
written as its obligation and one reminder per channel (:func:`~.notices.missed_row`)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from deadline_pipeline.instants import instant_text
from deadline_pipeline.plan import series_moved
from deadline_pipeline.plan.first_seen import LOOKBACK, MISSED_UNWATCHED, FirstSeenPassed, judge_source
from deadline_pipeline.plan.notices import missed_row, passed_unwatched_reason
from deadline_pipeline.plan.occurrences import GRACE
from deadline_pipeline.plan.planner import PlannedObligation, Target, plan_obligations
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.states import ObligationState
from deadline_pipeline.store import notice_rows, plan_history
from deadline_pipeline.store.sources import freshness_window

if TYPE_CHECKING:
    from deadline_pipeline.plan.outcome import PlanOutcome

log = logging.getLogger(__name__)


def missed_while_unwatched(target: Target, rules: dict[str, tuple[int, RuleRecord]], judged: list[FirstSeenPassed],
                           lineage: dict[str, str] | None = None) -> list[tuple[PlannedObligation, FirstSeenPassed]]:
    """The obligations of ``target`` (pure) for each judgment that is a possible miss
    (:data:`~deadline_pipeline.plan.first_seen.MISSED_UNWATCHED`) of a rule still in force
    (``rules``: rule_id → (version, record)) that the target selects, keyed as planning keys them;
    planned over a window around the rule's instant (business-day rolling may move it a few days)."""
    out = []
    for j in judged:
        if j.verdict != MISSED_UNWATCHED or j.rule_id not in rules:
            continue
        lo = j.instant - timedelta(days=10)
        obs, _problems = plan_obligations(target, [rules[j.rule_id]], lo + GRACE, timedelta(days=20),
                                          after=lo, before=j.first_seen, lineage=lineage)
        out.extend((ob, j) for ob in obs)
    return out


def judge_sources(conn, targets: list[Target], now: datetime) -> dict[int, list[FirstSeenPassed]]:
    """source id → the possible misses (:data:`~deadline_pipeline.plan.first_seen.MISSED_UNWATCHED`
    judgments of :func:`~deadline_pipeline.plan.first_seen.judge_source`, over the last
    :data:`~deadline_pipeline.plan.first_seen.LOOKBACK` before ``now``, aware UTC) of every target's
    source; an empty list where there is none. Reads only."""
    judged: dict[int, list[FirstSeenPassed]] = {}
    for t in targets:
        if t.source_id not in judged:
            judged[t.source_id] = [j for j in judge_source(conn, t.source_id, t.source,
                                                           freshness_window(conn, t.source_id), now - LOOKBACK)
                                   if j.verdict == MISSED_UNWATCHED]
    return judged


def write_missed_while_unwatched(conn, targets: list[Target], rules_cache: dict, lineage: dict, now: datetime,
                                  watched: set[tuple[int, int]], judged: dict[int, list[FirstSeenPassed]],
                                  out: PlanOutcome) -> None:
    """Write, for each deadline that passed while its source was not fetched (``judged``: source id →
    its possible misses, :func:`judge_sources`), its obligation and one
    reminder per channel (the latest offset) that the delivery sweep escalates as missed
    (:func:`~.notices.missed_row`); counted in ``out.missed_while_unwatched``, logged at ERROR. ``watched``:
    (subscriber_id, source_id) pairs that had obligations before this run — a subscriber added since
    was not owed a deadline that passed before. An obligation already stored adds nothing, so a
    re-plan adds nothing either."""
    found: dict[str, tuple[PlannedObligation, FirstSeenPassed, dict[str, int]]] = {}
    for t in targets:
        if (t.subscriber_id, t.source_id) not in watched or not judged.get(t.source_id):
            continue
        rules = {r.rule_id: (v, r) for v, r in rules_cache[t.source_id][0]}
        for ob, j in missed_while_unwatched(t, rules, judged[t.source_id], lineage.get(t.source_id)):
            latest = found.setdefault(ob.key, (ob, j, {}))[2]
            top = max(o.nominal_seconds for o in t.offsets)
            # Two subscriptions of one subscriber merge into one obligation, as planning merges them.
            for ch in t.channels:
                latest[ch] = max(latest.get(ch, top), top)
    if found:
        _insert_missed_while_unwatched(conn, found, now, out)


def new_obligation_row(ob: PlannedObligation, now: datetime) -> dict:
    """The ``obligations`` row of ``ob`` written outside the chunks' merge (an escalated miss)."""
    return dict(obligation_key=ob.key, tenant=ob.tenant, subscriber_id=ob.subscriber_id, source_id=ob.source_id,
                rule_id=ob.rule_id, rule_version=ob.rule_version, period=ob.period, title=ob.title, due_at=ob.due_at,
                status=ObligationState.ACTIVE, planned_at=now, revision=0, fingerprint=ob.fingerprint)


def _insert_missed_while_unwatched(conn, found: dict, now: datetime, out: PlanOutcome) -> None:
    """Insert the obligations and escalation reminders :func:`write_missed_while_unwatched` found."""
    ids = notice_rows.insert_obligations_if_new(conn, [new_obligation_row(ob, now) for ob, _, _ in found.values()])
    rows = [missed_row(ids[key], key, ch, seconds, None, ob.due_at, now, passed_unwatched_reason(j))
            for key, (ob, j, latest) in found.items() if key in ids for ch, seconds in sorted(latest.items())]
    written = notice_rows.insert_notices(conn, rows)
    out.obligations_inserted += len(ids)
    out.alerts_inserted += written
    out.missed_while_unwatched += written
    for key in ids:
        log.error("planning: %s: reminder(s) left to the delivery sweep, which escalates them as missed",
                  found[key][1].describe())


def escalate_series_moved_into_past(conn, stale, subscribed: dict, rules_cache: dict, lo: datetime,
                                     now: datetime, lineage: dict[int, dict[str, str]], out: PlanOutcome) -> None:
    """For recurring rules whose occurrences ahead this run withdraws (``stale``) from subscribers
    still subscribed: write each new occurrence of the revised series that is already past and that
    the subscriber was never told of (:mod:`~deadline_pipeline.plan.series_moved`), as an obligation
    and one reminder per channel (the latest offset) that the delivery sweep escalates as missed;
    counted in ``out.moved_into_past_missed``, logged at ERROR. A re-plan writes nothing again: the
    withdrawn occurrences are no longer active, and a stored key is never written twice."""
    withdrawn = series_moved.moved_series_triples(stale, subscribed)
    if not withdrawn:
        return
    known = plan_history.series_known_until(conn, set(withdrawn), lo)
    found = series_moved.passed_unplanned(withdrawn, known, subscribed,
                                          {sid: rules for sid, (rules, _) in rules_cache.items()}, lo, now, lineage)
    if not found:
        return
    ids = notice_rows.insert_obligations_if_new(conn, [new_obligation_row(ob, now) for ob, _, _ in found])
    top = {id(t): max(o.nominal_seconds for o in t.offsets) for _, _, t in found}
    rows = [missed_row(ids[ob.key], ob.key, ch, top[id(t)], old_due, ob.due_at, now)
            for ob, old_due, t in found if ob.key in ids for ch in sorted(t.channels)]
    written = notice_rows.insert_notices(conn, rows)
    out.obligations_inserted += len(ids)
    out.alerts_inserted += written
    out.moved_into_past_missed += written
    if written:
        first = rows[0]
        log.error("planning: %d reminder(s) of %d occurrence(s) of recurring rules a revision moved into the past are "
                  "left to the delivery sweep, which escalates them as missed; first: obligation %s channel %s "
                  "moved from %s to %s", written, len(ids), first["obligation_id"], first["channel"],
                  instant_text(first["previous_due_at"]), instant_text(first["due_at"]))
