"""iCalendar readings that passed unseen: what ``validate`` lists, ``run`` acts on the same way, through
real Dagster runs (``deadline-pipeline run``) on PostgreSQL with a maildir channel."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from deadline_pipeline.cli import main
from deadline_pipeline.config import load_config
from deadline_pipeline.ingest.parsers import parse_payload
from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.store.db import make_engine, upgrade
from deadline_pipeline.store.schema import obligations
from deadline_pipeline.timezones import resolve_zone
from deadline_pipeline.watch.sources import rules_complete
from deadline_pipeline_tests.factories import write_config

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _calendar(*lines: str) -> str:
    return "".join(line + "\r\n" for line in ["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//test//EN", *lines,
                                               "END:VCALENDAR"])


def _event(uid: str, *props: str) -> list[str]:
    return ["BEGIN:VEVENT", f"UID:{uid}", "DTSTAMP:20260101T000000Z", f"SUMMARY:{uid}", *props, "END:VEVENT"]


OTHER = _event("other", "DTSTART;TZID=America/New_York:20270301T170000")
SERIES = ("DTSTART;TZID=America/New_York:20270115T170000", "RRULE:FREQ=MONTHLY;COUNT=2")
#: The series with an RDATE list folded without the leading space (RFC 5545 §3.1) just before a comma:
#: the RDATE line reads well with its first date, and the second is a line of its own, which the library
#: cannot split into name, parameters and value.
BROKEN_FOLD = _calendar(*_event("series", *SERIES, "RDATE;TZID=America/New_York:20270120T170000",
                                ",20270125T170000"), *OTHER)


def _config(tmp_path, payload: str):
    (tmp_path / "cal.ics").write_text(payload, newline="")
    return write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t1", "freshness": "P1D"}],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "America/New_York"}],
        subscriptions=[{"name": "all", "sources": ["cal"], "offsets": ["-P7D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}})


def _run(tmp_path, path, url: str, as_of: str):
    env = {"DEADLINE_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    return CliRunner().invoke(main, ["run", "--config", str(path), "--db-url", url, "--as-of", as_of], env=env)


def _check_line(output: str, name: str) -> str:
    (line,) = [x for x in output.splitlines() if x.strip().startswith(name)]
    return line


@pytest.mark.parametrize(("payload", "skipped"), [
    (BROKEN_FOLD, 1),
    (_calendar(*_event("bad", "DTSTART:not-a-date"), *OTHER), 1),
    (_calendar(*_event("bad", *SERIES, "not a content line"), *OTHER), 1),
    # A note only (RFC 5545 §3.3.5 forbids a TZID on a UTC time): listed by validate, skips nothing.
    (_calendar(*_event("utc", "DTSTART;TZID=Europe/Berlin:20270301T120000Z"), *OTHER), 0),
    (_calendar(*_event("exrule", *SERIES, "EXRULE:FREQ=MONTHLY;COUNT=1"), *OTHER), 0),
], ids=["rdate-fold-lost", "dtstart-not-a-date", "stray-line", "note-only", "exrule-note"])
def test_validate_and_ingest_agree_on_what_is_skipped(tmp_path, pg_url, payload, skipped):
    """``validate`` says how many records ingest skips (the one decision, ``counted_problems``), and
    ``rules_complete`` is red exactly then. Before, a line the library could not split inside a VEVENT
    failed validate while ingest planned the event without it, ``rules_complete`` green."""
    path = _config(tmp_path, payload)
    checked = CliRunner().invoke(main, ["validate", "--format", "ics", str(tmp_path / "cal.ics")])
    assert checked.exit_code == 1, checked.output
    verdict = checked.output.splitlines()[-1]
    said = f"{skipped} record(s) skipped" if skipped else "parsing skipped no record"
    assert said in verdict, checked.output

    engine = make_engine(pg_url)
    upgrade(engine)
    try:
        src = load_config(path)[0].sources[0]
        fetch_snapshot(engine, src, T0)
        applied = apply_latest_snapshot(engine, src, T0)
        assert (applied.status, applied.skipped) == ("applied", skipped), applied
        assert rules_complete(engine, "cal").passed is (skipped == 0)
    finally:
        engine.dispose()


def test_an_exrule_is_a_note_naming_its_line_and_the_series_is_planned_without_it(tmp_path):
    """EXRULE (RFC 2445; deprecated by RFC 5545, Appendix A.3) is not applied, and ``validate`` says so,
    naming its line, as it names a second RRULE. Before, it was ignored without a word: all four days
    planned and ``validate`` said OK. recurring-ical-events does not apply it either (four days)."""
    import icalendar
    import recurring_ical_events

    payload = _calendar(*_event("ex", "DTSTART:20270104T090000Z", "RRULE:FREQ=DAILY;COUNT=4",
                                "EXRULE:FREQ=DAILY;INTERVAL=2;COUNT=2"))
    result = parse_payload("ics", payload.encode(), source="cal")
    [rule] = result.rules
    shown = ("EXRULE (line 10) 'FREQ=DAILY;INTERVAL=2;COUNT=2' is not applied: EXRULE is RFC 2445's, deprecated by "
             "RFC 5545 (Appendix A.3); the instances it would exclude are planned (write them as EXDATEs)")
    assert [(p.position, p.message, p.record_id, p.skipped) for p in result.problems] == [
        ("VEVENT UID=ex (line 4)", shown, "ex", False)]
    assert rule.rrule == "FREQ=DAILY;COUNT=4"
    reference = recurring_ical_events.of(icalendar.Calendar.from_ical(payload)).between(
        datetime(2027, 1, 1), datetime(2027, 2, 1))
    assert len(list(reference)) == 4
    (tmp_path / "cal.ics").write_text(payload, newline="")
    checked = CliRunner().invoke(main, ["validate", "--format", "ics", str(tmp_path / "cal.ics")])
    assert checked.exit_code == 1 and shown in checked.output, checked.output


def test_a_date_rdate_in_a_timed_series_is_due_at_the_series_time_with_a_note_naming_its_line():
    """``RDATE;VALUE=DATE:20270315`` under ``DTSTART;TZID=Europe/Berlin:…T090000``: RFC 5545 §3.8.5.2 gives
    the date no time of day. It is planned at the series' 09:00 Berlin (08:00Z), as the other
    deadlines of the series; recurring-ical-events reads midnight (23:00Z the day before). Before,
    that choice was made without a word: ``validate`` said OK and nothing named the line."""
    from deadline_pipeline.plan.occurrences import expand

    series = ("DTSTART;TZID=Europe/Berlin:20270301T090000", "RRULE:FREQ=MONTHLY;COUNT=2")
    result = parse_payload("ics", _calendar(*_event("mixed", *series, "RDATE;VALUE=DATE:20270315")).encode(),
                           source="cal")
    (note,) = result.problems
    assert (note.position, note.record_id, note.skipped) == ("VEVENT UID=mixed (line 4)", "mixed", False)
    assert note.message.startswith(
        "RDATE (line 10) 2027-03-15: a DATE in a series whose DTSTART (line 8) is a DATE-TIME; each is due at "
        "09:00:00 (Europe/Berlin), the series' time of day, not at midnight"), note.message
    (rule,) = result.rules
    window = {"after": datetime(2027, 1, 1, tzinfo=UTC), "before": datetime(2027, 6, 1, tzinfo=UTC)}
    assert [o.due_at for o in expand(rule, resolve_zone(rule.tz), **window)] == [
        datetime(2027, 3, 1, 8, tzinfo=UTC), datetime(2027, 3, 15, 8, tzinfo=UTC), datetime(2027, 4, 1, 7, tzinfo=UTC)]
    # A DATE-TIME RDATE says its own time: nothing to note.
    timed = _calendar(*_event("timed", *series, "RDATE;TZID=Europe/Berlin:20270315T090000"))
    assert parse_payload("ics", timed.encode(), source="cal").problems == []
    # The other way round: a floating 09:00 RDATE in an all-day series is due at 09:00, said too.
    all_day = _calendar(*_event("day", "DTSTART;VALUE=DATE:20270301", "RRULE:FREQ=MONTHLY;COUNT=2",
                                "RDATE:20270315T090000"))
    (note,) = parse_payload("ics", all_day.encode(), source="cal").problems
    assert note.message.startswith("RDATE (line 10) 2027-03-15T09:00:00: a DATE-TIME in a series whose DTSTART "
                                   "(line 8) is a DATE; each is due at the time written"), note.message


def test_a_date_line_cut_off_its_property_turns_rules_complete_red_and_keeps_the_last_good_version(
        tmp_path, pg_url):
    """A real run over the calendar with an RDATE folded without its space: the series is skipped, naming
    the line, ``rules_complete`` is red and ``run`` exits 1, and the series' last good version (with the
    25 January occurrence) stays planned. Before, the series was planned without that occurrence and
    every check passed."""
    good = _calendar(*_event("series", *SERIES, "RDATE;TZID=America/New_York:20270120T170000,20270125T170000"),
                     *OTHER)
    path = _config(tmp_path, good)
    first = _run(tmp_path, path, pg_url, "2026-12-01T00:00:00Z")
    assert first.exit_code == 0, first.output

    (tmp_path / "cal.ics").write_text(BROKEN_FOLD, newline="")
    second = _run(tmp_path, path, pg_url, "2026-12-02T00:00:00Z")
    assert second.exit_code == 1, second.output
    line = _check_line(second.output, "rules_complete[cal]")
    assert "FAIL" in line and "VEVENT UID=series (line 4): component skipped: line 11: " in line, line
    assert "',20270125T170000'" in line and "RDATE" not in line, line
    engine = make_engine(pg_url)
    try:
        with engine.connect() as conn:
            due = sorted(conn.execute(select(obligations.c.due_at).where(
                obligations.c.rule_id == "series", obligations.c.status == "active")).scalars())
    finally:
        engine.dispose()
    assert [d.astimezone(UTC).strftime("%m-%d") for d in due] == ["01-15", "01-20", "01-25", "02-15"], due


# --- a VTIMEZONE under an IANA name that the IANA zone overrides -------------------------------------

def _vtimezone(tzid: str, *rules: tuple[str, str, str, str, str]) -> list[str]:
    """A VTIMEZONE of ``(STANDARD|DAYLIGHT, DTSTART, RRULE, TZOFFSETFROM, TZOFFSETTO)`` observances."""
    out = ["BEGIN:VTIMEZONE", f"TZID:{tzid}"]
    for kind, start, rrule, offset_from, offset_to in rules:
        out += [f"BEGIN:{kind}", f"DTSTART:{start}", *([f"RRULE:{rrule}"] if rrule else []),
                f"TZOFFSETFROM:{offset_from}", f"TZOFFSETTO:{offset_to}", f"END:{kind}"]
    return [*out, "END:VTIMEZONE"]


#: America/New_York as written before 2007: daylight time from the first Sunday of April to the last
#: Sunday of October (IANA: second Sunday of March to first Sunday of November).
OLD_US = _vtimezone("America/New_York",
                    ("DAYLIGHT", "19870405T020000", "FREQ=YEARLY;BYMONTH=4;BYDAY=1SU", "-0500", "-0400"),
                    ("STANDARD", "19671029T020000", "FREQ=YEARLY;BYMONTH=10;BYDAY=-1SU", "-0400", "-0500"))
CURRENT_US = _vtimezone("America/New_York",
                        ("DAYLIGHT", "20070311T020000", "FREQ=YEARLY;BYMONTH=3;BYDAY=2SU", "-0500", "-0400"),
                        ("STANDARD", "20071104T020000", "FREQ=YEARLY;BYMONTH=11;BYDAY=1SU", "-0400", "-0500"))
#: A wrong offset all year: Berlin's TZID with a definition one hour off.
WRONG_BERLIN = _vtimezone("Europe/Berlin", ("STANDARD", "19700101T000000", "", "+0200", "+0200"))


@pytest.mark.parametrize(("vtz", "props", "shown"), [
    # 20 March 2027: New York is on EDT (IANA); the old rule says EST until 4 April.
    (OLD_US, ("DTSTART;TZID=America/New_York:20270320T120000",),
     "VTIMEZONE TZID=America/New_York (line 5) disagrees with the zone of that name at DTSTART (line 23) "
     "2027-03-20T12:00:00: the calendar's definition gives UTC-05:00, the IANA zone America/New_York UTC-04:00; "
     "read in the IANA zone (due 2027-03-20T16:00:00+00:00)"),
    # A weekly series from January agrees at its DTSTART; its occurrence of 16 March does not.
    (OLD_US, ("DTSTART;TZID=America/New_York:20270105T120000", "RRULE:FREQ=WEEKLY"),
     "at the occurrence of 2027-03-16 of the RRULE (line 24): the calendar's definition gives UTC-05:00, the "
     "IANA zone America/New_York UTC-04:00; read in the IANA zone (due 2027-03-16T16:00:00+00:00)"),
    (OLD_US, ("DTSTART;TZID=America/New_York:20270105T120000", "RRULE:FREQ=MONTHLY;COUNT=3",
              "RDATE;TZID=America/New_York:20270401T120000"), "at RDATE (line 25) 2027-04-01T12:00:00"),
    (WRONG_BERLIN, ("DTSTART;TZID=Europe/Berlin:20270115T120000",),
     "VTIMEZONE TZID=Europe/Berlin (line 5) disagrees with the zone of that name at DTSTART (line 16) "
     "2027-01-15T12:00:00: the calendar's definition gives UTC+02:00, the IANA zone Europe/Berlin UTC+01:00"),
])
def test_a_vtimezone_the_iana_zone_overrides_is_a_note_naming_both_offsets(vtz, props, shown):
    """The IANA zone of the TZID is read, as documented, but no longer silently: a note (nothing
    skipped) names the VTIMEZONE's line, the value's line and instant, and both offsets."""
    payload = _calendar(*vtz, *_event("e", *props)).encode()
    result = parse_payload("ics", payload, source="s")
    (rule,) = result.rules
    assert rule.tz == props[0].split(";TZID=")[1].split(":")[0]  # the reading is unchanged: the IANA zone
    (note,) = result.problems
    assert not note.skipped and note.record_id == "e" and shown in note.message, note


@pytest.mark.parametrize("props", [
    ("DTSTART;TZID=America/New_York:20270320T120000",),
    ("DTSTART;TZID=America/New_York:20270105T120000", "RRULE:FREQ=WEEKLY"),
])
def test_a_vtimezone_that_agrees_with_the_iana_zone_says_nothing(props):
    result = parse_payload("ics", _calendar(*CURRENT_US, *_event("e", *props)).encode(), source="s")
    assert len(result.rules) == 1 and result.problems == []


def _us_rules(tzid: str, standard: str, daylight: str) -> list[str]:
    return _vtimezone(tzid, ("DAYLIGHT", "20070311T020000", "FREQ=YEARLY;BYMONTH=3;BYDAY=2SU", standard, daylight),
                      ("STANDARD", "20071104T020000", "FREQ=YEARLY;BYMONTH=11;BYDAY=1SU", daylight, standard))


@pytest.mark.parametrize(("vtz", "tzid", "zone", "due"), [
    # EST defined with US daylight saving: Eastern time, 12:00 EDT on 15 July is 16:00Z.
    (_us_rules("EST", "-0500", "-0400"), "EST", "America/New_York", datetime(2027, 7, 15, 16, tzinfo=UTC)),
    (_us_rules("MST", "-0700", "-0600"), "MST", "America/Denver", datetime(2027, 7, 15, 18, tzinfo=UTC)),
    # A definition that agrees with the fixed zone keeps it: 12:00 EST is 17:00Z all year.
    (_vtimezone("EST", ("STANDARD", "19700101T000000", "", "-0500", "-0500")), "EST", "EST",
     datetime(2027, 7, 15, 17, tzinfo=UTC)),
])
def test_est_mst_hst_defined_with_daylight_saving_are_read_in_the_calendars_definition(vtz, tzid, zone, due):
    """``EST``, ``MST`` and ``HST`` are IANA names of fixed offsets and also US abbreviations; a VTIMEZONE
    under one of them with US daylight saving is the calendar's definition of that TZID (RFC 5545
    §3.6.5). Before, the fixed IANA zone won: the summer deadline was due an hour late (17:00Z), with
    only a note that the definition disagreed."""
    from deadline_pipeline.plan.occurrences import expand

    result = parse_payload("ics", _calendar(*vtz, *_event("e", f"DTSTART;TZID={tzid}:20270715T120000")).encode(),
                           source="s")
    (rule,) = result.rules
    assert rule.tz == zone
    [occurrence] = expand(rule, resolve_zone(rule.tz), after=datetime(2027, 1, 1, tzinfo=UTC),
                          before=datetime(2028, 1, 1, tzinfo=UTC))
    assert occurrence.due_at == due
    if zone == tzid:  # read as the fixed zone: the reading of the abbreviation in summer is noted
        assert [p.message.split(":")[0] for p in result.problems] == ["start 2027-07-15T12"]
    else:
        assert rule.extra["tzid"] == tzid
        assert [(p.position, p.message, p.skipped) for p in result.problems] == [(
            "line 5", f"VTIMEZONE TZID={tzid} (line 5) defines other offsets than the IANA zone {tzid}, which has "
            "no daylight saving; its values are read in the calendar's definition (RFC 5545 §3.6.5)", False)]


def test_an_old_rule_that_agrees_at_every_instant_used_says_nothing():
    """Compared at the instants the calendar uses, not over the whole definition: a one-off in July
    is EDT by either rule."""
    result = parse_payload("ics", _calendar(*OLD_US, *_event(
        "e", "DTSTART;TZID=America/New_York:20270715T120000")).encode(), source="s")
    assert len(result.rules) == 1 and result.problems == []


# --- the calendar's zone (X-WR-TIMEZONE) defined by its own VTIMEZONE ----------------------------------

def _floating(zone_name: str, vtz: list[str], *events: list[str]) -> bytes:
    """A calendar whose floating times are in ``X-WR-TIMEZONE:zone_name``, with ``vtz`` (a VTIMEZONE or
    nothing) before its ``events``."""
    return _calendar(f"X-WR-TIMEZONE:{zone_name}", *vtz, *events).encode()


def _due(rule) -> list[datetime]:
    from deadline_pipeline.plan.occurrences import expand

    return [o.due_at for o in expand(rule, resolve_zone(rule.tz), after=datetime(2027, 1, 1, tzinfo=UTC),
                                     before=datetime(2028, 1, 1, tzinfo=UTC))]


#: US Eastern time as a calendar defines it under an IANA name of a fixed offset, as Eastern with summer.
EST_US = _us_rules("EST", "-0500", "-0400")


@pytest.mark.parametrize(("vtz", "zone", "july", "january"), [
    (EST_US, "America/New_York", 13, 14),
    (_us_rules("MST", "-0700", "-0600"), "America/Denver", 15, 16),
    (_us_rules("HST", "-1000", "-0900"), "America/Adak", 18, 19),
])
def test_x_wr_timezone_est_mst_hst_defined_with_daylight_saving_is_read_in_the_definition(vtz, zone, july, january):
    """``X-WR-TIMEZONE:EST`` beside a VTIMEZONE ``TZID:EST`` with US daylight saving: the calendar's floating
    times are in the zone it defines (RFC 5545 §3.6.5), as a ``TZID=EST`` value of it is. Before, they were
    read in the fixed IANA zone ``EST``: 09:00 on 15 July was due at 14:00Z, an hour late, with only a note
    that ``EST`` is winter time. The note is the VTIMEZONE's, as for a TZID parameter."""
    tzid = vtz[1].removeprefix("TZID:")
    result = parse_payload("ics", _floating(tzid, vtz, *_event("jul", "DTSTART:20270715T090000"),
                                            *_event("jan", "DTSTART:20270115T090000")), source="s")
    rules = {r.rule_id: r for r in result.rules}
    assert {r.tz for r in rules.values()} == {zone}
    assert _due(rules["jul"]) == [datetime(2027, 7, 15, july, tzinfo=UTC)]
    assert _due(rules["jan"]) == [datetime(2027, 1, 15, january, tzinfo=UTC)]
    assert [(p.position, p.message, p.skipped) for p in result.problems] == [(
        "line 6", f"VTIMEZONE TZID={tzid} (line 6) defines other offsets than the IANA zone {tzid}, which has "
        "no daylight saving; its values are read in the calendar's definition (RFC 5545 §3.6.5)", False)]


@pytest.mark.parametrize("vtz", [[], _vtimezone("EST", ("STANDARD", "19700101T000000", "", "-0500", "-0500"))])
def test_x_wr_timezone_est_without_daylight_saving_in_the_calendar_stays_the_fixed_zone(vtz):
    """Without a VTIMEZONE of it, or with one that agrees with the fixed zone, ``X-WR-TIMEZONE:EST`` is the
    IANA zone ``EST`` (UTC-05:00 all year), and 09:00 in July keeps its note that EST is winter time."""
    result = parse_payload("ics", _floating("EST", vtz, *_event("jul", "DTSTART:20270715T090000")), source="s")
    (rule,) = result.rules
    assert rule.tz == "EST" and _due(rule) == [datetime(2027, 7, 15, 14, tzinfo=UTC)]
    (note,) = result.problems
    assert not note.skipped and note.message.startswith(
        "start 2027-07-15T09:00:00 EST: EST is the standard (winter) time of America/New_York, which is on EDT "
        "(UTC-04:00) on 2027-07-15; read as written (UTC-05:00), the deadline is 1 hour later"), note


def test_x_wr_timezone_naming_a_zone_only_the_calendar_defines_is_read_in_the_definition():
    """``X-WR-TIMEZONE:Customized Time Zone`` (no IANA or Windows name) with a VTIMEZONE of that TZID: its
    floating times are read as the IANA zone with the definition's offsets and transitions, as a
    ``TZID=Customized Time Zone`` value is. Before, every floating component was skipped: the name
    "names no zone". One no IANA zone agrees with (US rules at UTC-04:30) still skips them, saying so."""
    vtz = _us_rules("Customized Time Zone", "-0500", "-0400")
    result = parse_payload("ics", _floating("Customized Time Zone", vtz, *_event("jul", "DTSTART:20270715T090000"),
                                            *_event("jan", "DTSTART:20270115T090000")), source="s")
    assert result.problems == []
    rules = {r.rule_id: r for r in result.rules}
    assert _due(rules["jul"]) == [datetime(2027, 7, 15, 13, tzinfo=UTC)]
    assert _due(rules["jan"]) == [datetime(2027, 1, 15, 14, tzinfo=UTC)]
    odd = _us_rules("Odd Time", "-0430", "-0330")
    result = parse_payload("ics", _floating("Odd Time", odd, *_event("jul", "DTSTART:20270715T090000")), source="s")
    assert result.rules == []
    (problem,) = result.problems
    assert problem.skipped and "read in the calendar's X-WR-TIMEZONE (line 4) 'Odd Time', which only its " \
        "VTIMEZONE defines, and no IANA zone has its offsets and transitions" in problem.message, problem


@pytest.mark.parametrize(("vtz", "summer"), [(EST_US, 13), (_us_rules("MST", "-0700", "-0600"), 15),
                                             (_us_rules("Customized Time Zone", "-0500", "-0400"), 13)])
def test_x_wr_timezone_defined_in_the_calendar_agrees_with_recurring_ical_events(vtz, summer):
    """Differential: a weekly floating series across the March change and a July one-off, read in the
    calendar's zone, give the instants recurring-ical-events gives for the same calendar written as RFC
    5545 has it (each time with a TZID of the definition). That TZID is a name of the calendar's own: the
    library reads ``TZID=EST`` as the fixed IANA zone whatever the VTIMEZONE says."""
    from deadline_pipeline_tests.differential import ours, reference

    name = vtz[1].removeprefix("TZID:")
    window = (datetime(2027, 1, 1, tzinfo=UTC), datetime(2028, 1, 1, tzinfo=UTC))
    written = _floating(name, vtz, *_event("series", "DTSTART:20270222T090000", "RRULE:FREQ=WEEKLY;COUNT=5"),
                        *_event("once", "DTSTART:20270715T090000"))
    standard = (written.decode().replace(f"X-WR-TIMEZONE:{name}\r\n", "")
                .replace(f"TZID:{name}\r\n", "TZID:Defined here\r\n")
                .replace("DTSTART:2027", "DTSTART;TZID=Defined here:2027")).encode()
    expected = reference(standard, window)
    assert ours(written, window) == expected
    # The reference read the definition: the series' occurrence after 14 March and the July one in summer.
    assert sum(expected.values()) == 6 and {("series", f"2027-03-15T{summer:02d}:00:00Z"),
                                            ("once", f"2027-07-15T{summer:02d}:00:00Z")} <= set(expected)


#: A VTIMEZONE under the IANA name America/Chicago that defines US Eastern time (UTC-05:00/-04:00).
CHICAGO_AS_EASTERN = _us_rules("America/Chicago", "-0500", "-0400")


def _chicago_as_eastern(zoned: bool) -> bytes:
    """Two one-off events and a series at 09:00, floating in ``X-WR-TIMEZONE:America/Chicago`` or, when
    ``zoned``, each written ``DTSTART;TZID=America/Chicago`` (and no X-WR-TIMEZONE)."""
    start = "DTSTART;TZID=America/Chicago:" if zoned else "DTSTART:"
    events = [*_event("jul", f"{start}20270715T090000"), *_event("jan", f"{start}20270115T090000"),
              *_event("series", f"{start}20270301T090000", "RRULE:FREQ=WEEKLY;COUNT=3")]
    return _calendar(*([] if zoned else ["X-WR-TIMEZONE:America/Chicago"]), *CHICAGO_AS_EASTERN, *events).encode()


def _without_lines(text: str) -> str:
    import re

    return re.sub(r"\(line \d+\)", "(line N)", text)


def test_x_wr_timezone_naming_an_iana_vtimezone_that_disagrees_notes_every_floating_component(tmp_path):
    """``X-WR-TIMEZONE:America/Chicago`` beside a VTIMEZONE ``TZID:America/Chicago`` defining US Eastern
    rules: the floating times are read in the IANA zone, as ``TZID=America/Chicago`` values are, and each
    component carries the note those values carry, in ``validate`` and ``occurrences --ics`` alike. Before,
    only the series had one (at its RRULE); the one-off times were read an hour away from the file's own
    definition without a word."""
    notes = {}
    for zoned in (True, False):
        result = parse_payload("ics", _chicago_as_eastern(zoned), source="s")
        assert {r.tz for r in result.rules} == {"America/Chicago"}
        assert {r.rule_id: _due(r)[0] for r in result.rules if r.rrule is None} == {
            "jul": datetime(2027, 7, 15, 14, tzinfo=UTC), "jan": datetime(2027, 1, 15, 15, tzinfo=UTC)}
        notes[zoned] = sorted((p.record_id, _without_lines(p.message)) for p in result.problems)
        assert not any(p.skipped for p in result.problems)
    assert notes[False] == notes[True]
    assert [uid for uid, _m in notes[False]] == ["jan", "jul", "series"]
    assert "disagrees with the zone of that name at DTSTART (line N) 2027-07-15T09:00:00: the calendar's " \
        "definition gives UTC-04:00, the IANA zone America/Chicago UTC-05:00" in notes[False][1][1]
    path = tmp_path / "cal.ics"
    path.write_bytes(_chicago_as_eastern(False))
    checked = CliRunner().invoke(main, ["validate", "--format", "ics", str(path)])
    assert checked.output.count("disagrees with the zone of that name at DTSTART") == 3, checked.output
    listed = CliRunner().invoke(main, ["occurrences", "--ics", str(path), "--after", "2027-01-01T00:00:00Z",
                                       "--before", "2028-01-01T00:00:00Z"])
    assert listed.exit_code == 0, listed.output
    warned = [line for line in listed.output.splitlines() if line.startswith("warning:")]
    assert len(warned) == 3 and all("disagrees with the zone of that name at DTSTART" in w for w in warned), warned


def test_x_wr_timezone_agreeing_or_not_in_force_adds_no_note():
    """The floating times are compared only where the calendar's zone reads them: a VTIMEZONE that agrees
    with the IANA zone, a component with a TZID of its own or a UTC time, and a calendar without
    X-WR-TIMEZONE (floating times in ``default_tz``) have no note."""
    agreeing = _us_rules("America/Chicago", "-0600", "-0500")
    floating = _event("jul", "DTSTART:20270715T090000")
    result = parse_payload("ics", _floating("America/Chicago", agreeing, *floating), source="s")
    assert result.problems == [] and len(result.rules) == 1
    for own in ("DTSTART;TZID=Europe/Berlin:20270715T090000", "DTSTART:20270715T090000Z"):
        result = parse_payload("ics", _floating("America/Chicago", CHICAGO_AS_EASTERN, *_event("x", own)),
                               source="s")
        assert result.problems == [] and len(result.rules) == 1, result.problems
    result = parse_payload("ics", _calendar(*CHICAGO_AS_EASTERN, *floating).encode(), source="s",
                           default_tz="America/Chicago")
    assert result.problems == [] and [r.tz for r in result.rules] == ["America/Chicago"]


def test_several_x_wr_timezone_lines_name_each_line_and_value():
    """Two X-WR-TIMEZONE lines with different values give the floating times no single zone: the
    components with one are skipped, the message naming both lines and values. Before, it printed the
    library's list (``[vUnknown(b'America/New_York'), …]``) and no line. Two with one value are that zone."""
    floating = _event("f", "DTSTART:20270715T090000")
    two = _calendar("X-WR-TIMEZONE:America/New_York", "X-WR-TIMEZONE:Europe/Berlin", *floating,
                    *_event("z", "DTSTART;TZID=Asia/Tokyo:20270715T090000")).encode()
    result = parse_payload("ics", two, source="s", default_tz="UTC")
    assert [r.rule_id for r in result.rules] == ["z"]
    (problem,) = result.problems
    assert problem.skipped and problem.record_id == "f"
    assert "the calendar has 2 X-WR-TIMEZONE lines (line 4 'America/New_York', line 5 'Europe/Berlin'): its " \
        "floating times have no single zone" in problem.message, problem.message
    assert "vUnknown" not in problem.message
    same = _calendar("X-WR-TIMEZONE:Europe/Berlin", "X-WR-TIMEZONE:Europe/Berlin", *floating).encode()
    result = parse_payload("ics", same, source="s")
    assert [r.tz for r in result.rules] == ["Europe/Berlin"] and result.problems == []


@pytest.mark.parametrize("written", ["X-WR-TIMEZONE:", "X-WR-TIMEZONE:   "])
def test_empty_x_wr_timezone_is_read_as_absent_with_a_note(tmp_path, written):
    """An empty X-WR-TIMEZONE names no zone: floating times are read as without one (``default_tz``, else
    each subscriber's zone), as before, but a note names the line, and ``occurrences --ics`` no longer says
    the calendar "declares no X-WR-TIMEZONE"."""
    payload = _calendar(written, *_event("f", "DTSTART:20270715T090000")).encode()
    for default, reading in ((None, "in each subscriber's zone"), ("Europe/Paris", "in default_tz 'Europe/Paris'")):
        result = parse_payload("ics", payload, source="s", default_tz=default)
        assert [r.tz for r in result.rules] == [default]
        assert [(p.position, p.message, p.skipped) for p in result.problems] == [(
            "line 4", "X-WR-TIMEZONE (line 4) is empty: floating times are read as if it were absent, i.e. "
            f"{reading}", False)]
    path = tmp_path / "cal.ics"
    path.write_bytes(payload)
    listed = CliRunner().invoke(main, ["occurrences", "--ics", str(path), "--after", "2027-01-01T00:00:00Z"])
    assert listed.exit_code != 0
    assert "X-WR-TIMEZONE (line 4) is empty" in listed.output, listed.output
    assert "declares no X-WR-TIMEZONE" not in listed.output
    assert "names no zone for them (no X-WR-TIMEZONE, or an empty one); give --tz" in listed.output, listed.output


def test_empty_x_wr_timezone_beside_only_zoned_values_is_no_note():
    """An empty X-WR-TIMEZONE in a calendar whose every value names its zone (a TZID, or UTC) decides
    nothing: no note, so ``validate`` does not call the file INVALID. Its VTIMEZONE's own DTSTART
    (local wall time of the zone) is not a floating value of the calendar."""
    zone = ("BEGIN:VTIMEZONE", "TZID:Europe/Berlin",
            "BEGIN:DAYLIGHT", "DTSTART:19700329T020000", "RRULE:FREQ=YEARLY;BYMONTH=3;BYDAY=-1SU",
            "TZOFFSETFROM:+0100", "TZOFFSETTO:+0200", "END:DAYLIGHT",
            "BEGIN:STANDARD", "DTSTART:19701025T030000", "RRULE:FREQ=YEARLY;BYMONTH=10;BYDAY=-1SU",
            "TZOFFSETFROM:+0200", "TZOFFSETTO:+0100", "END:STANDARD", "END:VTIMEZONE")
    payload = _calendar("X-WR-TIMEZONE:", *zone, *_event("f", "DTSTART;TZID=Europe/Berlin:20270715T090000"),
                        *_event("g", "DTSTART:20270716T090000Z")).encode()
    result = parse_payload("ics", payload, source="s")
    assert sorted(r.tz for r in result.rules) == ["Europe/Berlin", "UTC"] and result.problems == []


# --- an abbreviation out of its season ----------------------------------------------------------------

@pytest.mark.parametrize(("fmt", "payload", "shown"), [
    ("ics", _calendar(*_event("e", "DTSTART;TZID=PST:20270715T170000")),
     "VEVENT UID=e (line 4): start 2027-07-15T17:00:00 PST: PST is the standard (winter) time of "
     "America/Los_Angeles, which is on PDT (UTC-07:00) on 2027-07-15; read as written (UTC-08:00), the deadline "
     "is 1 hour later than at that clock time in America/Los_Angeles"),
    ("ics", _calendar(*_event("e", "DTSTART;TZID=CEST:20270115T170000")),
     "start 2027-01-15T17:00:00 CEST: CEST is the daylight saving (summer) time of Europe/Berlin, which is on "
     "CET (UTC+01:00) on 2027-01-15; read as written (UTC+02:00), the deadline is 1 hour earlier"),
    # A series in PST from January: its first occurrence in daylight time.
    ("ics", _calendar(*_event("e", "DTSTART;TZID=PST:20270115T170000", "RRULE:FREQ=MONTHLY;COUNT=4")),
     "the RRULE's occurrence 2027-03-15T17:00:00 PST: PST is the standard (winter) time of America/Los_Angeles"),
    ("csv", "id,title,due,timezone\nq2,Filing,2027-07-15T17:00,EST\n",
     "line 2: start 2027-07-15T17:00:00 EST: EST is the standard (winter) time of America/New_York, which is on EDT"),
])
def test_a_seasonal_abbreviation_out_of_season_is_read_as_written_with_a_note(fmt, payload, shown):
    """Read as the fixed offset written (the documented reading; never another instant guessed), with a
    note naming the record's line, the abbreviation and the season. Before, nothing was said."""
    result = parse_payload(fmt, payload.encode(), source="s")
    (rule,) = result.rules
    (note,) = result.problems
    assert not note.skipped and shown in str(note), note
    # The reading is unchanged: the wall time and the abbreviation as written (its fixed offset).
    assert rule.start.endswith("T17:00:00") and f" {rule.tz}: {rule.tz} is the " in str(note), rule


@pytest.mark.parametrize("props", [("DTSTART;TZID=PST:20270115T170000",), ("DTSTART;TZID=PDT:20270715T170000",),
                                   ("DTSTART;TZID=CET:20270715T170000",),
                                   ("DTSTART;TZID=PST:20270115T170000", "RRULE:FREQ=YEARLY;COUNT=3")])
def test_an_abbreviation_in_season_says_nothing(props):
    result = parse_payload("ics", _calendar(*_event("e", *props)).encode(), source="s")
    assert len(result.rules) == 1 and result.problems == []


def test_notes_on_zones_are_counted_in_rules_complete_of_a_real_run(tmp_path, pg_url):
    """Through a real run: both readings are kept (the rules planned), ``rules_complete`` stays green and
    counts the two notes in its summary and metadata, and ``run`` exits 0."""
    payload = _calendar(*OLD_US, *_event("vtz", "DTSTART;TZID=America/New_York:20270320T120000"),
                        *_event("pst", "DTSTART;TZID=PST:20270715T170000"), *OTHER)
    path = _config(tmp_path, payload)
    out = _run(tmp_path, path, pg_url, "2026-12-01T00:00:00Z")
    assert out.exit_code == 0, out.output
    line = _check_line(out.output, "rules_complete[cal]")
    assert "PASS" in line and "none skipped; 2 note(s) on readings kept" in line, line
    engine = make_engine(pg_url)
    try:
        check = rules_complete(engine, "cal")
        with engine.connect() as conn:
            planned = set(conn.execute(select(obligations.c.rule_id)).scalars())
    finally:
        engine.dispose()
    assert planned == {"vtz", "pst", "other"}
    assert check.metadata["notes_count"] == 2, check.metadata
    assert ["VTIMEZONE TZID=America/New_York (line 5) disagrees" in n["message"] or "PST is the standard (winter)"
            in n["message"] for n in check.metadata["notes"]] == [True, True], check.metadata["notes"]
