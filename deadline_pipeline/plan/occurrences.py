"""Expanding a rule into concrete due instants (pure; no I/O).

The RECUR value is read by :mod:`deadline_pipeline.plan.recurrence` (one parser, strict or lenient)
and expanded with python-dateutil. Every instant returned is an aware UTC ``datetime``.

DST policy (documented because each alternative is a silent miss somewhere; shared cases C09, C10,
C16, C17, C18):

* DAILY and coarser frequencies expand in the rule's *local wall-clock time* and convert each
  occurrence to UTC only at the end, so "15 April 17:00" stays 17:00 local across DST, and a daily
  reminder fires exactly once per local day across both transitions (never 24 h after the last one).
* A local time inside a spring-forward gap is shifted forward by the gap's length (RFC 5545 §3.3.5
  for DATE-TIME values that do not exist: 02:30 on a 02:00→03:00 night becomes 03:30); the day still
  counts towards COUNT. A local time repeated by a fall-back takes its *first* occurrence. A gap
  occurrence keeps its nominal local start (02:30) as its label, and an EXDATE or RECURRENCE-ID names
  it by instant, as written in any zone (07:30Z, or 03:30, which the parser reads it as):
  :func:`_exclusions` excludes both wall times of a gap's instant
  (:func:`~deadline_pipeline.plan.recurrence.gap_alias`), and
  :func:`~deadline_pipeline.plan.recurrence.occurrence_named` gives an override the series' label.
* A shifted time can land on the instant of another occurrence of the same rule: Samoa skipped
  2011-12-30 (UTC-10 → UTC+14), so a daily 09:00 there yields the nonexistent 2011-12-30 09:00,
  read with the offset before the gap as 2011-12-30T19:00Z — the instant of 2011-12-31 09:00. An
  instant is planned once per rule (RFC 5545 §3.8.5.3: "Duplicate instances are ignored"): the
  occurrence whose local time exists keeps it, the nonexistent one is dropped
  (:func:`once_per_instant`), and the drop is reported — WARNING naming the rule and both local
  times (once per rule, zone and local time per process), ``Expansion.counts["instants_collapsed"]``
  every time, and ``Expansion.collapsed``. Both still count towards COUNT, so ``COUNT=5`` over the skipped
  day gives four instants. A business-day roll is not such a case: occurrences rolled onto one day
  stay separate occurrences (each keeps its own period), so the comparison is made before the roll.
* HOURLY, MINUTELY and SECONDLY rules without BYxxx parts step in *elapsed* time: they expand in UTC
  from the DTSTART instant, so the repeated hour of a fall-back is not skipped and the gap hour is
  not doubled. With BYxxx parts (BYHOUR=9,17…) those parts name wall-clock values, so such a rule
  expands in wall-clock time like the daily ones, and 02:30 shifted onto an occurrence at 03:30 is
  dropped as above.

Floating rules (``tz`` is ``None``) are expanded in the ``zone`` the caller passes: the source's
declared zone (ICS ``X-WR-TIMEZONE``) or else the subscriber's (see the planner) — never UTC.

Windows, horizon and truncation: callers pass ``[after, before]``; the planner's window is
``[now - GRACE, now + HORIZON]`` (:func:`window`), so the past is never replayed: the first
occurrence planned is the first at or after ``now - 15 min``. A series that continues past
``before`` is normal for deadlines (a yearly tax date has no end) and is logged at DEBUG only. It is
logged at ERROR with the rule id, once per rule and process, and counted in
``Expansion.counts["horizon_truncations"]`` every time, when the series is *suspicious*:

* it is unbounded (no COUNT, no UNTIL) at a sub-daily frequency, or
* at the rate seen in the window it would fire more than :data:`SANE_OCCURRENCES` times in a
  366-day horizon (about four reminders a day, every day).

Independently, an expansion stops at :data:`MAX_OCCURRENCES` (ERROR,
``Expansion.counts["occurrence_cap"]``) when the window holds more: :func:`expansion` says where
(``Expansion.cut_at``), the planner plans what was expanded and reports the rest as a planning
problem (:func:`cap_problem`), and ``validate`` refuses such a rule (:func:`budget_problem`). A
window holding exactly the cap is not cut.

Cost is bounded by the window, not by the rule's age: a sub-daily rule does not step from a DTSTART
years back. A plain sub-daily rule (elapsed time) jumps to the window in whole INTERVALs and lowers
its COUNT by the intervals jumped (computed, not stepped); a sub-daily rule with BYxxx parts and no
COUNT jumps in whole multiples of both its interval and a day, so its wall-clock filters still
match. Every expansion then has a work budget of :data:`MAX_STEPS` series items examined (those
before the window included): a rule that needs more raises :class:`ExpansionBudgetExceeded` — the
rule is skipped loudly (ERROR log, ``ExpansionBudgetExceeded.counts``, a planning problem) and the
other rules plan. :func:`budget_problem` tells ``validate`` about such rules before they go live.

RFC 5545 readings (§3.8.5.3, §3.8.5.2):

* DTSTART is always the first instance, even when it does not match its own RRULE (a Thursday
  DTSTART with ``BYDAY=WE``), and it **counts toward COUNT**: ``COUNT=3`` gives DTSTART and the
  first two matching dates. (Some expanders, ``recurring-ical-events`` among them, add DTSTART on top
  of COUNT matches; that difference is listed in the differential test's justified differences.)
* RDATEs are instances whatever the RRULE's bounds: an RDATE after UNTIL is kept.
"""

from __future__ import annotations

import logging
import math
import re
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from itertools import islice

from dateutil.rrule import rruleset

from deadline_pipeline.instants import instant_text
from deadline_pipeline.plan import business_days as bd
from deadline_pipeline.plan.gaps import Collapsed, gap_wall, once_per_instant, zone_gaps
from deadline_pipeline.plan.offsets import Offset, send_instant
from deadline_pipeline.plan.recurrence import (
    DUE_OFFSET,
    DUE_SPAN,
    SHIFT_SECONDS,
    SPLIT_BEFORE,
    SPLIT_FROM,
    Lenient,
    Recur,
    RRuleError,
    due_offset,
    gap_alias,
    parse_rrule,
    shifted_label,
    to_instant,
    until_bound,
    validate_rrule,
)
from deadline_pipeline.plan.rfc_series import series
from deadline_pipeline.rules import RULE_YEARS, RuleRecord, dates_problem, format_local, parse_local

log = logging.getLogger(__name__)

GRACE = timedelta(minutes=15)
HORIZON = timedelta(days=366)
#: Hard stop for one expansion: a rule yielding more is a data bug (FREQ=SECONDLY…), not a schedule.
MAX_OCCURRENCES = 5000
#: Work budget of one expansion: series items examined, the ones before the window included.
MAX_STEPS = 200_000
#: Occurrences per 366-day horizon above which a truncated series is logged at ERROR (≈ 4 a day).
SANE_OCCURRENCES = 1500
# How far a business-day convention may move a date; the expansion window is widened by it so an
# occurrence rolled into the window (or out of it) is judged by its adjusted instant.
_ROLL_SLACK = timedelta(days=bd.MAX_ROLL_DAYS + 1)
_DAY = timedelta(days=1)

# dateutil warns (DeprecationWarning) when COUNT and UNTIL are both given. The rule text never has
# both (validate_rrule refuses it); the expansion adds an internal UNTIL at the window's end next to a
# rule's COUNT only so that a rule which never matches (BYMONTH=2;BYMONTHDAY=30) stops at the window
# instead of scanning to year 9999 — seconds of CPU per planning pass.
warnings.filterwarnings("ignore", message=".*count.*until.*", category=DeprecationWarning,
                        module=r"dateutil\.rrule")

_TRUNCATION_LOGGED: set[tuple[str, str]] = set()
_COLLAPSE_LOGGED: set[tuple[str, str, str]] = set()


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One occurrence: ``period`` is its identity (the original local start, ISO, before any
    business-day adjustment or THISANDFUTURE shift; an elapsed-time sub-daily series uses the UTC
    instant ``…Z``, because a local label repeats in a fall-back hour); ``due_at`` the aware UTC
    instant it is due; ``wall`` the nominal local wall time (naive, in the expansion's zone) it is due at
    when a spring-forward gap skips that time (02:30 on a 02:00→03:00 night, due at the instant of
    03:30), else None: the instant's own wall time is its nominal one. A calendar-day reminder offset
    counts from the nominal time (:func:`~deadline_pipeline.plan.offsets.send_instant`): from 03:30,
    ``-P1D`` was 03:30 the day before, an hour after the 02:30 intended."""

    period: str
    due_at: datetime
    wall: datetime | None = field(default=None, compare=False)


def normalise_until(rrule_text: str, zone: tzinfo) -> str:
    """Rewrite UNTIL into the local wall-clock form dateutil accepts next to a naive DTSTART.

    Kept for callers of the first version; :func:`deadline_pipeline.plan.recurrence.until_bound`
    holds the rules (``…Z`` → converted to ``zone``; floating → read in ``zone``; DATE → end of that
    day in ``zone``, inclusive). Raises ``RRuleError`` for a malformed UNTIL.
    """

    def repl(m: re.Match) -> str:
        local, _instant = until_bound(m.group(1), zone, all_day=False)
        return "UNTIL=" + local.strftime("%Y%m%dT%H%M%S")

    return re.sub(r"UNTIL=([0-9TZtz]+)", repl, rrule_text)


class ExpansionBudgetExceeded(ValueError):
    """An expansion needed more than :data:`MAX_STEPS` series items; the message names the rule.

    Raised instead of an :class:`Expansion`, so it carries the count one would have held."""

    @property
    def counts(self) -> Counter[str]:
        """``{"expansion_budget": 1}``: the rule skipped over the work budget."""
        return Counter({"expansion_budget": 1})


@dataclass(frozen=True, slots=True)
class Expansion:
    """What :func:`expansion` returns: ``occurrences`` as :func:`expand` returns them, and ``cut_at``,
    the due instant (aware UTC) of the first occurrence left out because the window held more than
    :data:`MAX_OCCURRENCES` — None when nothing was left out (a ``limit`` reached is not a cut).
    ``collapsed``: the occurrences left out because a nonexistent local time shared its instant with
    an existing one (:func:`once_per_instant`) and that instant lies in the window, in series order;
    empty when none was. ``counts``: what this expansion reported, for a check or a caller to add
    up — ``occurrence_cap`` (1 when cut), ``horizon_truncations`` (1 for a suspicious series cut at
    the window's end), ``instants_collapsed`` (``len(collapsed)``) and ``rrule_rejected`` (1 for a
    rule the lenient parser refused); a key absent reads 0."""

    occurrences: list[Occurrence]
    cut_at: datetime | None = None
    collapsed: tuple[Collapsed, ...] = ()
    counts: Counter[str] = field(default_factory=Counter)


def _report_collapsed(rule: RuleRecord, zone: tzinfo, collapsed: list[Collapsed], after: datetime,
                      before: datetime) -> tuple[Collapsed, ...]:
    """The occurrences :func:`once_per_instant` left out whose instant lies in ``[after, before]``
    (aware), logged (WARNING, once per rule, zone and dropped local time per process); the caller
    counts them (``Expansion.counts["instants_collapsed"]``, every time). The series is read from its start, so a drop
    years before the window is not this window's news; and planning runs every few minutes, so the
    same line on every pass would bury the first."""
    inside = tuple(c for c in collapsed if after <= c.instant <= before)
    for c in inside:
        key = (rule.rule_id, str(zone), c.dropped.isoformat())
        if key in _COLLAPSE_LOGGED:
            continue
        if len(_COLLAPSE_LOGGED) < 10_000:  # bounded: a hostile feed must not grow memory without end
            _COLLAPSE_LOGGED.add(key)
        log.warning("rule %s: RRULE %r: the occurrence at local %s is dropped: that time does not exist in %s, "
                    "and read with the offset before the gap it is %s, the instant of the occurrence at local %s, "
                    "which keeps it (one instant, planned once: RFC 5545 §3.3.5, §3.8.5.3)",
                    rule.rule_id, rule.rrule, c.dropped.isoformat(), zone, c.instant.isoformat(),
                    c.kept.isoformat())
    return inside


def cap_problem(cut_at: datetime, before: datetime) -> str:
    """The words for an expansion cut at :data:`MAX_OCCURRENCES`: where it stopped (``cut_at``, the
    first occurrence left out) and the window's end ``before`` (aware datetimes), and what to do."""
    cut, end = instant_text(cut_at), instant_text(before)
    return (f"more than {MAX_OCCURRENCES} occurrences (the expansion cap) before the window's end {end}; "
            f"expansion stopped at {cut}, so reminders for occurrences due from {cut} on are not planned: "
            "the rule recurs too often for the horizon (bound it with UNTIL or COUNT, or use a coarser FREQ "
            "or a larger INTERVAL)")


_UNIT_SECONDS = {"HOURLY": 3600, "MINUTELY": 60, "SECONDLY": 1}


def _jump(dtstart: datetime, lo: datetime, step_seconds: int, count: int | None) -> tuple[datetime, int | None]:
    """Move ``dtstart`` forward to the last whole ``step_seconds`` at or before ``lo``; COUNT lowered to match.

    Returns ``(new start, remaining count)``; a remaining count of 0 means the series ended before
    the window. Naive datetimes in one frame (UTC for elapsed stepping, wall clock otherwise).
    """
    if lo <= dtstart:
        return dtstart, count
    steps = int((lo - dtstart).total_seconds()) // step_seconds
    if count is not None:
        steps = min(steps, count)
        count -= steps
    return dtstart + timedelta(seconds=steps * step_seconds), count


def budget_problem(rule: RuleRecord, zone: tzinfo, *, now: datetime, horizon: timedelta = HORIZON) -> str | None:
    """The reason planning would not plan all of ``rule`` in the window from ``now``, else None: the
    rule is skipped over the work budget (the message names the rule), or its expansion is cut at
    :data:`MAX_OCCURRENCES` (:func:`cap_problem`).

    For ``validate``: the same expansion planning runs, so a problem here is a planning problem
    there. Other errors (an unreadable RRULE) are reported by the parser and are not repeated here.
    """
    lo, hi = window(now, horizon)
    try:
        cut_at = expansion(rule, zone, after=lo, before=hi, strict=False).cut_at
    except ExpansionBudgetExceeded as exc:
        return str(exc)
    except ValueError:
        return None
    return None if cut_at is None else cap_problem(cut_at, hi)


def over_budget(rules, default_tz: str | None, *, now: datetime | None = None) -> list[tuple[str, str]]:
    """``(rule_id, message)`` for each recurring rule that :func:`budget_problem` flags from ``now``.

    ``default_tz`` is the zone of floating rules (else UTC, only to measure the cost); ``now``
    defaults to the current time (aware UTC). Rules with an unknown zone are left to the parser.
    """
    from deadline_pipeline.timezones import UnknownTimeZone, resolve_zone

    now = now or datetime.now(UTC)
    out = []
    for rule in rules:
        if not rule.rrule:
            continue
        try:
            zone = resolve_zone(rule.tz or default_tz or "UTC")
        except UnknownTimeZone:
            continue
        message = budget_problem(rule, zone, now=now)
        if message:
            out.append((rule.rule_id, message))
    return out


#: How far :func:`has_occurrence` looks for an occurrence at or after a label.
_LATER_SPAN = timedelta(days=366 * 100)


@dataclass(frozen=True, slots=True)
class _Span:
    """What an occurrence label matches: the instant ``lo`` (``timed``), or any due instant in
    ``[lo, hi]``, the local ``day``."""

    timed: bool
    lo: datetime
    hi: datetime
    day: date


def _span(rule: RuleRecord, zone: tzinfo, label: str) -> _Span:
    timed = "T" in label and not rule.all_day
    day = parse_local(label).date() if "T" in label else date.fromisoformat(label)
    if timed:
        instant = to_instant(parse_local(label), zone)
        return _Span(True, instant, instant, day)
    following = to_instant(datetime.combine(day + _DAY, time.min), zone)
    return _Span(False, to_instant(datetime.combine(day, time.min), zone), following - timedelta(microseconds=1), day)


def _due_label(rule: RuleRecord, zone: tzinfo, label: str) -> str:
    """The label of the due time of the occurrence whose start ``label`` names, for a to-do due a span
    after each start (its due instant as :func:`_due_after_start` computes it, :func:`due_span`, read
    back as a wall time in ``zone``); ``label`` itself for any other rule."""
    offset = due_offset(rule)
    if not offset or "T" not in label or label.endswith("Z") or rule.all_day:
        return shifted_label(label, offset)
    start, span = parse_local(label), due_span(rule)
    if span is None:  # a DUE: the wall-clock span from the nominal start (the label), as planned
        return format_local(start + timedelta(seconds=offset))
    due = send_instant(to_instant(start, zone), span, zone, gap_wall(start, zone))
    return format_local(due.astimezone(zone).replace(tzinfo=None))


def due_span(rule: RuleRecord) -> Offset | None:
    """The DURATION a recurring to-do (:data:`~deadline_pipeline.plan.recurrence.DUE_OFFSET`) is due
    after each instance's start (:data:`~deadline_pipeline.plan.recurrence.DUE_SPAN`, ISO 8601): its
    nominal days and exact hours, RFC 5545 §3.3.6 (``PT2H`` from a start read in a spring-forward gap,
    02:30 New York = 07:30Z, is due 09:30Z). ``None`` for a to-do with a DUE (or a rule version stored
    before the parser kept the DURATION: read as its DUE), due at its start's nominal wall time moved by
    the wall-clock DUE − DTSTART (:func:`_due_of`).

    Why the wall clock for a DUE, where §3.8.5.3 says "the same exact duration": read exactly, a weekly
    to-do from Saturday 17:00 due Sunday 17:00 would be due at 18:00 on the Sunday New York springs
    forward, an hour after the time its publisher wrote and every calendar shows, and its reminders an
    hour late; recurring-ical-events keeps the wall clock too. Counted from the nominal start (02:30,
    not the 03:30 after the gap), the first instance is due at its DUE as written: counted from 03:30,
    04:30 New York on 2027-03-14 was due at 05:30, an hour after it. Raises ``ValueError`` for a stored
    span that is not a duration."""
    written = rule.extra.get(DUE_SPAN)
    return Offset.parse(str(written)) if written else None


def has_occurrence(rule: RuleRecord, zone: tzinfo, label: str, *, or_later: bool = False) -> bool:
    """Whether the expansion of ``rule`` in ``zone`` has the occurrence ``label`` names: a local ISO
    date-time (the occurrence due at that instant), or a date (any occurrence on that local date, as
    a DATE EXDATE matches; an all-day rule's occurrences are compared by date too). With
    ``or_later``, whether it has any occurrence from there on (a ``RANGE=THISANDFUTURE`` override
    applies to all of them).

    For RECURRENCE-ID overrides (RFC 5545 §3.8.4.4), which name an occurrence of their series: the
    series' EXDATEs, RDATEs, UNTIL and COUNT all count, as in planning (no business-day shift).
    Raises as :func:`expand` does: ``ValueError`` (:class:`ExpansionBudgetExceeded` included) for a
    rule that cannot be expanded.
    """
    span = _span(rule, zone, _due_label(rule, zone, label))
    end = span.lo + _LATER_SPAN if or_later else span.hi
    # limit=1: the window holds nothing but matches, so one is enough, and a dense rule is never cut.
    return bool(expand(rule, zone, after=span.lo, before=end, limit=1))


def present_labels(rule: RuleRecord, zone: tzinfo, labels: list[str]) -> set[str]:
    """The ``labels`` (as for :func:`has_occurrence`) that name an occurrence of ``rule`` in ``zone``.

    One expansion over the span of all of them, not one per label: a series with a thousand
    overrides was expanded from its DTSTART a thousand times (15 s for a daily series of ten years).
    Labels past :data:`MAX_OCCURRENCES` occurrences are checked one by one. Raises as :func:`expand`.
    """
    spans = {label: _span(rule, zone, _due_label(rule, zone, label)) for label in labels}
    if not spans:
        return set()
    # A limit, not the cap: this span is no planning window, so a dense or endless series must neither
    # be logged as truncated nor counted as cut (checks read both counts).
    found = expand(rule, zone, after=min(s.lo for s in spans.values()), before=max(s.hi for s in spans.values()),
                   limit=MAX_OCCURRENCES)
    last = found[-1].due_at if len(found) == MAX_OCCURRENCES else None
    instants = {o.due_at for o in found}
    days = {o.due_at.astimezone(zone).date() for o in found}
    present = set()
    for label, span in spans.items():
        if last is not None and span.hi >= last:
            hit = has_occurrence(rule, zone, label)
        else:
            hit = span.lo in instants if span.timed else span.day in days
        if hit:
            present.add(label)
    return present


def occurs_between(payload: dict, after: datetime, before: datetime) -> bool:
    """Whether the stored rule ``payload`` (``RuleRecord.to_payload``) has an instant in
    ``[after, before]`` (aware datetimes), read with the bounded expansion: the rule's zone, or UTC
    for a floating rule (callers pass bounds with a day of slack for that), no business-day shift.

    For the watchers and the quarantine, which must not hang on a rule planning refuses (an
    unbounded ``rrulestr(...).after()`` on ``FREQ=SECONDLY`` from an old DTSTART stepped through
    every second). Raises :class:`ExpansionBudgetExceeded` for a rule over the work budget, and
    ``ValueError`` (``RRuleError``, ``UnknownTimeZone``…) or ``KeyError``/``TypeError`` for an
    unreadable payload; the caller decides what such a rule counts as.
    """
    return first_between(payload, after, before) is not None


def first_between(payload: dict, after: datetime, before: datetime) -> datetime | None:
    """The first instant (aware UTC) of the stored rule ``payload`` in ``[after, before]``, or None;
    read as :func:`occurs_between` reads it, raising what it raises."""
    from deadline_pipeline.timezones import resolve_zone

    if (payload.get("extra") or {}).get("cancelled"):
        return None  # a cancelled or completed occurrence (a closed override) is never planned
    # Only the timing fields matter here; a payload stored without a title or zone is still readable.
    rule = RuleRecord.from_payload({"title": "", "tz": None, "rule_id": "?", **payload})
    zone = resolve_zone(rule.tz or "UTC")
    found = expand(rule, zone, after=after, before=before, limit=1, strict=True)
    return found[0].due_at if found else None


BusinessDays = tuple  # (calendar spec | HolidayCalendar | iterable of dates, convention)


def _business(spec: BusinessDays | None):
    if spec is None:
        return None
    cal_spec, convention = spec
    name = bd.check_convention(convention)
    if name == "none":
        return None
    return bd.calendar(cal_spec), name


def expand(rule: RuleRecord, zone: tzinfo, *, after: datetime, before: datetime, until: datetime | None = None,
           business_days: BusinessDays | None = None, limit: int | None = None,
           strict: bool = True) -> list[Occurrence]:
    """Occurrences of ``rule`` whose due instant lies in ``[after, before]``, sorted by instant.

    ``zone``: the resolved zone of the rule (for a floating rule, the zone the caller chose).
    ``after``/``before``: aware datetimes (any zone; compared as instants). Returns
    :class:`Occurrence` values with aware UTC ``due_at``, one per instant before any business-day
    roll (a gap that maps two onto one keeps the one whose local time exists; see the module's DST
    policy). A one-off rule yields at most one.
    All-day starts expand by date and are due at the end of the local day (23:59:59).

    Keyword options:

    * ``until``: the caller's end date (aware), a *fallback* only: it bounds a rule that has neither
      UNTIL nor COUNT; a rule's own bound is authoritative and is never replaced or doubled.
    * ``business_days``: ``(calendar, convention)`` — a calendar spec (``"US-IRS"``, ``"GB-ENG"``), a
      :class:`~deadline_pipeline.plan.business_days.HolidayCalendar` or a set of dates, and one of
      ``none``/``following``/``modified-following``/``preceding``. Each occurrence's local *date*
      is adjusted, its local time of day kept; ``period`` stays the unadjusted one, and the window
      applies to the adjusted instant.
    * ``limit``: stop after this many occurrences (in series order).
    * ``strict``: True (default) raises; False logs and counts an unreadable RRULE
      (``recurrence.parse_rrule``) and returns ``[]``.

    Raises :class:`~deadline_pipeline.plan.recurrence.RRuleError` (a ``ValueError``) naming the rule
    and the offending rule part; ``ValueError`` for an unreadable start/EXDATE/RDATE, an unknown
    business-day convention, or ``UnknownCalendar`` for an unknown holiday calendar.
    """
    return expansion(rule, zone, after=after, before=before, until=until, business_days=business_days,
                     limit=limit, strict=strict).occurrences


def expansion(rule: RuleRecord, zone: tzinfo, *, after: datetime, before: datetime, until: datetime | None = None,
              business_days: BusinessDays | None = None, limit: int | None = None,
              strict: bool = True) -> Expansion:
    """:func:`expand`, and whether the window held more than :data:`MAX_OCCURRENCES`: where the
    expansion was cut, and which occurrences were left out because a gap put them on the instant of
    another (:class:`Expansion`). Same arguments and errors as :func:`expand`; also
    ``ValueError`` naming the rule for a date outside :data:`~deadline_pipeline.rules.RULE_YEARS`.

    Checked here as well as at ingest: a rule stored before the check, or given on the command
    line, must be one planning problem, never an ``OverflowError`` that ended the planning run (it
    is not a ``ValueError``, so the planner's per-rule guard let it through)."""
    problem = dates_problem(rule)
    if problem:
        raise ValueError(f"rule {rule.rule_id!r}: {problem}")
    try:
        if due_offset(rule):
            return _due_after_start(rule, zone, after=after, before=before, until=until,
                                    business_days=business_days, limit=limit, strict=strict)
        return _expansion(rule, zone, after=after, before=before, until=until, business_days=business_days,
                          limit=limit, strict=strict)
    except OverflowError:
        low, high = RULE_YEARS
        raise ValueError(f"rule {rule.rule_id!r}: an instant computed from it is outside Python's calendar; "
                         f"its dates must lie in the supported range (years {low} to {high})") from None


def _due_after_start(rule: RuleRecord, zone: tzinfo, *, after: datetime, before: datetime, until: datetime | None,
                     business_days: BusinessDays | None, limit: int | None, strict: bool) -> Expansion:
    """:func:`expansion` of a recurring to-do due a fixed span after each instance's DTSTART
    (:data:`~deadline_pipeline.plan.recurrence.DUE_OFFSET`; its record starts at the first due time).

    RFC 5545 §3.8.5.3: the recurrence set is generated from DTSTART (the RRULE with its UNTIL and BYxxx
    parts, RDATE and EXDATE all name starts), and a span given by DUE or DURATION applies to every
    instance. Stepped from the due time instead, an instance starting at UNTIL was cut (its due time
    is after it), ``BYDAY=MO`` made Monday the due day of a task due on Fridays, and an EXDATE naming a
    start excluded nothing. Each instance is due :func:`due_span` after its start (:func:`_due_of`),
    labelled by its start's label moved by the wall-clock DUE − DTSTART (the identity its obligations
    always had), and rolled to a business day after the move."""
    offset = due_offset(rule)
    starts = replace(rule, start=shifted_label(rule.start, -offset),
                     extra={k: v for k, v in rule.extra.items() if k not in (DUE_OFFSET, DUE_SPAN)})
    span, slack = timedelta(seconds=offset), _DAY  # slack: wall-clock vs elapsed time across a DST change
    inner = _expansion(starts, zone, after=after - span - slack, before=before - span + slack, until=until,
                       business_days=None, limit=None, strict=strict)
    business = _business(business_days)
    duration = due_span(rule)
    out: list[Occurrence] = []
    for o in inner.occurrences:
        period = shifted_label(o.period, offset)
        # From the start's instant, not its label: a THISANDFUTURE piece's starts are shifted
        # (SHIFT_SECONDS) while their labels stay the original ones.
        if period.endswith("Z"):  # an elapsed-time series: stepped in elapsed time
            step = span if duration is None else timedelta(days=duration.days, seconds=duration.seconds)
            due, wall = o.due_at + step, None
        else:
            due, wall = _due_of(o, duration or span, zone, business)
        if after <= due <= before:
            out.append(Occurrence(period, due, wall))
    out.sort(key=lambda o: o.due_at)
    return Expansion(out if limit is None else out[:max(limit, 0)], inner.cut_at, inner.collapsed, inner.counts)


def _due_of(start: Occurrence, span: Offset | timedelta, zone: tzinfo, business) -> tuple[datetime, datetime | None]:
    """The due instant (aware UTC) of the to-do instance ``start`` (its start occurrence) ``span`` later,
    rolled to a business day if ``business`` says so, and its nominal wall time when a spring-forward gap
    skips it (:class:`Occurrence`). Counted from the start's nominal wall time (``start.wall``: 02:30,
    not the 03:30 its instant shows). ``span``: a DURATION (:func:`due_span`: its days nominal, its hours
    elapsed, :func:`~deadline_pipeline.plan.offsets.send_instant`, RFC 5545 §3.3.6), or a DUE's
    wall-clock DUE − DTSTART (a ``timedelta``, added to the wall time)."""
    nominal = start.wall or start.due_at.astimezone(zone).replace(tzinfo=None)
    if isinstance(span, timedelta):
        local = nominal + span
        due = to_instant(local, zone)
    else:
        due = send_instant(start.due_at, span, zone, start.wall)
        local = due.astimezone(zone).replace(tzinfo=None) if span.seconds else nominal + timedelta(days=span.days)
    if business is not None:
        local = _rolled(local, business)
        due = to_instant(local, zone)
    return due, gap_wall(local, zone)


def _expansion(rule: RuleRecord, zone: tzinfo, *, after: datetime, before: datetime, until: datetime | None,
               business_days: BusinessDays | None, limit: int | None, strict: bool) -> Expansion:
    """:func:`expansion` once the rule's dates are known to be in range: reads the rule
    (:func:`_read_recur`, :func:`_bounds`), picks the frame it steps in (:func:`_frame`), builds the
    series (:func:`_start_and_count`, :func:`_engine`), walks it through the window (:class:`_Walk`)
    and reports what was cut, truncated or collapsed (in ``Expansion.counts``)."""
    start = rule.start_local()
    business = _business(business_days)
    if not rule.rrule and not rule.rdates:
        return _one_off(rule, start, zone, after, before, business)
    parsed = _read_recur(rule, strict)
    recur = parsed.recur
    if rule.rrule and recur is None:
        return Expansion([], counts=parsed.counts)
    bounds = _bounds(rule, recur, zone, until)
    frame = _frame(start, zone, recur, bounds, after, before, business)
    start_instance, series_start, count = _start_and_count(recur, frame, after, bounds, business)
    ex_days, ex_moments = _exclusions(bounds.exdates, rule.all_day, frame)
    rdate_moments = _rdate_moments(bounds.rdates, rule.all_day, start.time(), frame)
    if start_instance is not None:
        rdate_moments.append(start_instance)
    engine = _engine(rule, recur, frame, series_start, count, rdate_moments, ex_moments)
    # A gap can map two local occurrences onto one instant (a skipped day; 02:30 onto 03:30): keep the
    # one whose local time exists, before the window and any business-day roll are applied.
    collapsed: list[Collapsed] = []
    engine = once_per_instant(engine, frame.wall_zone, collapsed, shift=frame.wall_shift, earliest=frame.lo)
    if limit is not None and limit <= 0:
        return Expansion([])
    # RDATEs and DTSTART are instances whatever the RRULE's UNTIL (§3.8.5.2, §3.8.5.3).
    walk = _Walk(rule, zone, after, before, frame, bounds, ex_days, frozenset(rdate_moments), business, limit)
    out, cut_at = walk.run(engine)
    counts: Counter[str] = Counter()
    if cut_at is not None:
        counts["occurrence_cap"] += 1
        log.error("rule %s: more than %d occurrences in [%s, %s]; expansion stopped at %s", rule.rule_id,
                  MAX_OCCURRENCES, instant_text(after), instant_text(before), instant_text(cut_at))
    elif recur is not None and limit is None:
        if _check_truncation(rule, recur, out, after, before, bounds.until_instant, series_start, count, frame.hi):
            counts["horizon_truncations"] += 1
    inside = _report_collapsed(rule, zone, collapsed, after, before)
    if inside:
        counts["instants_collapsed"] += len(inside)
    return Expansion(out, cut_at, inside, counts)


def _one_off(rule: RuleRecord, start: datetime, zone: tzinfo, after: datetime, before: datetime,
             business) -> Expansion:
    """The expansion of a rule without RRULE and RDATE: its DTSTART (``start``, naive local in
    ``zone``), rolled to a business day if ``business`` says so, when due in ``[after, before]`` and no
    EXDATE names it (:func:`_excluded`)."""
    if _excluded(rule, start, zone):
        return Expansion([])
    wall = _rolled(start, business) if business is not None else start
    due = to_instant(wall, zone)
    return Expansion([Occurrence(rule.start, due, gap_wall(wall, zone))] if after <= due <= before else [])


def _excluded(rule: RuleRecord, start: datetime, zone: tzinfo) -> bool:
    """Whether an EXDATE of the one-off ``rule`` names its DTSTART ``start`` (naive local in ``zone``),
    as one names an instance of a series (:func:`_exclusions`): the same DATE-TIME or its gap twin
    (§3.3.5), or a DATE on its local date.

    RFC 5545 §3.8.5.1 and §3.8.4.4: the set of a component without RRULE is its DTSTART, and an override
    with that RECURRENCE-ID replaces it (``recurrence.apply_overrides`` turns it into this EXDATE). Read
    without its EXDATEs, a one-off was planned at its original date next to its override's: two
    obligations for one deadline, and one left when the override cancelled it."""
    for text in rule.exdates:
        x = _local_value(text)
        if isinstance(x, datetime) and not rule.all_day:
            hit = x == start or gap_alias(x, zone) == start
        else:
            hit = (x.date() if isinstance(x, datetime) else x) == start.date()
        if hit:
            log.info("rule %s: its one occurrence %s is excluded by an EXDATE or replaced by an override; "
                     "not planned", rule.rule_id, rule.start)
            return True
    return False


def _read_recur(rule: RuleRecord, strict: bool) -> Lenient:
    """The rule's RRULE read strictly (raises :class:`RRuleError` naming the rule and the part) or
    leniently (``recur`` None and counted when invalid); ``recur`` None also for a rule without one."""
    if not rule.rrule:
        return Lenient(None)
    if not strict:
        return parse_rrule(rule.rrule, rule_id=rule.rule_id)
    try:
        return Lenient(validate_rrule(rule.rrule))
    except RRuleError as exc:
        raise RRuleError(f"rule {rule.rule_id!r}: {exc}") from None


def _local_value(text: str) -> date | datetime:
    """An EXDATE or RDATE as stored: a naive local ``datetime`` (``T`` or a space in it) or a ``date``."""
    return parse_local(text) if ("T" in text or " " in text) else date.fromisoformat(text)


@dataclass(slots=True)  # not frozen: built once per expansion, and a frozen __init__ costs
class _Bounds:
    """A rule's timing fields besides DTSTART and RRULE, read once.

    ``until_instant``: the aware UTC instant the series ends at, inclusive — the rule's own UNTIL
    (:func:`~deadline_pipeline.plan.recurrence.until_bound`), else the caller's fallback ``until``
    for a rule without COUNT, else None. ``shift``: the wall-clock shift of a THISANDFUTURE piece.
    ``split_from``/``split_before``: naive local bounds of a split series' piece (None: open).
    ``exdates``/``rdates``: naive local datetimes or dates, as stored."""

    until_instant: datetime | None
    shift: timedelta
    split_from: datetime | None
    split_before: datetime | None
    exdates: list
    rdates: list


def _bounds(rule: RuleRecord, recur: Recur | None, zone: tzinfo, until: datetime | None) -> _Bounds:
    """:class:`_Bounds` of ``rule`` (``recur``: its parsed RRULE, None without one) in ``zone``.
    Raises ``ValueError`` naming the rule for an unreadable UNTIL, EXDATE, RDATE or split field."""
    try:
        until_instant: datetime | None = None
        if recur is not None and recur.until is not None:
            until_instant = until_bound(recur.until, zone, all_day=rule.all_day)[1]
        elif until is not None and (recur is None or recur.count is None):
            until_instant = until.astimezone(UTC)
        extra = rule.extra or {}
        shift = timedelta(seconds=int(extra.get(SHIFT_SECONDS) or 0))
        split_from = parse_local(extra[SPLIT_FROM]) if extra.get(SPLIT_FROM) else None
        split_before = parse_local(extra[SPLIT_BEFORE]) if extra.get(SPLIT_BEFORE) else None
        exdates = [_local_value(x) for x in rule.exdates]
        rdates = [_local_value(x) for x in rule.rdates]
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"rule {rule.rule_id!r}: {exc}") from None
    return _Bounds(until_instant, shift, split_from, split_before, exdates, rdates)


@dataclass(slots=True)  # not frozen: built once per expansion, and a frozen __init__ costs
class _Frame:
    """The frame a series is stepped in (see the module's DST policy), all naive datetimes in it.

    ``elapsed``: a plain sub-daily rule, stepped in UTC (items are naive UTC instants); otherwise
    items are wall-clock times in ``zone``. ``dtstart``: the DTSTART in the frame. ``wall_zone`` and
    ``wall_shift``: the zone and shift :func:`once_per_instant` reads items with (UTC and none when
    elapsed: distinct instants never collide). ``lo``/``hi``: the window widened by the slack a
    shift, a business-day roll or a wall-clock day can move an occurrence. ``engine_until``: where
    the series engine stops (``hi``, or the UNTIL if earlier, with a day of slack in wall time)."""

    elapsed: bool
    zone: tzinfo
    dtstart: datetime
    wall_zone: tzinfo
    wall_shift: timedelta
    lo: datetime
    hi: datetime
    engine_until: datetime

    def of(self, local: datetime) -> datetime:
        """A naive local wall time in ``zone`` → the frame (the gap/fold policy applied once when elapsed)."""
        return to_instant(local, self.zone).replace(tzinfo=None) if self.elapsed else local

    def local_of(self, item: datetime) -> datetime:
        """An item of the frame → its naive local wall time in ``zone``."""
        return item.replace(tzinfo=UTC).astimezone(self.zone).replace(tzinfo=None) if self.elapsed else item

    def instant_of(self, item: datetime) -> datetime:
        """An item of the frame → its aware UTC instant, read as :class:`_Walk` reads it against UNTIL."""
        return item.replace(tzinfo=UTC) if self.elapsed else item.replace(tzinfo=self.zone, fold=0).astimezone(UTC)


def _frame(start: datetime, zone: tzinfo, recur: Recur | None, bounds: _Bounds, after: datetime, before: datetime,
           business) -> _Frame:
    """The :class:`_Frame` for a series from the naive local ``start`` in ``zone`` over ``[after,
    before]`` (aware), given the rule's ``bounds`` and business-day roll (``business``, None: none)."""
    # Elapsed-time stepping (see the module docstring): plain sub-daily rules expand in UTC.
    elapsed = recur is not None and recur.sub_daily and not recur.has_by_parts
    slack = _DAY + abs(bounds.shift) + (_ROLL_SLACK if business is not None else timedelta(0))
    lo_instant, hi_instant = after - slack, before + slack
    until_instant = bounds.until_instant
    if elapsed:
        # Frame: naive UTC. The start instant follows the gap/fold policy once; steps are elapsed time.
        # Items are distinct UTC instants here (no wall time to collide); shifts are elapsed time.
        dtstart = to_instant(start, zone).replace(tzinfo=None)
        wall_zone, wall_shift = UTC, timedelta(0)
        lo = lo_instant.astimezone(UTC).replace(tzinfo=None)
        hi = hi_instant.astimezone(UTC).replace(tzinfo=None)
        cap = until_instant.replace(tzinfo=None) if until_instant is not None else None
    else:
        dtstart = start
        wall_zone, wall_shift = zone, bounds.shift
        lo = lo_instant.astimezone(zone).replace(tzinfo=None)
        hi = hi_instant.astimezone(zone).replace(tzinfo=None)
        # One day of slack: UNTIL is enforced below on instants, where a fold hour is unambiguous.
        cap = until_instant.astimezone(zone).replace(tzinfo=None) + _DAY if until_instant is not None else None
    engine_until = hi if cap is None else min(hi, cap)
    return _Frame(elapsed, zone, dtstart, wall_zone, wall_shift, lo, hi, engine_until)


def _start_and_count(recur: Recur | None, frame: _Frame, after: datetime, bounds: _Bounds,
                     business) -> tuple[datetime | None, datetime, int | None]:
    """``(start_instance, series_start, count)``: the DTSTART to add as an instance of its own when
    the RRULE would not yield it — it does not match the RRULE, or it is after the series' UNTIL
    (``bounds.until_instant``) — else None; where the RRULE's series starts (DTSTART, or moved
    towards the window for a sub-daily rule) and the COUNT left for it (None: no COUNT; 0: the series
    has nothing left). Naive datetimes in ``frame``."""
    dtstart = frame.dtstart
    count = recur.count if recur is not None else None
    # RFC 5545 §3.8.5.3: DTSTART is the first instance even when it does not match the RRULE, and it
    # counts toward COUNT. dateutil yields matching dates only, so such a DTSTART was silently lost.
    # The same holds whatever UNTIL says: dateutil yields nothing past UNTIL, so a DTSTART after it
    # (FREQ=WEEKLY;BYDAY=FR;UNTIL before a Friday DTSTART) was lost although it matched its rule, and
    # the walk (which lets instances added here pass UNTIL) never saw it.
    start_instance: datetime | None = None
    if recur is not None:
        outside = recur.has_by_parts and next(iter(series(recur, dtstart, count=1)), None) != dtstart
        until = bounds.until_instant
        if outside or (until is not None and frame.instant_of(dtstart) > until):
            start_instance = dtstart
            count = count - 1 if count is not None else None
    series_start = dtstart
    if recur is not None and recur.sub_daily and start_instance is None:
        series_start, count = _jump_to_window(recur, frame, count, after, bounds.shift, business)
    return start_instance, series_start, count


def _jump_to_window(recur: Recur, frame: _Frame, count: int | None, after: datetime, shift: timedelta,
                    business) -> tuple[datetime, int | None]:
    """Where a sub-daily series may start without stepping from an old DTSTART, and the COUNT left
    (:func:`_jump`); naive, in ``frame``."""
    # Bounded by the window, not the rule's age: jump in whole intervals (elapsed stepping), or in
    # whole days that are also whole intervals when BYxxx parts filter on the wall clock.
    step = _UNIT_SECONDS[recur.freq] * int(recur.kwargs.get("interval", 1))
    if frame.elapsed:
        # Items are UTC instants here: the day of wall-clock slack is not needed, only the shift and
        # business-day roll that can move an instant into the window.
        near = after - abs(shift) - (_ROLL_SLACK if business is not None else timedelta(0))
        return _jump(frame.dtstart, max(frame.lo, near.astimezone(UTC).replace(tzinfo=None)), step, count)
    if count is None:
        return _jump(frame.dtstart, frame.lo, math.lcm(step, 86400), None)
    return frame.dtstart, count


def _exclusions(exdates: list, all_day: bool, frame: _Frame) -> tuple[set[date], list[datetime]]:
    """``(ex_days, ex_moments)``: the EXDATEs that exclude a whole local date, and those that exclude
    one moment (naive, in ``frame``)."""
    # Dates to exclude by local date: a DATE EXDATE against a timed series matches that whole local
    # day (ical.net #830), and every EXDATE of an all-day series is a date.
    ex_days: set[date] = set()
    ex_moments: list[datetime] = []
    for x in exdates:
        if isinstance(x, datetime) and not all_day:
            ex_moments.append(frame.of(x))
            # An EXDATE excludes the instance whose start is the same DATE-TIME (RFC 5545 §3.8.5.1), and
            # 02:30 in a 02:00 → 03:00 gap is the instant of 03:30 (§3.3.5). EXDATEs arrive as wall
            # times converted from their own TZID, so 07:30Z reads 03:30 and excluded nothing from a
            # series naming that instance 02:30. Both names go in; the series has one instance there
            # (once_per_instant). An elapsed frame compares instants already.
            twin = None if frame.elapsed else gap_alias(x, frame.zone)
            if twin is not None:
                ex_moments.append(twin)
        else:
            ex_days.add(x.date() if isinstance(x, datetime) else x)
    return ex_days, ex_moments


def _rdate_moments(rdates: list, all_day: bool, start_time: time, frame: _Frame) -> list[datetime]:
    """The RDATEs as moments in ``frame``: a DATE RDATE at the end of the day for an all-day series,
    else at DTSTART's time of day (``start_time``)."""
    return [frame.of(x if isinstance(x, datetime) else
                     datetime.combine(x, time(23, 59, 59) if all_day else start_time)) for x in rdates]


def _engine(rule: RuleRecord, recur: Recur | None, frame: _Frame, series_start: datetime, count: int | None,
            rdate_moments: list[datetime], ex_moments: list[datetime]):
    """The series as an iterable of naive datetimes in ``frame``, ascending: the RRULE's (from
    ``series_start``, ``count`` left, up to ``frame.engine_until``) with ``rdate_moments`` added and
    ``ex_moments`` taken out. Raises ``ValueError`` naming the rule when dateutil refuses it."""
    try:
        engine = series(recur, series_start, count=count, until=frame.engine_until) if (
            recur is not None and count != 0) else None
        if not (ex_moments or rdate_moments or engine is None):
            return engine
        rs = rruleset()
        if engine is not None:
            rs.rrule(engine)
        elif recur is None:
            rs.rdate(frame.dtstart)  # DTSTART is the first occurrence of an RDATE-only set (RFC 5545 §3.8.5.2)
        for m in rdate_moments:
            rs.rdate(m)
        for m in ex_moments:
            rs.exdate(m)
        return rs
    except (ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"rule {rule.rule_id!r}: RRULE {rule.rrule!r} cannot be expanded: {exc}") from None


#: What :meth:`_Walk.filtered` (and so :meth:`_Walk.placer`'s ``place``) returns for an item past the end of the
#: series' piece; ``_KEEP``, what :meth:`_Walk.filtered` returns for an item it does not leave out.
_STOP = object()
_KEEP = object()


class _Walk:
    """Walks a series (naive items in ``frame``) through the window ``[after, before]`` (aware):
    the split bounds, EXDATE days, UNTIL, shift and business-day roll applied to each item.

    ``unbounded``: items UNTIL does not bound (RDATEs, and a DTSTART outside its RRULE or after its
    UNTIL: §3.8.5.2, §3.8.5.3);
    ``limit``: stop after this many occurrences (None: no limit). The fields each item needs are
    kept flat on the walk: ``place`` (:meth:`placer`) runs once per occurrence in the window, the hot path of
    planning."""

    __slots__ = ("after", "before", "business", "elapsed", "ex_days", "filters", "frame", "limit", "moves", "place",
                 "rule", "shift", "split_before", "split_from", "unbounded", "until_instant", "zone")

    def __init__(self, rule: RuleRecord, zone: tzinfo, after: datetime, before: datetime, frame: _Frame,
                 bounds: _Bounds, ex_days: set[date], unbounded: frozenset, business, limit: int | None) -> None:
        self.rule, self.zone, self.after, self.before, self.frame = rule, zone, after, before, frame
        self.elapsed = frame.elapsed
        self.until_instant, self.shift = bounds.until_instant, bounds.shift
        self.split_from, self.split_before = bounds.split_from, bounds.split_before
        self.ex_days, self.unbounded, self.business, self.limit = ex_days, unbounded, business, limit
        #: Whether :meth:`filtered` can leave an item out, and :meth:`moved` change a due instant.
        self.filters = bool(ex_days) or bounds.split_from is not None or bounds.split_before is not None
        self.moves = bool(bounds.shift) or business is not None
        self.place = self.placer()

    def run(self, engine: Iterable[datetime]) -> tuple[list[Occurrence], datetime | None]:
        """``(occurrences sorted by due instant, cut_at)``: ``cut_at`` the due instant of the first
        occurrence past :data:`MAX_OCCURRENCES` in the window, None when none was left out. Raises
        :class:`ExpansionBudgetExceeded` past :data:`MAX_STEPS` items examined."""
        out: list[Occurrence] = []
        append = out.append
        lo, hi, limit, place = self.frame.lo, self.frame.hi, self.limit, self.place
        # Read once per walk, not once per item (tests lower them with monkeypatch before a walk).
        max_steps, cap = MAX_STEPS, MAX_OCCURRENCES
        cut_at: datetime | None = None
        unsorted = False
        last_due: datetime | None = None
        items = iter(engine)
        # The work budget: at most max_steps items examined (islice counts them), and a walk that
        # needs one more is over it.
        for item in islice(items, max_steps):
            if item < lo:
                continue
            if item > hi:
                break
            occurrence = place(item)
            if occurrence is None:
                continue
            if occurrence is _STOP:
                break
            if len(out) >= cap:
                # One occurrence more than the cap in the window: the expansion is cut here. (Stopping at
                # the cap itself claimed a cut for a window holding exactly the cap.)
                cut_at = occurrence.due_at
                break
            due = occurrence.due_at
            if last_due is not None and due < last_due:
                unsorted = True  # a business-day roll or a shift put it before the last one
            last_due = due
            append(occurrence)
            if limit is not None and len(out) >= limit:
                break
        else:
            if next(items, None) is not None:
                raise self.over_budget()
        if unsorted:
            out.sort(key=lambda o: (o.due_at, o.period))
        return out, cut_at

    def placer(self):
        """The function ``place(item)`` of this walk: the :class:`Occurrence` of ``item`` (naive, in
        the frame, inside its widened window), None when it is left out (before the piece, on an
        EXDATE day, past UNTIL, outside the window after its shift and roll), or :data:`_STOP` when the
        piece ends before it. A closure over the walk's fields: it runs once per occurrence in the
        window, and reading cells costs less than reading attributes."""
        zone, after, before, elapsed, all_day = self.zone, self.after, self.before, self.elapsed, self.rule.all_day
        # Bound methods only where they are called (each is an allocation per expansion).
        filters, moves = self.filters, self.moves
        local_of = self.frame.local_of if elapsed else None
        filtered = self.filtered if filters else None
        moved = self.moved if moves else None
        until_instant, unbounded = self.until_instant, self.unbounded

        def place(item: datetime):
            local = local_of(item) if elapsed else item
            if filters:
                verdict = filtered(local)
                if verdict is not _KEEP:
                    return verdict
            if elapsed:
                due, period = item.replace(tzinfo=UTC), item.isoformat(timespec="seconds") + "Z"
            else:
                due = local.replace(tzinfo=zone, fold=0).astimezone(UTC)
                period = local.date().isoformat() if all_day else local.isoformat(timespec="seconds")
            # UNTIL bounds the series' own (unshifted) instants, inclusive (RFC 5545 §3.3.10).
            if until_instant is not None and due > until_instant and item not in unbounded:
                return None
            wall = None if elapsed else local
            if moves:
                due, wall = moved(due, local)
            if not (after <= due <= before):
                return None
            return Occurrence(period, due, None if wall is None else gap_wall(wall, zone))

        return place

    def filtered(self, local: datetime):
        """:data:`_STOP` when the local wall time ``local`` is at or after the next piece of a split
        series, None when it is before this piece or on an EXDATE day (left out), else :data:`_KEEP`."""
        if self.split_before is not None and local >= self.split_before:
            return _STOP
        if self.split_from is not None and local < self.split_from:
            return None
        if self.ex_days and local.date() in self.ex_days:
            return None
        return _KEEP

    def moved(self, due: datetime, local: datetime) -> tuple[datetime, datetime | None]:
        """``due`` (aware UTC) after the THISANDFUTURE shift and the business-day roll, if any, with the
        nominal wall time it was read from (naive; None: an elapsed-time instant, not rolled)."""
        shift, zone, elapsed = self.shift, self.zone, self.elapsed
        wall = None if elapsed else local + shift
        if shift:
            due = due + shift if elapsed else wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
        if self.business is not None:
            wall = _rolled(due.astimezone(zone).replace(tzinfo=None) if elapsed else wall, self.business)
            due = to_instant(wall, zone)
        return due, wall

    def over_budget(self) -> ExpansionBudgetExceeded:
        """The error for a series needing more than :data:`MAX_STEPS` items, logged at ERROR."""
        rule = self.rule
        log.error("rule %s: RRULE %r needs more than %d steps to reach [%s, %s]; the rule is skipped",
                  rule.rule_id, rule.rrule, MAX_STEPS, instant_text(self.after), instant_text(self.before))
        return ExpansionBudgetExceeded(
            f"rule {rule.rule_id!r}: RRULE {rule.rrule!r} needs more than {MAX_STEPS} steps from its DTSTART "
            f"{rule.start} to reach the window; it is skipped (bound it with a later DTSTART, UNTIL or a "
            "coarser FREQ)")


def _rolled(local: datetime, business) -> datetime:
    """``local`` (naive wall time) on the business day ``business`` (calendar, convention) rolls its
    date to, at the same time of day."""
    cal, convention = business
    day = bd.adjust(local.date(), convention, cal)
    return datetime.combine(day, local.time()) if day != local.date() else local


def _check_truncation(rule: RuleRecord, recur: Recur, out: list[Occurrence], after: datetime, before: datetime,
                      until_instant: datetime | None, dtstart: datetime, count: int | None,
                      hi: datetime) -> bool:
    """Whether the series is suspicious and cut at ``before`` (the caller counts it every time);
    logged at ERROR once per rule and process."""
    window_days = max((before - after).total_seconds() / 86400, 1.0)
    rate = len(out) * HORIZON.days / window_days
    unbounded_sub_daily = recur.sub_daily and not recur.bounded
    if not unbounded_sub_daily and rate <= SANE_OCCURRENCES:
        return False
    # Does the series go on past the window? Unbounded: yes; UNTIL: compare; COUNT: probe once.
    if recur.count is None:
        continues = until_instant is None or until_instant > before
    else:
        probe = series(recur, dtstart, count=count) if count else ()
        continues = any(item > hi for item in probe)
    if not continues:
        return False
    key = (rule.rule_id, rule.rrule or "")
    if key in _TRUNCATION_LOGGED:
        return True
    if len(_TRUNCATION_LOGGED) < 10_000:  # bounded: a hostile feed must not grow memory without end
        _TRUNCATION_LOGGED.add(key)
    why = ("unbounded sub-daily series" if unbounded_sub_daily
           else f"about {rate:.0f} occurrences per {HORIZON.days} days (more than {SANE_OCCURRENCES})")
    log.error("rule %s: RRULE %r truncated at %s (%s); a reminder that fires without end is a data bug",
              rule.rule_id, rule.rrule, instant_text(before), why)
    return True


def window(now: datetime, horizon: timedelta = HORIZON) -> tuple[datetime, datetime]:
    """The planning window ``[now - GRACE, now + horizon]`` (aware UTC): the past is never replayed."""
    return now - GRACE, now + horizon


__all__ = ["GRACE", "HORIZON", "MAX_OCCURRENCES", "MAX_STEPS", "Collapsed", "Expansion", "ExpansionBudgetExceeded",
           "budget_problem", "cap_problem", "due_span", "SANE_OCCURRENCES", "over_budget", "Occurrence", "expand",
           "expansion", "gap_wall", "has_occurrence", "normalise_until", "once_per_instant", "present_labels",
           "to_instant", "window", "zone_gaps"]
