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
    tail to one planning interval; and (2) every occurrence due inside
    ``[now + 15 min, now + horizon - 1 day]`` of every rule an active subscription (active
    subscriber) selects (patterns, ``kinds`` / ``exclude_kinds``) has an active obligation of that
    (subscriber, source, rule) due at that instant — the rule matched by its id or its lineage (a
    renamed rule's obligations stay keyed on its first id). Each due instant is read as planning
    reads it, with planning's own functions: its targets (zone of a floating rule, business-day
    calendar and convention), RECURRENCE-ID overrides folded into their masters, the expansion over
    planning's window rolled to business days. Only rules whose current version (and every version
    of its series) came into force before the last completed full planning run started are judged,
    and a rule planning refuses (``FREQ=SECONDLY``), cannot expand or cuts at the occurrence cap is
    not (``plan_complete`` reports it; counted in the summary). (2) catches a rule the planner
    silently skipped or withdrew, and one occurrence missing beside planned ones of its rule.
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
    ``watchdog`` agree. Metadata ``gap_rule_fallbacks``: quiet-window edges those runs read by the
    gap rule because the planner's gap scan saw no gap at a time the zone data skips (named in the
    summary when not 0; it does not turn the check red: the edge is read at or after the gap's end).
    Metadata ``orphan_overrides``, ``cancelled_occurrences``, ``override_rrule_ignored``: what folding
    the RECURRENCE-ID overrides left loose or took out in those runs. None turns the check red, as
    none leaves a reminder unplanned: an orphan override is planned as it is (a duplicate at worst),
    a cancelled occurrence is one the calendar itself cancelled, and an override's RRULE is dropped
    because an override is one instance (RFC 5545 §3.8.4.4), which is planned. A fold that fails is
    a planning problem (red above). Metadata ``calendar_decree_notes`` (and ``decrees_listed_to``:
    calendar → year): library calendars of yearly decree countries (CN) that rolled a due date past
    the last year the installed ``holidays`` release lists their moved days for; said in the summary
    with the release and the remedies, not red, as a country may move no day in a year (a due date
    past a calendar's declared end year is a planning problem instead). All of these are read from
    the heartbeats' structured ``counts``
    (:meth:`~deadline_pipeline.plan.outcome.PlanOutcome.heartbeat_counts`), each run's own.
``escalations_acknowledged``
    zero escalated alerts without ``acknowledged_at`` (a WARN: the miss is already loud; this tracks
    that a human took it over).
``clock_agrees``
    this process's clock and the store's (PostgreSQL's ``clock_timestamp()``) differ by at most
    :data:`CLOCK_SKEW`. Every other check judges ages by the same host clock the sweep uses to
    decide what is due: a host clock hours behind left every reminder unsent (not yet due by that
    clock) while ``alerts_reconciled`` and ``sweep_alive`` stayed green. Every live heartbeat
    records its process's offset against the store's clock as it is written, so a recent heartbeat
    from another host (a sweeper, a planner, a Celery worker) whose clock is beyond the skew is red
    too, named by its component.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Engine

from deadline_pipeline.config import DeadlinesConfig
from deadline_pipeline.instants import instant_text
from deadline_pipeline.plan.occurrences import GRACE
from deadline_pipeline.plan.outcome import DECREES_LISTED_TO, OVERRIDE_FOLD_COUNTS
from deadline_pipeline.rules import kinds_allow
from deadline_pipeline.states import OPEN
from deadline_pipeline.store import health
from deadline_pipeline.store.db import db_clock
from deadline_pipeline.watch.planned import SourceReading, planning_view
from deadline_pipeline.wording import human_duration, shorten

log = logging.getLogger(__name__)

# Heartbeat components the sweep writes: a completed sweep, or a sensor tick with nothing to claim.
SWEEP_COMPONENTS = ("deliver", "deliver:idle")
PLAN_COMPONENT = "plan"
PLAN_COMPONENTS = ("plan", "plan:backfill")
# Machines' clocks drift by seconds under NTP; more than this apart is not drift.
CLOCK_SKEW = timedelta(minutes=2)
# Channel type → the subscriber contact it needs (planning skips a channel whose contact is missing).
CONTACT_OF_TYPE = {"smtp": "email", "maildir": "email", "webhook": "webhook_url", "slack": None}


@dataclass
class CheckOutcome:
    """``passed``; ``count`` of offenders; ``offenders``: the worst few, JSON-safe; ``summary``: one line;
    ``metadata``: further JSON-safe figures of the check (e.g. fallback counts), shown beside them."""

    name: str
    passed: bool
    count: int
    summary: str
    offenders: list[dict] = field(default_factory=list)
    metadata: dict = field(default_factory=dict)


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


_PROBLEM_COUNT = re.compile(r"(\d+) problem\(s\)")

# The planning counts plan_complete reads from the heartbeats it judges (the full run's and newer
# backfills', ``heartbeats.counts``), by how they combine across those runs. Per-run totals count
# what each run did, so they add up.
_PER_RUN_COUNTS = ("gap_rule_fallbacks", *OVERRIDE_FOLD_COUNTS)
# Per-configuration facts describe what every run reads, not what one did: the zone notes describe
# the subscriber list, which every month's run reads whole, so adding the runs' counts would
# multiply them (one ambiguous zone said twice after a backfill); the largest is taken. The decree
# notes describe the configuration's calendars against the installed holidays release and the
# months planned: a backfill of months the full run planned notes the same calendar again (CN said
# twice), so they are not added either.
_PER_CONFIGURATION_COUNTS = ("subscriber_zone_notes", "calendar_decree_notes")


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
    out = _plan_complete_outcome(judged)
    counts = [b.get("counts") or {} for b in judged]
    for name in _PER_RUN_COUNTS:
        out.metadata[name] = sum(int(c.get(name, 0)) for c in counts)
    for name in _PER_CONFIGURATION_COUNTS:
        out.metadata[name] = max((int(c.get(name, 0)) for c in counts), default=0)
    fallbacks = out.metadata["gap_rule_fallbacks"]
    if fallbacks:
        out.summary += (f"; {fallbacks} quiet-window edge(s) read by the gap rule: the zone data has an "
                        "offset change the planner's gap scan did not see (see the planning log)")
    # Said, not red: the zone is read as written, as a source's ambiguous zone is (rules_complete's notes).
    zone_notes = out.metadata["subscriber_zone_notes"]
    if zone_notes:
        out.summary += (f"; {zone_notes} subscriber(s) have an ambiguous time zone (an abbreviation such as CST "
                        "or IANA's Etc/GMT±N, read as written; see the planning log for which, and write the "
                        "IANA name meant)")
    # Said, not red: a year past the release's listed decrees may be one in which nothing moved.
    listed = _decrees_listed(judged)
    out.metadata["decrees_listed_to"] = listed
    if out.metadata["calendar_decree_notes"]:
        release = max(judged, key=lambda b: b["last_completed_at"]).get("calendar_data") or "the holidays release"
        named = ", ".join(f"{spec} to {year}" for spec, year in listed.items())
        noted = out.metadata["calendar_decree_notes"]
        out.summary += (f"; {noted} business-day calendar(s) of yearly decree countries rolled due dates past the "
                        f"last year {release} lists their worked weekends and bridged days off for ({named}), as if "
                        "no day moved after it: if a decree moved days, upgrade holidays, or ingest the official "
                        "holiday file for that year (business_days.calendar: source:NAME); "
                        "see the planning log")
    return out


def _decrees_listed(judged: list[dict]) -> dict[str, int]:
    """Calendar spec → the last year the holidays release lists its decreed moved days for, over the
    heartbeats' counts (:data:`~deadline_pipeline.plan.outcome.DECREES_LISTED_TO`; the latest year
    when runs differ), sorted by spec."""
    listed: dict[str, int] = {}
    for beat in judged:
        for name, year in (beat.get("counts") or {}).items():
            if name.startswith(DECREES_LISTED_TO):
                spec = name[len(DECREES_LISTED_TO):]
                listed[spec] = max(int(year), listed.get(spec, 0))
    return dict(sorted(listed.items()))


def _plan_complete_outcome(judged: list[dict]) -> CheckOutcome:
    """:func:`plan_complete` on the heartbeats it judges (the full run's and newer backfills')."""
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


#: Missing occurrences a ``horizon_planned`` offender list and summary name (the count is exact).
MISSING_SHOWN = 10


@dataclass
class _Coverage:
    """What :func:`_missing_occurrences` found: ``missing`` offenders (``subscriber``, ``source``,
    ``rule_id``, ``due_at`` ISO), ``judged`` occurrences judged, ``skipped`` (source, rule id) pairs not
    judged because planning cannot expand them (it reports them: ``plan_complete``)."""

    missing: list[dict] = field(default_factory=list)
    judged: int = 0
    skipped: set[tuple[str, str]] = field(default_factory=set)


def _judged_rules(sources: dict[int, SourceReading], since: datetime) -> dict[int, tuple[list, dict[str, str]]]:
    """For each of ``sources`` (source id → its rules as planning plans them,
    :func:`~deadline_pipeline.watch.planned.planning_view` with ``trust_withdrawals``): source id →
    (its folded rules ``(version, RuleRecord)``; rule id → lineage), less the rules whose series
    (master and overrides, withdrawn ones too) has a version that came into force after ``since``:
    not planned yet, judging them would be red in the minutes between an ingest and the next
    planning run."""
    from deadline_pipeline.plan.scope import series_of

    return {sid: ([(v, r) for v, r in read.rules if read.series_changed.get(series_of(r.rule_id), since) <= since],
                  read.lineage) for sid, read in sources.items()}


def _missing_occurrences(conn, cfg: DeadlinesConfig, now: datetime, horizon: timedelta, since: datetime, lo: datetime,
                         hi: datetime) -> _Coverage:
    """Every occurrence due in ``[lo, hi]`` (aware UTC) of every rule each active subscription selects,
    read as planning reads it — its targets, business-day calendars and rules
    (:func:`~deadline_pipeline.watch.planned.planning_view`), each expansion over planning's own
    window at ``now`` (:func:`~deadline_pipeline.plan.planner.target_expansion`, cached across the
    subscriptions that share it) — without an active obligation of that subscriber, source and rule
    (its id or lineage) due at that instant."""
    from deadline_pipeline.plan.occurrences import window

    view = planning_view(conn, cfg, trust_withdrawals=True)
    targets = view.targets
    rules = _judged_rules(view.sources, since)
    planned = health.active_obligation_instants(conn, lo, hi)
    span = window(now, horizon)
    cache: dict = {}
    found = _Coverage()
    for t in targets:
        judged, lineage = rules[t.source_id]
        for version, rule in judged:
            for due in _uncovered(t, version, rule, lineage, planned, span, (lo, hi), cache, found):
                found.missing.append({"subscriber": t.subscriber, "source": t.source, "rule_id": rule.rule_id,
                                      "due_at": _iso(due)})
    return found


def _uncovered(target, version: int, rule, lineage: dict[str, str], planned: dict, span: tuple[datetime, datetime],
               judged: tuple[datetime, datetime], cache: dict, found: _Coverage) -> list[datetime]:
    """The due instants in ``judged`` of ``rule`` for ``target`` that the subscriber has no active
    obligation at (``planned``: :func:`~deadline_pipeline.store.health.active_obligation_instants`).
    A rule the target does not select, that planning refuses (``FREQ=SECONDLY``), cannot expand or
    cut at the occurrence cap is not judged: planning reports it (``plan_complete``), and the
    expansion cut here, started later than planning's, would expect what planning rightly did not plan."""
    from deadline_pipeline.plan.planner import refused_frequency, target_expansion
    from deadline_pipeline.timezones import UnknownTimeZone

    if not target.wants_rule(rule):
        return []
    try:
        if refused_frequency(rule.rrule):
            raise ValueError(f"FREQ={refused_frequency(rule.rrule)} is refused by planning")
        _zone, expanded = target_expansion(target, version, rule, *span, cache)
        if expanded.cut_at is not None:
            raise ValueError(f"its expansion is cut at the occurrence cap, at {instant_text(expanded.cut_at)}")
    except (UnknownTimeZone, ValueError) as exc:
        if (target.source, rule.rule_id) not in found.skipped:
            found.skipped.add((target.source, rule.rule_id))
            log.warning("horizon_planned: %s rule %s not judged (planning reports it): %s", target.source,
                        rule.rule_id, exc)
        return []
    # Each expansion's judged instants and the subscriber sets that cover them, once per expansion:
    # the per-target work is one set lookup per occurrence.
    ckey = ("horizon_planned", id(expanded), target.source_id, rule.rule_id)
    dues = cache.get(ckey)
    if dues is None:
        ids = {rule.rule_id, lineage.get(rule.rule_id, rule.rule_id)}
        lo, hi = judged
        dues = cache[ckey] = [(o.due_at, [planned.get((target.source_id, r, o.due_at), ()) for r in ids])
                              for o in expanded.occurrences if lo <= o.due_at <= hi]
    found.judged += len(dues)
    sid = target.subscriber_id
    return [due for due, covered in dues if not any(sid in c for c in covered)]


def horizon_planned(engine: Engine, cfg: DeadlinesConfig, now: datetime,
                    plan_interval: timedelta = timedelta(minutes=90), horizon: timedelta = timedelta(days=366),
                    limit: int = MISSING_SHOWN) -> CheckOutcome:
    """Planning is alive and every occurrence a subscription selects through ``now + horizon`` has its
    obligation (see the module docstring for the exact definition). ``cfg``: the
    :class:`~deadline_pipeline.config.DeadlinesConfig` planning plans from (its business-day calendars
    and source zones). Offenders: the stale heartbeat and/or one row per missing occurrence
    (``subscriber``, ``source``, ``rule_id``, ``due_at``: its due instant, ISO), the first ``limit``;
    ``count`` is exact."""
    with engine.connect() as conn:
        beats = health.read_heartbeats(conn)
        since = _judged_since(beats.get(PLAN_COMPONENT), plan_interval)
        # From the grace on at the near end: due instants are read as planning reads them (rolled,
        # overrides folded), so nothing ahead is excused; a week there (kept while they were read
        # unrolled) left a deadline of the coming week without its obligation green until a reminder's
        # send time had passed (reminders_owed). A day at the far end absorbs the planner's window
        # ending at its own run's start + horizon, up to one plan interval before now + horizon.
        lo, hi = now + GRACE, now + horizon - timedelta(days=1)
        found = _Coverage() if since is None else _missing_occurrences(conn, cfg, now, horizon, since, lo, hi)
    beat_out = _age_outcome("horizon_planned", "planning", beats, (PLAN_COMPONENT,), now, plan_interval)
    crashed = beats.get(PLAN_COMPONENT, {}).get("last_outcome") == "crashed"
    # Two subscriptions of one subscriber to one source share one obligation: one offender, not two.
    missing = sorted({(o["due_at"], o["source"], o["subscriber"], o["rule_id"]): o for o in found.missing}.items())
    missing = [o for _key, o in missing]
    count = (0 if beat_out.passed and not crashed else 1) + len(missing)
    parts = [] if beat_out.passed else [beat_out.summary]
    if crashed:
        parts.append(f"the last planning run crashed: {beats[PLAN_COMPONENT].get('detail')}")
    if missing:
        rules = len({(o["source"], o["rule_id"]) for o in missing})
        people = len({o["subscriber"] for o in missing})
        shown = ", ".join(f"{o['subscriber']} × {o['source']} rule {o['rule_id']} due {o['due_at']}"
                          for o in missing[:3])
        parts.append(f"{len(missing)} occurrence(s) of {rules} rule(s) for {people} subscriber(s) due between "
                     f"{instant_text(lo)} and {instant_text(hi)} have no active obligation (first: {shown})")
    skipped = (f"; {len(found.skipped)} rule(s) not judged: planning refuses or cannot expand them "
               "(plan_complete)") if found.skipped else ""
    summary = "; ".join(parts) or (f"{beat_out.summary}; each of {found.judged} subscribed occurrence(s) "
                                   f"due between {instant_text(lo)} and {instant_text(hi)} has its "
                                   "obligation")
    offenders = ([] if beat_out.passed and not crashed else beat_out.offenders) + missing
    return CheckOutcome("horizon_planned", count == 0, count, summary + skipped, offenders[:limit])


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


def _clock_words(behind_seconds: float) -> str:
    """``"3 h 0 min behind"`` / ``"5 h 0 min ahead of"`` for a clock ``behind_seconds`` behind the
    store's (negative: ahead)."""
    return f"{human_duration(abs(behind_seconds))} {'behind' if behind_seconds > 0 else 'ahead of'}"


def clock_agrees(engine: Engine, host_now: datetime, tolerance: timedelta = CLOCK_SKEW,
                 window: timedelta = timedelta(minutes=90)) -> CheckOutcome:
    """This process's clock (``host_now``, aware UTC: its real clock, never a replayed instant) and
    the store's clock (:func:`~deadline_pipeline.store.db.db_clock`, read right after) differ by
    at most ``tolerance``, and so did the clock of every process that wrote a live heartbeat within
    ``window`` before the store's now (its ``clock_offset_seconds``, measured as it wrote:
    :func:`~deadline_pipeline.store.health.beat`). Red otherwise, naming each host's component, by
    how much and which way (``"deliver's host clock is 3 h 0 min behind the store's"``); metadata
    ``offset_seconds`` is this host's clock minus the store's, ``heartbeats_measured`` the
    number of recent heartbeats that recorded an offset. ``offenders``: ``{"component", "host_clock",
    "store_clock", "offset_seconds"}`` for this host (component ``"this check"``) and
    ``{"component", "offset_seconds"}`` per heartbeat (offset_seconds: host minus store, as above).

    Why: the sweep decides what is due (``send_at <= now``) and every check judges ages by its
    host's clock, so a clock hours behind (a host up before NTP synced, a stopped NTP daemon) kept
    due reminders waiting while ``alerts_reconciled`` and ``sweep_alive`` judged with the same wrong
    clock and stayed green; hours ahead, reminders went out early and were escalated as missed
    before their deadline. Judging only this host missed a sweeper, planner or Celery worker on
    another host; their heartbeats carry their offsets. A replay's heartbeats (``--as-of``) record
    none. Leases are on the store's clock already, so it is the reference. On SQLite the store's
    clock is this host's own: a host clock that is wrong is not seen there."""
    with engine.connect() as conn:
        store_now = db_clock(conn)
        dialect = conn.dialect.name
        recorded = health.clock_offsets_by_component(health.live_processes(conn), store_now, window)
    offset = host_now - store_now
    seconds = offset.total_seconds()
    meta = {"offset_seconds": round(seconds, 3), "store_clock": instant_text(store_now),
            "heartbeats_measured": len(recorded)}
    offenders: list[dict] = []
    parts: list[str] = []
    if abs(offset) > tolerance:
        offenders.append({"component": "this check", "host_clock": instant_text(host_now),
                          "store_clock": instant_text(store_now), "offset_seconds": round(seconds, 3)})
        parts.append(f"this host's clock ({instant_text(host_now)}) is {_clock_words(-seconds)} the store's "
                     f"({instant_text(store_now)})")
    # Recorded as the store's clock minus the host's: positive is a host behind.
    for component, behind in sorted(recorded.items(), key=lambda kv: -abs(kv[1])):
        if abs(behind) > tolerance.total_seconds():
            offenders.append({"component": component, "offset_seconds": round(-behind, 3)})
            parts.append(f"{component}'s host clock is {_clock_words(behind)} the store's")
    if not offenders:
        note = " (SQLite: the store's clock is this host's)" if dialect == "sqlite" else ""
        return CheckOutcome("clock_agrees", True, 0, f"this host's clock is within {human_duration(tolerance)} of the "
                            f"store's ({seconds:+.1f} s), and so was every process of the {len(recorded)} heartbeat(s) "
                            f"of the last {human_duration(window)}{note}", [], meta)
    held = any(o["offset_seconds"] < 0 for o in offenders)
    early = any(o["offset_seconds"] > 0 for o in offenders)
    harm = " and ".join(w for w, on in (("held back", held), ("sent early and escalated as missed too soon", early))
                        if on)
    shown = "; ".join(parts[:5]) + (f"; and {len(parts) - 5} more" if len(parts) > 5 else "")
    return CheckOutcome("clock_agrees", False, len(offenders),
                        f"{shown}: reminders are judged due by the wrong clock ({harm}) and the checks on those "
                        "hosts judge ages by it too; fix NTP on each named host (timedatectl)", offenders, meta)


def time_data_in_force() -> tuple[str, str, str]:
    """This process's time data as (IANA zone-data version, holiday-calendar release, recurrence
    engine): what it computes instants with, in the order of :data:`health.TimeData`, for
    :func:`time_data_change`."""
    from deadline_pipeline import zone_data
    from deadline_pipeline.holiday_calendars import calendar_data_version
    from deadline_pipeline.recurrence_engine import recurrence_engine_version

    return zone_data.version(), calendar_data_version(), recurrence_engine_version()


def time_data_change(recorded: health.TimeData, in_force: tuple[str, str, str]) -> dict[str, str]:
    """What differs between the time data a process recorded (the horizon plan's, a heartbeat's)
    and the data in force, both as (IANA zone-data version, holiday-calendar release, recurrence
    engine), as heartbeat column → phrase, in that order (``{"zone_data": "IANA 2025b → 2026f",
    "calendar_data": "holidays 0.108 → holidays 0.109", "recurrence_engine": "python-dateutil 2.8.2 →
    python-dateutil 2.9.0.post0"}``); empty when nothing does. A version not recorded (``None``:
    written by a release before the record) is no change. The one comparison
    :func:`time_data_agrees` and the ``replan_on_time_data`` sensor both make: two copies could
    disagree, the sensor seeing nothing to re-plan while the check is red for the same horizon plan,
    or re-planning every minute while the check is green."""
    changes = {}
    for column, old, new, prefix in zip(_TIME_DATA, recorded, in_force, _TIME_DATA_PREFIX, strict=True):
        if old and old != new:
            changes[column] = f"{prefix}{old} → {new}"
    return changes


# The heartbeat columns of the time data, in the order of health.TimeData, how a version of each is
# named (a bare "2026f" reads as nothing), and what a difference in each does to the instants
# (time_data_agrees names it).
_TIME_DATA = ("zone_data", "calendar_data", "recurrence_engine")
_TIME_DATA_PREFIX = ("IANA ", "", "")
_TIME_DATA_HARM = ("processes compute instants with different time-zone data",
                   "processes roll business days with different holiday calendars",
                   "processes expand recurrence rules with different engines")


def time_data_agrees(engine: Engine, real_now: datetime, window: timedelta = timedelta(minutes=90),
                     own: str | None = None, own_calendar: str | None = None,
                     own_engine: str | None = None) -> CheckOutcome:
    """Every process serving the store computes instants with one IANA zone-data version, one
    holiday-calendar release and one recurrence engine: the versions recorded by the live heartbeats
    of the last ``window`` before ``real_now`` (aware UTC, the real clock: a replay's heartbeats prove
    nothing) and ``own`` / ``own_calendar`` / ``own_engine`` (default: this process's,
    :func:`~deadline_pipeline.zone_data.version`,
    :func:`~deadline_pipeline.holiday_calendars.calendar_data_version` and
    :func:`~deadline_pipeline.recurrence_engine.recurrence_engine_version`) are all equal. Red
    otherwise, naming each process's versions: a planner on 2025b and a checker on 2026f put
    America/Vancouver's deadlines an hour apart, a planner on another ``holidays`` release rolls a
    deadline to another working day, and one on another python-dateutil may expand an RRULE to other
    dates; none would say so. Also red while the last horizon plan's versions differ from the ones
    in force (the re-plan of the horizon is pending: ``replan_on_time_data``). A version not recorded
    (a heartbeat of a release before the record) is compared with nothing.

    ``offenders``: ``{"component", "zone_data"}``, ``{"component", "calendar_data"}`` or
    ``{"component", "recurrence_engine"}`` per version that differs from this process's."""
    ours = tuple(given or mine for given, mine in zip((own, own_calendar, own_engine), time_data_in_force(),
                                                       strict=True))
    with engine.connect() as conn:
        seen = health.time_data_by_component(health.live_processes(conn), real_now, window)
        planned, _ = health.plan_time_data(conn)
    # The horizon plan however old its heartbeat: its instants are the ones reminders go out at.
    seen = {**seen, "horizon plan": planned, "this check": ours}
    changed = {c: time_data_change(data, ours) for c, data in sorted(seen.items())}
    offenders, parts = [], []
    for i, (column, prefix, harm) in enumerate(zip(_TIME_DATA, _TIME_DATA_PREFIX, _TIME_DATA_HARM, strict=True)):
        named = {c: data[i] for c, data in seen.items() if data[i]}
        found = [{"component": c, column: named[c]} for c, ch in changed.items() if column in ch]
        offenders += found
        if found:
            parts.append(f"{harm}: " + ", ".join(f"{c} {prefix}{v}" for c, v in sorted(named.items())))
    if not offenders:
        zones = sorted(c for c, data in seen.items() if data[0])
        return CheckOutcome("time_data_agrees", True, 0,
                            f"every process of the last {human_duration(window)} computes with IANA {ours[0]}, "
                            f"{ours[1]} and {ours[2]} ({', '.join(zones)})")
    return CheckOutcome("time_data_agrees", False, len(offenders),
                        "; ".join(parts) + "; deploy one zone database (DEADLINE_ZONE_DATA and the tzdata package), "
                        "one holidays release and one python-dateutil release everywhere so due instants agree",
                        offenders)
