"""Reading a payload with the ``icalendar`` library, and recovering from the values it cannot read:
which component a line it refused belongs to, so that one VEVENT or VTODO is skipped (naming the
property, line and value) instead of the whole payload (:func:`from_library`,
:func:`unreadable_skips`). Used by :mod:`.ics`."""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import icalendar
from icalendar.parser import Contentline

from deadline_pipeline.ingest.parsers.base import (
    ParseError,
    ParseProblem,
)
from deadline_pipeline.ingest.parsers.ics_lines import (
    COMPONENTS,
    NAME,
    ScannedComponent,
    lines_of,
    locate_library_error,
)
from deadline_pipeline.ingest.parsers.ics_values import prop_list

#: Properties of a VEVENT or VTODO (RFC 5545 §3.6.1, §3.6.2, RFC 7986) that no instant, identity, revision
#: or status is read from: a line of one of these (or of an ``X-`` property) that the library cannot split
#: is a note, the component read without it. Any other such line skips the component (:func:`unreadable_skips`).
_DESCRIPTIVE = frozenset({
    "ATTACH", "ATTENDEE", "CATEGORIES", "CLASS", "COLOR", "COMMENT", "CONFERENCE", "CONTACT", "CREATED",
    "DESCRIPTION", "GEO", "IMAGE", "LOCATION", "ORGANIZER", "PRIORITY", "RELATED-TO", "REQUEST-STATUS",
    "RESOURCES", "RSTATUS", "SUMMARY", "TRANSP", "URL",
})


#: What the library's message about a line it could not split quotes of it up to the first ``;`` or ``:``
#: (``Content line could not be parsed into parts: '20270125T170000': …``): the key its line is found by.
_UNREADABLE_NAME = re.compile(r"parts: '([^:;']*)")


@dataclass(frozen=True)
class _Unreadable:
    """A content line the library refuses inside a component it reads strictly (every one but VEVENT)."""

    index: int  # its place in the lines handed to the library
    number: int  # its physical line
    name: str  # the property name, upper case ("" when even that is unreadable)
    value: str  # the value as written; the whole line when the line cannot be split
    error: str  # the library's message
    inner: str  # the innermost component it is in: "VTODO", "VALARM", "VCALENDAR", "STANDARD"…
    # The VEVENT/VTODO it belongs to (its index in document order, as :func:`~.ics_lines.scan_components`'s).
    owner: int | None
    zone: bool  # inside a VTIMEZONE
    split: bool  # False: the line cannot be split into name, parameters and value

    def described(self) -> str:
        """``"DUE (line 10) '2026XX01': Wrong date format 2026XX01"``; for a line that cannot be split,
        ``"line 10: Content line could not be parsed into parts: …"``."""
        if not self.split:
            return f"line {self.number}: {self.error}"
        return f"{self.name} (line {self.number}) {self.value!r}: {self.error}"


#: One payload read at a time (:func:`own_zones`).
_LIBRARY_ZONES = threading.Lock()


@contextmanager
def own_zones() -> Iterator[None]:
    """Within the block (one payload's reading), the library knows the zones of this payload's
    VTIMEZONEs only, and no other thread reads a payload.

    The library keeps every zone a VTIMEZONE defines in one process-wide cache by TZID (icalendar's
    ``tzp``, first definition kept) and reads a TZID through it in any later calendar. So one source's
    ``TZID:Customized Time Zone`` (+08:00, Outlook's name for any custom zone) was the next source's
    definition of it too (its own +02:00 ignored: six hours off), and a ``TZID=PST`` without a
    VTIMEZONE was read in whichever source had defined ``PST`` before — an instant decided by the order
    sources were read in, in one process (``run``, a backfill) and not in another. (The same fault is
    vobject's issue 153.) A fresh provider (``icalendar.use_zoneinfo``) forgets every earlier
    definition; it is made again on the way out so none leaks to the library's other users."""
    with _LIBRARY_ZONES:
        icalendar.use_zoneinfo()
        try:
            yield
        finally:
            icalendar.use_zoneinfo()


def _library_read(bodies: list[str]) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return icalendar.Calendar.from_ical("\r\n".join(bodies), multiple=True)


def _unreadable_lines(bodies: list[tuple[int, str]]) -> list[_Unreadable]:
    """The lines of ``bodies`` (``(physical line number, logical line)`` as handed to the library) that the
    library cannot read and that make it refuse the whole payload: every line of a component other than
    a VEVENT (the only one it reads tolerantly, listing what it could not read in ``errors``).

    Each such property line is read by the library itself, alone in a VEVENT of a calendar made of them
    (a property's value type depends on its name and VALUE parameter only, not on its component), so
    what is refused is exactly what the library refuses. One pass; ``[]`` when that reading fails.
    """
    candidates = _strictly_read(bodies)
    if not candidates:
        return []
    probe = ["BEGIN:VCALENDAR"]
    for _index, _number, body, *_rest in candidates:
        probe += ["BEGIN:VEVENT", body, "END:VEVENT"]
    try:
        (calendar,) = _library_read([*probe, "END:VCALENDAR"])
    except Exception:  # noqa: BLE001 — no finer reading than the caller's own failure
        return []
    events = calendar.subcomponents
    if len(events) != len(candidates):
        return []
    out: list[_Unreadable] = []
    for (index, number, body, inner, owner, zone), event in zip(candidates, events, strict=True):
        for prop, message in (getattr(event, "errors", ()) or ())[:1]:  # one line, one report
            try:
                name, _params, value = Contentline(body).parts()
            except Exception:  # noqa: BLE001 — the line itself is what cannot be read
                named = NAME.match(body)
                name, value = (named.group(0) if named else ""), body
            out.append(_Unreadable(index, number, str(name).upper(), str(value), str(message), inner, owner,
                                   zone, prop is not None))
    return out


def _strictly_read(bodies: list[tuple[int, str]]) -> list[tuple[int, int, str, str, int | None, bool]]:
    """The property lines of ``bodies`` inside a component other than VEVENT: ``(index, physical line
    number, line, innermost component, owner, in a VTIMEZONE)`` (see :class:`_Unreadable`)."""
    stack: list[tuple[str, int | None]] = []  # (component name, owner) from the outermost
    ordinal = -1
    candidates: list[tuple[int, int, str, str, int | None, bool]] = []
    for index, (number, body) in enumerate(bodies):
        head, _, rest = body.partition(":")
        key = head.strip().upper()
        if key == "BEGIN":  # the same reading of BEGIN/END as scan_components's, so owners number alike
            name = rest.strip().upper()
            owner = stack[-1][1] if stack else None
            if name in COMPONENTS:
                ordinal += 1
                owner = ordinal
            stack.append((name, owner))
        elif key == "END":
            if stack:
                stack.pop()
        elif stack and stack[-1][0] != "VEVENT":
            zone = any(name == "VTIMEZONE" for name, _owner in stack)
            candidates.append((index, number, body, stack[-1][0], stack[-1][1], zone))
    return candidates


def from_library(lines: list[tuple[int, str]], bodies: list[tuple[int, str]],
                  source: str) -> tuple[list, list[_Unreadable]]:
    """The library's reading of ``bodies`` (the lines as handed over, with their physical line numbers,
    see :func:`~.ics_lines.library_lines`), and the lines left out of it (:func:`_unreadable_lines`).

    The library reads every component but a VEVENT strictly: one value it refuses in a VTODO, a VALARM
    or the VCALENDAR (``DURATION:P1Y``, ``DUE:2026XX01``) made it refuse the whole payload, "position
    unknown", and every other component of the feed with it. When it fails, it reads again without the
    lines it cannot read in a VEVENT or VTODO (with their alarms) and of the calendar's own values, and
    the caller reports each with its component. Raises :class:`ParseError` naming the line when that
    is not enough: a line of a VTIMEZONE (instants written in the zone depend on it), a line outside
    any VEVENT/VTODO that cannot even be split, or a failure no line explains.
    """
    try:
        return _library_read([body for _n, body in bodies]), []
    except Exception as exc:  # noqa: BLE001 — the library raises ValueError, KeyError, IndexError…
        failure = exc
    unreadable = _unreadable_lines(bodies)
    fatal = [u for u in unreadable if u.zone or (u.owner is None and not u.split)]
    if unreadable and not fatal:
        left_out = {u.index for u in unreadable}
        try:
            return _library_read([body for i, (_n, body) in enumerate(bodies) if i not in left_out]), unreadable
        except Exception as exc:  # noqa: BLE001 — as above
            failure = exc
    if fatal:
        u = fatal[0]
        what = (f"{u.inner} {u.name} {u.value!r} in a VTIMEZONE, which the instants written in its zone depend on: "
                f"{u.error}" if u.zone and u.split else u.error)
        raise ParseError(f"source {source!r}: line {u.number}: not a usable iCalendar payload: {what}")
    bad = locate_library_error(lines)
    where = f"line {lines[bad][0]}" if bad is not None else "position unknown"
    raise ParseError(f"source {source!r}: {where}: not a usable iCalendar payload: "
                     f"{failure.__class__.__name__}: {failure}") from None


def lost_by_component(unreadable: list[_Unreadable], paired: bool, problems: list[ParseProblem],
                       source: str) -> dict[int, list[_Unreadable]]:
    """The lines :func:`from_library` left out, by the VEVENT/VTODO they belong to (its index in document
    order); a note appended to ``problems`` for each of the others (a value of the calendar itself, of a
    VJOURNAL…: no rule is read from it). Raises :class:`ParseError` naming the first line when some
    belong to a component but the scan is not ``paired`` with the library's components: which component
    lost the line cannot be told, and read without it a to-do that lost its DUE would be planned at its
    DTSTART."""
    lost: dict[int, list[_Unreadable]] = {}
    for u in unreadable:
        if u.owner is None:
            problems.append(ParseProblem(f"line {u.number}", (
                f"{u.inner} {u.name} {u.value!r} ignored: {u.error} (no VEVENT or VTODO is read from it)"),
                skipped=False))
        else:
            lost.setdefault(u.owner, []).append(u)
    if lost and not paired:
        u = next(u for u in unreadable if u.owner is not None)
        raise ParseError(f"source {source!r}: line {u.number}: not a usable iCalendar payload: {u.described()}")
    return lost


def unreadable_skips(component: icalendar.cal.Component, scan: ScannedComponent | None, lost: list[_Unreadable],
                      problems: list[ParseProblem], position: str, uid: str | None) -> bool:
    """Report the lines of ``component`` the library could not read and say whether they skip it.

    The library keeps going past a line it cannot read in a VEVENT and lists it in ``errors``; in any
    other component it refused the payload, and :func:`from_library` read it again without the line
    (``lost``). Neither passes silently, and a component that lost a line of its own is not read: a
    value the library refused (its meaning is unknown) and a line it cannot split into name, parameters
    and value skip it — a problem appended to ``problems`` naming the line, its last good version stays
    in force — unless that line names an ``X-`` property or one of :data:`_DESCRIPTIVE`, which no instant
    depends on (a note). A line that cannot be split may be a date cut off its property: an RDATE list
    folded without the leading space (RFC 5545 §3.1) left ``,20270125T170000`` on a line of its own, and
    read without it the series lost that occurrence while ``validate`` failed and every check stayed
    green. A line of a VALARM of the component is a note: the alarm is not read. Returns whether the
    component is skipped.
    """
    for u in lost:
        if u.inner not in COMPONENTS:
            problems.append(ParseProblem(position, f"{u.inner} {u.described()}; ignored, the {u.inner} is not read",
                                         uid, skipped=False))
    own = [u for u in lost if u.inner in COMPONENTS]
    described = [u.described() for u in own]
    names = {u.name if not u.split else "" for u in own}  # "": a value the library refused
    for prop, message in getattr(component, "errors", ()) or ():
        described.append(_library_error(component, scan, prop, str(message)))
        if prop is not None:  # a value the library refused: its meaning is unknown
            names.add("")
        else:  # a line it could not split: the name it starts with, when the message quotes it
            # ("SUMMARY=testevent" is a SUMMARY with "=" for ":"; ",20270125T170000" starts with none)
            quoted = m.group(1).strip() if (m := _UNREADABLE_NAME.search(str(message))) else ""
            names.add(named.group(0).upper() if (named := NAME.match(quoted)) else "")
    if not described:
        return False
    fatal = not all(name.startswith("X-") or name in _DESCRIPTIVE for name in names)
    problems.append(ParseProblem(position, ("component skipped: " if fatal else "") + "; ".join(described), uid,
                                 skipped=fatal))
    return fatal


def _library_error(component: icalendar.cal.Component, scan: ScannedComponent | None, prop: str | None,
                   message: str) -> str:
    """One entry of a VEVENT's ``errors`` in words: ``"DTSTART (line 10) '2026XX01': Wrong date format
    2026XX01"`` for a value the library refused (its lines from ``scan``, its value as written from the
    library's ``vBroken``); for a line it could not split, ``"line 10: Content line could not be parsed
    into parts: '20270125T170000': …"`` (the library's message quotes the line; its number comes from
    ``scan``, by the text before the first ``;`` or ``:``, and is left out when that is not one line)."""
    if prop is None:
        named = _UNREADABLE_NAME.search(message)
        numbers = scan.lines.get(named.group(1).strip().upper(), []) if scan is not None and named else []
        return f"line {numbers[0]}: {message}" if len(numbers) == 1 else message
    where = lines_of(scan, prop.upper())
    broken = [str(v) for v in prop_list(component, prop) if isinstance(v, icalendar.prop.vBroken)]
    written = f" {broken[0]!r}" if len(broken) == 1 else ""
    return f"{prop}{where}{written}: {message}"
