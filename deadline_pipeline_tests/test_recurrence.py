"""Recurrence: the strict/lenient RRULE parser, UNTIL rules, DST policy, horizon, ICS sets and overrides.

The shared cases (``../shared/cases/recurrence_and_delivery_cases.json``, bugs taken from public
reports against calendar and scheduler software) are read from the file and checked against their
exact expected output; the hand-written cases around them pin the policies the cases leave open.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import icalendar
import pytest
import recurring_ical_events
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deadline_pipeline.ingest.parsers.csv_format import parse_csv
from deadline_pipeline.ingest.parsers.ics import parse_ics
from deadline_pipeline.plan import occurrences
from deadline_pipeline.plan.occurrences import GRACE, HORIZON, MAX_OCCURRENCES, expand, normalise_until, window
from deadline_pipeline.plan.recurrence import (
    RRuleError,
    apply_overrides,
    merge_until,
    parse_rrule,
    to_instant,
    until_bound,
    validate_rrule,
)
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.timezones import resolve_zone

FAR_PAST = datetime(1990, 1, 1, tzinfo=UTC)
FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)
NY = ZoneInfo("America/New_York")


@pytest.fixture(scope="module")
def cases(shared_dir) -> dict[str, dict]:
    data = json.loads((shared_dir / "cases" / "recurrence_and_delivery_cases.json").read_text())
    return {c["id"]: c for c in data}


def rule_from(dtstart: str, rrule: str | None = None, *, rule_id: str = "r", exdates=(), rdates=()) -> RuleRecord:
    """A RuleRecord from an ICS-style DTSTART (``DTSTART;TZID=…:…``, ``…Z``, ``VALUE=DATE``, floating)."""
    head, _, value = dtstart.rpartition(":") if dtstart.startswith("DTSTART") else ("", "", dtstart)
    tz = None
    for param in head.split(";")[1:]:
        if param.upper().startswith("TZID="):
            tz = param[5:]
    if len(value) == 8:
        start = date(int(value[:4]), int(value[4:6]), int(value[6:8])).isoformat()
    else:
        moment = datetime.strptime(value.rstrip("Z"), "%Y%m%dT%H%M%S")
        start = moment.isoformat()
        if value.endswith("Z"):
            tz = "UTC"
    return RuleRecord(rule_id, "t", start, tz, rrule, tuple(exdates), tuple(rdates))


def instants(rule: RuleRecord, zone=None, **kw) -> list[datetime]:
    zone = zone or resolve_zone(rule.tz)
    kw.setdefault("after", FAR_PAST)
    kw.setdefault("before", FAR_FUTURE)
    return [o.due_at for o in expand(rule, zone, **kw)]


def iso_utc(values: list[str]) -> list[datetime]:
    return [datetime.fromisoformat(v).astimezone(UTC) for v in values]


# --- strict and lenient postures ---------------------------------------------------------------


def test_c03_every_rule_is_rejected_naming_the_part(cases):
    case = cases["C03"]
    named = {0: "COUNT and UNTIL", 1: "UNTIL appears more than once", 2: "FREQ appears more than once",
             3: "BYMONTH appears more than once"}
    for i, text in enumerate(case["input"]["rules"]):
        with pytest.raises(RRuleError, match=named[i]):
            validate_rrule(text)


def test_c03_rules_never_become_active_at_ingest(cases):
    case = cases["C03"]
    for i, text in enumerate(case["input"]["rules"]):
        ics = (f"BEGIN:VCALENDAR\r\nVERSION:2.0\r\nBEGIN:VEVENT\r\nUID:c03-{i}\r\n"
               f"DTSTART:{case['input']['DTSTART']}\r\nRRULE:{text}\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n")
        result = parse_ics(ics.encode(), source="c03", default_tz="UTC")
        assert result.rules == []
        assert len(result.problems) == 1


def test_c03_expansion_refuses_instead_of_last_wins(cases):
    for text in cases["C03"]["input"]["rules"]:
        rule = rule_from(cases["C03"]["input"]["DTSTART"], text, rule_id="bad")
        with pytest.raises(RRuleError, match="rule 'bad'"):
            expand(rule, UTC, after=FAR_PAST, before=FAR_FUTURE)


@pytest.mark.parametrize("text, part", [
    ("FREQ=DAILY;FOO=1", "FOO is unknown"),
    ("FREQ=FORTNIGHTLY", "FREQ="),
    ("FREQ=DAILY;COUNT=0", "COUNT="),
    ("FREQ=DAILY;COUNT=x", "COUNT="),
    ("FREQ=DAILY;INTERVAL=-1", "INTERVAL="),
    ("FREQ=DAILY;UNTIL=2024-01-01", "UNTIL="),
    ("FREQ=DAILY;UNTIL=20240230", "UNTIL="),
    ("FREQ=DAILY;BYHOUR=24", "BYHOUR="),
    ("FREQ=MONTHLY;BYMONTHDAY=0", "BYMONTHDAY="),
    ("FREQ=MONTHLY;BYMONTHDAY=32", "BYMONTHDAY="),
    ("FREQ=YEARLY;BYMONTH=13", "BYMONTH="),
    ("FREQ=WEEKLY;BYDAY=XX", "BYDAY="),
    ("FREQ=WEEKLY;BYDAY=1MO", "BYDAY="),
    ("FREQ=WEEKLY;BYMONTHDAY=1", "BYMONTHDAY cannot be used with FREQ=WEEKLY"),
    ("FREQ=MONTHLY;BYWEEKNO=1", "BYWEEKNO cannot be used"),
    ("FREQ=MONTHLY;BYSETPOS=1", "BYSETPOS needs another"),
    ("FREQ=DAILY;WKST=XX", "WKST="),
    ("COUNT=3", "no FREQ"),
    ("FREQ=DAILY;COUNT", "not NAME=VALUE"),
    ("", "empty"),
])
def test_strict_names_the_offending_part(text, part):
    with pytest.raises(RRuleError, match=part):
        validate_rrule(text)


def test_rrule_error_is_a_value_error_so_the_planner_reports_it_as_a_problem():
    assert issubclass(RRuleError, ValueError)


def test_strict_accepts_prefix_case_trailing_semicolon_and_x_parts():
    recur = validate_rrule("RRULE:freq=monthly;byday=-1fr;X-NAME=1;")
    assert recur.freq == "MONTHLY" and recur.text == "FREQ=MONTHLY;BYDAY=-1FR"


def test_lenient_returns_none_logs_with_rule_id_and_counts(caplog):
    with caplog.at_level(logging.ERROR, logger="deadline_pipeline.plan.recurrence"):
        got = parse_rrule("FREQ=DAILY;UNTIL=20240103T000000;UNTIL=20240110T000000", rule_id="tax-q1")
    assert got.recur is None
    assert got.counts["rrule_rejected"] == 1
    assert got.rejected[0] == "tax-q1" and "UNTIL" in got.rejected[1]
    assert any("tax-q1" in r.getMessage() and "UNTIL" in r.getMessage() and r.levelno == logging.ERROR
               for r in caplog.records)
    good = parse_rrule("FREQ=DAILY;COUNT=2")
    assert good.recur is not None and good.counts["rrule_rejected"] == 0


def test_lenient_expansion_skips_the_bad_rule_alone():
    bad = RuleRecord("bad", "t", "2024-01-01T00:00:00", "UTC", "FREQ=DAILY;COUNT=3;UNTIL=20240105T000000")
    good = RuleRecord("good", "t", "2024-01-01T00:00:00", "UTC", "FREQ=DAILY;COUNT=3")
    refused = occurrences.expansion(bad, UTC, after=FAR_PAST, before=FAR_FUTURE, strict=False)
    kept = occurrences.expansion(good, UTC, after=FAR_PAST, before=FAR_FUTURE, strict=False)
    assert expand(bad, UTC, after=FAR_PAST, before=FAR_FUTURE, strict=False) == []
    assert len(expand(good, UTC, after=FAR_PAST, before=FAR_FUTURE, strict=False)) == 3
    assert (refused.counts["rrule_rejected"], kept.counts["rrule_rejected"]) == (1, 0)


# --- UNTIL -------------------------------------------------------------------------------------


def test_c02_until_normalisation(cases):
    case = cases["C02"]
    for variant in ("variant_a", "variant_b"):
        given_ = case["input"][variant]
        rule = rule_from(given_["DTSTART"], given_["RRULE"])
        assert instants(rule) == iso_utc(case["expected"][variant]), variant


def test_c02_floating_until_read_in_dtstart_zone_is_an_instant(cases):
    given_ = cases["C02"]["input"]["variant_b"]
    local, instant = until_bound(given_["RRULE"].split("UNTIL=")[1], NY, all_day=False)
    assert instant == datetime(2026, 1, 26, 14, 0, tzinfo=UTC)
    assert local == datetime(2026, 1, 26, 9, 0)


def test_date_until_with_timed_dtstart_is_the_end_of_that_local_day():
    rule = RuleRecord("r", "t", "2026-03-01T22:30:00", "America/Los_Angeles", "FREQ=DAILY;UNTIL=20260303")
    zone = resolve_zone("America/Los_Angeles")
    assert [d.astimezone(zone).date() for d in instants(rule)] == [date(2026, 3, 1), date(2026, 3, 2),
                                                                      date(2026, 3, 3)]


def test_all_day_dtstart_with_utc_until_compares_by_date():
    # Google birthday feeds: VALUE=DATE DTSTART next to a UTC UNTIL (xandikos #702, noted under C02).
    rule = RuleRecord("r", "t", "2020-03-15", "Australia/Sydney", "FREQ=YEARLY;UNTIL=20230315T000000Z")
    zone = resolve_zone("Australia/Sydney")
    assert [d.astimezone(zone).date() for d in instants(rule)] == [date(y, 3, 15) for y in range(2020, 2024)]


def test_legacy_normalise_until_still_rewrites_to_local():
    assert normalise_until("FREQ=WEEKLY;UNTIL=20260126T140000Z", NY) == "FREQ=WEEKLY;UNTIL=20260126T090000"
    assert normalise_until("FREQ=WEEKLY;UNTIL=20260126", NY) == "FREQ=WEEKLY;UNTIL=20260126T235959"


def test_merge_until_keeps_one_until_and_the_rules_own_bound():
    end = datetime(2026, 6, 30, tzinfo=UTC)
    assert merge_until("FREQ=MONTHLY", end, UTC) == "FREQ=MONTHLY;UNTIL=20260630T000000Z"
    # The rule's own UNTIL is authoritative in both directions, and never doubled.
    assert merge_until("FREQ=MONTHLY;UNTIL=20260101T000000Z", end, UTC) == "FREQ=MONTHLY;UNTIL=20260101T000000Z"
    assert merge_until("FREQ=MONTHLY;UNTIL=20270101T000000Z", end, UTC) == "FREQ=MONTHLY;UNTIL=20270101T000000Z"
    assert merge_until("FREQ=MONTHLY;COUNT=3", end, UTC) == "FREQ=MONTHLY;COUNT=3"
    for text in ("FREQ=MONTHLY", "FREQ=MONTHLY;UNTIL=20260101T000000Z"):
        assert merge_until(text, end, UTC).count("UNTIL") == 1


def test_callers_end_date_is_a_fallback_for_unbounded_rules_only():
    end = datetime(2026, 3, 31, tzinfo=UTC)
    unbounded = RuleRecord("r", "t", "2026-01-15T12:00:00", "UTC", "FREQ=MONTHLY")
    assert len(instants(unbounded, until=end)) == 3
    own = RuleRecord("r", "t", "2026-01-15T12:00:00", "UTC", "FREQ=MONTHLY;UNTIL=20260615T120000Z")
    assert len(instants(own, until=end)) == 6  # a caller's date never truncates the rule's own series
    counted = RuleRecord("r", "t", "2026-01-15T12:00:00", "UTC", "FREQ=MONTHLY;COUNT=5")
    assert len(instants(counted, until=end)) == 5


# --- calendar arithmetic cases -----------------------------------------------------------------


def test_c05_last_business_day_of_month(cases):
    case = cases["C05"]
    rule = rule_from(case["input"]["DTSTART"], case["input"]["RRULE"])
    periods = [o.period for o in expand(rule, NY, after=FAR_PAST, before=FAR_FUTURE)]
    # The case's DTSTART (Thursday 2004-05-27) is not a last business day. RFC 5545 §3.8.5.3 makes it
    # the first instance all the same, counted in COUNT=12: it, then the first 11 month-ends.
    assert periods == ["2004-05-27", *case["expected"][:11]]
    synced = rule_from("DTSTART;VALUE=DATE:20040531", case["input"]["RRULE"])
    assert [o.period for o in expand(synced, NY, after=FAR_PAST, before=FAR_FUTURE)] == case["expected"]


def test_c07_month_end(cases):
    case = cases["C07"]
    a = case["input"]["variant_a"]
    assert instants(rule_from(a["DTSTART"], a["RRULE"])) == iso_utc(case["expected"]["variant_a"])
    b = case["input"]["variant_b"]
    rule = rule_from(b["DTSTART"], b["RRULE"])
    got = [o.due_at.date().isoformat() for o in expand(rule, UTC, after=FAR_PAST, before=FAR_FUTURE)]
    assert got == case["expected"]["variant_b"]


# --- DST ---------------------------------------------------------------------------------------


def test_c09_gap_shifts_forward_by_the_gap_and_counts(cases):
    case = cases["C09"]
    rule = rule_from(case["input"]["DTSTART"], case["input"]["RRULE"])
    policy = next(k for k in case["expected"] if k.startswith("policy_shift"))
    assert instants(rule) == iso_utc(case["expected"][policy])


def test_c10_sub_daily_steps_in_elapsed_time_across_fall_back(cases):
    case = cases["C10"]
    rule = rule_from(case["input"]["DTSTART"], case["input"]["RRULE"])
    assert instants(rule) == iso_utc(case["expected"])


def test_c16_daily_wall_clock_fires_once_per_day_after_fall_back(cases):
    case = cases["C16"]
    last_run = datetime.fromisoformat(case["input"]["last_run"])
    local = last_run.replace(tzinfo=None)
    rule = RuleRecord("r", "t", local.isoformat(), case["input"]["tz"], "FREQ=DAILY")
    got = instants(rule, after=last_run + timedelta(seconds=1), before=last_run + timedelta(days=2, hours=2))
    assert got == iso_utc(case["expected"])


def test_c17_hourly_keeps_the_repeated_hour(cases):
    case = cases["C17"]
    expected = iso_utc(case["expected"]["hourly_runs"])
    first = datetime.fromisoformat(case["expected"]["hourly_runs"][0])
    rule = RuleRecord("r", "t", first.replace(tzinfo=None).isoformat(), case["input"]["tz"], "FREQ=HOURLY")
    got = instants(rule, after=expected[0], before=expected[-1])
    assert got == expected
    now = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
    assert (now in got) is case["expected"]["is_due_at_09Z"]


def test_c18_spring_forward_does_not_skip_a_weekday(cases):
    case = cases["C18"]
    now = datetime.fromisoformat(case["input"]["now"].split(" ")[0])
    rule = RuleRecord("r", "t", "2021-03-01T00:00:00", case["input"]["tz"], "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR")
    got = instants(rule, after=now, before=now + timedelta(days=7), limit=1)
    assert got == iso_utc(case["expected"])


def test_fold_takes_the_first_occurrence():
    rule = RuleRecord("r", "t", "2024-11-02T01:30:00", "America/New_York", "FREQ=DAILY;COUNT=2")
    assert instants(rule)[1] == datetime(2024, 11, 3, 5, 30, tzinfo=UTC)  # 01:30 EDT, not EST


def test_hourly_with_byhour_is_wall_clock_and_never_duplicates_an_instant():
    rule = RuleRecord("r", "t", "2025-03-08T00:30:00", "America/New_York", "FREQ=HOURLY;BYHOUR=1,2,3;COUNT=9")
    got = instants(rule)
    assert len(got) == len(set(got)) == 8  # 02:30 on the gap night shifts onto 03:30 and is kept once
    assert got == sorted(got)


# --- a gap that maps two local occurrences onto one instant --------------------------------------
# Zones and years chosen where the system's zone data and the tzdata package agree (checked).

APIA = ZoneInfo("Pacific/Apia")


def test_a_skipped_day_plans_its_instant_once_for_the_day_that_exists(caplog):
    """Samoa skipped 2011-12-30 (UTC-10 → UTC+14). The nonexistent 30 December 09:00, read with the
    offset before the gap, is 19:00Z on the 30th: the instant of 31 December 09:00. Five occurrences
    requested, four instants, each once; the instant belongs to the 31st, whose 09:00 exists."""
    rule = RuleRecord("apia-daily", "t", "2011-12-28T09:00:00", "Pacific/Apia", "FREQ=DAILY;COUNT=5")
    with caplog.at_level(logging.WARNING, logger="deadline_pipeline.plan.occurrences"):
        got = occurrences.expansion(rule, APIA, after=FAR_PAST, before=FAR_FUTURE)
    assert [(o.period, o.due_at) for o in got.occurrences] == [
        ("2011-12-28T09:00:00", datetime(2011, 12, 28, 19, tzinfo=UTC)),
        ("2011-12-29T09:00:00", datetime(2011, 12, 29, 19, tzinfo=UTC)),
        ("2011-12-31T09:00:00", datetime(2011, 12, 30, 19, tzinfo=UTC)),
        ("2012-01-01T09:00:00", datetime(2011, 12, 31, 19, tzinfo=UTC)),
    ]
    [c] = got.collapsed
    assert (c.dropped, c.kept, c.instant) == (datetime(2011, 12, 30, 9), datetime(2011, 12, 31, 9),
                                              datetime(2011, 12, 30, 19, tzinfo=UTC))
    assert got.counts["instants_collapsed"] == 1
    [record] = [r for r in caplog.records if "apia-daily" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "2011-12-30T09:00:00 is dropped" in record.getMessage()
    assert "Pacific/Apia" in record.getMessage() and "2011-12-31T09:00:00" in record.getMessage()


def test_a_skipped_all_day_date_is_due_once_at_the_end_of_the_day_that_exists():
    rule = RuleRecord("apia-all-day", "t", "2011-12-29", "Pacific/Apia", "FREQ=DAILY;COUNT=3")
    got = occurrences.expansion(rule, APIA, after=FAR_PAST, before=FAR_FUTURE)
    assert [(o.period, o.due_at) for o in got.occurrences] == [
        ("2011-12-29", datetime(2011, 12, 30, 9, 59, 59, tzinfo=UTC)),
        ("2011-12-31", datetime(2011, 12, 31, 9, 59, 59, tzinfo=UTC)),
    ]
    assert [(c.dropped, c.kept) for c in got.collapsed] == [(datetime(2011, 12, 30, 23, 59, 59),
                                                            datetime(2011, 12, 31, 23, 59, 59))]


def test_kiritimati_skipped_1994_12_31_and_plans_that_instant_once():
    """Kiritimati went from UTC-10 to UTC+14 at the end of 30 December 1994: 31 December does not
    exist there, and its 09:00 would be the instant of 1 January 1995 09:00."""
    zone = ZoneInfo("Pacific/Kiritimati")
    assert datetime(1994, 12, 31, 9, tzinfo=zone).astimezone(UTC) == \
        datetime(1995, 1, 1, 9, tzinfo=zone).astimezone(UTC)  # the zone data says so
    rule = RuleRecord("kiritimati-daily", "t", "1994-12-29T09:00:00", "Pacific/Kiritimati", "FREQ=DAILY;COUNT=5")
    got = occurrences.expansion(rule, zone, after=FAR_PAST, before=FAR_FUTURE)
    assert [o.due_at for o in got.occurrences] == [datetime(1994, 12, d, 19, tzinfo=UTC) for d in (29, 30, 31)] + [
        datetime(1995, 1, 1, 19, tzinfo=UTC)]
    assert [o.period for o in got.occurrences][2] == "1995-01-01T09:00:00"
    assert [c.dropped for c in got.collapsed] == [datetime(1994, 12, 31, 9)]


def test_a_gap_hour_shifted_onto_an_occurrence_keeps_the_local_time_that_exists():
    """BYHOUR=1,2,3 at :30 over New York's 2025-03-09 gap (02:00→03:00): 02:30 is 07:30Z, the instant
    of 03:30 EDT. That instant is planned once, identified by 03:30 (it was identified by the 02:30
    that never shows on a clock), and the drop is reported."""
    rule = RuleRecord("ny-byhour", "t", "2025-03-08T01:30:00", "America/New_York", "FREQ=HOURLY;BYHOUR=1,2,3;COUNT=9")
    got = occurrences.expansion(rule, NY, after=FAR_PAST, before=FAR_FUTURE)
    gap_day = [(o.period, o.due_at) for o in got.occurrences if o.period.startswith("2025-03-09")]
    assert gap_day == [("2025-03-09T01:30:00", datetime(2025, 3, 9, 6, 30, tzinfo=UTC)),
                       ("2025-03-09T03:30:00", datetime(2025, 3, 9, 7, 30, tzinfo=UTC))]
    assert len(got.occurrences) == 8
    assert [(c.dropped, c.kept) for c in got.collapsed] == [(datetime(2025, 3, 9, 2, 30), datetime(2025, 3, 9, 3, 30))]


def test_an_rdate_in_a_gap_on_an_occurrence_is_planned_once_for_the_occurrence():
    rule = RuleRecord("ny-rdate", "t", "2025-03-08T03:30:00", "America/New_York", "FREQ=DAILY;COUNT=3",
                      rdates=("2025-03-09T02:30:00",))
    got = occurrences.expansion(rule, NY, after=FAR_PAST, before=FAR_FUTURE)
    assert [o.period for o in got.occurrences] == ["2025-03-08T03:30:00", "2025-03-09T03:30:00",
                                                    "2025-03-10T03:30:00"]
    assert [c.dropped for c in got.collapsed] == [datetime(2025, 3, 9, 2, 30)]


def test_a_collapse_outside_the_window_is_not_reported_again():
    rule = RuleRecord("apia-long", "t", "2011-12-28T09:00:00", "Pacific/Apia", "FREQ=DAILY")
    later = datetime(2012, 6, 1, tzinfo=UTC)
    got = occurrences.expansion(rule, APIA, after=later, before=later + timedelta(days=3))
    assert len(got.occurrences) == 3 and got.collapsed == ()


def test_a_business_day_roll_onto_one_day_keeps_each_occurrence():
    """Not a gap: Saturday's and Sunday's deadlines rolled to Monday are still their own deadlines
    (each keeps its period), with or without wall-clock BYxxx parts. (With BYHOUR, the two rolled
    ones used to vanish without a word.)"""
    after, before = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 20, tzinfo=UTC)
    for text in ("FREQ=DAILY;COUNT=4", "FREQ=DAILY;BYHOUR=9;COUNT=4"):
        rule = RuleRecord("roll", "t", "2026-01-09T09:00:00", "America/New_York", text)
        got = occurrences.expansion(rule, NY, after=after, before=before, business_days=("US", "following"))
        assert [(o.period[:10], o.due_at.day) for o in got.occurrences] == [
            ("2026-01-09", 9), ("2026-01-10", 12), ("2026-01-11", 12), ("2026-01-12", 12)], text
        assert got.collapsed == ()


def test_zone_gaps_are_the_nonexistent_wall_clock_spans():
    from deadline_pipeline.plan.gaps import zone_gaps

    assert zone_gaps(APIA, 2011)[-1] == (datetime(2011, 12, 30), datetime(2011, 12, 31))
    assert zone_gaps(NY, 2025) == ((datetime(2025, 3, 9, 2), datetime(2025, 3, 9, 3)),)
    assert zone_gaps(ZoneInfo("Australia/Lord_Howe"), 2025) == (
        (datetime(2025, 10, 5, 2), datetime(2025, 10, 5, 2, 30)),)  # a half-hour gap
    assert zone_gaps(ZoneInfo("Pacific/Kiritimati"), 1994) == ((datetime(1994, 12, 31), datetime(1995, 1, 1)),)
    assert zone_gaps(UTC, 2025) == () and zone_gaps(ZoneInfo("Asia/Kolkata"), 2025) == ()


def _once(items, zone, **kw):
    from deadline_pipeline.plan.gaps import once_per_instant

    dropped: list = []
    kept = list(once_per_instant(items, zone, dropped, **kw))
    return kept, [(c.dropped, c.kept, c.instant) for c in dropped]


def test_once_per_instant_drops_the_nonexistent_time_and_keeps_series_order():
    day = datetime(2025, 3, 9)
    items = [day.replace(hour=1, minute=30), day.replace(hour=2, minute=30), day.replace(hour=3),
             day.replace(hour=3, minute=30), day.replace(hour=4)]
    kept, dropped = _once(items, NY)
    assert kept == [items[0], items[2], items[3], items[4]]
    assert dropped == [(items[1], items[3], datetime(2025, 3, 9, 7, 30, tzinfo=UTC))]


def test_once_per_instant_keeps_a_nonexistent_time_without_a_partner():
    day = datetime(2025, 3, 9)
    alone = [day.replace(hour=1), day.replace(hour=2, minute=30), day.replace(hour=4)]
    assert _once(alone, NY) == (alone, [])
    assert _once([day.replace(hour=2, minute=30)], NY) == ([day.replace(hour=2, minute=30)], [])  # at the end


def test_once_per_instant_reads_shifted_times_and_passes_early_items_unexamined():
    # A THISANDFUTURE piece shifted by a day: its 29 and 30 December fall on Samoa's 30 (gone) and 31.
    items = [datetime(2011, 12, 29, 9), datetime(2011, 12, 30, 9)]
    kept, dropped = _once(items, APIA, shift=timedelta(days=1))
    assert kept == [datetime(2011, 12, 30, 9)]
    assert dropped == [(datetime(2011, 12, 30, 9), datetime(2011, 12, 31, 9), datetime(2011, 12, 30, 19, tzinfo=UTC))]
    # Items before `earliest` are the caller's to drop: passed on as they are, never held.
    items = [datetime(2011, 12, 30, 9), datetime(2011, 12, 31, 9)]
    assert _once(items, APIA, earliest=datetime(2011, 12, 31)) == (items, [])


ZONES = ["America/New_York", "Europe/London", "Australia/Sydney", "America/Santiago", "Asia/Tehran",
         "Pacific/Auckland", "America/Sao_Paulo"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(zone_name=st.sampled_from(ZONES), day=st.dates(date(2015, 1, 1), date(2027, 12, 31)),
       hour=st.integers(0, 23), minute=st.sampled_from([0, 15, 30, 59]))
def test_daily_local_rule_fires_once_per_local_day_across_dst(zone_name, day, hour, minute):
    zone = ZoneInfo(zone_name)
    start = datetime(day.year, day.month, day.day, hour, minute)
    rule = RuleRecord("r", "t", start.isoformat(), zone_name, "FREQ=DAILY")
    after = to_instant(start, zone)
    got = instants(rule, after=after, before=after + timedelta(days=400))
    local_days = [g.astimezone(zone).date() for g in got]
    assert len(local_days) >= 399
    assert all((b - a).days == 1 for a, b in zip(local_days, local_days[1:], strict=False))
    for g in got:
        wall = g.astimezone(zone)
        # The wall time is kept, or shifted forward by a gap (never backward, never by a day).
        shift = (wall.replace(tzinfo=None) - datetime.combine(wall.date(), start.time())).total_seconds()
        assert 0 <= shift <= 3600 * 2


RULE_TEXTS = ["FREQ=DAILY", "FREQ=WEEKLY;BYDAY=MO,FR", "FREQ=MONTHLY;BYMONTHDAY=-1", "FREQ=HOURLY;INTERVAL=7",
              "FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1", "FREQ=YEARLY;BYMONTH=4;BYMONTHDAY=15",
              "FREQ=MINUTELY;INTERVAL=997", "FREQ=DAILY;BYHOUR=1,2,3"]


@settings(max_examples=80, deadline=None)
@given(text=st.sampled_from(RULE_TEXTS), zone_name=st.sampled_from(ZONES),
       start=st.datetimes(datetime(2020, 1, 1), datetime(2026, 12, 31)).map(lambda d: d.replace(microsecond=0)),
       count=st.one_of(st.none(), st.integers(1, 40)), until_days=st.one_of(st.none(), st.integers(0, 400)),
       offset=st.integers(-30, 300), span=st.integers(0, 500))
def test_expansion_properties(text, zone_name, start, count, until_days, offset, span):
    zone = ZoneInfo(zone_name)
    rrule = text
    until = None
    if count is not None:
        rrule += f";COUNT={count}"
    elif until_days is not None:
        until = to_instant(start, zone) + timedelta(days=until_days)
        rrule += ";UNTIL=" + until.strftime("%Y%m%dT%H%M%SZ")
    rule = RuleRecord("p", "t", start.isoformat(), zone_name, rrule)
    after = to_instant(start, zone) + timedelta(days=offset)
    before = after + timedelta(days=span)
    got = instants(rule, after=after, before=before)
    assert got == sorted(got)
    assert len(got) == len(set(got))
    assert all(after <= g <= before for g in got)
    assert all(g.tzinfo is UTC for g in got)
    if count is not None:
        assert len(got) <= count
        whole = instants(rule, after=to_instant(start, zone) - timedelta(days=1), before=FAR_FUTURE)
        assert len(whole) <= count
        assert set(got) <= set(whole)
    if until is not None:
        assert all(g <= until for g in got)


# --- horizon, grace, caps ----------------------------------------------------------------------


def test_window_never_replays_the_past():
    now = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    lo, hi = window(now)
    assert lo == now - GRACE and hi == now + HORIZON
    rule = RuleRecord("r", "t", "2026-05-01T11:40:00", "UTC", "FREQ=MINUTELY;INTERVAL=10;COUNT=3")
    # 11:40 is 20 minutes past: not replayed; 11:50 (10 minutes past) is within the grace.
    assert instants(rule, after=lo, before=hi) == [datetime(2026, 5, 1, 11, 50, tzinfo=UTC),
                                                   datetime(2026, 5, 1, 12, 0, tzinfo=UTC)]


def test_ordinary_unbounded_yearly_series_does_not_log_error(caplog):
    now = datetime(2026, 1, 1, tzinfo=UTC)
    rule = RuleRecord("tax", "t", "2020-04-15", "America/New_York", "FREQ=YEARLY")
    with caplog.at_level(logging.DEBUG, logger="deadline_pipeline.plan.occurrences"):
        got = occurrences.expansion(rule, resolve_zone(rule.tz), after=window(now)[0], before=window(now)[1])
    assert len(got.occurrences) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert got.counts["horizon_truncations"] == 0


def test_unbounded_sub_daily_series_logs_error_once_with_rule_id_and_counts_every_time(caplog):
    now = datetime(2026, 1, 1, tzinfo=UTC)
    rule = RuleRecord("hourly-forever", "t", "2025-12-31T00:00:00", "UTC", "FREQ=HOURLY;INTERVAL=6")
    with caplog.at_level(logging.ERROR, logger="deadline_pipeline.plan.occurrences"):
        got = [occurrences.expansion(rule, resolve_zone(rule.tz), after=window(now)[0], before=window(now)[1])
               for _ in range(2)]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "hourly-forever" in r.getMessage()]
    assert len(errors) == 1
    assert sum(e.counts["horizon_truncations"] for e in got) == 2


def test_a_daily_rule_firing_too_often_logs_error(caplog):
    rule = RuleRecord("chatty", "t", "2026-01-01T00:00:00", "UTC",
                      "FREQ=DAILY;BYHOUR=0,2,4,6,8,10,12,14,16,18,20,22")
    with caplog.at_level(logging.ERROR, logger="deadline_pipeline.plan.occurrences"):
        instants(rule, after=datetime(2026, 1, 1, tzinfo=UTC), before=datetime(2026, 2, 1, tzinfo=UTC))
    assert any("chatty" in r.getMessage() for r in caplog.records)


def test_bounded_sub_daily_series_inside_the_window_is_not_an_error(caplog):
    rule = RuleRecord("c10", "t", "2024-11-03T01:52:03", "America/New_York", "FREQ=SECONDLY;INTERVAL=240;COUNT=6")
    with caplog.at_level(logging.ERROR, logger="deadline_pipeline.plan.occurrences"):
        instants(rule)
    assert not caplog.records


def test_occurrence_cap_stops_and_counts(caplog):
    rule = RuleRecord("secondly", "t", "2026-01-01T00:00:00", "UTC", "FREQ=SECONDLY")
    with caplog.at_level(logging.ERROR, logger="deadline_pipeline.plan.occurrences"):
        got = occurrences.expansion(rule, resolve_zone(rule.tz), after=datetime(2026, 1, 1, tzinfo=UTC),
                                    before=datetime(2026, 2, 1, tzinfo=UTC))
    assert len(got.occurrences) == MAX_OCCURRENCES
    assert got.counts["occurrence_cap"] == 1


def test_expansion_names_the_first_occurrence_left_out_at_the_cap_and_only_when_one_is(monkeypatch, caplog):
    """A window holding exactly the cap is complete (no cut, no ERROR, not counted); one more
    occurrence is a cut, and ``cut_at`` is that occurrence's due instant: planning reports from there."""
    from deadline_pipeline.plan import occurrences as occ_mod

    monkeypatch.setattr(occ_mod, "MAX_OCCURRENCES", 5)
    after, before = datetime(2027, 1, 1, tzinfo=UTC), datetime(2027, 2, 1, tzinfo=UTC)
    exact = RuleRecord("five", "t", "2027-01-01T09:00:00", "UTC", "FREQ=DAILY;COUNT=5")
    more = RuleRecord("six", "t", "2027-01-01T09:00:00", "UTC", "FREQ=DAILY;COUNT=6")
    with caplog.at_level(logging.ERROR, logger="deadline_pipeline.plan.occurrences"):
        whole = occ_mod.expansion(exact, UTC, after=after, before=before)
    assert len(whole.occurrences) == 5 and whole.cut_at is None
    assert whole.counts["occurrence_cap"] == 0 and not caplog.records
    with caplog.at_level(logging.ERROR, logger="deadline_pipeline.plan.occurrences"):
        cut = occ_mod.expansion(more, UTC, after=after, before=before)
    assert [o.due_at.day for o in cut.occurrences] == [1, 2, 3, 4, 5]
    assert cut.cut_at == datetime(2027, 1, 6, 9, tzinfo=UTC)
    assert cut.counts["occurrence_cap"] == 1
    assert "expansion stopped at 2027-01-06T09:00:00+00:00" in caplog.text
    assert len(expand(more, UTC, after=after, before=before, limit=5)) == 5  # a limit reached is no cut


def test_a_rule_that_never_occurs_is_refused_instead_of_scanning_to_year_9999():
    with pytest.raises(RRuleError, match="never meet"):
        validate_rrule("FREQ=DAILY;BYMONTH=2;BYMONTHDAY=30;COUNT=3")
    with pytest.raises(RRuleError, match="never meet"):
        validate_rrule("FREQ=YEARLY;BYMONTH=4,6;BYMONTHDAY=31")
    assert validate_rrule("FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29")  # leap years
    assert validate_rrule("FREQ=YEARLY;BYMONTH=4,5;BYMONTHDAY=31")


# --- ICS sets: EXDATE/RDATE, floating, VTODO, overrides ------------------------------------------


def _calendar(*lines: str, x_wr: str | None = None) -> bytes:
    head = ["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//test//EN"] + ([f"X-WR-TIMEZONE:{x_wr}"] if x_wr else [])
    return ("\r\n".join([*head, *lines, "END:VCALENDAR"]) + "\r\n").encode()


def _event(uid: str, *props: str, kind: str = "VEVENT") -> list[str]:
    return [f"BEGIN:{kind}", f"UID:{uid}", "SUMMARY:s", *props, f"END:{kind}"]


def _expand_calendar(content: bytes, default_tz: str | None = None, **kw) -> list[tuple[str, datetime]]:
    result = parse_ics(content, source="test", default_tz=default_tz)
    assert not result.problems, result.problems
    out = []
    for rule in apply_overrides(result.rules):
        out += [(rule.rule_id, o.due_at) for o in expand(rule, resolve_zone(rule.tz),
                                                        after=kw.get("after", FAR_PAST),
                                                        before=kw.get("before", FAR_FUTURE))]
    return sorted(out, key=lambda p: p[1])


def _oracle(content: bytes, start: datetime, end: datetime) -> list[datetime]:
    cal = icalendar.Calendar.from_ical(content)
    return sorted(e["DTSTART"].dt.astimezone(UTC) for e in recurring_ical_events.of(cal).between(start, end))


def test_c12_exdate_with_its_own_tzid(cases):
    case = cases["C12"]
    content = _calendar(*_event("c12", *case["input"]["ics"]))
    got = [d for _rid, d in _expand_calendar(content)]
    assert len(got) == case["expected"]["count"]
    assert got[-3:] == iso_utc(case["expected"]["last_week"])
    assert not set(iso_utc(case["expected"]["must_not_contain"])) & set(got)
    # An independent expander (recurring-ical-events) agrees on every instant.
    assert got == _oracle(content, datetime(2022, 1, 1, tzinfo=UTC), datetime(2023, 6, 1, tzinfo=UTC))


def test_c12_exdate_given_in_another_zone_is_matched_as_an_instant():
    content = _calendar(*_event("x", "DTSTART;TZID=Europe/Amsterdam:20221118T111500", "RRULE:FREQ=DAILY;COUNT=3",
                                "EXDATE:20221119T101500Z"))
    assert [d for _r, d in _expand_calendar(content)] == [datetime(2022, 11, 18, 10, 15, tzinfo=UTC),
                                                          datetime(2022, 11, 20, 10, 15, tzinfo=UTC)]


def test_date_exdate_against_timed_series_matches_the_local_day():
    rule = RuleRecord("r", "t", "2026-01-05T09:00:00", "Europe/Berlin", "FREQ=DAILY;COUNT=3", exdates=("2026-01-06",))
    assert [d.date() for d in instants(rule)] == [date(2026, 1, 5), date(2026, 1, 7)]


def test_rdate_adds_and_dtstart_counts_in_an_rdate_only_set():
    rule = RuleRecord("r", "t", "2026-01-05T09:00:00", "Europe/Berlin", None, rdates=("2026-02-01T10:00:00",))
    assert instants(rule) == [datetime(2026, 1, 5, 8, 0, tzinfo=UTC), datetime(2026, 2, 1, 9, 0, tzinfo=UTC)]


def test_c14_floating_time_takes_the_calendars_zone(cases):
    case = cases["C14"]
    lines = [x for x in case["input"]["ics"] if not x.startswith("X-WR-TIMEZONE")]
    x_wr = next(x.split(":", 1)[1] for x in case["input"]["ics"] if x.startswith("X-WR-TIMEZONE"))
    content = _calendar(*_event("c14", *lines), x_wr=x_wr)
    assert [d for _r, d in _expand_calendar(content)] == iso_utc(case["expected"])
    # Without X-WR-TIMEZONE the recipient's zone is used — never UTC.
    bare = parse_ics(_calendar(*_event("c14", *lines)), source="t").rules[0]
    assert bare.tz is None
    assert instants(bare, zone=resolve_zone(case["input"]["recipient_tz"])) == iso_utc(case["expected"])


def test_vtodo_due_is_the_due_instant():
    content = _calendar(*_event("todo", "DTSTART;TZID=Europe/Paris:20260401T090000",
                                "DUE;TZID=Europe/Paris:20260415T170000", kind="VTODO"))
    assert _expand_calendar(content) == [("todo", datetime(2026, 4, 15, 15, 0, tzinfo=UTC))]


OVERRIDES = _calendar(
    *_event("m", "DTSTART;TZID=Europe/Berlin:20260105T090000", "RRULE:FREQ=WEEKLY;COUNT=6"),
    *_event("m", "RECURRENCE-ID;TZID=Europe/Berlin:20260112T090000", "DTSTART;TZID=Europe/Berlin:20260113T100000"),
    *_event("m", "RECURRENCE-ID;RANGE=THISANDFUTURE;TZID=Europe/Berlin:20260126T090000",
            "DTSTART;TZID=Europe/Berlin:20260126T150000"),
)


def _with_range(content: bytes) -> list[RuleRecord]:
    """The parsed rules, with RANGE=THISANDFUTURE recorded in ``extra["range"]`` (see apply_overrides)."""
    rules = parse_ics(content, source="t").rules
    ranged = {str(c.get("RECURRENCE-ID").dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
              for c in icalendar.Calendar.from_ical(content).walk("VEVENT")
              if c.get("RECURRENCE-ID") is not None and c["RECURRENCE-ID"].params.get("RANGE") == "THISANDFUTURE"}
    return [replace(r, extra={**r.extra, "range": "THISANDFUTURE"}) if r.extra.get("recurrence_id") in ranged
            else r for r in rules]


def _expand_rules(rules: list[RuleRecord]) -> list[tuple[str, str, datetime]]:
    out = []
    for rule in rules:
        out += [(rule.rule_id, o.period, o.due_at) for o in expand(rule, resolve_zone(rule.tz), after=FAR_PAST,
                                                                   before=FAR_FUTURE)]
    return sorted(out, key=lambda p: p[2])


def test_override_replaces_the_occurrence_it_names_and_thisandfuture_splits():
    folded = apply_overrides(_with_range(OVERRIDES))
    got = _expand_rules(folded)
    # Same instants as an independent expander, each once.
    assert [d for _r, _p, d in got] == _oracle(OVERRIDES, datetime(2026, 1, 1, tzinfo=UTC),
                                                 datetime(2026, 4, 1, tzinfo=UTC))
    assert [(r, d.isoformat()) for r, _p, d in got] == [
        ("m", "2026-01-05T08:00:00+00:00"),
        ("m#2026-01-12T08:00:00Z", "2026-01-13T09:00:00+00:00"),
        ("m", "2026-01-19T08:00:00+00:00"),
        ("m#2026-01-26T08:00:00Z", "2026-01-26T14:00:00+00:00"),
        ("m#2026-01-26T08:00:00Z", "2026-02-02T14:00:00+00:00"),
        ("m#2026-01-26T08:00:00Z", "2026-02-09T14:00:00+00:00"),
    ]
    # The tail keeps the original occurrences' identity (period) while its instants move.
    assert [p for r, p, _d in got if r.startswith("m#2026-01-26")][0] == "2026-01-26T09:00:00"


def test_without_folding_the_override_would_be_counted_twice():
    raw = _expand_rules(parse_ics(OVERRIDES, source="t").rules)
    assert len(raw) > len(_expand_rules(apply_overrides(_with_range(OVERRIDES))))


def test_apply_overrides_is_order_independent_pure_and_counts_orphans():
    rules = _with_range(OVERRIDES)
    snapshot = [replace(r) for r in rules]
    assert _expand_rules(apply_overrides(list(reversed(rules)))) == _expand_rules(apply_overrides(rules))
    assert rules == snapshot and all(r.exdates == () for r in rules)  # inputs untouched
    orphans = apply_overrides([r for r in rules if r.rule_id != "m"])
    assert orphans.counts["orphan_overrides"] == 2
    assert [r.rule_id for r in orphans] == [r.rule_id for r in rules if r.rule_id != "m"]


def test_thisandfuture_on_an_unbounded_series_bounds_the_master():
    content = _calendar(
        *_event("u", "DTSTART;TZID=America/New_York:20260105T090000", "RRULE:FREQ=WEEKLY"),
        *_event("u", "RECURRENCE-ID;RANGE=THISANDFUTURE;TZID=America/New_York:20260119T090000",
                "DTSTART;TZID=America/New_York:20260119T070000"),
    )
    got = _expand_rules(apply_overrides(_with_range(content)))
    window_end = datetime(2026, 2, 10, tzinfo=UTC)
    got = [(r, d) for r, _p, d in got if d < window_end]
    assert [d for _r, d in got] == _oracle(content, datetime(2026, 1, 1, tzinfo=UTC), window_end)
    assert [r for r, _d in got] == ["u", "u"] + ["u#2026-01-19T14:00:00Z"] * 4


# A series with one occurrence cancelled, as Thunderbird writes it (an override with STATUS:CANCELLED;
# recurring-ical-events' own test calendar issue_18_cancel_status.ics has this shape).
CANCELLED_OCCURRENCE = _calendar(
    *_event("tb", "DTSTART;TZID=Europe/Berlin:20260128T220000", "RRULE:FREQ=DAILY;COUNT=3", "SEQUENCE:1"),
    *_event("tb", "RECURRENCE-ID;TZID=Europe/Berlin:20260129T220000", "DTSTART;TZID=Europe/Berlin:20260129T220000",
            "STATUS:CANCELLED", "SEQUENCE:2"),
)


def test_a_cancelled_occurrence_is_not_planned():
    """Before, the cancelled override was planned as a one-off at its own DTSTART: the subscriber was
    reminded of a deadline its publisher had cancelled."""
    from deadline_pipeline_tests.differential import compare

    folded = apply_overrides(parse_ics(CANCELLED_OCCURRENCE, source="t").rules)
    got = _expand_rules(folded)
    assert [d.isoformat() for _r, _p, d in got] == ["2026-01-28T21:00:00+00:00", "2026-01-30T21:00:00+00:00"]
    assert folded.counts["cancelled_occurrences"] == 1
    assert compare(CANCELLED_OCCURRENCE).identical  # the reference, its cancelled occurrence left out


def test_a_cancelled_thisandfuture_override_ends_the_series_there():
    content = _calendar(
        *_event("u", "DTSTART;TZID=America/New_York:20260105T090000", "RRULE:FREQ=WEEKLY;COUNT=6"),
        *_event("u", "RECURRENCE-ID;RANGE=THISANDFUTURE;TZID=America/New_York:20260119T090000",
                "DTSTART;TZID=America/New_York:20260119T090000", "STATUS:CANCELLED"),
    )
    got = _expand_rules(apply_overrides(_with_range(content)))
    assert [(r, d.date().isoformat()) for r, _p, d in got] == [("u", "2026-01-05"), ("u", "2026-01-12")]


def test_a_cancelled_event_and_its_overrides_are_out_of_force_with_a_note():
    content = _calendar(
        *_event("gone", "DTSTART;TZID=Europe/Berlin:20260128T220000", "RRULE:FREQ=DAILY;COUNT=3", "STATUS:CANCELLED"),
        *_event("gone", "RECURRENCE-ID;TZID=Europe/Berlin:20260129T220000",
                "DTSTART;TZID=Europe/Berlin:20260129T230000"),
        *_event("kept", "DTSTART:20260201T120000Z"),
    )
    result = parse_ics(content, source="t")
    assert [r.rule_id for r in result.rules] == ["kept"]
    notes = [(p.record_id, p.skipped, p.message) for p in result.problems]
    assert [(rid, skipped) for rid, skipped, _m in notes] == [("gone", False), ("gone#2026-01-29T21:00:00Z", False)]
    assert all("withdrawn" in m for _r, _s, m in notes), notes


# --- business days inside expand ---------------------------------------------------------------


def test_business_days_adjust_the_date_keep_the_time_and_the_period():
    rule = RuleRecord("irs", "t", "2028-04-15T17:00:00", "America/New_York", "FREQ=YEARLY;COUNT=1")
    [occ] = expand(rule, NY, after=FAR_PAST, before=FAR_FUTURE, business_days=("US-IRS", "following"))
    assert occ.period == "2028-04-15T17:00:00"
    assert occ.due_at == datetime(2028, 4, 18, 21, 0, tzinfo=UTC)


def test_business_days_window_judges_the_adjusted_instant():
    rule = RuleRecord("r", "t", "2028-04-15", "America/New_York", "FREQ=YEARLY")
    after = datetime(2028, 4, 17, 12, 0, tzinfo=UTC)  # after the unadjusted due, before the adjusted one
    got = expand(rule, NY, after=after, before=after + timedelta(days=2), business_days=("US-IRS", "following"))
    assert [(o.period, o.due_at.astimezone(NY).date()) for o in got] == [("2028-04-15", date(2028, 4, 18))]


def test_business_days_with_an_ingested_date_set_and_a_one_off():
    rule = RuleRecord("r", "t", "2026-12-25T12:00:00", "Europe/London")
    holidays = {date(2026, 12, 25), date(2026, 12, 28)}
    [occ] = expand(rule, ZoneInfo("Europe/London"), after=FAR_PAST, before=FAR_FUTURE,
                   business_days=(holidays, "following"))
    assert occ.due_at == datetime(2026, 12, 29, 12, 0, tzinfo=UTC)


def test_unknown_convention_is_refused():
    rule = RuleRecord("r", "t", "2026-12-25T12:00:00", "UTC", "FREQ=DAILY")
    with pytest.raises(ValueError, match="convention"):
        expand(rule, UTC, after=FAR_PAST, before=FAR_FUTURE, business_days=("US", "nearest"))


# --- ingest-side cases -------------------------------------------------------------------------


def test_c30_day_month_order_is_never_guessed(cases):
    case = cases["C30"]
    values = case["input"]["csv_column_from_dd_mm_yyyy_source"]
    body = "title,due,timezone\n" + "".join(f"row{i},{v},UTC\n" for i, v in enumerate(values))
    result = parse_csv(body.encode(), source="c30")
    # The parser accepts ISO dates only: a dd.mm.yyyy value is refused, never read month-first.
    assert result.rules == [] and len(result.problems) == len(values)
    iso = "title,due,timezone\n" + "".join(f"row{i},{d},UTC\n" for i, d in enumerate(case["expected"]))
    assert [r.start for r in parse_csv(iso.encode(), source="c30").rules] == case["expected"]


@pytest.mark.parametrize(("zone", "local", "twin"), [
    ("America/New_York", datetime(2026, 3, 8, 2, 30), datetime(2026, 3, 8, 3, 30)),  # in the gap
    ("America/New_York", datetime(2026, 3, 8, 3, 30), datetime(2026, 3, 8, 2, 30)),  # the time after it
    ("America/New_York", datetime(2026, 3, 8, 3, 0), datetime(2026, 3, 8, 2, 0)),
    ("America/New_York", datetime(2026, 3, 8, 4, 0), None),  # an hour on: no twin
    ("America/New_York", datetime(2026, 3, 8, 1, 59), None),
    ("America/New_York", datetime(2026, 11, 1, 1, 30), None),  # repeated by the fall-back: one wall time
    ("America/New_York", datetime(2026, 3, 7, 2, 30), None),
    ("Pacific/Apia", datetime(2011, 12, 30, 9, 0), datetime(2011, 12, 31, 9, 0)),  # the skipped day
    ("Pacific/Apia", datetime(2011, 12, 31, 9, 0), datetime(2011, 12, 30, 9, 0)),
    ("Australia/Lord_Howe", datetime(2026, 10, 4, 2, 15), datetime(2026, 10, 4, 2, 45)),  # a 30-minute gap
    ("UTC", datetime(2026, 3, 8, 2, 30), None),
])
def test_gap_alias_pairs_a_nonexistent_time_with_the_existing_one_on_its_instant(zone, local, twin):
    """RFC 5545 §3.3.5: a time in a gap is read with the offset before it, so it and the time the gap's
    length later are one instant. Override and EXDATE matching rely on this pairing."""
    from deadline_pipeline.plan.recurrence import gap_alias

    z = ZoneInfo(zone)
    assert gap_alias(local, z) == twin
    if twin is not None:
        assert to_instant(local, z) == to_instant(twin, z)
