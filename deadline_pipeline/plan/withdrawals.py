"""Obligations a run no longer plans: withdrawn (pending reminders cancelled, a cancellation notice
where a reminder was delivered and the source caused it), or, for a deadline moved out of the run's
window (into the past, or into another partition's month), moved (corrections, and for one moved into
the past reminders the delivery sweep escalates as missed)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from itertools import groupby
from typing import TYPE_CHECKING

from deadline_pipeline.instants import instant_text
from deadline_pipeline.plan.escalations import escalate_series_moved_into_past
from deadline_pipeline.plan.notices import cancellation_row, correction_row, missed_row
from deadline_pipeline.plan.occurrences import GRACE
from deadline_pipeline.plan.override_keys import replanned, series_claimants
from deadline_pipeline.plan.planner import ONCE, PlannedObligation, Target, plan_obligations
from deadline_pipeline.plan.scope import series_of
from deadline_pipeline.store import notice_rows, supersession, unplanned

if TYPE_CHECKING:
    from deadline_pipeline.plan.outcome import PlanOutcome

log = logging.getLogger(__name__)


def withdraw(conn, source_ids, lo, hi, failed_rules, subscribed: dict, rules_cache: dict, now,
              out: PlanOutcome, *, filtered: set[tuple[int, int, str]] = frozenset(),
              rule_ids: dict[int, frozenset[str] | None] | None = None,
              lineage: dict[int, dict[str, str]] | None = None, horizon_end: datetime | None = None) -> None:
    """Withdraw obligations the plan no longer contains. When the source caused it (a withdrawn rule,
    an occurrence that moved to another date or was excluded) and the subscriber is still subscribed,
    everyone who already got a reminder gets one cancellation notice — the new date, if any, arrives
    as its own reminder. A removed subscriber or subscription, or a rule the subscription's own
    filter now leaves out (``filtered``, e.g. a new ``exclude_kinds``), is cancelled silently: a
    notice would claim the source withdrew a deadline it still publishes. A one-off
    deadline moved out of ``[lo, hi]`` is moved instead: into the past (open reminders superseded,
    one correction per channel where a reminder was delivered, saying the new instant has passed, and
    where none was, a reminder the delivery sweep escalates as missed: :func:`~.notices.missed_row`),
    or into another month of the planning horizon (through ``horizon_end``, aware UTC; ``hi`` when
    None), which that month's run arms (open reminders superseded, one correction per channel where
    a reminder was delivered); a recurring rule whose
    revision withdrew an occurrence ahead leaves its new occurrences already past escalated alike
    (:func:`~.escalations.escalate_series_moved_into_past`). ``rule_ids`` (a scoped re-plan): source id → the only
    rule ids whose obligations this run planned, and so may withdraw (``None``: every rule of that
    source); ``lineage``: source id → rule id → the id obligations are keyed on."""
    stale = [r for r in unplanned.unplanned_obligations(conn, source_ids, lo, hi, rule_ids=rule_ids)
             if (r.source_id, r.rule_id) not in failed_rules]
    if not stale:
        return
    moved = _moved_out_of_window(stale, subscribed, rules_cache, lo, hi, max(hi, horizon_end or hi), lineage or {},
                                 now)
    if moved:
        ids = sorted(moved)
        delivered = supersession.delivered_channels(conn, ids)
        reminders: dict[int, list[dict]] = {}
        for a in supersession.reminders_of(conn, ids):
            reminders.setdefault(a["obligation_id"], []).append(a)
        notices, missed = [], []
        for r in stale:
            if r.id in moved:
                new_due, version, key, rule_id = moved[r.id]
                unplanned.move_obligation(conn, r.id, new_due, version, now, rule_id=rule_id)
                notices.extend(correction_row(r.id, key, ch, r.revision + 1, r.due_at, new_due, now)
                               for ch in sorted(delivered.get(r.id, ())))
                # Only a deadline really past: `lo` may be a partition's first day, and a move to an
                # earlier month still ahead gets its reminders when that month is planned.
                if new_due < now - GRACE:
                    missed.extend(_missed_rows(r, key, new_due, reminders.get(r.id, []),
                                               delivered.get(r.id, set()), now))
        out.alerts_superseded += supersession.supersede_other_instants(conn, ids, now)
        out.corrections += notice_rows.insert_notices(conn, notices)
        written = notice_rows.insert_notices(conn, missed)
        if written:
            out.moved_into_past_missed += written
            first = missed[0]
            log.error("planning: %d reminder(s) of %d deadline(s) moved into the past before any reminder was "
                      "delivered on their channel are left to the delivery sweep, which escalates them as missed; "
                      "first: obligation %s channel %s moved from %s to %s", written,
                      len({m["obligation_id"] for m in missed}), first["obligation_id"], first["channel"],
                      instant_text(first["previous_due_at"]), instant_text(first["due_at"]))
        out.obligations_moved += len(ids)
        stale = [r for r in stale if r.id not in moved]
        if not stale:
            return
    escalate_series_moved_into_past(conn, stale, subscribed, rules_cache, lo, now, lineage or {}, out)
    by_rule = [r for r in stale if (r.subscriber_id, r.source_id) in subscribed
               and (r.subscriber_id, r.source_id, r.rule_id) not in filtered]
    delivered = supersession.delivered_channels(conn, [r.id for r in by_rule])
    out.obligations_withdrawn = len(stale)
    out.alerts_cancelled += unplanned.withdraw_obligations(
        conn, [r.id for r in stale], "the rule, subscription or subscriber no longer asks for this obligation", now)
    out.cancellation_notices += notice_rows.insert_notices(conn, [
        cancellation_row(r.id, r.obligation_key, channel, r.revision, r.due_at, now)
        for r in by_rule for channel in sorted(delivered.get(r.id, ()))])


def _moved_out_of_window(stale, subscribed: dict, rules_cache: dict, lo: datetime, hi: datetime,
                        horizon_end: datetime, lineage: dict[int, dict[str, str]], now: datetime) -> dict[int, tuple]:
    """obligation id → (new due instant, rule version, obligation key, rule id) for the stale
    obligations whose deadline is still in force for a still-subscribed target but now falls outside
    this run's window ``[lo, hi]``: before ``lo`` (into the past, or an earlier month) or after ``hi``
    up to ``horizon_end`` (a later month of the horizon; all aware UTC). Such a deadline is a one-off
    rule's, or an occurrence of a series that a RECURRENCE-ID override moved (:func:`~.override_keys.series_claimants`),
    or an occurrence of a series whose revision moved it, under the same key, into another month of
    the planning window at ``now`` (``now - GRACE`` through ``horizon_end``; one moved into the past
    is escalated by :func:`~.escalations.escalate_series_moved_into_past`).
    It moved; it is not withdrawn: a partition's run that withdrew a deadline moved to the next month
    sent "Cancelled ... no further reminders will be sent" where a reminder was delivered, and
    cancelled its reminders until that month was planned. ``lineage``: source id → rule id → the id
    obligations are keyed on."""
    out: dict[int, tuple] = {}
    series_plans: dict[tuple, dict[str, PlannedObligation]] = {}
    for r in stale:
        target = subscribed.get((r.subscriber_id, r.source_id))
        if target is None or r.source_id not in rules_cache:
            continue
        rules = rules_cache[r.source_id][0]
        if r.period == ONCE:
            obs = replanned(target, [(v, rule) for v, rule in rules if rule.rule_id == r.rule_id
                                      and not (rule.rrule or rule.rdates)], lo, horizon_end, None)
            ob = obs[0] if len(obs) == 1 else None
        else:
            # Once per subscriber and series, not per stale occurrence: a revised daily series
            # withdraws hundreds of occurrences, and each would expand the master over the whole span.
            memo = (r.subscriber_id, r.source_id, series_of(r.rule_id))
            if memo not in series_plans:
                claimants = series_claimants(r, rules)
                if claimants:
                    obs = replanned(target, claimants, lo, horizon_end, lineage.get(r.source_id))
                else:
                    # A series revised so that an occurrence keeps its key at an instant in another
                    # UTC month (its time or zone changed: Sunday 31 January 15:00 Los Angeles,
                    # 23:00Z, became 23:30, 07:30Z on 1 February): January's run alone withdrew it,
                    # a cancellation notice went out where a reminder was delivered, and its
                    # reminders stayed cancelled until February was planned. Expanded over the
                    # planning window only, as planning expands it.
                    master = [(v, rule) for v, rule in rules if rule.rule_id == series_of(r.rule_id)]
                    obs = (plan_obligations(target, master, now, horizon_end - now,
                                            before=horizon_end + timedelta(microseconds=1),
                                            lineage=lineage.get(r.source_id))[0]
                           if master and horizon_end > now else [])
                series_plans[memo] = {o.key: o for o in obs}
            ob = series_plans[memo].get(r.obligation_key)
        if ob is not None and not lo <= ob.due_at <= hi and ob.due_at != r.due_at:
            out[r.id] = (ob.due_at, ob.rule_version, r.obligation_key, ob.rule_id)
    return out


def _missed_rows(r, key: str, new_due: datetime, reminders: list[dict], delivered: set[str],
                 now: datetime) -> list[dict]:
    """:func:`~.notices.missed_row` for each channel of stale obligation ``r`` that has reminder rows but none
    delivered (``reminders``: its reminder rows, :func:`~deadline_pipeline.store.supersession.reminders_of`)."""
    latest: dict[str, int] = {}
    for a in reminders:
        if a["channel"] not in delivered:
            latest[a["channel"]] = max(latest.get(a["channel"], a["offset_seconds"]), a["offset_seconds"])
    return [missed_row(r.id, key, ch, latest[ch], r.due_at, new_due, now) for ch in sorted(latest)]


def filtered_out(targets, rules_cache) -> set[tuple[int, int, str]]:
    """(subscriber id, source id, rule id) of active rules that no subscription of that subscriber to
    that source wants any more (rule patterns, ``kinds`` / ``exclude_kinds``).

    Judged one (subscriber, source) pair at a time, keeping only the answer: a verdict kept for every
    subscriber × rule held 26 MiB at 20,000 subscribers × 10 rules, the largest part of what planning
    memory still grew by per subscriber."""
    def pair(t: Target) -> tuple[int, int]:
        return t.subscriber_id, t.source_id

    out: set[tuple[int, int, str]] = set()
    for (subscriber_id, source_id), group in groupby(sorted(targets, key=pair), key=pair):
        mine = list(group)
        out.update((subscriber_id, source_id, rule.rule_id) for _, rule in rules_cache[source_id][0]
                   if not any(t.wants_rule(rule) for t in mine))
    return out
