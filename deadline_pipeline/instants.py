"""Instants given on the command line and in run configuration (``--as-of``, ``--from``, ``--to``).

One parser for every command, so that one input gets one answer: before, ``status --as-of
9999-12-31T23:59:59Z`` failed with ``OverflowError: date value out of range`` where ``run`` said
"out of range", an offset of ``+25:00`` answered with Python's ``timedelta`` repr, and ``now`` with
``Invalid isoformat string``. Imports nothing of Dagster (the watchdog and ``status`` start without it).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

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
        raise ValueError(f"not an ISO 8601 instant; write e.g. {EXAMPLE}") from None
    if value.tzinfo is None:
        raise ValueError(f"has no offset; write e.g. {EXAMPLE}")
    low, high = years
    try:
        value = value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00 has no UTC form
        raise ValueError(f"out of range (years {low} to {high})") from None
    if not low <= value.year <= high:
        raise ValueError(f"out of range (years {low} to {high})")
    return value
