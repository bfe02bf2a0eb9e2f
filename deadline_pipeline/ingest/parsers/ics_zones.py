"""VTIMEZONEs a calendar defines for a TZID that names an IANA zone (RFC 5545 §3.6.5): the IANA zone
is read, and where the calendar's definition gives another UTC offset at an instant the component
uses, a note says so, naming both offsets (:func:`note_zone_read_anew`). A name only guessed from
(``GMT-8``, ``PST``) is read in the calendar's definition where the two differ, so it has no note
(:func:`~deadline_pipeline.timezones.definition_overrides_guess`). Used by :mod:`.ics`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo

import icalendar

from deadline_pipeline.ingest.parsers.base import (
    ParseProblem,
)
from deadline_pipeline.ingest.parsers.ics_lines import ScannedComponent, lines_of, named_lines
from deadline_pipeline.ingest.parsers.ics_values import prop_list, vtimezone_definition, written_value
from deadline_pipeline.instants import instant_text
from deadline_pipeline.rules import RuleRecord, format_local
from deadline_pipeline.timezones import (
    FIXED_LEGACY,
    UnknownTimeZone,
    definition_overrides_guess,
    offset_disagreements,
    resolve_zone,
    utc_offset_text,
)


@dataclass
class _DefinedZone:
    """A VTIMEZONE whose TZID :func:`~deadline_pipeline.timezones.resolve_zone` knows, so that its values
    are read in that zone (``theirs``) and not in the calendar's own definition (``ours``)."""

    tzid: str
    line: int | None  # the physical line of its TZID property
    ours: tzinfo
    theirs: tzinfo
    #: Where the two disagree (:func:`~deadline_pipeline.timezones.offset_disagreements`), worked out
    #: the first time a recurring rule needs them.
    spans: list | None = None

    @property
    def named(self) -> str:
        return f"VTIMEZONE TZID={self.tzid}" + (f" (line {self.line})" if self.line else "")


def zones_defined_anew(tops: list, lines: list[tuple[int, str]], problems: list[ParseProblem],
                        legacy: dict[str, tzinfo] | None = None) -> dict[str, _DefinedZone]:
    """``{TZID: _DefinedZone}`` for each VTIMEZONE of ``tops`` (the library's components) whose TZID
    names a zone :func:`~deadline_pipeline.timezones.resolve_zone` knows (an IANA or Windows name).
    ``lines``: the unfolded lines with their physical numbers, to name each TZID's line. A definition
    the library cannot turn into a zone is a note appended to ``problems`` (it cannot be compared).
    ``legacy``: filled with ``{TZID upper case: definition}`` for each VTIMEZONE of ``EST``, ``MST`` or
    ``HST`` (:data:`~deadline_pipeline.timezones.FIXED_LEGACY`) whose definition is read instead of
    the IANA zone of that name (:func:`~deadline_pipeline.ingest.parsers.ics_values.definitions_read`)."""
    legacy = {} if legacy is None else legacy
    tzid_lines: dict[str, int] = {}
    inside = False
    for number, body in lines:
        head, _colon, rest = body.partition(":")
        key = head.strip().upper()
        if key in ("BEGIN", "END") and rest.strip().upper() == "VTIMEZONE":
            inside = key == "BEGIN"
        elif inside and key == "TZID":
            tzid_lines.setdefault(rest.strip(), number)
    out: dict[str, _DefinedZone] = {}
    for top in tops:
        for vtz in top.walk("VTIMEZONE"):
            tzid = str(vtz.get("TZID", "")).strip()
            try:
                theirs = resolve_zone(tzid)
            except UnknownTimeZone:
                continue  # the definition is the zone (read through equivalent_iana_zone)
            line = tzid_lines.get(tzid)
            try:
                ours = vtimezone_definition(vtz)
            except Exception as exc:  # noqa: BLE001 — the library raises ValueError, KeyError…
                problems.append(ParseProblem(f"line {line}" if line else f"VTIMEZONE TZID={tzid}", (
                    f"VTIMEZONE TZID={tzid} cannot be compared with the zone of that name, which is read instead: "
                    f"{exc.__class__.__name__}: {exc}"), skipped=False))
                continue
            if definition_overrides_guess(ours, tzid):
                # A guessed name (GMT-8, PST) is read in its definition (ics_values._zoned_when); so is
                # EST/MST/HST defined with daylight saving, which the library reads as the IANA zone.
                if tzid.upper() in FIXED_LEGACY:
                    legacy[tzid.upper()] = ours
                    named = f"VTIMEZONE TZID={tzid}" + (f" (line {line})" if line else "")
                    problems.append(ParseProblem(f"line {line}" if line else named, (
                        f"{named} defines other offsets than the IANA zone {tzid}, which has no daylight saving; "
                        "its values are read in the calendar's definition (RFC 5545 §3.6.5)"), skipped=False))
                continue
            out[tzid] = _DefinedZone(tzid, line, ours, theirs)
    return out


#: The date properties whose TZID :func:`note_zone_read_anew` compares.
_DATED = ("DTSTART", "DUE", "RECURRENCE-ID", "RDATE", "EXDATE")


def note_zone_read_anew(component: icalendar.cal.Component, rule: RuleRecord, scan: ScannedComponent | None,
                         defined: dict[str, _DefinedZone], problems: list[ParseProblem], position: str,
                         declared: str | None = None) -> None:
    """A note appended to ``problems`` when a value of ``component`` is read in a zone whose UTC offset
    differs from the one the calendar's own VTIMEZONE of that TZID gives (``defined``), naming the
    VTIMEZONE, the value's line, the instant and both offsets; nothing when they agree.

    ``declared``: the zone the calendar's X-WR-TIMEZONE is read as
    (:func:`~deadline_pipeline.ingest.parsers.ics_values.calendar_zone`), ``None`` without one. When
    ``rule`` is in that zone, its floating values are wall times in it and are compared with the
    VTIMEZONE of that name (any case) as a value with that TZID is: a VTIMEZONE ``TZID:America/Chicago``
    defining US Eastern rules beside ``X-WR-TIMEZONE:America/Chicago`` had its one-off floating times read
    an hour away from the definition with no note, while the same times written with ``TZID=`` had one.

    A TZID that names an IANA zone is that zone (see the module docstring), also when the calendar
    defines it differently (an old US rule, say: many producers ship stale VTIMEZONEs), so the instant
    is the IANA zone's; RFC 5545 §3.6.5 makes the VTIMEZONE the definition, so a disagreement is said,
    not resolved silently. Compared at each DTSTART, DUE, RECURRENCE-ID, RDATE and EXDATE value, and for
    an RRULE at its first occurrence within the spans where the two zones disagree
    (:func:`~deadline_pipeline.timezones.offset_disagreements`, years :data:`EQUIVALENCE_YEARS`). One
    note per component: the first disagreement found."""
    if not defined:
        return
    floating = None
    if declared is not None and rule.tz == declared:
        floating = next((z for tzid, z in defined.items() if tzid.upper() == declared.strip().upper()), None)
    for name, zone, wall in _wall_times(component, defined, floating):
        ours, theirs = wall.replace(tzinfo=zone.ours).utcoffset(), wall.replace(tzinfo=zone.theirs).utcoffset()
        if ours != theirs:
            problems.append(_zone_note(zone, f"{name}{lines_of(scan, name)} {format_local(wall)}",
                                       wall.replace(tzinfo=zone.theirs), ours, theirs, position, rule))
            return
    zone = defined.get(rule.tz or "") or floating
    if rule.rrule is None or zone is None:
        return
    from deadline_pipeline.plan.occurrences import expand

    if zone.spans is None:
        zone.spans = offset_disagreements(zone.ours, zone.theirs)
    for start, end, ours, theirs in zone.spans:
        found = expand(rule, zone.theirs, after=start.replace(tzinfo=UTC), before=end.replace(tzinfo=UTC)
                       - timedelta(seconds=1), limit=1, strict=False)
        if found:
            label = named_lines(scan, "RRULE")
            problems.append(_zone_note(zone, f"the occurrence of {found[0].due_at.astimezone(zone.theirs):%Y-%m-%d} "
                                             f"of the {label}", found[0].due_at, ours, theirs, position, rule))
            return


def _wall_times(component: icalendar.cal.Component, defined: dict[str, _DefinedZone],
                floating: _DefinedZone | None) -> Iterator[tuple[str, _DefinedZone, datetime]]:
    """``(property name, zone, naive wall time)`` for each DATE-TIME value of :data:`_DATED` in
    ``component`` read in a zone of ``defined``: its TZID's, or ``floating`` (the calendar's
    X-WR-TIMEZONE, ``None`` when not in force) for a floating one."""
    for name in _DATED:
        for prop in prop_list(component, name):
            params = getattr(prop, "params", {}) or {}
            tzid = str(params.get("TZID", "")).strip()
            zone = defined.get(tzid) if tzid else floating
            if zone is None:
                continue
            values = [d.dt for d in getattr(prop, "dts", [])] if hasattr(prop, "dts") else [getattr(prop, "dt", None)]
            for value in values:
                value = written_value(value, params)
                # Without a TZID only a floating time is in the calendar's zone: a UTC one is an instant.
                if isinstance(value, datetime) and (tzid or value.tzinfo is None):
                    yield name, zone, value.replace(tzinfo=None)


def _zone_note(zone: _DefinedZone, what: str, instant: datetime, ours: timedelta, theirs: timedelta, position: str,
               rule: RuleRecord) -> ParseProblem:
    """The note of :func:`note_zone_read_anew`: ``what`` (a value and its line) is due at ``instant``
    (aware) in the zone read, whose offset is ``theirs``; the calendar's definition gives ``ours``."""
    return ParseProblem(position, (
        f"{zone.named} disagrees with the zone of that name at {what}: the calendar's definition gives "
        f"UTC{utc_offset_text(ours)}, the IANA zone {getattr(zone.theirs, 'key', zone.tzid)} "
        f"UTC{utc_offset_text(theirs)}; "
        f"read in the IANA zone (due {instant_text(instant)}). A TZID naming an IANA zone is that zone: if the "
        "definition was meant, give it a TZID of its own"), rule.rule_id, skipped=False)
