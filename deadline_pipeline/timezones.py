"""Time-zone names as sources write them, resolved to a ``tzinfo`` — never silently UTC.

Accepted spellings:

* IANA names (``America/Los_Angeles``), through :mod:`zoneinfo`;
* ``AoE`` ("Anywhere on Earth") = the fixed offset UTC-12, which never observes daylight saving
  (the convention of conference deadlines, e.g. the IEEE and NeurIPS calls for papers);
* fixed offsets ``UTC``, ``UTC-12``, ``UTC+5:30``, ``GMT+8``, ``+02:00`` (``GMT+8`` means eight hours
  *ahead* of UTC, as conference pages use it — not the inverted POSIX ``Etc/GMT+8``);
* abbreviations with one common meaning, mapped explicitly (``PST``/``PDT``…): a daylight-time
  abbreviation means that fixed offset, because a source that writes ``PDT`` means -07:00 even when
  it uses it in winter;
* Windows zone names (``W. Europe Standard Time``), through the CLDR table below.

Anything else raises :class:`UnknownTimeZone` naming the input.
"""

from __future__ import annotations

import re
from datetime import UTC, timedelta, timezone, tzinfo
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError


class UnknownTimeZone(ValueError):
    """A time-zone name that maps to no zone; the message names the input."""


# Fixed-offset abbreviations, hours east of UTC. Ambiguous ones (IST, CST of China vs. US) are
# resolved to their most common meaning in deadline feeds and documented here.
ABBREVIATIONS: dict[str, float] = {
    "UTC": 0, "GMT": 0, "Z": 0, "UT": 0, "WET": 0, "BST": 1, "WEST": 1,
    "CET": 1, "CEST": 2, "MET": 1, "MEST": 2, "EET": 2, "EEST": 3, "MSK": 3,
    "IST": 5.5,  # India Standard Time (not Irish/Israel): the usual meaning in conference calls
    "PKT": 5, "ICT": 7, "WIB": 7, "SGT": 8, "HKT": 8, "AWST": 8, "KST": 9, "JST": 9,
    "ACST": 9.5, "AEST": 10, "AEDT": 11, "NZST": 12, "NZDT": 13,
    "HST": -10, "AKST": -9, "AKDT": -8, "PST": -8, "PDT": -7, "MST": -7, "MDT": -6,
    "CST": -6, "CDT": -5, "EST": -5, "EDT": -4, "AST": -4, "ADT": -3, "NST": -3.5, "NDT": -2.5,
    "BRT": -3, "ART": -3,
    "AOE": -12,  # Anywhere on Earth
}

# Windows time-zone names → IANA, from the Unicode CLDR windowsZones table (territory "001").
WINDOWS_ZONES: dict[str, str] = {
    "UTC": "Etc/UTC",
    "GMT Standard Time": "Europe/London",
    "Greenwich Standard Time": "Atlantic/Reykjavik",
    "W. Europe Standard Time": "Europe/Berlin",
    "Central Europe Standard Time": "Europe/Budapest",
    "Central European Standard Time": "Europe/Warsaw",
    "Romance Standard Time": "Europe/Paris",
    "E. Europe Standard Time": "Europe/Chisinau",
    "FLE Standard Time": "Europe/Kiev",
    "GTB Standard Time": "Europe/Bucharest",
    "Russian Standard Time": "Europe/Moscow",
    "Israel Standard Time": "Asia/Jerusalem",
    "India Standard Time": "Asia/Calcutta",
    "China Standard Time": "Asia/Shanghai",
    "Singapore Standard Time": "Asia/Singapore",
    "Tokyo Standard Time": "Asia/Tokyo",
    "Korea Standard Time": "Asia/Seoul",
    "AUS Eastern Standard Time": "Australia/Sydney",
    "New Zealand Standard Time": "Pacific/Auckland",
    "Dateline Standard Time": "Etc/GMT+12",
    "Hawaiian Standard Time": "Pacific/Honolulu",
    "Alaskan Standard Time": "America/Anchorage",
    "Pacific Standard Time": "America/Los_Angeles",
    "Mountain Standard Time": "America/Denver",
    "US Mountain Standard Time": "America/Phoenix",
    "Central Standard Time": "America/Chicago",
    "Eastern Standard Time": "America/New_York",
    "Atlantic Standard Time": "America/Halifax",
    "E. South America Standard Time": "America/Sao_Paulo",
    "SA Pacific Standard Time": "America/Bogota",
}

_OFFSET = re.compile(r"^(?:UTC|GMT|UT)?\s*(?P<sign>[+-])\s*(?P<h>\d{1,2})(?::?(?P<m>\d{2}))?$", re.IGNORECASE)


def _fixed(hours: float, name: str) -> timezone:
    if abs(hours) > 14:
        raise UnknownTimeZone(f"time zone {name!r}: offset {hours:+g} h is outside UTC-14..UTC+14")
    return timezone(timedelta(hours=hours)) if hours else UTC


@lru_cache(maxsize=512)
def resolve_zone(name: str) -> tzinfo:
    """Resolve a time-zone spelling to a ``tzinfo``.

    ``name``: an IANA name, ``AoE``, a fixed offset (``UTC-12``, ``GMT+8``, ``+05:30``), a mapped
    abbreviation (``PDT``) or a Windows zone name. Returns a ``ZoneInfo`` or a fixed ``timezone``.
    Raises :class:`UnknownTimeZone` naming the input when none applies; it never falls back to UTC.
    """
    if not isinstance(name, str) or not name.strip():
        raise UnknownTimeZone(f"time zone {name!r} is empty; a rule needs an IANA zone or a UTC offset")
    text = name.strip()
    upper = text.upper()
    if upper in ABBREVIATIONS:
        return _fixed(ABBREVIATIONS[upper], text)
    m = _OFFSET.match(text)
    if m:
        hours = int(m.group("h")) + int(m.group("m") or 0) / 60
        return _fixed(hours if m.group("sign") == "+" else -hours, text)
    if text in WINDOWS_ZONES:
        return ZoneInfo(WINDOWS_ZONES[text])
    try:
        if "/" in text or text in ("UTC", "GMT"):
            return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        pass
    raise UnknownTimeZone(
        f"unknown time zone {name!r}: expected an IANA name (Europe/Berlin), AoE, a UTC offset "
        "(UTC-12, GMT+8), a known abbreviation (PDT) or a Windows zone name"
    )
