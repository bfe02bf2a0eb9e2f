"""Business-day conventions and holiday calendars (the ``holidays`` library, or an ingested date set),
and the years an ingested holiday file covers: a due date rolled past them is a planning problem
(real store and planning, SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import date, timedelta

import holidays
import pytest

from deadline_pipeline.plan import business_days
from deadline_pipeline.plan.business_days import (
    CONVENTIONS,
    DateSetCalendar,
    HolidayCalendar,
    UnionCalendar,
    UnknownCalendar,
    adjust,
    calendar,
    describe_roll,
    holiday_source_of,
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



# Weekend working days: the Saturdays and Sundays a government makes working days when it moves a
# working day to bridge a holiday. The holidays library lists them (HolidayBase.weekend_workdays).
# Five countries that have them in 2024-2027 (Ukraine has suspended its transfers since 2022).
WORKING_WEEKEND_COUNTRIES = ("RU", "CN", "BY", "KZ", "UZ")


def test_a_worked_saturday_in_russia_is_not_rolled():
    ru = calendar("RU")
    saturday = date(2024, 4, 27)  # worked: Monday 29 April 2024 is the day off in its place
    assert saturday.weekday() == 5 and ru.is_working_day(saturday)
    assert adjust(saturday, "following", ru) == saturday
    assert adjust(saturday, "preceding", ru) == saturday
    assert adjust(saturday, "modified-following", ru) == saturday


@pytest.mark.parametrize("convention", ["following", "preceding"])
def test_a_worked_sunday_after_the_chinese_spring_festival_is_not_rolled(convention):
    cn = calendar("CN")
    sunday = date(2024, 2, 18)  # worked; the Spring Festival days off ran 10-17 February 2024
    cn.get(sunday)  # fills 2024 in, weekend_workdays with it
    assert sunday.weekday() == 6 and sunday in cn.weekend_workdays
    assert adjust(sunday, convention, cn) == sunday


def test_a_roll_that_lands_on_a_weekend_working_day_says_it_is_one():
    cn, ru = calendar("CN"), calendar("RU")
    assert adjust(date(2024, 2, 17), "following", cn) == date(2024, 2, 18)  # Saturday off -> Sunday worked
    assert describe_roll(date(2024, 2, 17), date(2024, 2, 18), "CN", "following") == (
        "Saturday 17 Feb falls on a weekend; due Sunday 18 Feb, a working day (CN following)")
    assert adjust(date(2024, 4, 29), "preceding", ru) == date(2024, 4, 27)  # Monday off -> Saturday worked
    assert describe_roll(date(2024, 4, 29), date(2024, 4, 27), "RU", "preceding") == (
        "Monday 29 Apr is a holiday (Day off (substituted from 04/27/2024)); "
        "due Saturday 27 Apr, a working day (RU preceding)")


def _library_roll(lib: holidays.HolidayBase, day: date, convention: str) -> date:
    # The library's own stepping: n = 0 is "this day if working, else the next working day".
    if convention == "following":
        return lib.get_nth_working_day(day, 0)
    return day if lib.is_working_day(day) else lib.get_nth_working_day(day, -1)


@pytest.mark.parametrize("country", WORKING_WEEKEND_COUNTRIES)
def test_rolls_agree_with_the_library_on_every_day_of_2024_to_2027(country):
    lib = holidays.country_holidays(country)  # a fresh instance, not the one adjust() uses
    cal = calendar(country)
    days = [date(2024, 1, 1) + timedelta(days=i) for i in range((date(2028, 1, 1) - date(2024, 1, 1)).days)]
    lib.get(days[0])
    assert any(d.year >= 2024 for d in lib.weekend_workdays)  # the comparison covers the kind
    wrong = [(d, conv) for d in days for conv in ("following", "preceding")
             if adjust(d, conv, cal) != _library_roll(lib, d, conv)]
    assert wrong == []


def test_us_irs_is_the_library_sum_of_federal_and_dc_holidays():
    irs = calendar("US-IRS")
    assert isinstance(irs, holidays.HolidaySum)
    assert not irs.is_working_day(date(2028, 4, 17))  # observed Emancipation Day (DC only)
    assert irs.is_working_day(date(2028, 4, 18))
    assert not calendar("US").is_working_day(date(2028, 4, 15))  # Saturday
    assert describe_roll(date(2028, 4, 17), date(2028, 4, 18), "US-IRS", "following") == (
        "Monday 17 Apr is a holiday (Emancipation Day (observed)); due Tuesday 18 Apr (IRC §7503 following)")


def test_a_union_keeps_a_library_members_weekend_working_days():
    ingested = {date(2024, 4, 26)}  # an ingested extra day off
    union = UnionCalendar((calendar("RU"), ingested))
    assert adjust(date(2024, 4, 27), "following", union) == date(2024, 4, 27)
    assert adjust(date(2024, 4, 26), "following", union) == date(2024, 4, 27)
    assert adjust(date(2024, 4, 28), "preceding", union) == date(2024, 4, 27)
    plain = UnionCalendar(({date(2024, 4, 26)}, DateSetCalendar(frozenset({date(2024, 4, 29)}))))
    assert adjust(date(2024, 4, 26), "following", plain) == date(2024, 4, 30)  # Saturday/Sunday + both sets


def test_calendar_data_version_names_the_library_release():
    assert business_days.calendar_data_version() == f"holidays {holidays.__version__}"


def test_a_source_spec_names_the_holiday_source_and_its_division():
    """``source:NAME[/DIVISION]`` names an ingested holiday source; any other spec is a library calendar."""
    assert holiday_source_of("source:uk-holidays/england-and-wales") == ("uk-holidays", "england-and-wales")
    assert holiday_source_of("source:hols") == ("hols", "")
    assert holiday_source_of("source:hols").name == "hols"
    assert holiday_source_of("GB-ENG") is None
    assert holiday_source_of("US-IRS") is None


def test_a_calendar_knows_the_years_it_covers_and_reports_the_earliest_due_date_past_them():
    """A date set covering 2026-2027: rolled due dates past 2027 are rolled for weekends alone, the
    report is published once and names the earliest, whatever order they are rolled in. Only the
    date a roll settles on counts: Saturday 1 January 2028 rolled back over a holiday on Friday 31
    December to Thursday 30 December 2027 is covered, and so is a modified-following roll from that
    Friday into January 2028, sent back into December."""
    from types import SimpleNamespace

    published = []
    report = SimpleNamespace(message="")
    cal = DateSetCalendar(frozenset({date(2026, 5, 4), date(2027, 5, 3), date(2027, 12, 31)}), coverage=(
        cov := business_days.Coverage(2026, 2027, "source:ukh/england-and-wales", report, published.append)))
    assert cal == DateSetCalendar(cal.dates)  # the coverage is no part of the calendar's identity
    assert adjust(date(2027, 5, 3), "preceding", cal) == date(2027, 4, 30)
    assert adjust(date(2028, 1, 1), "preceding", cal) == date(2027, 12, 30)
    assert adjust(date(2027, 12, 31), "modified-following", cal) == date(2027, 12, 30)
    assert cov.uncovered is None and published == [] and report.message == ""
    assert adjust(date(2028, 6, 3), "following", cal) == date(2028, 6, 5)  # weekend only
    assert adjust(date(2028, 6, 30), "preceding", cal) == date(2028, 6, 30)
    assert adjust(date(2028, 5, 1), "preceding", cal) == date(2028, 5, 1)  # Early May 2028: unknown
    assert published == [report] and cov.uncovered == date(2028, 5, 1)
    assert report.message == (
        "business-day calendar 'source:ukh/england-and-wales' has holidays for 2026-2027 only; due dates from "
        "2028-05-01 on are rolled for weekends alone: ingest a newer holiday file, or shorten plan.horizon_days")
    assert adjust(date(2028, 5, 1), "none", cal) == date(2028, 5, 1)
    assert adjust(date(2025, 1, 1), "preceding", cal) == date(2025, 1, 1)  # before the data: not judged
    assert published == [report] and cov.uncovered == date(2028, 5, 1)


# GOV.UK's bank-holidays.json ended 2027-12-28 while planning reached Monday 1 May 2028 (Early May
# bank holiday): a ``preceding`` filing stayed on the holiday, its PT0S reminder three days after the
# real deadline (Friday 28 April), with no log line and every check green. A small file in the
# current GOV.UK schema: England & Wales to 2027, Scotland to 2028 (the years are the division's own).
GOVUK_TO_2027 = {
    "england-and-wales": {"division": "england-and-wales", "events": [
        {"title": title, "date": day, "notes": "", "bunting": True} for title, day in [
            ("New Year’s Day", "2026-01-01"), ("Early May bank holiday", "2026-05-04"),
            ("Christmas Day", "2026-12-25"), ("Boxing Day", "2026-12-28"), ("New Year’s Day", "2027-01-01"),
            ("Early May bank holiday", "2027-05-03"), ("Christmas Day", "2027-12-27"),
            ("Boxing Day", "2027-12-28")]]},
    "scotland": {"division": "scotland", "events": [
        {"title": "New Year’s Day", "date": "2028-01-03", "notes": "Substitute day", "bunting": True}]},
}


def _rolled_over_govuk(tmp_path, filings: str):
    """A ``govuk-bank-holidays`` source of :data:`GOVUK_TO_2027` and a ``filings`` CSV (``filings``: its
    rows, ``id,due``, 12:00 Europe/London) rolled ``preceding`` over its England & Wales holidays."""
    import json

    from deadline_pipeline.config import load_config
    from deadline_pipeline_tests.factories import write_config

    (tmp_path / "holidays.json").write_text(json.dumps(GOVUK_TO_2027))
    rows = "".join(f"{rid},Filing {rid},{due}T12:00:00,Europe/London\n" for rid, due in
                   (line.split(",") for line in filings.split()))
    (tmp_path / "filings.csv").write_text("id,title,due,timezone\n" + rows)
    return load_config(write_config(
        tmp_path,
        sources=[{"name": "ukh", "format": "govuk-bank-holidays", "location": "holidays.json"},
                 {"name": "filings", "format": "csv", "location": "filings.csv",
                  "business_days": {"calendar": "source:ukh/england-and-wales", "convention": "preceding"}}],
        subscribers=[{"id": "ann", "email": "ann@example.org", "timezone": "Europe/London"},
                     {"id": "bob", "email": "bob@example.org", "timezone": "Europe/London"}],
        subscriptions=[{"name": "s", "sources": ["filings"], "offsets": ["PT0S"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    ))[0]


def _plan_and_record(engine, cfg, now):
    """Ingest every source, plan, and record the run as the ``plan_obligations`` asset does."""
    from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
    from deadline_pipeline.plan.service import plan_all, record_plan_run

    for src in cfg.sources:
        fetch_snapshot(engine, src, now)
        apply_latest_snapshot(engine, src, now)
    out = plan_all(engine, cfg, now)
    record_plan_run(engine, "plan", started_at=now, completed_at=now, label="test", problems=out.problems,
                    counts=out.heartbeat_counts())
    return out


def _dues(engine) -> dict[str, set[str]]:
    """rule id → the London dates of its obligations' due instants."""
    from sqlalchemy import select

    from deadline_pipeline.store.schema import obligations
    from deadline_pipeline.timezones import resolve_zone

    london = resolve_zone("Europe/London")
    with engine.connect() as conn:
        rows = conn.execute(select(obligations.c.rule_id, obligations.c.due_at)).all()
    dues: dict[str, set[str]] = {}
    for rule_id, due in rows:
        dues.setdefault(rule_id, set()).add(due.astimezone(london).date().isoformat())
    return dues


def test_a_due_date_past_the_holiday_files_last_year_is_reported_not_rolled_silently(engine, tmp_path):
    """Holidays of England & Wales to 2027 (Scotland's 2028 day is another division's). Christmas 2027
    (Monday 27 December, a holiday) rolls back to Friday 24 December: no problem. Monday 1 May 2028
    and Saturday 3 June 2028 are past the data: rolled for weekends alone (1 May stays, 3 June goes
    to Friday 2 June), and planning reports it once for the source, for two subscribers and two
    rules, naming the calendar, its years and the first uncovered due date (1 May, though the June
    filing comes first); plan_complete is red. A due date on Saturday 1 January 2028 rolls back to
    Friday 31 December 2027, which the data covers: no problem from it alone."""
    from datetime import UTC, datetime

    from deadline_pipeline.watch import checks as w

    now = datetime(2027, 7, 1, tzinfo=UTC)
    cfg = _rolled_over_govuk(tmp_path, "a-jun,2028-06-03 b-may,2028-05-01 xmas,2027-12-27 ny,2028-01-01")
    out = _plan_and_record(engine, cfg, now)
    assert _dues(engine) == {"a-jun": {"2028-06-02"}, "b-may": {"2028-05-01"}, "xmas": {"2027-12-24"},
                             "ny": {"2027-12-31"}}
    assert [(p.source, p.rule_id) for p in out.problems] == [("filings", "*")], out.problems
    assert out.problems[0].message == (
        "business-day calendar 'source:ukh/england-and-wales' has holidays for 2026-2027 only; due dates from "
        "2028-05-01 on are rolled for weekends alone: ingest a newer holiday file, or shorten plan.horizon_days")
    check = w.plan_complete(engine, now)
    assert not check.passed and "2026-2027" in check.summary and "2028-05-01" in check.summary, check.summary


def test_due_dates_the_holiday_file_covers_raise_no_problem(engine, tmp_path):
    """The same source with due dates in 2027 only (Tuesday 28 December 2027, Boxing Day, rolls back
    to Friday 24 December) and one whose weekend roll ends in 2027: no problem, plan_complete green."""
    from datetime import UTC, datetime

    from deadline_pipeline.watch import checks as w

    now = datetime(2027, 7, 1, tzinfo=UTC)
    out = _plan_and_record(engine, _rolled_over_govuk(tmp_path, "boxing,2027-12-28 ny,2028-01-01"), now)
    assert _dues(engine) == {"boxing": {"2027-12-24"}, "ny": {"2027-12-31"}}
    assert out.problems == [] and out.calendar_decree_notes == {}
    check = w.plan_complete(engine, now)
    assert check.passed and check.metadata["calendar_decree_notes"] == 0, check


# Library calendars: past the installed holidays release's declared end year the library answers
# "not a holiday" silently (Sri Lanka's calendar ends 2026 in holidays 0.109): a roll there is a
# planning problem, as past an ingested holiday file. China's working weekends and bridged days
# come from the State Council's yearly notice; 0.109 lists them to 2026, so a 2027 roll ignores the
# 2027 notice, if it moved days: noted (logged, counted, said by plan_complete), not red, since a
# country may move no day in a year (Kazakhstan, Taiwan list none for 2026 in 0.109). The years are
# read from the installed release, so a newer release moves them, not the tests.


def test_a_library_calendar_reports_a_due_date_past_its_declared_end_year():
    """LK: covered to the release's declared end year (2026 in 0.109), after which the library knows
    nothing; a roll judged there is reported once, naming the calendar, the year, the release and
    both remedies; a covered roll is not."""
    from types import SimpleNamespace

    from deadline_pipeline.holiday_calendars import library_coverage

    end = holidays.country_holidays("LK").end_year
    assert end < 2100 and library_coverage("LK").last == end and library_coverage("LK").decrees is None
    published, report = [], SimpleNamespace(message="")
    lk = business_days.covered_calendar("LK", report, published.append)
    assert lk.decrees is None
    covered = next(date(end, 12, d) for d in range(14, 22) if lk.is_working_day(date(end, 12, d)))
    assert adjust(covered, "following", lk) == covered
    assert published == [] and report.message == ""
    late = next(date(end + 1, 1, d) for d in range(2, 9) if date(end + 1, 1, d).weekday() == 0)
    assert adjust(late, "following", lk) == late
    assert published == [report] and lk.coverage.uncovered == late
    assert report.message == (
        f"business-day calendar 'LK' (holidays {holidays.__version__}) has holidays for 2003-{end} only (LK holidays "
        f"end with the release's declared end year {end}); due dates from {late.isoformat()} on are rolled without "
        f"{end + 1} data: upgrade holidays, or ingest an official {end + 1} holiday file (business_days.calendar: "
        "source:NAME)")
    assert not holidays.country_holidays("LK", years=end + 1)  # the library knows nothing
    assert adjust(late + timedelta(days=7), "preceding", lk) == late + timedelta(days=7)
    assert published == [report]


def test_a_decree_calendar_notes_a_due_date_past_its_listed_decrees_without_reporting_it():
    """CN: holidays to 2100, decreed moved days listed to the last year the release has a worked
    weekend day for (2026 in 0.109); a roll the year after calls ``note`` once (spec, that year, a
    message naming the calendar, the year, the release and the remedies) and reports no problem;
    a covered roll notes nothing. RU lists its 2027 production calendar in 0.109: 2027 is not noted."""
    from types import SimpleNamespace

    from deadline_pipeline.holiday_calendars import library_coverage

    known = library_coverage("CN")
    cn = holidays.country_holidays("CN", years=range(known.decrees - 1, known.decrees + 3))
    assert known.last == holidays.country_holidays("CN").end_year and known.decrees < known.last
    assert any(d.year == known.decrees for d in cn.weekend_workdays)
    assert not any(d.year > known.decrees for d in cn.weekend_workdays)
    published, report, noted = [], SimpleNamespace(message=""), []
    cal = business_days.covered_calendar("CN", report, published.append,
                                         lambda *said: noted.append(said))
    worked = max(d for d in cn.weekend_workdays if d.year == known.decrees)
    assert adjust(worked, "following", cal) == worked  # a listed worked weekend day is a business day
    assert noted == []
    late = date(known.decrees + 1, 3, 15)  # a Monday
    assert adjust(late, "following", cal) == late
    assert adjust(late + timedelta(days=7), "preceding", cal) == late + timedelta(days=7)
    assert published == [] and report.message == "" and cal.coverage.uncovered is None
    year = known.decrees + 1
    assert noted == [("CN", known.decrees, (
        f"business-day calendar 'CN' (holidays {holidays.__version__}) lists the yearly decree's worked weekends "
        f"and bridged days off to {known.decrees} only; due dates from {late.isoformat()} on are rolled as if "
        f"{year} moved no day: if a {year} decree moved days, upgrade holidays or ingest the official {year} "
        "holiday file (business_days.calendar: source:NAME)"))]

    ru = business_days.covered_calendar("RU", note=lambda *said: noted.append(said))
    assert ru.decrees.last >= 2027 and adjust(date(2027, 3, 6), "following", ru) == date(2027, 3, 9)
    assert len(noted) == 1  # 8 March 2027 is Women's Day, rolled to Tuesday 9 March


def test_library_coverage_judges_only_declared_years_and_live_decree_practice():
    """India's Hindu date tables end 2035 in 0.109 (a known limit, beyond a planning horizon for
    years): not judged, its coverage is the declared end year. US-IRS (US + DC, no yearly decrees)
    is covered to the release's declared end year (2100). Ukraine listed worked weekend days until
    it suspended transfers in 2022: history, not a practice, so nothing is noted for it."""
    from deadline_pipeline.holiday_calendars import library_coverage

    assert library_coverage("IN") == (holidays.country_holidays("IN").start_year,
                                      holidays.country_holidays("IN").end_year,
                                      f"IN holidays end with the release's declared end year "
                                      f"{holidays.country_holidays('IN').end_year}", None)
    assert library_coverage("US-IRS").last == holidays.country_holidays("US").end_year
    assert library_coverage("US-IRS").decrees is None
    assert library_coverage("UA").last == holidays.country_holidays("UA").end_year
    assert library_coverage("UA").decrees is None


def _rolled_over_library(tmp_path, calendars: dict[str, str], zone: str, dues: list[date]):
    """One ``filings``-like CSV source per entry of ``calendars`` (source name → library calendar
    spec), each of one rule per date of ``dues`` (id ``f<n>``, 12:00 in ``zone``), rolled
    ``following`` over its calendar, for one subscriber."""
    from deadline_pipeline.config import load_config
    from deadline_pipeline_tests.factories import write_config

    rows = "".join(f"f{n},Filing {n},{due.isoformat()}T12:00:00,{zone}\n" for n, due in enumerate(dues))
    for name in calendars:
        (tmp_path / f"{name}.csv").write_text("id,title,due,timezone\n" + rows)
    return load_config(write_config(
        tmp_path,
        sources=[{"name": name, "format": "csv", "location": f"{name}.csv",
                  "business_days": {"calendar": spec, "convention": "following"}} for name, spec in calendars.items()],
        subscribers=[{"id": "ann", "email": "ann@example.org", "timezone": zone}],
        subscriptions=[{"name": "s", "sources": list(calendars), "offsets": ["PT0S"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    ))[0]


def test_a_due_date_past_the_listed_decrees_is_noted_once_per_calendar_and_plan_complete_stays_green(
        engine, tmp_path, caplog):
    """CN due dates the year after the release's last decree year (2027 in holidays 0.109, inside
    the horizon on 6 December of the year before), in two sources on CN: planned, rolled as the
    library answers (Saturday to Monday), no planning problem; logged once at WARNING, naming CN,
    the year, the release and the remedies; plan_complete green, counting one calendar and naming
    it, the year listed to, the release and the remedies."""
    from datetime import UTC, datetime

    from deadline_pipeline.holiday_calendars import library_coverage
    from deadline_pipeline.watch import checks as w

    listed = library_coverage("CN").decrees
    year = listed + 1
    now = datetime(year - 1, 12, 6, tzinfo=UTC)
    saturday = next(date(year, 3, d) for d in range(1, 8) if date(year, 3, d).weekday() == 5)
    cfg = _rolled_over_library(tmp_path, {"filings": "CN", "returns": "cn"}, "Asia/Shanghai", [saturday])
    with caplog.at_level("WARNING", logger="deadline_pipeline.plan.outcome"):
        out = _plan_and_record(engine, cfg, now)
    assert out.problems == [] and out.calendar_decree_notes == {"CN": listed}
    said = [r for r in caplog.records if "yearly decree" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING", caplog.records
    message = said[0].getMessage()
    assert message.startswith(f"planning: business-day calendar 'CN' (holidays {holidays.__version__}) lists the "
                              f"yearly decree's worked weekends and bridged days off to {listed} only"), message
    assert f"due dates from {(saturday + timedelta(days=2)).isoformat()} on are rolled as if {year} moved" in message
    assert f"upgrade holidays or ingest the official {year} holiday file" in message
    check = w.plan_complete(engine, now)
    assert check.passed and check.metadata["calendar_decree_notes"] == 1, check
    assert check.metadata["decrees_listed_to"] == {"CN": listed}, check
    assert (f"1 business-day calendar(s) of yearly decree countries rolled due dates past the last year "
            f"holidays {holidays.__version__} lists their worked weekends and bridged days off for (CN to {listed})"
            in check.summary), check.summary
    assert "upgrade holidays, or ingest the official holiday file for that year" in check.summary, check.summary
    assert _due_dates(engine) == [saturday + timedelta(days=2)] * 2


def test_a_due_date_past_a_library_calendars_declared_end_year_turns_plan_complete_red(engine, tmp_path):
    """LK due dates the year after the release's declared end year (2027 in holidays 0.109):
    planned, reported once for the source, naming LK, the year, the release and the remedies;
    plan_complete red and says so; no decree note."""
    from datetime import UTC, datetime

    from deadline_pipeline.watch import checks as w

    year = holidays.country_holidays("LK").end_year + 1
    now = datetime(year - 1, 12, 6, tzinfo=UTC)
    monday = next(date(year, 1, d) for d in range(2, 9) if date(year, 1, d).weekday() == 0)
    out = _plan_and_record(engine, _rolled_over_library(tmp_path, {"filings": "LK"}, "Asia/Colombo", [monday]), now)
    assert [(p.source, p.rule_id) for p in out.problems] == [("filings", "*")], out.problems
    message = out.problems[0].message
    assert message.startswith(f"business-day calendar 'LK' (holidays {holidays.__version__}) has holidays for "
                              f"2003-{year - 1} only"), message
    assert f"due dates from {monday.isoformat()} on are rolled without {year} data" in message
    assert f"upgrade holidays, or ingest an official {year} holiday file" in message
    check = w.plan_complete(engine, now)
    assert not check.passed and f"{year} data" in check.summary, check.summary
    assert check.metadata["calendar_decree_notes"] == 0 and out.calendar_decree_notes == {}
    assert _due_dates(engine) == [monday]


def _due_dates(engine) -> list[date]:
    """The UTC dates of every obligation's due instant (12:00 in Shanghai, Colombo or Moscow: the local date)."""
    from datetime import UTC

    from sqlalchemy import select

    from deadline_pipeline.store.schema import obligations

    with engine.connect() as conn:
        return sorted(d.astimezone(UTC).date() for d in conn.execute(select(obligations.c.due_at)).scalars())


def test_due_dates_the_library_release_covers_raise_no_problem(engine, tmp_path):
    """RU due dates in 2027, the year of the production calendar holidays 0.109 lists (Saturday 6
    March before Women's Day on Monday 8 March rolls to Tuesday 9 March): no problem, no note,
    plan_complete green."""
    from datetime import UTC, datetime

    from deadline_pipeline.holiday_calendars import library_coverage
    from deadline_pipeline.watch import checks as w

    assert library_coverage("RU").decrees >= 2027
    now = datetime(2026, 12, 6, tzinfo=UTC)
    out = _plan_and_record(engine, _rolled_over_library(tmp_path, {"filings": "RU"}, "Europe/Moscow",
                                                        [date(2027, 3, 6)]), now)
    assert _due_dates(engine) == [date(2027, 3, 9)]
    assert out.problems == [] and out.calendar_decree_notes == {}
    check = w.plan_complete(engine, now)
    assert check.passed and check.metadata["calendar_decree_notes"] == 0, check
