"""Instants given on the command line and in run configuration (``--as-of``, ``--from``, ``--to``),
and instants as every message prints them (:func:`instant_text`).

One parser for every command, so that one input gets one answer: before, ``status --as-of
9999-12-31T23:59:59Z`` failed with ``OverflowError: date value out of range`` where ``run`` said
"out of range", an offset of ``+25:00`` answered with Python's ``timedelta`` repr, and ``now`` with
``Invalid isoformat string``. Imports nothing of Dagster (the watchdog and ``status`` start without it).
"""

from __future__ import annotations

import calendar
import re
from datetime import UTC, datetime, tzinfo

# The years a replayed "now" or a preview window may lie in: a horizon, a grace window, a month's
# partition or a subscription's lead is added to it or taken from it, and the calendar must still have
# room (9999-12-31 plus the horizon, and 0001-01-01 minus a day, overflowed).
INSTANT_YEARS = (1900, 9000)

EXAMPLE = "2026-05-01T12:00:00Z"
_OFFSET = re.compile(r"[+-](\d{2}):?(\d{2})(?::?\d{2}(?:\.\d+)?)?$")


def parse_instant(text: str, years: tuple[int, int] = INSTANT_YEARS) -> datetime:
    """``text``, an ISO 8601 instant with an offset (``2026-05-01T12:00:00Z``, ``…+02:00``), as an
    aware UTC datetime.

    Raises ``ValueError`` with a reason that does not repeat the input (callers prefix the option
    and the value): not ISO 8601; an offset outside ±23:59; no offset (a replayed "now" must not
    depend on the machine's zone); a UTC year outside ``years``.
    """
    raw = text.strip()
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        offset = _OFFSET.search(raw)
        if offset and int(offset.group(1)) >= 24:
            raise ValueError("its UTC offset is out of range (-23:59 to +23:59)") from None
        raise ValueError(impossible_part(raw) or f"not an ISO 8601 instant; write e.g. {EXAMPLE}") from None
    if value.tzinfo is None:
        raise ValueError(f"has no offset; write e.g. {EXAMPLE}")
    offset = _OFFSET.search(raw)
    if offset and int(offset.group(2)) >= 60:
        # Python reads "+05:75" as +06:15: a typo in --as-of would replay another instant, unsaid.
        raise ValueError("its UTC offset's minutes are out of range (00 to 59)")
    return in_years(value, years)


def whole_second(value: datetime) -> datetime:
    """The aware ``value`` unchanged when it is a whole second; raises ``ValueError`` naming its
    fraction and the whole second it falls in otherwise.

    For the instants a command is given (``--as-of``, ``--from``, ``--to``): every summary, check and
    report prints instants to the second (:func:`instant_text`), so ``--as-of
    2026-05-01T12:00:00.750Z`` ran at .750 while every line said 12:00:00, the fraction dropped
    without a word. Refused, the instant a command is given is exactly the one it prints."""
    if not value.microsecond:
        return value
    fraction = f"{value.microsecond / 1e6:.6f}".rstrip("0")[1:]
    floor = value.replace(microsecond=0).astimezone(UTC).isoformat().replace("+00:00", "Z")
    raise ValueError(f"has a fraction of a second ({fraction}); instants are taken and shown to the whole "
                     f"second, so write the second you mean, e.g. {floor}")


def in_years(value: datetime, years: tuple[int, int] = INSTANT_YEARS) -> datetime:
    """The aware ``value`` as UTC; raises ``ValueError`` ("out of range (years …)") when its UTC
    year is outside ``years`` or it has no UTC form (``0001-01-01T00:00+01:00``)."""
    low, high = years
    try:
        value = value.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"out of range (years {low} to {high})") from None
    if not low <= value.year <= high:
        raise ValueError(f"out of range (years {low} to {high})")
    return value


def instant_text(value: datetime, zone: tzinfo = UTC) -> str:
    """The aware ``value`` as every summary, check, report and message shows an instant: ISO 8601 in
    ``zone`` (default UTC, written ``+00:00``) to the whole second, e.g. ``2026-12-02T15:28:34+00:00``.

    The fraction is dropped, never rounded: ``23:59:59.9`` stays in its second and its day. Through
    this one function because each message formatting its own instant printed the clock's
    microseconds (``last fresh 2026-12-02 15:28:34.551555+00:00``) next to whole seconds elsewhere.
    Raises ``ValueError`` for a naive ``value`` (it names no instant).
    """
    if value.utcoffset() is None:
        raise ValueError(f"{value.isoformat(timespec='seconds')} has no offset: it names no instant")
    try:
        return value.astimezone(zone).isoformat(timespec="seconds")
    except OverflowError:
        # 9999-12-31T23:00:00-05:00 has no UTC form; an error message naming such an input must not
        # itself fail, so it keeps the offset it was given (still one instant, read unambiguously).
        return value.isoformat(timespec="seconds")


# A date and time as ISO 8601 (extended or basic) or ICS writes it, each field by its digits alone.
_FIELDS = re.compile(r"^(\d{4})-?(\d{2})-?(\d{2})(?:[T ](\d{2})(?::?(\d{2})(?::?(\d{2}))?)?)?", re.IGNORECASE)


def impossible_part(text: str) -> str | None:
    """Why ``text``, written as a date or date-time (``2026-02-30T09:00:00Z``, ``20260230T090000``),
    names no moment: the first field out of range, e.g. ``"no such date: 2026-02 has 28 days"`` or
    ``"hour 24 is out of range (00 to 23)"``; ``None`` when its fields are in range or it is not of that
    shape. Python's parser says only "Invalid isoformat string" (or "day is out of range for month"),
    which the commands passed on as "not an ISO 8601 instant" for a date that is one in form."""
    m = _FIELDS.match(text.strip())
    if not m:
        return None
    year, month, day = (int(g) for g in m.group(1, 2, 3))
    if year == 0:
        return "year 0000 does not exist (the calendar starts at 0001)"
    if not 1 <= month <= 12:
        return f"month {m.group(2)} is out of range (01 to 12)"
    days = calendar.monthrange(year, month)[1]
    if not 1 <= day <= days:
        return f"no such date: {m.group(1)}-{m.group(2)} has {days} days"
    for group, what, top in ((4, "hour", 23), (5, "minute", 59), (6, "second", 59)):
        if m.group(group) is not None and int(m.group(group)) > top:
            hint = "; write 24:00 as 00:00 of the next day" if what == "hour" else ""
            return f"{what} {m.group(group)} is out of range (00 to {top}){hint}"
    return None
