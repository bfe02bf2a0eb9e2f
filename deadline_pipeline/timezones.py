"""Time-zone names as sources write them, resolved to a ``tzinfo`` — never silently UTC.

Accepted spellings:

* IANA names (``America/Los_Angeles``; in any case, ``europe/berlin``, since no two differ only in
  case), through :mod:`zoneinfo` — checked *before* abbreviations,
  so the IANA zones ``CET``, ``EET``, ``MET``, ``WET``, ``EST5EDT``, ``CST6CDT``, ``MST7MDT`` and
  ``PST8PDT`` are those zones with their daylight saving, never a fixed abbreviation offset (reading
  ``CET`` as a fixed UTC+1 puts every summer deadline an hour late);
* prefixed IANA names as Mozilla/Evolution write TZIDs (``/mozilla.org/20050126_1/Asia/Tokyo``,
  ``/softwarestudio.org/Olson_20011030_5/America/New_York``): the IANA name at the end;
* ``AoE`` (also spelt out, ``Anywhere on Earth``) = the fixed offset UTC-12, which never observes
  daylight saving (the convention of conference deadlines, e.g. the IEEE and NeurIPS calls for papers);
* fixed offsets ``UTC``, ``UTC-12``, ``UTC+5:30``, ``GMT+8``, ``+02:00``, their minus also written as the
  minus sign U+2212 or a dash (``UTC−12``, ``UTC–12``) (``GMT+8`` means eight hours
  *ahead* of UTC, as conference pages use it — not the inverted POSIX ``Etc/GMT+8``);
* abbreviations with one common meaning, mapped explicitly (``PST``/``PDT``…): a daylight-time
  abbreviation means that fixed offset, because a source that writes ``PDT`` means -07:00 even when
  it uses it in winter (which one was meant cannot be told, so ingest keeps the offset written and
  adds a note when the season is wrong: :data:`SEASONAL_ABBREVIATIONS`);
* Windows zone names (``W. Europe Standard Time``), through the CLDR table below.

IANA's ``Etc/GMT+5`` is read as IANA defines it, five hours *behind* UTC (the POSIX sign), unlike
``GMT+5``; ingest says so for each source that uses one (:func:`inverted_sign`).

Anything else raises :class:`UnknownTimeZone` naming the input. So do the keys of a machine's
zoneinfo folder that are not IANA zone names and mean different instants on different machines:
``localtime``, ``Factory``, ``posixrules``, ``posix/…``, ``right/…`` (IANA names are those of the
``tzdata`` package's zone list; its ``backward`` aliases such as ``US/Eastern`` stay accepted).

Floating times (RFC 5545 §3.3.5 form 1: an ICS date-time with neither ``Z`` nor ``TZID``, or a
source row without a zone) are *not* a zone and never resolve to UTC: the rule keeps ``tz=None`` and
is read in the calendar's ``X-WR-TIMEZONE`` when it declares one (the ICS parser puts it in ``tz``),
else in the source's configured zone, else in the subscriber's zone (the planner's choice). Reading a
floating time as UTC is the classic bug (shared case C14: 10:00 in Brisbane sent ten hours late).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from deadline_pipeline import zone_data


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

# Abbreviations of ABBREVIATIONS that name other zones too, with what else they name. Read as above,
# but said at ingest (:func:`ambiguous_abbreviation`): "23:59 CST" from a publisher in China is 14 hours
# earlier than the US Central reading, so a reminder at the deadline would come after it.
AMBIGUOUS_ABBREVIATIONS: dict[str, str] = {
    "CST": "China Standard Time (UTC+8, Asia/Shanghai) and Cuba Standard Time (UTC-5, America/Havana)",
    "IST": "Irish Standard Time (UTC+1, Europe/Dublin) and Israel Standard Time (UTC+2, Asia/Jerusalem)",
    "AST": "Arabia Standard Time (UTC+3, Asia/Riyadh)",
    "BST": "Bangladesh Standard Time (UTC+6, Asia/Dhaka)",
}


# Abbreviations of ABBREVIATIONS (and the fixed IANA zones EST, MST) that are one season's time of a zone
# with daylight saving: the zone whose clock they name. Read as written (a fixed offset), one used when
# that zone is on its other time (PST on a July date, when Los Angeles is on PDT) is said at ingest
# (``ingest.parsers.parse_payload``): it is most likely the publisher's slip, and an hour off.
SEASONAL_ABBREVIATIONS: dict[str, str] = {
    "PST": "America/Los_Angeles", "PDT": "America/Los_Angeles", "MST": "America/Denver", "MDT": "America/Denver",
    "CST": "America/Chicago", "CDT": "America/Chicago", "EST": "America/New_York", "EDT": "America/New_York",
    "AKST": "America/Anchorage", "AKDT": "America/Anchorage", "AST": "America/Halifax", "ADT": "America/Halifax",
    "NST": "America/St_Johns", "NDT": "America/St_Johns", "BST": "Europe/London", "WEST": "Europe/Lisbon",
    "CEST": "Europe/Berlin", "MEST": "Europe/Berlin", "EEST": "Europe/Athens", "AEST": "Australia/Sydney",
    "AEDT": "Australia/Sydney", "NZST": "Pacific/Auckland", "NZDT": "Pacific/Auckland",
}


def seasonal_abbreviation(name: object) -> tuple[tzinfo, ZoneInfo] | None:
    """``(the fixed offset it is read as, the zone whose season it names)`` for a zone written as one of
    :data:`SEASONAL_ABBREVIATIONS` (any case, surrounding space ignored) that :func:`resolve_zone` reads as
    a fixed offset; ``None`` for anything else (an IANA zone with daylight saving such as ``CET``)."""
    if not isinstance(name, str):
        return None
    region = SEASONAL_ABBREVIATIONS.get(name.strip().upper())
    if region is None:
        return None
    try:
        zone = resolve_zone(name)
    except UnknownTimeZone:
        return None
    if datetime(2026, 1, 1, tzinfo=zone).utcoffset() != datetime(2026, 7, 1, tzinfo=zone).utcoffset():
        return None
    try:
        return zone, _zone(region)
    except UnknownTimeZone:  # the region's zone is not in the zone data in force: no season to compare with
        return None


def ambiguous_abbreviation(name: object) -> str | None:
    """For a zone written as an abbreviation that names more than one zone (``CST``, ``IST``, ``AST``,
    ``BST``; any case, surrounding space ignored), a sentence saying how it is read and what else it
    names; ``None`` for anything else (an IANA name, an offset, an unambiguous abbreviation)."""
    if not isinstance(name, str):
        return None
    upper = name.strip().upper()
    others = AMBIGUOUS_ABBREVIATIONS.get(upper)
    if others is None or _iana(name.strip()) is not None:
        return None
    hours = ABBREVIATIONS[upper]
    offset = f"UTC{hours:+g}" if hours else "UTC"
    return (f"time zone {name.strip()!r} is ambiguous: read as {offset}, but it also names {others}; "
            "write the IANA name of the zone meant")


_POSIX_SIGNED = re.compile(r"^Etc/GMT(?P<sign>[+-])(?P<h>\d{1,2})$", re.IGNORECASE)


def inverted_sign(name: object) -> str | None:
    """For a zone written as IANA's ``Etc/GMT+5`` or ``Etc/GMT-8`` (any case, surrounding space ignored),
    a sentence saying it is read as IANA defines it, with POSIX's inverted sign, and what to write if the
    other reading was meant; ``None`` for anything else (``Etc/GMT+0``, ``GMT+8``, an IANA city).

    ``Etc/GMT+8`` is eight hours *behind* UTC, ``GMT+8`` (:data:`_OFFSET`) eight hours ahead. A publisher
    who meant Beijing by ``Etc/GMT+8`` gets its deadlines sixteen hours late; which was meant cannot be told,
    so it is read as IANA says and said where the source's records are reported."""
    if not isinstance(name, str):
        return None
    m = _POSIX_SIGNED.match(name.strip())
    if m is None or not int(m.group("h")):
        return None
    hours = int(m.group("h"))
    behind = m.group("sign") == "+"
    read, other = (f"UTC-{hours}", f"UTC+{hours}") if behind else (f"UTC+{hours}", f"UTC-{hours}")
    return (f"time zone {name.strip()!r} is read as IANA defines it, {read} ({hours} hour(s) "
            f"{'behind' if behind else 'ahead of'} UTC): in the Etc area the sign is POSIX's, the inverse of "
            f"'GMT{m.group('sign')}{hours}'; if {other} was meant, write {other}")


# Windows time-zone names → IANA, from the Unicode CLDR windowsZones table (territory "001", the
# zone Windows itself designates). Outlook and Exchange write these as TZID; without the table such a
# calendar's every event would be refused, and with a guess it would be silently wrong.
WINDOWS_ZONES: dict[str, str] = {
    "Dateline Standard Time": "Etc/GMT+12",
    "UTC-11": "Etc/GMT+11",
    "Aleutian Standard Time": "America/Adak",
    "Hawaiian Standard Time": "Pacific/Honolulu",
    "Marquesas Standard Time": "Pacific/Marquesas",
    "Alaskan Standard Time": "America/Anchorage",
    "UTC-09": "Etc/GMT+9",
    "Pacific Standard Time (Mexico)": "America/Tijuana",
    "UTC-08": "Etc/GMT+8",
    "Pacific Standard Time": "America/Los_Angeles",
    "US Mountain Standard Time": "America/Phoenix",
    "Mountain Standard Time (Mexico)": "America/Mazatlan",
    "Mountain Standard Time": "America/Denver",
    "Yukon Standard Time": "America/Whitehorse",
    "Central America Standard Time": "America/Guatemala",
    "Central Standard Time": "America/Chicago",
    "Easter Island Standard Time": "Pacific/Easter",
    "Central Standard Time (Mexico)": "America/Mexico_City",
    "Canada Central Standard Time": "America/Regina",
    "SA Pacific Standard Time": "America/Bogota",
    "Eastern Standard Time (Mexico)": "America/Cancun",
    "Eastern Standard Time": "America/New_York",
    "Haiti Standard Time": "America/Port-au-Prince",
    "Cuba Standard Time": "America/Havana",
    "US Eastern Standard Time": "America/Indiana/Indianapolis",
    "Turks And Caicos Standard Time": "America/Grand_Turk",
    "Paraguay Standard Time": "America/Asuncion",
    "Atlantic Standard Time": "America/Halifax",
    "Venezuela Standard Time": "America/Caracas",
    "Central Brazilian Standard Time": "America/Cuiaba",
    "SA Western Standard Time": "America/La_Paz",
    "Pacific SA Standard Time": "America/Santiago",
    "Newfoundland Standard Time": "America/St_Johns",
    "Tocantins Standard Time": "America/Araguaina",
    "E. South America Standard Time": "America/Sao_Paulo",
    "SA Eastern Standard Time": "America/Cayenne",
    "Argentina Standard Time": "America/Argentina/Buenos_Aires",
    "Greenland Standard Time": "America/Nuuk",
    "Montevideo Standard Time": "America/Montevideo",
    "Magallanes Standard Time": "America/Punta_Arenas",
    "Saint Pierre Standard Time": "America/Miquelon",
    "Bahia Standard Time": "America/Bahia",
    "UTC-02": "Etc/GMT+2",
    "Mid-Atlantic Standard Time": "Etc/GMT+2",
    "Azores Standard Time": "Atlantic/Azores",
    "Cape Verde Standard Time": "Atlantic/Cape_Verde",
    "UTC": "Etc/UTC",
    "GMT Standard Time": "Europe/London",
    "Greenwich Standard Time": "Atlantic/Reykjavik",
    "Sao Tome Standard Time": "Africa/Sao_Tome",
    "Morocco Standard Time": "Africa/Casablanca",
    "W. Europe Standard Time": "Europe/Berlin",
    "Central Europe Standard Time": "Europe/Budapest",
    "Romance Standard Time": "Europe/Paris",
    "Central European Standard Time": "Europe/Warsaw",
    "W. Central Africa Standard Time": "Africa/Lagos",
    "Jordan Standard Time": "Asia/Amman",
    "GTB Standard Time": "Europe/Bucharest",
    "Middle East Standard Time": "Asia/Beirut",
    "Egypt Standard Time": "Africa/Cairo",
    "E. Europe Standard Time": "Europe/Chisinau",
    "Syria Standard Time": "Asia/Damascus",
    "West Bank Standard Time": "Asia/Hebron",
    "South Africa Standard Time": "Africa/Johannesburg",
    "FLE Standard Time": "Europe/Kiev",
    "Israel Standard Time": "Asia/Jerusalem",
    "South Sudan Standard Time": "Africa/Juba",
    "Kaliningrad Standard Time": "Europe/Kaliningrad",
    "Sudan Standard Time": "Africa/Khartoum",
    "Libya Standard Time": "Africa/Tripoli",
    "Namibia Standard Time": "Africa/Windhoek",
    "Arabic Standard Time": "Asia/Baghdad",
    "Turkey Standard Time": "Europe/Istanbul",
    "Arab Standard Time": "Asia/Riyadh",
    "Belarus Standard Time": "Europe/Minsk",
    "Russian Standard Time": "Europe/Moscow",
    "E. Africa Standard Time": "Africa/Nairobi",
    "Volgograd Standard Time": "Europe/Volgograd",
    "Iran Standard Time": "Asia/Tehran",
    "Arabian Standard Time": "Asia/Dubai",
    "Astrakhan Standard Time": "Europe/Astrakhan",
    "Azerbaijan Standard Time": "Asia/Baku",
    "Russia Time Zone 3": "Europe/Samara",
    "Mauritius Standard Time": "Indian/Mauritius",
    "Saratov Standard Time": "Europe/Saratov",
    "Georgian Standard Time": "Asia/Tbilisi",
    "Caucasus Standard Time": "Asia/Yerevan",
    "Afghanistan Standard Time": "Asia/Kabul",
    "West Asia Standard Time": "Asia/Tashkent",
    "Ekaterinburg Standard Time": "Asia/Yekaterinburg",
    "Pakistan Standard Time": "Asia/Karachi",
    "Qyzylorda Standard Time": "Asia/Qyzylorda",
    "India Standard Time": "Asia/Kolkata",
    "Sri Lanka Standard Time": "Asia/Colombo",
    "Nepal Standard Time": "Asia/Kathmandu",
    "Central Asia Standard Time": "Asia/Bishkek",
    "Bangladesh Standard Time": "Asia/Dhaka",
    "Omsk Standard Time": "Asia/Omsk",
    "Myanmar Standard Time": "Asia/Yangon",
    "SE Asia Standard Time": "Asia/Bangkok",
    "Altai Standard Time": "Asia/Barnaul",
    "W. Mongolia Standard Time": "Asia/Hovd",
    "North Asia Standard Time": "Asia/Krasnoyarsk",
    "N. Central Asia Standard Time": "Asia/Novosibirsk",
    "Tomsk Standard Time": "Asia/Tomsk",
    "China Standard Time": "Asia/Shanghai",
    "North Asia East Standard Time": "Asia/Irkutsk",
    "Singapore Standard Time": "Asia/Singapore",
    "W. Australia Standard Time": "Australia/Perth",
    "Taipei Standard Time": "Asia/Taipei",
    "Ulaanbaatar Standard Time": "Asia/Ulaanbaatar",
    "Aus Central W. Standard Time": "Australia/Eucla",
    "Transbaikal Standard Time": "Asia/Chita",
    "Tokyo Standard Time": "Asia/Tokyo",
    "North Korea Standard Time": "Asia/Pyongyang",
    "Korea Standard Time": "Asia/Seoul",
    "Yakutsk Standard Time": "Asia/Yakutsk",
    "Cen. Australia Standard Time": "Australia/Adelaide",
    "AUS Central Standard Time": "Australia/Darwin",
    "E. Australia Standard Time": "Australia/Brisbane",
    "AUS Eastern Standard Time": "Australia/Sydney",
    "West Pacific Standard Time": "Pacific/Port_Moresby",
    "Tasmania Standard Time": "Australia/Hobart",
    "Vladivostok Standard Time": "Asia/Vladivostok",
    "Lord Howe Standard Time": "Australia/Lord_Howe",
    "Bougainville Standard Time": "Pacific/Bougainville",
    "Russia Time Zone 10": "Asia/Srednekolymsk",
    "Magadan Standard Time": "Asia/Magadan",
    "Norfolk Standard Time": "Pacific/Norfolk",
    "Sakhalin Standard Time": "Asia/Sakhalin",
    "Central Pacific Standard Time": "Pacific/Guadalcanal",
    "Russia Time Zone 11": "Asia/Kamchatka",
    "New Zealand Standard Time": "Pacific/Auckland",
    "UTC+12": "Etc/GMT-12",
    "Fiji Standard Time": "Pacific/Fiji",
    "Chatham Islands Standard Time": "Pacific/Chatham",
    "UTC+13": "Etc/GMT-13",
    "Tonga Standard Time": "Pacific/Tongatapu",
    "Samoa Standard Time": "Pacific/Apia",
    "Line Islands Standard Time": "Pacific/Kiritimati",
}
# Outlook writes the name in any case ("w. europe standard time" has been seen in exports).
_WINDOWS_FOLDED: dict[str, str] = {k.casefold(): v for k, v in WINDOWS_ZONES.items()}

# Hours alone (1 or 2 digits), hours:minutes, or ISO 8601's compact hhmm (4 digits). Minutes are 00-59.
# Read more loosely, "UTC+5:75" was +06:15 and "UTC+123" +01:23: a typo became an instant, unsaid.
_OFFSET = re.compile(r"^(?:UTC|GMT|UT)?\s*(?P<sign>[+-])\s*"
                     r"(?:(?P<h>\d{1,2})(?::(?P<m>[0-5]\d))?|(?P<hh>\d{2})(?P<mm>[0-5]\d))$", re.IGNORECASE)


# "UTC−12" with the minus sign U+2212, or a dash a word processor put for the hyphen ("UTC–12"): the
# offset is written in full, so it is read; refused, the source's deadlines went unplanned.
_MINUS_SIGNS = str.maketrans({"\u2212": "-", "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-",
                              "\u2014": "-", "\ufe63": "-", "\uff0d": "-", "\uff0b": "+"})
# AoE spelt out, as calls for papers write it ("Anywhere on Earth", "anywhere-on-earth").
_ANYWHERE_ON_EARTH = re.compile(r"^anywhere[\s_-]+on[\s_-]+earth$", re.IGNORECASE)


def _fixed(hours: float, name: str) -> timezone:
    if abs(hours) > 14:
        raise UnknownTimeZone(f"time zone {name!r}: offset {hours:+g} h is outside UTC-14..UTC+14")
    return timezone(timedelta(hours=hours)) if hours else UTC


# Keys that a zoneinfo folder holds but that name no zone anywhere else. Python's
# available_timezones() lists the zone files of the machine's zoneinfo folder (less posix/, right/ and
# posixrules), so on Debian it listed, and this module accepted, `localtime` (a link to /etc/localtime:
# the zone of whichever machine reads the file, so planning and review put the same due date at
# different instants without a word); `Factory` is IANA's placeholder for "no zone set" (abbreviation
# "-00"); `posixrules` is the default rule for POSIX TZ strings; `posix/X` copies X, and `right/X` is X
# on a clock that counts leap seconds. The rule is an allow-list, IANA's own names (_iana_names), with
# these named in the refusal because they do open a file on some machines.
_NOT_PORTABLE = {
    "localtime": "it is the zone of the machine reading the file, which differs between machines",
    "Factory": "it is IANA's placeholder for a machine whose zone is not set",
    "posixrules": "it is the rule file for POSIX TZ strings",
}


def _not_portable(text: str) -> str | None:
    """Why the zone key ``text`` is not a portable IANA zone name and what to write instead, or
    ``None`` when it is not one of those keys."""
    if text in _NOT_PORTABLE:
        return f"{_NOT_PORTABLE[text]}; write the zone itself, e.g. Europe/Berlin"
    for folder, meant in (("posix/", "a copy of"), ("right/", "a leap-second-counting variant of")):
        if text.startswith(folder):
            zone = text.removeprefix(folder)
            return f"it is {meant} {zone!r} in a machine's zoneinfo folder; write {zone!r}"
    return None


@lru_cache(maxsize=1)
def _iana_names() -> frozenset[str]:
    """The IANA zone names (zones and links, ``backward`` aliases such as ``US/Eastern`` included),
    from the zone list of the ``tzdata`` package (a dependency): the same on every machine, unlike
    the machine's zoneinfo folder, whose extra keys are refused (see :data:`_NOT_PORTABLE`)."""
    from importlib.resources import files

    listed = files("tzdata").joinpath("zones").read_text(encoding="utf-8").split()
    return frozenset(name for name in listed if _not_portable(name) is None)


@lru_cache(maxsize=1)
def _iana_folded() -> dict[str, str]:
    """``{name.casefold(): name}`` of :func:`_iana_names` whose folded form no other name shares."""
    seen: dict[str, list[str]] = {}
    for name in _iana_names():
        seen.setdefault(name.casefold(), []).append(name)
    return {folded: names[0] for folded, names in seen.items() if len(names) == 1}


def zone_names() -> frozenset[str]:
    """The IANA zone names :func:`resolve_zone` accepts as written (see :func:`_iana_names`): the names a
    misspelt zone is compared with to say which was meant."""
    return _iana_names()


def _zone(name: str) -> ZoneInfo:
    """The ``ZoneInfo`` of the IANA zone ``name`` (a name of :func:`_iana_names`) in the zone data in
    force, never the ``tzdata`` package's copy behind a system folder that lacks it
    (:func:`~deadline_pipeline.zone_data.key_in_force`). Raises :class:`UnknownTimeZone` naming the
    zone, the database in force and the remedies when that database does not hold it."""
    key = zone_data.key_in_force(name)
    if key is None:
        zd = zone_data.in_force()
        meant = zone_data.package_links().get(name)
        instead = f"write {meant!r}, the zone it names, " if meant else ""
        raise UnknownTimeZone(
            f"time zone {name!r} is not in the zone data in force ({zd.describe()}): read from the tzdata "
            f"package instead (IANA {zone_data.package_version()}), it would be planned with another version's "
            f"rules than the one recorded; {instead}install the folder's missing zones (Debian and Ubuntu: "
            f"tzdata-legacy) or set {zone_data.ENV}=package")
    return ZoneInfo(key)


def _iana(text: str) -> ZoneInfo | None:
    """The IANA zone ``text`` names exactly, or at the end of a ``/vendor/version/Area/City`` prefix."""
    names = _iana_names()
    if text in names:
        return _zone(text)
    if text.upper() in names and "/" not in text:  # "cet", "est5edt" as some producers write them
        return _zone(text.upper())
    folded = _iana_folded().get(text.casefold())
    if folded is not None:
        # "europe/berlin", "America/new_york": IANA names differ in more than case from no other name, so the
        # zone meant is certain; refused, every deadline of such a source or calendar went unplanned.
        return _zone(folded)
    if text.startswith("/"):
        parts = [p for p in text.split("/") if p]
        for i in range(1, len(parts)):
            candidate = "/".join(parts[i:])
            if candidate in names:
                return _zone(candidate)
    return None


def resolve_zone(name: str) -> tzinfo:
    """Resolve a time-zone spelling to a ``tzinfo``.

    ``name``: an IANA name, ``AoE``, a fixed offset (``UTC-12``, ``GMT+8``, ``+05:30``), a mapped
    abbreviation (``PDT``) or a Windows zone name. Returns a ``ZoneInfo`` or a fixed ``timezone``.
    Raises :class:`UnknownTimeZone` naming the input when none applies; it never falls back to UTC.
    """
    zone = _resolve_or_problem(name)
    if isinstance(zone, UnknownTimeZone):
        # A fresh exception each time (a cached one would carry the traceback of every earlier raise).
        raise UnknownTimeZone(*zone.args)
    return zone


@lru_cache(maxsize=512)
def _resolve_or_problem(name: str) -> tzinfo | UnknownTimeZone:
    """:func:`resolve_zone`'s answer, with an unknown name's error returned instead of raised, so that
    it is cached too: a subscriber with an unknown zone is looked up again for every alert (and a
    miss costs a directory lookup for ``ZoneInfo``)."""
    try:
        return _resolve(name)
    except UnknownTimeZone as exc:
        return exc


# A zone resolved before the database switched carries the old rules: drop every cached answer.
zone_data.on_change(_resolve_or_problem.cache_clear)


def _resolve(name: str) -> tzinfo:
    if not isinstance(name, str) or not name.strip():
        raise UnknownTimeZone(f"time zone {name!r} is empty; a rule needs an IANA zone or a UTC offset")
    text = name.strip()
    upper = text.upper()
    if upper not in ("UTC", "GMT", "Z", "UT", "UCT"):  # the UTC spellings stay the UTC singleton
        iana = _iana(text)
        if iana is not None:
            return iana
    if upper in ABBREVIATIONS:
        return _fixed(ABBREVIATIONS[upper], text)
    if _ANYWHERE_ON_EARTH.match(text):
        return _fixed(ABBREVIATIONS["AOE"], text)
    m = _OFFSET.match(text.translate(_MINUS_SIGNS))
    if m:
        hours = (int(m.group("h")) + int(m.group("m") or 0) / 60 if m.group("h") is not None
                 else int(m.group("hh")) + int(m.group("mm")) / 60)
        return _fixed(hours if m.group("sign") == "+" else -hours, text)
    windows = _WINDOWS_FOLDED.get(text.casefold())
    if windows is not None:
        return _zone(windows)
    # Said for what it is, not "unknown": the key may open a file in a machine's zoneinfo folder
    # (before, any key with a "/" was opened as one, and posix/… and right/… were accepted).
    why = _not_portable(text) or (_not_portable(text.rsplit("/", 1)[-1]) if text.startswith("/") else None)
    if why is not None:
        raise UnknownTimeZone(f"time zone {name!r} is not an IANA zone name: {why}")
    raise UnknownTimeZone(
        f"unknown time zone {name!r}: expected an IANA name (Europe/Berlin), AoE, a UTC offset "
        "(UTC-12, GMT+8), a known abbreviation (PDT) or a Windows zone name"
    )


# --- zones defined only by a calendar's VTIMEZONE ----------------------------------------------

#: Years over which a VTIMEZONE must agree with an IANA zone, transition by transition, to be read as it.
EQUIVALENCE_YEARS = (2020, 2040)
_WEEK = timedelta(days=7)


def _transitions(zone: tzinfo) -> tuple:
    """``(offset at the start, ((instant, new offset), …))`` of ``zone`` over :data:`EQUIVALENCE_YEARS`.

    Sampled weekly, each change located to the minute by bisection (UTC instants, naive).
    """
    def off(moment: datetime) -> timedelta | None:
        return moment.replace(tzinfo=UTC).astimezone(zone).utcoffset()

    t = datetime(EQUIVALENCE_YEARS[0], 1, 1)
    end = datetime(EQUIVALENCE_YEARS[1], 1, 1)
    first = current = off(t)
    changes = []
    while t < end:
        nxt = t + _WEEK
        new = off(nxt)
        if new != current:
            lo, hi = t, nxt
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                if off(mid) == current:
                    lo = mid
                else:
                    hi = mid
            changes.append((hi.replace(second=0, microsecond=0), new))
            current = new
        t = nxt
    return first, tuple(changes)


@lru_cache(maxsize=1)
def _iana_signatures() -> dict[str, tuple]:
    return {}


zone_data.on_change(_iana_signatures.cache_clear)


def utc_offset_text(offset: timedelta) -> str:
    """``"+02:00"``, ``"-05:00"``, ``"+05:45"`` for a UTC offset (seconds dropped)."""
    minutes = int(offset.total_seconds()) // 60
    sign = "-" if minutes < 0 else "+"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def offset_disagreements(ours: tzinfo, theirs: tzinfo) -> list[tuple[datetime, datetime, timedelta, timedelta]]:
    """The spans of :data:`EQUIVALENCE_YEARS` in which two zones give different UTC offsets:
    ``[(start, end, ours' offset, theirs' offset), …]``, ``start``/``end`` naive UTC instants (``end``
    exclusive), each change located to the minute (sampled weekly, as :func:`equivalent_iana_zone`
    compares zones). ``theirs``' transitions are cached when it is a ``ZoneInfo`` (by its key).

    Used to say where a zone read in place of another moves instants: a calendar's VTIMEZONE under an
    IANA name read as the IANA zone, an abbreviation read as its fixed offset beside its region's zone.
    """
    return _signature_disagreements(_transitions(ours), _iana_transitions(theirs))


def _iana_transitions(zone: tzinfo) -> tuple:
    """:func:`_transitions` of ``zone``, cached by its key when it is a ``ZoneInfo`` (cleared when the
    zone data in force changes)."""
    key = getattr(zone, "key", None)
    cache = _iana_signatures()
    signature = cache.get(key) if key else None
    if signature is None:
        signature = _transitions(zone)
        if key:
            cache[key] = signature
    return signature


def _offset_in(signature: tuple, instant: datetime) -> timedelta | None:
    """The UTC offset a :func:`_transitions` signature gives at ``instant`` (naive UTC)."""
    current = signature[0]
    for moment, new in signature[1]:
        if moment > instant:
            break
        current = new
    return current


def _signature_disagreements(mine: tuple, other: tuple) -> list[tuple[datetime, datetime, timedelta, timedelta]]:
    """:func:`offset_disagreements` of two :func:`_transitions` signatures."""
    edges = sorted({datetime(EQUIVALENCE_YEARS[0], 1, 1), datetime(EQUIVALENCE_YEARS[1], 1, 1),
                    *(moment for moment, _new in mine[1]), *(moment for moment, _new in other[1])})
    spans: list[tuple[datetime, datetime, timedelta, timedelta]] = []
    for start, end in zip(edges, edges[1:], strict=False):
        a, b = _offset_in(mine, start), _offset_in(other, start)
        if a == b:
            continue
        if spans and spans[-1][1] == start and spans[-1][2:] == (a, b):
            spans[-1] = (spans[-1][0], end, a, b)
        else:
            spans.append((start, end, a, b))
    return spans


def equivalent_iana_zone(zone: tzinfo, tzid: str) -> str | None:
    """The IANA zone whose UTC offsets and transitions equal ``zone``'s over :data:`EQUIVALENCE_YEARS`.

    For a TZID that only the calendar's own VTIMEZONE defines (Outlook's ``(GMT+01.00)
    Sarajevo/Warsaw/Zagreb``): RFC 5545 §3.6.5 makes that definition authoritative, and a rule must
    carry a zone name planning can resolve, so the definition is matched against every IANA zone.
    When several zones agree, the one whose city appears in ``tzid`` is preferred, else the first by
    name. Returns ``None`` when no IANA zone agrees (the rule is then refused with a clear message).
    """
    return _equivalent_to_signature(_transitions(zone), tzid)


# Keyed by the definition's transitions, not its tzinfo object: each calendar is read with its own
# VTIMEZONE objects (ics_library.own_zones), so a cache keyed by object never hit again and every
# parse of a calendar with a custom zone compared it against all IANA zones anew (0.15 s per zone).
@lru_cache(maxsize=256)
def _equivalent_to_signature(own: tuple, tzid: str) -> str | None:
    probes = [datetime(year, month, 15, 12) for year in (2026, 2035) for month in (1, 4, 7, 10)]
    want = [_offset_in(own, p) for p in probes]
    cache = _iana_signatures()
    matches = []
    for name in sorted(_iana_names()):
        try:
            candidate = _zone(name)
        except (UnknownTimeZone, ZoneInfoNotFoundError, ValueError):
            continue
        if [p.replace(tzinfo=UTC).astimezone(candidate).utcoffset() for p in probes] != want:
            continue
        if name not in cache:
            cache[name] = _transitions(candidate)
        if cache[name] == own:
            matches.append(name)
    if not matches:
        return None
    words = {w.casefold() for w in re.findall(r"[A-Za-z]+", tzid)}
    for name in matches:
        if name.rsplit("/", 1)[-1].replace("_", " ").casefold() in words:
            return name
    # A season's abbreviation (TZID=PST defined with the US rules) is its region's zone, not the first
    # name that agrees (America/Ensenada).
    region = SEASONAL_ABBREVIATIONS.get(tzid.strip().upper())
    return region if region in matches else matches[0]


def names_zone(name: str) -> bool:
    """True when :func:`resolve_zone` reads ``name`` (any ``str``) as the zone it names: an IANA name
    (also behind a vendor prefix) or a Windows name of the CLDR table. False for what it reads by
    guessing, an abbreviation (``PST``) or an offset-looking name (``GMT-8``, ``UTC+5:30``), and for
    a name it does not know."""
    text = name.strip()
    return _iana(text) is not None or text.casefold() in _WINDOWS_FOLDED


#: IANA names of fixed-offset zones (links since tzdata 2024b) that are also US abbreviations, which
#: calendars write for the US zone with daylight saving (see definition_overrides_guess).
FIXED_LEGACY = frozenset({"EST", "MST", "HST"})


def definition_overrides_guess(definition: tzinfo, tzid: str) -> bool:
    """True when a calendar's VTIMEZONE ``definition`` of ``tzid`` is to be read instead of
    :func:`resolve_zone`'s reading of the name: ``tzid`` is a guess (not :func:`names_zone`) and the
    two give another UTC offset somewhere in :data:`EQUIVALENCE_YEARS` (:func:`offset_disagreements`).

    RFC 5545 §3.6.5 makes the VTIMEZONE the definition of its TZID. An IANA name stays that zone (a
    stale definition under a real name is the usual case), but a name that only looks like one is not:
    ``TZID:GMT-8`` defined as UTC+8 was read as UTC-8, sixteen hours late. Where the two agree the
    guess is kept, so the rules of such calendars keep their zone name.

    ``EST``, ``MST`` and ``HST`` (:data:`FIXED_LEGACY`) name IANA zones, but fixed offsets that are also
    US abbreviations: a VTIMEZONE under one of them that defines daylight saving is the publisher's
    own zone (Eastern time with its summer), not a stale copy of a fixed offset. Read as the fixed
    offset, its summer deadlines were an hour late (with only a note). They yield to a definition
    that disagrees; one that agrees keeps the fixed zone."""
    if names_zone(tzid) and tzid.strip().upper() not in FIXED_LEGACY:
        return False
    return _signature_overrides_guess(_transitions(definition), tzid)


@lru_cache(maxsize=256)  # keyed by transitions, as _equivalent_to_signature and for the same reason
def _signature_overrides_guess(definition: tuple, tzid: str) -> bool:
    try:
        guess = resolve_zone(tzid)
    except UnknownTimeZone:
        return False  # not a guess either: the definition is read (equivalent_iana_zone)
    return bool(_signature_disagreements(definition, _iana_transitions(guess)))


zone_data.on_change(_equivalent_to_signature.cache_clear)
zone_data.on_change(_signature_overrides_guess.cache_clear)
