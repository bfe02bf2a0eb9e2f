"""The invariants the watchers evaluate, as plain functions of the store and a clock.

The Dagster asset checks (:mod:`deadline_pipeline.orchestration.checks`) call these, and the
``watchdog`` command may, so the UI and cron agree. Every ``now`` is an aware UTC datetime; every
interval is a :class:`~datetime.timedelta`. A check never raises for what it finds: it returns a
:class:`CheckOutcome` with the count of offenders and the worst few (JSON-safe).

Checks and what exactly they promise:

``alerts_reconciled``
    zero alerts with ``send_at`` older than ``now - grace`` that are neither delivered, escalated,
    cancelled, superseded nor skipped; and zero ``delivered`` alerts without a ``sent`` receipt in
    ``delivery_attempts`` (the status alone proves nothing).
``sweep_alive``
    the newest of the heartbeats ``deliver`` (a sweep completed) and ``deliver:idle`` (the sensor
    found nothing claimable, i.e. the sweep is caught up) is within ``interval + grace`` of ``now``.
``horizon_planned``
    (1) the ``plan`` heartbeat completed within ``plan_interval`` of ``now`` and its last run did not
    crash — planning covers ``[P, P + horizon]`` when it last ran at P, so this bounds the uncovered
    tail to one planning interval; and (2) for every active subscription (active subscriber) and
    every rule of its source it selects (patterns, ``kinds`` / ``exclude_kinds``), read as planning
    reads it (RECURRENCE-ID overrides folded into their masters), with an occurrence inside
    ``[now + 7 days, now + horizon - 1 day]`` (read with dateutil from the stored rule, not by the
    planner; the week of slack absorbs a business day rolled earlier, the day time zones), there is at least one
    active obligation of that (subscriber, source, rule) due at or after ``now`` — the rule matched
    by its id or its lineage (a renamed rule's obligations stay keyed on its first id). Only rules
    whose current version (and every version of its series) came into force before the last
    completed full planning run started are judged, and a rule that cannot be read or expanded
    within budget is not (``plan_complete`` reports it). (2) catches a rule the planner silently
    skipped or withdrew while other rules of its source kept their obligations.
``fanout_complete``
    every active obligation due in ``[now, now + horizon]`` has exactly one reminder row per
    (offset, usable channel) of the active subscriptions of its subscriber and source whose
    patterns match its rule — none missing, and no *open* reminder for a pair nobody asks for.
    A channel is usable when it is configured and the subscriber has its contact (email for smtp
    and maildir, webhook_url for webhook).
``plan_complete``
    the last full planning run (heartbeat ``plan``), and a backfill run (``plan:backfill``) newer
    than it, reported no planning problem: neither outcome is ``partial``. A backfill can turn the
    check red, never green: a one-month backfill clean in its month hid the full run's problems
    (reminders past an expansion cap, months away) until the next full run. A problem is a reminder planning knowingly
    did not plan (a subscriber without the contact a channel needs, ``kinds`` matching no rule, a
    rule the planner refuses or cannot expand within its work budget, a rule whose expansion was cut
    at the occurrence cap — planned up to the cut only); the heartbeat's ``detail``
    names the count and the first offenders. Read from the store, so the UI, ``run`` and the
    ``watchdog`` agree.
``escalations_acknowledged``
    zero escalated alerts without ``acknowledged_at`` (a WARN: the miss is already loud; this tracks
    that a human took it over).
"""

from __future__ import annotations

import fnmatch
import logging
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Engine

from deadline_pipeline.instants import instant_text
from deadline_pipeline.rules import kinds_allow
from deadline_pipeline.states import OPEN
from deadline_pipeline.store import health
from deadline_pipeline.wording import human_duration, shorten

log = logging.getLogger(__name__)

# Heartbeat components the sweep writes: a completed sweep, or a sensor tick with nothing to claim.
SWEEP_COMPONENTS = ("deliver", "deliver:idle")
PLAN_COMPONENT = "plan"
PLAN_COMPONENTS = ("plan", "plan:backfill")
# Channel type → the subscriber contact it needs (planning skips a channel whose contact is missing).
CONTACT_OF_TYPE = {"smtp": "email", "maildir": "email", "webhook": "webhook_url", "slack": None}


@dataclass
class CheckOutcome:
    """``passed``; ``count`` of offenders; ``offenders``: the worst few, JSON-safe; ``summary``: one line."""

    name: str
    passed: bool
    count: int
    summary: str
    offenders: list[dict] = field(default_factory=list)


def _iso(value: datetime | None) -> str | None:
    """An instant in offenders (JSON for machines) written as the summaries write it, so an offender
    and the summary naming it show the same text; ``None`` stays ``None``."""
    return instant_text(value) if value else None


def oldest_text(first: dict) -> str:
    """``2027-01-14T11:00:00+00:00 (retry_wait; attempt 2 failed: <last error>)`` for an overdue
    alert row (:func:`~deadline_pipeline.store.health.overdue_alerts`). The last error is in the
    text itself: a red row then says why (a closed port, a refused address), which was only in the
    sweep's log lines."""
    error = (f"; attempt {first['attempts']} failed: {shorten(' '.join(first['last_error'].split()), 300)}"
             if first.get("last_error") else "")
    return f"{instant_text(first['send_at'])} ({first['status']}{error})"


def _alert_offender(r: dict, reason: str) -> dict:
    return {"alert_id": r["id"], "reason": reason, "send_at": _iso(r["send_at"]), "status": r["status"],
            "channel": r["channel"], "subscriber": r["subscriber"], "title": r["title"],
            "attempts": r["attempts"], "last_error": r["last_error"]}


def alerts_reconciled(engine: Engine, now: datetime, grace: timedelta = timedelta(minutes=30),
                      limit: int = 10) -> CheckOutcome:
    """Alerts due before ``now - grace`` that are neither delivered, escalated, cancelled nor skipped,
    plus ``delivered`` alerts without a ``sent`` receipt, must be zero: each one is a reminder that
    should have gone out and may not have. A backlog stays counted until it drains (no flapping)."""
    with engine.connect() as conn:
        overdue, oldest = health.overdue_alerts(conn, now - grace, limit)
        unreceipted, forged = health.unreceipted_deliveries(conn, limit)
    offenders = ([_alert_offender(r, "overdue") for r in oldest]
                 + [_alert_offender(r, "delivered_without_receipt") for r in forged])[:limit]
    count = overdue + unreceipted
    parts = []
    if overdue:
        parts.append(f"{overdue} alert(s) overdue by more than {human_duration(grace)}; oldest due "
                     f"{oldest_text(oldest[0])}")
    if unreceipted:
        parts.append(f"{unreceipted} alert(s) marked delivered without a 'sent' delivery attempt "
                     f"(first: alert {forged[0]['id']})")
    summary = "; ".join(parts) or (f"every alert due before {instant_text(now - grace)} is delivered, escalated "
                                   "or cancelled, and every delivery has its receipt")
    return CheckOutcome("alerts_reconciled", count == 0, count, summary, offenders)


def _age_outcome(name: str, what: str, beats: dict[str, dict], components: tuple[str, ...], now: datetime,
                 allowed: timedelta) -> CheckOutcome:
    seen = {c: beats[c] for c in components if c in beats and beats[c].get("last_completed_at")}
    offenders = [{"component": c, "last_completed_at": _iso(b["last_completed_at"]),
                  "last_started_at": _iso(b.get("last_started_at")), "last_outcome": b.get("last_outcome"),
                  "detail": b.get("detail")} for c, b in seen.items()]
    if not seen:
        return CheckOutcome(name, False, 1, f"{what} has never completed (no heartbeat {' / '.join(components)})",
                            [{"component": c, "last_completed_at": None} for c in components])
    newest = max(b["last_completed_at"] for b in seen.values())
    age = now - newest
    if age > allowed:
        return CheckOutcome(name, False, 1, f"{what} last completed {instant_text(newest)}, "
                            f"{human_duration(age)} ago; expected "
                            f"within {human_duration(allowed)}", offenders)
    return CheckOutcome(name, True, 0, f"{what} completed {human_duration(age)} ago "
                        f"(allowed {human_duration(allowed)})", offenders)


def sweep_alive(engine: Engine, now: datetime, interval: timedelta = timedelta(minutes=5),
                grace: timedelta = timedelta(minutes=10)) -> CheckOutcome:
    """The sweep completed (or the sensor found it caught up) within ``interval + grace`` of ``now``.
    Red when the daemon, the sensor or every sweep run has stopped."""
    with engine.connect() as conn:
        beats = health.read_heartbeats(conn)
    return _age_outcome("sweep_alive", "the delivery sweep", beats, SWEEP_COMPONENTS, now, interval + grace)


def _first_within(payload: dict, lo: datetime, hi: datetime) -> datetime | None | bool:
    """The first instant (aware UTC) of a rule (its payload) between ``lo`` and ``hi``; None when it
    has none; False when planning refuses the rule (``FREQ=SECONDLY``), the payload cannot be read or
    is over the expansion budget (planning reports that rule itself, and ``plan_complete`` turns red
    for it).

    Read with the bounded expansion (:func:`~deadline_pipeline.plan.occurrences.first_between`):
    a ``FREQ=SECONDLY`` rule read with an unbounded ``rrulestr(...).after()`` hung the check, and
    with it ``run``. Callers pass shrunk bounds, so a rule at the edge of the window is never
    *expected* by mistake.
    """
    from deadline_pipeline.plan.occurrences import ExpansionBudgetExceeded, first_between
    from deadline_pipeline.plan.planner import refused_frequency

    if refused_frequency(payload.get("rrule")):
        return False  # planning refuses it (a planning problem: plan_complete is red), never plans it
    try:
        return first_between(payload, lo, hi)
    except ExpansionBudgetExceeded as exc:
        log.warning("horizon_planned: rule %s not judged (planning reports it): %s", payload.get("rule_id"), exc)
        return False
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("horizon_planned: cannot read rule payload %s: %s", payload.get("rule_id"), exc)
        return False


def _planned_rules(versions: dict[str, dict]) -> list[tuple[dict, datetime]]:
    """The rules of one source as planning plans them, with the instant each came into force:
    (payload, valid_from) of the active rules with RECURRENCE-ID overrides folded into their masters
    (:func:`~deadline_pipeline.plan.recurrence.apply_overrides`, as planning's ``fold_overrides``
    does), so an occurrence an override moved or cancelled is not expected of its master.
    ``versions``: :func:`~deadline_pipeline.store.health.latest_rule_versions` of the source.
    A rule's ``valid_from`` is the newest of its series (master and overrides, withdrawn ones too):
    a new override changes what its master plans. Overrides that cannot be folded are judged
    unfolded, as planning plans them (it reports that itself)."""
    from deadline_pipeline.plan.recurrence import apply_overrides
    from deadline_pipeline.plan.scope import series_of
    from deadline_pipeline.rules import RuleRecord

    newest: dict[str, datetime] = {}
    for rid, v in versions.items():
        series = series_of(rid)
        newest[series] = max(newest.get(series, v["valid_from"]), v["valid_from"])
    active = {rid: v["payload"] for rid, v in versions.items() if not v["withdrawn"]}
    try:
        folded = [r.to_payload() for r in apply_overrides([RuleRecord.from_payload(p) for p in active.values()])]
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("horizon_planned: overrides not folded, judged as they are: %s", exc)
        folded = list(active.values())
    return [(p, newest[series_of(p["rule_id"])]) for p in folded]


_PROBLEM_COUNT = re.compile(r"(\d+) problem\(s\)")


def plan_complete(engine: Engine, now: datetime) -> CheckOutcome:
    """The last completed planning run had no planning problem (see the module docstring).

    Red for a run whose outcome is ``partial``: each problem is one the configuration or a source must
    fix, e.g. a subscriber without an email on a mail channel (its reminders are not planned, which
    left ``fanout_complete`` and ``reminders_owed`` green: both only expect what can be planned), or a
    subscriber of another tenant (planned as listed). The summary reads ``the planning run completed
    <instant> (<run>) reported N problem(s): …``.
    Green when planning has never run (``horizon_planned`` is red for that)."""
    with engine.connect() as conn:
        beats = health.read_heartbeats(conn)
    done = [beats[c] for c in PLAN_COMPONENTS if c in beats and beats[c].get("last_completed_at")]
    if not done:
        return CheckOutcome("plan_complete", True, 0, "planning has not completed yet (see horizon_planned)")
    full = beats.get("plan") if beats.get("plan", {}).get("last_completed_at") else None
    judged = [b for b in done if b is full or full is None or b["last_completed_at"] > full["last_completed_at"]]
    partial = sorted((b for b in judged if b.get("last_outcome") == "partial"),
                     key=lambda b: b["last_completed_at"], reverse=True)
    if partial:
        counts, texts = [], []
        for beat in partial:
            detail = beat.get("detail") or ""
            found = _PROBLEM_COUNT.search(detail)
            counts.append(max(int(found.group(1)) if found else 1, 1))
            # Not "left reminders unplanned": some problems plan every reminder (a subscriber of another
            # tenant is planned as listed), so the summary says what is known — the run's problems.
            run = detail[:found.start()].rstrip("; ") if found else ""
            listed = detail[found.start():] if found else detail
            texts.append(f"the planning run completed {instant_text(beat['last_completed_at'])}"
                         f"{f' ({run})' if run else ''} reported {listed[:500]}")
        offenders = [{"component": b["component"], "last_completed_at": _iso(b["last_completed_at"]),
                      "last_outcome": b.get("last_outcome"), "detail": (b.get("detail") or "")[:2000]}
                     for b in partial]
        return CheckOutcome("plan_complete", False, sum(counts), "; ".join(texts), offenders)
    last = max(judged, key=lambda b: b["last_completed_at"])
    return CheckOutcome("plan_complete", True, 0, f"the planning run completed "
                        f"{instant_text(last['last_completed_at'])} reported no problem", [])


def _judged_since(beat: dict | None, plan_interval: timedelta) -> datetime | None:
    """The instant before which a rule version must have come into force to be judged: when the last
    completed full planning run started (its heartbeat's ``last_started_at``). A run in progress (or
    crashed) has overwritten that with its own start; the completed run's start is then taken as
    ``last_completed_at - plan_interval`` (a run longer than the plan interval can still be judged
    too early, for the rules ingested while it ran). None: planning never completed."""
    if not beat or not beat.get("last_completed_at"):
        return None
    if beat.get("last_outcome") in ("running", "crashed") or not beat.get("last_started_at"):
        return beat["last_completed_at"] - plan_interval
    return min(beat["last_started_at"], beat["last_completed_at"])


def horizon_planned(engine: Engine, now: datetime, plan_interval: timedelta = timedelta(minutes=90),
                    horizon: timedelta = timedelta(days=366), limit: int = 10) -> CheckOutcome:
    """Planning is alive and covers every rule through ``now + horizon`` (see the module docstring
    for the exact definition). Offenders: the stale heartbeat and/or one row per uncovered rule of a
    subscription (``subscriber``, ``source``, ``rule_id``, ``first_ahead``: its first occurrence in
    the judged window, ISO)."""
    with engine.connect() as conn:
        beats = health.read_heartbeats(conn)
        subs = health.active_subscription_rows(conn)
        versions = health.latest_rule_versions(conn)
        upcoming = health.upcoming_obligation_rules(conn, now)
    beat_out = _age_outcome("horizon_planned", "planning", beats, (PLAN_COMPONENT,), now, plan_interval)
    crashed = beats.get(PLAN_COMPONENT, {}).get("last_outcome") == "crashed"
    since = _judged_since(beats.get(PLAN_COMPONENT), plan_interval)
    # A week of slack at the near end: business-day rolling with a 'preceding' convention moves a due
    # date a few days earlier than the instant read here (still at or after now, where the obligations
    # are counted). A day at the far end absorbs time zones and the planner's window ending at its own
    # run's start + horizon, up to one plan interval before now + horizon.
    lo, hi = now + timedelta(days=7), now + horizon - timedelta(days=1)
    first_ahead: dict[tuple[int, str], datetime | None | bool] = {}
    planned: dict[int, list[tuple[dict, datetime]]] = {}
    uncovered = []
    for s in subs:
        src = s["source_id"]
        if since is None or src not in versions:
            continue
        if src not in planned:
            planned[src] = _planned_rules(versions[src])
        for payload, valid_from in planned[src]:
            rid = payload["rule_id"]
            # A version ingested after the last completed planning run started is not planned yet:
            # judging it would be red in the minutes between an ingest and the next planning.
            if valid_from > since or not any(fnmatch.fnmatchcase(rid, p) for p in s["rule_patterns"]) \
                    or not kinds_allow(s.get("kinds"), s.get("exclude_kinds"), payload):
                continue
            if (src, rid) not in first_ahead:
                first_ahead[(src, rid)] = _first_within(payload, lo, hi)
            first = first_ahead[(src, rid)]
            if not first:
                continue
            # A renamed rule's obligations stay keyed on its lineage; planning moves their rule_id to
            # the new id, so either id is the rule's.
            lineage = (versions[src].get(rid) or {}).get("lineage")
            if not any((s["subscriber_id"], src, r) in upcoming for r in {rid, lineage} if r):
                uncovered.append({"subscriber": s["subscriber"], "source": s["source"], "rule_id": rid,
                                  "first_ahead": _iso(first)})
    uncovered = sorted({(o["source"], o["subscriber"], o["rule_id"]): o for o in uncovered}.values(),
                       key=lambda o: (o["source"], o["subscriber"], o["rule_id"]))
    count = (0 if beat_out.passed and not crashed else 1) + len(uncovered)
    parts = [] if beat_out.passed else [beat_out.summary]
    if crashed:
        parts.append(f"the last planning run crashed: {beats[PLAN_COMPONENT].get('detail')}")
    if uncovered:
        first = uncovered[0]
        parts.append(f"{len(uncovered)} rule(s) of a subscription with an occurrence ahead have no obligation "
                     f"due after {instant_text(now)} (first: {first['subscriber']} × {first['source']} rule "
                     f"{first['rule_id']}, next due {first['first_ahead']})")
    summary = "; ".join(parts) or (f"{beat_out.summary}; every subscribed rule with an occurrence ahead "
                                   "has obligations ahead")
    offenders = ([] if beat_out.passed and not crashed else beat_out.offenders) + uncovered
    return CheckOutcome("horizon_planned", count == 0, count, summary, offenders[:limit])


def expected_reminders(subs: list[dict], rule_id: str, channel_types: dict[str, str],
                       payload: dict | None = None) -> set[tuple[int, str]]:
    """(offset_seconds, channel) pairs the subscriptions in ``subs`` (one subscriber and source) ask
    for on ``rule_id``: offsets × usable channels of each subscription whose patterns match and whose
    ``kinds`` / ``exclude_kinds`` admit the rule (``payload``: its stored payload; None = not
    checked). Pure."""
    out: set[tuple[int, str]] = set()
    for s in subs:
        if not any(fnmatch.fnmatchcase(rule_id, p) for p in s["rule_patterns"]):
            continue
        if payload is not None and not kinds_allow(s.get("kinds"), s.get("exclude_kinds"), payload):
            continue
        for ch in s["channels"]:
            if ch not in channel_types:
                continue  # not configured: planning reports it and plans nothing on it
            contact = CONTACT_OF_TYPE.get(channel_types[ch])
            if contact and not s.get(contact):
                continue  # planning skipped it loudly (the subscriber has no such contact)
            out.update((int(o), ch) for o in s["offsets"])
    return out


def fanout_complete(engine: Engine, now: datetime, horizon: timedelta, channel_types: dict[str, str],
                    limit: int = 10) -> CheckOutcome:
    """Every active obligation due in ``[now, now + horizon]`` has exactly its expected reminder rows
    (``channel_types``: channel name → configured type, e.g. ``{"mail": "smtp"}``)."""
    with engine.connect() as conn:
        subs = health.active_subscription_rows(conn)
        obs = health.obligations_with_reminders(conn, now, now + horizon)
        payloads = health.active_rule_payloads(conn)
    by_target: dict[tuple[int, int], list[dict]] = {}
    for s in subs:
        by_target.setdefault((s["subscriber_id"], s["source_id"]), []).append(s)
    offenders = []
    count = 0
    for ob in obs:
        want = expected_reminders(by_target.get((ob["subscriber_id"], ob["source_id"]), []), ob["rule_id"],
                                  channel_types, payloads.get(ob["source_id"], {}).get(ob["rule_id"]))
        have = ob["reminders"]
        missing = sorted(want - set(have))
        # A reminder nobody asks for any more is harmless once handled; an open one would still be sent.
        extra = sorted(k for k, st in have.items() if k not in want and st in OPEN)
        if missing or extra:
            count += 1
            if len(offenders) < limit:
                offenders.append({"obligation_id": ob["id"], "rule_id": ob["rule_id"], "title": ob["title"],
                                  "due_at": _iso(ob["due_at"]), "missing": [list(m) for m in missing[:10]],
                                  "unexpected": [list(e) for e in extra[:10]]})
    # "planned": this check judges the obligations planning wrote, not whether it wrote all of them
    # (a rule cut at the occurrence cap has none past the cut; plan_complete is red for that).
    summary = (f"{count} of {len(obs)} planned obligation(s) due by {instant_text(now + horizon)} lack reminder "
               f"rows or have open ones nobody asks for (first: obligation {offenders[0]['obligation_id']})" if count
               else f"all {len(obs)} planned obligation(s) due by {instant_text(now + horizon)} have exactly their "
               "reminder rows")
    return CheckOutcome("fanout_complete", count == 0, count, summary, offenders)


def escalations_acknowledged(engine: Engine, now: datetime, limit: int = 10) -> CheckOutcome:
    """Escalated alerts that no human has acknowledged (``deadline-pipeline acknowledge``)."""
    with engine.connect() as conn:
        count, oldest = health.escalated_unacknowledged(conn, limit)
    offenders = [{**_alert_offender(r, "escalated_unacknowledged"), "escalated_at": _iso(r["updated_at"]),
                  "waiting_seconds": int((now - r["updated_at"]).total_seconds())} for r in oldest]
    summary = (f"{count} escalated alert(s) not acknowledged; oldest escalated {instant_text(oldest[0]['updated_at'])}"
               if count else "every escalated alert is acknowledged")
    return CheckOutcome("escalations_acknowledged", count == 0, count, summary, offenders)


def time_data_agrees(engine: Engine, real_now: datetime, window: timedelta = timedelta(minutes=90),
                     own: str | None = None) -> CheckOutcome:
    """Every process serving the store computes instants with one IANA zone-data version: the
    versions recorded by the live heartbeats of the last ``window`` before ``real_now`` (aware UTC,
    the real clock: a replay's heartbeats prove nothing) and ``own`` (default: this process's,
    :func:`~deadline_pipeline.zone_data.version`) are all equal. Red otherwise, naming each
    process's version: a planner on 2025b and a checker on 2026f put America/Vancouver's deadlines an
    hour apart, and neither would say so. Also red while the last horizon plan's version differs
    from the one in force (the re-plan of the horizon is pending: ``replan_on_zone_data``)."""
    from deadline_pipeline import zone_data

    own = own or zone_data.version()
    with engine.connect() as conn:
        seen = health.zone_data_by_component(conn, real_now, window)
        planned_with, _ = health.plan_zone_data(conn)
    # The horizon plan however old its heartbeat: its instants are the ones reminders go out at.
    versions = {**seen, **({"horizon plan": planned_with} if planned_with else {}), "this check": own}
    distinct = sorted(set(versions.values()))
    if len(distinct) == 1:
        return CheckOutcome("time_data_agrees", True, 0,
                            f"every process of the last {human_duration(window)} computes with IANA {own}"
                            f" ({', '.join(sorted(versions))})")
    offenders = [{"component": c, "zone_data": v} for c, v in sorted(versions.items()) if v != own]
    named = ", ".join(f"{c} IANA {v}" for c, v in sorted(versions.items()))
    return CheckOutcome("time_data_agrees", False, len(offenders),
                        f"processes compute instants with different time-zone data: {named}; deploy one zone "
                        f"database everywhere (DEADLINE_ZONE_DATA and the tzdata package) so due instants agree",
                        offenders)
