"""``reminders_owed``: an independent reconciliation of what was owed against what was sent.

The other checks read the outbox (``alerts``) and ask whether its rows were handled. A reminder that
was never *planned* has no row, so they cannot see it: a moved deadline whose new reminders were
never written, or a rule withdrawn because its record failed to parse, stays green there. This check
recomputes what is owed from the rule versions in force instead:

1. **Rules in force**, per source, from ``rule_versions`` alone: the latest version of each rule —
   unless that version is a withdrawal made by a snapshot that *skipped* a record which may have been
   that rule (its ``parse_report``) and no human accepted it; then the last good version is in force
   (only a parseable snapshot that lacks a rule withdraws it). Read with the targets as planning
   reads them (:func:`~deadline_pipeline.watch.planned.planning_view`, ``trust_withdrawals=False``).
2. **Owed reminders**: every (subscriber, rule, due instant, offset, channel) of the active
   subscriptions whose send instant lies in ``[now - lookback, now - grace]``, expanded from those
   rules with the planner's calendar arithmetic (zones, business-day rolling, offsets whose days are
   calendar days in the deadline's zone, quiet hours). Only
   rules already planned for that subscriber at least once count (a subscriber added today is not
   owed last week's reminders; a target never planned at all is ``horizon_planned``'s to catch), and
   only instants due after the rule version came into force. A reminder planning no longer owes is
   not counted: planning writes an obligation's alert rows only while its due instant lies in the
   planning window (:func:`~deadline_pipeline.plan.occurrences.window`, ``now`` minus its grace), so
   when the subscription's offsets, channels or quiet hours changed after a deadline had left that
   window (the stored obligation, at the same due instant, keeps the fingerprint of what it was
   planned from), the reminders the new configuration adds were never planning's to write. An offset
   added while the deadline was still ahead is owed: missing, it is red.
3. **Explained**: the outbox holds, *for that due instant*, a delivered reminder with a ``sent``
   receipt, or a recorded reason that agrees with the recomputation — ``skipped`` (late policy),
   ``escalated`` (already loud), ``cancelled`` for another reason than a withdrawal. A reminder
   ``superseded`` or ``cancelled`` as withdrawn while its rule and instant are in force is not
   explained, nor is a missing row. A row still open (pending, claimed, waiting to retry) is in
   flight: ``alerts_reconciled`` judges it (and pages for it) once it is overdue, so one stuck
   reminder is one incident, not two.

Any owed reminder not explained is red, with the offenders.

4. **Passed while unwatched**: a rule first seen within ``lookback`` after its deadline had passed
   while its source was not fetched (:mod:`~deadline_pipeline.plan.first_seen`) was owed a
   reminder nobody could send: counted in the summary, and an offender (red) while the outbox holds
   no reminder for that deadline (planning did not leave the one the sweep escalates).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import Engine

from deadline_pipeline.config import DeadlinesConfig
from deadline_pipeline.instants import instant_text
from deadline_pipeline.plan.first_seen import MISSED_UNWATCHED, FirstSeenPassed, judge_source
from deadline_pipeline.states import OPEN, AlertState
from deadline_pipeline.store.health import (
    obligation_fingerprints,
    planned_rules,
    reminder_outcomes,
)
from deadline_pipeline.store.plan_history import reminder_statuses_of_rule
from deadline_pipeline.store.sources import freshness_window
from deadline_pipeline.store.unplanned import WITHDRAWN_REASON_PREFIX
from deadline_pipeline.watch.checks import CheckOutcome
from deadline_pipeline.watch.planned import planning_view

log = logging.getLogger(__name__)

DEFAULT_LOOKBACK = timedelta(days=7)


def reminders_owed(engine: Engine, cfg: DeadlinesConfig, now: datetime, grace: timedelta = timedelta(minutes=30),
                   lookback: timedelta = DEFAULT_LOOKBACK, limit: int = 10) -> CheckOutcome:
    """The reconciliation (module docstring) at ``now`` (aware UTC); ``grace`` and ``lookback`` bound
    the send instants judged. Never raises for what it finds; offenders name subscriber, rule, due
    instant, offset, channel and why the outbox does not explain the reminder."""
    from deadline_pipeline.plan.occurrences import window
    from deadline_pipeline.plan.planner import merged_fingerprint, plan_target

    lo, hi = now - lookback, now - grace
    owed: dict[tuple, dict] = {}
    with engine.connect() as conn:
        view = planning_view(conn, cfg, trust_withdrawals=False)
        targets = view.targets
        planned_pairs = planned_rules(conn)
        fingerprints: dict[tuple, str] = {}  # (subscriber, source, rule, due) -> what planning would plan from
        for t in targets:
            rules, since = view.sources[t.source_id].rules, view.sources[t.source_id].valid_from
            # Due instants up to the latest offset after ``hi`` can have a send instant before it; a
            # day of slack because calendar days across a DST change outlast their nominal length.
            span = max((abs(o) for o in t.offsets_seconds), default=0) + 86400
            obs, _problems = plan_target(t, rules, lo, lookback + timedelta(seconds=span))
            for ob in obs:
                if (t.subscriber_id, t.source_id, ob.rule_id) not in planned_pairs:
                    continue
                # Two subscriptions of one subscriber to one source: one obligation, its fingerprint
                # combined as planning combines it (in the same order of targets), else a past
                # deadline's missing row was always excused as planned from another configuration.
                fk = (t.subscriber_id, t.source_id, ob.rule_id, ob.due_at)
                fingerprints[fk] = (ob.fingerprint if fk not in fingerprints
                                    else merged_fingerprint(fingerprints[fk], ob.fingerprint))
                if ob.due_at < since.get(ob.rule_id, ob.due_at):
                    continue  # due before this version was known: never owed
                for a in ob.alerts:
                    if lo <= a.send_at <= hi:
                        key = (t.subscriber_id, t.source_id, ob.rule_id, ob.due_at, a.offset_seconds, a.channel)
                        owed[key] = {"subscriber": t.subscriber, "source": t.source, "rule_id": ob.rule_id,
                                     "title": ob.title, "due_at": instant_text(ob.due_at),
                                     "offset_seconds": a.offset_seconds, "channel": a.channel,
                                     "send_at": instant_text(a.send_at)}
        dues = [k[3] for k in owed] or [now]  # (nothing owed: both reads below are empty)
        # Only the due instants owed: the read stays small on a large outbox.
        have: dict[tuple, tuple] = {
            (r.subscriber_id, r.source_id, r.rule_id, r.due_at, r.offset_seconds, r.channel):
                (r.status, r.status_reason, r.receipt)
            for r in reminder_outcomes(conn, min(dues), max(dues))} if owed else {}
        stored = obligation_fingerprints(conn, min(dues), max(dues)) if owed else {}
        for key in [k for k in owed if k not in have and not _planning_owes(k, fingerprints, stored, window(now)[0])]:
            del owed[key]
        unwatched = unwatched_misses(conn, {t.source_id: t.source for t in targets}, lo)
    offenders = [_unwatched_offender(j) for j, statuses in unwatched if not statuses]
    for key, info in sorted(owed.items(), key=lambda kv: kv[1]["send_at"]):
        why = _unexplained(have.get(key))
        if why:
            offenders.append({**info, "reason": why})
    count = len(offenders)
    if count:
        first = offenders[0]
        summary = (f"{count} of {len(owed)} reminder(s) owed between {instant_text(lo)} and {instant_text(hi)} "
                   f"(recomputed from the rule versions in force) have no receipt and no recorded reason; first: "
                   f"{first['subscriber']} × {first['rule_id']} due {first['due_at']} offset "
                   f"{first['offset_seconds']}s on {first['channel']}: {first['reason']}")
    else:
        summary = (f"all {len(owed)} reminder(s) owed between {instant_text(lo)} and {instant_text(hi)} (recomputed "
                   "from the rule versions in force) were sent or have a recorded reason")
    summary += _unwatched_summary(unwatched)
    return CheckOutcome("reminders_owed", count == 0, count, summary, offenders[:limit])


def _planning_owes(key: tuple, fingerprints: dict[tuple, str], stored: dict[tuple, str | None],
                   window_start: datetime) -> bool:
    """Whether planning owes the reminder ``key`` (subscriber, source, rule, due, offset, channel),
    which has no alert row: yes, unless its due instant lies before ``window_start`` (planning's own
    window at now, :func:`~deadline_pipeline.plan.occurrences.window`: it never re-plans such an
    obligation) and the stored obligation at that due instant was planned from another configuration
    than the current one (``fingerprints``: recomputed, ``stored``: as written; keyed on the first four
    fields). Without this, an offset added after a deadline had passed paged "never planned" for a
    week (the lookback) for reminders no run could write, and the remedy (re-plan) cannot apply."""
    ob = key[:4]
    return not (key[3] < window_start and ob in stored and stored[ob] != fingerprints.get(ob))


def _unwatched_summary(unwatched: list[tuple[FirstSeenPassed, set[str]]]) -> str:
    """The summary's clause on deadlines that passed unwatched (``""`` when there is none)."""
    if not unwatched:
        return ""
    return (f"; {len(unwatched)} deadline(s) passed while their source was not fetched "
            f"(first: {unwatched[0][0].describe()})")


def unwatched_misses(conn, sources: dict[int, str], since: datetime) -> list[tuple[FirstSeenPassed, set[str]]]:
    """Each deadline of ``sources`` (id → name) first seen at or after ``since`` (aware UTC) that
    passed while its source was not fetched, with the statuses of its reminders in the outbox
    (empty: nobody was told, not even on-call)."""
    out = []
    for source_id, name in sorted(sources.items()):
        for j in judge_source(conn, source_id, name, freshness_window(conn, source_id), since):
            if j.verdict == MISSED_UNWATCHED:
                out.append((j, reminder_statuses_of_rule(conn, source_id, j.rule_id, j.instant)))
    return out


def _unwatched_offender(j: FirstSeenPassed) -> dict:
    """The offender row of a deadline that passed unwatched and has no reminder in the outbox."""
    return {"subscriber": "*", "source": j.source, "rule_id": j.rule_id, "title": "", "due_at": instant_text(j.instant),
            "offset_seconds": None, "channel": "*", "send_at": instant_text(j.first_seen),
            "reason": f"never escalated: {j.describe()}"}


def _unexplained(row: tuple | None) -> str | None:
    """Why an owed reminder's outbox row does not explain it, or None when it does."""
    if row is None:
        return "never planned: no alert row for this due instant"
    status, reason, receipt = row
    if status == AlertState.DELIVERED:
        return None if receipt else "marked delivered without a 'sent' receipt"
    if status == AlertState.ESCALATED:
        return None  # the loud end: the escalation checks and the watchdog report it
    if status == AlertState.SKIPPED:
        return None if reason else f"{status} without a reason"
    if status == AlertState.CANCELLED:
        if reason and not reason.startswith(WITHDRAWN_REASON_PREFIX):
            return None
        return f"cancelled as withdrawn while its rule is in force ({reason})"
    if status == AlertState.SUPERSEDED:
        return f"superseded while its due instant is in force ({reason})"
    if status in OPEN:
        return None  # in flight: alerts_reconciled's to judge once overdue
    return f"unknown status {status!r}"
