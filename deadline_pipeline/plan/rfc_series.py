"""An RRULE's own instances as RFC 5545 §3.3.10 defines them (pure; no I/O): python-dateutil's
:class:`~dateutil.rrule.rrule`, corrected where it departs from the RFC — the first week of a weekly
BYSETPOS rule counted from WKST, BYWEEKNO weeks that straddle New Year (:func:`rfc_week`), BYSETPOS
picked after the weeks are right, COUNT consumed only by the instances kept. The expansion
(:mod:`deadline_pipeline.plan.occurrences`) reads every series from :func:`series`."""

from __future__ import annotations

from datetime import date, datetime, timedelta

from dateutil.rrule import rrule

from deadline_pipeline.plan.recurrence import FREQS, Recur


def _week_start(day: date, wkst: int) -> date:
    return day - timedelta(days=(day.weekday() - wkst) % 7)


def rfc_week(day: date, wkst: int) -> tuple[int, int, int]:
    """``(week-numbering year, week number, weeks in that year)`` of ``day`` for weeks starting on ``wkst``.

    RFC 5545 §3.3.10 (BYWEEKNO): week 1 is the first week with at least four days in the year, i.e.
    the week holding January 4th; with ``wkst`` Monday these are ISO 8601 weeks. A week straddling
    New Year belongs to the year holding its fourth day.
    """
    start = _week_start(day, wkst)
    year = (start + timedelta(days=3)).year
    first = _week_start(date(year, 1, 4), wkst)
    following = _week_start(date(year + 1, 1, 4), wkst)
    return year, (start - first).days // 7 + 1, (following - first).days // 7


def series(recur: Recur, dtstart: datetime, *, count: int | None = None, until: datetime | None = None):
    """The RRULE's own instances from ``dtstart`` (naive, one frame), as dateutil yields them, corrected
    where dateutil departs from RFC 5545 §3.3.10:

    * ``FREQ=WEEKLY`` with BYSETPOS: dateutil starts the first week at DTSTART instead of at WKST, so
      the positions of that week are counted from the wrong day (``BYDAY=MO,WE,FR;BYSETPOS=2`` from a
      Wednesday gave that week's Friday). Expanded from the week's start, earlier dates dropped.
    * BYWEEKNO: dateutil misnumbers the days of a week that straddles New Year (``BYWEEKNO=53`` gave
      2022-01-02, which is in week 52 of 2021, and ``BYWEEKNO=52`` missed it). It is asked for the
      neighbouring week numbers too, and each date is kept only when :func:`rfc_week` agrees.

    COUNT is applied after the correction, so the dropped dates never consume it. Returns an iterable.
    Raises as :class:`dateutil.rrule.rrule` does (``ValueError``) for arguments it refuses.
    """
    kwargs = recur.kwargs
    weekly_setpos = recur.freq == "WEEKLY" and "BYSETPOS" in recur.parts
    weekno = kwargs.get("byweekno")
    if not weekly_setpos and not weekno:
        return rrule(FREQS[recur.freq], dtstart=dtstart, count=count, until=until, **kwargs)
    wkst = kwargs.get("wkst", 0)
    begin = dtstart
    if weekly_setpos:
        begin = datetime.combine(_week_start(dtstart.date(), wkst), dtstart.time())
    setpos = None
    if weekno:
        kwargs, setpos, begin = _widened_weeks(kwargs, weekno, begin)
    engine = rrule(FREQS[recur.freq], dtstart=begin, until=until, **kwargs)
    return _counted_from(_right_weeks(engine, weekno, wkst, setpos) if weekno else engine, dtstart, count)


def _widened_weeks(kwargs: dict, weekno, begin: datetime) -> tuple[dict, tuple | list | None, datetime]:
    """dateutil's arguments for a BYWEEKNO rule, widened to the neighbouring week numbers, without
    BYSETPOS: ``(kwargs, setpos, begin)`` — the BYSETPOS to apply per year afterwards (None: none) and
    where to start (1 January of ``begin``'s year when there is one)."""
    # dateutil also misnumbers days of a straddling week by one (it misses 2022-01-02 for
    # BYWEEKNO=52): ask it for the neighbouring weeks too and keep the right days below.
    wide = {m for n in weekno for m in (n - 1, n, n + 1) if 1 <= abs(m) <= 53}
    kwargs = {**kwargs, "byweekno": sorted(wide)}
    # BYSETPOS picks from each year's set *after* the weeks are right: left to dateutil it
    # picked from the widened set (a neighbouring week's day, then dropped below), so
    # BYWEEKNO=52;BYSETPOS=1 gave nothing and BYWEEKNO=2;BYSETPOS=1 searched to year 9999.
    setpos = kwargs.pop("bysetpos", None)
    if isinstance(setpos, int):
        setpos = (setpos,)
    if setpos:
        # The first year's set starts on 1 January, not at DTSTART: positions count from there
        # (dates before DTSTART are dropped below, after the pick).
        begin = begin.replace(month=1, day=1)
    return kwargs, setpos, begin


def _in_weeks(item: datetime, weekno, wkst: int) -> bool:
    """Whether ``item`` lies in one of the BYWEEKNO weeks ``weekno`` (negative: from the year's end),
    numbered as RFC 5545 §3.3.10 does (:func:`rfc_week`) for weeks starting on ``wkst``."""
    _year, week, weeks = rfc_week(item.date(), wkst)
    return week in weekno or week - weeks - 1 in weekno


def _right_weeks(engine, weekno, wkst: int, setpos):
    """The items of ``engine`` (a widened BYWEEKNO series, ascending) in their right weeks, and with
    ``setpos`` (BYSETPOS, None: none) picked per calendar year."""
    if not setpos:
        for item in engine:
            if _in_weeks(item, weekno, wkst):
                yield item
        return
    # BYWEEKNO is YEARLY only, and BYSETPOS picks "within the set of recurrence instances in
    # the interval of FREQ" (RFC 5545 §3.3.10): the calendar year's matching instants.
    current, group = None, []
    for item in engine:
        if not _in_weeks(item, weekno, wkst):
            continue
        year = item.year
        if current is not None and year != current:
            yield from _positions(group, setpos)
            group = []
        current = year
        group.append(item)
    yield from _positions(group, setpos)


def _counted_from(items, dtstart: datetime, count: int | None):
    """``items`` (ascending) from ``dtstart`` on, at most ``count`` of them (None: all); the ones
    before ``dtstart`` are dropped without consuming COUNT."""
    left = count
    for item in items:
        if item < dtstart:
            continue
        yield item
        if left is not None:
            left -= 1
            if left <= 0:
                return


def _positions(group: list, setpos) -> list:
    """The members of one recurrence set that BYSETPOS selects (1-based, negative from the end;
    RFC 5545 §3.3.10), in order, without repeats."""
    picked = {group[p - 1 if p > 0 else p] for p in setpos if -len(group) <= (p - 1 if p > 0 else p) < len(group)}
    return sorted(picked)
