"""Send instants around every daylight-saving change of 2026, in every IANA zone, computed twice.

The planner's instants (``plan_target``: expansion, nominal wall time, ``send_instant``, quiet hours)
are checked against references built another way: calendar-day offsets with python-dateutil's
``relativedelta`` and its ``resolve_imaginary`` (RFC 5545 §3.3.5/§3.3.6: a day keeps the wall time, a
time that does not exist moves forward by the gap), and quiet windows by scanning the subscriber's
clock minute by minute. The example tests pin single cases; these catch the class: a reminder an hour
off because one path read a wall time the clock never shows, in a zone nobody thought of.
"""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from functools import cache
from zoneinfo import ZoneInfo, available_timezones

import pytest
from dateutil import tz as dtz
from dateutil.relativedelta import relativedelta

from deadline_pipeline.plan.offsets import Offset
from deadline_pipeline.plan.planner import Target, apply_quiet_hours, plan_target
from deadline_pipeline.rules import RuleRecord, format_local

YEAR = 2026
MINUTE = timedelta(minutes=1)
OFFSETS = [Offset.parse(t) for t in ("-P1D", "-P7D", "-P1DT1H30M", "-PT24H", "PT0S")]


def _offset_at(zone: ZoneInfo, t: datetime) -> timedelta:
    return t.astimezone(zone).utcoffset()


@cache
def transitions(name: str) -> tuple[tuple[datetime, timedelta, timedelta], ...]:
    """``(instant, offset before, offset after)`` of each change of ``name``'s UTC offset in ``YEAR``,
    found by a daily scan and bisection to the minute (not the planner's own gap finder)."""
    zone = ZoneInfo(name)
    out = []
    t = datetime(YEAR, 1, 1, tzinfo=UTC)
    before = _offset_at(zone, t)
    while t.year == YEAR:
        nxt = t + timedelta(days=1)
        after = _offset_at(zone, nxt)
        if after != before:
            lo, hi = t, nxt
            while hi - lo > MINUTE:
                mid = lo + (hi - lo) / 2
                mid = mid.replace(second=0, microsecond=0)
                if mid <= lo:
                    mid = lo + MINUTE
                lo, hi = (mid, hi) if _offset_at(zone, mid) == before else (lo, mid)
            out.append((hi, before, after))
            before = after
        t = nxt
    return tuple(out)


ZONES = sorted(n for n in available_timezones() if transitions(n))


def _reference(wall: datetime, zone: ZoneInfo, offset: Offset) -> datetime:
    """The send instant by dateutil: days on the naive wall time, a time in a gap resolved forward by
    the gap (``resolve_imaginary``), a repeated one its first occurrence, then the exact seconds."""
    local = (wall + relativedelta(days=offset.days)).replace(tzinfo=zone)
    if not dtz.datetime_exists(local):
        local = dtz.resolve_imaginary(local)
    return local.astimezone(UTC) + timedelta(seconds=offset.seconds)


def _walls(zone: ZoneInfo) -> list[datetime]:
    """Nominal wall times (naive) at and around each change: the first skipped or repeated minute, its
    middle, its last minute, the first minute after, and the same a day and a week later (so that the
    reminder, not the deadline, lands on the change)."""
    out = []
    for instant, before, after in transitions(zone.key):
        first, last = sorted(((instant + before).replace(tzinfo=None), (instant + after).replace(tzinfo=None)))
        span = last - first
        for w in (first, first + span / 2, last - MINUTE, last, first - MINUTE):
            w = w.replace(second=0, microsecond=0)
            out += [w, w + timedelta(days=1), w + timedelta(days=7)]
    return out


@pytest.mark.parametrize("name", ZONES)
def test_calendar_day_offsets_agree_with_relativedelta_around_each_change(name):
    zone = ZoneInfo(name)
    walls = _walls(zone)
    rules = [(1, RuleRecord(f"r{i}", "R", format_local(w), name)) for i, w in enumerate(walls)]
    # A daily series through each change too: its occurrences' nominal times come from the expansion.
    for instant, before, after in transitions(name):
        first = (instant + min(before, after)).replace(tzinfo=None, second=0, microsecond=0)
        start = first + abs(after - before) / 2 - timedelta(days=3)
        rules.append((1, RuleRecord(f"d{instant:%m%d}", "D", format_local(start.replace(second=0)), name,
                                    rrule="FREQ=DAILY;COUNT=7")))
    target = Target(1, "ann", "t", name, 1, "cal", None, ("*",), tuple(OFFSETS), ("mail",))
    now = datetime(YEAR - 1, 11, 1, tzinfo=UTC)
    obs, problems = plan_target(target, rules, now, timedelta(days=500))
    assert not problems
    starts = {rid: rule.start_local() for _, rule in rules for rid in [rule.rule_id]}
    checked = 0
    for ob in obs:
        if ob.period == "once":
            wall = starts[ob.rule_id]
        else:
            wall = datetime.combine(datetime.fromisoformat(ob.period).date(), starts[ob.rule_id].time())
        assert ob.due_at == _reference(wall, zone, Offset(0, 0)), (name, wall)
        for a in ob.alerts:
            assert a.send_at == _reference(wall, zone, a.offset), (name, format_local(wall), a.offset.iso())
            checked += 1
    assert checked >= len(walls) * len(OFFSETS)


# ------------------------------------------------------------------------------ quiet hours


def _distinct_changes() -> list[tuple[str, datetime, timedelta, timedelta]]:
    """One change for each distinct (offsets before and after, whether it skips or repeats midnight) of
    2026: the windows tried are placed relative to the change, so changes alike in those behave alike,
    and the scan below is minute by minute."""
    seen, out = set(), []
    for name in ZONES:
        for instant, before, after in transitions(name):
            key = (before, after, (instant + before).date() != (instant + after - MINUTE).date())
            if key not in seen:
                seen.add(key)
                out.append((name, instant, before, after))
    return out


def _windows(instant: datetime, before: timedelta, after: timedelta) -> list[tuple[time, time]]:
    """Quiet windows with an edge at the start, middle and end of the skipped or repeated span, wrapping
    midnight or not, short and long."""
    first, last = sorted(((instant + before).replace(tzinfo=None), (instant + after).replace(tzinfo=None)))
    mid = (first + (last - first) / 2).replace(second=0, microsecond=0)
    out = []
    for edge in (first, mid, last):
        for other in (timedelta(hours=-3), timedelta(hours=5), timedelta(hours=-20)):
            a, b = (edge + other, edge) if other < timedelta(0) else (edge, edge + other)
            if a.time() != b.time():
                out.append((a.time(), b.time()))
    return out


def _clock(zone: ZoneInfo, lo: datetime, hi: datetime) -> list[tuple[datetime, datetime]]:
    """``(instant, wall time it shows)`` for every minute in ``[lo, hi)``."""
    out, t = [], lo
    while t < hi:
        out.append((t, t.astimezone(zone).replace(tzinfo=None)))
        t += MINUTE
    return out


def _scanned_nights(window: tuple[time, time], clock: list[tuple[datetime, datetime]]) -> list:
    """The quiet windows of the minutes ``clock`` read (:func:`_clock`) as ``(first, end)`` instants: the
    window of local day *d* holds the instants whose wall time lies in [*d* start, *d*(+1) end); it runs
    from the first of them to the minute after the last (a fall-back that shows part of it twice keeps
    the whole night quiet)."""
    start, end = window
    wraps = timedelta(days=1) if end <= start else timedelta(0)
    nights: dict = {}
    for t, wall in clock:
        for d in (wall.date() - timedelta(days=1), wall.date()):
            if datetime.combine(d, start) <= wall < datetime.combine(d + wraps, end):
                nights[d] = (nights.get(d, (t,))[0], t + MINUTE)
    return list(nights.values())


def _scanned_end(send: datetime, nights: list) -> datetime | None:
    """The end of the scanned window ``send`` is in (one ending where another starts continues into
    it), or None."""
    at, inside = send, False
    for _ in range(4):
        for first, last in nights:
            if first <= at < last:
                at, inside = last, True
                break
        else:
            break
    return at if inside else None


@pytest.mark.parametrize("name, instant, before, after",
                         [pytest.param(*c, id=f"{c[0]}-{c[1]:%m%d}") for c in _distinct_changes()])
def test_quiet_hours_end_where_the_clock_leaves_the_window(name, instant, before, after):
    zone = ZoneInfo(name)
    lo, hi = instant - timedelta(hours=40), instant + timedelta(hours=40)  # whole windows of ±14 h
    far = instant + timedelta(days=30)
    clock = _clock(zone, lo, hi)
    for window in _windows(instant, before, after):
        quiet = f"{window[0]:%H:%M}-{window[1]:%H:%M}"
        nights = _scanned_nights(window, clock)
        t = instant - timedelta(hours=14)
        while t <= instant + timedelta(hours=14):
            expected = _scanned_end(t, nights)
            got, why = apply_quiet_hours(t, far, quiet, zone)
            assert got == (expected or t), (name, quiet, t.isoformat(), expected)
            assert (why is None) == (expected is None)
            t += timedelta(minutes=10)
