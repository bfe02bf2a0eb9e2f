"""Business-day conventions: moving a due date that falls on a weekend or a public holiday.

Pure domain logic. Holiday data comes from the maintained ``holidays`` library (country and
subdivision calendars, updated with each release; :func:`calendar_data_version` names the release)
or from an ingested holiday source — anything that answers ``day in calendar`` is a
:class:`HolidayCalendar`, so a plain ``set`` of dates is one.

A business day is the calendar's own notion of a working day (:func:`is_business_day`). For a
``holidays`` calendar that is ``HolidayBase.is_working_day``: not a holiday, and on the calendar's
weekend for that date (``HolidayBase.is_weekend``) only when the date is one of its
``weekend_workdays`` — the Saturdays and Sundays a government makes working days when it moves a
working day to bridge a holiday. Example (the Russian government's production calendar for 2024):
Monday 29 and Tuesday 30 April are days off, Saturday 27 April and Saturday 2 November are working
days, so ``following`` leaves Saturday 27 April 2024 where it is. China, Belarus, Kazakhstan and
Uzbekistan publish such days too. A plain date set has no such notion: its business days are the
days neither on its ``weekend`` (Saturday/Sunday unless it says otherwise) nor in the set.

Covered years. A calendar built from an ingested holiday file knows only the years the file lists:
GOV.UK's bank-holidays.json ended 2027-12-28, so Monday 1 May 2028 (Early May bank holiday) was a
business day to it. A ``holidays`` calendar answers any year to 2100, but past the release's
declared end year it answers "not a holiday" just as silently (Sri Lanka's ends 2026 in holidays
0.109). Either calendar carries a :class:`Coverage` (for a library calendar, :class:`LibraryCoverage`,
the years :func:`~deadline_pipeline.holiday_calendars.library_coverage` reads from the release), and
:func:`adjust` tells it each due date it settles on past the last covered year, so planning can
report the date as rolled without the data (a planning problem); the plan still goes ahead.

Decreed transfers. A country whose worked weekends and bridged days off come from a yearly decree
(China's State Council notice) has them in the release only for the years published before it was
made: holidays 0.109 lists China's to 2026. A roll past that year may ignore a decree, or the
country may have moved no day that year (Kazakhstan, Taiwan and others list none for 2026 in
0.109); the release cannot tell. Such a calendar also carries a :class:`DecreeCoverage`, told each
due date alike, which planning *notes* (a warning, shown by ``plan_complete`` while it stays
green), not reports: a problem would be red for a whole year in every deployment of a country that
simply moved no day.

Conventions (the ISDA names used for payment and filing dates):

* ``none`` — the date stays as it is;
* ``following`` — the next business day on or after the date;
* ``modified-following`` — ``following``, unless that lands in the next calendar month, then
  ``preceding`` (a month-end deadline never moves into the next month);
* ``preceding`` — the last business day on or before the date.

Calendar specs (:func:`calendar`): ``"US"``, ``"US-DC"``, ``"GB-ENG"`` (ISO 3166 country, optional
subdivision, as ``holidays.country_holidays`` takes them), a financial market (``"NYSE"``), and
``"US-IRS"`` — the calendar of US federal tax due dates: IRC §7503 moves a due date that falls on a
Saturday, Sunday or "legal holiday" to the next business day, and legal holiday includes those of
the District of Columbia. So ``US-IRS`` = US federal holidays ∪ DC legal holidays, the library's own
sum ``country_holidays("US") + country_holidays("US", subdiv="DC")`` (DC Emancipation
Day, 16 April, observed on Friday 15 April when the 16th is a Saturday and on Monday 17 April when
it is a Sunday; Inauguration Day). Example: 15 April 2028 is a Saturday, Monday 17 April is the
observed Emancipation Day, so the return is due Tuesday 18 April 2028.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import date, timedelta
from types import SimpleNamespace
from typing import Protocol, runtime_checkable

# The library calendars and their spec grammar live in a leaf module, so that the configuration can
# check a calendar name without importing the planner; re-exported here for the planner's callers.
from deadline_pipeline.holiday_calendars import (
    UnknownCalendar,
    calendar_data_version,
    holiday_source_of,
    library_calendar,
    library_coverage,
)

CONVENTIONS = ("none", "following", "modified-following", "preceding")
WEEKEND = frozenset({5, 6})  # Saturday, Sunday (date.weekday())
# A calendar in which no business day lies within this many days is broken data, not a long holiday.
MAX_ROLL_DAYS = 31


@runtime_checkable
class HolidayCalendar(Protocol):
    """Anything that says whether a date is a holiday: ``day in calendar``.

    A ``holidays.HolidayBase``, a ``set``/``frozenset`` of dates (an ingested holiday source) and
    :class:`DateSetCalendar` all qualify. An optional ``weekend`` attribute (weekday numbers,
    Monday = 0) overrides the Saturday/Sunday weekend, e.g. for Friday/Saturday countries. An
    optional ``is_working_day(date) -> bool`` (as ``holidays.HolidayBase`` has) overrides both: the
    calendar then decides its business days itself, weekend working days included, and an optional
    ``is_weekend(date) -> bool`` names its weekend per date (for :func:`describe_roll`).
    """

    def __contains__(self, day: object) -> bool: ...


@dataclass(eq=False)
class Coverage:
    """The calendar years ``first`` to ``last`` (inclusive) a holiday calendar's dates cover, and the
    earliest due date rolled past them (``uncovered``; ``None`` until :func:`adjust` settles on one).

    After ``last`` the calendar answers "not a holiday" for lack of data, not knowledge: GOV.UK's file
    ended 2027-12-28, and a ``preceding`` filing due Monday 1 May 2028 (Early May bank holiday) stayed
    on the holiday instead of Friday 28 April, its PT0S reminder three days late, silently. A due
    date the roll settles on is the one date whose holiday status decided the roll (the dates it
    passed were holidays, so covered, or weekend days, which need no data), so :meth:`note` judges
    that date alone: Saturday 1 January 2028 rolled back to Friday 31 December 2027 is covered.

    ``report``: any object with a writable ``message`` (a planning problem); ``publish(report)`` is
    called once, at the first due date past ``last``, with ``report.message`` set by
    :meth:`describe`; an earlier due date met later (another rule) rewrites ``report.message`` in
    place, so one report per calendar names the earliest (the log line of ``publish`` names the
    first met). The planner rolls dates up to :data:`MAX_ROLL_DAYS` + 1 days beyond its window too,
    so a report may come up to a month before its date is planned: a warning, not a false alarm.
    Dates before ``first`` are not judged: a holiday file may drop its past years (it is applied,
    not quarantined), and the rolls that reach before the window (at dates never planned) would then
    report them each January.
    """

    first: int
    last: int
    spec: str = ""
    report: object = None
    publish: Callable[[object], object] | None = None
    uncovered: date | None = None

    def note(self, due: date) -> None:
        """Record ``due`` (a rolled due date) when it is past :attr:`last` and earlier than
        :attr:`uncovered`; O(1): one year comparison for a covered date."""
        if due.year <= self.last or (self.uncovered is not None and due >= self.uncovered):
            return
        first_time = self.uncovered is None
        self.uncovered = due
        if self.report is not None:
            self.report.message = self.describe()
            if first_time and self.publish is not None:
                self.publish(self.report)

    def describe(self) -> str:
        """``"business-day calendar 'source:ukh/england-and-wales' has holidays for 2019-2027 only; due
        dates from 2028-05-01 on are rolled for weekends alone: …"``, from :attr:`uncovered`."""
        years = f"{self.first}" if self.first == self.last else f"{self.first}-{self.last}"
        since = self.uncovered.isoformat() if self.uncovered else f"{self.last + 1}-01-01"
        return (f"business-day calendar {self.spec!r} has holidays for {years} only; due dates from {since} on "
                "are rolled for weekends alone: ingest a newer holiday file, or shorten plan.horizon_days")


@dataclass(eq=False)
class LibraryCoverage(Coverage):
    """The years the installed ``holidays`` release has holidays for a library calendar spec (from its
    declared start and end years), judged like an ingested file's (:class:`Coverage`); ``why``: why
    the data ends at ``last``, and ``data``: the release (:func:`calendar_data_version`). Built by
    :func:`covered_calendar`."""

    why: str = ""
    data: str = ""

    def describe(self) -> str:
        """``"business-day calendar 'LK' (holidays 0.109) has holidays for 2003-2026 only (LK holidays end
        with the release's declared end year 2026); due dates from 2027-01-04 on are rolled without
        2027 data: upgrade holidays, or ingest an official 2027 holiday file (business_days.calendar:
        source:NAME)"``, from :attr:`uncovered`."""
        since = self.uncovered or date(self.last + 1, 1, 1)
        return (f"business-day calendar {self.spec!r} ({self.data}) has holidays for {self.first}-{self.last} "
                f"only ({self.why}); due dates from {since.isoformat()} on are rolled without {since.year} data: "
                f"upgrade holidays, or ingest an official {since.year} holiday file (business_days.calendar: "
                "source:NAME)")


@dataclass(eq=False)
class DecreeCoverage(Coverage):
    """The years to ``last`` for which the installed ``holidays`` release lists a decree country's
    moved working days (:attr:`~deadline_pipeline.holiday_calendars.LibraryCoverage.decrees`), told
    each rolled due date as :class:`Coverage` is; ``data``: the release. ``publish(report)`` is
    meant for a note (a warning), not a problem: past ``last`` the country may have moved no day."""

    data: str = ""

    def describe(self) -> str:
        """``"business-day calendar 'CN' (holidays 0.109) lists the yearly decree's worked weekends and
        bridged days off to 2026 only; due dates from 2027-03-08 on are rolled as if 2027 moved no
        day: if a 2027 decree moved days, upgrade holidays or ingest the official 2027 holiday file
        (business_days.calendar: source:NAME)"``, from :attr:`uncovered`."""
        since = self.uncovered or date(self.last + 1, 1, 1)
        return (f"business-day calendar {self.spec!r} ({self.data}) lists the yearly decree's worked weekends "
                f"and bridged days off to {self.last} only; due dates from {since.isoformat()} on are rolled as "
                f"if {since.year} moved no day: if a {since.year} decree moved days, upgrade holidays or ingest "
                f"the official {since.year} holiday file (business_days.calendar: source:NAME)")


@dataclass(frozen=True)
class CoveredCalendar:
    """A ``holidays`` calendar (``calendar``, shared and cached per spec) with the :class:`Coverage`
    of one planning run and, for a decree country, its :class:`DecreeCoverage` (``decrees``; else
    ``None``): it answers as the calendar does (``day in``, ``is_working_day``, ``is_weekend``,
    ``get``), and :func:`adjust` tells both each due date it settles on."""

    calendar: HolidayCalendar
    coverage: Coverage = field(compare=False, repr=False)
    decrees: Coverage | None = field(default=None, compare=False, repr=False)

    def __contains__(self, day: object) -> bool:
        return day in self.calendar

    def is_working_day(self, day: date) -> bool:
        return bool(self.calendar.is_working_day(day))

    def is_weekend(self, day: date) -> bool:
        return _on_weekend(day, self.calendar)

    def get(self, day: date, default: object = None) -> object:
        return self.calendar.get(day, default)


def covered_calendar(spec: str, report: object = None, publish: Callable[[object], object] | None = None,
                     note: Callable[[str, int, str], object] | None = None) -> CoveredCalendar:
    """The library calendar of ``spec`` (:func:`calendar`) with a :class:`LibraryCoverage` of the
    years the installed release has holidays for, told ``report`` and ``publish`` as
    :class:`Coverage` is, and for a decree country
    (:attr:`~deadline_pipeline.holiday_calendars.LibraryCoverage.decrees` not ``None``) a
    :class:`DecreeCoverage`, which calls ``note(spec, last listed year, its message)`` once, at the
    first due date past its year (both read by
    :func:`~deadline_pipeline.holiday_calendars.library_coverage`). Raises :class:`UnknownCalendar`
    naming the spec."""
    known = library_coverage(spec)
    data = calendar_data_version()
    decrees = None if known.decrees is None else DecreeCoverage(
        known.first, known.decrees, spec, SimpleNamespace(message=""),
        None if note is None else lambda said: note(spec, known.decrees, said.message), data=data)
    return CoveredCalendar(library_calendar(spec), LibraryCoverage(
        known.first, known.last, spec, report, publish, why=known.why, data=data), decrees)


@dataclass(frozen=True)
class DateSetCalendar:
    """A holiday calendar from explicit dates (e.g. an ingested holiday source).

    ``coverage``: the years the dates cover (:class:`Coverage`), told each due date :func:`adjust`
    rolls with this calendar; ``None``: the dates are taken as complete (a plain set of dates).
    """

    dates: frozenset[date]
    weekend: frozenset[int] = WEEKEND
    name: str = "dates"
    coverage: Coverage | None = field(default=None, compare=False, repr=False)

    def __contains__(self, day: object) -> bool:
        return day in self.dates


@dataclass(frozen=True)
class UnionCalendar:
    """A date is a holiday when any member calendar says so.

    ``members``: :class:`HolidayCalendar` values. Business days (:meth:`is_working_day`): a member
    with its own notion of a working day (a ``holidays`` calendar) judges every date by it, and all
    such members must call it a working day; the other members (date sets) contribute holidays only.
    ``weekend`` is the weekend of a union in which no member has its own notion.
    """

    members: tuple = field(default_factory=tuple)
    weekend: frozenset[int] = WEEKEND
    name: str = "union"

    def __contains__(self, day: object) -> bool:
        return any(day in m for m in self.members)

    def _judges(self) -> list:
        return [m for m in self.members if callable(getattr(m, "is_working_day", None))]

    def is_working_day(self, day: date) -> bool:
        """Not a holiday of any member, and a working day of every member that knows its own."""
        judges = self._judges()
        if not judges:
            return day.weekday() not in self.weekend and day not in self
        # The union's Saturday/Sunday would override a member's weekend working day (RU 2024-04-27)
        # and a member's other weekend (Friday/Saturday): the member's own verdict decides.
        return day not in self and all(m.is_working_day(day) for m in judges)

    def is_weekend(self, day: date) -> bool:
        """On the weekend of a member that knows its own, or on the union's when none does."""
        judges = self._judges()
        if not judges:
            return day.weekday() in self.weekend
        return any(_on_weekend(day, m) for m in judges)


def calendar(spec: str | HolidayCalendar | Iterable[date]) -> HolidayCalendar:
    """Resolve a calendar spec to a :class:`HolidayCalendar`.

    ``spec``: a string (``"US"``, ``"US-DC"``, ``"GB-ENG"``, ``"NYSE"``, ``"US-IRS"``), an object that
    already answers ``day in calendar``, or an iterable of dates. Library calendars are cached per
    spec and fill in years lazily. Raises :class:`UnknownCalendar` naming the spec when the library
    does not know the country or subdivision.
    """
    if isinstance(spec, str):
        return library_calendar(spec)
    if isinstance(spec, HolidayCalendar):
        return spec
    return DateSetCalendar(frozenset(spec))


def is_business_day(day: date, cal: HolidayCalendar) -> bool:
    """Whether ``day`` is a business day of ``cal``.

    A calendar with its own ``is_working_day`` (a ``holidays`` calendar, :class:`UnionCalendar`)
    decides; any other: not a weekend day of ``cal`` (its ``weekend``, Saturday/Sunday unless it
    says otherwise) and not a holiday.
    """
    working = getattr(cal, "is_working_day", None)
    if callable(working):
        # Saturday/Sunday alone rolled a worked Saturday (RU 2024-04-27) into the next week, past
        # days the country works, and misjudged countries whose weekend changed over the years
        # (MY-JHR, AE): the library knows both, per date.
        return bool(working(day))
    return day.weekday() not in getattr(cal, "weekend", WEEKEND) and day not in cal


def _on_weekend(day: date, cal: HolidayCalendar) -> bool:
    check = getattr(cal, "is_weekend", None)
    if callable(check):
        return bool(check(day))
    return day.weekday() in getattr(cal, "weekend", WEEKEND)


def _roll(day: date, cal: HolidayCalendar, step: int) -> date:
    current = day
    for _ in range(MAX_ROLL_DAYS + 1):
        if is_business_day(current, cal):
            return current
        current += timedelta(days=step)
    raise ValueError(f"no business day within {MAX_ROLL_DAYS} days of {day.isoformat()}: the holiday calendar "
                     "marks every day as a holiday or weekend")


def adjust(day: date, convention: str, calendar: HolidayCalendar) -> date:  # noqa: A002 — the documented name
    """Move ``day`` to a business day by ``convention`` (one of :data:`CONVENTIONS`).

    ``calendar``: a :class:`HolidayCalendar` (resolve a spec with :func:`calendar`). Returns a date.
    A calendar with a :class:`Coverage` (:class:`DateSetCalendar`, :class:`CoveredCalendar`, also its
    ``decrees``) is told the result (:meth:`Coverage.note`).
    Raises ``ValueError`` for an unknown convention, or when no business day lies within
    :data:`MAX_ROLL_DAYS` days (a calendar that marks everything as a holiday is a data error).
    """
    name = check_convention(convention)
    if name == "none":
        return day
    if name == "following":
        due = _roll(day, calendar, 1)
    elif name == "preceding":
        due = _roll(day, calendar, -1)
    else:
        # A following roll into the next month is judged by its month alone, whatever its holidays:
        # only the date kept is noted below.
        due = _roll(day, calendar, 1)
        due = due if due.month == day.month else _roll(day, calendar, -1)
    coverage = getattr(calendar, "coverage", None)
    if coverage is not None:
        # A holiday file's last year passed silently (GOV.UK's ended 2027: 1 May 2028 not rolled),
        # and so did a library release's declared end year (Sri Lanka's 2026 in holidays 0.109).
        coverage.note(due)
    decrees = getattr(calendar, "decrees", None)
    if decrees is not None:
        # China's 2027 decree (not in holidays 0.109) may move days this roll ignored: noted, not red.
        decrees.note(due)
    return due


def check_convention(convention: str) -> str:
    """The canonical convention name (``modified_following`` is accepted); ``ValueError`` names the input."""
    name = str(convention).strip().lower().replace("_", "-")
    if name not in CONVENTIONS:
        raise ValueError(f"business-day convention {convention!r} is not one of {', '.join(CONVENTIONS)}")
    return name


# The rule a calendar spec stands for, as a reader of a reminder knows it.
_LEGAL_NAMES = {"US-IRS": "IRC §7503"}


def holiday_name(day: date, cal: HolidayCalendar) -> str | None:
    """The name a holiday calendar gives ``day`` (``"Martin Luther King Jr. Day"``), or ``None``
    when it is not a holiday or the calendar has no names (a plain set of dates)."""
    members = getattr(cal, "members", None)
    if members:
        for member in members:
            name = holiday_name(day, member)
            if name:
                return name
        return None
    getter = getattr(cal, "get", None)
    if callable(getter) and day in cal:
        name = getter(day)
        return str(name) if name else None
    return None


def _day(d: date) -> str:
    return f"{d:%A} {d.day} {d:%b}"


def _why_moved(nominal: date, cal: HolidayCalendar) -> str:
    if _on_weekend(nominal, cal):
        return "falls on a weekend"
    name = holiday_name(nominal, cal)
    return f"is a holiday ({name})" if name else "is a holiday"


def _due_words(due: date, cal: HolidayCalendar) -> str:
    # A due date on a Saturday or Sunday reads as a mistake unless it says it is a working day
    # (RU: Monday 29 April 2024 is a day off, "preceding" lands on the worked Saturday 27 April).
    return f"{_day(due)}, a working day" if _on_weekend(due, cal) else _day(due)


def describe_roll(nominal: date, due: date, spec: str, convention: str,
                  cal: HolidayCalendar | None = None) -> str | None:
    """Why a due date moved, in words, or ``None`` when it did not:
    ``"Sunday 31 Jan falls on a weekend; due Monday 1 Feb (IRC §7503 following)"``, and for a due
    date on a weekend working day ``"Monday 29 Apr is a holiday (…); due Saturday 27 Apr, a working
    day (RU preceding)"``.

    ``nominal``: the date the source gave; ``due``: the date after the ``convention``; ``spec``: the
    calendar spec of the configuration (``US-IRS`` is named by its rule, IRC §7503); ``cal``: the
    resolved calendar, used to name a holiday and the calendar's weekend on each date (default:
    resolved from ``spec``; a ``source:`` spec names none). A reader who sees a date other than the
    published one must learn why, or they would take the reminder for a mistake and file on the
    published (earlier) day.
    """
    if nominal == due:
        return None
    if cal is None and holiday_source_of(spec) is None:
        try:
            cal = calendar(spec)
        except ValueError:
            cal = None
    if cal is None:  # no calendar to ask: a Saturday/Sunday weekend and no holiday names
        cal = DateSetCalendar(frozenset())
    rule = _LEGAL_NAMES.get(spec.strip().upper(), spec)
    return f"{_day(nominal)} {_why_moved(nominal, cal)}; due {_due_words(due, cal)} ({rule} {convention})"


__all__ = ["CONVENTIONS", "Coverage", "CoveredCalendar", "DateSetCalendar", "DecreeCoverage", "HolidayCalendar",
           "LibraryCoverage", "UnionCalendar", "UnknownCalendar", "adjust", "calendar", "calendar_data_of",
           "calendar_data_version", "check_convention", "covered_calendar", "describe_roll", "holiday_name",
           "holiday_source_of", "is_business_day"]


def calendar_data_of(cal: HolidayCalendar) -> str | None:
    """:func:`calendar_data_version` for a calendar built from the library (a ``holidays`` calendar,
    or a union with one); ``None`` for explicit dates (an ingested holiday source is versioned as a
    source, by its snapshots)."""
    if isinstance(cal, (DateSetCalendar, set, frozenset)):
        return None
    if isinstance(cal, UnionCalendar) and all(calendar_data_of(m) is None for m in cal.members):
        return None
    return calendar_data_version()
