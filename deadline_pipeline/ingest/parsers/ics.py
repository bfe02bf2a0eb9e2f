"""iCalendar (RFC 5545) feeds: one rule per VEVENT and VTODO, read with the ``icalendar`` library.

What becomes of each component (section numbers are RFC 5545's):

* ``start``: DTSTART of a VEVENT (§3.8.2.4); for a VTODO the DUE instant (§3.8.2.3), else DTSTART +
  DURATION (§3.6.2, §3.8.2.5), else DTSTART. A DATE value (§3.3.4) is an all-day rule and stays a
  date string.
* DURATION of a VTODO (§3.3.6): its weeks and days are nominal, added to DTSTART's date or wall time
  (``P1D`` from 17:00 Berlin is 17:00 the next day, 23 or 25 hours later across a DST change); its
  hours, minutes and seconds are exact, added to the instant (``PT24H`` is 24 hours). The sum keeps
  DTSTART's form: a date, a wall time in its zone, or a floating time (exact parts read in the
  calendar's zone, see ``tz``; without one added to the wall time). A to-do with both DUE and
  DURATION (§3.6.2 forbids it), a negative DURATION, or hours on a DATE DTSTART is a skipped record
  naming the lines: its due instant is unknown. Weeks written with other parts (``P1W2D``; §3.3.6
  writes weeks alone) are read as the days they add up to, with a note naming the line.
* A value the library cannot read (``DUE:2026XX01``, ``DURATION:P1Y``) skips its VEVENT or VTODO alone,
  a skipped record naming the property, its line and the value; so does a line of it that cannot be
  split into name, parameters and value (``,20270125T170000`` alone: an RDATE folded without its space),
  unless it names a property no instant depends on (DESCRIPTION, an ``X-`` property…: a note); one in
  a VALARM is a note on its component, one of the calendar itself or of a VJOURNAL (no rule comes from
  either) a note naming the line (:func:`_from_library`). One in a VTIMEZONE refuses the payload, naming the line.
* ``tz``: the TZID parameter as written (§3.2.19), checked with
  :func:`~deadline_pipeline.timezones.resolve_zone`, which also maps Windows zone names; a UTC time
  (``Z`` suffix, §3.3.5 form 2) gives ``"UTC"``; a floating time (§3.3.5 form 1) and an all-day date
  take the calendar's ``X-WR-TIMEZONE`` when present, else ``default_tz``, else ``None`` (read later
  in the subscriber's zone) — never UTC.
* A UTC time written with a TZID (``DTSTART;TZID=Europe/Berlin:20260725T121500Z``) is the UTC time:
  §3.3.5 says the TZID parameter must not be applied to a UTC value. The library applies it (12:15
  Berlin wall time, 10:15Z), so the TZID is taken off such values of DTSTART, DTEND, DUE,
  RECURRENCE-ID, EXDATE and RDATE before the library reads them, and each such line is a note
  naming its line (``validate`` reports it). An RRULE's UNTIL is then compared with the UTC instants.
* ``rrule``: the RECUR value (§3.3.10) re-serialised by ``vRecur.to_ical()``, after checking the
  raw text for repeated parts and COUNT+UNTIL (the library silently keeps the last of a repeated
  part, which would change the rule's meaning). An EXRULE (RFC 2445, deprecated by RFC 5545) is not
  applied; a note names its line (:func:`_note_exrules`).
* ``exdates``/``rdates`` (§3.8.5.1, §3.8.5.2): every property, each in its own TZID, converted to
  wall-clock time in the rule's zone (a PERIOD RDATE contributes its start).
* ``rule_id``: the UID (§3.8.4.7); an override (§3.8.4.4) is ``UID#RECURRENCE-ID`` with the
  RECURRENCE-ID as a UTC ISO instant (``…Z``; a date stays a date; a floating one is read in the
  rule's zone, or kept as local ISO when it has none). A component without UID gets the sha256 of
  its DTSTART and SUMMARY: **unstable** — editing the title or time of such an event makes it a new
  rule — because nothing else identifies it. Several components with one identity: a revision that
  another supersedes (higher SEQUENCE, then later DTSTAMP/LAST-MODIFIED) is dropped with a note;
  components tied on the latest revision are different records under one UID, and the one due
  first is kept, the others being skipped records (:func:`~.base.drop_duplicate_ids`).

Closed by the publisher (:func:`_closed_marks`): an event or to-do with STATUS:CANCELLED
(§3.8.1.11), and a completed to-do, are out of force — a one-off or a whole series is dropped with a
note (its reminders are withdrawn), an override takes its occurrence out of the series. A to-do is
completed when its STATUS is COMPLETED; when it has no STATUS, a COMPLETED date-time (§3.8.2.1) or
PERCENT-COMPLETE:100 (§3.8.1.8) says so too, except on a series' master, where one completion date
cannot say which occurrence was done: that series stays in force, with a note. An explicit other
STATUS (NEEDS-ACTION, IN-PROCESS) wins over a COMPLETED date left behind by a reopened to-do. For a
recurring to-do with DTSTART and a DUE or DURATION, the record starts at the first due time and
``extra["due_offset_seconds"]`` (due − DTSTART) lets planning step the series in DTSTARTs, as its
RRULE (UNTIL, BYxxx), RDATEs, EXDATEs and RECURRENCE-IDs name them (§3.8.5.3, §3.8.4.4), each
instance due that span after its start (``plan.occurrences.expansion``).

An override (§3.8.4.4) whose occurrence the series in force no longer has — excluded by an EXDATE,
or no longer generated by its RRULE, UNTIL, COUNT or an RDATE — is dropped with a note, as a closed
one is: a revised series deleting an occurrence may leave that occurrence's older override in the
feed (:func:`~deadline_pipeline.plan.vanished.vanished_overrides`). An override that moves its
occurrence stays as long as the series has the occurrence its RECURRENCE-ID names.

A TZID that resolve_zone does not know but the calendar defines in a VTIMEZONE (Outlook's
``(GMT+01.00) Sarajevo/Warsaw/Zagreb``) is authoritative (§3.6.5): it is read as the IANA zone with
the same offsets and transitions (:func:`~deadline_pipeline.timezones.equivalent_iana_zone`; the
TZID as written is kept in ``extra["tzid"]``). When no IANA zone agrees, a one-off rule or an
RDATE-only set is converted to its exact UTC instants (``tz="UTC"``) and a rule with an RRULE is a
problem, since expanding it needs the zone's rules, which the rule record cannot carry.
"""

from __future__ import annotations

import hashlib
import re
import warnings
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo

import icalendar
from icalendar.parser import Contentline

from deadline_pipeline.ingest.parsers.base import (
    ParseError,
    ParseProblem,
    ParseResult,
    check_recur,
    decode_text,
    drop_duplicate_ids,
)
from deadline_pipeline.instants import instant_text
from deadline_pipeline.plan.offsets import Offset
from deadline_pipeline.rules import RuleRecord, format_local, year_problem
from deadline_pipeline.timezones import (
    EQUIVALENCE_YEARS,
    UnknownTimeZone,
    equivalent_iana_zone,
    offset_disagreements,
    resolve_zone,
    utc_offset_text,
)

WHAT = "an iCalendar (RFC 5545) calendar"
COMPONENTS = ("VEVENT", "VTODO")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class _Skip(Exception):
    """The component cannot become a rule; the message says why."""


#: Properties whose raw text :func:`_scan` keeps per component: RRULE (checked before the library
#: re-serialises it), DUE and DURATION (their lines name a to-do with both, and DURATION's text keeps
#: ``P1D`` apart from ``PT24H``, which the library reads as one and the same ``timedelta``), and EXRULE
#: (the note saying it is not applied quotes it as written, with its line).
_SCANNED = frozenset({"RRULE", "DUE", "DURATION", "EXRULE"})


@dataclass
class _ScannedComponent:
    name: str
    line: int
    #: ``{property name: [(physical line number, text after the first colon), …]}`` for :data:`_SCANNED`
    #: properties of the component itself (not of a VALARM inside it), in document order.
    raw: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    #: ``{property name: [physical line number, …]}`` for every property of the component itself: a value
    #: the library cannot read is reported with its line.
    lines: dict[str, list[int]] = field(default_factory=dict)
    #: ``{property name: [physical line number, …]}`` of its lines without a colon (no value at all).
    colonless: dict[str, list[int]] = field(default_factory=dict)

    def note(self, prop: str, number: int, value: str | None) -> None:
        """Note property ``prop`` (upper case) of physical line ``number``; ``value``: the text after the
        first colon, None for a line without one."""
        self.lines.setdefault(prop, []).append(number)
        if value is None:
            self.colonless.setdefault(prop, []).append(number)
        elif prop in _SCANNED:
            self.raw.setdefault(prop, []).append((number, value))

    @property
    def rrules(self) -> list[str]:
        return [text for _n, text in self.raw.get("RRULE", [])]


@dataclass
class _When:
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


_PHYSICAL = re.compile(rb"\r\n|\r|\n")
#: Properties of a VEVENT or VTODO (RFC 5545 §3.6.1, §3.6.2, RFC 7986) that no instant, identity, revision
#: or status is read from: a line of one of these (or of an ``X-`` property) that the library cannot split
#: is a note, the component read without it. Any other such line skips the component (:func:`_unreadable_skips`).
_DESCRIPTIVE = frozenset({
    "ATTACH", "ATTENDEE", "CATEGORIES", "CLASS", "COLOR", "COMMENT", "CONFERENCE", "CONTACT", "CREATED",
    "DESCRIPTION", "GEO", "IMAGE", "LOCATION", "ORGANIZER", "PRIORITY", "RELATED-TO", "REQUEST-STATUS",
    "RESOURCES", "RSTATUS", "SUMMARY", "TRANSP", "URL",
})
#: What the library's message about a line it could not split quotes of it up to the first ``;`` or ``:``
#: (``Content line could not be parsed into parts: '20270125T170000': …``): the key its line is found by.
_UNREADABLE_NAME = re.compile(r"parts: '([^:;']*)")


def _unfold(content: bytes) -> list[tuple[int, bytes]]:
    """Unfold content lines on the *bytes* (RFC 5545 §3.1): ``(physical line number, logical line)``.

    A fold may split a multi-octet UTF-8 character (§3.1 folds at 75 octets, not characters), so the
    bytes are unfolded before they are decoded. Linear: the pieces of a logical line are joined once
    (appending to a growing string made a 10 MB payload of folded lines take minutes).
    """
    out: list[tuple[int, bytes]] = []
    pieces: list[bytes] = []
    first = 0
    for number, physical in enumerate(_PHYSICAL.split(content), start=1):
        if physical[:1] in (b" ", b"\t") and pieces:
            pieces.append(physical[1:])
            continue
        if pieces:
            out.append((first, b"".join(pieces)))
        pieces, first = ([physical], number) if physical.strip() else ([], 0)
    if pieces:
        out.append((first, b"".join(pieces)))
    return out


def _scan(lines: list[tuple[int, str]], source: str) -> list[_ScannedComponent]:
    """Check BEGIN/END nesting and note each VEVENT/VTODO's line, the lines of its properties and its raw
    RRULE, DUE and DURATION lines, in document order.

    ``lines``: the unfolded logical lines with their physical line numbers. Raises ParseError for a
    payload without any BEGIN line, an END that closes nothing or the wrong component, and a
    truncated payload (a component never closed).
    """
    if not any(body.upper().startswith("BEGIN:") for _n, body in lines):
        number = lines[0][0] if lines else 1
        raise ParseError(f"source {source!r}: line {number}: not {WHAT} (no BEGIN line)")
    stack: list[tuple[str, int]] = []
    found: list[_ScannedComponent] = []
    current: list[_ScannedComponent] = []
    for number, body in lines:
        head, colon, rest = body.partition(":")
        head = head.strip().upper()
        if head == "BEGIN":
            name = rest.strip().upper()
            stack.append((name, number))
            if name in COMPONENTS:
                comp = _ScannedComponent(name, number)
                found.append(comp)
                current.append(comp)
        elif head == "END":
            name = rest.strip().upper()
            if not stack:
                raise ParseError(f"source {source!r}: line {number}: END:{name} closes no component")
            opened, opened_at = stack.pop()
            if opened != name:
                raise ParseError(
                    f"source {source!r}: line {number}: END:{name} does not close "
                    f"BEGIN:{opened} of line {opened_at} (truncated or corrupted calendar)"
                )
            if name in COMPONENTS:
                current.pop()
        elif current and stack and stack[-1][0] in COMPONENTS:
            current[-1].note(head.split(";", 1)[0], number, rest if colon else None)
    if stack:
        opened, opened_at = stack[-1]
        last = lines[-1][0]
        raise ParseError(
            f"source {source!r}: line {last}: payload ends inside BEGIN:{opened} of line {opened_at} "
            f"(truncated calendar: END:{opened} missing)"
        )
    return found


def _locate_library_error(lines: list[tuple[int, str]]) -> int | None:
    """Index of the first content line the library cannot split into name, parameters and value."""
    for index, (_number, body) in enumerate(lines):
        try:
            Contentline(body).parts()
        except Exception:  # noqa: BLE001 — any failure marks the line; the cause is reported by the caller
            return index
    return None


#: Properties whose DATE-TIME values may carry a TZID parameter (RFC 5545 §3.8.2, §3.8.4.4, §3.8.5).
_ZONED = frozenset({"DTSTART", "DTEND", "DUE", "RECURRENCE-ID", "EXDATE", "RDATE"})
_NAME = re.compile(r"[A-Za-z0-9-]+")


def _utc_form(value: str) -> bool:
    """Whether a DATE-TIME (or the start of a PERIOD) is written in UTC: ``…T121500Z`` (§3.3.5 form 2)."""
    return value.split("/", 1)[0].strip().upper().endswith("Z")


def _tzid_off_utc_values(body: str) -> tuple[list[str], str] | None:
    """A content line with a TZID and UTC values, rewritten so the library reads those values as UTC.

    Returns ``(lines, note)``: one line holding the UTC values without TZID (other parameters kept),
    plus one with the remaining values and the TZID when the line mixes both forms; ``None`` for any
    line that needs no change. Without this, icalendar 7 applies the TZID to ``…Z`` and drops the
    ``Z``: ``DTSTART;TZID=Europe/Berlin:20260725T121500Z`` became 10:15Z instead of 12:15Z.
    """
    head = _NAME.match(body)
    if head is None or head.group(0).upper() not in _ZONED:
        return None
    try:
        name, params, value = Contentline(body).parts()
    except Exception:  # noqa: BLE001 — an unsplittable line is the library's to report
        return None
    tzid = params.get("TZID")
    values = value.split(",")
    utc = [v for v in values if _utc_form(v)]
    if not tzid or not utc:
        return None
    plain = params.copy()
    del plain["TZID"]
    start = f"{name};{plain.to_ical().decode()}" if plain else name
    lines = [f"{start}:{','.join(utc)}"]
    rest = [v for v in values if not _utc_form(v)]
    if rest:
        lines.append(f"{name};{params.to_ical().decode()}:{','.join(rest)}")
    note = (f"{name};TZID={tzid}:{','.join(utc)} is a UTC time with a TZID parameter, which RFC 5545 §3.3.5 "
            "forbids; read as the UTC time written, the TZID is not applied")
    return lines, note


def _when(prop: object, what: str) -> _When:
    """Read a DTSTART/DUE/RECURRENCE-ID property (a vDDDTypes) into a :class:`_When`."""
    if isinstance(prop, icalendar.prop.vBroken):
        raise _Skip(f"{what} is not a valid date or date-time: {str(prop)!r}")
    return _value_when(getattr(prop, "dt", None), getattr(prop, "params", {}) or {}, what)


def _written_value(value: object, params: dict) -> object:
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


def _value_when(value: object, params: dict, what: str) -> _When:
    """One DATE or DATE-TIME value of property ``what`` with its ``params`` (TZID) as a :class:`_When`.
    Raises :class:`_Skip` naming ``what`` for a value that is neither, in an unknown zone, or outside
    :data:`~deadline_pipeline.rules.RULE_YEARS`."""
    value = _written_value(value, params)
    if isinstance(value, date):
        # Before any zone arithmetic: DTSTART;TZID=America/New_York:99991231T235959 has no UTC form,
        # and the OverflowError failed the whole calendar, not this component.
        problem = year_problem(value)
        if problem:
            shown = value.replace(tzinfo=None).isoformat() if isinstance(value, datetime) else value.isoformat()
            raise _Skip(f"{what} {shown}: {problem}")
    if isinstance(value, datetime):
        naive = value.replace(tzinfo=None)
        tzid = params.get("TZID")
        if tzid:
            try:
                return _When(naive, str(tzid), resolve_zone(str(tzid)))
            except UnknownTimeZone:
                pass
            if isinstance(value.tzinfo, ZoneInfo):  # the library mapped the name to an IANA zone
                return _When(naive, value.tzinfo.key, value.tzinfo)
            if value.tzinfo is not None:  # defined by a VTIMEZONE of this calendar only
                # The file's definition is authoritative (§3.6.5): read it as the IANA zone with the
                # same offsets and transitions, so the rule can be planned like any other.
                iana = equivalent_iana_zone(value.tzinfo, str(tzid))
                if iana is not None:
                    return _When(naive, iana, ZoneInfo(iana), written=str(tzid))
                return _When(naive, str(tzid), value.tzinfo, known=False)
            raise _Skip(f"{what} has TZID {str(tzid)!r}, a zone that is neither known nor defined "
                        "by a VTIMEZONE in this calendar")
        if value.tzinfo is not None:  # the "Z" form: an absolute UTC time
            return _When(value.astimezone(UTC).replace(tzinfo=None), "UTC", UTC)
        return _When(naive, None, None)
    if isinstance(value, date):
        return _When(value, None, None)
    raise _Skip(f"{what} is {type(value).__name__}, not a date or date-time")


def _prop_list(component: icalendar.cal.Component, name: str) -> list:
    value = component.get(name)
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _text(component: icalendar.cal.Component, name: str) -> str | None:
    value = component.get(name)
    if value is None or isinstance(value, list):
        return None
    return str(value)


def _calendar_zone(cal: icalendar.cal.Component, default_tz: str | None,
                   problems: list[ParseProblem], index: int) -> str | None:
    """The zone for floating times: X-WR-TIMEZONE when known, else default_tz."""
    declared = cal.get("X-WR-TIMEZONE") if cal.name == "VCALENDAR" else None
    if declared is not None and str(declared).strip():
        name = str(declared).strip()
        try:
            resolve_zone(name)
            return name
        except UnknownTimeZone as exc:
            problems.append(ParseProblem(f"VCALENDAR {index}", f"X-WR-TIMEZONE ignored: {exc}", skipped=False))
    return default_tz


def _utc_values_without_tzid(lines: list[tuple[int, str]]) -> tuple[list[tuple[int, str]], list[ParseProblem]]:
    """The logical lines to hand to the library (:func:`_tzid_off_utc_values` applied to each), each with
    its physical line number, and a note per rewritten line, positioned at its physical line (``"line
    N"``). ``lines``: the unfolded lines with their physical line numbers. Pure."""
    bodies: list[tuple[int, str]] = []
    notes: list[ParseProblem] = []
    for number, body in lines:
        rewritten = _tzid_off_utc_values(body)
        if rewritten is None:
            bodies.append((number, body))
            continue
        bodies.extend((number, line) for line in rewritten[0])
        notes.append(ParseProblem(f"line {number}", rewritten[1], skipped=False))
    return bodies, notes


@dataclass(frozen=True)
class _Unreadable:
    """A content line the library refuses inside a component it reads strictly (every one but VEVENT)."""

    index: int  # its place in the lines handed to the library
    number: int  # its physical line
    name: str  # the property name, upper case ("" when even that is unreadable)
    value: str  # the value as written; the whole line when the line cannot be split
    error: str  # the library's message
    inner: str  # the innermost component it is in: "VTODO", "VALARM", "VCALENDAR", "STANDARD"…
    owner: int | None  # the VEVENT/VTODO it belongs to (its index in document order, as :func:`_scan`'s)
    zone: bool  # inside a VTIMEZONE
    split: bool  # False: the line cannot be split into name, parameters and value

    def described(self) -> str:
        """``"DUE (line 10) '2026XX01': Wrong date format 2026XX01"``; for a line that cannot be split,
        ``"line 10: Content line could not be parsed into parts: …"``."""
        if not self.split:
            return f"line {self.number}: {self.error}"
        return f"{self.name} (line {self.number}) {self.value!r}: {self.error}"


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
                named = _NAME.match(body)
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
        if key == "BEGIN":  # the same reading of BEGIN/END as _scan's, so owners number alike
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


def _from_library(lines: list[tuple[int, str]], bodies: list[tuple[int, str]],
                  source: str) -> tuple[list, list[_Unreadable]]:
    """The library's reading of ``bodies`` (the lines as handed over, with their physical line numbers,
    see :func:`_utc_values_without_tzid`), and the lines left out of it (:func:`_unreadable_lines`).

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
    bad = _locate_library_error(lines)
    where = f"line {lines[bad][0]}" if bad is not None else "position unknown"
    raise ParseError(f"source {source!r}: {where}: not a usable iCalendar payload: "
                     f"{failure.__class__.__name__}: {failure}") from None


def _lost_by_component(unreadable: list[_Unreadable], paired: bool, problems: list[ParseProblem],
                       source: str) -> dict[int, list[_Unreadable]]:
    """The lines :func:`_from_library` left out, by the VEVENT/VTODO they belong to (its index in document
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


def _unreadable_skips(component: icalendar.cal.Component, scan: _ScannedComponent | None, lost: list[_Unreadable],
                      problems: list[ParseProblem], position: str, uid: str | None) -> bool:
    """Report the lines of ``component`` the library could not read and say whether they skip it.

    The library keeps going past a line it cannot read in a VEVENT and lists it in ``errors``; in any
    other component it refused the payload, and :func:`_from_library` read it again without the line
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
            names.add(named.group(0).upper() if (named := _NAME.match(quoted)) else "")
    if not described:
        return False
    fatal = not all(name.startswith("X-") or name in _DESCRIPTIVE for name in names)
    problems.append(ParseProblem(position, ("component skipped: " if fatal else "") + "; ".join(described), uid,
                                 skipped=fatal))
    return fatal


def _lines_of(scan: _ScannedComponent | None, name: str) -> str:
    """``" (line 10)"``, ``" (lines 9, 10)"``: the physical lines of property ``name`` (upper case) of the
    component ``scan`` noted; ``""`` without a scan or such a line."""
    numbers = scan.lines.get(name, []) if scan is not None else []
    return f" (line{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))})" if numbers else ""


def _library_error(component: icalendar.cal.Component, scan: _ScannedComponent | None, prop: str | None,
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
    where = _lines_of(scan, prop.upper())
    broken = [str(v) for v in _prop_list(component, prop) if isinstance(v, icalendar.prop.vBroken)]
    written = f" {broken[0]!r}" if len(broken) == 1 else ""
    return f"{prop}{where}{written}: {message}"


def parse_ics(content: bytes, *, source: str, default_tz: str | None = None) -> ParseResult:
    """Parse an iCalendar payload into one rule per VEVENT/VTODO (see the module docstring).

    ``content``: the payload's bytes (UTF-8, RFC 5545 §3.1.4). ``source``: the source name, used in
    messages. ``default_tz``: zone of floating times when the calendar declares no X-WR-TIMEZONE.

    Returns a :class:`ParseResult`; components without DTSTART/DUE, with unreadable values, unknown
    zones or malformed RRULEs are problems with position ``"VEVENT UID=… (line N)"``. Components
    found outside a VCALENDAR are read too, with a problem noting it. Raises :class:`ParseError`
    (naming source and line) for undecodable, empty, HTML, truncated or mis-nested payloads, payloads
    without any calendar component, content lines the library cannot parse at all outside a
    VEVENT/VTODO and values it cannot read in a VTIMEZONE. A content line the library cannot split
    inside a VEVENT/VTODO skips that component alone, naming the line (it may be a date cut off its
    property, so the component's instants are unknown; a line of a descriptive or ``X-`` property is a
    note), and the other components are read. A value it
    cannot read there skips the component, naming the property, line and value (:func:`_unreadable_skips`).
    """
    if not isinstance(content, (bytes, bytearray)):
        raise ParseError(f"source {source!r}: expected bytes, got {type(content).__name__}")
    raw_lines = _unfold(bytes(content))
    try:
        text = decode_text(b"\r\n".join(line for _n, line in raw_lines), source=source, what=WHAT)
    except ParseError:
        decode_text(bytes(content), source=source, what=WHAT)  # the message with the original position
        raise
    numbers = [n for n, _line in raw_lines]
    lines = list(zip(numbers, text.split("\r\n"), strict=True)) if text else []
    scanned = _scan(lines, source)
    result = ParseResult()
    bodies, result.problems = _utc_values_without_tzid(lines)
    tops, unreadable = _from_library(lines, bodies, source)
    components: list[tuple[icalendar.cal.Component, str | None]] = []
    tops = [t for t in tops if isinstance(t, icalendar.cal.Component)]
    if not any(t.name == "VCALENDAR" for t in tops) and not any(
        c.name in COMPONENTS for t in tops for c in t.walk()
    ):
        raise ParseError(f"source {source!r}: line 1: not {WHAT} (no VCALENDAR, VEVENT or VTODO found)")
    for index, top in enumerate(tops, start=1):
        if top.name != "VCALENDAR" and any(c.name in COMPONENTS for c in top.walk()):
            result.problems.append(ParseProblem(
                f"{top.name} {index}", "component outside a VCALENDAR (RFC 5545 §3.4); read anyway", skipped=False))
        zone = _calendar_zone(top, default_tz, result.problems, index)
        components.extend((c, zone) for c in top.walk() if c.name in COMPONENTS)

    # The scan and the library walk both list components in document order; use the scan's line
    # numbers and raw RRULEs only when the two agree, rather than risk pairing the wrong ones.
    paired = len(scanned) == len(components) and all(
        s.name == c.name for s, (c, _z) in zip(scanned, components, strict=True)
    )
    lost = _lost_by_component(unreadable, paired, result.problems, source)
    defined = _zones_defined_anew(tops, lines, result.problems)
    ranks: list[tuple] = []  # per rule read: its revision rank
    for n, (component, zone) in enumerate(components):
        scan = scanned[n] if paired else None
        uid = _text(component, "UID")
        position = f"{component.name} UID={uid}" if uid else f"{component.name} #{n + 1} (no UID)"
        if scan is not None:
            position += f" (line {scan.line})"
        if _unreadable_skips(component, scan, lost.get(n, []), result.problems, position, uid):
            continue
        try:
            rule = _component_rule(component, zone, uid, scan, result.problems, position)
            result.add(rule, position)
            _note_zone_read_anew(component, rule, scan, defined, result.problems, position)
            ranks.append(_revision_rank(component))
        except _Skip as exc:
            result.problems.append(ParseProblem(position, str(exc), uid))
        except Exception as exc:  # noqa: BLE001 — one hostile component must not sink the payload
            result.problems.append(ParseProblem(position, f"unreadable component: {exc.__class__.__name__}: {exc}",
                                                uid))
    return _without_vanished_overrides(_without_cancelled(drop_duplicate_ids(_latest_revisions(result, ranks))))


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


def _zones_defined_anew(tops: list, lines: list[tuple[int, str]],
                        problems: list[ParseProblem]) -> dict[str, _DefinedZone]:
    """``{TZID: _DefinedZone}`` for each VTIMEZONE of ``tops`` (the library's components) whose TZID
    names a zone :func:`~deadline_pipeline.timezones.resolve_zone` knows (an IANA or Windows name).
    ``lines``: the unfolded lines with their physical numbers, to name each TZID's line. A definition
    the library cannot turn into a zone is a note appended to ``problems`` (it cannot be compared)."""
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
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ours = vtz.to_tz(lookup_tzid=False)
            except Exception as exc:  # noqa: BLE001 — the library raises ValueError, KeyError…
                problems.append(ParseProblem(f"line {line}" if line else f"VTIMEZONE TZID={tzid}", (
                    f"VTIMEZONE TZID={tzid} cannot be compared with the zone of that name, which is read instead: "
                    f"{exc.__class__.__name__}: {exc}"), skipped=False))
                continue
            out[tzid] = _DefinedZone(tzid, line, ours, theirs)
    return out


#: The date properties whose TZID :func:`_note_zone_read_anew` compares.
_DATED = ("DTSTART", "DUE", "RECURRENCE-ID", "RDATE", "EXDATE")


def _note_zone_read_anew(component: icalendar.cal.Component, rule: RuleRecord, scan: _ScannedComponent | None,
                         defined: dict[str, _DefinedZone], problems: list[ParseProblem], position: str) -> None:
    """A note appended to ``problems`` when a value of ``component`` is read in a zone whose UTC offset
    differs from the one the calendar's own VTIMEZONE of that TZID gives (``defined``), naming the
    VTIMEZONE, the value's line, the instant and both offsets; nothing when they agree.

    A TZID that names an IANA zone is that zone (see the module docstring), also when the calendar
    defines it differently (an old US rule, say: many producers ship stale VTIMEZONEs), so the instant
    is the IANA zone's; RFC 5545 §3.6.5 makes the VTIMEZONE the definition, so a disagreement is said,
    not resolved silently. Compared at each DTSTART, DUE, RECURRENCE-ID, RDATE and EXDATE value, and for
    an RRULE at its first occurrence within the spans where the two zones disagree
    (:func:`~deadline_pipeline.timezones.offset_disagreements`, years :data:`EQUIVALENCE_YEARS`). One
    note per component: the first disagreement found."""
    if not defined:
        return
    for name in _DATED:
        for prop in _prop_list(component, name):
            params = getattr(prop, "params", {}) or {}
            zone = defined.get(str(params.get("TZID", "")).strip())
            if zone is None:
                continue
            values = [d.dt for d in getattr(prop, "dts", [])] if hasattr(prop, "dts") else [getattr(prop, "dt", None)]
            for value in values:
                value = _written_value(value, params)
                if not isinstance(value, datetime):
                    continue
                wall = value.replace(tzinfo=None)
                ours, theirs = wall.replace(tzinfo=zone.ours).utcoffset(), wall.replace(tzinfo=zone.theirs).utcoffset()
                if ours != theirs:
                    problems.append(_zone_note(zone, f"{name}{_lines_of(scan, name)} {format_local(wall)}",
                                               wall.replace(tzinfo=zone.theirs), ours, theirs, position, rule))
                    return
    zone = defined.get(rule.tz or "")
    if rule.rrule is None or zone is None:
        return
    from deadline_pipeline.plan.occurrences import expand

    if zone.spans is None:
        zone.spans = offset_disagreements(zone.ours, zone.theirs)
    for start, end, ours, theirs in zone.spans:
        found = expand(rule, zone.theirs, after=start.replace(tzinfo=UTC), before=end.replace(tzinfo=UTC)
                       - timedelta(seconds=1), limit=1, strict=False)
        if found:
            label = _named_lines(scan, "RRULE")
            problems.append(_zone_note(zone, f"the occurrence of {found[0].due_at.astimezone(zone.theirs):%Y-%m-%d} "
                                             f"of the {label}", found[0].due_at, ours, theirs, position, rule))
            return


def _zone_note(zone: _DefinedZone, what: str, instant: datetime, ours: timedelta, theirs: timedelta, position: str,
               rule: RuleRecord) -> ParseProblem:
    """The note of :func:`_note_zone_read_anew`: ``what`` (a value and its line) is due at ``instant``
    (aware) in the zone read, whose offset is ``theirs``; the calendar's definition gives ``ours``."""
    return ParseProblem(position, (
        f"{zone.named} disagrees with the zone of that name at {what}: the calendar's definition gives "
        f"UTC{utc_offset_text(ours)}, the IANA zone {getattr(zone.theirs, 'key', zone.tzid)} "
        f"UTC{utc_offset_text(theirs)}; "
        f"read in the IANA zone (due {instant_text(instant)}). A TZID naming an IANA zone is that zone: if the "
        "definition was meant, give it a TZID of its own"), rule.rule_id, skipped=False)


def _closing(rule: RuleRecord) -> str:
    """How the publisher closed ``rule``: ``"completed (STATUS:COMPLETED)"``, ``"cancelled (STATUS:CANCELLED)"``…"""
    completed = rule.extra.get("completed")
    return f"completed ({completed})" if completed else "cancelled (STATUS:CANCELLED)"


def _without_cancelled(result: ParseResult) -> ParseResult:
    """Take the events and to-dos their publisher cancelled or completed (``extra["cancelled"]``,
    see :func:`_closed_marks`) out of force.

    A closed master (no RECURRENCE-ID) is dropped with every override of its UID: the whole event,
    to-do or series is over, so its reminders are withdrawn as for a removed event (:func:`_withdraw`).
    A closed override stays, marked: planning makes the occurrence it names an EXDATE of its master
    and plans nothing for it (:func:`deadline_pipeline.plan.recurrence.apply_overrides`).
    """
    cancelled = {str(r.extra.get("uid") or r.rule_id): _closing(r) for r in result.rules
                 if r.extra.get("cancelled") and "recurrence_id" not in r.extra}
    reasons = {}
    for rule in result.rules:
        closed = cancelled.get(str(rule.extra.get("uid") or rule.rule_id))
        if closed is None:
            continue
        override = "recurrence_id" in rule.extra
        reasons[rule.rule_id] = f"an override of a series that is {closed}" if override else closed
    return _withdraw(result, reasons)


def _without_vanished_overrides(result: ParseResult) -> ParseResult:
    """Take out of force each override whose occurrence the series in force no longer has: excluded
    by an EXDATE, or no longer generated by its RRULE/RDATE (RFC 5545 §3.8.4.4, §3.8.5; see
    :func:`deadline_pipeline.plan.vanished.vanished_overrides`, which logs and counts each).

    A feed revising a series to delete an occurrence (SEQUENCE 2 with an EXDATE) may keep that
    occurrence's override of SEQUENCE 1; planned, it reminded of an occurrence its owner deleted.
    """
    from deadline_pipeline.plan.vanished import vanished_overrides

    return _withdraw(result, vanished_overrides(result.rules))


def _withdraw(result: ParseResult, reasons: dict[str, str]) -> ParseResult:
    """Drop the rules named in ``reasons`` (``{rule_id: why}``), each with a note: ``"<why>: not in
    force, its reminders are withdrawn"`` at the rule's position.

    A note (``skipped=False``), not a skipped record: ingest holds a skipped record's last version in
    force, and its reminders would still go out. Missing from the snapshot, the rule is withdrawn.
    Returns ``result``, changed; its positions stay parallel to its rules when they were.
    """
    if not reasons:
        return result
    positions = result.positions if len(result.positions) == len(result.rules) else [None] * len(result.rules)
    kept, where = [], []
    for rule, position in zip(result.rules, positions, strict=True):
        if rule.rule_id not in reasons:
            kept.append(rule)
            where.append(position)
            continue
        uid = str(rule.extra.get("uid") or rule.rule_id)
        result.problems.append(ParseProblem(
            position or f"{rule.extra.get('component', 'VEVENT')} UID={uid}",
            f"{reasons[rule.rule_id]}: not in force, its reminders are withdrawn", rule.rule_id, skipped=False))
    result.rules = kept
    result.positions = where if len(result.positions) == len(positions) else result.positions
    return result


_EPOCH = datetime(1, 1, 1, tzinfo=UTC)


def _revision_rank(component: icalendar.cal.Component) -> tuple[int, datetime]:
    """How recent a revision of a component is: ``(SEQUENCE, latest of DTSTAMP and LAST-MODIFIED)``.

    RFC 5545 §3.8.7.4 (SEQUENCE) and §3.8.7.2/§3.8.7.3 (DTSTAMP, LAST-MODIFIED); RFC 5546 §2.1.5 orders
    revisions of one UID by SEQUENCE, then DTSTAMP. A missing or unreadable value ranks lowest.
    """
    try:
        sequence = int(str(component.get("SEQUENCE", 0)))
    except ValueError:
        sequence = 0
    stamps = [_EPOCH]
    for name in ("DTSTAMP", "LAST-MODIFIED"):
        value = getattr(component.get(name), "dt", None)
        if isinstance(value, datetime):
            stamps.append(value if value.tzinfo is not None else value.replace(tzinfo=UTC))
    return sequence, max(stamps)


def _latest_revisions(result: ParseResult, ranks: list[tuple]) -> ParseResult:
    """Of several components with one identity (UID, and RECURRENCE-ID for an override), drop each
    revision that a later one supersedes (:func:`_revision_rank`: a higher SEQUENCE, then a later
    DTSTAMP/LAST-MODIFIED; RFC 5546 §2.1.5) and report it as a note. ``ranks``: parallel to
    ``result.rules`` (and ``result.positions``).

    Keeping the first in the file instead would plan a superseded time when a feed appends the new
    revision of an event after the old one. Components that tie on the latest rank are all left to
    :func:`~.base.drop_duplicate_ids`: nothing says which is the newer, so they are not revisions of
    one event but different records under one UID (two exports merged, a generator reusing UIDs), and
    keeping the first in the file dropped a different deadline without a word. There a differing
    copy is a skipped record and the one due first is kept; an identical copy stays a note.
    """
    best: dict[str, tuple] = {}
    for i, rule in enumerate(result.rules):
        if rule.rule_id not in best or ranks[i] > best[rule.rule_id][0]:
            best[rule.rule_id] = (ranks[i], i)
    kept, where = [], []
    for i, rule in enumerate(result.rules):
        rank, j = best[rule.rule_id]
        if ranks[i] == rank:
            kept.append(rule)
            where.append(result.positions[i])
            continue
        (seq, stamp), (seq_kept, stamp_kept) = ranks[i], rank
        result.problems.append(ParseProblem(result.positions[i], (
            f"duplicate UID: this revision (SEQUENCE {seq}, stamped {instant_text(stamp)}) is superseded by the one "
            f"at {result.positions[j]} (SEQUENCE {seq_kept}, stamped {instant_text(stamp_kept)}); the latest is kept"),
            rule.rule_id, skipped=False))
    result.rules, result.positions = kept, where
    return result


#: The properties a rule is read from, which a misspelt property name is compared with.
_TIMING = ("DTSTART", "DUE", "DTEND", "DURATION", "RRULE", "RDATE", "EXDATE", "RECURRENCE-ID")


def _refuse_lost_properties(component: icalendar.cal.Component, scan: _ScannedComponent | None) -> None:
    """Raise :class:`_Skip` for a component whose dates or rule lost a line without a word: one the scan
    found without a colon (``scan.colonless``) and the library dropped (``RDATE;VALUE=DATE 20270301``, a
    space for the colon: the library kept no RDATE at all), or a property name that is no iCalendar property but
    close to one of :data:`_TIMING` (``RRLUE``: ignored as unknown, the yearly rule became a one-off).
    Either way ``validate`` and every check said OK while occurrences were never planned."""
    import difflib

    present = {str(name).upper() for name in component.keys()}
    lines = {str(name).upper(): numbers for name, numbers in (scan.lines if scan is not None else {}).items()}
    colonless = {str(name).upper(): numbers for name, numbers in (scan.colonless if scan is not None else {}).items()}
    for name in _TIMING:
        # Only a line without a colon: an empty ``RDATE:`` names no occurrence, and dropping it loses none.
        if name in colonless and name not in present:
            raise _Skip(f"{name} (line {colonless[name][0]}) could not be read (a content line is "
                        "NAME;PARAMS:VALUE); the occurrences it names are unknown")
    for name in present:
        if name.startswith("X-") or name in _TIMING:
            continue
        close = difflib.get_close_matches(name, _TIMING, n=1, cutoff=0.75)
        if close and name not in _KNOWN_PROPERTIES:
            where = f" (line {lines[name][0]})" if name in lines else ""
            raise _Skip(f"{name}{where} is no iCalendar property; did you mean {close[0]}? Ignored, the rule would be "
                        "planned without it")


#: RFC 5545 properties of a VEVENT or VTODO (§3.6.1, §3.6.2) that are not :data:`_TIMING`, and RFC 7986's.
_KNOWN_PROPERTIES = frozenset({
    "DTSTAMP", "UID", "CLASS", "CREATED", "DESCRIPTION", "GEO", "LAST-MODIFIED", "LOCATION", "ORGANIZER",
    "PRIORITY", "SEQUENCE", "STATUS", "SUMMARY", "TRANSP", "URL", "ATTACH", "ATTENDEE", "CATEGORIES", "COMMENT",
    "CONTACT", "RELATED-TO", "RESOURCES", "RSTATUS", "RRULE", "COMPLETED", "PERCENT-COMPLETE", "COLOR",
    "CONFERENCE", "IMAGE", "REQUEST-STATUS",
})


def _component_rule(component: icalendar.cal.Component, floating_zone: str | None, uid: str | None,
                    scan: _ScannedComponent | None, problems: list[ParseProblem],
                    position: str) -> RuleRecord:
    _refuse_lost_properties(component, scan)
    is_todo = component.name == "VTODO"
    key = "DUE" if is_todo and component.get("DUE") is not None else "DTSTART"
    prop = component.get(key)
    if isinstance(prop, list):
        # RFC 5545 3.6.1/3.6.2: DTSTART (and DUE) MUST NOT occur more than once. Which one the
        # publisher meant cannot be told, so the record is skipped (and held back, not withdrawn).
        raise _Skip(f"{key} appears {len(prop)} times (RFC 5545 allows it once); the due instant is ambiguous")
    if prop is None:
        raise _Skip("no DUE or DTSTART" if is_todo else "no DTSTART")
    start = _when(prop, key)
    if is_todo:
        start = _todo_due(component, key, start, scan, floating_zone, problems, position, uid)

    rrule = _rrule(component, scan)
    _note_exrules(component, scan, problems, position, uid)
    rdates = _dates(component, "RDATE", problems, position)
    extra: dict = {}
    if start.written:
        extra["tzid"] = start.written
    if start.known:
        tz = start.tz if start.tz is not None else floating_zone
    elif rrule is not None:
        raise _Skip(f"TZID {start.tz!r} is defined only by this calendar's VTIMEZONE and no IANA zone has "
                    f"its offsets and transitions in {EQUIVALENCE_YEARS[0]}-{EQUIVALENCE_YEARS[1]}; a recurring "
                    "rule cannot be expanded in it (use an IANA zone name)")
    else:
        # A one-off time (or a set of RDATEs, each in its own zone) converts exactly to its instants,
        # so no meaning is lost.
        extra["tzid"] = start.tz
        start = _When(start.aware.astimezone(UTC).replace(tzinfo=None), "UTC", UTC)
        tz = "UTC"
    rule_zone = resolve_zone(tz) if tz is not None else None

    exdates = _dates(component, "EXDATE", problems, position)
    summary = _text(component, "SUMMARY")
    if uid:
        rule_id = uid
    else:
        # Unstable by nature (see the module docstring): nothing else identifies the component.
        raw_start = prop.to_ical()
        raw_start = raw_start.decode() if isinstance(raw_start, bytes) else str(raw_start)
        blob = f"{start.tz or ''}:{raw_start}\n{summary or ''}".encode()
        rule_id = hashlib.sha256(blob).hexdigest()
        extra["unstable_id"] = True
    recurrence_id = component.get("RECURRENCE-ID")
    if recurrence_id is not None and not isinstance(recurrence_id, list):
        rid = _when(recurrence_id, "RECURRENCE-ID")
        rid_text = _utc_iso(rid, rule_zone)
        rule_id = f"{rule_id}#{rid_text}"
        extra["recurrence_id"] = rid_text
        if isinstance(rid.value, datetime):
            # Its local date as written: what it names in an all-day master (Outlook writes a DATE-TIME
            # RECURRENCE-ID, e.g. in TZID=GMT Standard Time, for occurrences of an all-day series).
            extra["recurrence_id_date"] = rid.value.date().isoformat()
        # RANGE=THISANDFUTURE (§3.2.13) makes the override apply to every later occurrence too;
        # planning splits the series on it (plan.recurrence.apply_overrides).
        rng = recurrence_id.params.get("RANGE") if hasattr(recurrence_id, "params") else None
        if rng:
            extra["range"] = str(rng).upper()

    recurring = (rrule is not None or bool(rdates)) and "recurrence_id" not in extra
    extra.update(_closed_marks(component, recurring, problems, position, uid))
    if is_todo and recurring:
        extra.update(_due_offset(component, start))  # {} when the to-do is due at its DTSTART
    return RuleRecord(
        rule_id=rule_id,
        title=summary if summary is not None else "(untitled)",
        start=format_local(start.value),
        tz=tz,
        rrule=rrule,
        exdates=tuple(_in_zone(w, rule_zone, problems, position, "EXDATE") for w in exdates),
        rdates=tuple(_in_zone(w, rule_zone, problems, position, "RDATE") for w in rdates),
        kind="todo" if is_todo else "event",
        url=_text(component, "URL"),
        note=_text(component, "DESCRIPTION"),
        extra={**extra, "uid": uid, "component": component.name},
    )


def _closed_marks(component: icalendar.cal.Component, recurring: bool, problems: list[ParseProblem],
                  position: str, uid: str | None) -> dict:
    """The ``extra`` marks of a component its publisher closed (see the module docstring).

    ``{"cancelled": True}`` for STATUS:CANCELLED (RFC 5545 §3.8.1.11; Thunderbird and Google export a
    cancelled occurrence of a series as an override with it); ``{"cancelled": True, "completed":
    evidence}`` for a completed to-do, where ``evidence`` is the property that says so
    (:func:`_completion`). The one mark ``cancelled`` takes either out of force (:func:`_without_cancelled`,
    ``plan.recurrence.apply_overrides``): reminding of either told subscribers to meet a deadline
    that no longer needs meeting. ``recurring``: a series' master (not an override), on which only
    STATUS:COMPLETED counts; a COMPLETED date or PERCENT-COMPLETE:100 there is a note appended to
    ``problems`` and the series stays in force.
    """
    status = (_text(component, "STATUS") or "").strip().upper()
    if status == "CANCELLED":
        return {"cancelled": True}
    evidence = _completion(component, status) if component.name == "VTODO" else None
    if evidence is None:
        return {}
    if recurring and status != "COMPLETED":
        # One completion date cannot say which occurrence was done, and a series has many: withdrawing
        # all of them on it would miss every later one.
        problems.append(ParseProblem(position, (
            f"{evidence} on a recurring to-do without STATUS:COMPLETED is read as one completion, not the end of "
            "the series (RFC 5545 §3.8.2.1, §3.8.1.8): the series stays in force; mark a completed occurrence "
            "with an override, or the whole series with STATUS:COMPLETED"), uid, skipped=False))
        return {}
    return {"cancelled": True, "completed": evidence}


def _completion(todo: icalendar.cal.Component, status: str) -> str | None:
    """What says a to-do is completed, or None: STATUS:COMPLETED (RFC 5545 §3.8.1.11); without a
    STATUS, a COMPLETED date-time (§3.8.2.1) or PERCENT-COMPLETE:100 (§3.8.1.8). An explicit other
    STATUS (NEEDS-ACTION, IN-PROCESS) wins over a COMPLETED date left behind when a to-do is reopened."""
    if status == "COMPLETED":
        return "STATUS:COMPLETED"
    if status:
        return None
    done = todo.get("COMPLETED")
    if done is not None and not isinstance(done, list):
        raw = done.to_ical()
        return f"COMPLETED:{raw.decode() if isinstance(raw, bytes) else raw}"
    if str(todo.get("PERCENT-COMPLETE", "")).strip() == "100":
        return "PERCENT-COMPLETE:100"
    return None


def _due_offset(todo: icalendar.cal.Component, due: _When) -> dict:
    """``{"due_offset_seconds": n}``: a recurring to-do's due time (its DUE, or DTSTART + DURATION, see
    :func:`_todo_due`) − DTSTART in wall-clock seconds of the due time's zone, when it has a DTSTART
    and the two differ; else ``{}``.

    A RECURRENCE-ID names an instance by its DTSTART (RFC 5545 §3.8.4.4), while the to-do is
    planned at its DUE: planning shifts the RECURRENCE-ID by this to find the occurrence it names
    (``plan.recurrence.occurrence_named``). Without it, a completed occurrence of a task due at
    17:00 whose DTSTART is 09:00 (Thunderbird writes both) named no occurrence and was reminded.
    """
    prop = todo.get("DTSTART")
    if prop is None or isinstance(prop, list):
        return {}
    try:
        begin = _when(prop, "DTSTART")
    except _Skip:
        return {}  # an unreadable DTSTART of a to-do read at its DUE: no occurrence to shift from
    if begin.aware is not None and due.aware is not None:
        begin = _When(begin.aware.astimezone(due.zone).replace(tzinfo=None), due.tz, due.zone)
    if type(begin.value) is not type(due.value) or (begin.zone is None) != (due.zone is None):
        return {}  # a DATE DTSTART with a DATE-TIME DUE (or floating with zoned): no common clock
    seconds = int((due.value - begin.value).total_seconds())
    return {"due_offset_seconds": seconds} if seconds else {}


def _todo_due(todo: icalendar.cal.Component, key: str, start: _When, scan: _ScannedComponent | None,
              floating_zone: str | None, problems: list[ParseProblem], position: str, uid: str | None) -> _When:
    """A to-do's due time: ``start`` (its ``key`` value, DUE or else DTSTART), moved by its DURATION when
    it has one (RFC 5545 §3.6.2: "dur" only with DTSTART, the to-do then due at DTSTART + DURATION,
    §3.8.2.5); ``floating_zone``: the calendar's zone for floating times (see the module docstring).

    Before, a DURATION was not read and the to-do was due at its DTSTART: a ``P1D`` task's reminders
    came a day early. Raises :class:`_Skip` for a to-do with DUE and DURATION (§3.6.2: they "MUST NOT
    occur in the same 'todo'"), naming both lines, and for a DURATION :func:`_duration` or
    :func:`_plus_duration` refuses: which instant the publisher meant cannot be told, so the record is
    skipped (its last good version stays in force) rather than planned at either reading. A DURATION
    writing weeks with other parts (``P1W2D``) is read (:func:`_duration`) with a note appended to
    ``problems`` at ``position``.
    """
    prop = todo.get("DURATION")
    if prop is None:
        return start
    if key == "DUE":
        raise _Skip(f"{_named_lines(scan, 'DUE')} and {_named_lines(scan, 'DURATION')} in one to-do, which RFC "
                    "5545 §3.6.2 forbids (due at the DUE, or at DTSTART + DURATION?); the due instant is ambiguous")
    duration = _duration(prop, scan)
    if _WEEKS_WITH_MORE.match(duration.written or ""):
        # RFC 5545 §3.3.6 writes weeks alone (dur-week), but P1W2D can mean nothing but 9 calendar days, and
        # reminder offsets read it so (plan.offsets.Offset.parse): refusing it would leave the to-do unplanned
        # for a spelling, so it is planned and the publisher told.
        exact = f" and {duration.seconds} seconds" if duration.seconds else ""
        problems.append(ParseProblem(position, (
            f"{_named_lines(scan, 'DURATION')} {duration.written!r} writes weeks with other parts, which RFC 5545 "
            f"§3.3.6 does not allow (weeks stand alone: P1W); read as {duration.days} days{exact}"), uid,
            skipped=False))
    return _plus_duration(start, duration, floating_zone)


#: A DURATION with weeks and any other part (``P1W2D``, ``P1WT1H``): not an RFC 5545 dur-value (§3.3.6).
_WEEKS_WITH_MORE = re.compile(r"[+-]?P\d+W.", re.IGNORECASE)


def _named_lines(scan: _ScannedComponent | None, name: str) -> str:
    """``"DUE (line 7)"``: property ``name`` with the physical lines it is on, or ``"DUE"`` without a scan."""
    numbers = [str(n) for n, _text in (scan.raw.get(name, []) if scan is not None else [])]
    if not numbers:
        return name
    return f"{name} (line{'s' if len(numbers) > 1 else ''} {', '.join(numbers)})"


def _duration(prop: icalendar.prop.vDDDTypes | list, scan: _ScannedComponent | None) -> Offset:
    """A to-do's DURATION property (a vDDDTypes, or a list when repeated) as an
    :class:`~deadline_pipeline.plan.offsets.Offset` (``days`` nominal, ``seconds`` exact, ``written``).

    Read from the raw text the scan kept (``scan``): the library reads ``P1D`` and ``PT24H`` as one
    ``timedelta``, and across a DST change they are due an hour apart. Without a scan paired with the
    component, from the library's value, where whole days count as nominal. Raises :class:`_Skip` for a
    repeated DURATION (§3.6.2 allows one), a value that is not a duration (§3.3.6) and a negative one:
    due before its DTSTART, which §3.8.2.3 forbids (a DUE "MUST be later in time" than DTSTART).
    """
    if isinstance(prop, list):
        raise _Skip(f"DURATION appears {len(prop)} times (RFC 5545 allows it once); the due instant is ambiguous")
    written = scan.raw.get("DURATION", []) if scan is not None else []
    if len(written) == 1:
        text = written[0][1].rsplit(":", 1)[-1].strip()  # a duration holds no colon: what follows the last one
    else:
        raw = prop.to_ical()
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
    try:
        # Split as a reminder offset is (plan.offsets): weeks and days nominal, the rest exact.
        duration = Offset.parse(text.upper())
    except ValueError:
        raise _Skip(f"DURATION {text!r} is not a duration of weeks, days, hours, minutes and seconds "
                    "(RFC 5545 §3.3.6)") from None
    if duration.days < 0 or duration.seconds < 0:
        raise _Skip(f"DURATION {text} is negative: the to-do would be due before its DTSTART, which RFC 5545 "
                    "§3.8.2.3 forbids; the due instant is unknown")
    return duration


def _plus_duration(start: _When, duration: Offset, floating_zone: str | None) -> _When:
    """``start`` (a to-do's DTSTART) + ``duration``, in the form ``start`` has: a date stays a date, a wall
    time stays a wall time in the same zone (or floating).

    RFC 5545 §3.3.6: the days are added first, to the date or the wall time (``P1D`` from 17:00 is 17:00
    the next day, 23 or 25 hours later across a DST change); then the hours, minutes and seconds, to the
    instant, read in the start's zone (a wall time in a DST gap as planning reads it: fold 0,
    ``plan.recurrence.to_instant``). A floating time is read in ``floating_zone``; with none (read later
    in each subscriber's zone), they are added to the wall time, which is off only when a subscriber's
    clock changes within them. Raises :class:`_Skip` for hours, minutes or seconds on a DATE (§3.8.2.3:
    the due time has DTSTART's value type, a date) and for a due time outside
    :data:`~deadline_pipeline.rules.RULE_YEARS`.
    """
    value = start.value
    if not isinstance(value, datetime) and duration.seconds:
        raise _Skip(f"DURATION {duration.written} has hours, minutes or seconds but DTSTART {value.isoformat()} is a "
                    "DATE, whose due time is a date too (RFC 5545 §3.8.2.3); the due instant is unknown")
    try:
        if not isinstance(value, datetime):
            # A DATE start + P1D spans that one day and ends as the next begins (as an all-day event's
            # DTEND, §3.6.1), so the to-do is due at the end of the start day; a date planned as due
            # at the end of DTSTART + P1D was a day late.
            return replace(start, value=value + timedelta(days=max(duration.days - 1, 0)))
        due = value + timedelta(days=duration.days)
        if duration.seconds:
            zone = start.zone if start.zone is not None else resolve_zone(floating_zone) if floating_zone else None
            exact = timedelta(seconds=duration.seconds)
            if zone is None:
                due += exact
            else:  # aware + timedelta in Python is wall-clock arithmetic: add in UTC, read back in the zone
                due = (due.replace(tzinfo=zone, fold=0).astimezone(UTC) + exact).astimezone(zone).replace(tzinfo=None)
    except OverflowError:  # P99999999D: beyond any date, not a traceback failing the component
        raise _Skip(f"DTSTART + DURATION {duration.written} is beyond any representable date") from None
    problem = year_problem(due)
    if problem:
        raise _Skip(f"DTSTART + DURATION {duration.written} = {format_local(due)}: {problem}")
    return replace(start, value=due)


def _rrule(component: icalendar.cal.Component, scan: _ScannedComponent | None) -> str | None:
    values = _prop_list(component, "RRULE")
    raw = scan.rrules if scan is not None else []
    if len(values) > 1 or len(raw) > 1:
        raise _Skip("more than one RRULE (RFC 5545 §3.8.5.3 allows one per component)")
    for text in raw:
        message = check_recur(text)
        if message:
            raise _Skip(message)
    if not values:
        return None
    value = values[0]
    if isinstance(value, icalendar.prop.vBroken):
        raise _Skip(f"RRULE {str(value)!r} is not a valid RECUR value (RFC 5545 §3.3.10)")
    serialised = value.to_ical()
    serialised = serialised.decode() if isinstance(serialised, bytes) else str(serialised)
    message = check_recur(serialised)
    if message:
        raise _Skip(message)
    return serialised


def _note_exrules(component: icalendar.cal.Component, scan: _ScannedComponent | None, problems: list[ParseProblem],
                  position: str, uid: str | None) -> None:
    """Append to ``problems`` (at ``position``, record ``uid``) one note for the component's EXRULEs, if any,
    naming their lines and values: they are not applied.

    EXRULE is RFC 2445's (§4.8.5.2) and RFC 5545 deprecated it (Appendix A.3). Read as nothing, without a
    word, ``RRULE:FREQ=DAILY;COUNT=4`` with ``EXRULE:FREQ=DAILY;INTERVAL=2;COUNT=2`` planned all four days
    and ``validate`` said OK. The instances it would exclude stay planned (a reminder too many, never
    one missed), so a note, not a skipped record."""
    values = _prop_list(component, "EXRULE")
    raw = [text for _n, text in (scan.raw.get("EXRULE", []) if scan is not None else [])]
    if not values and not raw:
        return
    written = raw or [str(v.to_ical().decode() if hasattr(v, "to_ical") else v) for v in values]
    problems.append(ParseProblem(position, (
        f"{_named_lines(scan, 'EXRULE')} {', '.join(repr(t) for t in written)} is not applied: EXRULE is RFC "
        "2445's, deprecated by RFC 5545 (Appendix A.3); the instances it would exclude are planned (write them "
        "as EXDATEs)"), uid, skipped=False))


def _dates(component: icalendar.cal.Component, name: str, problems: list[ParseProblem],
           position: str) -> list[_When]:
    """Every value of every EXDATE/RDATE property, each read with its own TZID.

    An EXDATE value that cannot be read is ignored with a note (at worst a reminder too many). An RDATE
    value is an occurrence: one beyond :data:`~deadline_pipeline.rules.RULE_YEARS` is ignored with a
    note (never within a plan), any other unreadable one (an unknown TZID, not a date list) raises
    :class:`_Skip`: ignored with a note, its deadline was never planned and every check stayed green;
    skipped, the component keeps its last good version and ``rules_complete`` names the line."""
    out: list[_When] = []
    for prop in _prop_list(component, name):
        if isinstance(prop, icalendar.prop.vBroken):
            if name == "RDATE":
                raise _Skip(f"RDATE {str(prop)!r} is not a valid date list: the occurrences it names are unknown")
            problems.append(ParseProblem(position, f"{name} {str(prop)!r} ignored: not a valid date list",
                                         skipped=False))
            continue
        params = getattr(prop, "params", {}) or {}
        for item in getattr(prop, "dts", []) or []:
            try:
                out.append(_value_when(item.dt, params, name))
            except _Skip as exc:
                if name == "RDATE" and not (isinstance(item.dt, date) and year_problem(item.dt)):
                    raise _Skip(f"{exc}: an occurrence of this rule cannot be planned") from None
                problems.append(ParseProblem(position, f"{exc}; that {name} value is ignored", skipped=False))
    return out


def _in_zone(when: _When, rule_zone: tzinfo | None, problems: list[ParseProblem], position: str,
             what: str) -> str:
    """An EXDATE/RDATE as wall-clock time in the rule's zone (floating ones are already in it).

    Raises :class:`_Skip` for an RDATE instant (UTC or zoned) of a floating or all-day rule: each
    subscriber reads the rule in their own zone, so the instant cannot be kept, and as a wall time it
    was due up to a day off (12:00Z read as 12:00 in Pago Pago: 23:00Z) with only a note. An EXDATE
    so written is kept as wall time with a note (at worst it excludes nothing)."""
    aware = when.aware
    if aware is None:
        return format_local(when.value)
    if rule_zone is None and what == "RDATE":
        raise _Skip(f"RDATE {format_local(when.value)} in {when.tz} is an instant but the rule is floating (its "
                    "DTSTART has no TZID and is read in each subscriber's zone); give DTSTART a TZID, or write the "
                    "RDATE as a floating time")
    if rule_zone is None:
        problems.append(ParseProblem(
            position, f"{what} {format_local(when.value)} in {when.tz} kept as wall time: the rule is floating",
            skipped=False))
        return format_local(when.value)
    return format_local(aware.astimezone(rule_zone).replace(tzinfo=None))


def _utc_iso(when: _When, rule_zone: tzinfo | None) -> str:
    if not isinstance(when.value, datetime):
        return when.value.isoformat()
    aware = when.aware
    if aware is None and rule_zone is not None:
        aware = when.value.replace(tzinfo=rule_zone)
    if aware is None:
        return format_local(when.value)
    return aware.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
