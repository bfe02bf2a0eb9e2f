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
  either) a note naming the line (:func:`~.ics_library.from_library`). One in a VTIMEZONE refuses the
  payload, naming the line.
* ``tz``: the TZID parameter as written (§3.2.19), checked with
  :func:`~deadline_pipeline.timezones.resolve_zone`, which also maps Windows zone names; a UTC time
  (``Z`` suffix, §3.3.5 form 2) gives ``"UTC"``; a floating time (§3.3.5 form 1) and an all-day date
  take the calendar's ``X-WR-TIMEZONE`` when present, else ``default_tz``, else ``None`` (read later
  in the subscriber's zone) — never UTC. An ``X-WR-TIMEZONE`` that a VTIMEZONE of the calendar
  defines is read as a TZID of that name is (see below): ``EST`` defined with US daylight saving is
  ``America/New_York``, a name only the calendar defines the IANA zone its definition matches
  (:func:`~.ics_values.calendar_zone`); an IANA name whose VTIMEZONE defines other offsets stays the
  IANA zone, and its floating values get the note a TZID of it gets (:mod:`.ics_zones`). An empty
  ``X-WR-TIMEZONE`` is read as absent, with a note naming its line. An ``X-WR-TIMEZONE`` that names no
  zone, and several with different values, skip the components with such a time, naming each line and
  value (and the nearest zone name); the others are read (:func:`~.ics_values.floating_zone_of`).
* A UTC time written with a TZID (``DTSTART;TZID=Europe/Berlin:20260725T121500Z``) is the UTC time:
  §3.3.5 says the TZID parameter must not be applied to a UTC value. The library applies it (12:15
  Berlin wall time, 10:15Z), so the TZID is taken off such values of DTSTART, DTEND, DUE,
  RECURRENCE-ID, EXDATE and RDATE before the library reads them, and each such line is a note
  naming its line (``validate`` reports it). An RRULE's UNTIL is then compared with the UTC instants.
* A date written with a TZID and no VALUE=DATE (``DTSTART;TZID=America/New_York:20270310``) is that date
  (§3.3.4; a TZID does not apply to a DATE, §3.2.19): the library reads it as midnight in the zone, a
  day before the end of the day an all-day deadline is due at, so the line is read as ``VALUE=DATE``
  without the TZID, with a note naming its line.
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

Closed by the publisher (:func:`~.ics_todo.closed_marks`): an event or to-do with STATUS:CANCELLED
(§3.8.1.11), and a completed to-do, are out of force — a one-off or a whole series is dropped with a
note (its reminders are withdrawn), an override takes its occurrence out of the series. A to-do is
completed when its STATUS is COMPLETED; when it has no STATUS, a COMPLETED date-time (§3.8.2.1) or
PERCENT-COMPLETE:100 (§3.8.1.8) says so too, except on a series' master, where one completion date
cannot say which occurrence was done: that series stays in force, with a note. An explicit other
STATUS (NEEDS-ACTION, IN-PROCESS) wins over a COMPLETED date left behind by a reopened to-do. For a
recurring to-do with DTSTART and a DUE or DURATION, the record starts at the first due time and
``extra["due_offset_seconds"]`` (due − DTSTART in wall-clock time) lets planning step the series in
DTSTARTs, as its RRULE (UNTIL, BYxxx), RDATEs, EXDATEs and RECURRENCE-IDs name them (§3.8.5.3,
§3.8.4.4). Each instance is due the same span after its start (``plan.occurrences.due_span``): with a
DUE, the wall-clock DUE − DTSTART from its start's wall time (a DTSTART inside a spring-forward gap,
02:30, counts from 02:30, so the first instance is due at its DUE as written); with a DURATION (kept
in ``extra["due_span"]``), its nominal days and exact hours from the start's instant (§3.3.6).

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
problem, since expanding it needs the zone's rules, which the rule record cannot carry. So is a TZID
resolve_zone reads only by guessing (an abbreviation ``PST``, an offset-looking ``GMT-8``) when the
calendar's VTIMEZONE of it gives other offsets
(:func:`~deadline_pipeline.timezones.definition_overrides_guess`): ``GMT-8`` defined as UTC+8 was read
as UTC-8, sixteen hours late. An IANA or Windows name stays that zone (:mod:`.ics_zones`).
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import icalendar

from deadline_pipeline.ingest.parsers.base import (
    ParseError,
    ParseProblem,
    ParseResult,
    check_recur,
    decode_text,
    drop_duplicate_ids,
    refuse_other_unicode,
)
from deadline_pipeline.ingest.parsers.ics_library import from_library, lost_by_component, own_zones, unreadable_skips
from deadline_pipeline.ingest.parsers.ics_lines import (
    COMPONENTS,
    WHAT,
    ScannedComponent,
    library_lines,
    lines_of,
    named_lines,
    scan_components,
    unfold,
)
from deadline_pipeline.ingest.parsers.ics_revisions import (
    latest_revisions,
    revision_rank,
    without_cancelled,
    without_vanished_overrides,
)
from deadline_pipeline.ingest.parsers.ics_todo import closed_marks, due_offset, due_on_start_clock, todo_due
from deadline_pipeline.ingest.parsers.ics_values import (
    Skip,
    UnreadableZone,
    When,
    calendar_zone,
    dates_of,
    definitions_read,
    floating_zone_of,
    in_zone,
    prop_list,
    text_of,
    utc_iso,
    when_of,
)
from deadline_pipeline.ingest.parsers.ics_zones import note_zone_read_anew, zones_defined_anew
from deadline_pipeline.rules import RuleRecord, format_local
from deadline_pipeline.timezones import (
    EQUIVALENCE_YEARS,
    resolve_zone,
)
from deadline_pipeline.wording import near_name


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
    cannot read there skips the component, naming the property, line and value (:func:`~.ics_library.unreadable_skips`).
    """
    if not isinstance(content, (bytes, bytearray)):
        raise ParseError(f"source {source!r}: expected bytes, got {type(content).__name__}")
    with own_zones():  # the zones of this payload's VTIMEZONEs, not of one read before
        return _parse_ics(bytes(content), source, default_tz)


def _parse_ics(content: bytes, source: str, default_tz: str | None) -> ParseResult:
    """:func:`parse_ics` of ``content`` (bytes) within :func:`~.ics_library.own_zones`."""
    # Before unfolding: the line breaks it takes out shift which bytes of UTF-16 text are NUL.
    refuse_other_unicode(content, source=source, what=WHAT)
    raw_lines = unfold(content)
    try:
        text = decode_text(b"\r\n".join(line for _n, line in raw_lines), source=source, what=WHAT)
    except ParseError:
        decode_text(bytes(content), source=source, what=WHAT)  # the message with the original position
        raise
    numbers = [n for n, _line in raw_lines]
    lines = list(zip(numbers, text.split("\r\n"), strict=True)) if text else []
    scanned = scan_components(lines, source)
    result = ParseResult()
    bodies, result.problems = library_lines(lines)
    tops, unreadable = from_library(lines, bodies, source)
    # (component, zone of its floating times, the calendar's X-WR-TIMEZONE as read or None)
    components: list[tuple[icalendar.cal.Component, str | UnreadableZone | None, str | None]] = []
    tops = [t for t in tops if isinstance(t, icalendar.cal.Component)]
    if not any(t.name == "VCALENDAR" for t in tops) and not any(
        c.name in COMPONENTS for t in tops for c in t.walk()
    ):
        raise ParseError(f"source {source!r}: line 1: not {WHAT} (no VCALENDAR, VEVENT or VTODO found)")
    for index, top in enumerate(tops, start=1):
        if top.name != "VCALENDAR" and any(c.name in COMPONENTS for c in top.walk()):
            result.problems.append(ParseProblem(
                f"{top.name} {index}", "component outside a VCALENDAR (RFC 5545 §3.4); read anyway", skipped=False))
        zone, declared = calendar_zone(top, default_tz, lines, result.problems)
        components.extend((c, zone, declared) for c in top.walk() if c.name in COMPONENTS)

    # The scan and the library walk both list components in document order; use the scan's line
    # numbers and raw RRULEs only when the two agree, rather than risk pairing the wrong ones.
    paired = len(scanned) == len(components) and all(
        s.name == c.name for s, (c, _z, _d) in zip(scanned, components, strict=True)
    )
    lost = lost_by_component(unreadable, paired, result.problems, source)
    legacy: dict = {}
    defined = zones_defined_anew(tops, lines, result.problems, legacy)
    with definitions_read(legacy):
        ranks = _read_components(components, scanned if paired else None, lost, defined, result)
    return without_vanished_overrides(without_cancelled(drop_duplicate_ids(latest_revisions(result, ranks))))


def _read_components(components: list, scanned: list[ScannedComponent] | None, lost: dict, defined: dict,
                     result: ParseResult) -> list[tuple]:
    """Read each of ``components`` (``(component, calendar zone, X-WR-TIMEZONE as read)``, see
    :func:`~.ics_values.calendar_zone`) into ``result`` (a rule or a problem); ``scanned``: their scans,
    None when scan and library disagree. Returns the revision rank of each rule read, in order."""
    ranks: list[tuple] = []  # per rule read: its revision rank
    for n, (component, zone, declared) in enumerate(components):
        scan = scanned[n] if scanned is not None else None
        uid = text_of(component, "UID")
        position = f"{component.name} UID={uid}" if uid else f"{component.name} #{n + 1} (no UID)"
        if scan is not None:
            position += f" (line {scan.line})"
        if unreadable_skips(component, scan, lost.get(n, []), result.problems, position, uid):
            continue
        try:
            rule = _component_rule(component, zone, uid, scan, result.problems, position)
            result.add(rule, position)
            note_zone_read_anew(component, rule, scan, defined, result.problems, position, declared)
            ranks.append(revision_rank(component))
        except Skip as exc:
            result.problems.append(ParseProblem(position, str(exc), uid))
        except Exception as exc:  # noqa: BLE001 — one hostile component must not sink the payload
            result.problems.append(ParseProblem(position, f"unreadable component: {exc.__class__.__name__}: {exc}",
                                                uid))
    return ranks


#: The properties a rule is read from, which a misspelt property name is compared with.
_TIMING = ("DTSTART", "DUE", "DTEND", "DURATION", "RRULE", "RDATE", "EXDATE", "RECURRENCE-ID")


def _refuse_lost_properties(component: icalendar.cal.Component, scan: ScannedComponent | None) -> None:
    """Raise :class:`~.ics_values.Skip` for a component whose dates or rule lost a line without a word: one the scan
    found without a colon (``scan.colonless``) and the library dropped (``RDATE;VALUE=DATE 20270301``, a
    space for the colon: the library kept no RDATE at all), or a property name that is no iCalendar property but
    close to one of :data:`_TIMING` (``RRLUE``: ignored as unknown, the yearly rule became a one-off).
    Either way ``validate`` and every check said OK while occurrences were never planned."""
    present = {str(name).upper() for name in component.keys()}
    lines = {str(name).upper(): numbers for name, numbers in (scan.lines if scan is not None else {}).items()}
    colonless = {str(name).upper(): numbers for name, numbers in (scan.colonless if scan is not None else {}).items()}
    for name in _TIMING:
        # Only a line without a colon: an empty ``RDATE:`` names no occurrence, and dropping it loses none.
        if name in colonless and name not in present:
            raise Skip(f"{name} (line {colonless[name][0]}) could not be read (a content line is "
                        "NAME;PARAMS:VALUE); the occurrences it names are unknown")
    for name in present:
        if name.startswith("X-") or name in _TIMING:
            continue
        close = near_name(name, _TIMING)
        if close and name not in _KNOWN_PROPERTIES:
            where = f" (line {lines[name][0]})" if name in lines else ""
            raise Skip(f"{name}{where} is no iCalendar property; did you mean {close}? Ignored, the rule would be "
                        "planned without it")


#: The parameters a date or rule line is read with (RFC 5545 §3.2.19, §3.2.20, §3.2.13).
_TIMING_PARAMETERS = ("TZID", "VALUE", "RANGE")
#: RFC 5545's other parameters (§3.2) and RFC 7986's: never taken for a misspelt one of the above.
_KNOWN_PARAMETERS = frozenset({
    "ALTREP", "CN", "CUTYPE", "DELEGATED-FROM", "DELEGATED-TO", "DIR", "ENCODING", "FMTTYPE", "FBTYPE",
    "LANGUAGE", "MEMBER", "PARTSTAT", "RELATED", "RELTYPE", "ROLE", "RSVP", "SENT-BY", "DISPLAY", "EMAIL",
    "FEATURE", "LABEL",
})


def _refuse_misspelt_parameters(component: icalendar.cal.Component, scan: ScannedComponent | None) -> None:
    """Raise :class:`~.ics_values.Skip` for a date or rule line of :data:`_TIMING` with a parameter name that
    is no iCalendar parameter but close to one of :data:`_TIMING_PARAMETERS`. The library ignores an
    unknown parameter (RFC 5545 §3.2 has readers do so), so ``DTSTART;TZDI=Europe/Berlin:20270301T090000``
    was a floating time, read in each subscriber's zone (due 14:00Z for a New York subscriber, not 08:00Z)
    while ``validate`` and every check said OK."""
    lines = {str(name).upper(): numbers for name, numbers in (scan.lines if scan is not None else {}).items()}
    for name in _TIMING:
        values = component.get(name)
        for value in values if isinstance(values, list) else [] if values is None else [values]:
            for parameter in getattr(value, "params", None) or {}:
                upper = str(parameter).upper()
                if upper.startswith("X-") or upper in _TIMING_PARAMETERS or upper in _KNOWN_PARAMETERS:
                    continue
                close = near_name(upper, _TIMING_PARAMETERS)
                if close:
                    where = f" (line {lines[name][0]})" if name in lines else ""
                    raise Skip(f"{name}{where} has parameter {upper}, which is no iCalendar parameter; did you mean "
                               f"{close}? Ignored, the value would be read without it")


#: RFC 5545 properties of a VEVENT or VTODO (§3.6.1, §3.6.2) that are not :data:`_TIMING`, and RFC 7986's.
_KNOWN_PROPERTIES = frozenset({
    "DTSTAMP", "UID", "CLASS", "CREATED", "DESCRIPTION", "GEO", "LAST-MODIFIED", "LOCATION", "ORGANIZER",
    "PRIORITY", "SEQUENCE", "STATUS", "SUMMARY", "TRANSP", "URL", "ATTACH", "ATTENDEE", "CATEGORIES", "COMMENT",
    "CONTACT", "RELATED-TO", "RESOURCES", "RSTATUS", "RRULE", "COMPLETED", "PERCENT-COMPLETE", "COLOR",
    "CONFERENCE", "IMAGE", "REQUEST-STATUS",
})


def _component_rule(component: icalendar.cal.Component, declared_zone: str | UnreadableZone | None, uid: str | None,
                    scan: ScannedComponent | None, problems: list[ParseProblem],
                    position: str) -> RuleRecord:
    _refuse_lost_properties(component, scan)
    _refuse_misspelt_parameters(component, scan)
    is_todo = component.name == "VTODO"
    key = "DUE" if is_todo and component.get("DUE") is not None else "DTSTART"
    prop = component.get(key)
    if isinstance(prop, list):
        # RFC 5545 3.6.1/3.6.2: DTSTART (and DUE) MUST NOT occur more than once. Which one the
        # publisher meant cannot be told, so the record is skipped (and held back, not withdrawn).
        raise Skip(f"{key} appears {len(prop)} times (RFC 5545 allows it once); the due instant is ambiguous")
    if prop is None:
        raise Skip("no DUE or DTSTART" if is_todo else "no DTSTART")
    start = when_of(prop, key)
    floating_zone = floating_zone_of(start, declared_zone, key)
    if is_todo:
        start = todo_due(component, key, start, scan, floating_zone, problems, position, uid)

    rrule = _rrule(component, scan)
    _note_exrules(component, scan, problems, position, uid)
    rdates = dates_of(component, "RDATE", problems, position)
    start = due_on_start_clock(component, start, rrule is not None or bool(rdates), scan, problems, position, uid)
    extra: dict = {}
    if start.written:
        extra["tzid"] = start.written
    if start.known:
        tz = start.tz if start.tz is not None else floating_zone
    elif rrule is not None:
        raise Skip(f"TZID {start.tz!r} is defined only by this calendar's VTIMEZONE and no IANA zone has "
                    f"its offsets and transitions in {EQUIVALENCE_YEARS[0]}-{EQUIVALENCE_YEARS[1]}; a recurring "
                    "rule cannot be expanded in it (use an IANA zone name)")
    else:
        # A one-off time (or a set of RDATEs, each in its own zone) converts exactly to its instants,
        # so no meaning is lost.
        extra["tzid"] = start.tz
        start = When(start.aware.astimezone(UTC).replace(tzinfo=None), "UTC", UTC)
        tz = "UTC"
    rule_zone = resolve_zone(tz) if tz is not None else None

    exdates = dates_of(component, "EXDATE", problems, position)
    summary = text_of(component, "SUMMARY")
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
        rid = when_of(recurrence_id, "RECURRENCE-ID")
        rid_text = utc_iso(rid, rule_zone)
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
    extra.update(closed_marks(component, recurring, problems, position, uid))
    if is_todo and recurring:
        extra.update(due_offset(component, start, scan))  # {} when the to-do is due at its DTSTART
    rule = RuleRecord(
        rule_id=rule_id,
        title=summary if summary is not None else "(untitled)",
        start=format_local(start.value),
        tz=tz,
        rrule=rrule,
        exdates=tuple(in_zone(w, rule_zone, problems, position, "EXDATE") for w in exdates),
        rdates=tuple(in_zone(w, rule_zone, problems, position, "RDATE") for w in rdates),
        kind="todo" if is_todo else "event",
        url=text_of(component, "URL"),
        note=text_of(component, "DESCRIPTION"),
        extra={**extra, "uid": uid, "component": component.name},
    )
    # Once the record stands: a component skipped for another reason gets no note besides its skip.
    _note_dates_on_start_clock(key, start, rdates, scan, problems, position, uid)
    return rule


def _note_dates_on_start_clock(key: str, start: When, rdates: list[When], scan: ScannedComponent | None,
                               problems: list[ParseProblem], position: str, uid: str | None) -> None:
    """Append a note to ``problems`` (at ``position``, record ``uid``) when ``rdates`` differ in value
    type from ``start`` (the ``key`` property, DTSTART or DUE, as read): a DATE RDATE in a series
    whose start is a DATE-TIME, or a DATE-TIME RDATE in an all-day series.

    RFC 5545 §3.8.5.2 allows either but says nothing of the time of day. A DATE is planned at the
    start's time of day (a deadline of the series is due when its other deadlines are;
    recurring-ical-events reads midnight, up to a day earlier in the zone); a DATE-TIME at the time
    written (the series' dates are due at the end of their day). Both readings were taken without a
    word: the same line meant 09:00 or 00:00 to two readers and nothing said which one was planned."""
    timed = isinstance(start.value, datetime)
    odd = [w.value for w in rdates if isinstance(w.value, datetime) != timed]
    if not odd:
        return
    shown = ", ".join(format_local(v) if isinstance(v, datetime) else v.isoformat() for v in odd)
    if timed:
        reading = (f"a DATE in a series whose {key}{lines_of(scan, key)} is a DATE-TIME; each is due at "
                   f"{start.value.time().isoformat()}{f' ({start.tz})' if start.tz else ''}, the series' time of "
                   "day, not at midnight")
    else:
        reading = (f"a DATE-TIME in a series whose {key}{lines_of(scan, key)} is a DATE; each is due at the "
                   "time written, not at the end of its day as the series' other deadlines")
    problems.append(ParseProblem(position, f"RDATE{lines_of(scan, 'RDATE')} {shown}: {reading} (RFC 5545 §3.8.5.2 "
                                           "does not say which time of day a mixed value type means)",
                                 uid, skipped=False))


def _rrule(component: icalendar.cal.Component, scan: ScannedComponent | None) -> str | None:
    values = prop_list(component, "RRULE")
    raw = scan.rrules if scan is not None else []
    if len(values) > 1 or len(raw) > 1:
        raise Skip("more than one RRULE (RFC 5545 §3.8.5.3 allows one per component)")
    for text in raw:
        message = check_recur(text)
        if message:
            raise Skip(message)
    if not values:
        return None
    value = values[0]
    if isinstance(value, icalendar.prop.vBroken):
        raise Skip(f"RRULE {str(value)!r} is not a valid RECUR value (RFC 5545 §3.3.10)")
    serialised = value.to_ical()
    serialised = serialised.decode() if isinstance(serialised, bytes) else str(serialised)
    message = check_recur(serialised)
    if message:
        raise Skip(message)
    return serialised


def _note_exrules(component: icalendar.cal.Component, scan: ScannedComponent | None, problems: list[ParseProblem],
                  position: str, uid: str | None) -> None:
    """Append to ``problems`` (at ``position``, record ``uid``) one note for the component's EXRULEs, if any,
    naming their lines and values: they are not applied.

    EXRULE is RFC 2445's (§4.8.5.2) and RFC 5545 deprecated it (Appendix A.3). Read as nothing, without a
    word, ``RRULE:FREQ=DAILY;COUNT=4`` with ``EXRULE:FREQ=DAILY;INTERVAL=2;COUNT=2`` planned all four days
    and ``validate`` said OK. The instances it would exclude stay planned (a reminder too many, never
    one missed), so a note, not a skipped record."""
    values = prop_list(component, "EXRULE")
    raw = [text for _n, text in (scan.raw.get("EXRULE", []) if scan is not None else [])]
    if not values and not raw:
        return
    written = raw or [str(v.to_ical().decode() if hasattr(v, "to_ical") else v) for v in values]
    problems.append(ParseProblem(position, (
        f"{named_lines(scan, 'EXRULE')} {', '.join(repr(t) for t in written)} is not applied: EXRULE is RFC "
        "2445's, deprecated by RFC 5545 (Appendix A.3); the instances it would exclude are planned (write them "
        "as EXDATEs)"), uid, skipped=False))
