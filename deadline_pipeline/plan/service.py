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
  the delivery sweep escalates as missed (:func:`missed_row`); an occurrence of a recurring series a
  revision moved to another day already past is escalated alike (:mod:`.series_moved`);
* deadline first seen after it had passed while its source was not fetched (no fetch with parsed
  content within the source's freshness window before it: :mod:`~deadline_pipeline.plan.first_seen`)
  → its obligation and one reminder per channel that the delivery sweep escalates as missed, naming
  the gap (:func:`missed_while_unwatched`); one the source published late, or that was past when the
  source was first watched, is a note, not a page;
* withdrawn rule → pending reminders cancelled; subscribers who already got a reminder get one
  *cancellation* notice per channel; a removed subscriber or subscription → cancelled silently.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import groupby
from zoneinfo import ZoneInfo

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError

from deadline_pipeline import zone_data
from deadline_pipeline.config import (
    DeadlinesConfig,
    SourceConfig,
    SubscriberConfig,
    SubscriptionConfig,
    parse_duration,
)
from deadline_pipeline.instants import instant_text
from deadline_pipeline.plan import series_moved
from deadline_pipeline.plan.business_days import calendar_data_version, holiday_source_of
from deadline_pipeline.plan.first_seen import LOOKBACK, MISSED_UNWATCHED, FirstSeenPassed, judge_source
from deadline_pipeline.plan.keys import alert_dedup_key, reminder_dedup_keys
from deadline_pipeline.plan.occurrences import GRACE, window
from deadline_pipeline.plan.offsets import Offset
from deadline_pipeline.plan.planner import (
    MOVED_DESPITE_SKIP,
    SKIPPED_BY_POLICY,
    PlannedObligation,
    PlanProblem,
    Target,
    plan_obligations,
    plan_target,
    reminder_rows,
    renamed_out_problem,
    subscription_selection_problems,
)
from deadline_pipeline.plan.recurrence import apply_overrides
from deadline_pipeline.plan.scope import RuleScope, series_of
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.states import SENT_OR_SENDING, UNSENT, AlertState, ObligationState
from deadline_pipeline.store import planning as sql
from deadline_pipeline.store.sources import all_sources, find_source, freshness_window, sync_source
from deadline_pipeline.wording import MOVE_CAUSE

log = logging.getLogger(__name__)


@dataclass
class PlanOutcome:
    """Counts of one planning run (every number is a row count)."""

    targets: int = 0
    obligations_planned: int = 0
    obligations_inserted: int = 0
    obligations_moved: int = 0
    obligations_updated: int = 0
    obligations_unchanged: int = 0
    obligations_withdrawn: int = 0
    alerts_planned: int = 0
    alerts_inserted: int = 0
    alerts_moved: int = 0
    alerts_cancelled: int = 0
    alerts_superseded: int = 0
    corrections: int = 0
    cancellation_notices: int = 0
    # Late reminders left to send at once for moved obligations of ``late_policy: skip``
    # subscriptions (:data:`~deadline_pipeline.plan.planner.MOVED_DESPITE_SKIP`; logged).
    moved_sent_despite_skip: int = 0
    # Reminders left for the delivery sweep to escalate as missed: one per channel of a deadline a
    # revision moved into the past before any reminder of it was delivered on that channel
    # (:func:`missed_row`; logged).
    moved_into_past_missed: int = 0
    # Reminders left for the delivery sweep to escalate as missed: one per channel of a deadline that
    # passed while its source was not fetched (plan.first_seen; :func:`missed_while_unwatched`,
    # logged at ERROR with the gap).
    missed_while_unwatched: int = 0
    # Obligations whose due instant moved although their rule did not: the zone data or the
    # working-day calendar changed (:func:`time_data_cause`; logged, named in the corrections).
    moved_by_time_data: int = 0
    # The IANA zone-data version and calendar library this run planned with.
    zone_data: str = ""
    calendar_data: str = ""
    problems: list[PlanProblem] = field(default_factory=list)
    # Chunks guessed all new whose direct COPY met a stored key, and that were merged instead
    # (logged; shown in the plan's metadata).
    direct_write_fallbacks: int = 0
    # A revision re-plan's scope (:meth:`~deadline_pipeline.plan.scope.RuleScope.describe`); empty for a
    # plan of every rule.
    scope: str = ""
    # (source, rule id, message) of each problem in ``problems``: a problem every subscriber of a
    # subscription meets (a refused rule) is listed and logged once, not once per subscriber.
    _seen: set[tuple[str, str, str]] = field(default_factory=set, repr=False, compare=False)

    def add_problems(self, problems: Iterable[PlanProblem], log_as: str = "planning problem") -> list[PlanProblem]:
        """Add the problems not already listed (same source, rule id and message), log each new one
        once (error, prefixed ``log_as``) and return them."""
        new = []
        for p in problems:
            key = (p.source, p.rule_id, p.message)
            if key in self._seen:
                continue
            self._seen.add(key)
            self.problems.append(p)
            new.append(p)
            log.error("%s: source %s rule %s: %s", log_as, p.source, p.rule_id, p.message)
        return new

    @property
    def alerts_written(self) -> int:
        return self.alerts_inserted + self.alerts_moved


def problems_detail(problems: list[PlanProblem], limit: int = 5) -> str:
    """``"N problem(s): source/rule: message; ..."`` with the first ``limit`` problems, or
    ``"0 problem(s)"``: the ``plan`` heartbeat's detail, which the ``plan_complete`` check and the
    watchdog read back (the count is parsed from ``N problem(s)``)."""
    head = "; ".join(f"{p.source}/{p.rule_id}: {p.message}" for p in problems[:limit])
    more = f"; and {len(problems) - limit} more" if len(problems) > limit else ""
    return f"{len(problems)} problem(s)" + (f": {head}{more}" if problems else "")


def record_plan_run(engine: Engine, component: str, *, started_at: datetime, completed_at: datetime, label: str,
                    problems: list[PlanProblem], replay: bool = False) -> None:
    """Write the heartbeat of one completed planning run: outcome ``partial`` when it reported
    problems (else ``ok``), detail ``"<label>; N problem(s): first offenders"``. The ``plan_complete``
    check and the watchdog read it back, so a problem known only to the run's log turns red."""
    from deadline_pipeline.store import health

    with engine.begin() as conn:
        health.beat(conn, component, started_at=started_at, completed_at=completed_at,
                    outcome="partial" if problems else "ok", detail=f"{label}; {problems_detail(problems)}",
                    replay=replay)


def subscribes(subscription: SubscriptionConfig, subscriber: SubscriberConfig, source: SourceConfig) -> bool:
    """Whether ``subscription`` applies to ``subscriber`` for ``source``: listed by id, or ``"*"`` for
    every subscriber of the source's tenant."""
    return subscriber.id in subscription.subscribers or (
        "*" in subscription.subscribers and subscriber.tenant == source.tenant)


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


def sync_configuration(engine: Engine, cfg: DeadlinesConfig) -> None:
    """Mirror the configuration's sources, subscribers and subscriptions into the store.

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
        # Generators: the store reads and writes them a page at a time (sql.MIRROR_PAGE).
        sub_ids = sql.sync_subscribers(conn, (
            dict(external_id=s.id, tenant=s.tenant, email=s.email, webhook_url=s.webhook_url, timezone=s.timezone,
                 quiet_hours=s.quiet_hours, caldav_url=s.caldav_url, apprise_target=s.apprise_target)
            for s in cfg.subscribers
        ))
        sql.sync_subscriptions(conn, _subscription_rows(cfg, src_ids, sub_ids))


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
    duplicate reminder is allowed, a missing one is not."""
    versions = {r.rule_id: v for v, r in rules}
    try:
        folded = apply_overrides([r for _, r in rules])
    except ValueError as exc:
        log.error("planning: source %s: overrides not folded, planned as they are: %s", source, exc)
        out.problems.append(PlanProblem(source, "*", f"overrides not folded: {exc}"))
        return rules
    return [(versions.get(r.rule_id, 0), r) for r in folded]


def targets_from_rows(cfg: DeadlinesConfig, rows, out: PlanOutcome, calendars: dict[str, tuple]) -> list[Target]:
    """Planning targets from subscription rows (store rows, or built from the configuration by
    `preview`); a channel the subscriber has no contact for is left out and reported as a problem."""
    tz_of_source = {s.name: s.timezone for s in cfg.sources}
    # One object per distinct value: a plan holds every target for the whole run, and 20,000
    # subscribers share a handful of zones, tenants, patterns, offsets and channel lists, of which
    # each row read from the store carried its own copy (about 400 bytes a target).
    shared: dict = {}

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
        offsets = _target_offsets(cfg, r, out)
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
    (Early May bank holiday) was not rolled, with no log line and every check green.
    """
    from datetime import date

    from deadline_pipeline.plan.business_days import Coverage, DateSetCalendar, calendar

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
                rules, _ = sql.active_rules(conn, holiday_source.id)
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
                cal = calendar(bd.calendar)
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
    sync_configuration(engine, cfg)
    horizon = timedelta(days=cfg.plan.horizon_days)
    lo, hi = window(now, horizon)
    if after is not None:
        lo = max(lo, after)
    if before is not None:
        hi = min(hi, before - timedelta(microseconds=1))
    out = PlanOutcome(zone_data=zone_data.version(), calendar_data=calendar_data_version())
    out.add_problems(reach_problems(cfg), "planning")
    with engine.begin() as conn:
        if sql.lock_planning(conn):
            log.info("planning: waited for another planning run of this store to finish")
        sql.without_jit(conn)
        targets = targets_from_rows(cfg, sql.active_targets(conn), out, business_calendars(conn, cfg, out))
        if scope is not None:
            scope = scope.with_whole_sources(_rolled_over(conn, cfg, scope.source_ids))
            targets = [t for t in targets if t.source_id in scope.source_ids]
        rules_cache: dict[int, tuple] = {}
        lineage: dict[int, dict[str, str]] = {}
        recorded_lineage: dict[int, dict[str, str]] = {}
        for t in targets:
            if t.source_id not in rules_cache:
                read = sql.source_rules(conn, t.source_id)
                rules_cache[t.source_id] = (fold_overrides(read.active, t.source, out), read.withdrawn)
                lineage[t.source_id] = read.lineage
                recorded_lineage[t.source_id] = read.recorded_lineage
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
        judged = _judge_sources(conn, targets, now)
        watched = sql.planned_pairs(conn, [sid for sid, found in judged.items() if found])
        sql.create_stage(conn)
        failed_rules: set[tuple[int, str]] = set()
        cache: dict = {}
        # A store without obligations gets new chunks only, until one turns out not to be new:
        # while that holds, the planning thread also builds each chunk's alert rows and binary COPY
        # fields (PostgreSQL, where new chunks are written directly; SQLite merges every chunk).
        expect_new = {"new": conn.dialect.name == "postgresql" and sql.store_has_no_obligations(conn)}
        chunks = (_prepare(chunk, now, cache, expect_new["new"]) for chunk in _planned_chunks(
            targets, rules_cache, now, horizon, lo, hi, out, lineage, failed_rules, cache,
            start_small=expect_new["new"]))
        # Two helper threads overlap the client's Python with the database's work (the driver
        # releases the GIL while it waits): the next chunk is planned (and, expected new, made
        # ready to COPY) while this one is written, and a chunk's alert rows are built while its
        # obligations merge. The connection is only ever used by one thread at a time; the
        # shared ``cache`` holds deterministic values.
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="plan") as pool:
            pending = pool.submit(next, chunks, None)
            while (chunk := pending.result()) is not None:
                pending = pool.submit(next, chunks, None)
                expect_new["new"] = _write_chunk(conn, chunk, now, out, cache, pool)
        sql.analyze_planned(conn)
        if out.obligations_inserted + out.alerts_inserted >= ANALYZE_AFTER_ROWS:
            sql.analyze_written(conn)
        _write_missed_while_unwatched(conn, targets, rules_cache, lineage, now, watched, judged, out)
        _withdraw(conn, list(rules_cache) or [t.source_id for t in targets], lo, hi, failed_rules,
                  {(t.subscriber_id, t.source_id): t for t in targets}, rules_cache, now, out,
                  filtered=_filtered_out(targets, rules_cache), rule_ids=scoped_ids, lineage=lineage)
        # Not in a `finally`: on an error the transaction rolls back, and the staging tables made in it
        # with it, while a DROP on PostgreSQL's aborted transaction failed and was reported instead of
        # the error (a concurrent run's KeyError read "current transaction is aborted").
        sql.drop_stage(conn)
    return out


def _scoped_rule_ids(scope: RuleScope | None, rules_cache: dict[int, tuple],
                     recorded_lineage: dict[int, dict[str, str]]) -> dict[int, frozenset[str] | None] | None:
    """source id → the rule ids a scoped re-plan plans and may withdraw (:meth:`RuleScope.rule_ids`:
    ``None`` for every rule of that source), for every source in ``rules_cache``; ``None`` without a
    scope (every rule of every source). ``recorded_lineage``: source id →
    :attr:`~deadline_pipeline.store.planning.SourceRules.recorded_lineage`."""
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
        changed = sql.rule_versions_between(conn, since_version_id, until_version_id)
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
    ``recorded_lineage``: source id → that source's :class:`~deadline_pipeline.store.planning.SourceRules`
    maps. Costs one dict look-up per target."""
    by_subscription: dict[tuple, dict[int, Target]] = {}
    for t in targets:
        key = (t.subscription, t.rule_patterns, t.kinds, t.exclude_kinds)
        by_subscription.setdefault(key, {}).setdefault(t.source_id, t)
    problems = []
    for per_source in by_subscription.values():
        ordered = sorted(per_source.items(), key=lambda i: i[1].source)
        problems.extend(subscription_selection_problems((t, *rules_cache[sid]) for sid, t in ordered))
        renamed = (renamed_out_problem(t, lineage[sid], recorded_lineage.get(sid, {}))
                   for sid, t in ordered if lineage.get(sid))
        problems.extend(p for p in renamed if p is not None)
    return problems


# A run that inserted at least this many rows refreshes the tables' statistics before it reads them
# again (see :func:`~deadline_pipeline.store.planning.analyze_written`).
ANALYZE_AFTER_ROWS = 100_000

# Obligations planned, compared and written per chunk: memory stays bounded by the chunk (not the
# plan), and each chunk's statements stay small. A chunk is cut only between subscribers, because
# two subscriptions of one subscriber merge into one obligation. Two chunks are in memory at once
# (one written, the next planned): at 20,000 the peak RSS of a 960,000-alert plan was 30% above a
# 96,000-alert one (whose chunks never grew that large); at 10,000 both reach the same size. A first
# plan lost about 5% to the smaller chunks (each ends in a round trip the pipeline waits on), won back
# by not sampling a chunk expected to be new (see _write_chunk).
CHUNK_OBLIGATIONS = 10_000


@dataclass
class _Planned:
    """One obligation of a chunk and the targets (subscriptions) that ask for it, in plan order."""

    ob: PlannedObligation
    targets: list[Target]
    alert_count: int


def _planned_chunks(targets, rules_cache, now, horizon, lo, hi, out: PlanOutcome, lineage: dict,
                    failed: set[tuple[int, str]], cache: dict, size: int | None = None, start_small: bool = False):
    """Expand every target (obligations only, no alert rows yet) and yield the obligations in chunks
    of about ``size`` as ``{obligation key: _Planned}``. Rules with a planning problem (failed to
    expand, or cut at the occurrence cap: their stored obligations past the cut are kept, not
    withdrawn) are added to ``failed`` as (source id, rule id); counts and problems go to ``out``.
    ``size`` defaults to :data:`CHUNK_OBLIGATIONS`. With ``start_small`` (a first plan) the first chunks are smaller (an
    eighth of it, doubling), because the database idles while the first chunk is planned and made
    ready to COPY: a small one gets the writes going sooner, and each next chunk is prepared while
    the one before it is written. (A re-plan's chunks cost the database little next to their
    planning, so there more chunks would only add statements.)"""
    size = size or CHUNK_OBLIGATIONS
    limit = max(1, size // 8) if start_small else size
    chunk: dict[str, _Planned] = {}
    last_subscriber = None
    for t in targets:
        if len(chunk) >= limit and t.subscriber_id != last_subscriber:
            yield chunk
            chunk = {}
            limit = min(size, limit * 2)
        last_subscriber = t.subscriber_id
        rules, _withdrawn = rules_cache[t.source_id]
        obs, problems = plan_obligations(t, rules, now, horizon, after=lo, before=hi + timedelta(microseconds=1),
                                         cache=cache, lineage=lineage.get(t.source_id))
        for p in problems:
            failed.add((t.source_id, p.rule_id))
        out.add_problems(problems)
        slots = len(t.offsets) * len(t.channels)
        for o in obs:
            first = chunk.get(o.key)
            if first is None:
                chunk[o.key] = _Planned(o, [t], slots)
                out.obligations_planned += 1
                out.alerts_planned += slots
                continue
            # Two subscriptions of one subscriber to the same source plan the same obligation once,
            # with the reminders of both (a second subscription must never be silently dropped).
            have = {(o_.nominal_seconds, ch) for tt in first.targets for o_ in tt.offsets for ch in tt.channels}
            extra = len({(o_.nominal_seconds, ch) for o_ in t.offsets for ch in t.channels} - have)
            first.targets.append(t)
            first.alert_count += extra
            out.alerts_planned += extra
            first.ob.fingerprint = hashlib.sha256((first.ob.fingerprint + o.fingerprint).encode()).hexdigest()
        out.targets += 1
    if chunk:
        yield chunk


def _alerts_of(p: _Planned, now: datetime, cache: dict, moved: bool = False,
               owed_since: datetime | None = None) -> list[tuple[tuple, str]]:
    """The reminder rows (:func:`~deadline_pipeline.plan.planner.reminder_rows`: ``(slot,
    dedup_key)``) of one planned obligation: those of its first subscription, then any (offset,
    channel) only a later subscription asks for. ``moved``: a stored obligation whose due instant
    changed; ``owed_since``: when a stored one was first planned (both: see
    :func:`~deadline_pipeline.plan.planner.fold_late`)."""
    rows = reminder_rows(p.ob, p.targets[0], now, cache, moved=moved, owed_since=owed_since)
    if len(p.targets) == 1:
        return rows
    at = {(slot[0], slot[1]): i for i, (slot, _) in enumerate(rows)}
    for t in p.targets[1:]:
        for slot, key in reminder_rows(p.ob, t, now, cache, moved=moved, owed_since=owed_since):
            i = at.get((slot[0], slot[1]))
            if i is None:
                at[(slot[0], slot[1])] = len(rows)
                rows.append((slot, key))
            elif _wins(slot, rows[i][0]):
                rows[i] = (slot, key)
    return rows


def _wins(slot: tuple, kept: tuple) -> bool:
    """Whether a later subscription's reminder ``slot`` replaces the ``kept`` one of the same
    (offset, channel) of one obligation (slots as :func:`~deadline_pipeline.plan.planner.reminder_rows`
    makes them). A reminder one subscription sends beats one another subscription skips: with
    ``late_policy: skip`` in the first subscription and ``send_latest`` in the second, the late
    reminder was skipped and the subscriber got nothing, or got it, depending only on the order the
    subscriptions were written in. Otherwise the earlier instant (one identity, two spellings:
    ``-P7D`` here, ``-PT168H`` there), because a reminder may come early but never late."""
    sends, sent_kept = slot[3] == AlertState.PENDING, kept[3] == AlertState.PENDING
    if sends != sent_kept:
        return sends
    return slot[2] < kept[2]


@dataclass
class _Prepared:
    """One planned chunk, ready to write: its obligation rows (:data:`~deadline_pipeline.store.planning.OB_COLS`
    order) and, for a chunk expected to be all new, each obligation's alert rows and binary COPY
    fields (in the chunk's order; ``None`` otherwise)."""

    chunk: dict[str, _Planned]
    rows: list[tuple]
    alerts: list[list[tuple[tuple, str]]] | None = None
    records: list[bytes] | None = None


def _prepare(chunk: dict[str, _Planned], now: datetime, cache: dict, expect_new: bool) -> _Prepared:
    """Everything a chunk's write needs that is pure Python, built on the planning thread: the
    obligation rows and, when ``expect_new``, the alert rows (one hash per alert: most of a first
    plan's client time) and the obligations' binary COPY fields, so the writing thread only streams them.
    A wrong expectation costs only this work: a chunk that is not all new is merged as usual."""
    rows = [(o.key, o.tenant, o.subscriber_id, o.source_id, o.rule_id, o.rule_version, o.period, o.title, o.due_at,
             o.fingerprint, o.zone_data, o.calendar_data) for o in (p.ob for p in chunk.values())]
    if not expect_new:
        return _Prepared(chunk, rows)
    return _Prepared(chunk, rows, [_alerts_of(p, now, cache) for p in chunk.values()],
                     sql.new_obligation_records(rows, now))


def _write_chunk(conn, prepared: _Prepared, now: datetime, out: PlanOutcome, cache: dict,
                 pool: Executor | None = None) -> bool:
    """Stage one chunk's obligations, compare them with the stored ones in one statement, merge only
    those that differ, and build and write alert rows only for obligations whose fingerprint
    changed (new obligations' alerts go straight in): an unchanged chunk costs a read, no write.
    Returns whether the chunk was all new and written directly."""
    chunk, rows = prepared.chunk, prepared.rows
    # A chunk prepared as new (every chunk before it was) skips the sample and is copied at once: the
    # unique index still catches a stored key, and the sample cost a first plan 4% (a query per chunk).
    if conn.dialect.name == "postgresql" and (prepared.alerts is not None or sql.none_stored(conn, list(chunk))):
        # A chunk of new obligations only (a first plan, new subscribers): COPY them and their
        # alerts straight in. A stored key the sample missed, or one another run stored meanwhile,
        # makes the COPY fail on the unique index; the savepoint undoes it and the chunk is merged
        # as usual below.
        try:
            with conn.begin_nested():
                _write_new_chunk(conn, prepared, now, out, cache, pool)
            return True
        except (IntegrityError, conn.dialect.loaded_dbapi.IntegrityError) as exc:
            # (The COPY runs on the driver's cursor, so its error arrives unwrapped.)
            out.direct_write_fallbacks += 1
            log.warning("planning: a chunk guessed all new met stored keys (missed by the sample, or stored by "
                        "a concurrent plan run); merged instead: %s", getattr(exc, "orig", exc))
    sql.clear_stage(conn)
    sql.stage_rows(conn, sql.stage_obligations, rows)
    with sql.key_lookups(conn):
        _merge_chunk(conn, chunk, now, out, cache, pool)
    return False


def _merge_chunk(conn, chunk: dict[str, _Planned], now: datetime, out: PlanOutcome, cache: dict,
                 pool: Executor | None) -> None:
    """The staged chunk: compare, merge what differs, write the alert rows of what changed.

    Order of the writes: the obligations' merge; the moved obligations' old-instant reminders
    superseded; the new obligations' reminders and the moved ones' new-instant reminders written
    straight in (PostgreSQL); every other changed obligation's reminders staged and merged; the
    corrections last (after the reminders, as the sweep's (send_at, id) order has always had them)."""
    diff = sql.compare_staged(conn)
    out.obligations_inserted += len(diff.new)
    out.obligations_moved += len(diff.moved)
    out.obligations_updated += diff.changed
    out.obligations_unchanged += len(chunk) - len(diff.new) - len(diff.moved) - diff.changed
    sql.remember_staged(conn)
    if not diff.need_alerts and not diff.moved and not diff.changed:
        return  # nothing differs: no merge, no alert rows
    old_due = {m["obligation_key"]: m["old_due_at"] for m in diff.moved}
    # Moved here by a run of another partition (the old instant's month planned first): without
    # this its late reminders were folded as a new deadline's and, under late_policy skip, never
    # sent, while the old instant's had been superseded.
    moved_from = {**diff.moved_before, **old_due}
    new = set(diff.new)
    moved_ids = {m["obligation_key"]: m["id"] for m in diff.moved}

    def write_obligations() -> tuple[dict[str, int], tuple[int, dict[int, set[str]]]]:
        # The moved obligations' old-instant reminders are superseded before the new instants' are
        # written: the update skips the current instant's rows, so it finds the same rows either way.
        return sql.merge_obligations(conn, now), sql.supersede_moved(conn, list(moved_ids.values()), now)

    def moved_records(stored: dict[str, list[tuple[tuple, str]]]) -> list[bytes]:
        # The moved obligations' new-instant reminders as binary COPY records (PostgreSQL).
        if conn.dialect.name != "postgresql":
            return []
        return list(sql.new_alert_records((
            (moved_ids[key], (seconds, channel, send_at, status, _moved_reason(reason, moved_from[key])), dedup,
             chunk[key].ob.due_at)
            for key, rows in stored.items() if key in moved_ids
            for (seconds, channel, send_at, status, reason), dedup in rows), now))

    writing = pool.submit(write_obligations) if pool is not None else None
    try:
        # Every alert row this chunk writes, built while the database merges and supersedes (or
        # before, without a pool): a new obligation's, each other changed one's, and the moved ones'
        # COPY records. A set's order varies per process: sorted, a chunk writes its rows in the
        # same order on every run, the moved obligations' by obligation id.
        built = [_alerts_of(chunk[key], now, cache) for key in diff.new]
        stored = {key: _alerts_of(chunk[key], now, cache, moved=key in moved_from or key in diff.restored)
                  for key in sorted(diff.need_alerts - new, key=lambda k: (moved_ids.get(k, 0), k))}
        records = moved_records(stored)
    finally:
        # Never leave the writes running on the connection, even when building the rows failed.
        written = writing.result() if writing is not None else None
    ids, (superseded, delivered) = written if written is not None else write_obligations()
    out.alerts_superseded += superseded
    _fold_as_known(conn, [chunk[key] for key in diff.new], built, now, cache, out)
    new_rows = [(key, chunk[key].ob.due_at, rows) for key, rows in zip(diff.new, built, strict=True)]
    del built
    direct = sql.insert_new_alerts(conn, (
        (ids[key], slot, dedup, due) for key, due, rows in new_rows for slot, dedup in rows
    ), now)
    del new_rows
    before_fold = {key: stored[key] for key in moved_ids if key in stored}
    _fold_as_owed(conn, stored, chunk, ids, diff.reactivated, now, cache)
    if any(stored[key] is not rows for key, rows in before_fold.items()):
        records = moved_records(stored)  # a moved obligation's rows were re-folded: encode them again
    del before_fold
    if _insert_moved_alerts(conn, records):
        direct += len(records)
        stored = {key: rows for key, rows in stored.items() if key not in moved_ids}
    del records
    staged = sql.stage_rows(conn, sql.stage_alerts, (
        (key, seconds, channel, "reminder", dedup, send_at, status, _moved_reason(reason, moved_from.get(key)),
         chunk[key].ob.due_at)
        for key, rows in stored.items() for (seconds, channel, send_at, status, reason), dedup in rows
    ))
    del stored
    merged, moved_alerts = sql.merge_alerts(conn, now) if staged else (0, 0)
    out.alerts_inserted += direct + merged
    out.alerts_moved += moved_alerts
    out.alerts_cancelled += sql.cancel_unwanted_reminders(
        conn, [key for key in diff.need_alerts if key not in new and key not in old_due], now)
    _correct_moves(conn, diff.moved, {key: p.ob for key, p in chunk.items()}, delivered, now, out)
    _tell_restored(conn, [key for key in sorted(diff.reactivated) if key not in old_due], ids, chunk, now, out)
    # Restored, or moved by another partition's run: their late reminders go out despite skip too.
    also = [{"id": ids[key], "obligation_key": key, "old_due_at": diff.moved_before.get(key),
             "new_due_at": chunk[key].ob.due_at}
            for key in sorted((diff.restored | set(diff.moved_before)) - set(old_due)) if key in ids]
    _count_moved_despite_skip(conn, diff.moved + also, chunk, out)


def _insert_moved_alerts(conn, records: list[bytes]) -> bool:
    """Write the new instants' reminders of moved obligations (their binary COPY ``records``,
    :func:`~deadline_pipeline.store.planning.new_alert_records`; PostgreSQL) straight into ``alerts``
    under a savepoint. False when the caller must merge them instead: no records (SQLite), or one
    already stored (a deadline moved back to an instant it had: its superseded reminders are
    revived by the merge, never duplicated). The unique indexes tell the second case, as they do for
    a chunk guessed new, and the savepoint undoes the COPY. Written directly, they skip the staging
    table, its join and the per-row conflict check of the merge."""
    if not records:
        return False
    try:
        with conn.begin_nested():
            sql.copy_new_alerts(conn, records)
        return True
    except (IntegrityError, conn.dialect.loaded_dbapi.IntegrityError):
        # (The COPY runs on the driver's cursor, so its error arrives unwrapped.) Expected, not a
        # wrong guess of a chunk: not counted in ``direct_write_fallbacks``.
        log.info("planning: a moved deadline's new instant already has reminders (moved back); merged instead")
        return False


def _count_moved_despite_skip(conn, moved: list[dict], chunk: dict[str, _Planned], out: PlanOutcome) -> None:
    """Count and log the late reminders of moved obligations (``moved``: dicts with ``id``,
    ``obligation_key``, ``old_due_at`` — None for one its source withdrew and restored — and
    ``new_due_at``) that go out at once although their subscription skips late reminders: a
    deliberate exception to the configured policy, so it is visible in the plan's metadata and log,
    not only in each alert's reason."""
    ids = {m["id"]: m for m in moved
           if any(t.late_policy == "skip" for t in chunk[m["obligation_key"]].targets)}
    if not ids:
        return
    found = sql.pending_reminders_noting(conn, sorted(ids), MOVED_DESPITE_SKIP)
    if not found:
        return
    out.moved_sent_despite_skip += len(found)
    first = ids[found[0][0]]
    how = (f"moved from {instant_text(first['old_due_at'])} to" if first["old_due_at"] is not None
           else "withdrawn and restored by its source, due")
    log.warning("planning: %d late reminder(s) of %d moved deadline(s) sent at once although their subscription "
                "has late_policy skip (its subscriber knew only the old date); first: obligation %s %s %s",
                len(found), len({oid for oid, _ in found}), first["obligation_key"], how,
                instant_text(first["new_due_at"]))


def _write_new_chunk(conn, prepared: _Prepared, now: datetime, out: PlanOutcome, cache: dict,
                     pool: Executor | None) -> None:
    """Write a chunk whose obligations are all new (:func:`~deadline_pipeline.store.planning.copy_new_obligations`).
    Its alert rows come prepared, or are built while the obligations are copied; counts go to
    ``out`` only once the chunk is written."""
    chunk, rows = prepared.chunk, prepared.rows
    built = prepared.alerts
    if built is not None:
        ids = sql.copy_new_obligations(conn, rows, now, prepared.records)
    else:
        copying = pool.submit(sql.copy_new_obligations, conn, rows, now) if pool is not None else None
        try:
            built = [_alerts_of(p, now, cache) for p in chunk.values()]
        finally:
            # Never leave the COPY running on the connection, even when building the rows failed.
            ids = copying.result() if copying is not None else None
        if ids is None:
            ids = sql.copy_new_obligations(conn, rows, now)
    _fold_as_known(conn, list(chunk.values()), built, now, cache, out)
    written = sql.insert_new_alerts(conn, (
        (ids[key], slot, dedup, p.ob.due_at)
        for (key, p), alerts_ in zip(chunk.items(), built, strict=True) for slot, dedup in alerts_
    ), now)
    out.obligations_inserted += len(chunk)
    out.alerts_inserted += written


def _fold_as_known(conn, planned: list[_Planned], built: list[list[tuple[tuple, str]]], now: datetime, cache: dict,
                   out: PlanOutcome) -> None:
    """Re-fold, in place, the reminder rows (``built``, one list per obligation of ``planned``) of new
    obligations whose subscriber was planned for their rule under an older version: a revision made
    them (a weekly series moved from Wednesdays to Tuesdays, a monthly one from the 15th to the
    10th), so ``late_policy: skip`` does not skip their late reminders — as for a deadline that moved
    (:func:`~deadline_pipeline.plan.planner.fold_late`, ``moved``). Planned as new, the 10th's
    reminder was skipped as late while the 15th's was withdrawn: its subscriber got nothing, or a
    "Cancelled" notice. A new subscriber, or a deadline new to a rule nobody was planned for, keeps
    ``skip``. Reads the store only when some row was skipped by that policy.

    A RECURRENCE-ID override (``UID#<RECURRENCE-ID>``, RFC 5545 §3.8.4.4) is a rule of its own, new
    at version 1 when the source adds it, but the occurrence it replaces was its series': an override
    new to a subscriber planned for its series (the master ``UID``) before this run moved a deadline
    the subscriber knew. Judged by its rule alone, an override moving the 18th to the 8th had its late
    reminder skipped while the 18th's was withdrawn: nobody was told."""
    maybe = [i for i, rows in enumerate(built) if _skipped_by_policy(rows)]
    if not maybe:
        return
    asked = {(planned[i].ob.subscriber_id, planned[i].ob.source_id, rule_id)
             for i in maybe for rule_id in {planned[i].ob.rule_id, series_of(planned[i].ob.rule_id)}}
    stored = sql.planned_rule_versions(conn, asked, now)
    for i in maybe:
        if not _known_before(planned[i].ob, stored):
            continue
        built[i] = _alerts_of(planned[i], now, cache, moved=True)
        out.moved_sent_despite_skip += sum(1 for slot, _ in built[i]
                                           if slot[3] == AlertState.PENDING and slot[2] <= now)


def _skipped_by_policy(rows: list[tuple[tuple, str]]) -> bool:
    """Whether one of an obligation's reminder rows (:func:`_alerts_of`) was skipped by ``late_policy:
    skip`` (not by a later reminder of the same deadline)."""
    return any(slot[3] == AlertState.SKIPPED and (slot[4] or "").endswith(SKIPPED_BY_POLICY) for slot, _ in rows)


def _known_before(ob: PlannedObligation, stored: dict[tuple[int, int, str], int]) -> bool:
    """Whether ``ob``'s subscriber was planned, before this run, for its rule under an older version
    (``stored``: :func:`~deadline_pipeline.store.planning.planned_rule_versions`), or, for an override
    never planned for them, for its series."""
    version = stored.get((ob.subscriber_id, ob.source_id, ob.rule_id))
    if version is not None:
        return version < ob.rule_version
    series = series_of(ob.rule_id)
    return series != ob.rule_id and (ob.subscriber_id, ob.source_id, series) in stored


def _fold_as_owed(conn, stored: dict[str, list[tuple[tuple, str]]], chunk: dict[str, _Planned], ids: dict[str, int],
                  reactivated: set[str], now: datetime, cache: dict) -> None:
    """Re-fold, in place, the reminder rows (``stored``: obligation key → rows) of stored obligations
    that ``late_policy: skip`` skipped as late although their time came after the obligation was
    first planned (its first alert row, ``ids``: key → obligation id): they were owed, and a
    configuration edit (an offset taken out and put back, a channel renamed, a contact blanked and
    fixed) had cancelled them before they went out. Skipped as a new deadline's, they were never
    sent and every check stayed green (:func:`~deadline_pipeline.plan.planner.fold_late`,
    ``owed_since``). Not for obligations coming back from withdrawn (``reactivated``): a subscriber
    removed and added back was owed nothing meanwhile. Reads the store only when some row was skipped
    by that policy."""
    maybe = [key for key, rows in stored.items() if key in ids and key not in reactivated and _skipped_by_policy(rows)]
    if not maybe:
        return
    first = sql.first_planned(conn, [ids[key] for key in maybe])
    for key in maybe:
        since = first.get(ids[key])
        if since is not None:
            stored[key] = _alerts_of(chunk[key], now, cache, owed_since=since)


# The status reason of a cancellation notice not sent because its deadline came back first.
RESTORED_BEFORE_NOTICE = "withdrawn: the source published the deadline again before this notice went out"


def _tell_restored(conn, keys: list[str], ids: dict[str, int], chunk: dict[str, _Planned], now: datetime,
                   out: PlanOutcome) -> None:
    """For obligations coming back from withdrawn at the same due instant (``keys``; ``ids``: key →
    id): a cancellation notice of the withdrawal not yet sent is cancelled, and each channel where
    one was sent (or is being sent) gets a correction saying the deadline stands again
    (:func:`restored_row`). Before, "Cancelled … no further reminders will be sent" was the
    subscriber's last word on a deadline its source had restored, with every reminder already
    delivered: nothing more was sent, every check green. A subscriber removed and added back got no
    notice when removed, so gets none now."""
    oids = {ids[key]: key for key in keys if key in ids}
    if not oids:
        return
    notices = sql.cancellation_notices(conn, sorted(oids))
    if not notices:
        return
    unsent = [aid for aid, _oid, _ch, status, _rev in notices if status in UNSENT]
    out.alerts_cancelled += sql.cancel_unsent_notices(conn, unsent, RESTORED_BEFORE_NOTICE, now)
    rows = [restored_row(oid, oids[oid], channel, revision, chunk[oids[oid]].ob.due_at, now)
            for _aid, oid, channel, status, revision in notices
            if status in SENT_OR_SENDING]
    written = sql.insert_notices(conn, rows)
    out.corrections += written
    if written:
        log.warning("planning: %d correction(s) tell subscribers that %d deadline(s) withdrawn with a cancellation "
                    "notice are back", written, len({r["obligation_id"] for r in rows}))


def restored_row(obligation_id: int, key: str, channel: str, revision: int, due: datetime, now: datetime) -> dict:
    """The alert row of a correction saying a deadline (due ``due``, aware UTC) stands again after a
    cancellation notice of its withdrawal went out on ``channel``; one per revision and channel, as
    the cancellation notices are, so a re-plan never writes a second one."""
    row = correction_row(obligation_id, key, channel, revision, due, due, now)
    row.update(dedup_key=alert_dedup_key(key, 0, channel, "restored", revision), previous_due_at=None,
               status_reason=f"deadline restored at {instant_text(due)} after a cancellation notice was delivered"
                             f"{MOVE_CAUSE}its source withdrew it and published it again: it is due as before")
    return row


def _moved_reason(reason: str | None, old_due: datetime | None) -> str | None:
    """A moved deadline's late reminders say why they are late (the move, not the planning run)."""
    if old_due is not None and reason and reason.startswith("late at planning"):
        return f"deadline moved from {instant_text(old_due)}" + reason[len("late at planning"):]
    return reason


def _correct_moves(conn, moved: list[dict], by_key: dict, delivered: dict[int, set[str]], now: datetime,
                   out: PlanOutcome) -> None:
    """After the merge and the supersession of their old instants' open reminders
    (:func:`~deadline_pipeline.store.planning.supersede_moved`, which read ``delivered``: obligation id →
    channels with a delivered reminder): log each move's time-data cause and send one correction per
    channel where a reminder was already delivered."""
    if not moved:
        return
    notices = []
    for m in moved:
        ob = by_key[m["obligation_key"]]
        revision = m["revision"] + 1  # the merge bumped it once for this move
        cause = time_data_cause(m, ob)
        if cause:
            out.moved_by_time_data += 1
            log.warning("planning: obligation %s moved from %s to %s: %s", ob.key, instant_text(m["old_due_at"]),
                        instant_text(ob.due_at), cause)
        for channel in sorted(delivered.get(m["id"], ())):
            notices.append(correction_row(m["id"], ob.key, channel, revision, m["old_due_at"], ob.due_at, now,
                                          cause=cause))
    out.corrections += sql.insert_notices(conn, notices)


def _filtered_out(targets, rules_cache) -> set[tuple[int, int, str]]:
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


def time_data_cause(stored: dict, ob: PlannedObligation) -> str | None:
    """Why obligation ``ob`` moved although its rule did not: ``stored`` is the obligation as it was
    (``rule_version``, ``zone_data``, ``calendar_data``: :class:`~deadline_pipeline.store.planning.StagedDiff`
    ``moved``). Returns e.g. "the time-zone rules of America/Vancouver changed (IANA 2025b → 2026f)",
    the working-day calendar's upgrade, both joined by "; ", or ``None`` (the rule changed, or no
    recorded version did: a NULL is "planned before versions were recorded", not a version)."""
    if stored.get("rule_version") != ob.rule_version:
        return None
    causes = []
    old_zone, old_cal = stored.get("zone_data"), stored.get("calendar_data")
    # Only an IANA zone has rules that change; a fixed offset (AoE, UTC-12) means the same everywhere.
    if old_zone and ob.zone_data and old_zone != ob.zone_data and isinstance(ob.tz, ZoneInfo):
        causes.append(f"the time-zone rules of {ob.zone} changed (IANA {old_zone} → {ob.zone_data})")
    if old_cal and ob.calendar_data and old_cal != ob.calendar_data:
        causes.append(f"the working-day calendar changed ({old_cal} → {ob.calendar_data})")
    return "; ".join(causes) or None


def correction_row(obligation_id: int, key: str, channel: str, revision: int, old_due: datetime,
                   new_due: datetime, now: datetime, *, cause: str | None = None) -> dict:
    """The alert row of one correction ("moved from ``old_due`` to ``new_due``", both aware UTC),
    keyed on the obligation's revision so a re-plan never sends a second one for the same move. A
    move into the past says so: the new instant has passed, so no reminder for it will follow.
    ``cause``: why it moved when its rule did not (:func:`time_data_cause`), after
    :data:`~deadline_pipeline.wording.MOVE_CAUSE`, which the message shows as "Why: …"."""
    passed = "; the new instant has already passed" if new_due <= now else ""
    passed += f"{MOVE_CAUSE}{cause}" if cause else ""
    return dict(
        obligation_id=obligation_id, offset_seconds=0, channel=channel, kind="correction", revision=revision,
        dedup_key=alert_dedup_key(key, 0, channel, "correction", revision), send_at=now, due_at=new_due,
        status=AlertState.PENDING, previous_due_at=old_due, attempts=0, created_at=now, updated_at=now,
        status_reason=f"deadline moved from {instant_text(old_due)} to {instant_text(new_due)} after a reminder "
                      f"was delivered{passed}",
    )


# Why a deadline moved into the past leaves a pending reminder rather than an escalated one: the
# delivery sweep escalates a reminder whose deadline passed more than DEADLINE_PASSED_GRACE before it
# could be sent ("missed: …"), with the ERROR log, the notice to the escalation channels, the
# `escalations` heartbeat and a red escalations_acknowledged that every other miss gets. Marking the
# alert escalated here would skip the notice (nobody would be told), and a state of its own would be
# one no check or watchdog row knows. Before, the old instant's reminders were superseded and, with
# none delivered, nothing else was written: the subscriber never heard of the move, and every check
# stayed green.
MOVED_INTO_PAST = "the deadline moved to an instant already past before any reminder was delivered on this channel"


def missed_row(obligation_id: int, key: str, channel: str, offset_seconds: int, old_due: datetime | None,
               new_due: datetime, now: datetime, why: str | None = None) -> dict:
    """The alert row of a reminder for ``new_due`` (aware UTC, already past at ``now``), due at once,
    that the delivery sweep escalates as missed: one per channel of an obligation moved into the past
    from ``old_due`` with no reminder delivered there (:data:`MOVED_INTO_PAST`), or, with ``old_due``
    None, of a deadline that passed while its source was not fetched (``why``: the gap,
    :data:`PASSED_UNWATCHED`). ``offset_seconds``: the latest offset the channel has (the reminder
    nearest the deadline); keyed like the reminder planning would have written for that offset and
    instant, so a re-plan never writes a second one."""
    (dedup,) = reminder_dedup_keys(key, new_due, [(offset_seconds, channel)])
    if why is None:
        why = f"deadline moved from {instant_text(old_due)} to {instant_text(new_due)}: {MOVED_INTO_PAST}"
    return dict(
        obligation_id=obligation_id, offset_seconds=offset_seconds, channel=channel, kind="reminder", revision=0,
        dedup_key=dedup, send_at=now, due_at=new_due, status=AlertState.PENDING, previous_due_at=old_due,
        attempts=0, created_at=now, updated_at=now, status_reason=f"{why}; escalated as missed by the delivery sweep",
    )


# The reason of a reminder left for the sweep to escalate because its deadline passed while the
# source was not fetched (plan.first_seen: MISSED_UNWATCHED). Before, such a rule was stored as a
# version and nothing else: no obligation, no alert, every check green. The sweep keeps the reason.
PASSED_UNWATCHED = "first seen after it had passed, while its source was not fetched"


def passed_unwatched_reason(judged: FirstSeenPassed) -> str:
    """The alert reason naming the gap: ``"first seen after ...: no successful fetch of source X
    between A and B; deadline D at T passed in that gap"``."""
    return f"{PASSED_UNWATCHED}: {judged.describe()}"


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


def _judge_sources(conn, targets: list[Target], now: datetime) -> dict[int, list[FirstSeenPassed]]:
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


def _write_missed_while_unwatched(conn, targets: list[Target], rules_cache: dict, lineage: dict, now: datetime,
                                  watched: set[tuple[int, int]], judged: dict[int, list[FirstSeenPassed]],
                                  out: PlanOutcome) -> None:
    """Write, for each deadline that passed while its source was not fetched (``judged``: source id →
    its possible misses, :func:`_judge_sources`), its obligation and one
    reminder per channel (the latest offset) that the delivery sweep escalates as missed
    (:func:`missed_row`); counted in ``out.missed_while_unwatched``, logged at ERROR. ``watched``:
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


def _new_obligation_row(ob: PlannedObligation, now: datetime) -> dict:
    """The ``obligations`` row of ``ob`` written outside the chunks' merge (an escalated miss)."""
    return dict(obligation_key=ob.key, tenant=ob.tenant, subscriber_id=ob.subscriber_id, source_id=ob.source_id,
                rule_id=ob.rule_id, rule_version=ob.rule_version, period=ob.period, title=ob.title, due_at=ob.due_at,
                status=ObligationState.ACTIVE, planned_at=now, revision=0, fingerprint=ob.fingerprint)


def _insert_missed_while_unwatched(conn, found: dict, now: datetime, out: PlanOutcome) -> None:
    """Insert the obligations and escalation reminders :func:`_write_missed_while_unwatched` found."""
    ids = sql.insert_obligations_if_new(conn, [_new_obligation_row(ob, now) for ob, _, _ in found.values()])
    rows = [missed_row(ids[key], key, ch, seconds, None, ob.due_at, now, passed_unwatched_reason(j))
            for key, (ob, j, latest) in found.items() if key in ids for ch, seconds in sorted(latest.items())]
    written = sql.insert_notices(conn, rows)
    out.obligations_inserted += len(ids)
    out.alerts_inserted += written
    out.missed_while_unwatched += written
    for key in ids:
        log.error("planning: %s: reminder(s) left to the delivery sweep, which escalates them as missed",
                  found[key][1].describe())


def _missed_rows(r, key: str, new_due: datetime, reminders: list[dict], delivered: set[str],
                 now: datetime) -> list[dict]:
    """:func:`missed_row` for each channel of stale obligation ``r`` that has reminder rows but none
    delivered (``reminders``: its reminder rows, :func:`~deadline_pipeline.store.planning.reminders_of`)."""
    latest: dict[str, int] = {}
    for a in reminders:
        if a["channel"] not in delivered:
            latest[a["channel"]] = max(latest.get(a["channel"], a["offset_seconds"]), a["offset_seconds"])
    return [missed_row(r.id, key, ch, latest[ch], r.due_at, new_due, now) for ch in sorted(latest)]


def _moved_into_past(stale, subscribed: dict, rules_cache: dict, lo: datetime) -> dict[int, tuple]:
    """obligation id → (new due instant, rule version) for the stale one-off obligations whose rule is
    still in force for a still-subscribed target but now falls before the planning window: a deadline
    moved into the past is a move (a correction saying so), not a withdrawal."""
    from deadline_pipeline.plan.planner import ONCE

    out: dict[int, tuple] = {}
    long_ago = timedelta(days=3660)
    for r in stale:
        target = subscribed.get((r.subscriber_id, r.source_id))
        if target is None or r.period != ONCE or r.source_id not in rules_cache:
            continue
        rules, _withdrawn = rules_cache[r.source_id]
        match = [(v, rule) for v, rule in rules if rule.rule_id == r.rule_id and not (rule.rrule or rule.rdates)]
        if not match:
            continue
        obs, _problems = plan_target(target, match, lo - long_ago, long_ago, before=lo)
        if len(obs) == 1 and obs[0].due_at < lo and obs[0].due_at != r.due_at:
            out[r.id] = (obs[0].due_at, obs[0].rule_version, r.obligation_key)
    return out


def _escalate_series_moved_into_past(conn, stale, subscribed: dict, rules_cache: dict, lo: datetime,
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
    known = sql.series_known_until(conn, set(withdrawn), lo)
    found = series_moved.passed_unplanned(withdrawn, known, subscribed,
                                          {sid: rules for sid, (rules, _) in rules_cache.items()}, lo, now, lineage)
    if not found:
        return
    ids = sql.insert_obligations_if_new(conn, [_new_obligation_row(ob, now) for ob, _, _ in found])
    top = {id(t): max(o.nominal_seconds for o in t.offsets) for _, _, t in found}
    rows = [missed_row(ids[ob.key], ob.key, ch, top[id(t)], old_due, ob.due_at, now)
            for ob, old_due, t in found if ob.key in ids for ch in sorted(t.channels)]
    written = sql.insert_notices(conn, rows)
    out.obligations_inserted += len(ids)
    out.alerts_inserted += written
    out.moved_into_past_missed += written
    if written:
        first = rows[0]
        log.error("planning: %d reminder(s) of %d occurrence(s) of recurring rules a revision moved into the past are "
                  "left to the delivery sweep, which escalates them as missed; first: obligation %s channel %s "
                  "moved from %s to %s", written, len(ids), first["obligation_id"], first["channel"],
                  instant_text(first["previous_due_at"]), instant_text(first["due_at"]))


def _withdraw(conn, source_ids, lo, hi, failed_rules, subscribed: dict, rules_cache: dict, now,
              out: PlanOutcome, *, filtered: set[tuple[int, int, str]] = frozenset(),
              rule_ids: dict[int, frozenset[str] | None] | None = None,
              lineage: dict[int, dict[str, str]] | None = None) -> None:
    """Withdraw obligations the plan no longer contains. When the source caused it (a withdrawn rule,
    an occurrence that moved to another date or was excluded) and the subscriber is still subscribed,
    everyone who already got a reminder gets one cancellation notice — the new date, if any, arrives
    as its own reminder. A removed subscriber or subscription, or a rule the subscription's own
    filter now leaves out (``filtered``, e.g. a new ``exclude_kinds``), is cancelled silently: a
    notice would claim the source withdrew a deadline it still publishes. A one-off
    deadline moved into the past is moved instead (open reminders superseded, one correction per
    channel where a reminder was delivered, saying the new instant has passed, and where none was,
    a reminder the delivery sweep escalates as missed: :func:`missed_row`); a recurring rule whose
    revision withdrew an occurrence ahead leaves its new occurrences already past escalated alike
    (:func:`_escalate_series_moved_into_past`). ``rule_ids`` (a scoped re-plan): source id → the only
    rule ids whose obligations this run planned, and so may withdraw (``None``: every rule of that
    source); ``lineage``: source id → rule id → the id obligations are keyed on."""
    stale = [r for r in sql.unplanned_obligations(conn, source_ids, lo, hi, rule_ids=rule_ids)
             if (r.source_id, r.rule_id) not in failed_rules]
    if not stale:
        return
    past = _moved_into_past(stale, subscribed, rules_cache, lo)
    if past:
        ids = sorted(past)
        delivered = sql.delivered_channels(conn, ids)
        reminders: dict[int, list[dict]] = {}
        for a in sql.reminders_of(conn, ids):
            reminders.setdefault(a["obligation_id"], []).append(a)
        notices, missed = [], []
        for r in stale:
            if r.id in past:
                new_due, version, key = past[r.id]
                sql.move_obligation(conn, r.id, new_due, version, now)
                notices.extend(correction_row(r.id, key, ch, r.revision + 1, r.due_at, new_due, now)
                               for ch in sorted(delivered.get(r.id, ())))
                # Only a deadline really past: `lo` may be a partition's first day, and a move to an
                # earlier month still ahead gets its reminders when that month is planned.
                if new_due < now - GRACE:
                    missed.extend(_missed_rows(r, key, new_due, reminders.get(r.id, []),
                                               delivered.get(r.id, set()), now))
        out.alerts_superseded += sql.supersede_other_instants(conn, ids, now)
        out.corrections += sql.insert_notices(conn, notices)
        written = sql.insert_notices(conn, missed)
        if written:
            out.moved_into_past_missed += written
            first = missed[0]
            log.error("planning: %d reminder(s) of %d deadline(s) moved into the past before any reminder was "
                      "delivered on their channel are left to the delivery sweep, which escalates them as missed; "
                      "first: obligation %s channel %s moved from %s to %s", written,
                      len({m["obligation_id"] for m in missed}), first["obligation_id"], first["channel"],
                      instant_text(first["previous_due_at"]), instant_text(first["due_at"]))
        out.obligations_moved += len(ids)
        stale = [r for r in stale if r.id not in past]
        if not stale:
            return
    _escalate_series_moved_into_past(conn, stale, subscribed, rules_cache, lo, now, lineage or {}, out)
    by_rule = [r for r in stale if (r.subscriber_id, r.source_id) in subscribed
               and (r.subscriber_id, r.source_id, r.rule_id) not in filtered]
    delivered = sql.delivered_channels(conn, [r.id for r in by_rule])
    out.obligations_withdrawn = len(stale)
    out.alerts_cancelled += sql.withdraw_obligations(
        conn, [r.id for r in stale], "the rule, subscription or subscriber no longer asks for this obligation", now)
    notices = []
    for r in by_rule:
        for channel in sorted(delivered.get(r.id, ())):
            notices.append(dict(
                obligation_id=r.id, offset_seconds=0, channel=channel, kind="cancellation", revision=r.revision,
                due_at=r.due_at,
                dedup_key=alert_dedup_key(r.obligation_key, 0, channel, "cancellation", r.revision), send_at=now,
                status=AlertState.PENDING, attempts=0, created_at=now, updated_at=now,
                status_reason="the source withdrew or moved this occurrence after a reminder was delivered",
            ))
    out.cancellation_notices += sql.insert_notices(conn, notices)


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
        return sql.max_rule_version_id(conn)


def affected_partitions(engine: Engine, cfg: DeadlinesConfig, since_version_id: int, now: datetime,
                        until_version_id: int | None = None) -> list[str]:
    """Due months (partition keys ``YYYY-MM-01``, sorted) whose obligations the rule versions with
    ``since_version_id < id <= until_version_id`` (no upper bound when None) can change: the months of
    the rules' current obligations (old instants) and of their new occurrences in every subscriber
    zone (new instants) after business-day rolling, inside the planning window around ``now`` (aware
    UTC). A rule whose occurrences cannot be expanded is logged and widens nothing (planning reports
    it)."""
    from deadline_pipeline.plan.occurrences import expand
    from deadline_pipeline.rules import RuleRecord
    from deadline_pipeline.timezones import resolve_zone

    lo, hi = window(now, timedelta(days=cfg.plan.horizon_days))
    months: set[str] = set()
    with engine.connect() as conn:
        changed = sql.rule_versions_between(conn, since_version_id, until_version_id)
        if not changed:
            return []
        # New instants are rolled exactly as planning rolls them: a Saturday 31 October due date
        # rolled to Monday 2 November belongs to November's partition, not October's.
        calendars = business_calendars(conn, cfg, PlanOutcome())
        name_of = {s.id: s.name for s in all_sources(conn)}
        zones = {s.timezone for s in cfg.subscribers} | {s.timezone for s in cfg.sources if s.timezone}
        pairs = {(source_id, rule_id) for source_id, rule_id, _, _ in changed}
        # One query for the old instants: only obligations of the changed rules' sources are read.
        for source_id, rule_id, due in sql.obligation_dues(conn, {p[0] for p in pairs}, lo, hi):
            if (source_id, rule_id) in pairs:
                months.add(f"{due:%Y-%m}-01")
        new_rules = [(source_id, RuleRecord.from_payload(payload))
                     for source_id, _, withdrawn, payload in changed if not withdrawn]
        # A changed or withdrawn RECURRENCE-ID override changes its master's occurrences (a cancelled
        # one taken back restores one; its own version had no obligation, so no month): the master's
        # current occurrences count too.
        masters = {(source_id, series_of(rule_id)) for source_id, rule_id, _, _ in changed
                   if series_of(rule_id) != rule_id}
        for source_id in sorted({s for s, _ in masters}):
            new_rules += [(source_id, r) for _, r in sql.active_rules(conn, source_id)[0]
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
