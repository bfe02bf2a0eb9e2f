"""The physical lines of an iCalendar payload, read before the library reads it: unfolding
(RFC 5545 §3.1), each component's lines and their numbers (:class:`ScannedComponent`), and the
UTC values (§3.3.5) and the dates (§3.3.4) written with a TZID, which the library would misread. Used by
:mod:`.ics`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from icalendar.parser import Contentline

from deadline_pipeline.ingest.parsers.base import (
    ParseError,
    ParseProblem,
)

WHAT = "an iCalendar (RFC 5545) calendar"


COMPONENTS = ("VEVENT", "VTODO")


#: Properties whose raw text :func:`scan_components` keeps per component: RRULE (checked before the library
#: re-serialises it), DUE and DURATION (their lines name a to-do with both, and DURATION's text keeps
#: ``P1D`` apart from ``PT24H``, which the library reads as one and the same ``timedelta``), and EXRULE
#: (the note saying it is not applied quotes it as written, with its line).
_SCANNED = frozenset({"RRULE", "DUE", "DURATION", "EXRULE"})


@dataclass
class ScannedComponent:
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


_PHYSICAL = re.compile(rb"\r\n|\r|\n")


def unfold(content: bytes) -> list[tuple[int, bytes]]:
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


def scan_components(lines: list[tuple[int, str]], source: str) -> list[ScannedComponent]:
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
    found: list[ScannedComponent] = []
    current: list[ScannedComponent] = []
    for number, body in lines:
        head, colon, rest = body.partition(":")
        head = head.strip().upper()
        if head == "BEGIN":
            name = rest.strip().upper()
            stack.append((name, number))
            if name in COMPONENTS:
                comp = ScannedComponent(name, number)
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


def locate_library_error(lines: list[tuple[int, str]]) -> int | None:
    """Index of the first content line the library cannot split into name, parameters and value."""
    for index, (_number, body) in enumerate(lines):
        try:
            Contentline(body).parts()
        except Exception:  # noqa: BLE001 — any failure marks the line; the cause is reported by the caller
            return index
    return None


#: Properties whose DATE-TIME values may carry a TZID parameter (RFC 5545 §3.8.2, §3.8.4.4, §3.8.5).
_ZONED = frozenset({"DTSTART", "DTEND", "DUE", "RECURRENCE-ID", "EXDATE", "RDATE"})


NAME = re.compile(r"[A-Za-z0-9-]+")


def _utc_form(value: str) -> bool:
    """Whether a DATE-TIME (or the start of a PERIOD) is written in UTC: ``…T121500Z`` (§3.3.5 form 2).
    A value without its time (``20270310Z``) is no DATE-TIME: left to the library, which refuses it
    (noted as read in UTC, the same line was then also skipped, two messages that contradicted)."""
    return re.fullmatch(r"\d{8}T\d{6}Z", value.split("/", 1)[0].strip().upper()) is not None


def _zoned_parts(body: str) -> tuple[str, object, str, object] | None:
    """``(name, parameters, value, TZID or None)`` of a content line of a :data:`_ZONED` property;
    ``None`` for another property's line and for a line the library cannot split (its to report)."""
    head = NAME.match(body)
    if head is None or head.group(0).upper() not in _ZONED:
        return None
    try:
        name, params, value = Contentline(body).parts()
    except Exception:  # noqa: BLE001 — an unsplittable line is the library's to report
        return None
    return name, params, value, params.get("TZID")


def _tzid_off_utc_values(body: str) -> tuple[list[str], str] | None:
    """A content line with a TZID and UTC values, rewritten so the library reads those values as UTC.

    Returns ``(lines, note)``: one line holding the UTC values without TZID (other parameters kept),
    plus one with the remaining values and the TZID when the line mixes both forms; ``None`` for any
    line that needs no change. Without this, icalendar 7 applies the TZID to ``…Z`` and drops the
    ``Z``: ``DTSTART;TZID=Europe/Berlin:20260725T121500Z`` became 10:15Z instead of 12:15Z.
    """
    parts = _zoned_parts(body)
    if parts is None:
        return None
    name, params, value, tzid = parts
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


#: A DATE value (§3.3.4): eight digits, no time.
_DATE = re.compile(r"^\d{8}$")


def _tzid_off_dates(body: str) -> tuple[list[str], str] | None:
    """A content line with a TZID, no VALUE parameter or ``VALUE=DATE-TIME``, and only DATE values,
    rewritten as ``VALUE=DATE`` without the TZID, and the note saying so; ``None`` for any other line.

    ``DTSTART;TZID=America/New_York:20270310`` is no DATE-TIME (the default value type, §3.3.5, has a
    time), so the only thing it can mean is the date, an all-day deadline due at the end of that day;
    a TZID does not apply to a DATE (§3.2.19). icalendar 7 reads it as midnight in the zone, and the
    deadline was due at 00:00, a day early, with every check green. ``VALUE=DATE-TIME`` over a date
    says the same thing no better: it was read as midnight too, without the note.
    """
    parts = _zoned_parts(body)
    if parts is None:
        return None
    name, params, value, tzid = parts
    values = [v.strip() for v in value.split(",")]
    declared = str(params.get("VALUE", "")).upper()
    if not tzid or declared not in ("", "DATE-TIME") or not all(_DATE.match(v) for v in values):
        return None
    plain = params.copy()
    del plain["TZID"]
    plain["VALUE"] = "DATE"
    written = f"{name};VALUE=DATE-TIME;TZID={tzid}" if declared else f"{name};TZID={tzid}"
    note = (f"{written}:{value} is a DATE written without VALUE=DATE (RFC 5545 §3.3.4); read as "
            f"the date{'s' if len(values) > 1 else ''} written (an all-day start is due at the end of its day), "
            "the TZID is not applied (§3.2.19)")
    return [f"{name};{plain.to_ical().decode()}:{','.join(values)}"], note


def library_lines(lines: list[tuple[int, str]]) -> tuple[list[tuple[int, str]], list[ParseProblem]]:
    """The logical lines to hand to the library (:func:`_tzid_off_utc_values` and
    :func:`_tzid_off_dates` applied to each), each with its physical line number, and a note per
    rewritten line, positioned at its physical line (``"line N"``). ``lines``: the unfolded lines with
    their physical line numbers. Pure."""
    bodies: list[tuple[int, str]] = []
    notes: list[ParseProblem] = []
    for number, body in lines:
        rewritten = _tzid_off_utc_values(body) or _tzid_off_dates(body)
        if rewritten is None:
            bodies.append((number, body))
            continue
        bodies.extend((number, line) for line in rewritten[0])
        notes.append(ParseProblem(f"line {number}", rewritten[1], skipped=False))
    return bodies, notes


def lines_of(scan: ScannedComponent | None, name: str) -> str:
    """``" (line 10)"``, ``" (lines 9, 10)"``: the physical lines of property ``name`` (upper case) of the
    component ``scan`` noted; ``""`` without a scan or such a line."""
    numbers = scan.lines.get(name, []) if scan is not None else []
    return f" (line{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))})" if numbers else ""


def named_lines(scan: ScannedComponent | None, name: str) -> str:
    """``"DUE (line 7)"``: property ``name`` with the physical lines it is on, or ``"DUE"`` without a scan."""
    numbers = [str(n) for n, text_of in (scan.raw.get(name, []) if scan is not None else [])]
    if not numbers:
        return name
    return f"{name} (line{'s' if len(numbers) > 1 else ''} {', '.join(numbers)})"
