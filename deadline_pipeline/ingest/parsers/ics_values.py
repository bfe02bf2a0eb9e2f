"""Reading the values of an iCalendar component (RFC 5545 §3.3): date, date-time and floating
values as :class:`When`, property lists and text, the calendar's zone, and the skip a value that
cannot be read raises (:class:`Skip`). Used by :mod:`.ics`."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, tzinfo
from zoneinfo import ZoneInfo

import icalendar

from deadline_pipeline.ingest.parsers.base import (
    ParseProblem,
)
from deadline_pipeline.rules import format_local, year_problem
from deadline_pipeline.timezones import (
    EQUIVALENCE_YEARS,
    UnknownTimeZone,
    definition_overrides_guess,
    equivalent_iana_zone,
    resolve_zone,
    zone_names,
)
from deadline_pipeline.wording import near_name


class Skip(Exception):
    """The component cannot become a rule; the message says why."""


@dataclass
class When:
    """A DATE or DATE-TIME value as written: naive wall time (or date), and its zone if any."""

    value: date | datetime
    tz: str | None  # the zone name for the rule ("Europe/Berlin", "UTC"), None when floating/date
    zone: tzinfo | None  # the tzinfo to compute instants with
    known: bool = True  # False: TZID unknown to resolve_zone, zone comes from a VTIMEZONE
    written: str | None = None  # the TZID as written, when it was mapped to an equivalent IANA zone

    @property
    def aware(self) -> datetime | None:
        if isinstance(self.value, datetime) and self.zone is not None:
            return self.value.replace(tzinfo=self.zone)
        return None


def when_of(prop: object, what: str) -> When:
    """Read a DTSTART/DUE/RECURRENCE-ID property (a vDDDTypes) into a :class:`When`."""
    if isinstance(prop, icalendar.prop.vBroken):
        raise Skip(f"{what} is not a valid date or date-time: {str(prop)!r}")
    return _value_when(getattr(prop, "dt", None), getattr(prop, "params", {}) or {}, what)


def written_value(value: object, params: dict) -> object:
    """The library's ``value`` of a property with ``params`` as the publisher wrote it: a PERIOD
    (start, end|duration) by its start; a date written with a TZID as the date."""
    if isinstance(value, tuple) and value:
        value = value[0]
    if (isinstance(value, datetime) and str(params.get("VALUE", "")).upper() == "DATE"
            and value.time() == time.min):
        # DTSTART;TZID=America/New_York;VALUE=DATE:20260320 is a date (a TZID does not apply to DATE
        # values, §3.2.19), but the library reads it as midnight in the zone: the all-day deadline was
        # due at 00:00, a day early.
        return value.date()
    return value


def _value_when(value: object, params: dict, what: str) -> When:
    """One DATE or DATE-TIME value of property ``what`` with its ``params`` (TZID) as a :class:`When`.
    Raises :class:`Skip` naming ``what`` for a value that is neither, in an unknown zone, or outside
    :data:`~deadline_pipeline.rules.RULE_YEARS`."""
    value = written_value(value, params)
    if isinstance(value, date):
        # Before any zone arithmetic: DTSTART;TZID=America/New_York:99991231T235959 has no UTC form,
        # and the OverflowError failed the whole calendar, not this component.
        problem = year_problem(value)
        if problem:
            shown = value.replace(tzinfo=None).isoformat() if isinstance(value, datetime) else value.isoformat()
            raise Skip(f"{what} {shown}: {problem}")
    if isinstance(value, datetime):
        naive = value.replace(tzinfo=None)
        tzid = params.get("TZID")
        if tzid:
            return _zoned_when(naive, str(tzid), value.tzinfo, what)
        if value.tzinfo is not None:  # the "Z" form: an absolute UTC time
            return When(value.astimezone(UTC).replace(tzinfo=None), "UTC", UTC)
        return When(naive, None, None)
    if isinstance(value, date):
        return When(value, None, None)
    raise Skip(f"{what} is {type(value).__name__}, not a date or date-time")


#: ``{TZID upper case: definition}``: the VTIMEZONEs of the calendar being read that are read instead
#: of the IANA zone the library maps their TZID to (EST, MST, HST with daylight saving; see
#: :func:`~deadline_pipeline.timezones.definition_overrides_guess`). Set by :func:`definitions_read`.
_READ_AS_DEFINED: ContextVar[dict[str, tzinfo]] = ContextVar("_READ_AS_DEFINED", default={})  # noqa: B039 — never mutated


@contextmanager
def definitions_read(defined: dict[str, tzinfo]) -> Iterator[None]:
    """Within the block, a value whose TZID is a key of ``defined`` (upper case) is read in that
    definition, not in the IANA zone the library mapped the name to."""
    token = _READ_AS_DEFINED.set(defined)
    try:
        yield
    finally:
        _READ_AS_DEFINED.reset(token)


def _zoned_when(naive: datetime, tzid: str, library_zone: tzinfo | None, what: str) -> When:
    """The wall time ``naive`` of property ``what`` written with ``tzid``, which the library read in
    ``library_zone`` (a ``ZoneInfo`` it mapped the name to, the calendar's VTIMEZONE of that TZID, or
    ``None``). Raises :class:`Skip` when the zone is neither known nor defined by the calendar."""
    return When(naive, *_tzid_reading(tzid, library_zone, what))


def _tzid_reading(tzid: str, library_zone: tzinfo | None, what: str) -> tuple[str, tzinfo, bool, str | None]:
    """How a value of property ``what`` written in zone ``tzid`` is read: ``(zone name for the rule,
    tzinfo, known, TZID as written when mapped to another name)``, the fields of :class:`When` after its
    value. ``library_zone``: as for :func:`_zoned_when`. Raises :class:`Skip` when the zone is neither
    known nor defined by the calendar."""
    library_zone = _READ_AS_DEFINED.get().get(tzid.strip().upper(), library_zone)
    defined = library_zone is not None and not isinstance(library_zone, ZoneInfo)
    # A guessed name (TZID:GMT-8, TZID:PST) whose VTIMEZONE defines other offsets is that definition
    # (§3.6.5): read as the guess, GMT-8 defined as UTC+8 was due sixteen hours late.
    if not (defined and definition_overrides_guess(library_zone, tzid)):
        try:
            return tzid, resolve_zone(tzid), True, None
        except UnknownTimeZone:
            pass
    if isinstance(library_zone, ZoneInfo):  # the library mapped the name to an IANA zone
        # Read again in the zone data in force: the library's own ZoneInfo is the tzdata package's
        # copy where a system folder in force lacks the key (zone_data.key_in_force).
        try:
            return library_zone.key, resolve_zone(library_zone.key), True, None
        except UnknownTimeZone as exc:
            raise Skip(f"{what} has TZID {tzid!r}: {exc}") from None
    if library_zone is not None:  # defined by a VTIMEZONE of this calendar
        # The file's definition is authoritative (§3.6.5): read it as the IANA zone with the
        # same offsets and transitions, so the rule can be planned like any other.
        iana = equivalent_iana_zone(library_zone, tzid)
        if iana is not None:
            return iana, resolve_zone(iana), True, tzid
        return tzid, library_zone, False, None
    raise Skip(f"{what} has TZID {tzid!r}, a zone that is neither known nor defined "
                "by a VTIMEZONE in this calendar")


def prop_list(component: icalendar.cal.Component, name: str) -> list:
    value = component.get(name)
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def text_of(component: icalendar.cal.Component, name: str) -> str | None:
    value = component.get(name)
    if value is None or isinstance(value, list):
        return None
    return str(value)


@dataclass(frozen=True)
class UnreadableZone:
    """A calendar's X-WR-TIMEZONE that names no zone: ``reason`` names its line and value, and the
    nearest zone name (else :func:`~deadline_pipeline.timezones.resolve_zone`'s error), or each of its
    lines and values when it has several that differ. Floating times and dates that would be read in it
    cannot be read (:func:`floating_zone_of`)."""

    reason: str


def calendar_zone(cal: icalendar.cal.Component, default_tz: str | None, lines: list[tuple[int, str]],
                  problems: list[ParseProblem]) -> tuple[str | UnreadableZone | None, str | None]:
    """``(zone for floating times of cal, zone its X-WR-TIMEZONE is read as)``: the first is its
    X-WR-TIMEZONE, else ``default_tz``; the second the same zone name when it is the calendar's own
    X-WR-TIMEZONE, else ``None`` (:func:`~.ics_zones.note_zone_read_anew` compares floating values read
    in it with the calendar's VTIMEZONE of that name). ``lines``: the unfolded lines with their
    physical numbers, to name the X-WR-TIMEZONE line in messages. ``problems``: a note is appended for
    an empty X-WR-TIMEZONE.

    An X-WR-TIMEZONE :func:`~deadline_pipeline.timezones.resolve_zone` does not know is an
    :class:`UnreadableZone` naming its line, its value and the nearest zone name. ``default_tz`` is not
    put in its place: the calendar says its floating times are in another zone, so ``default_tz`` (or
    each subscriber's zone) would be a guess, hours off. So are several X-WR-TIMEZONE lines with
    different values (the library gave their list, and the message printed its ``repr``); several with
    one value are that zone.

    An empty X-WR-TIMEZONE (or only spaces) names no zone and is read as absent, with a note naming its
    line: the floating times are read in ``default_tz`` (each subscriber's zone when ``None``).

    An X-WR-TIMEZONE that a VTIMEZONE of ``cal`` defines (same TZID, any case) is read as a TZID
    parameter of that name is (:func:`_zoned_when`): an IANA or Windows name stays that zone, but
    ``EST``/``MST``/``HST`` or a guessed name (``GMT-8``) whose definition gives other offsets, and a
    name only the calendar defines (``Customized Time Zone``), are the IANA zone with the definition's
    offsets and transitions (:func:`~deadline_pipeline.timezones.equivalent_iana_zone`). Read as the
    fixed IANA zone ``EST``, 09:00 in July of a calendar defining ``EST`` with US daylight saving was due
    at 14:00Z, an hour late; a name only the calendar defined skipped every floating component. A
    definition no IANA zone agrees with is an :class:`UnreadableZone`: a rule cannot carry it."""
    declared = _declared_lines(cal, lines)
    if not declared:
        return default_tz, None
    shown = ", ".join(f"{f'line {n} ' if n else ''}{value!r}" for n, value in declared)
    if len({value for _n, value in declared}) > 1:
        return UnreadableZone(f"X-WR-TIMEZONE, but the calendar has {len(declared)} X-WR-TIMEZONE lines ({shown}): "
                              "its floating times have no single zone"), None
    number, name = declared[0]
    where = f"X-WR-TIMEZONE{f' (line {number})' if number else ''}"
    if not name:
        if not _has_calendar_zoned_values(lines):
            # Every value names its own zone: the empty line decides nothing, and a note would make
            # `validate` call the file INVALID.
            return default_tz, None
        # Read as absent, but said: occurrences --ics said the calendar "declares no X-WR-TIMEZONE".
        instead = f"in default_tz {default_tz!r}" if default_tz else "in each subscriber's zone"
        problems.append(ParseProblem(f"line {number}" if number else "VCALENDAR", (
            f"{where} is empty: floating times are read as if it were absent, i.e. {instead}"), skipped=False))
        return default_tz, None
    where += f" {name!r}"
    definition = _definition_in(cal, name)
    if definition is not None:
        # A definition (neither None nor a ZoneInfo) is always read: no Skip comes of it.
        tz, _zone, known, _written = _tzid_reading(name, definition, "X-WR-TIMEZONE")
        if known:
            return tz, tz
        return UnreadableZone(f"{where}, which only its VTIMEZONE defines, and no IANA zone has its offsets and "
                              f"transitions in {EQUIVALENCE_YEARS[0]}-{EQUIVALENCE_YEARS[1]}"), None
    try:
        resolve_zone(name)
        return name, name
    except UnknownTimeZone as exc:
        close = near_name(name, zone_names())
        return UnreadableZone(f"{where}, which names no zone ({f'did you mean {close}?' if close else exc})"), None


def _declared_lines(cal: icalendar.cal.Component, lines: list[tuple[int, str]]) -> list[tuple[int | None, str]]:
    """``[(physical line or None, value stripped)]``: each X-WR-TIMEZONE of ``cal`` (none unless a
    VCALENDAR). The line numbers are those of the first VCALENDAR of ``lines`` whose X-WR-TIMEZONE
    values are the library's; ``None`` when none is."""
    values = [str(v).strip() for v in prop_list(cal, "X-WR-TIMEZONE")] if cal.name == "VCALENDAR" else []
    if not values:
        return []
    found: list[list[tuple[int, str]]] = []  # per VCALENDAR: its own X-WR-TIMEZONE lines
    depth = 0
    for number, body in lines:
        head, _colon, rest = body.partition(":")
        key = head.partition(";")[0].strip().upper()
        if key == "BEGIN":
            depth += 1
            if depth == 1:
                found.append([])
        elif key == "END":
            depth = max(depth - 1, 0)
        elif key == "X-WR-TIMEZONE" and depth == 1 and found:
            found[-1].append((number, rest.strip()))
    for group in found:
        if [value for _n, value in group] == values:
            return list(group)
    return [(None, value) for value in values]


# The properties whose floating or date values take the calendar's zone (RFC 5545 §3.3.4, §3.3.5).
_CALENDAR_ZONED = ("DTSTART", "DTEND", "DUE", "RDATE", "EXDATE", "RECURRENCE-ID")


def _has_calendar_zoned_values(lines: list[tuple[int, str]]) -> bool:
    """Whether a component's date-time property (``lines``: the unfolded lines) is floating or a date,
    i.e. read in the calendar's zone: no ``TZID`` parameter and no ``Z`` suffix. VTIMEZONE blocks are
    left out: their DTSTART is the zone's own local wall time."""
    in_zone = False
    for _n, body in lines:
        head, _, value = body.partition(":")
        name = head.split(";", 1)[0].strip().upper()
        if name in ("BEGIN", "END") and value.strip().upper() == "VTIMEZONE":
            in_zone = name == "BEGIN"
        elif not in_zone and name in _CALENDAR_ZONED and "TZID=" not in head.upper() \
                and not value.strip().upper().endswith("Z"):
            return True
    return False


def vtimezone_definition(vtz: icalendar.cal.Component) -> tzinfo:
    """The zone a VTIMEZONE component defines, built from its own rules (never the library's zone of
    that TZID). Raises what the library raises for a definition it cannot build (``ValueError``,
    ``KeyError``…)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vtz.to_tz(lookup_tzid=False)


def _definition_in(cal: icalendar.cal.Component, tzid: str) -> tzinfo | None:
    """The zone the first VTIMEZONE of ``cal`` with TZID ``tzid`` (any case) defines; ``None`` when
    there is none or the library cannot build it (the name is then read as any zone name is)."""
    for vtz in cal.walk("VTIMEZONE"):
        if str(vtz.get("TZID", "")).strip().upper() == tzid.upper():
            try:
                return vtimezone_definition(vtz)
            except Exception:  # noqa: BLE001 — the library raises ValueError, KeyError…
                return None
    return None


def floating_zone_of(start: When, zone: str | UnreadableZone | None, what: str) -> str | None:
    """The calendar's ``zone`` (:func:`calendar_zone`) for a component whose due time, property
    ``what``, is ``start``; ``None`` when ``start`` has a zone of its own. Raises :class:`Skip` when
    ``start`` is floating (or a date) and the calendar's zone is unreadable: read in each subscriber's
    zone instead, 09:00 of a calendar in Berlin was due six hours late for New York while every check
    stayed green."""
    if not isinstance(zone, UnreadableZone):
        return zone
    if start.tz is None:
        raise Skip(f"{what} {format_local(start.value)} is floating, read in the calendar's {zone.reason}; it "
                   "is not read in each subscriber's zone instead")
    return None


def dates_of(component: icalendar.cal.Component, name: str, problems: list[ParseProblem],
           position: str) -> list[When]:
    """Every value of every EXDATE/RDATE property, each read with its own TZID.

    An EXDATE value that cannot be read is ignored with a note (at worst a reminder too many). An RDATE
    value is an occurrence: one beyond :data:`~deadline_pipeline.rules.RULE_YEARS` is ignored with a
    note (never within a plan), any other unreadable one (an unknown TZID, not a date list) raises
    :class:`Skip`: ignored with a note, its deadline was never planned and every check stayed green;
    skipped, the component keeps its last good version and ``rules_complete`` names the line."""
    out: list[When] = []
    for prop in prop_list(component, name):
        if isinstance(prop, icalendar.prop.vBroken):
            if name == "RDATE":
                raise Skip(f"RDATE {str(prop)!r} is not a valid date list: the occurrences it names are unknown")
            problems.append(ParseProblem(position, f"{name} {str(prop)!r} ignored: not a valid date list",
                                         skipped=False))
            continue
        params = getattr(prop, "params", {}) or {}
        for item in getattr(prop, "dts", []) or []:
            try:
                out.append(_value_when(item.dt, params, name))
            except Skip as exc:
                if name == "RDATE" and not (isinstance(item.dt, date) and year_problem(item.dt)):
                    raise Skip(f"{exc}: an occurrence of this rule cannot be planned") from None
                problems.append(ParseProblem(position, f"{exc}; that {name} value is ignored", skipped=False))
    return out


def in_zone(when: When, rule_zone: tzinfo | None, problems: list[ParseProblem], position: str,
             what: str) -> str:
    """An EXDATE/RDATE as wall-clock time in the rule's zone (floating ones are already in it).

    Raises :class:`Skip` for an RDATE instant (UTC or zoned) of a floating or all-day rule: each
    subscriber reads the rule in their own zone, so the instant cannot be kept, and as a wall time it
    was due up to a day off (12:00Z read as 12:00 in Pago Pago: 23:00Z) with only a note. An EXDATE
    so written is kept as wall time with a note (at worst it excludes nothing)."""
    aware = when.aware
    if aware is None:
        return format_local(when.value)
    if rule_zone is None and what == "RDATE":
        raise Skip(f"RDATE {format_local(when.value)} in {when.tz} is an instant but the rule is floating (its "
                    "DTSTART has no TZID and is read in each subscriber's zone); give DTSTART a TZID, or write the "
                    "RDATE as a floating time")
    if rule_zone is None:
        problems.append(ParseProblem(
            position, f"{what} {format_local(when.value)} in {when.tz} kept as wall time: the rule is floating",
            skipped=False))
        return format_local(when.value)
    return format_local(aware.astimezone(rule_zone).replace(tzinfo=None))


def utc_iso(when: When, rule_zone: tzinfo | None) -> str:
    if not isinstance(when.value, datetime):
        return when.value.isoformat()
    aware = when.aware
    if aware is None and rule_zone is not None:
        aware = when.value.replace(tzinfo=rule_zone)
    if aware is None:
        return format_local(when.value)
    return aware.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
