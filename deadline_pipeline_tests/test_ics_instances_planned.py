"""ICS instants as planning plans them, through the real parse and plan path (fetch, snapshot, rule
versions, ``plan_all`` on the test database): a recurring to-do starting in a spring-forward gap (RFC
5545 §3.3.5, §3.8.5.3) and a one-off event replaced or cancelled by an override (§3.8.4.4)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from deadline_pipeline.config import load_config
from deadline_pipeline.store.schema import alerts, obligations
from deadline_pipeline.watch import checks
from deadline_pipeline.watch.sources import rules_complete
from deadline_pipeline_tests.factories import ics, ingest_and_plan, write_config


def _configure(tmp_path, calendar: str):
    (tmp_path / "cal.ics").write_text(calendar, newline="")
    path = write_config(
        tmp_path,
        sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "America/New_York"}],
        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    )
    return load_config(path)[0]


def _planned(engine) -> list[tuple[str, str, datetime]]:
    """(rule id, obligation status, due instant as aware UTC) of every obligation, by due instant."""
    q = select(obligations.c.rule_id, obligations.c.status, obligations.c.due_at).order_by(obligations.c.due_at)
    with engine.connect() as conn:
        return [(r.rule_id, r.status, r.due_at.replace(tzinfo=UTC)) for r in conn.execute(q)]


def _alert_states(engine) -> list[tuple[str, str]]:
    q = (select(obligations.c.rule_id, alerts.c.status).join(obligations, obligations.c.id == alerts.c.obligation_id)
         .order_by(alerts.c.id))
    with engine.connect() as conn:
        return [(r.rule_id, r.status) for r in conn.execute(q)]


def _watched(engine, cfg, now: datetime) -> tuple[int, list[dict]]:
    """(occurrences judged, occurrences missing) of ``horizon_planned``'s reading of the store at ``now``,
    every rule in force judged (ingested at ``now``), its whole window from ``now`` on: the check reads
    the rules and instants as planning does, so it must judge what was planned, and find it."""
    with engine.connect() as conn:
        found = checks._missing_occurrences(conn, cfg, now, timedelta(days=400), now, now,
                                            now + timedelta(days=399))
    return found.judged, found.missing


def _todo(*props: str) -> str:
    lines = ["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//test//test//EN", "BEGIN:VTODO", "UID:gap@test",
             "DTSTAMP:20260101T000000Z", "SUMMARY:Night shift handover",
             "DTSTART;TZID=America/New_York:20270314T023000", *props, "RRULE:FREQ=WEEKLY;COUNT=3",
             "END:VTODO", "END:VCALENDAR"]
    return "".join(line + "\r\n" for line in lines)


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# New York springs forward at 02:00 on 2027-03-14: DTSTART 02:30 does not exist and is read with the offset
# before the gap (EST, §3.3.5), 07:30Z, the instant of 03:30 EDT; later starts, 02:30 EDT, are 06:30Z.
@pytest.mark.parametrize(("span", "expected"), [
    # DUE 04:30 EDT = 08:30Z: the first instance is due at it, and every later one the wall-clock
    # DUE − DTSTART (2 h) after its start's wall time (plan.occurrences.due_span): 02:30 + 2 h = 04:30 EDT.
    ("DUE;TZID=America/New_York:20270314T043000", ["2027-03-14T08:30:00Z", "2027-03-21T08:30:00Z",
                                                   "2027-03-28T08:30:00Z"]),
    # DURATION PT2H: two exact hours after each start (§3.3.6): 07:30Z + 2 h, then 06:30Z + 2 h.
    ("DURATION:PT2H", ["2027-03-14T09:30:00Z", "2027-03-21T08:30:00Z", "2027-03-28T08:30:00Z"]),
    # DURATION P1D: one nominal day from the start as written, 02:30 → 02:30 EDT the next day (06:30Z).
    ("DURATION:P1D", ["2027-03-15T06:30:00Z", "2027-03-22T06:30:00Z", "2027-03-29T06:30:00Z"]),
], ids=["due", "duration-hours", "duration-day"])
def test_a_recurring_todo_starting_in_a_gap_is_due_its_span_after_each_start(engine, tmp_path, span, expected):
    """Before, the span was DUE − DTSTART in wall-clock time (04:30 − 02:30 = 2 h, or 05:30 − 02:30 = 3 h
    for PT2H) added to the time after the gap (03:30): the first instance was due at 09:30Z, an hour after
    its own DUE, and every instance of PT2H and P1D an hour late. The watchers read the same expansion."""
    cfg = _configure(tmp_path, _todo(span))
    now = datetime(2027, 3, 1, tzinfo=UTC)
    out = ingest_and_plan(engine, cfg, now)
    assert out.problems == []
    assert _planned(engine) == [("gap@test", "active", _utc(e)) for e in expected]
    assert _watched(engine, cfg, now) == (3, [])


EVENT = dict(uid="review@test", tzid="America/New_York", dtstart="20270315T090000", summary="Review")
# The override of its one occurrence (RECURRENCE-ID = its DTSTART), moved two days later.
MOVED = dict(EVENT, dtstart="20270317T090000", recurrence_id="20270315T090000", summary="Review (moved)")
OVERRIDE_ID = "review@test#2027-03-15T13:00:00Z"


def test_an_override_of_a_one_off_event_replaces_it(engine, tmp_path):
    """RFC 5545 §3.8.4.4: the override replaces the instance it names, and a one-off event's one instance
    is its DTSTART. Before, the one-off was planned at its original date next to the override's: two
    obligations, a reminder for 15 March that no longer holds. Planned first without the override, its
    obligation moves when the override arrives."""
    cfg = _configure(tmp_path, ics(EVENT))
    ingest_and_plan(engine, cfg, datetime(2027, 3, 1, tzinfo=UTC))
    assert _planned(engine) == [("review@test", "active", _utc("2027-03-15T13:00:00Z"))]
    (tmp_path / "cal.ics").write_text(ics(EVENT, MOVED), newline="")
    out = ingest_and_plan(engine, cfg, datetime(2027, 3, 2, tzinfo=UTC))
    assert out.problems == []
    active = [p for p in _planned(engine) if p[1] == "active"]
    assert active == [(OVERRIDE_ID, "active", _utc("2027-03-17T13:00:00Z"))]
    # The same obligation, moved (as an override of a series' occurrence moves it): its reminder of
    # 15 March superseded, one of 17 March planned; no cancellation, which a delivered reminder's
    # subscriber would read as "no further reminders" before a new deadline's.
    assert _alert_states(engine) == [(OVERRIDE_ID, "superseded"), (OVERRIDE_ID, "pending")]
    assert _watched(engine, cfg, datetime(2027, 3, 2, tzinfo=UTC)) == (1, [])


def test_a_cancelled_override_of_a_one_off_event_leaves_nothing_planned(engine, tmp_path):
    """STATUS:CANCELLED on the override of the one occurrence (as Google and Thunderbird export a cancelled
    instance): as for an occurrence of a series, the occurrence is out of force and its reminder is
    withdrawn. Before, the one-off stayed planned and was reminded."""
    cfg = _configure(tmp_path, ics(EVENT))
    ingest_and_plan(engine, cfg, datetime(2027, 3, 1, tzinfo=UTC))
    (tmp_path / "cal.ics").write_text(ics(EVENT, dict(MOVED, dtstart=EVENT["dtstart"], status="CANCELLED")),
                                      newline="")
    now = datetime(2027, 3, 2, tzinfo=UTC)
    out = ingest_and_plan(engine, cfg, now)
    assert out.problems == []
    assert [p for p in _planned(engine) if p[1] == "active"] == []
    assert _alert_states(engine) == [("review@test", "cancelled")]
    assert _watched(engine, cfg, now) == (0, [])


def _calendar(*body: str, head: tuple[str, ...] = ()) -> str:
    lines = ["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//test//test//EN", *head, *body, "END:VCALENDAR"]
    return "".join(line + "\r\n" for line in lines)


def _event(uid: str, *props: str) -> tuple[str, ...]:
    return ("BEGIN:VEVENT", f"UID:{uid}", "DTSTAMP:20260101T000000Z", f"SUMMARY:{uid}", *props, "END:VEVENT")


# VTIMEZONEs under names resolve_zone only guesses from: GMT-8 defined as UTC+8 all year, and PST defined
# with the US daylight saving rules (second Sunday of March to first Sunday of November, as since 2007).
GMT_MINUS_8_AS_PLUS_8 = ("BEGIN:VTIMEZONE", "TZID:GMT-8", "BEGIN:STANDARD", "DTSTART:19700101T000000",
                         "TZOFFSETFROM:+0800", "TZOFFSETTO:+0800", "END:STANDARD", "END:VTIMEZONE")
PST_WITH_US_RULES = ("BEGIN:VTIMEZONE", "TZID:PST",
                     "BEGIN:STANDARD", "DTSTART:19701101T020000", "RRULE:FREQ=YEARLY;BYMONTH=11;BYDAY=1SU",
                     "TZOFFSETFROM:-0700", "TZOFFSETTO:-0800", "END:STANDARD",
                     "BEGIN:DAYLIGHT", "DTSTART:19700308T020000", "RRULE:FREQ=YEARLY;BYMONTH=3;BYDAY=2SU",
                     "TZOFFSETFROM:-0800", "TZOFFSETTO:-0700", "END:DAYLIGHT", "END:VTIMEZONE")


@pytest.mark.parametrize(("calendar", "expected"), [
    # 17:00 at UTC+8 is 09:00Z; read as the name's guess, UTC-8, it was 2027-03-02T01:00Z: 16 hours late.
    (_calendar(*GMT_MINUS_8_AS_PLUS_8, *_event("gmt", "DTSTART;TZID=GMT-8:20270301T170000")),
     [("gmt", "2027-03-01T09:00:00Z")]),
    # 17:00 on 1 July is PDT by the definition, UTC-7: 00:00Z; read as the fixed PST, 01:00Z, an hour late.
    (_calendar(*PST_WITH_US_RULES, *_event("pst", "DTSTART;TZID=PST:20270701T170000")),
     [("pst", "2027-07-02T00:00:00Z")]),
    # A series across the change of 7 November: 17:00 PDT (00:00Z), then 17:00 PST (01:00Z) as defined.
    (_calendar(*PST_WITH_US_RULES, *_event("pst-monthly", "DTSTART;TZID=PST:20271015T170000",
                                           "RRULE:FREQ=MONTHLY;COUNT=2")),
     [("pst-monthly", "2027-10-16T00:00:00Z"), ("pst-monthly", "2027-11-16T01:00:00Z")]),
], ids=["gmt-8-defined-as-utc+8", "pst-defined-with-daylight-saving", "pst-series-across-the-change"])
def test_a_guessed_tzid_is_read_in_the_calendars_vtimezone(engine, tmp_path, calendar, expected):
    """RFC 5545 §3.6.5: a VTIMEZONE defines its TZID. A name that only looks like a zone (an offset-looking
    ``GMT-8``, an abbreviation ``PST``) was read as resolve_zone's guess even where the calendar's own
    definition gave other offsets, with every check green. An IANA name stays that zone."""
    cfg = _configure(tmp_path, calendar)
    now = datetime(2027, 2, 1, tzinfo=UTC)
    out = ingest_and_plan(engine, cfg, now)
    assert out.problems == []
    assert _planned(engine) == [(rule_id, "active", _utc(e)) for rule_id, e in expected]
    assert _watched(engine, cfg, now) == (len(expected), [])


@pytest.mark.parametrize(("start", "due", "expected"), [
    # Each Monday 09:00 start is due on the Sunday after, each Thursday one on the Wednesday after, at the
    # end of the day in Berlin (CET, UTC+1): 22:59:59Z.
    ("DTSTART;TZID=Europe/Berlin:20270301T090000", "DUE;VALUE=DATE:20270307",
     ["2027-03-07T22:59:59Z", "2027-03-10T22:59:59Z", "2027-03-14T22:59:59Z", "2027-03-17T22:59:59Z"]),
    # The reverse: a DATE start, a DUE at 17:00 Berlin six days and 17 hours after it.
    ("DTSTART;VALUE=DATE:20270301", "DUE;TZID=Europe/Berlin:20270307T170000",
     ["2027-03-07T16:00:00Z", "2027-03-10T16:00:00Z", "2027-03-14T16:00:00Z", "2027-03-17T16:00:00Z"]),
], ids=["date-due", "date-start"])
def test_a_recurring_todo_with_a_date_and_a_date_time_steps_its_starts(engine, tmp_path, start, due, expected):
    """A DUE and a DTSTART of different value types (RFC 5545 §3.8.2.3 forbids it) had no common clock, so
    the series was stepped from the DUE as if it were the start: with BYDAY=MO,TH the dues fell on Sunday,
    Monday, Thursday and Monday, the Wednesday ones a day late, with every check green. Now the DATE is
    put on the other's clock and each instance is due the same span after its own start, with a note."""
    calendar = _calendar("BEGIN:VTODO", "UID:mixed@test", "DTSTAMP:20260101T000000Z", "SUMMARY:Timesheet",
                         start, due, "RRULE:FREQ=WEEKLY;BYDAY=MO,TH;COUNT=4", "END:VTODO")
    cfg = _configure(tmp_path, calendar)
    now = datetime(2027, 2, 1, tzinfo=UTC)
    out = ingest_and_plan(engine, cfg, now)
    assert out.problems == []
    assert _planned(engine) == [("mixed@test", "active", _utc(e)) for e in expected]
    assert _watched(engine, cfg, now) == (4, [])
    check = rules_complete(engine, "cal")
    assert check.passed and "which RFC 5545 §3.8.2.3 forbids" in str(check.metadata), check


def test_a_date_written_with_a_tzid_is_an_all_day_date(engine, tmp_path):
    """``DTSTART;TZID=America/New_York:20270310`` (no VALUE=DATE) can only be a date: RFC 5545 §3.3.4, and a
    TZID does not apply to a date (§3.2.19). The library read it as midnight in the zone, so the all-day
    deadline was due at 00:00 (05:00Z), a day before the end of the day it is due at, and an EXDATE so
    written excluded nothing, with every check green. Now both are dates (read in ann's zone, as an
    all-day date without X-WR-TIMEZONE is), each line with a note."""
    calendar = _calendar(*_event("filing", "DTSTART;TZID=America/New_York:20270310"),
                         *_event("daily", "DTSTART;TZID=America/New_York:20270315", "RRULE:FREQ=DAILY;COUNT=3",
                                 "EXDATE;TZID=America/New_York:20270316"))
    cfg = _configure(tmp_path, calendar)
    now = datetime(2027, 3, 1, tzinfo=UTC)
    out = ingest_and_plan(engine, cfg, now)
    assert out.problems == []
    assert _planned(engine) == [("filing", "active", _utc("2027-03-11T04:59:59Z")),
                                ("daily", "active", _utc("2027-03-16T03:59:59Z")),
                                ("daily", "active", _utc("2027-03-18T03:59:59Z"))]
    assert _watched(engine, cfg, now) == (3, [])
    check = rules_complete(engine, "cal")
    assert check.passed and "DTSTART;TZID=America/New_York:20270310 is a DATE written without VALUE=DATE" in str(
        check.metadata), check


def test_a_one_off_todo_with_a_date_due_is_due_on_its_start_clock_and_value_date_time_over_a_date_is_a_date(
        engine, tmp_path):
    """A one-off to-do with ``DTSTART;TZID=Europe/Berlin`` and ``DUE;VALUE=DATE`` (RFC 5545 §3.8.2.3 forbids
    the mix) was read as a floating date, due at the end of the day in each subscriber's zone (New York
    here: 04:59:59Z, six hours after Berlin's end of day), without a note, while the same pair in a series
    was read on Berlin's clock. Now it is due at the end of its DUE day on the DTSTART's clock, with the
    note. And ``DTSTART;VALUE=DATE-TIME;TZID=…:20270310`` (a date under a DATE-TIME label) was read as
    midnight in the zone, a day early, without the note the same line without VALUE gets."""
    calendar = _calendar("BEGIN:VTODO", "UID:oneoff@test", "DTSTAMP:20260101T000000Z", "SUMMARY:Report",
                         "DTSTART;TZID=Europe/Berlin:20270104T090000", "DUE;VALUE=DATE:20270105", "END:VTODO",
                         *_event("labelled", "DTSTART;VALUE=DATE-TIME;TZID=America/New_York:20270310"))
    cfg = _configure(tmp_path, calendar)
    now = datetime(2026, 12, 1, tzinfo=UTC)
    out = ingest_and_plan(engine, cfg, now)
    assert out.problems == []
    assert _planned(engine) == [("oneoff@test", "active", _utc("2027-01-05T22:59:59Z")),
                                ("labelled", "active", _utc("2027-03-11T04:59:59Z"))]
    check = rules_complete(engine, "cal")
    notes = str(check.metadata)
    assert check.passed and "it is due at the end of its DUE day (23:59:59) on the DTSTART's clock" in notes, notes
    assert "DTSTART;VALUE=DATE-TIME;TZID=America/New_York:20270310 is a DATE written without VALUE=DATE" in notes


def test_a_misspelt_x_wr_timezone_skips_the_floating_components(engine, tmp_path):
    """A floating time of a calendar whose X-WR-TIMEZONE names no zone (``Europe/Berln``) was read in each
    subscriber's zone, with a note: 09:00 in Berlin (08:00Z) due at 14:00Z for New York, and
    ``rules_complete`` green. Now the component is skipped, naming the line and the nearest zone, its last
    good version stays planned and the check is red; a component with a zone of its own is read."""
    berlin = _calendar(*_event("floating", "DTSTART:20270301T090000"),
                       *_event("zoned", "DTSTART;TZID=Asia/Tokyo:20270301T090000"),
                       head=("X-WR-TIMEZONE:Europe/Berlin",))
    cfg = _configure(tmp_path, berlin)
    ingest_and_plan(engine, cfg, datetime(2027, 2, 1, tzinfo=UTC))
    (tmp_path / "cal.ics").write_text(berlin.replace("Europe/Berlin", "Europe/Berln").replace(
        "Asia/Tokyo:20270301T090000", "Asia/Tokyo:20270302T090000"), newline="")
    now = datetime(2027, 2, 2, tzinfo=UTC)
    ingest_and_plan(engine, cfg, now)
    active = [p for p in _planned(engine) if p[1] == "active"]
    assert active == [("floating", "active", _utc("2027-03-01T08:00:00Z")),
                      ("zoned", "active", _utc("2027-03-02T00:00:00Z"))]
    check = rules_complete(engine, "cal")
    assert not check.passed
    assert "X-WR-TIMEZONE (line 4) 'Europe/Berln'" in check.summary and "Europe/Berlin?" in check.summary, \
        check.summary


CUSTOM = "Customized Time Zone"


def _custom_zone(offset: str) -> tuple[str, ...]:
    """Outlook's ``Customized Time Zone``: one name for whatever zone the exporting machine had."""
    return ("BEGIN:VTIMEZONE", f"TZID:{CUSTOM}", "BEGIN:STANDARD", "DTSTART:19700101T000000",
            f"TZOFFSETFROM:{offset}", f"TZOFFSETTO:{offset}", "END:STANDARD", "END:VTIMEZONE")


def test_each_calendar_is_read_in_its_own_vtimezones_not_in_one_read_before(engine, tmp_path):
    """Two sources read in one process, each defining ``Customized Time Zone`` its own way (+08:00 and
    +02:00), and a third writing ``TZID=PST`` with no VTIMEZONE after one that defined PST with the US
    rules. The library keeps VTIMEZONE definitions in a process-wide cache by TZID (first one kept), so
    the second source's 17:00 was read at +08:00 (09:00Z, six hours early) and the third's July 17:00
    as PDT: each instant depended on which source had been read before it."""
    sources = {
        "perth": _calendar(*_custom_zone("+0800"), *_event("perth", f"DTSTART;TZID={CUSTOM}:20270715T170000")),
        "cairo": _calendar(*_custom_zone("+0200"), *_event("cairo", f"DTSTART;TZID={CUSTOM}:20270715T170000")),
        "la": _calendar(*PST_WITH_US_RULES, *_event("la", "DTSTART;TZID=PST:20270715T170000")),
        # PST without a definition: the abbreviation's fixed UTC-8 (with its out-of-season note).
        "plain": _calendar(*_event("plain", "DTSTART;TZID=PST:20270715T170000")),
    }
    for name, calendar in sources.items():
        (tmp_path / f"{name}.ics").write_text(calendar, newline="")
    cfg = load_config(write_config(
        tmp_path,
        sources=[{"name": name, "format": "ics", "location": f"{name}.ics", "tenant": "t"} for name in sources],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": list(sources), "offsets": ["-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    ))[0]
    ingest_and_plan(engine, cfg, datetime(2027, 2, 1, tzinfo=UTC))
    assert sorted((rule_id, due) for rule_id, _status, due in _planned(engine)) == [
        ("cairo", _utc("2027-07-15T15:00:00Z")), ("la", _utc("2027-07-16T00:00:00Z")),
        ("perth", _utc("2027-07-15T09:00:00Z")), ("plain", _utc("2027-07-16T01:00:00Z"))]
