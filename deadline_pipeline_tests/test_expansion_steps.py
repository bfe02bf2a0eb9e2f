"""Unit tests of the steps :func:`deadline_pipeline.plan.occurrences.expansion` is made of: the frame a
series is stepped in, DTSTART outside its RRULE, the jump of sub-daily series to the window, EXDATE
days and moments, RDATE times, BYWEEKNO/BYSETPOS corrections and the per-item walk (split bounds,
UNTIL, THISANDFUTURE shift, business-day roll, window, cap and budget)."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from dateutil.rrule import DAILY, rrule

from deadline_pipeline.plan import occurrences as occ
from deadline_pipeline.plan import rfc_series as rfc
from deadline_pipeline.plan.recurrence import validate_rrule
from deadline_pipeline.rules import RuleRecord

NY = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")
AFTER = datetime(2026, 3, 1, tzinfo=UTC)
BEFORE = datetime(2026, 4, 1, tzinfo=UTC)


def bounds(**kw) -> occ._Bounds:
    values = dict(until_instant=None, shift=timedelta(0), split_from=None, split_before=None, exdates=[], rdates=[])
    values.update(kw)
    return occ._Bounds(**values)


def test_bounds_read_until_as_an_instant_and_the_callers_until_only_without_count():
    rule = RuleRecord("r", "t", "2026-01-05T09:00:00", "America/New_York", "FREQ=DAILY;UNTIL=20260110")
    got = occ._bounds(rule, validate_rrule(rule.rrule), NY, None)
    # A DATE UNTIL next to a timed DTSTART is the end of that local day (shared case C02).
    assert got.until_instant == datetime(2026, 1, 10, 23, 59, 59, tzinfo=NY)
    fallback = datetime(2026, 2, 1, tzinfo=UTC)
    counted = RuleRecord("c", "t", "2026-01-05T09:00:00", "America/New_York", "FREQ=DAILY;COUNT=3")
    assert occ._bounds(counted, validate_rrule(counted.rrule), NY, fallback).until_instant is None
    plain = RuleRecord("p", "t", "2026-01-05T09:00:00", "America/New_York", "FREQ=DAILY")
    assert occ._bounds(plain, validate_rrule(plain.rrule), NY, fallback).until_instant == fallback


def test_bounds_name_the_rule_for_an_unreadable_exdate():
    rule = RuleRecord("bad-ex", "t", "2026-01-05T09:00:00", "UTC", "FREQ=DAILY", ("2026-13-01",))
    with pytest.raises(ValueError, match="rule 'bad-ex'"):
        occ._bounds(rule, validate_rrule(rule.rrule), UTC, None)


def test_frame_of_a_plain_sub_daily_rule_is_utc_and_of_others_the_wall_clock():
    start = datetime(2026, 3, 8, 1, 30)  # New York, before the spring-forward gap
    hourly = occ._frame(start, NY, validate_rrule("FREQ=HOURLY"), bounds(), AFTER, BEFORE, None)
    assert hourly.elapsed and hourly.wall_zone is UTC
    assert hourly.dtstart == datetime(2026, 3, 8, 6, 30)  # the UTC instant, naive
    assert hourly.local_of(datetime(2026, 3, 8, 7, 30)) == datetime(2026, 3, 8, 3, 30)
    filtered = occ._frame(start, NY, validate_rrule("FREQ=HOURLY;BYMINUTE=30"), bounds(), AFTER, BEFORE, None)
    assert not filtered.elapsed and filtered.dtstart == start and filtered.wall_zone is NY
    assert filtered.of(datetime(2026, 3, 8, 2, 30)) == datetime(2026, 3, 8, 2, 30)


def test_frame_widens_the_window_by_a_day_the_shift_and_the_roll():
    shift = timedelta(hours=5)
    plain = occ._frame(datetime(2026, 1, 1, 9), UTC, validate_rrule("FREQ=DAILY"), bounds(shift=shift), AFTER,
                       BEFORE, None)
    assert (plain.lo, plain.hi) == (datetime(2026, 2, 27, 19), datetime(2026, 4, 2, 5))
    rolled = occ._frame(datetime(2026, 1, 1, 9), UTC, validate_rrule("FREQ=DAILY"), bounds(), AFTER, BEFORE,
                        ("US", "following"))
    assert plain.lo - rolled.lo == occ._ROLL_SLACK - shift


def test_frame_stops_the_engine_a_day_after_until_in_wall_time():
    until = datetime(2026, 3, 10, 12, tzinfo=UTC)
    got = occ._frame(datetime(2026, 1, 1, 9), BERLIN, validate_rrule("FREQ=DAILY"), bounds(until_instant=until),
                     AFTER, BEFORE, None)
    # One day of slack: UNTIL itself is enforced on instants, where a fold hour is unambiguous.
    assert got.engine_until == datetime(2026, 3, 11, 13)
    elapsed = occ._frame(datetime(2026, 1, 1, 9), BERLIN, validate_rrule("FREQ=HOURLY"),
                         bounds(until_instant=until), AFTER, BEFORE, None)
    assert elapsed.engine_until == datetime(2026, 3, 10, 12)


def test_a_dtstart_outside_its_rrule_is_an_instance_of_its_own_and_uses_up_one_count():
    recur = validate_rrule("FREQ=WEEKLY;BYDAY=WE;COUNT=3")
    thursday = datetime(2026, 1, 1, 9)
    frame = occ._frame(thursday, UTC, recur, bounds(), AFTER, BEFORE, None)
    assert occ._start_and_count(recur, frame, AFTER, bounds(), None) == (thursday, thursday, 2)
    wednesday = datetime(2025, 12, 31, 9)
    frame = occ._frame(wednesday, UTC, recur, bounds(), AFTER, BEFORE, None)
    assert occ._start_and_count(recur, frame, AFTER, bounds(), None) == (None, wednesday, 3)


def test_a_dtstart_after_until_is_an_instance_of_its_own_even_when_it_matches_its_rrule():
    """RFC 5545 §3.8.5.3: DTSTART is an instance whatever UNTIL says; the series yields nothing past
    UNTIL, so it is added on its own (and the walk lets it pass UNTIL). At UNTIL it is the series'."""
    friday = datetime(2027, 1, 1, 9)
    for rule in ("FREQ=WEEKLY;BYDAY=FR;UNTIL=20261201T000000Z", "FREQ=DAILY;UNTIL=20270101T085959Z",
                 "FREQ=MINUTELY;UNTIL=20261201T000000Z"):
        recur = validate_rrule(rule)
        until = bounds(until_instant=datetime(2027, 1, 1, 8, 59, 59, tzinfo=UTC))
        frame = occ._frame(friday, UTC, recur, until, AFTER, BEFORE, None)
        assert occ._start_and_count(recur, frame, AFTER, until, None)[0] == friday, rule
    at_until = bounds(until_instant=datetime(2027, 1, 1, 9, tzinfo=UTC))
    recur = validate_rrule("FREQ=DAILY;UNTIL=20270101T090000Z")
    frame = occ._frame(friday, UTC, recur, at_until, AFTER, BEFORE, None)
    assert occ._start_and_count(recur, frame, AFTER, at_until, None) == (None, friday, None)


def test_a_plain_sub_daily_series_jumps_to_the_window_and_lowers_its_count():
    recur = validate_rrule("FREQ=HOURLY;INTERVAL=5;COUNT=10000")
    start = datetime(2026, 1, 1, 0)
    frame = occ._frame(start, UTC, recur, bounds(), AFTER, BEFORE, None)
    instance, series_start, count = occ._start_and_count(recur, frame, AFTER, bounds(), None)
    assert instance is None
    assert series_start <= datetime(2026, 3, 1) < series_start + timedelta(hours=5)
    jumped = int((series_start - start).total_seconds()) // (5 * 3600)
    assert (series_start - start) % timedelta(hours=5) == timedelta(0)
    assert count == 10000 - jumped


def test_a_filtered_sub_daily_series_without_count_jumps_in_whole_days():
    recur = validate_rrule("FREQ=HOURLY;INTERVAL=5;BYMINUTE=0")
    start = datetime(2026, 1, 1, 3)
    frame = occ._frame(start, UTC, recur, bounds(), AFTER, BEFORE, None)
    _instance, series_start, count = occ._start_and_count(recur, frame, AFTER, bounds(), None)
    assert count is None and series_start > start
    # A multiple of both the interval and a day: the wall-clock filters still match the same hours.
    assert (series_start - start) % timedelta(hours=120) == timedelta(0)
    counted = validate_rrule("FREQ=HOURLY;INTERVAL=5;BYMINUTE=0;COUNT=9")
    frame = occ._frame(start, UTC, counted, bounds(), AFTER, BEFORE, None)
    assert occ._start_and_count(counted, frame, AFTER, bounds(), None)[1:] == (start, 9)


def test_exclusions_split_date_exdates_from_moments():
    frame = occ._frame(datetime(2026, 1, 1, 9), UTC, validate_rrule("FREQ=DAILY"), bounds(), AFTER, BEFORE, None)
    days, moments = occ._exclusions([date(2026, 3, 2), datetime(2026, 3, 3, 9)], False, frame)
    # A DATE EXDATE against a timed series takes that whole local day (ical.net #830).
    assert (days, moments) == ({date(2026, 3, 2)}, [datetime(2026, 3, 3, 9)])
    days, moments = occ._exclusions([datetime(2026, 3, 3, 9)], True, frame)
    assert (days, moments) == ({date(2026, 3, 3)}, [])


def test_a_date_rdate_is_due_at_dtstarts_time_or_at_the_end_of_an_all_day():
    frame = occ._frame(datetime(2026, 1, 1, 9), UTC, validate_rrule("FREQ=DAILY"), bounds(), AFTER, BEFORE, None)
    assert occ._rdate_moments([date(2026, 3, 5)], False, time(9, 15), frame) == [datetime(2026, 3, 5, 9, 15)]
    assert occ._rdate_moments([date(2026, 3, 5)], True, time(0), frame) == [datetime(2026, 3, 5, 23, 59, 59)]


def test_engine_of_an_rdate_only_rule_starts_with_its_dtstart_and_drops_exdates():
    rule = RuleRecord("rd", "t", "2026-03-02T09:00:00", "UTC", None)
    frame = occ._frame(datetime(2026, 3, 2, 9), UTC, None, bounds(), AFTER, BEFORE, None)
    got = list(occ._engine(rule, None, frame, frame.dtstart, None, [datetime(2026, 3, 9, 9), datetime(2026, 3, 5, 9)],
                           [datetime(2026, 3, 5, 9)]))
    assert got == [datetime(2026, 3, 2, 9), datetime(2026, 3, 9, 9)]


def walk(rule: RuleRecord, zone, *, b: occ._Bounds | None = None, business=None, limit=None, ex_days=(),
         unbounded=frozenset()) -> occ._Walk:
    b = b or bounds()
    frame = occ._frame(rule.start_local(), zone, validate_rrule(rule.rrule), b, AFTER, BEFORE, business)
    return occ._Walk(rule, zone, AFTER, BEFORE, frame, b, set(ex_days), unbounded, occ._business(business), limit)


DAILY_NY = RuleRecord("d", "t", "2026-01-01T09:00:00", "America/New_York", "FREQ=DAILY")


def test_place_stops_at_the_next_piece_and_skips_before_its_own():
    w = walk(DAILY_NY, NY, b=bounds(split_from=datetime(2026, 3, 10, 9), split_before=datetime(2026, 3, 20, 9)))
    assert w.place(datetime(2026, 3, 9, 9)) is None
    assert w.place(datetime(2026, 3, 10, 9)) == occ.Occurrence("2026-03-10T09:00:00",
                                                              datetime(2026, 3, 10, 13, tzinfo=UTC))
    assert w.place(datetime(2026, 3, 20, 9)) is occ._STOP


def test_place_applies_until_to_the_series_but_not_to_rdates():
    until = datetime(2026, 3, 10, 13, tzinfo=UTC)
    late = datetime(2026, 3, 11, 9)
    assert walk(DAILY_NY, NY, b=bounds(until_instant=until)).place(datetime(2026, 3, 10, 9)) is not None
    assert walk(DAILY_NY, NY, b=bounds(until_instant=until)).place(late) is None
    assert walk(DAILY_NY, NY, b=bounds(until_instant=until), unbounded=frozenset({late})).place(late) is not None


def test_place_skips_an_exdate_day_and_an_item_outside_the_window():
    w = walk(DAILY_NY, NY, ex_days={date(2026, 3, 12)})
    assert w.place(datetime(2026, 3, 12, 9)) is None
    assert w.place(datetime(2026, 2, 28, 9)) is None  # inside the widened frame, before the window
    assert w.place(datetime(2026, 3, 13, 9)) is not None


def test_a_shift_is_wall_clock_time_across_dst_and_keeps_the_period():
    # 8 March 2026: New York springs forward. 09:00 on the 7th shifted by a day is 09:00 on the 8th,
    # 13:00Z (EDT), not 14:00Z (24 elapsed hours).
    w = walk(DAILY_NY, NY, b=bounds(shift=timedelta(days=1)))
    assert w.place(datetime(2026, 3, 7, 9)) == occ.Occurrence("2026-03-07T09:00:00",
                                                             datetime(2026, 3, 8, 13, tzinfo=UTC))


def test_an_elapsed_item_is_labelled_by_its_utc_instant_and_shifted_in_elapsed_time():
    rule = RuleRecord("h", "t", "2026-03-01T00:00:00", "America/New_York", "FREQ=HOURLY")
    w = walk(rule, NY, b=bounds(shift=timedelta(hours=1)))
    got = w.place(datetime(2026, 3, 8, 6, 30))  # 01:30 EST, the hour before the gap
    assert got == occ.Occurrence("2026-03-08T06:30:00Z", datetime(2026, 3, 8, 7, 30, tzinfo=UTC))


def test_business_day_roll_moves_the_due_date_and_keeps_the_period():
    rule = RuleRecord("b", "t", "2026-01-01T09:00:00", "UTC", "FREQ=DAILY")
    w = walk(rule, UTC, business=({date(2026, 3, 9)}, "following"))
    saturday = w.place(datetime(2026, 3, 7, 9))
    assert saturday == occ.Occurrence("2026-03-07T09:00:00", datetime(2026, 3, 10, 9, tzinfo=UTC))


def test_run_cuts_one_past_the_cap_and_names_where(monkeypatch):
    monkeypatch.setattr(occ, "MAX_OCCURRENCES", 3)
    rule = RuleRecord("d", "t", "2026-03-01T09:00:00", "UTC", "FREQ=DAILY")
    w = walk(rule, UTC)
    items = rrule(DAILY, dtstart=datetime(2026, 3, 1, 9), count=3)
    assert w.run(items) == (w.run(items)[0], None)
    out, cut_at = w.run(rrule(DAILY, dtstart=datetime(2026, 3, 1, 9), count=4))
    assert [o.due_at.day for o in out] == [1, 2, 3] and cut_at == datetime(2026, 3, 4, 9, tzinfo=UTC)
    assert walk(rule, UTC, limit=2).run(rrule(DAILY, dtstart=datetime(2026, 3, 1, 9), count=4))[1] is None


def test_run_sorts_occurrences_a_roll_put_out_of_order():
    rule = RuleRecord("b", "t", "2026-01-01T09:00:00", "UTC", "FREQ=DAILY")
    w = walk(rule, UTC, business=(set(), "preceding"))
    out, _cut = w.run([datetime(2026, 3, 6, 10), datetime(2026, 3, 7, 9)])  # Friday 10:00, Saturday → Friday 09:00
    assert [o.period for o in out] == ["2026-03-07T09:00:00", "2026-03-06T10:00:00"]


def test_run_counts_items_before_the_window_against_the_budget(monkeypatch):
    monkeypatch.setattr(occ, "MAX_STEPS", 10)
    rule = RuleRecord("old", "t", "2026-01-01T09:00:00", "UTC", "FREQ=DAILY")
    with pytest.raises(occ.ExpansionBudgetExceeded, match="rule 'old'.*more than 10 steps") as raised:
        walk(rule, UTC).run(rrule(DAILY, dtstart=datetime(2026, 1, 1, 9), count=100))
    assert raised.value.counts["expansion_budget"] == 1


def test_counted_from_drops_items_before_dtstart_without_using_up_count():
    items = [datetime(2026, 1, d) for d in (1, 2, 3, 4, 5)]
    assert list(rfc._counted_from(items, datetime(2026, 1, 3), 2)) == [datetime(2026, 1, 3), datetime(2026, 1, 4)]
    assert list(rfc._counted_from(items, datetime(2026, 1, 3), None)) == items[2:]


def test_widened_weeks_asks_for_the_neighbours_and_keeps_bysetpos_for_later():
    kwargs, setpos, begin = rfc._widened_weeks({"byweekno": [53], "bysetpos": [1]}, [53], datetime(2026, 5, 4, 9))
    assert kwargs == {"byweekno": [52, 53]} and setpos == [1] and begin == datetime(2026, 1, 1, 9)
    kwargs, setpos, begin = rfc._widened_weeks({"byweekno": [1]}, [1], datetime(2026, 5, 4, 9))
    assert kwargs == {"byweekno": [1, 2]} and setpos is None and begin == datetime(2026, 5, 4, 9)


def test_in_weeks_numbers_a_straddling_week_as_rfc_5545_does():
    # 2022-01-02 (a Sunday) is in week 52 of 2021 for Monday weeks; dateutil called it week 53.
    assert rfc._in_weeks(datetime(2022, 1, 2), [52], 0)
    assert not rfc._in_weeks(datetime(2022, 1, 2), [53], 0)
    assert rfc._in_weeks(datetime(2021, 12, 27), [-1], 0)  # the last week of 2021


def test_right_weeks_picks_bysetpos_per_calendar_year():
    # Week 2 of 2026 starts on 5 January, of 2027 on 11 January (4 January is always in week 1).
    items = [datetime(2026, 1, 5), datetime(2026, 1, 6), datetime(2027, 1, 4), datetime(2027, 1, 11),
             datetime(2027, 1, 12)]
    assert list(rfc._right_weeks(iter(items), [2], 0, [-1])) == [datetime(2026, 1, 6), datetime(2027, 1, 12)]
    assert list(rfc._right_weeks(iter(items), [2], 0, [1])) == [datetime(2026, 1, 5), datetime(2027, 1, 11)]
    assert list(rfc._right_weeks(iter(items), [2], 0, None)) == items[:2] + items[3:]


def test_filtered_keeps_an_item_inside_the_piece_and_off_the_exdate_days():
    w = walk(DAILY_NY, NY, b=bounds(split_from=datetime(2026, 3, 10, 9)), ex_days={date(2026, 3, 12)})
    assert w.filtered(datetime(2026, 3, 11, 9)) is occ._KEEP
    assert w.filtered(datetime(2026, 3, 12, 9)) is None
    assert w.filtered(datetime(2026, 3, 9, 9)) is None
    assert not walk(DAILY_NY, NY).filters and not walk(DAILY_NY, NY).moves
