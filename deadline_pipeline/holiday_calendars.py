"""Holiday calendars of the ``holidays`` library by name: the spec grammar and the lookup.

A leaf module (it imports only the ``holidays`` library): the configuration checks a
``business_days.calendar`` name here when it is loaded, and the planner
(:mod:`deadline_pipeline.plan.business_days`) builds its calendars from the same lookup, so the two
can never disagree about which names exist. The other spec form, ``source:NAME[/DIVISION]`` (an
ingested holiday source), is parsed here too (:func:`holiday_source_of`), for the same reason.
"""

from __future__ import annotations

from datetime import date
from functools import lru_cache
from typing import NamedTuple

# A ``business_days.calendar`` spec starting with this names an ingested holiday source.
SOURCE_PREFIX = "source:"


class HolidaySourceRef(NamedTuple):
    """The ingested holiday source a calendar spec names: the source's ``name`` and the
    ``division`` whose rules are its holidays (a rule id prefix before ``/``; ``""``: every rule)."""

    name: str
    division: str


def holiday_source_of(spec: str) -> HolidaySourceRef | None:
    """The holiday source of a ``source:NAME[/DIVISION]`` spec (``"source:uk-holidays/england-and-wales"``
    → ``("uk-holidays", "england-and-wales")``, ``"source:hols"`` → ``("hols", "")``); ``None`` for
    any other spec (a library calendar such as ``"GB-ENG"``). Nothing is checked: ``"source:"`` gives
    an empty name, which the configuration refuses as an unknown source."""
    if not spec.startswith(SOURCE_PREFIX):
        return None
    name, _, division = spec[len(SOURCE_PREFIX):].partition("/")
    return HolidaySourceRef(name, division)


class UnknownCalendar(ValueError):
    """A calendar spec that names no holiday calendar; the message names the spec."""


def _library_calendar(country: str, subdiv: str | None, spec: str):
    import holidays

    try:
        if subdiv is None and country in holidays.list_supported_financial():
            return holidays.financial_holidays(country)
        return holidays.country_holidays(country, subdiv=subdiv)
    except (NotImplementedError, KeyError, ValueError) as exc:
        raise UnknownCalendar(
            f"holiday calendar {spec!r}: {exc} (expected e.g. 'US', 'US-DC', 'GB-ENG', 'NYSE' or 'US-IRS')"
        ) from None


@lru_cache(maxsize=64)
def library_calendar(spec: str):
    """The ``holidays`` calendar of ``spec`` (``"US"``, ``"US-DC"``, ``"GB-ENG"``, ``"NYSE"``,
    ``"US-IRS"``; letter case and surrounding spaces ignored), cached per spec; it answers
    ``day in calendar`` and ``is_working_day(day)``. Raises :class:`UnknownCalendar` naming the spec
    when the library knows no such country, subdivision or market, or the spec is empty."""
    text = spec.strip().upper()
    if not text:
        raise UnknownCalendar("holiday calendar spec is empty")
    if text == "US-IRS":
        # IRC §7503: weekends, federal legal holidays and DC legal holidays (see deadline_pipeline.plan.business_days).
        # The library's own sum (a HolidaySum) answers is_working_day like any of its calendars. It
        # keeps the Saturday/Sunday weekend and drops its operands' weekend working days: right for
        # the US, which has none, so this sum is built for US-IRS only, not for arbitrary specs.
        return _library_calendar("US", None, spec) + _library_calendar("US", "DC", spec)
    country, _, subdiv = text.partition("-")
    return _library_calendar(country, subdiv or None, spec)


def calendar_data_version() -> str:
    """Which holiday data business days come from: ``"holidays 0.109"``.

    The ``holidays`` distribution name and ``holidays.__version__``. Each release revises holidays
    and weekend working days (a government publishes a year's transfers the year before), so
    the same nominal date may roll differently under another release: recorded beside a rolled
    date, this says which data rolled it, and every heartbeat records the one its process reads
    (two processes on different releases plan different working days: ``time_data_agrees``). A
    ``source:`` calendar (an ingested holiday source) is that source's data, not this library's.
    """
    import holidays

    return f"holidays {holidays.__version__}"


class LibraryCoverage(NamedTuple):
    """The calendar years ``first`` to ``last`` (inclusive) for which the installed ``holidays``
    release has complete data for a calendar spec, and ``why`` the data ends at ``last`` (words for a
    report: ``"CN weekend working days and bridged days are set by yearly decree; this release lists
    them to 2026"``)."""

    first: int
    last: int
    why: str


# A country whose newest listed weekend working day is more than this many years older than the
# newest such day any country of the release lists no longer transfers working days: Ukraine
# suspended its transfers under martial law in 2022 (last listed 2022), Armenia's end 2021 and
# Bulgaria's 2016. Judging them by their last listed year would report every later year of a
# calendar the release has complete, a standing false alarm.
DECREE_LAPSE_YEARS = 2


def _entries(days: object) -> tuple:
    # A year's special holidays are one (month, day, ...) tuple or a tuple of them.
    return days if isinstance(days, tuple) and days and isinstance(days[0], tuple) else (days,)


def _decree_last_year(entity) -> int | None:
    """The last year for which ``entity`` lists a substituted day (a day off whose working day moved
    to another date, a ``special_public_holidays`` entry of four or five items), or ``None``."""
    special = getattr(entity, "special_public_holidays", None) or {}
    years = [y for y, days in special.items() if isinstance(y, int)
             and any(isinstance(d, tuple) and len(d) >= 4 for d in _entries(days))]
    return max(years, default=None)


@lru_cache(maxsize=1)
def _newest_decree_year() -> int:
    """The newest year any country of the installed release lists a substituted day for (the year
    the release's decree data reaches: 2027 in holidays 0.109, from Russia's production calendar)."""
    import holidays

    years = [_decree_last_year(holidays.country_holidays(code)) for code in holidays.list_supported_countries()]
    return max((y for y in years if y is not None), default=0)


class _TableReads:
    """Stands in for a lunar/lunisolar calendar helper of a throwaway entity (``_hindu_calendar``,
    ``_islamic_calendar``, …) and records the last year of each date table the entity reads: a call
    ``diwali_date(year)`` reads ``DIWALI_DATES``, ``eid_al_fitr_dates(year)`` ``EID_AL_FITR_DATES``."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.ends: dict[str, int] = {}

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        upper = name.upper()
        table_name = upper if upper.endswith("_DATES") else upper + "S" if upper.endswith("_DATE") else None
        table = getattr(self._inner, table_name, None) if table_name else None
        if isinstance(table, dict) and table and all(isinstance(y, int) for y in table):
            self.ends[table_name] = max(table)
        return attr


def _table_last_year(entity, years: range) -> tuple[int, str] | None:
    """The earliest last year of the date tables a fresh copy of ``entity`` reads to compute
    ``years``, and that table's name; ``None`` when it reads none (a Gregorian-only calendar)."""
    fresh = type(entity)(subdiv=entity.subdiv, categories=tuple(entity.categories))
    helpers = {name: _TableReads(value) for name, value in vars(fresh).items()
               if type(value).__module__.startswith("holidays.calendars.")}
    if not helpers:
        return None
    for name, proxy in helpers.items():
        setattr(fresh, name, proxy)
    for year in years:
        fresh.get(date(year, 1, 1))
    ends = [(end, table) for proxy in helpers.values() for table, end in proxy.ends.items()]
    return min(ends) if ends else None


def _members(cal) -> list:
    import holidays

    # US-IRS is a HolidaySum: its data ends where the first of its operands' ends.
    return list(cal.holidays) if isinstance(cal, holidays.HolidaySum) else [cal]


def library_coverage(spec: str, today: date | None = None) -> LibraryCoverage:
    """The years the installed ``holidays`` release has complete data for calendar ``spec`` (as
    :func:`library_calendar` takes it). Raises :class:`UnknownCalendar` as that does.

    The library answers every year from its entity's ``start_year`` (default 1901) to its
    ``end_year`` (default 2100), but past the data it holds it answers "not a holiday" silently, so
    ``last`` is the earliest of, per entity (each operand of ``US-IRS``):

    * the entity's declared ``end_year`` (2100 by default; Sri Lanka's 2026, the end of its
      Poya-day tables; Japan's 2099): nothing after it;
    * the last year of each date table its lunar/lunisolar calendars read for this year and the
      next (``today``: default the current date): India's Hindu tables end 2035, after which the
      library drops Diwali and Holi with a ``UserWarning`` only. Tables of dates the library itself
      calls estimated (Islamic, Chinese) count as data, being the release's best knowledge;
    * for a country whose weekend working days and bridged days are set by yearly decree (CN, RU,
      BY, KZ, UZ, VN, HU, LV, …), the last year its ``special_public_holidays`` lists a substituted
      day for: the release has no marker of which decrees it holds, and a year without listed
      transfers in such a country means the decree was not yet published when the release was
      made (CN lists 2026; a 2027 roll would ignore the 2027 State Council notice). A country counts
      as such while that year is within :data:`DECREE_LAPSE_YEARS` of the newest year any country of
      the release lists (Russia's 2027): older transfers (Ukraine's 2022) are history, not a practice.

    Where the release says nothing per year, its declared ``end_year`` stands: no data is invented.
    Cached per spec and year (a few milliseconds each).
    """
    return _library_coverage(spec, (today or date.today()).year)


@lru_cache(maxsize=64)
def _library_coverage(spec: str, year: int) -> LibraryCoverage:
    entities = _members(library_calendar(spec))
    first = max(e.start_year for e in entities)
    last, why = min((e.end_year, f"{e.country if hasattr(e, 'country') else e.market} holidays end with the "
                     f"release's declared end year {e.end_year}") for e in entities)
    for e in entities:
        code = getattr(e, "country", None) or getattr(e, "market", "")
        table = _table_last_year(e, range(year, year + 2))
        if table is not None and table[0] < last:
            last, why = table[0], f"{code} dates of this release's {table[1]} table end {table[0]}"
        decree = _decree_last_year(e)
        if decree is not None and decree >= _newest_decree_year() - DECREE_LAPSE_YEARS and decree < last:
            last, why = decree, (f"{code} weekend working days and bridged days are set by yearly decree; "
                                 f"this release lists them to {decree}")
    return LibraryCoverage(first, last, why)
