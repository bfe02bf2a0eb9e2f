"""A deadline its publisher cancels (RFC 5545 STATUS:CANCELLED) stops being reminded: real CLI runs on
SQLite with a maildir channel, the calendar revised between runs."""

from __future__ import annotations

import mailbox

from click.testing import CliRunner
from sqlalchemy import select

from deadline_pipeline.cli import main
from deadline_pipeline.store.db import make_engine
from deadline_pipeline.store.schema import alerts
from deadline_pipeline_tests.factories import ics, write_config

# Due 2027-01-15 11:00 UTC; with -P1D its reminder is due 2027-01-14 11:00 UTC.
EVENT = dict(uid="report@test", tzid="Europe/Berlin", dtstart="20270115T120000", summary="Quarterly report")
OTHER = dict(uid="audit@test", tzid="Europe/Berlin", dtstart="20270116T120000", summary="Audit")
# Later ones: a revision that withdraws more than 30% of a source's future rules is quarantined (a
# feed cancelling everything by mistake is held for review); one in four is a cancellation.
LATER = [dict(uid=f"later{i}@test", tzid="Europe/Berlin", dtstart=f"2027060{i}T120000", summary=f"Later {i}")
         for i in (1, 2)]


def _run(path, url, as_of, tmp_path):
    env = {"DEADLINE_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    return CliRunner().invoke(main, ["run", "--config", str(path), "--db-url", url, "--as-of", as_of], env=env)


def test_a_deadline_cancelled_by_its_publisher_is_withdrawn_not_reminded(tmp_path):
    """Before, STATUS:CANCELLED was not read: the cancelled deadline's reminder went out on time."""
    subjects, states = _revised_run(
        tmp_path, lambda revised: ics({**EVENT, "status": "CANCELLED"} if revised else EVENT, OTHER, *LATER),
        "2027-01-16T00:00:00Z")  # past both reminders' send times
    assert len(subjects) == 1 and "Audit" in subjects[0], subjects
    assert states == ["cancelled", "delivered", "pending", "pending"], states


# Reminded (-P1D) 2027-01-14 11:00 UTC, like the report to-do below.
CONTROL = dict(uid="control@test", tzid="Europe/Berlin", dtstart="20270115T120000", summary="Audit")


def _todos(*, completed: bool) -> str:
    """Two to-dos: a one-off report due 2027-01-15 11:00 UTC, and a weekly timesheet written as
    Thunderbird writes tasks (DTSTART 09:00, DUE 17:00 Berlin) whose second occurrence is due
    2027-01-15 16:00 UTC; ``completed`` marks the report and that occurrence done (STATUS:COMPLETED,
    RFC 5545 §3.8.1.11)."""
    done = ["STATUS:COMPLETED", "COMPLETED:20270111T000000Z"] if completed else []
    lines = ["BEGIN:VTODO", "UID:report-todo@test", "DTSTAMP:20260101T000000Z", "SUMMARY:Send the report",
             "DUE;TZID=Europe/Berlin:20270115T120000", *done, "END:VTODO",
             "BEGIN:VTODO", "UID:timesheet@test", "DTSTAMP:20260101T000000Z", "SUMMARY:Timesheet",
             "DTSTART;TZID=Europe/Berlin:20270108T090000", "DUE;TZID=Europe/Berlin:20270108T170000",
             "RRULE:FREQ=WEEKLY;COUNT=3", "END:VTODO"]
    if completed:
        lines += ["BEGIN:VTODO", "UID:timesheet@test", "DTSTAMP:20270111T000000Z", "SUMMARY:Timesheet",
                  "RECURRENCE-ID;TZID=Europe/Berlin:20270115T090000", "DTSTART;TZID=Europe/Berlin:20270115T090000",
                  "DUE;TZID=Europe/Berlin:20270115T170000", *done, "END:VTODO"]
    return "".join(line + "\r\n" for line in lines)


def _with_control(components: str) -> str:
    """An ICS calendar of the control event, the later events and ``components`` (VEVENT/VTODO text)."""
    return ics(CONTROL, *LATER).replace("END:VCALENDAR", components + "END:VCALENDAR")


def _revised_run(tmp_path, calendar, later_as_of: str) -> tuple[list[str], list[str]]:
    """Run the pipeline on ``calendar(False)`` (an ICS text) at 2027-01-10, on ``calendar(True)`` at
    2027-01-11, then at ``later_as_of`` (past the reminders' send times). Returns the subjects
    delivered and the sorted alert states."""
    cal = tmp_path / "cal.ics"

    def write(revised: bool) -> None:
        cal.write_text(calendar(revised), newline="")

    write(False)
    maildir = tmp_path / "maildir"
    path = write_config(
        tmp_path,
        sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t1"}],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "Europe/Berlin"}],
        subscriptions=[{"name": "all", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(maildir)}},
    )
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    first = _run(path, url, "2027-01-10T00:00:00Z", tmp_path)
    assert first.exit_code == 0, first.output
    write(True)
    revised = _run(path, url, "2027-01-11T00:00:00Z", tmp_path)
    assert revised.exit_code == 0, revised.output
    assert "has no quarantined snapshot waiting" in revised.output
    later = _run(path, url, later_as_of, tmp_path)
    assert later.exit_code == 0, later.output
    subjects = [m["Subject"] for m in mailbox.Maildir(str(maildir), create=False)]
    engine = make_engine(url)
    with engine.connect() as conn:
        states = sorted(conn.execute(select(alerts.c.status)).scalars())
    engine.dispose()
    return subjects, states


def test_a_completed_todo_and_a_completed_occurrence_are_withdrawn_not_reminded(tmp_path):
    """Before, STATUS:COMPLETED was not read: the finished report was reminded, and the finished
    timesheet twice (its override named no occurrence: RECURRENCE-ID is the 09:00 DTSTART, the
    reminder is for the 17:00 DUE)."""
    subjects, states = _revised_run(tmp_path, lambda completed: _with_control(_todos(completed=completed)),
                                    "2027-01-14T18:00:00Z")  # past the three reminders' send times
    assert len(subjects) == 1 and "Audit" in subjects[0], subjects
    # Report and timesheet 2 withdrawn; timesheet 3 and the two later events still to come.
    assert states == ["cancelled", "cancelled", "delivered", "pending", "pending", "pending"], states


def _series(*, revised: bool) -> str:
    """A weekly meeting (SEQUENCE 1) and its override moving the 2027-01-15 occurrence to 14:00 Berlin
    (reminded 2027-01-14 13:00 UTC); ``revised``: the series at SEQUENCE 2 deletes that occurrence
    with an EXDATE, and the feed keeps the SEQUENCE 1 override (RFC 5545 §3.8.4.4, §3.8.5.1)."""
    master = ["BEGIN:VEVENT", "UID:meeting@test", f"SEQUENCE:{2 if revised else 1}", "DTSTAMP:20270101T000000Z",
              "SUMMARY:Board meeting", "DTSTART;TZID=Europe/Berlin:20270108T130000", "RRULE:FREQ=WEEKLY;COUNT=3",
              *(["EXDATE;TZID=Europe/Berlin:20270115T130000"] if revised else []), "END:VEVENT"]
    override = ["BEGIN:VEVENT", "UID:meeting@test", "SEQUENCE:1", "DTSTAMP:20270101T000000Z",
                "SUMMARY:Board meeting (moved)", "RECURRENCE-ID;TZID=Europe/Berlin:20270115T130000",
                "DTSTART;TZID=Europe/Berlin:20270115T140000", "END:VEVENT"]
    return "".join(line + "\r\n" for line in master + override)


def test_an_override_of_an_occurrence_its_series_deleted_is_withdrawn_not_reminded(tmp_path):
    """Before, the override outlived the revision that deleted its occurrence, and its reminder went
    out for a meeting that no longer takes place."""
    subjects, states = _revised_run(tmp_path, lambda revised: _with_control(_series(revised=revised)),
                                    "2027-01-14T18:00:00Z")  # past both reminders' send times
    assert len(subjects) == 1 and "Audit" in subjects[0], subjects
    # The override's alert withdrawn; the series' 2027-01-22 occurrence and the two later events to come.
    assert states == ["cancelled", "delivered", "pending", "pending", "pending"], states
