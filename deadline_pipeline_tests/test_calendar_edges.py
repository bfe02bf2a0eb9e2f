"""Dates at the edge of Python's calendar (years 1 and 9999) in feeds, stored rules and command-line
options: each is a skipped record or a clear error naming the input and the supported range
(``rules.RULE_YEARS``), never an ``OverflowError`` that ends the parse, the planning run or the
command. An UNTIL past the range bounds nothing a window reaches and is kept."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from deadline_pipeline.cli import main
from deadline_pipeline.ingest.parsers import parse_payload
from deadline_pipeline.plan.occurrences import expand
from deadline_pipeline.plan.planner import Target, plan_target
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.timezones import resolve_zone
from deadline_pipeline_tests.factories import ai_deadlines, ics, ingest_and_plan_feed

T0 = datetime(2027, 1, 10, tzinfo=UTC)
RANGE = "is outside the supported range (years 1000 to 9000)"
NEAR_ICS = {"uid": "near", "tzid": "America/New_York", "dtstart": "20270301T090000", "summary": "Near"}
NEAR_AI = {"id": "near27", "title": "Near", "year": 2027, "deadline": "2027-03-01 23:59:59", "timezone": "UTC-12"}


def _calendar(*lines: str) -> bytes:
    return ("\r\n".join(["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//test//EN", *lines, "END:VCALENDAR"])
            + "\r\n").encode()


def _event(uid: str, *props: str) -> list[str]:
    return ["BEGIN:VEVENT", f"UID:{uid}", "DTSTAMP:20260101T000000Z", "SUMMARY:s", *props, "END:VEVENT"]


# --- the parsers: one skipped record, the others kept ----------------------------------------------

@pytest.mark.parametrize(("fmt", "payload", "shown"), [
    # West of UTC: year 10000 in UTC.
    ("ics", ics({"uid": "far", "tzid": "America/New_York", "dtstart": "99991231T235959", "summary": "Far"},
                NEAR_ICS), "VEVENT UID=far (line 4): DTSTART 9999-12-31T23:59:59: year 9999 " + RANGE),
    # East of UTC: year 0 in UTC.
    ("ics", ics({"uid": "far", "tzid": "Asia/Tokyo", "dtstart": "00010101T000000", "summary": "Old"}, NEAR_ICS),
     "VEVENT UID=far (line 4): DTSTART 0001-01-01T00:00:00: year 1 " + RANGE),
    ("ics", _calendar(*_event("far", "DTSTART;TZID=Pacific/Kiritimati:99991231T235959"),
                      *_event("near", "DTSTART:20270301T090000Z")),
     "VEVENT UID=far (line 4): DTSTART 9999-12-31T23:59:59: year 9999 " + RANGE),
    ("ai-deadlines", ai_deadlines({"id": "far99", "title": "Far", "year": 9999, "deadline": "9999-12-31 23:59:59",
                                   "timezone": "UTC-12"}, NEAR_AI),
     "entry 1 (id=far99, line 1) deadline: start 9999-12-31T23:59:59: year 9999 " + RANGE),
    ("csv", b"id,title,due,timezone\nfar,Far,9999-12-31T23:59,America/New_York\nnear,Near,2027-03-01,UTC\n",
     "line 2: start 9999-12-31T23:59:00: year 9999 " + RANGE),
    ("govuk-bank-holidays", json.dumps({"england-and-wales": {"division": "england-and-wales", "events": [
        {"title": "Far", "date": "9999-12-31"}, {"title": "Near", "date": "2027-03-01"}]}}).encode(),
     "england-and-wales.events[0]: start 9999-12-31: year 9999 " + RANGE),
])
def test_a_date_at_the_edge_of_the_calendar_skips_its_record_alone(fmt, payload, shown):
    """Before, the ICS and ai-deadlines feeds failed whole ("parser failed unexpectedly:
    OverflowError: date value out of range"), and the others stored a rule planning could not read."""
    payload = payload.encode() if isinstance(payload, str) else payload
    result = parse_payload(fmt, payload, source="s")
    assert [str(p) for p in result.problems if p.skipped] == [shown]
    assert len(result.rules) == 1 and "far" not in result.rules[0].rule_id.lower()


@pytest.mark.parametrize("prop", ["RDATE", "EXDATE"])
def test_an_rdate_or_exdate_at_the_edge_of_the_calendar_is_ignored_with_a_note(prop):
    payload = _calendar(*_event("yearly", "DTSTART;TZID=America/New_York:20270301T090000", "RRULE:FREQ=YEARLY",
                                f"{prop};TZID=America/New_York:99991231T235959"))
    result = parse_payload("ics", payload, source="s")
    (rule,) = result.rules
    assert rule.rdates == () and rule.exdates == ()
    assert [str(p) for p in result.problems] == [
        f"VEVENT UID=yearly (line 4): {prop} 9999-12-31T23:59:59: year 9999 {RANGE}; that {prop} value is ignored"]


@pytest.mark.parametrize(("props", "shown"), [
    # Read as 12:00 wall time in each subscriber's zone, it was due at 23:00Z in Pago Pago, with a note.
    (("DTSTART;VALUE=DATE:20270305", "RDATE:20270312T120000Z"),
     "RDATE 2027-03-12T12:00:00 in UTC is an instant but the rule is floating"),
    (("DTSTART:20270305T090000", "RDATE;TZID=America/New_York:20270312T090000"),
     "RDATE 2027-03-12T09:00:00 in America/New_York is an instant but the rule is floating"),
    # Ignored with a note, the occurrence it names was never planned.
    (("DTSTART;TZID=America/New_York:20270305T090000", "RDATE;TZID=Mars/Olympus:20270312T090000"),
     "RDATE has TZID 'Mars/Olympus'"),
])
def test_an_rdate_whose_instant_cannot_be_planned_skips_its_record(props, shown):
    """An RDATE is an occurrence: one the rule cannot hold skips the record (its last good version stays
    in force and rules_complete names it), never a note beside a rule planned without it or off by hours."""
    payload = _calendar(*_event("r", *props), *_event("ok", "DTSTART:20270301T090000Z"))
    result = parse_payload("ics", payload, source="s")
    assert [r.rule_id for r in result.rules] == ["ok"]
    (problem,) = result.problems
    assert problem.skipped and problem.record_id == "r" and shown in problem.message, problem


# --- ingest, planning and the checks over a feed with such records --------------------------------

@pytest.mark.parametrize(("fmt", "payload", "planned"), [
    ("ics", ics({"uid": "far", "tzid": "America/New_York", "dtstart": "99991231T235959", "summary": "Far"},
                # "No end", written as UNTIL in 9999: floating in a zone west of UTC, and UTC in one east.
                {"uid": "until-ny", "tzid": "America/New_York", "dtstart": "20270201T090000", "summary": "U1",
                 "rrule": "FREQ=YEARLY;UNTIL=99991231T235959"},
                {"uid": "until-tokyo", "tzid": "Asia/Tokyo", "dtstart": "20270201T090000", "summary": "U2",
                 "rrule": "FREQ=YEARLY;UNTIL=99991231T235959Z"},
                NEAR_ICS), {"near", "until-ny", "until-tokyo"}),
    ("ai-deadlines", ai_deadlines({"id": "far99", "title": "Far", "year": 9999, "deadline": "9999-12-31 23:59:59",
                                   "timezone": "UTC-12"}, NEAR_AI), {"near27/submission/deadline"}),
])
def test_a_feed_with_dates_at_the_edge_is_ingested_and_planned(engine, tmp_path, fmt, payload, planned):
    """The record at the edge is skipped (``rules_complete`` red, naming it and the range); every other
    rule is stored and planned, the rules with an UNTIL in 9999 included. Before, the feed failed to
    parse, or planning ended in an OverflowError for every rule."""
    applied, rule_ids, check = ingest_and_plan_feed(engine, tmp_path, fmt, payload, T0)
    assert applied.status == "applied" and applied.skipped == 1, applied
    assert rule_ids == planned
    assert not check.passed and RANGE in check.summary, check.summary


def test_planning_reports_a_stored_rule_at_the_edge_and_plans_the_others():
    """A rule stored before ingest refused such dates (or read from an old snapshot) is one planning
    problem naming it and the range; before, its OverflowError is no ValueError and ended the run."""
    target = Target(1, "ann", "t", "America/New_York", 1, "cal", None, ("*",), (-86400,), ("mail",))
    rules = [(1, RuleRecord("far", "Far", "9999-12-31T23:59:59", "AoE")),
             (1, RuleRecord("old", "Old", "0001-01-01T00:00:00", "Asia/Tokyo", "FREQ=YEARLY")),
             (1, RuleRecord("until", "Until", "2027-02-01T09:00:00", "AoE", "FREQ=YEARLY;UNTIL=99991231")),
             (1, RuleRecord("near", "Near", "2027-03-01T09:00:00", "America/New_York"))]
    obs, problems = plan_target(target, rules, T0)
    assert sorted(o.rule_id for o in obs) == ["near", "until"]
    assert {p.rule_id: p.message for p in problems} == {
        "far": f"rule 'far': start 9999-12-31T23:59:59: year 9999 {RANGE}",
        "old": f"rule 'old': start 0001-01-01T00:00:00: year 1 {RANGE}"}


@pytest.mark.parametrize("until", ["99991231", "99991231T235959", "99991231T235959Z", "00010101T000000Z"])
@pytest.mark.parametrize("zone", ["Etc/GMT+12", "Pacific/Kiritimati"])
def test_an_until_at_the_edge_of_the_calendar_bounds_nothing_in_range(until, zone):
    rule = RuleRecord("r", "R", "2027-02-01T09:00:00", zone, f"FREQ=YEARLY;UNTIL={until}")
    got = expand(rule, resolve_zone(zone), after=T0, before=datetime(2029, 1, 1, tzinfo=UTC))
    # UNTIL in year 1 ends the series before DTSTART: DTSTART alone (RFC 5545 §3.8.5.3: always an instance).
    assert len(got) == (1 if until.startswith("0001") else 2)


# --- the command line ------------------------------------------------------------------------------

def _occurrences(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deadline_pipeline.cli", "occurrences", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("args", "named"), [
    (["--dtstart", "99991231T235959", "--tz", "AoE"], "--dtstart: '99991231T235959': year 9999"),
    (["--dtstart", "99991231T235959", "--tz", "Asia/Tokyo"], "--dtstart: '99991231T235959': year 9999"),
    (["--dtstart", "9999-12-31T23:59:59-05:00"], "--dtstart: '9999-12-31T23:59:59-05:00': year 9999"),
    (["--dtstart", "99991231", "--tz", "AoE", "--business-days", "US"], "--dtstart: '99991231': year 9999"),
    (["--dtstart", "00010101T000000", "--tz", "Asia/Tokyo"], "--dtstart: '00010101T000000': year 1"),
    (["--dtstart", "0001-01-01T00:00:00-05:00"], "--dtstart: '0001-01-01T00:00:00-05:00': year 1"),
    (["--dtstart", "00010101T000000Z", "--tz", "America/New_York"], "--dtstart: '00010101T000000Z': year 1"),
    (["--dtstart", "20270101T090000", "--tz", "AoE", "--rrule", "FREQ=HOURLY", "--rdate", "99991231T235959"],
     "--rdate: '99991231T235959': year 9999"),
    (["--dtstart", "20270101T090000", "--tz", "AoE", "--rrule", "FREQ=HOURLY", "--exdate", "99991231T235959"],
     "--exdate: '99991231T235959': year 9999"),
])
def test_occurrences_names_a_rule_date_at_the_edge_of_the_calendar(args, named):
    """``occurrences --dtstart 99991231T235959 --tz AoE`` ended in ``error: OverflowError: date value
    out of range``; the option, its value and the supported range are named instead, exit 2."""
    out = _occurrences(*args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip() == f"error: {named} {RANGE}", out.stderr


@pytest.mark.parametrize(("until", "zone", "expected"), [
    ("99991231T235959", "AoE", ["2027-01-01T21:00:00Z", "2028-01-01T21:00:00Z"]),
    ("99991231", "AoE", ["2027-01-01T21:00:00Z", "2028-01-01T21:00:00Z"]),
    ("99991231T235959Z", "Asia/Tokyo", ["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"]),
])
def test_occurrences_reads_an_until_in_9999_as_no_end(until, zone, expected):
    out = _occurrences("--dtstart", "20270101T090000", "--tz", zone, "--rrule", f"FREQ=YEARLY;UNTIL={until}",
                       "--after", "2026-12-01T00:00:00Z", "--before", "2028-12-01T00:00:00Z")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == expected


def test_occurrences_of_a_calendar_with_a_date_at_the_edge_lists_the_others(tmp_path):
    path = tmp_path / "feed.ics"
    path.write_bytes(_calendar(*_event("far", "DTSTART;TZID=America/New_York:99991231T235959"),
                               *_event("near", "DTSTART:20270301T090000Z")))
    out = _occurrences("--ics", str(path), "--after", "2027-01-01T00:00:00Z", "--before", "2028-01-01T00:00:00Z")
    assert out.returncode == 1, out.stderr  # a skipped component: the list is incomplete
    assert out.stdout.strip() == "2027-03-01T09:00:00Z\tnear"
    assert f"DTSTART 9999-12-31T23:59:59: year 9999 {RANGE}" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("command", [["status"], ["watchdog"], ["run"]])
@pytest.mark.parametrize("value", ["9999-12-31T23:59:59-12:00", "9999-12-31T23:59:59+14:00",
                                   "0001-01-01T00:00:00-05:00", "0001-01-01T00:00:00+01:00"])
def test_as_of_at_the_edge_of_the_calendar_is_named(tmp_path, command, value):
    res = CliRunner().invoke(main, [*command, "--as-of", value, "--db-url", f"sqlite:///{tmp_path / 's.db'}"],
                             env={"DEADLINE_HOME": str(tmp_path)})
    assert res.exit_code == 2, res.output
    assert f"error: --as-of {value!r}: out of range (years 1900 to 9000)" in res.output
    assert "OverflowError" not in res.output
