"""To-dos (RFC 5545 §3.6.2): when one is completed, and its due instant from DUE, or DTSTART plus
DURATION (nominal weeks and days, exact hours; §3.3.6), with the span a recurring one is due after
each start. Used by :mod:`.ics`."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, time, timedelta

import icalendar

from deadline_pipeline.ingest.parsers.base import (
    ParseProblem,
)
from deadline_pipeline.ingest.parsers.ics_lines import ScannedComponent, named_lines
from deadline_pipeline.ingest.parsers.ics_values import Skip, When, text_of, when_of
from deadline_pipeline.plan.offsets import Offset
from deadline_pipeline.rules import END_OF_DAY, format_local, year_problem
from deadline_pipeline.timezones import (
    resolve_zone,
)


def closed_marks(component: icalendar.cal.Component, recurring: bool, problems: list[ParseProblem],
                  position: str, uid: str | None) -> dict:
    """The ``extra`` marks of a component its publisher closed (see the module docstring).

    ``{"cancelled": True}`` for STATUS:CANCELLED (RFC 5545 §3.8.1.11; Thunderbird and Google export a
    cancelled occurrence of a series as an override with it); ``{"cancelled": True, "completed":
    evidence}`` for a completed to-do, where ``evidence`` is the property that says so
    (:func:`_completion`). The one mark ``cancelled`` takes either out of force
    (:func:`~.ics_revisions.without_cancelled`,
    ``plan.recurrence.apply_overrides``): reminding of either told subscribers to meet a deadline
    that no longer needs meeting. ``recurring``: a series' master (not an override), on which only
    STATUS:COMPLETED counts; a COMPLETED date or PERCENT-COMPLETE:100 there is a note appended to
    ``problems`` and the series stays in force.
    """
    status = (text_of(component, "STATUS") or "").strip().upper()
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


def due_offset(todo: icalendar.cal.Component, due: When, scan: ScannedComponent | None) -> dict:
    """``{"due_offset_seconds": n}``: a recurring to-do's due time (its DUE, or DTSTART + DURATION, see
    :func:`todo_due`) − DTSTART in wall-clock seconds of the due time's zone, when it has a DTSTART
    and the two differ; else ``{}``. With a DURATION, also ``"due_span"``: the DURATION as ISO 8601
    (``P1D``, ``PT2H``), the nominal span every instance is due after its start (RFC 5545 §3.8.5.3;
    ``plan.occurrences.due_span``). The offset names occurrences; the span says when each is due:
    from a DTSTART inside a spring-forward gap (02:30, read as 03:30) the two differ.

    A RECURRENCE-ID names an instance by its DTSTART (RFC 5545 §3.8.4.4), while the to-do is
    planned at its DUE: planning shifts the RECURRENCE-ID by this to find the occurrence it names
    (``plan.recurrence.occurrence_named``). Without it, a completed occurrence of a task due at
    17:00 whose DTSTART is 09:00 (Thunderbird writes both) named no occurrence and was reminded.
    """
    prop = todo.get("DTSTART")
    if prop is None or isinstance(prop, list):
        return {}
    try:
        begin = when_of(prop, "DTSTART")
    except Skip:
        return {}  # an unreadable DTSTART of a to-do read at its DUE: no occurrence to shift from
    if not isinstance(begin.value, datetime) and isinstance(due.value, datetime):
        # A DATE DTSTART with a DATE-TIME DUE (§3.8.2.3 forbids it, said by due_on_start_clock): the start
        # of that day on the DUE's clock, so the series still steps in DTSTARTs. From the DUE it put a
        # BYDAY=MO,TH series' Sunday due on Mondays and Thursdays.
        begin = When(datetime.combine(begin.value, time.min), due.tz, due.zone)
    if begin.aware is not None and due.aware is not None:
        begin = When(begin.aware.astimezone(due.zone).replace(tzinfo=None), due.tz, due.zone)
    if type(begin.value) is not type(due.value) or (begin.zone is None) != (due.zone is None):
        return {}  # a DATE DTSTART with a DATE-TIME DUE (or floating with zoned): no common clock
    seconds = int((due.value - begin.value).total_seconds())
    if not seconds:
        return {}
    if todo.get("DURATION") is None:
        return {"due_offset_seconds": seconds}
    duration = _duration(todo["DURATION"], scan)  # read by todo_due already: raises nothing new
    return {"due_offset_seconds": seconds, "due_span": Offset(duration.days, duration.seconds).iso()}


def due_on_start_clock(todo: icalendar.cal.Component, due: When, recurring: bool, scan: ScannedComponent | None,
                       problems: list[ParseProblem], position: str, uid: str | None) -> When:
    """A to-do's ``due`` (its DUE) on its DTSTART's clock when one is a DATE and the other a DATE-TIME,
    which RFC 5545 §3.8.2.3 forbids, with a note appended to ``problems`` (at ``position``, record
    ``uid``) naming both lines; ``due`` unchanged otherwise, and for a VEVENT. ``recurring``: the
    to-do has an RRULE or RDATE (its instances step from DTSTART).

    A DATE DUE becomes the end of that day (23:59:59) in DTSTART's zone (floating when DTSTART is), so
    :func:`due_offset` finds the span each instance is due after its start; a DATE DTSTART of a
    series is read there as the start of its day on the DUE's clock. Without a common clock a series
    was stepped from the DUE instead of the DTSTART: with ``FREQ=WEEKLY;BYDAY=MO,TH`` from Monday 09:00
    and a DUE on Sunday, the Wednesday dues of the Thursday starts were planned on Thursdays, a day
    late, and the Sunday ones on Mondays. A one-off or an override with a DATE DUE is read on the same
    clock: read as a floating date it was due at the end of the day in each subscriber's zone (13 hours
    apart for Berlin and AoE) while its series was due on Berlin's clock, without a note."""
    prop = todo.get("DTSTART")
    if todo.name != "VTODO" or todo.get("DUE") is None or prop is None or isinstance(prop, list):
        return due
    try:
        begin = when_of(prop, "DTSTART")
    except Skip:
        return due  # read at its DUE: there is no start to step from
    if isinstance(begin.value, datetime) == isinstance(due.value, datetime):
        return due
    lines = f"{named_lines(scan, 'DUE')} and DTSTART"
    if isinstance(begin.value, datetime):
        which = "each instance is" if recurring and todo.get("RECURRENCE-ID") is None else "it is"
        problems.append(ParseProblem(position, (
            f"{lines} differ in value type (a DATE and a DATE-TIME), which RFC 5545 §3.8.2.3 forbids; {which} "
            "due at the end of its DUE day (23:59:59) on the DTSTART's clock"
            f"{f' ({begin.tz})' if begin.tz else ''}"), uid, skipped=False))
        return When(datetime.combine(due.value, END_OF_DAY), begin.tz, begin.zone, begin.known, begin.written)
    if not recurring or todo.get("RECURRENCE-ID") is not None:
        return due  # due at its DUE, a DATE-TIME: there is no series to step
    problems.append(ParseProblem(position, (
        f"{lines} differ in value type (a DATE-TIME and a DATE), which RFC 5545 §3.8.2.3 forbids; each "
        "instance starts at 00:00 of its DTSTART day on the DUE's clock"), uid, skipped=False))
    return due


def todo_due(todo: icalendar.cal.Component, key: str, start: When, scan: ScannedComponent | None,
              floating_zone: str | None, problems: list[ParseProblem], position: str, uid: str | None) -> When:
    """A to-do's due time: ``start`` (its ``key`` value, DUE or else DTSTART), moved by its DURATION when
    it has one (RFC 5545 §3.6.2: "dur" only with DTSTART, the to-do then due at DTSTART + DURATION,
    §3.8.2.5); ``floating_zone``: the calendar's zone for floating times (see the module docstring).

    Before, a DURATION was not read and the to-do was due at its DTSTART: a ``P1D`` task's reminders
    came a day early. Raises :class:`~.ics_values.Skip` for a to-do with DUE and DURATION (§3.6.2: they "MUST NOT
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
        raise Skip(f"{named_lines(scan, 'DUE')} and {named_lines(scan, 'DURATION')} in one to-do, which RFC "
                    "5545 §3.6.2 forbids (due at the DUE, or at DTSTART + DURATION?); the due instant is ambiguous")
    duration = _duration(prop, scan)
    if _WEEKS_WITH_MORE.match(duration.written or ""):
        # RFC 5545 §3.3.6 writes weeks alone (dur-week), but P1W2D can mean nothing but 9 calendar days, and
        # reminder offsets read it so (plan.offsets.Offset.parse): refusing it would leave the to-do unplanned
        # for a spelling, so it is planned and the publisher told.
        exact = f" and {duration.seconds} seconds" if duration.seconds else ""
        problems.append(ParseProblem(position, (
            f"{named_lines(scan, 'DURATION')} {duration.written!r} writes weeks with other parts, which RFC 5545 "
            f"§3.3.6 does not allow (weeks stand alone: P1W); read as {duration.days} days{exact}"), uid,
            skipped=False))
    return _plus_duration(start, duration, floating_zone)


#: A DURATION with weeks and any other part (``P1W2D``, ``P1WT1H``): not an RFC 5545 dur-value (§3.3.6).
_WEEKS_WITH_MORE = re.compile(r"[+-]?P\d+W.", re.IGNORECASE)


def _duration(prop: icalendar.prop.vDDDTypes | list, scan: ScannedComponent | None) -> Offset:
    """A to-do's DURATION property (a vDDDTypes, or a list when repeated) as an
    :class:`~deadline_pipeline.plan.offsets.Offset` (``days`` nominal, ``seconds`` exact, ``written``).

    Read from the raw text the scan kept (``scan``): the library reads ``P1D`` and ``PT24H`` as one
    ``timedelta``, and across a DST change they are due an hour apart. Without a scan paired with the
    component, from the library's value, where whole days count as nominal. Raises :class:`~.ics_values.Skip` for a
    repeated DURATION (§3.6.2 allows one), a value that is not a duration (§3.3.6) and a negative one:
    due before its DTSTART, which §3.8.2.3 forbids (a DUE "MUST be later in time" than DTSTART).
    """
    if isinstance(prop, list):
        raise Skip(f"DURATION appears {len(prop)} times (RFC 5545 allows it once); the due instant is ambiguous")
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
        raise Skip(f"DURATION {text!r} is not a duration of weeks, days, hours, minutes and seconds "
                    "(RFC 5545 §3.3.6)") from None
    if duration.days < 0 or duration.seconds < 0:
        raise Skip(f"DURATION {text} is negative: the to-do would be due before its DTSTART, which RFC 5545 "
                    "§3.8.2.3 forbids; the due instant is unknown")
    return duration


def _plus_duration(start: When, duration: Offset, floating_zone: str | None) -> When:
    """``start`` (a to-do's DTSTART) + ``duration``, in the form ``start`` has: a date stays a date, a wall
    time stays a wall time in the same zone (or floating).

    RFC 5545 §3.3.6: the days are added first, to the date or the wall time (``P1D`` from 17:00 is 17:00
    the next day, 23 or 25 hours later across a DST change); then the hours, minutes and seconds, to the
    instant, read in the start's zone (a wall time in a DST gap as planning reads it: fold 0,
    ``plan.recurrence.to_instant``). A floating time is read in ``floating_zone``; with none (read later
    in each subscriber's zone), they are added to the wall time, which is off only when a subscriber's
    clock changes within them. Raises :class:`~.ics_values.Skip` for hours, minutes or seconds on a DATE (§3.8.2.3:
    the due time has DTSTART's value type, a date) and for a due time outside
    :data:`~deadline_pipeline.rules.RULE_YEARS`.
    """
    value = start.value
    if not isinstance(value, datetime) and duration.seconds:
        raise Skip(f"DURATION {duration.written} has hours, minutes or seconds but DTSTART {value.isoformat()} is a "
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
        raise Skip(f"DTSTART + DURATION {duration.written} is beyond any representable date") from None
    problem = year_problem(due)
    if problem:
        raise Skip(f"DTSTART + DURATION {duration.written} = {format_local(due)}: {problem}")
    return replace(start, value=due)
