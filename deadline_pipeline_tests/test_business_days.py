"""Business-day conventions and holiday calendars (the ``holidays`` library, or an ingested date set)."""

from __future__ import annotations

from datetime import date

import pytest

from deadline_pipeline.plan.business_days import (
    CONVENTIONS,
    DateSetCalendar,
    HolidayCalendar,
    UnknownCalendar,
    adjust,
    calendar,
    is_business_day,
)


def test_irc_7503_example_2028_rolls_over_saturday_and_observed_emancipation_day():
    irs = calendar("US-IRS")
    assert date(2028, 4, 15).weekday() == 5  # Saturday
    assert date(2028, 4, 17) in irs  # DC Emancipation Day (16 April, a Sunday) observed on Monday
    assert adjust(date(2028, 4, 15), "following", irs) == date(2028, 4, 18)


@pytest.mark.parametrize("due, expected", [
    (date(2022, 4, 15), date(2022, 4, 18)),  # Friday: Emancipation Day observed (16th is a Saturday)
    (date(2023, 4, 15), date(2023, 4, 18)),  # Saturday; Monday 17th is the observed Emancipation Day
    (date(2024, 4, 15), date(2024, 4, 15)),  # an ordinary Monday
    (date(2029, 4, 15), date(2029, 4, 17)),  # Sunday; Monday 16th is Emancipation Day itself
])
def test_us_irs_tax_day_over_the_years(due, expected):
    assert adjust(due, "following", calendar("US-IRS")) == expected


def test_plain_us_federal_calendar_does_not_know_dc_emancipation_day():
    assert adjust(date(2028, 4, 15), "following", calendar("US")) == date(2028, 4, 17)


def test_conventions_on_a_month_end_weekend():
    gb = calendar("GB-ENG")
    saturday = date(2026, 10, 31)
    assert adjust(saturday, "none", gb) == saturday
    assert adjust(saturday, "following", gb) == date(2026, 11, 2)
    assert adjust(saturday, "preceding", gb) == date(2026, 10, 30)
    assert adjust(saturday, "modified-following", gb) == date(2026, 10, 30)  # never into the next month
    assert adjust(date(2026, 10, 3), "modified-following", gb) == date(2026, 10, 5)


def test_subdivision_holidays_are_used():
    good_friday, easter_monday = date(2028, 4, 14), date(2028, 4, 17)
    assert adjust(good_friday, "following", calendar("GB-ENG")) == date(2028, 4, 18)
    assert easter_monday in calendar("GB-ENG")
    assert easter_monday not in calendar("GB-SCT")  # Scotland has no Easter Monday bank holiday


def test_an_ingested_set_of_dates_is_a_calendar():
    holidays = {date(2026, 12, 24), date(2026, 12, 25)}
    assert isinstance(holidays, HolidayCalendar)
    assert adjust(date(2026, 12, 24), "following", holidays) == date(2026, 12, 28)
    assert adjust(date(2026, 12, 25), "preceding", calendar(holidays)) == date(2026, 12, 23)
    assert adjust(date(2026, 12, 24), "following", calendar(iter(holidays))) == date(2026, 12, 28)


def test_a_calendar_may_declare_another_weekend():
    fri_sat = DateSetCalendar(frozenset(), weekend=frozenset({4, 5}))
    assert not is_business_day(date(2026, 5, 1), fri_sat)  # Friday
    assert is_business_day(date(2026, 5, 3), fri_sat)  # Sunday
    assert adjust(date(2026, 5, 1), "following", fri_sat) == date(2026, 5, 3)


def test_unknown_calendar_and_convention_are_refused_by_name():
    with pytest.raises(UnknownCalendar, match="'XX'"):
        calendar("XX")
    with pytest.raises(UnknownCalendar, match="US-ZZ"):
        calendar("US-ZZ")
    with pytest.raises(ValueError, match="'nearest'"):
        adjust(date(2026, 1, 1), "nearest", calendar("US"))
    assert adjust(date(2026, 1, 3), "modified_following", calendar("US")) == date(2026, 1, 5)
    assert set(CONVENTIONS) == {"none", "following", "modified-following", "preceding"}


def test_a_calendar_without_business_days_is_an_error_not_a_hang():
    everything = DateSetCalendar(frozenset(), weekend=frozenset(range(7)))
    with pytest.raises(ValueError, match="no business day"):
        adjust(date(2026, 1, 1), "following", everything)


def test_financial_calendar():
    nyse = calendar("NYSE")
    assert date(2026, 4, 3) in nyse  # Good Friday: markets closed, not a federal holiday
