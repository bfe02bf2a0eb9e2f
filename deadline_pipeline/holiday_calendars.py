"""Holiday calendars of the ``holidays`` library by name: the spec grammar and the lookup.

A leaf module (it imports only the ``holidays`` library): the configuration checks a
``business_days.calendar`` name here when it is loaded, and the planner
(:mod:`deadline_pipeline.plan.business_days`) builds its calendars from the same lookup, so the two
can never disagree about which names exist. The other spec form, ``source:NAME[/DIVISION]`` (an
ingested holiday source), is parsed here too (:func:`holiday_source_of`), for the same reason.
"""

from __future__ import annotations

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
    """What the installed ``holidays`` release knows of a calendar spec, in calendar years.

    ``first`` to ``last`` (inclusive): the years it has holidays for at all (past ``last`` it answers
    "not a holiday" for every date); ``why``: why they end at ``last``, words for a report
    (``"LK holidays end with the release's declared end year 2026"``). ``decrees``: for a country
    whose weekend working days and bridged days are set by yearly decree, the last year this release
    lists such a moved day for (``2026`` for CN in holidays 0.109); ``None`` for any other calendar.
    Past ``decrees`` the release may lack a decree, or the country may have moved no day that year:
    the release cannot tell the two apart."""

    first: int
    last: int
    why: str
    decrees: int | None = None


# A country whose newest listed weekend working day is more than this many years older than the
# newest such day any country of the release lists no longer transfers working days: Ukraine
# suspended its transfers under martial law in 2022 (last listed 2022), Armenia's end 2021 and
# Bulgaria's 2016. Judging them by their last listed year would note every later year of a
# calendar the release has complete.
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


def _members(cal) -> list:
    import holidays

    # US-IRS is a HolidaySum: its data ends where the first of its operands' ends.
    return list(cal.holidays) if isinstance(cal, holidays.HolidaySum) else [cal]


@lru_cache(maxsize=64)
def library_coverage(spec: str) -> LibraryCoverage:
    """What the installed ``holidays`` release knows of calendar ``spec`` (as :func:`library_calendar`
    takes it), cached per spec. Raises :class:`UnknownCalendar` as that does.

    The library answers every year from its entity's ``start_year`` (default 1901) to its
    ``end_year`` (default 2100), so ``first``/``last`` are the latest declared start and the earliest
    declared end of the spec's entities (each operand of ``US-IRS``): Sri Lanka's 2026, the end of
    its Poya-day tables, Japan's 2099. Both are public attributes the release declares; past
    ``last`` nothing is known, a fact.

    ``decrees``, for a country whose weekend working days and bridged days are set by yearly decree
    (CN, RU, BY, KZ, UZ, VN, HU, LV, …): the last year its ``special_public_holidays`` lists a
    substituted day for. An inference, not a fact: a year without listed transfers may be a decree
    published after the release was made (CN lists 2026; a 2027 roll would ignore the 2027 State
    Council notice) or a year in which the government moved no day (KZ, KG, TW, AZ and MM list none
    for 2026 in 0.109), so it is for a note, not an alarm. A country counts as such while that year
    is within :data:`DECREE_LAPSE_YEARS` of the newest year any country of the release lists
    (Russia's 2027): older transfers (Ukraine's 2022) are history, not a practice.

    Known limit: the lunar and lunisolar date tables the library reads end too, silently past their
    last year (India's Hindu dates end 2035 in 0.109: Diwali and Holi dropped with a ``UserWarning``
    only). The release declares those ends nowhere public, and they lie beyond a year's planning
    horizon for years, so they are not judged here.
    """
    entities = _members(library_calendar(spec))
    first = max(e.start_year for e in entities)
    last, why = min((e.end_year, f"{_code(e)} holidays end with the release's declared end year {e.end_year}")
                    for e in entities)
    listed = [_decree_last_year(e) for e in entities]
    decrees = min((y for y in listed if y is not None and y >= _newest_decree_year() - DECREE_LAPSE_YEARS),
                  default=None)
    # Past ``last`` nothing is known at all, which the red coverage already says.
    return LibraryCoverage(first, last, why, decrees if decrees is not None and decrees < last else None)


def _code(entity) -> str:
    return getattr(entity, "country", None) or getattr(entity, "market", "")
