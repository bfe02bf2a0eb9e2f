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
