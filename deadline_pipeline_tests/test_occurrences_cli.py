"""``deadline-pipeline occurrences`` through a real subprocess: output format, strict errors, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deadline_pipeline.cli", "occurrences", *args], capture_output=True,
                          text=True, timeout=120)


def utc_lines(values: list[str]) -> list[str]:
    return [datetime.fromisoformat(v).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") for v in values]


@pytest.fixture(scope="module")
def cases(shared_dir) -> dict[str, dict]:
    data = json.loads((shared_dir / "cases" / "recurrence_and_delivery_cases.json").read_text())
    return {c["id"]: c for c in data}


def test_c09_dst_gap_one_instant_per_line(cases):
    case = cases["C09"]
    out = run("--dtstart", case["input"]["DTSTART"], "--rrule", case["input"]["RRULE"],
              "--after", "2025-01-01T00:00:00Z")
    assert out.returncode == 0, out.stderr
    policy = next(k for k in case["expected"] if k.startswith("policy_shift"))
    assert out.stdout.split() == utc_lines(case["expected"][policy])


def test_a_skipped_day_prints_its_instant_once_and_says_which_occurrence_was_dropped():
    """Samoa skipped 2011-12-30: five occurrences asked for, four instants, the 19:00Z of the 30th
    once (it is 31 December 09:00 there); stderr names the dropped local time."""
    out = run("--dtstart", "DTSTART;TZID=Pacific/Apia:20111228T090000", "--rrule", "FREQ=DAILY;COUNT=5",
              "--after", "2011-12-01T00:00:00Z")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2011-12-28T19:00:00Z", "2011-12-29T19:00:00Z", "2011-12-30T19:00:00Z",
                                  "2011-12-31T19:00:00Z"]
    assert "occurrence at local 2011-12-30T09:00:00 is dropped" in out.stderr
    assert "2011-12-31T09:00:00, which keeps it" in out.stderr


def test_c02_json_list_with_iso_dtstart_and_tz(cases):
    case = cases["C02"]["input"]["variant_b"]
    out = run("--dtstart", "2026-01-05T09:00:00", "--tz", "America/New_York", "--rrule", "RRULE:" + case["RRULE"],
              "--after", "2026-01-01T00:00:00Z", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == utc_lines(cases["C02"]["expected"]["variant_b"])


def test_c12_exdates_each_with_its_own_tzid(cases):
    case = cases["C12"]
    lines = case["input"]["ics"]
    args = ["--dtstart", lines[0], "--rrule", lines[1].split(":", 1)[1], "--after", "2022-01-01T00:00:00Z"]
    for line in lines[2:]:
        args += ["--exdate", line]
    out = run(*args)
    assert out.returncode == 0, out.stderr
    got = out.stdout.split()
    assert len(got) == case["expected"]["count"]
    assert got[-3:] == utc_lines(case["expected"]["last_week"])


@pytest.mark.parametrize("rule, part", [
    ("FREQ=DAILY;COUNT=3;UNTIL=20240105T000000", "COUNT and UNTIL"),
    ("FREQ=DAILY;UNTIL=20240103T000000;UNTIL=20240110T000000", "UNTIL appears more than once"),
    ("FREQ=DAILY;BYFOO=1", "BYFOO is unknown"),
    ("FREQ=DAILY;INTERVAL=zero", "INTERVAL"),
])
def test_strict_errors_exit_2_naming_the_part(rule, part):
    out = run("--dtstart", "20240101T000000Z", "--rrule", rule)
    assert out.returncode == 2
    assert part in out.stderr and out.stdout == ""


def test_floating_dtstart_without_tz_is_refused_never_utc():
    out = run("--dtstart", "2026-01-05T09:00:00", "--rrule", "FREQ=DAILY")
    assert out.returncode == 2 and "--tz" in out.stderr


def test_a_date_dtstart_with_a_tzid_is_named_a_date_not_floating():
    """``--dtstart 'DTSTART;TZID=America/New_York:20270703'`` was refused as "floating (no TZID …)",
    though it has one: a date takes no zone (RFC 5545 §3.2.19), and the message now says so."""
    res = run("--dtstart", "DTSTART;TZID=America/New_York:20270703")
    assert res.returncode == 2
    assert "is a date, which has no zone" in res.stderr and "no TZID" not in res.stderr, res.stderr


def test_unknown_zone_and_calendar_are_bad_input():
    assert run("--dtstart", "2026-01-05T09:00:00", "--tz", "Mars/Base", "--rrule", "FREQ=DAILY").returncode == 2
    out = run("--dtstart", "20260105T090000Z", "--business-days", "XX")
    assert out.returncode == 2 and "XX" in out.stderr


def test_business_days_us_irs_and_count():
    out = run("--dtstart", "DTSTART;TZID=America/New_York:20280415T235959", "--rrule", "FREQ=YEARLY",
              "--business-days", "US-IRS", "--convention", "following", "--after", "2028-01-01T00:00:00Z",
              "--count", "2")
    assert out.returncode == 0, out.stderr
    # 15 April 2028 (Saturday) → Tuesday 18 April; 15 April 2029 (Sunday) → Tuesday 17 April.
    assert out.stdout.split() == ["2028-04-19T03:59:59Z", "2029-04-18T03:59:59Z"]


def test_rdate_and_before_window():
    out = run("--dtstart", "DTSTART;VALUE=DATE:20260301", "--tz", "UTC", "--rdate", "20260310",
              "--after", "2026-01-01T00:00:00Z", "--before", "2026-12-31T00:00:00Z")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2026-03-01T23:59:59Z", "2026-03-10T23:59:59Z"]


def test_ics_file_with_floating_times_and_an_override(tmp_path: Path, cases):
    c14 = cases["C14"]["input"]["ics"]
    ics = "\r\n".join([
        "BEGIN:VCALENDAR", "VERSION:2.0", *[x for x in c14 if x.startswith("X-WR")],
        "BEGIN:VEVENT", "UID:f", "SUMMARY:floating", *[x for x in c14 if not x.startswith("X-WR")], "END:VEVENT",
        "BEGIN:VEVENT", "UID:m", "SUMMARY:weekly", "DTSTART;TZID=Europe/Berlin:20150302T090000",
        "RRULE:FREQ=WEEKLY;COUNT=3", "END:VEVENT",
        "BEGIN:VEVENT", "UID:m", "SUMMARY:moved", "RECURRENCE-ID;TZID=Europe/Berlin:20150309T090000",
        "DTSTART;TZID=Europe/Berlin:20150310T090000", "END:VEVENT",
        "END:VCALENDAR", ""])
    path = tmp_path / "cal.ics"
    path.write_text(ics)
    out = run("--ics", str(path), "--after", "2015-01-01T00:00:00Z", "--json")
    assert out.returncode == 0, out.stderr
    got = [(x["due_at"], x["rule_id"]) for x in json.loads(out.stdout)]
    assert got == [
        ("2015-03-02T08:00:00Z", "m"),
        ("2015-03-10T08:00:00Z", "m#2015-03-09T08:00:00Z"),  # replaces 9 March, which is not repeated
        ("2015-03-14T00:00:00Z", "f"),  # 10:00 in X-WR-TIMEZONE Australia/Brisbane (case C14)
        ("2015-03-16T08:00:00Z", "m"),
    ]
    lines = run("--ics", str(path), "--after", "2015-01-01T00:00:00Z", "--count", "1")
    assert lines.stdout.strip() == "2015-03-02T08:00:00Z\tm"


def test_an_ics_file_with_a_skipped_component_exits_1_saying_the_list_is_incomplete(tmp_path: Path):
    """Before, a file whose events were all skipped (here: an unknown TZID) printed warnings and
    nothing else and exited 0, like a window with no occurrence."""
    path = tmp_path / "cal.ics"
    path.write_text("\r\n".join([
        "BEGIN:VCALENDAR", "VERSION:2.0",
        "BEGIN:VEVENT", "UID:lost", "SUMMARY:s", "DTSTART;TZID=Mars/Olympus:20270302T090000",
        "RRULE:FREQ=WEEKLY;COUNT=3", "END:VEVENT",
        "BEGIN:VEVENT", "UID:kept", "SUMMARY:s", "DTSTART:20270305T090000Z", "END:VEVENT",
        "END:VCALENDAR", ""]))
    out = run("--ics", str(path), "--after", "2027-01-01T00:00:00Z")
    assert out.returncode == 1, (out.returncode, out.stdout, out.stderr)
    assert out.stdout.strip() == "2027-03-05T09:00:00Z\tkept"  # the good component is still listed
    assert "error: 1 component(s) of" in out.stderr and "not in the list" in out.stderr, out.stderr


def test_an_ics_file_lists_no_override_of_an_occurrence_its_series_deleted():
    """Before, ``exdate@tests`` listed 2024-08-19 as rule ``exdate@tests#2024-08-19`` although the
    series in force excludes that date, and each series revised to end earlier or recur on other days
    kept its old override: four occurrences their owners had deleted."""
    path = Path(__file__).with_name("calendars") / "overrides_of_deleted_occurrences.ics"
    out = run("--ics", str(path), "--tz", "UTC", "--after", "2024-08-01T00:00:00Z", "--before", "2024-10-01T00:00:00Z")
    assert out.returncode == 0, out.stderr  # a note, not a skipped component: the list is complete
    listed = out.stdout.split("\n")
    assert "2024-08-19T23:59:59Z\texdate@tests#2024-08-19" not in listed
    assert [line.split("\t")[1] for line in listed if "#" in line] == ["moved@tests#2024-08-12",
                                                                        "rdate@tests#2024-09-01"]
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
    assert sum("which the series in force" in line for line in warnings) == 4, out.stderr


def test_ics_and_dtstart_are_exclusive(tmp_path: Path):
    out = run("--ics", str(tmp_path / "missing.ics"), "--dtstart", "20260101T000000Z")
    assert out.returncode == 2
    assert run("--ics", str(tmp_path / "missing.ics")).returncode == 2


@pytest.mark.parametrize(("option", "value", "reason"), [
    # ISO 8601 and ICS in form: "neither an ICS value nor ISO 8601" sent the reader after the format.
    ("--after", "2026-02-30T00:00:00Z", "no such date: 2026-02 has 28 days"),
    ("--dtstart", "20261301T090000Z", "month 13 is out of range (01 to 12)"),
    ("--before", "2026-12-01T24:00:01Z", "hour 24 is out of range (00 to 23); write 24:00 as 00:00 of the next day"),
    # The window's other end is computed from it: "error: OverflowError: date value out of range".
    ("--after", "9999-12-31T23:59:59Z", "out of range (years 1900 to 9000)"),
    ("--after", "0001-01-01T00:00:00+01:00", "out of range (years 1900 to 9000)"),
    # Read as an ICS property name: "'garbage' is a property name without ':' and value".
    ("--after", "garbage", "is neither a date or date-time (2026-01-05T09:00:00Z, 20260105T090000Z) nor a property "
                           "line with ':' and a value (DTSTART;TZID=Europe/Berlin:20260105T090000)"),
])
def test_an_impossible_or_unreadable_instant_is_named_with_its_option(option, value, reason):
    args = {"--dtstart": "20260105T090000Z", "--after": "2026-01-01T00:00:00Z", "--before": "2027-01-01T00:00:00Z"}
    args[option] = value
    out = run(*[w for kv in args.items() for w in kv])
    assert out.returncode == 2, out.stdout + out.stderr
    separator = " " if reason.startswith("is ") else ": "
    assert out.stderr.strip() == f"error: {option}: {value!r}{separator}{reason}", out.stderr
