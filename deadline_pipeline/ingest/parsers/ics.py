"""iCalendar (RFC 5545) feeds: one rule per VEVENT and VTODO, read with the ``icalendar`` library.

What becomes of each component (section numbers are RFC 5545's):

* ``start``: DTSTART of a VEVENT (§3.8.2.4); for a VTODO the DUE instant (§3.8.2.3), falling back to
  DTSTART. A DATE value (§3.3.4) is an all-day rule and stays a date string.
* ``tz``: the TZID parameter as written (§3.2.19), checked with
  :func:`~deadline_pipeline.timezones.resolve_zone`, which also maps Windows zone names; a UTC time
  (``Z`` suffix, §3.3.5 form 2) gives ``"UTC"``; a floating time (§3.3.5 form 1) and an all-day date
  take the calendar's ``X-WR-TIMEZONE`` when present, else ``default_tz``, else ``None`` (read later
  in the subscriber's zone) — never UTC.
* ``rrule``: the RECUR value (§3.3.10) re-serialised by ``vRecur.to_ical()``, after checking the
  raw text for repeated parts and COUNT+UNTIL (the library silently keeps the last of a repeated
  part, which would change the rule's meaning).
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
from dataclasses import dataclass
from datetime import UTC, date, datetime, tzinfo
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
from deadline_pipeline.rules import RuleRecord, format_local, year_problem
from deadline_pipeline.timezones import (
    EQUIVALENCE_YEARS,
    UnknownTimeZone,
    equivalent_iana_zone,
    resolve_zone,
)

WHAT = "an iCalendar (RFC 5545) calendar"
COMPONENTS = ("VEVENT", "VTODO")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class _Skip(Exception):
    """The component cannot become a rule; the message says why."""


@dataclass
class _ScannedComponent:
    name: str
    line: int
    rrules: list[str]


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
#: Properties whose loss changes which instants a component has: a component with an unreadable
#: line of one of these is skipped (reported), not read without it.
_MEANINGFUL = frozenset({"DTSTART", "DUE", "DTEND", "DURATION", "RRULE", "RDATE", "EXDATE", "RECURRENCE-ID",
                         "UID", "SEQUENCE", "BEGIN", "END"})
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
    """Check BEGIN/END nesting and note each VEVENT/VTODO's line, extent and raw RRULEs, in document order.

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
        head, _, rest = body.partition(":")
        head = head.strip().upper()
        if head == "BEGIN":
            name = rest.strip().upper()
            stack.append((name, number))
            if name in COMPONENTS:
                comp = _ScannedComponent(name, number, [])
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
        elif head.split(";", 1)[0] == "RRULE" and current and stack and stack[-1][0] in COMPONENTS:
            current[-1].rrules.append(rest)
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


def _when(prop: object, what: str) -> _When:
    """Read a DTSTART/DUE/RECURRENCE-ID property (a vDDDTypes) into a :class:`_When`."""
    if isinstance(prop, icalendar.prop.vBroken):
        raise _Skip(f"{what} is not a valid date or date-time: {str(prop)!r}")
    return _value_when(getattr(prop, "dt", None), getattr(prop, "params", {}) or {}, what)


def _value_when(value: object, params: dict, what: str) -> _When:
    """One DATE or DATE-TIME value of property ``what`` with its ``params`` (TZID) as a :class:`_When`.
    Raises :class:`_Skip` naming ``what`` for a value that is neither, in an unknown zone, or outside
    :data:`~deadline_pipeline.rules.RULE_YEARS`."""
    if isinstance(value, tuple) and value:  # a PERIOD (start, end|duration): its start counts
        value = value[0]
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


def parse_ics(content: bytes, *, source: str, default_tz: str | None = None) -> ParseResult:
    """Parse an iCalendar payload into one rule per VEVENT/VTODO (see the module docstring).

    ``content``: the payload's bytes (UTF-8, RFC 5545 §3.1.4). ``source``: the source name, used in
    messages. ``default_tz``: zone of floating times when the calendar declares no X-WR-TIMEZONE.

    Returns a :class:`ParseResult`; components without DTSTART/DUE, with unreadable values, unknown
    zones or malformed RRULEs are problems with position ``"VEVENT UID=… (line N)"``. Components
    found outside a VCALENDAR are read too, with a problem noting it. Raises :class:`ParseError`
    (naming source and line) for undecodable, empty, HTML, truncated or mis-nested payloads, payloads
    without any calendar component and content lines the library cannot parse at all. A content
    line the library skips inside a VEVENT/VTODO is a problem of that component alone (with its
    position); when the line is one of its dates or its rule, the component is skipped — its
    instants are unknown — and the other components are read.
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
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tops = icalendar.Calendar.from_ical("\r\n".join(body for _n, body in lines), multiple=True)
    except Exception as exc:  # noqa: BLE001 — the library raises ValueError, KeyError, IndexError…
        bad = _locate_library_error(lines)
        where = f"line {lines[bad][0]}" if bad is not None else "position unknown"
        raise ParseError(f"source {source!r}: {where}: not a usable iCalendar payload: "
                         f"{exc.__class__.__name__}: {exc}") from None
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
    ranks: list[tuple] = []  # per rule read: its revision rank
    for n, (component, zone) in enumerate(components):
        scan = scanned[n] if paired else None
        uid = _text(component, "UID")
        position = f"{component.name} UID={uid}" if uid else f"{component.name} #{n + 1} (no UID)"
        if scan is not None:
            position += f" (line {scan.line})"
        # The library keeps going past a line it cannot split and lists it in ``errors``: never let
        # that pass silently, and never read a component whose dates or rule lost a line.
        unreadable = [str(message) for _prop, message in getattr(component, "errors", ()) or ()]
        if unreadable:
            names = {(m.group(1).strip().upper() if (m := _UNREADABLE_NAME.search(text)) else "")
                     for text in unreadable}
            fatal = bool(names & _MEANINGFUL) or "" in names
            # A line lost from the dates or the rule skips the component (its last good version stays
            # in force); any other lost line is a note that skips nothing.
            result.problems.append(ParseProblem(position, ("component skipped: " if fatal else "")
                                                + "; ".join(unreadable), uid, skipped=fatal))
            if fatal:
                continue
        try:
            rule = _component_rule(component, zone, uid, scan, result.problems, position)
            result.add(rule, position)
            ranks.append(_revision_rank(component))
        except _Skip as exc:
            result.problems.append(ParseProblem(position, str(exc), uid))
        except Exception as exc:  # noqa: BLE001 — one hostile component must not sink the payload
            result.problems.append(ParseProblem(position, f"unreadable component: {exc.__class__.__name__}: {exc}",
                                                uid))
    return _without_cancelled(drop_duplicate_ids(_latest_revisions(result, ranks)))


def _without_cancelled(result: ParseResult) -> ParseResult:
    """Take the events and to-dos their publisher cancelled (``extra["cancelled"]``) out of force.

    A cancelled master (no RECURRENCE-ID) is dropped with every override of its UID: the whole event
    or series is cancelled, so its reminders are withdrawn as for a removed event, and a note says
    why (it is not a record that failed to parse, which would be held in force). A cancelled
    override stays, marked: planning makes the occurrence it names an EXDATE of its master and
    plans nothing for it (:func:`deadline_pipeline.plan.recurrence.apply_overrides`).
    """
    cancelled = {str(r.extra.get("uid") or r.rule_id) for r in result.rules
                 if r.extra.get("cancelled") and "recurrence_id" not in r.extra}
    if not cancelled:
        return result
    # Kept parallel to the rules (ParseResult.add), when they were.
    positions = result.positions if len(result.positions) == len(result.rules) else [None] * len(result.rules)
    kept, where = [], []
    for rule, position in zip(result.rules, positions, strict=True):
        uid = str(rule.extra.get("uid") or rule.rule_id)
        if uid not in cancelled:
            kept.append(rule)
            where.append(position)
            continue
        what = "an override of a cancelled event" if "recurrence_id" in rule.extra else "cancelled (STATUS:CANCELLED)"
        result.problems.append(ParseProblem(
            position or f"{rule.extra.get('component', 'VEVENT')} UID={uid}",
            f"{what}: not in force, its reminders are withdrawn", rule.rule_id, skipped=False))
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


def _component_rule(component: icalendar.cal.Component, floating_zone: str | None, uid: str | None,
                    scan: _ScannedComponent | None, problems: list[ParseProblem],
                    position: str) -> RuleRecord:
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

    rrule = _rrule(component, scan)
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

    if (_text(component, "STATUS") or "").strip().upper() == "CANCELLED":
        # RFC 5545 §3.8.1.11: the publisher cancelled this event or to-do (Thunderbird and Google
        # export a cancelled occurrence of a series as an override with STATUS:CANCELLED). Reminding
        # of it told subscribers to meet a deadline that no longer exists; see _without_cancelled.
        extra["cancelled"] = True
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


def _dates(component: icalendar.cal.Component, name: str, problems: list[ParseProblem],
           position: str) -> list[_When]:
    """Every value of every EXDATE/RDATE property, each read with its own TZID."""
    out: list[_When] = []
    for prop in _prop_list(component, name):
        if isinstance(prop, icalendar.prop.vBroken):
            problems.append(ParseProblem(position, f"{name} {str(prop)!r} ignored: not a valid date list",
                                         skipped=False))
            continue
        params = getattr(prop, "params", {}) or {}
        for item in getattr(prop, "dts", []) or []:
            try:
                out.append(_value_when(item.dt, params, name))
            except _Skip as exc:
                problems.append(ParseProblem(position, f"{exc}; that {name} value is ignored", skipped=False))
    return out


def _in_zone(when: _When, rule_zone: tzinfo | None, problems: list[ParseProblem], position: str,
             what: str) -> str:
    """An EXDATE/RDATE as wall-clock time in the rule's zone (floating ones are already in it)."""
    aware = when.aware
    if aware is None:
        return format_local(when.value)
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
