"""Wall times a zone skips (pure; no I/O): the spring-forward gaps of a year (:func:`zone_gaps`), the
nominal wall time of a skipped time (:func:`gap_wall`), and one occurrence per instant where a
skipped time lands on the instant of another (:func:`once_per_instant`, RFC 5545 §3.3.5 and
§3.8.5.3: "Duplicate instances are ignored"). The expansion (:mod:`deadline_pipeline.plan.occurrences`)
and the quiet hours (:mod:`deadline_pipeline.plan.planner`) read gaps from here."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache

from deadline_pipeline.plan.recurrence import to_instant


def gap_wall(wall: datetime, zone: tzinfo) -> datetime | None:
    """``wall`` (naive local in ``zone``) when it is a time a spring-forward gap skips (:func:`zone_gaps`),
    so that its instant shows another wall time; else None. What
    :attr:`~deadline_pipeline.plan.occurrences.Occurrence.wall` holds."""
    # The zone's gaps, cached per year, not a conversion of the instant back: this runs once per
    # occurrence, and reading the instant in the zone cost a quarter of an expansion.
    for start, end in zone_gaps(zone, wall.year):
        if start <= wall < end:
            return wall
    return None


@dataclass(frozen=True, slots=True)
class Collapsed:
    """An occurrence left out because another occurrence of the same rule has its instant.

    ``dropped``: the local wall time (naive, in the rule's zone) that does not exist there — inside a
    spring-forward gap or a skipped day; ``kept``: the existing local wall time whose occurrence keeps
    the instant; ``instant``: the aware UTC instant both map to (RFC 5545 §3.3.5).
    """

    dropped: datetime
    kept: datetime
    instant: datetime


@dataclass(slots=True)
class _Pending:
    """An item :func:`once_per_instant` holds back."""

    item: datetime  # as the series yielded it
    local: datetime  # the wall time it is due at (item + wall-clock shift)
    # For a nonexistent ``local`` not yet settled: the wall time its instant reads as, the only
    # occurrence it can collide with. None once settled, and for an item that exists.
    reads: datetime | None


#: Sampling step when looking for a zone's transitions: an offset that changed and changed back
#: within it would go unseen. The closest two offset changes of any zone in the IANA data (2026f) are
#: a week apart.
_SCAN_STEP = timedelta(hours=6)


_SCAN_FIRST = datetime.min.replace(tzinfo=UTC) + timedelta(days=2)


_SCAN_LAST = datetime.max.replace(tzinfo=UTC) - timedelta(days=2)


@lru_cache(maxsize=1024)
def zone_gaps(zone: tzinfo, year: int) -> tuple[tuple[datetime, datetime], ...]:
    """The spans of wall-clock time that do not exist in ``zone`` and touch local ``year``, ascending:
    ``(first nonexistent wall time, first existing one after it)``, naive local datetimes — one per
    forward transition (a spring-forward hour, Samoa's skipped 2011-12-30 as one day).

    Found by reading the offset every :data:`_SCAN_STEP` over the year (with two days of margin, so
    a gap across New Year is in both years) and bisecting each change to the second; cached per zone
    and year (about 1,500 conversions once). Works on any ``tzinfo`` that converts from UTC.
    """
    # At the ends of datetime's range, two days inside it: converting to a zone must not overflow.
    t = datetime(year - 1, 12, 30, tzinfo=UTC) if year > 1 else _SCAN_FIRST
    end = datetime(year + 1, 1, 3, tzinfo=UTC) if year < 9999 else _SCAN_LAST
    before = t.astimezone(zone).utcoffset()
    out = []
    while t < end:
        step = t + _SCAN_STEP
        after = step.astimezone(zone).utcoffset()
        if after != before:
            if after > before:
                moment = _transition(zone, t, step, before)
                out.append(((moment + before).replace(tzinfo=None), (moment + after).replace(tzinfo=None)))
            before = after
        t = step
    return tuple(g for g in out if g[0].year <= year <= g[1].year)


def _transition(zone: tzinfo, lo: datetime, hi: datetime, before: timedelta) -> datetime:
    """The first whole second in ``(lo, hi]`` (aware UTC) at which ``zone``'s offset is no longer ``before``."""
    while hi - lo > timedelta(seconds=1):
        mid = lo + timedelta(seconds=int((hi - lo).total_seconds()) // 2)
        if mid.astimezone(zone).utcoffset() == before:
            lo = mid
        else:
            hi = mid
    return hi


def _gap_length(local: datetime, gaps: tuple[tuple[datetime, datetime], ...]) -> timedelta | None:
    """The length of the gap of ``gaps`` (:func:`zone_gaps`) that ``local`` lies in, or None when it
    lies in none (it exists)."""
    for start, end in gaps:
        if start <= local < end:
            return end - start
    return None


def once_per_instant(items: Iterable[datetime], zone: tzinfo, dropped: list[Collapsed], *,
                     shift: timedelta = timedelta(0), earliest: datetime | None = None) -> Iterator[datetime]:
    """``items`` with at most one per UTC instant: a nonexistent local time whose instant is that of
    another item is left out, and appended to ``dropped`` as :class:`Collapsed`.

    ``items``: naive wall-clock datetimes in ``zone``, ascending (as a series yields them);
    ``shift``: a wall-clock shift added to each before reading it in ``zone`` (a THISANDFUTURE
    piece); ``earliest``: items before it (naive, same frame) are passed on unexamined — the caller
    drops them, and a series read from a DTSTART years back must not pay for it. Yields the items
    themselves, unshifted, in their order. Lazy: from a nonexistent item on, items are held back
    until it is settled — until the wall time its instant reads as comes (an item there keeps the
    instant) or passes (it has no partner and is kept); a gap is at most a day long, so at most a
    day of series is held.

    Why the existing one keeps the instant: RFC 5545 §3.3.10 reads a nonexistent computed local time
    "in the same manner as an explicit DATE-TIME value" (§3.3.5), and §3.3.5 interprets that "using
    the UTC offset before the gap in local times" — so Samoa's skipped 2011-12-30 09:00 names the
    instant of 2011-12-31 09:00, and 02:30 on a 02:00→03:00 night that of 03:30. Both are then one
    instance, and §3.8.5.3 says "Duplicate instances are ignored". The occurrence at a time that
    exists on the wall clock names that instant as written: its period (the obligation's identity)
    is the date and time the subscriber sees. Without this, both were planned: two identical mails.
    No I/O and no global state (the zone's gaps are memoised, :func:`zone_gaps`); the only effect is
    the appending to ``dropped``. Raises nothing of its own.
    """
    held: deque[_Pending] = deque()
    # Items below `quiet` (in the items' frame) pass with one comparison: before `earliest`, or before
    # the next gap (or New Year, where the next year's gaps are read) while nothing is held. Reading
    # each item in the zone cost a tenth of a whole expansion.
    quiet = earliest or datetime.min
    for item in items:
        if item < quiet:
            yield item
            continue
        local = item + shift
        gaps = zone_gaps(zone, local.year)
        length = _gap_length(local, gaps)
        if held or length is not None:
            yield from _settle(held, _Pending(item, local, None if length is None else local + length), zone,
                               dropped)
        else:
            yield item
        quiet = datetime.min if held else _unshifted(_next_boundary(local, gaps), shift)
    for p in held:
        yield p.item


def _next_boundary(local: datetime, gaps: tuple[tuple[datetime, datetime], ...]) -> datetime:
    """The first wall time after ``local`` (naive) where :func:`once_per_instant` must look again:
    the start of the next gap of ``gaps`` (:func:`zone_gaps` of ``local``'s year), else New Year."""
    later = [start for start, _end in gaps if start > local]
    if later:
        return min(later)
    return datetime(local.year + 1, 1, 1) if local.year < 9999 else datetime.max


def _unshifted(local: datetime, shift: timedelta) -> datetime:
    """``local - shift``, held inside datetime's range (a boundary at its end is as good as none)."""
    try:
        return local - shift
    except OverflowError:
        return datetime.max if shift < timedelta(0) else datetime.min


def _settle(held: deque[_Pending], new: _Pending, zone: tzinfo, dropped: list[Collapsed]) -> Iterator[datetime]:
    """Add ``new`` to ``held`` (in series order) and yield the items no longer held back: settle each
    held nonexistent item whose partner's wall time has passed (it is kept), and drop the one whose
    partner ``new`` is (recorded in ``dropped``)."""
    for p in held:
        if p.reads is not None and p.reads < new.local:
            p.reads = None
    if new.reads is None:
        partner = next((p for p in held if p.reads == new.local), None)
        if partner is not None:
            held.remove(partner)
            dropped.append(Collapsed(partner.local, new.local, to_instant(new.local, zone)))
    held.append(new)
    while held and held[0].reads is None:
        yield held.popleft().item
