"""The planning stage without Dagster: configuration + active rules → obligations and alerts.

What a re-plan does to alerts (issue "Planning that is safe to recompute"):

* new obligation → its reminders, late ones folded (:func:`planner.fold_late`);
* moved due instant → reminders are owed per due instant: the new instant gets its own reminder rows
  (late ones folded by the late policy; under ``skip`` the latest late one still goes out at once,
  because the subscriber expects the old date), the open rows of the old instant are ``superseded``, the
  delivered ones stay as sent, and one *correction* per channel goes out ("old → new") where a
  reminder was delivered, keyed on the obligation's revision. Moving back to an instant whose
  reminders were delivered finds those rows and sends none of them again;
* deadline moved into the past (before the planning window) → a move as above, but no reminder of
  the new instant can go out: each channel with a delivered reminder gets its correction ("the new
  instant has already passed"), each channel without one gets a reminder for the passed instant that
  the delivery sweep escalates as missed (:func:`~.notices.missed_row`); an occurrence of a recurring series a
  revision moved to another day already past is escalated alike (:mod:`.series_moved`);
* deadline first seen after it had passed while its source was not fetched (no fetch with parsed
  content within the source's freshness window before it: :mod:`~deadline_pipeline.plan.first_seen`)
  → its obligation and one reminder per channel that the delivery sweep escalates as missed, naming
  the gap (:func:`~.escalations.missed_while_unwatched`); one the source published late, or that was past when the
  source was first watched, is a note, not a page;
* withdrawn rule → pending reminders cancelled; subscribers who already got a reminder get one
  *cancellation* notice per channel; a removed subscriber or subscription → cancelled silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

from sqlalchemy import Engine

from deadline_pipeline import zone_data
from deadline_pipeline.config import (
    DeadlinesConfig,
    SourceConfig,
    SubscriberConfig,
    SubscriptionConfig,
    parse_duration,
)
from deadline_pipeline.plan import chunks, escalations, override_keys, withdrawals
from deadline_pipeline.plan.business_days import calendar_data_version, holiday_source_of
from deadline_pipeline.plan.occurrences import window
from deadline_pipeline.plan.offsets import Offset
from deadline_pipeline.plan.outcome import PlanOutcome
from deadline_pipeline.plan.planner import (
    RULE_ID_SAMPLE,
    PlanMemo,
    PlanProblem,
    Target,
    editions_left_out,
    renamed_out_problem,
    subscription_selection_problems,
)
from deadline_pipeline.plan.recurrence import apply_overrides
from deadline_pipeline.plan.scope import RuleScope, series_of
from deadline_pipeline.plan.subscriber_hold import SubscriberHold, judge_removal
from deadline_pipeline.recurrence_engine import recurrence_engine_version
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.store import mirror, new_rows, plan_history, plan_inputs, revisions, staging
from deadline_pipeline.store.sources import all_sources, find_source, sync_source
from deadline_pipeline.timezones import ambiguous_abbreviation, inverted_sign

log = logging.getLogger(__name__)


def problems_detail(problems: list[PlanProblem], limit: int = 5) -> str:
    """``"N problem(s): source/rule: message; ..."`` with the first ``limit`` problems, or
    ``"0 problem(s)"``: the ``plan`` heartbeat's detail, which the ``plan_complete`` check and the
    watchdog read back (the count is parsed from ``N problem(s)``)."""
    head = "; ".join(f"{p.source}/{p.rule_id}: {p.message}" for p in problems[:limit])
    more = f"; and {len(problems) - limit} more" if len(problems) > limit else ""
    return f"{len(problems)} problem(s)" + (f": {head}{more}" if problems else "")


def record_plan_run(engine: Engine, component: str, *, started_at: datetime, completed_at: datetime, label: str,
                    problems: list[PlanProblem], replay: bool = False, counts: dict[str, int] | None = None,
                    host_clock: Callable[[], datetime] | None = None) -> None:
    """Write the heartbeat of one completed planning run: outcome ``partial`` when it reported
    problems (else ``ok``), detail ``"<label>; N problem(s): first offenders"``, and ``counts``
    (:meth:`PlanOutcome.heartbeat_counts`: the run's gap-rule fallbacks and override folds; name →
    count) as the heartbeat's structured counts. The ``plan_complete`` check and the watchdog read
    them back, so a problem known only to the run's log turns red, and a fallback is counted where
    the check is read. ``host_clock`` (default this host's real clock): the clock the run decided by,
    whose offset against the store's the heartbeat records (:func:`~deadline_pipeline.store.health.beat`)."""
    from deadline_pipeline.store import health

    with engine.begin() as conn:
        health.beat(conn, component, started_at=started_at, completed_at=completed_at,
                    outcome="partial" if problems else "ok",
                    detail=f"{label}; {problems_detail(problems)}", replay=replay, counts=counts,
                    host_clock=host_clock)


def subscribes(subscription: SubscriptionConfig, subscriber: SubscriberConfig, source: SourceConfig) -> bool:
    """Whether ``subscription`` applies to ``subscriber`` for ``source``: listed by id, or ``"*"`` for
    every subscriber of the source's tenant."""
    return subscriber.id in subscription.subscribers or (
        "*" in subscription.subscribers and subscriber.tenant == source.tenant)


def subscriber_zone_notes(cfg: DeadlinesConfig) -> tuple[list[str], int]:
    """(one sentence per zone, how many subscribers they name) for the subscribers whose zone is an
    ambiguous abbreviation (``CST``: read as UTC-6, also China Standard Time) or IANA's ``Etc/GMT+8``
    (POSIX's inverted sign: UTC-8), as a source's such zones are noted at ingest. A subscriber's zone
    decides when a date-only deadline ends for them and their quiet hours: a subscriber in China
    written ``CST`` had both 14 hours off, and nothing said so. Read as written, not refused."""
    by_zone: dict[str, list[str]] = {}
    for sub in cfg.subscribers:
        by_zone.setdefault(sub.timezone, []).append(sub.id)
    notes, named = [], 0
    for zone, ids in by_zone.items():
        sentence = ambiguous_abbreviation(zone) or inverted_sign(zone)
        if sentence is None:
            continue
        named += len(ids)
        shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        notes.append(f"subscriber(s) {shown}: {sentence}")
    return notes, named


def reach_problems(cfg: DeadlinesConfig) -> list[PlanProblem]:
    """Problems of the subscriptions' subscriber lists, one per subscription and source:

    * ``"*"`` that reaches no subscriber (no subscriber of the source's tenant; tenants compare
      exactly, and one differing from a source's only in letter case is refused at load,
      :func:`~deadline_pipeline.config.tenant_problems`): the subscription plans nothing, which would
      otherwise pass every check — also when it lists others by id (``["*", "bob"]``): the ``"*"``
      meant someone;
    * a subscriber listed by id whose tenant is not the source's: planned as listed (dropping it
      would be a silent miss), but a source's reminders are for its own tenant, so it is reported.
    """
    problems = []
    tenants = sorted({m.tenant for m in cfg.subscribers})
    by_id = {m.id: m for m in cfg.subscribers}
    for sub in cfg.subscriptions:
        for src_name in sub.sources:
            src = cfg.source(src_name)
            if not any(subscribes(sub, m, src) for m in cfg.subscribers):
                problems.append(PlanProblem(src.name, "*", f"subscription {sub.name!r} reaches no subscriber: "
                                            f"subscribers {sub.subscribers} has no subscriber of tenant "
                                            f"{src.tenant!r}; the subscribers' tenants are {tenants}"))
            elif "*" in sub.subscribers and not any(m.tenant == src.tenant for m in cfg.subscribers):
                problems.append(PlanProblem(src.name, "*", f"subscription {sub.name!r}: '*' in subscribers "
                                            f"{sub.subscribers} reaches no subscriber: there is none of tenant "
                                            f"{src.tenant!r}; the subscribers' tenants are {tenants}"))
            others = [f"{i!r} (tenant {by_id[i].tenant!r})" for i in sub.subscribers
                      if i in by_id and by_id[i].tenant != src.tenant]
            if others:
                problems.append(PlanProblem(src.name, "*", f"subscription {sub.name!r} lists subscriber(s) "
                                            f"{', '.join(others)} of another tenant than source {src.name!r} "
                                            f"(tenant {src.tenant!r}); planned as listed: give them the source's "
                                            "tenant, or remove them from the subscription"))
    return problems + unreached_subscribers(cfg)


#: Subscribers named in one "reached by no subscription" problem; the rest are counted.
UNREACHED_SHOWN = 10


def unreached_subscribers(cfg: DeadlinesConfig) -> list[PlanProblem]:
    """One problem per tenant of subscribers that no subscription reaches: listed by no subscription
    and of a tenant no ``"*"`` subscription's source has. Such a subscriber gets no reminder.

    An empty ``tenant`` cell in ``subscribers_csv`` (or no ``tenant`` key) means tenant ``default``:
    beside sources of tenant ``acme``, that subscriber was never planned, while the ``"*"``
    subscription still reached the other subscribers, so planning reported nothing and every check
    stayed green. The message names up to :data:`UNREACHED_SHOWN` ids, the tenant and the sources'
    tenants. Cost: one pass over the subscriptions and one over the subscribers."""
    listed: set[str] = set()
    star_tenants: set[str] = set()
    for sub in cfg.subscriptions:
        listed.update(sub.subscribers)
        if "*" in sub.subscribers:
            star_tenants.update(cfg.source(name).tenant for name in sub.sources)
    missed: dict[str, list[str]] = {}
    for m in cfg.subscribers:
        if m.id not in listed and m.tenant not in star_tenants:
            missed.setdefault(m.tenant, []).append(m.id)
    source_tenants = sorted({s.tenant for s in cfg.sources})
    problems = []
    for tenant, ids in sorted(missed.items()):
        shown = ", ".join(repr(i) for i in ids[:UNREACHED_SHOWN])
        more = f" and {len(ids) - UNREACHED_SHOWN:,} more" if len(ids) > UNREACHED_SHOWN else ""
        unset = (" (tenant 'default' is what a subscriber without a tenant gets, e.g. an empty tenant cell in "
                 "subscribers_csv)" if tenant == "default" else "")
        problems.append(PlanProblem("*", "*", f"{len(ids):,} subscriber(s) of tenant {tenant!r} reached by no "
                                    f"subscription get no reminder: {shown}{more}{unset}; '*' reaches the "
                                    f"subscribers of its sources' tenant, and the sources' tenants are "
                                    f"{source_tenants}: give them a source's tenant, list them in a "
                                    "subscription, or remove them"))
    return problems


def offsets_seconds(subscription: SubscriptionConfig) -> list[int]:
    """The subscription's reminder offsets as their nominal length in seconds (negative: before the
    due instant; a day counts 86,400 s), sorted: what the store keeps and keys reminders on."""
    return sorted(int(parse_duration(o).total_seconds()) for o in subscription.offsets)


def _target_offsets(cfg: DeadlinesConfig, row, out: PlanOutcome) -> tuple[Offset, ...]:
    """The offsets of a subscription row as written. The store keeps only their lengths in seconds;
    the written form (``-P7D`` calendar days vs ``-PT168H`` exact hours) comes from the
    configuration's subscription of that name. A row the configuration no longer matches (edited
    since planning last synced it) is read as exact seconds — loudly: it can put a reminder an
    hour off across a DST change until the next planning run syncs the row."""
    stored = [int(o) for o in row["offsets"]]
    written = row.get("offset_durations")
    if written is None:
        sub = next((s for s in cfg.subscriptions if s.name == row.get("name")), None)
        written = sub.offsets if sub is not None else None
    if written is not None:
        parsed = sorted((Offset.parse(o) for o in written), key=lambda o: (o.nominal_seconds, o))
        if [o.nominal_seconds for o in parsed] == sorted(stored):
            return tuple(parsed)
    msg = (f"subscription {row.get('name')!r} of {row.get('external_id')}: the configuration's offsets {written} "
           f"do not match the stored lengths {stored}; read as exact seconds until planning syncs the configuration")
    log.warning("planning: %s", msg)
    out.problems.append(PlanProblem(row.get("source", "?"), "*", msg))
    return tuple(Offset.exact(o) for o in stored)


class NothingToPlan(ValueError):
    """A configuration without subscribers or subscriptions: planning it would withdraw every
    obligation, which is far more often a broken file than an intent."""


def sync_configuration(engine: Engine, cfg: DeadlinesConfig, *, accept_removals: bool = False) -> SubscriberHold | None:
    """Mirror the configuration's sources, subscribers and subscriptions into the store.

    Returns the :class:`~deadline_pipeline.plan.subscriber_hold.SubscriberHold` when the subscriber
    list would withdraw more than ``plan.max_subscriber_withdraw_share`` of the subscribers owed
    reminders: those it leaves out are then kept active with their stored subscriptions (their
    reminders stay). ``accept_removals=True`` (``subscribers accept``: a human looked) mirrors the
    list as it is; the hold it overrode is returned all the same. None when nothing was held.

    Raises :class:`NothingToPlan` when the configuration has no subscriber or no subscription.
    """
    for section in ("subscribers", "subscriptions"):
        if not getattr(cfg, section):
            raise NothingToPlan(f"{section}: none configured; refusing to plan, because it would withdraw every "
                                "planned reminder (remove the subscriptions one by one to do that on purpose)")
    with engine.begin() as conn:
        src_ids = {}
        for s in cfg.sources:
            row = sync_source(conn, name=s.name, tenant=s.tenant, fmt=s.format, location=s.location,
                              freshness_seconds=int(s.freshness_window.total_seconds()))
            src_ids[s.name] = row.id
        active = mirror.active_subscriber_ids(conn)
        listed = {s.id for s in cfg.subscribers}
        # Who is owed a reminder is a join over every open alert (960k rows at scale), asked only when
        # two or more active subscribers are missing: fewer can never be held, and every run (a
        # scoped re-plan of 0.5 s included) would pay for it otherwise.
        owed = mirror.subscribers_owed_reminders(conn) if len(active.keys() - listed) > 1 else set()
        hold = judge_removal(listed, set(active), owed, cfg.plan.max_subscriber_withdraw_share,
                             cfg.subscribers_csv or "the configuration's subscribers")
        kept = {} if hold is None or accept_removals else {ext: active[ext] for ext in hold.kept}
        # Generators: the store reads and writes them a page at a time (mirror.MIRROR_PAGE).
        sub_ids = mirror.sync_subscribers(conn, (
            dict(external_id=s.id, tenant=s.tenant, email=s.email, webhook_url=s.webhook_url, timezone=s.timezone,
                 quiet_hours=s.quiet_hours, caldav_url=s.caldav_url, apprise_target=s.apprise_target)
            for s in cfg.subscribers
        ), keep=kept)
        mirror.sync_subscriptions(conn, _subscription_rows(cfg, src_ids, sub_ids), keep_subscribers=kept.values())
    return hold


def _subscription_rows(cfg: DeadlinesConfig, src_ids: dict[str, int], sub_ids: dict[str, int]) -> Iterator[dict]:
    """The store's subscription rows of the configuration: one per subscription, source and member
    subscriber (``subscribes``), built as they are read."""
    for sub in cfg.subscriptions:
        # The subscription's own values, once: every member's row shares them (read only), instead
        # of parsing the offsets and copying the lists once per subscriber (20,000 rows' worth).
        same = dict(name=sub.name, rule_patterns=list(sub.rules), offsets=offsets_seconds(sub),
                    channels=list(sub.channels), late_policy=sub.late_policy,
                    kinds=list(sub.kinds) if sub.kinds else None,
                    exclude_kinds=list(sub.exclude_kinds) or None)
        for src_name in sub.sources:
            src = cfg.source(src_name)
            for member in cfg.subscribers:
                if subscribes(sub, member, src):
                    yield {**same, "subscriber_id": sub_ids[member.id], "source_id": src_ids[src_name]}


def fold_overrides(rules: list[tuple[int, RuleRecord]], source: str, out: PlanOutcome) -> list[tuple[int, RuleRecord]]:
    """Fold RECURRENCE-ID overrides into their masters (each occurrence planned once), keeping each
    record's version. A source whose overrides cannot be folded is planned unfolded, loudly: a
    duplicate reminder is allowed, a missing one is not. What the fold left loose or took out
    (:attr:`~deadline_pipeline.plan.recurrence.Folded.counts`) is added to ``out.override_folds``."""
    versions = {r.rule_id: v for v, r in rules}
    try:
        folded = apply_overrides([r for _, r in rules])
    except ValueError as exc:
        log.error("planning: source %s: overrides not folded, planned as they are: %s", source, exc)
        out.problems.append(PlanProblem(source, "*", f"overrides not folded: {exc}"))
        return rules
    out.override_folds.update(folded.counts)
    return [(versions.get(r.rule_id, 0), r) for r in folded]


def targets_from_rows(cfg: DeadlinesConfig, rows, out: PlanOutcome, calendars: dict[str, tuple]) -> list[Target]:
    """Planning targets from subscription rows (store rows, or built from the configuration by
    `preview`); a channel the subscriber has no contact for is left out and reported as a problem."""
    tz_of_source = {s.name: s.timezone for s in cfg.sources}
    # One object per distinct value: a plan holds every target for the whole run, and 20,000
    # subscribers share a handful of zones, tenants, patterns, offsets and channel lists, of which
    # each row read from the store carried its own copy (about 400 bytes a target).
    shared: dict = {}
    # Offsets read once per (subscription, lengths, written form), not once per row: parsing them
    # for each of 20,000 subscribers was a third of building the targets. Only rows read without a
    # problem are remembered, so each mismatching row still reports its own subscriber.
    read_offsets: dict[tuple, tuple[Offset, ...]] = {}

    def one(value):
        return shared.setdefault(value, value)

    targets = []
    for r in rows:
        usable = []
        for ch in r["channels"]:
            missing = _missing_contact(cfg, ch, r)
            if missing:
                # Loud, not silent: the subscription asks for a channel this subscriber cannot get.
                msg = f"subscriber {r['external_id']} has no {missing} for channel {ch!r}"
                log.error("planning: %s; no alerts planned on that channel", msg)
                out.problems.append(PlanProblem(r["source"], "*", msg))
            else:
                usable.append(ch)
        written = r.get("offset_durations")
        okey = (r.get("name"), tuple(r["offsets"]), None if written is None else tuple(written))
        offsets = read_offsets.get(okey)
        if offsets is None:
            problems = len(out.problems)
            offsets = _target_offsets(cfg, r, out)
            if len(out.problems) == problems:
                read_offsets[okey] = offsets
        # Keyed with the text as written too: offsets compare by length only, and -P1W must not be
        # shown as another subscription's -P7D.
        offsets = shared.setdefault(("offsets", tuple((o.days, o.seconds, o.written) for o in offsets)), offsets)
        targets.append(Target(r["subscriber_id"], r["external_id"], one(r["tenant"]), one(r["timezone"]),
                              r["source_id"], one(r["source"]), tz_of_source.get(r["source"]),
                              one(tuple(r["rule_patterns"])), offsets, one(tuple(usable)), one(r["quiet_hours"]),
                              one(r["late_policy"]), calendars.get(r["source"]),
                              one(tuple(r["kinds"])) if r.get("kinds") else None,
                              one(tuple(r.get("exclude_kinds") or ())), one(r.get("name") or "")))
    return targets


def business_calendars(conn, cfg: DeadlinesConfig, out: PlanOutcome) -> dict[str, tuple]:
    """source name → (holiday calendar, convention) for sources that roll due dates.

    A ``source:NAME[/DIVISION]`` calendar is built from that holiday source's active rules, so a
    revised holiday (GOV.UK moving a bank holiday) moves the obligations rolled over it. A calendar
    that cannot be built leaves the source's dates unrolled and is reported: a due date one business
    day early is far better than none. Such a calendar covers the years of its first to its last
    holiday (of the division); a due date rolled past them is rolled for weekends alone and reported
    once per source (:class:`~deadline_pipeline.plan.business_days.Coverage`, told by the roll
    itself, so only when a due date falls there): GOV.UK's file ended 2027, and Monday 1 May 2028
    (Early May bank holiday) was not rolled, with no log line and every check green. A library
    calendar (``"LK"``) is judged the same way, over the years the installed ``holidays`` release
    declares (:func:`~deadline_pipeline.plan.business_days.covered_calendar`); a decree country's
    (``"CN"``) due date past the last year the release lists its moved days for is noted instead, once
    per calendar (:meth:`~deadline_pipeline.plan.outcome.PlanOutcome.note_calendar_decrees`), since
    the country may have moved no day that year.
    """
    from datetime import date

    from deadline_pipeline.plan.business_days import Coverage, DateSetCalendar, covered_calendar

    out_map: dict[str, tuple] = {}
    for src in cfg.sources:
        bd = src.business_days
        if bd is None or bd.convention == "none":
            continue
        try:
            ref = holiday_source_of(bd.calendar)
            if ref is not None:
                name, division = ref
                holiday_source = find_source(conn, name)
                if holiday_source is None:
                    raise ValueError(f"holiday source {name!r} was never ingested")
                rules, _ = plan_inputs.active_rules(conn, holiday_source.id)
                days = {date.fromisoformat(r.start[:10]) for _, r in rules
                        if not division or r.rule_id.startswith(division + "/")}
                if not days:
                    raise ValueError(f"holiday source {name!r} has no holidays{' for ' + division if division else ''}")
                # One problem per source, added by the roll (this run's planning) at its first due
                # date past the data, narrowed in place to the earliest.
                cal = DateSetCalendar(frozenset(days), name=bd.calendar, coverage=Coverage(
                    min(days).year, max(days).year, bd.calendar, PlanProblem(src.name, "*", ""),
                    lambda problem: out.add_problems([problem], "planning")))
            else:
                # Past the installed holidays release's declared end year (Sri Lanka's 2026 in 0.109)
                # the library answers "not a holiday": reported as a holiday file's last year is.
                # Past its listed decrees (China's 2027 notice absent from 0.109) it may be right, as
                # a year may move no day: said once per calendar, not red for a whole year.
                cal = covered_calendar(bd.calendar, PlanProblem(src.name, "*", ""),
                                       lambda problem: out.add_problems([problem], "planning"),
                                       out.note_calendar_decrees)
        except ValueError as exc:
            log.error("planning: source %s: business-day calendar %r unusable, dates not rolled: %s",
                      src.name, bd.calendar, exc)
            out.problems.append(PlanProblem(src.name, "*", f"business-day calendar {bd.calendar!r}: {exc}"))
            continue
        out_map[src.name] = (cal, bd.convention)
    return out_map


def plan_all(engine: Engine, cfg: DeadlinesConfig, now: datetime, *, after: datetime | None = None,
             before: datetime | None = None, scope: RuleScope | None = None) -> PlanOutcome:
    """Plan every active subscription through ``now + horizon`` (all instants aware UTC), optionally
    only the obligations due in ``[after, before)`` (one partition's months) and only those of the
    rules a revision changed (``scope``, see :func:`changed_rules` and :mod:`~deadline_pipeline.plan.scope`:
    other rules' obligations are neither planned nor withdrawn, so the run costs what changed).

    Idempotent: a second run with the same rules writes nothing. Obligations no longer wanted (rule
    withdrawn, subscriber or subscription removed) are withdrawn and their open alerts cancelled; a
    rule that merely failed to expand keeps its obligations (it is reported instead, because
    cancelling them would turn a parse problem into a silent miss).
    """
    hold = sync_configuration(engine, cfg)
    horizon = timedelta(days=cfg.plan.horizon_days)
    lo, hi = window(now, horizon)
    # A deadline that left this run's months for another month of the horizon is moved, not withdrawn.
    horizon_end = hi
    if after is not None:
        lo = max(lo, after)
    if before is not None:
        hi = min(hi, before - timedelta(microseconds=1))
    out = PlanOutcome(zone_data=zone_data.refresh().version, calendar_data=calendar_data_version(),
                      recurrence_engine=recurrence_engine_version())
    if hold is not None:
        # First of the problems: the plan heartbeat's detail (what plan_complete shows) lists the first few.
        out.subscribers_held = len(hold.kept)
        out.add_problems([PlanProblem("subscribers", "*", hold.message())], "planning: subscribers held")
    out.add_problems(reach_problems(cfg), "planning")
    notes, out.subscriber_zone_notes = subscriber_zone_notes(cfg)
    for note in notes:
        log.warning("planning: %s", note)
    with engine.begin() as conn:
        if staging.lock_planning(conn):
            log.info("planning: waited for another planning run of this store to finish")
        staging.without_jit(conn)
        targets = targets_from_rows(cfg, plan_inputs.active_targets(conn), out, business_calendars(conn, cfg, out))
        if scope is not None:
            scope = scope.with_whole_sources(_rolled_over(conn, cfg, scope.source_ids))
            targets = [t for t in targets if t.source_id in scope.source_ids]
        rules_cache, lineage, recorded_lineage = _read_rules(conn, targets, out)
        # Judged over every rule of a source, scoped or not: a pattern matching only unchanged rules
        # still matches.
        out.add_problems(subscriptions_selection_problems(targets, rules_cache, lineage, recorded_lineage))
        scoped_ids = _scoped_rule_ids(scope, rules_cache, recorded_lineage)
        if scoped_ids is not None:
            rules_cache = {sid: ([(v, r) for v, r in rules if ids is None or r.rule_id in ids], withdrawn)
                           for sid, (rules, withdrawn) in rules_cache.items() for ids in [scoped_ids[sid]]}
            out.scope = scope.describe()

        # Deadlines that may have passed while their source was not fetched, and who was planned for
        # before this run (only they can have missed one): both read before this run writes. The
        # pairs are read only for sources with such a deadline — usually none, and the read scans
        # every stored obligation of its sources, which would make a scoped run cost the store.
        judged = escalations.judge_sources(conn, targets, now)
        watched = plan_history.planned_pairs(conn, [sid for sid, found in judged.items() if found])
        override_keys.rekey_legacy_overrides(conn, targets, rules_cache, lineage, lo, horizon_end, out)
        staging.create_stage(conn)
        failed_rules = _plan_in_chunks(conn, targets, rules_cache, lineage, now, horizon, lo, hi, out)
        staging.analyze_planned(conn)
        if out.obligations_inserted + out.alerts_inserted >= ANALYZE_AFTER_ROWS:
            staging.analyze_written(conn)
        escalations.write_missed_while_unwatched(conn, targets, rules_cache, lineage, now, watched, judged, out)
        withdrawals.withdraw(conn, list(rules_cache) or [t.source_id for t in targets], lo, hi, failed_rules,
                             {(t.subscriber_id, t.source_id): t for t in targets}, rules_cache, now, out,
                             filtered=withdrawals.filtered_out(targets, rules_cache), rule_ids=scoped_ids,
                             lineage=lineage, horizon_end=horizon_end)
        # Not in a `finally`: on an error the transaction rolls back, and the staging tables made in it
        # with it, while a DROP on PostgreSQL's aborted transaction failed and was reported instead of
        # the error (a concurrent run's KeyError read "current transaction is aborted").
        staging.drop_stage(conn)
    return out


def _read_rules(conn, targets: list[Target], out: PlanOutcome) -> tuple[dict[int, tuple], dict[int, dict[str, str]],
                                                                        dict[int, dict[str, str]]]:
    """The rules of every target's source, read once per source: source id → (active rules with their
    RECURRENCE-ID overrides folded, :func:`fold_overrides`; withdrawn rule ids), source id →
    :attr:`~deadline_pipeline.store.plan_inputs.SourceRules.lineage` and →
    :attr:`~deadline_pipeline.store.plan_inputs.SourceRules.recorded_lineage`."""
    rules_cache: dict[int, tuple] = {}
    lineage: dict[int, dict[str, str]] = {}
    recorded_lineage: dict[int, dict[str, str]] = {}
    for t in targets:
        if t.source_id not in rules_cache:
            read = plan_inputs.source_rules(conn, t.source_id)
            rules_cache[t.source_id] = (fold_overrides(read.active, t.source, out), read.withdrawn)
            lineage[t.source_id] = read.lineage
            recorded_lineage[t.source_id] = read.recorded_lineage
    return rules_cache, lineage, recorded_lineage


def _plan_in_chunks(conn, targets: list[Target], rules_cache: dict[int, tuple], lineage: dict[int, dict[str, str]],
                    now: datetime, horizon: timedelta, lo: datetime, hi: datetime,
                    out: PlanOutcome) -> set[tuple[int, str]]:
    """Plan every target due in ``[lo, hi]`` (aware UTC) and write the plan chunk by chunk
    (:mod:`.chunks`) into the staging tables made by the caller; returns the (source id, rule id) of
    rules with a planning problem, whose stored obligations must not be withdrawn."""
    failed_rules: set[tuple[int, str]] = set()
    cache = PlanMemo()  # this run's own: it counts the run's gap-rule fallbacks
    # A store without obligations gets new chunks only, until one turns out not to be new:
    # while that holds, the planning thread also builds each chunk's alert rows and binary COPY
    # fields (PostgreSQL, where new chunks are written directly; SQLite merges every chunk).
    expect_new = {"new": conn.dialect.name == "postgresql" and new_rows.store_has_no_obligations(conn)}
    prepared = (chunks.prepare(chunk, now, cache, expect_new["new"]) for chunk in chunks.planned_chunks(
        targets, rules_cache, now, horizon, lo, hi, out, lineage, failed_rules, cache,
        start_small=expect_new["new"]))
    # Two helper threads overlap the client's Python with the database's work (the driver
    # releases the GIL while it waits): the next chunk is planned (and, expected new, made
    # ready to COPY) while this one is written, and a chunk's alert rows are built while its
    # obligations merge. The connection is only ever used by one thread at a time; the
    # shared ``cache`` holds deterministic values.
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="plan") as pool:
        pending = pool.submit(next, prepared, None)
        while (chunk := pending.result()) is not None:
            pending = pool.submit(next, prepared, None)
            expect_new["new"] = chunks.write_chunk(conn, chunk, now, out, cache, pool)
    out.gap_rule_fallbacks += cache.gap_rule_fallbacks
    return failed_rules


def _scoped_rule_ids(scope: RuleScope | None, rules_cache: dict[int, tuple],
                     recorded_lineage: dict[int, dict[str, str]]) -> dict[int, frozenset[str] | None] | None:
    """source id → the rule ids a scoped re-plan plans and may withdraw (:meth:`RuleScope.rule_ids`:
    ``None`` for every rule of that source), for every source in ``rules_cache``; ``None`` without a
    scope (every rule of every source). ``recorded_lineage``: source id →
    :attr:`~deadline_pipeline.store.plan_inputs.SourceRules.recorded_lineage`."""
    if scope is None:
        return None
    return {sid: scope.rule_ids(sid, rules, withdrawn, recorded_lineage[sid])
            for sid, (rules, withdrawn) in rules_cache.items()}


def _rolled_over(conn, cfg: DeadlinesConfig, source_ids: Iterable[int]) -> set[int]:
    """Ids of the sources whose business days are built from one of ``source_ids``
    (``business_days.calendar: source:NAME[/DIVISION]``): a revised holiday re-rolls their due dates."""
    names = {s.name: s.id for s in all_sources(conn)}
    holiday_sources = {name for name, sid in names.items() if sid in set(source_ids)}
    return {names[src.name] for src in cfg.sources
            if src.business_days is not None and src.name in names
            and (ref := holiday_source_of(src.business_days.calendar)) is not None
            and ref.name in holiday_sources}


def changed_rules(engine: Engine, since_version_id: int, until_version_id: int) -> RuleScope | None:
    """The rules changed by the rule versions with ``since_version_id < id <= until_version_id``, as the
    :class:`~deadline_pipeline.plan.scope.RuleScope` of a revision re-plan; ``None`` when there are none."""
    with engine.connect() as conn:
        changed = revisions.rule_versions_between(conn, since_version_id, until_version_id)
    if not changed:
        return None
    return RuleScope(frozenset((source_id, rule_id) for source_id, rule_id, _, _ in changed),
                     since_version_id + 1, until_version_id)


def subscriptions_selection_problems(targets: list[Target], rules_cache: dict[int, tuple],
                                     lineage: dict[int, dict[str, str]],
                                     recorded_lineage: dict[int, dict[str, str]]) -> list[PlanProblem]:
    """Each subscription's selection problem (:func:`~deadline_pipeline.plan.planner.subscription_selection_problems`)
    and, per source, its rules renamed out of its patterns
    (:func:`~deadline_pipeline.plan.planner.renamed_out_problem`), judged once per subscription over
    its sources — not per subscriber, whose targets differ only in who is reminded. ``rules_cache``:
    source id → (active rules, withdrawn rules) of every target's source; ``lineage`` /
    ``recorded_lineage``: source id → that source's :class:`~deadline_pipeline.store.plan_inputs.SourceRules`
    maps. Costs one dict look-up per target."""
    by_subscription: dict[tuple, dict[int, Target]] = {}
    for t in targets:
        key = (t.subscription, t.rule_patterns, t.kinds, t.exclude_kinds)
        by_subscription.setdefault(key, {}).setdefault(t.source_id, t)
    problems = []
    for per_source in by_subscription.values():
        ordered = sorted(per_source.items(), key=lambda i: i[1].source)
        problems.extend(subscription_selection_problems((t, *rules_cache[sid]) for sid, t in ordered))
        for sid, t in ordered:
            _log_editions_left_out(t, rules_cache[sid][0])
        renamed = (renamed_out_problem(t, lineage[sid], recorded_lineage.get(sid, {}))
                   for sid, t in ordered if lineage.get(sid))
        problems.extend(p for p in renamed if p is not None)
    return problems


def _log_editions_left_out(target: Target, rules: list) -> None:
    """Log the editions of ``target``'s source whose every deadline its kinds leave out
    (:func:`~deadline_pipeline.plan.planner.editions_left_out`): legitimate, so no problem, but seen."""
    left = editions_left_out(target, rules)
    if left:
        shown = ", ".join(left[:RULE_ID_SAMPLE]) + (f", … ({len(left)} in all)" if len(left) > RULE_ID_SAMPLE else "")
        log.info("subscription %r: kinds %s / exclude_kinds %s select no deadline of %d edition(s) of source %r "
                 "that list some: %s", target.subscription, list(target.kinds or ()), list(target.exclude_kinds),
                 len(left), target.source, shown)


# A run that inserted at least this many rows refreshes the tables' statistics before it reads them
# again (see :func:`~deadline_pipeline.store.staging.analyze_written`).
ANALYZE_AFTER_ROWS = 100_000


def _missing_contact(cfg: DeadlinesConfig, channel: str, row) -> str | None:
    """Which contact a subscriber lacks for a channel ("email", "webhook_url", "caldav_url"), or None."""
    ch = cfg.channels.get(channel)
    if ch is None:
        return "configured channel"
    if ch.type in ("smtp", "maildir") and not row["email"]:
        return "email"
    if ch.type == "webhook" and not row["webhook_url"]:
        return "webhook_url"
    if ch.type == "caldav" and not row.get("caldav_url") and not ch.url_template:
        return "caldav_url"
    return None


def max_version_id(engine: Engine) -> int:
    """The highest ``rule_versions.id`` so far (0 when empty): versions created after it are "new"."""
    with engine.connect() as conn:
        return revisions.max_rule_version_id(conn)


def affected_partitions(engine: Engine, cfg: DeadlinesConfig, since_version_id: int, now: datetime,
                        until_version_id: int | None = None) -> list[str]:
    """Due months (partition keys ``YYYY-MM-01``, sorted) whose obligations the rule versions with
    ``since_version_id < id <= until_version_id`` (no upper bound when None) can change: the months of
    the rules' current obligations (old instants) and of their new occurrences in every subscriber
    zone (new instants) after business-day rolling, inside the planning window around ``now`` (aware
    UTC); for a revised holiday source, also the months of every obligation and occurrence of the
    sources rolled over it (``business_days.calendar: source:NAME``), which its re-plan plans whole. A
    rule whose occurrences cannot be expanded is logged and widens nothing (planning reports it)."""
    from deadline_pipeline.plan.occurrences import expand
    from deadline_pipeline.rules import RuleRecord
    from deadline_pipeline.timezones import resolve_zone

    lo, hi = window(now, timedelta(days=cfg.plan.horizon_days))
    months: set[str] = set()
    with engine.connect() as conn:
        changed = revisions.rule_versions_between(conn, since_version_id, until_version_id)
        if not changed:
            return []
        # New instants are rolled exactly as planning rolls them: a Saturday 31 October due date
        # rolled to Monday 2 November belongs to November's partition, not October's.
        calendars = business_calendars(conn, cfg, PlanOutcome())
        name_of = {s.id: s.name for s in all_sources(conn)}
        zones = {s.timezone for s in cfg.subscribers} | {s.timezone for s in cfg.sources if s.timezone}
        pairs = {(source_id, rule_id) for source_id, rule_id, _, _ in changed}
        # A revised holiday source re-rolls every due date of the sources whose business days are
        # built on it (planning plans them whole): their old and new instants count as the changed
        # rules' do. Without them a holiday added on Friday 30 April requested April alone, whose run
        # withdrew the filing rolled to Monday 3 May, and May was not planned until the next horizon run.
        rolled = _rolled_over(conn, cfg, {p[0] for p in pairs})
        # One query for the old instants: only obligations of the changed rules' sources are read.
        for source_id, rule_id, due in revisions.obligation_dues(conn, {p[0] for p in pairs} | rolled, lo, hi):
            if (source_id, rule_id) in pairs or source_id in rolled:
                months.add(f"{due:%Y-%m}-01")
        new_rules = [(source_id, RuleRecord.from_payload(payload))
                     for source_id, _, withdrawn, payload in changed if not withdrawn]
        for source_id in sorted(rolled):
            new_rules += [(source_id, r) for _, r in plan_inputs.active_rules(conn, source_id)[0]]
        # A changed or withdrawn RECURRENCE-ID override changes its master's occurrences (a cancelled
        # one taken back restores one; its own version had no obligation, so no month): the master's
        # current occurrences count too.
        masters = {(source_id, series_of(rule_id)) for source_id, rule_id, _, _ in changed
                   if series_of(rule_id) != rule_id}
        for source_id in sorted({s for s, _ in masters}):
            new_rules += [(source_id, r) for _, r in plan_inputs.active_rules(conn, source_id)[0]
                          if (source_id, r.rule_id) in masters]
        for source_id, rule in new_rules:
            rolling = calendars.get(name_of.get(source_id))
            for zone_name in ({rule.tz} if rule.tz else zones or {"UTC"}):
                try:
                    for occ in expand(rule, resolve_zone(zone_name), after=lo, before=hi, business_days=rolling):
                        months.add(f"{occ.due_at:%Y-%m}-01")
                except ValueError as exc:  # reported by planning itself; here it only widens nothing
                    log.warning("affected partitions: rule %s: %s", rule.rule_id, exc)
    return sorted(months)
