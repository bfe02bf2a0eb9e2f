"""A recurring rule revised so that one of its occurrences now falls in the past (pure).

The incident: a weekly filing due on Wednesdays was revised on a Tuesday to Mondays. The Wednesday
ahead was withdrawn (a cancellation notice only where a reminder of it had been delivered), the
Monday ahead got its reminders, and the Monday of that week — the deadline the Wednesday had
become — was never planned: it was already past. The subscriber never heard of it, and every check
stayed green. A one-off deadline moved into the past is the same obligation and is escalated as a
move (``plan.withdrawals._moved_out_of_window``); an occurrence of a series is keyed by its original start,
so the revised series' Monday is a new obligation, found here instead.

Which past occurrences the subscriber was never told of: those of the revised series due after the
last occurrence they knew (the latest stored due instant before the planning window, or the first
time they were planned for the rule if later: :func:`~deadline_pipeline.store.plan_history.series_known_until`)
and before the window, for a subscriber still subscribed whose occurrence ahead the revision
withdrew (the evidence that the series moved: an EXDATE alone leaves nothing new in the past, and a
series merely extended into the past is history published late, not a move). Each gets one
reminder per channel the delivery sweep escalates as missed, as for a one-off moved into the past.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from deadline_pipeline.plan.occurrences import GRACE
from deadline_pipeline.plan.planner import ONCE, PlannedObligation, Target, plan_obligations
from deadline_pipeline.rules import RuleRecord


def moved_series_triples(stale, subscribed: dict) -> dict[tuple[int, int, str], datetime]:
    """``(subscriber_id, source_id, rule_id)`` → the earliest due instant among ``stale`` (rows of
    obligations this run withdraws: ``subscriber_id``, ``source_id``, ``rule_id``, ``period``,
    ``due_at``) of each recurring rule's occurrences withdrawn from a subscriber still subscribed
    (``subscribed``: (subscriber_id, source_id) → target)."""
    out: dict[tuple[int, int, str], datetime] = {}
    for r in stale:
        if r.period == ONCE or (r.subscriber_id, r.source_id) not in subscribed:
            continue
        triple = (r.subscriber_id, r.source_id, r.rule_id)
        out[triple] = min(out.get(triple, r.due_at), r.due_at)
    return out


def passed_unplanned(withdrawn: dict[tuple[int, int, str], datetime], known_until: dict[tuple[int, int, str], datetime],
                     subscribed: dict, rules: dict[int, list[tuple[int, RuleRecord]]], lo: datetime, now: datetime,
                     lineage: dict[int, dict[str, str]]) -> list[tuple[PlannedObligation, datetime, Target]]:
    """The occurrences of each revised series (``withdrawn``: :func:`moved_series_triples`) due after
    ``known_until`` (that triple's :func:`~deadline_pipeline.store.plan_history.series_known_until`) and
    before both ``lo`` (the planning window's start) and ``now - GRACE`` (really past: a partition's
    ``lo`` may lie ahead of a month still to be planned), as (obligation, the withdrawn occurrence's
    due instant, target). ``rules``: source id → ``(version, record)`` pairs in force; ``lineage``:
    source id → rule id → the id obligations are keyed on. Instants aware UTC. Keys not stored yet
    are the caller's to find (a re-plan must not write a second one)."""
    out = []
    end = min(lo, now - GRACE)
    for (sub, src, rule_id), old_due in sorted(withdrawn.items()):
        since = known_until.get((sub, src, rule_id))
        match = [(v, r) for v, r in rules.get(src, ()) if r.rule_id == rule_id and (r.rrule or r.rdates)]
        if since is None or not match or since >= end:
            continue
        target = subscribed[(sub, src)]
        obs, _problems = plan_obligations(target, match, since + GRACE, end - since,
                                          after=since + timedelta(microseconds=1), before=end,
                                          lineage=lineage.get(src))
        out.extend((ob, old_due, target) for ob in obs if since < ob.due_at < end)
    return out
