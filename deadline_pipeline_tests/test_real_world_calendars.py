"""Right instants on real-world calendars: RFC 5545 readings that common engines get wrong.

Each test names the rule it pins. Small calendars from public bug reports live in
``../shared/cases/calendar-and-yaml/`` and are checked against their stated right values.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from deadline_pipeline.ingest.parsers.ics import parse_ics
from deadline_pipeline.plan import occurrences as occ_mod
from deadline_pipeline.plan import vanished as vanished_mod
from deadline_pipeline.plan.occurrences import ExpansionBudgetExceeded, budget_problem, expand
from deadline_pipeline.plan.recurrence import apply_overrides
from deadline_pipeline.plan.rfc_series import series
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.timezones import resolve_zone

FAR_PAST = datetime(1990, 1, 1, tzinfo=UTC)
FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def returned_counts(monkeypatch, module, name: str) -> Counter:
    """Wrap ``module.name`` so the ``counts`` of every value it returns (or error it raises) add up
    in the Counter returned."""
    total: Counter = Counter()
    real = getattr(module, name)

    def counting(*args, **kwargs):
        try:
            got = real(*args, **kwargs)
        except ValueError as exc:
            total.update(getattr(exc, "counts", {}))
            raise
        total.update(got.counts)
        return got

    monkeypatch.setattr(module, name, counting)
    return total


def ics_instants(content: bytes, default_tz: str | None = None, **kw) -> list[tuple[str, datetime]]:
    result = parse_ics(content, source="t", default_tz=default_tz)
    out = []
    for rule in apply_overrides(result.rules):
        out += [(rule.rule_id, o.due_at) for o in expand(rule, resolve_zone(rule.tz or "UTC"),
                                                        after=kw.get("after", FAR_PAST),
                                                        before=kw.get("before", FAR_FUTURE))]
    return sorted(out, key=lambda p: (p[1], p[0]))


def calendar(*lines: str, head: tuple[str, ...] = ()) -> bytes:
    return ("\r\n".join(["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//t//EN", *head, *lines, "END:VCALENDAR"])
            + "\r\n").encode()


def event(uid: str, *props: str) -> list[str]:
    return ["BEGIN:VEVENT", f"UID:{uid}", "DTSTAMP:20260101T000000Z", "SUMMARY:s", *props, "END:VEVENT"]


@pytest.fixture(scope="module")
def bugcases(shared_dir):
    return shared_dir / "cases" / "calendar-and-yaml"


# --- class 1: DTSTART that does not match its RRULE ------------------------------------------------


def test_b01_dtstart_not_matching_rrule_is_the_first_instance_and_counts(bugcases):
    got = [d for _r, d in ics_instants((bugcases / "b01_dtstart_count.ics").read_bytes())]
    # RFC 5545 §3.8.5.3: DTSTART is the first instance and counts toward COUNT=3.
    assert got == [utc("2026-05-28T18:00:00Z"), utc("2026-06-03T18:00:00Z"), utc("2026-06-10T18:00:00Z")]


def test_dtstart_not_matching_without_count_is_kept_once():
    rule = RuleRecord("r", "t", "2026-05-28T20:00:00", "Europe/Berlin", "FREQ=WEEKLY;BYDAY=WE")
    got = [o.due_at for o in expand(rule, resolve_zone("Europe/Berlin"), after=FAR_PAST,
                                    before=utc("2026-06-12T00:00:00Z"))]
    assert got == [utc("2026-05-28T18:00:00Z"), utc("2026-06-03T18:00:00Z"), utc("2026-06-10T18:00:00Z")]


def test_dtstart_matching_its_rule_is_not_doubled():
    rule = RuleRecord("r", "t", "2026-06-03T20:00:00", "Europe/Berlin", "FREQ=WEEKLY;COUNT=2;BYDAY=WE")
    assert len(expand(rule, resolve_zone("Europe/Berlin"), after=FAR_PAST, before=FAR_FUTURE)) == 2


def test_count_1_with_mismatching_dtstart_is_dtstart_alone():
    rule = RuleRecord("r", "t", "2026-05-28T20:00:00", "Europe/Berlin", "FREQ=WEEKLY;COUNT=1;BYDAY=WE")
    got = [o.due_at for o in expand(rule, resolve_zone("Europe/Berlin"), after=FAR_PAST, before=FAR_FUTURE)]
    assert got == [utc("2026-05-28T18:00:00Z")]


# --- class 2: RDATE after UNTIL ----------------------------------------------------------------


def test_rdate_after_until_is_an_instance():
    content = calendar(*event("u", "DTSTART;TZID=Europe/Berlin:20200107T161500",
                              "RRULE:FREQ=WEEKLY;UNTIL=20200204T151459Z",
                              "RDATE;TZID=Europe/Berlin:20200204T161500"))
    got = [d for _r, d in ics_instants(content)]
    assert got[-1] == utc("2020-02-04T15:15:00Z")
    assert len(got) == 5  # 01-07, 01-14, 01-21, 01-28 from the RRULE, 02-04 from the RDATE


# --- class 2b: DTSTART after its RRULE's UNTIL (RFC 5545 §3.8.5.3: DTSTART is always an instance) ----

UNTIL_BEFORE_START = "RRULE:FREQ=WEEKLY;BYDAY=FR;UNTIL=20261201T000000Z"  # before Friday 1 January 2027


@pytest.mark.parametrize(("component", "props", "head", "due"), [
    # A DTSTART that matches its own rule (a Friday, BYDAY=FR), UNTIL a month before it.
    ("VEVENT", ("DTSTART:20270101T090000Z", UNTIL_BEFORE_START), (), "2027-01-01T09:00:00Z"),
    # UNTIL a second before DTSTART, without BYxxx parts.
    ("VEVENT", ("DTSTART:20270101T090000Z", "RRULE:FREQ=DAILY;UNTIL=20270101T085959Z"), (), "2027-01-01T09:00:00Z"),
    # A sub-daily rule, stepped in elapsed time.
    ("VEVENT", ("DTSTART:20270101T090000Z", "RRULE:FREQ=MINUTELY;UNTIL=20261201T000000Z"), (), "2027-01-01T09:00:00Z"),
    ("VEVENT", ("DTSTART;TZID=Europe/Berlin:20270101T090000", "RRULE:FREQ=DAILY;UNTIL=20270101T075959Z"), (),
     "2027-01-01T08:00:00Z"),
    # All-day: a DATE UNTIL the day before.
    ("VEVENT", ("DTSTART;VALUE=DATE:20270101", "RRULE:FREQ=YEARLY;UNTIL=20261231"), ("X-WR-TIMEZONE:Europe/Berlin",),
     "2027-01-01T22:59:59Z"),
    # Floating, read in the calendar's zone, with a floating UNTIL.
    ("VEVENT", ("DTSTART:20270101T090000", "RRULE:FREQ=DAILY;UNTIL=20261231T090000"),
     ("X-WR-TIMEZONE:America/New_York",), "2027-01-01T14:00:00Z"),
    # To-dos due a span after DTSTART: UNTIL names starts; the first is due that span after DTSTART.
    ("VTODO", ("DTSTART;TZID=America/New_York:20270101T090000", "DUE;TZID=America/New_York:20270105T170000",
               UNTIL_BEFORE_START), (), "2027-01-05T22:00:00Z"),
    ("VTODO", ("DTSTART;TZID=America/New_York:20270101T090000", "DURATION:P1D",
               "RRULE:FREQ=WEEKLY;UNTIL=20270101T135959Z"), (), "2027-01-02T14:00:00Z"),
    # A to-do with DUE alone recurs from its DUE.
    ("VTODO", ("DUE:20270101T090000Z", UNTIL_BEFORE_START), (), "2027-01-01T09:00:00Z"),
])
def test_dtstart_after_until_is_the_one_instance(component, props, head, due):
    """RFC 5545 §3.8.5.3 (and docs/source-formats.md): DTSTART is the first instance whatever UNTIL says.
    Before, a DTSTART matching its own rule after UNTIL gave no occurrence at all (dateutil yields
    nothing past UNTIL) while one outside its rule was kept: the deadline was never planned and
    ``validate`` said OK. The series stays bounded: nothing after DTSTART."""
    lines = [f"BEGIN:{component}", "UID:u", "DTSTAMP:20260101T000000Z", "SUMMARY:s", *props, f"END:{component}"]
    assert ics_instants(calendar(*lines, head=head)) == [("u", utc(due))]


def test_dtstart_after_until_keeps_its_rdates_and_is_taken_out_by_an_exdate():
    kept = calendar(*event("u", "DTSTART:20270101T090000Z", UNTIL_BEFORE_START, "RDATE:20270201T090000Z"))
    assert ics_instants(kept) == [("u", utc("2027-01-01T09:00:00Z")), ("u", utc("2027-02-01T09:00:00Z"))]
    excluded = calendar(*event("u", "DTSTART:20270101T090000Z", UNTIL_BEFORE_START, "EXDATE:20270101T090000Z"))
    assert ics_instants(excluded) == []


def test_dtstart_after_until_is_rolled_to_a_business_day_and_named_by_a_recurrence_id():
    """The business-day roll applies to it (1 January 2027 is a holiday: Monday 4 January), and
    ``has_occurrence`` finds it, so an override of it replaces it. Before, the override was dropped as
    naming an occurrence its series no longer has, and nothing was planned."""
    zone = resolve_zone("America/New_York")
    rule = RuleRecord("r", "t", "2027-01-01T09:00:00", "America/New_York", "FREQ=YEARLY;UNTIL=20261201T000000Z")
    rolled = expand(rule, zone, after=FAR_PAST, before=FAR_FUTURE, business_days=("US-IRS", "following"))
    assert [(o.period, o.due_at) for o in rolled] == [("2027-01-01T09:00:00", utc("2027-01-04T14:00:00Z"))]
    assert occ_mod.has_occurrence(rule, zone, "2027-01-01T09:00:00")
    content = calendar(*event("u", "DTSTART:20270101T090000Z", UNTIL_BEFORE_START),
                       *event("u", "RECURRENCE-ID:20270101T090000Z", "DTSTART:20270101T100000Z"))
    assert parse_ics(content, source="t").problems == []
    assert ics_instants(content) == [("u#2027-01-01T09:00:00Z", utc("2027-01-01T10:00:00Z"))]


def test_occurrences_prints_a_dtstart_after_until():
    """The user's command: ``deadline-pipeline occurrences`` printed nothing and exited 0."""
    from deadline_pipeline.cli import main

    for rrule in (UNTIL_BEFORE_START[len("RRULE:"):], "FREQ=DAILY;UNTIL=20270101T085959Z"):
        out = CliRunner().invoke(main, ["occurrences", "--dtstart", "20270101T090000Z", "--rrule", rrule,
                                        "--after", "2026-12-01T00:00:00Z"])
        assert (out.exit_code, out.output.split()) == (0, ["2027-01-01T09:00:00Z"]), out.output


def test_a_dtstart_after_until_is_ingested_and_planned(engine, tmp_path):
    """End to end: the user's event is ingested and its deadline planned (an obligation due at DTSTART).
    Before, ingest and planning succeeded with nothing planned for it."""
    from sqlalchemy import select

    from deadline_pipeline.config import load_config
    from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
    from deadline_pipeline.plan.service import plan_all
    from deadline_pipeline.store.schema import obligations
    from deadline_pipeline_tests.factories import write_config

    (tmp_path / "feed.ics").write_bytes(calendar(*event("filing@t", "DTSTART:20270101T090000Z",
                                                        UNTIL_BEFORE_START)))
    path = write_config(
        tmp_path, sources=[{"name": "feed", "format": "ics", "location": "feed.ics", "tenant": "t1",
                            "freshness": "P1D"}],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "America/New_York"}],
        subscriptions=[{"name": "all", "sources": ["feed"], "offsets": ["-P7D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}})
    cfg = load_config(path)[0]
    now = datetime(2026, 12, 1, tzinfo=UTC)
    fetch_snapshot(engine, cfg.sources[0], now)
    applied = apply_latest_snapshot(engine, cfg.sources[0], now)
    assert applied.status == "applied" and applied.skipped == 0, applied
    plan_all(engine, cfg, now)
    with engine.connect() as conn:
        rows = conn.execute(select(obligations.c.rule_id, obligations.c.due_at)
                            .where(obligations.c.rule_id == "filing@t")).all()
    assert [(r.rule_id, r.due_at.astimezone(UTC)) for r in rows] == [("filing@t", utc("2027-01-01T09:00:00Z"))]


# --- bounded expansion ---------------------------------------------------------------------------


def test_secondly_rule_from_a_past_start_jumps_to_the_window():
    rule = RuleRecord("s", "t", "2025-01-01T00:00:00", "UTC", "FREQ=SECONDLY")
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    t0 = time.perf_counter()
    got = expand(rule, UTC, after=now, before=now + timedelta(days=366), limit=3)
    assert time.perf_counter() - t0 < 1.0
    assert [o.due_at for o in got] == [now, now + timedelta(seconds=1), now + timedelta(seconds=2)]


def test_count_is_computed_across_the_jump():
    rule = RuleRecord("s", "t", "2026-01-01T00:00:00", "UTC", "FREQ=MINUTELY;INTERVAL=7;COUNT=33000")
    after = datetime(2026, 6, 1, tzinfo=UTC)
    got = expand(rule, UTC, after=after, before=FAR_FUTURE)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    # The last of 33000 occurrences is start + 32999 * 7 min, whatever the window.
    assert got[-1].due_at == start + timedelta(minutes=7 * 32999)
    assert (got[0].due_at - start) % timedelta(minutes=7) == timedelta(0) and got[0].due_at >= after
    assert got[0].due_at - after < timedelta(minutes=7)


def test_sub_daily_with_by_parts_jumps_in_whole_days():
    rule = RuleRecord("s", "t", "2000-01-03T09:00:00", "Europe/Berlin", "FREQ=HOURLY;INTERVAL=5;BYHOUR=9,14")
    after = datetime(2026, 3, 2, tzinfo=UTC)
    got = expand(rule, resolve_zone("Europe/Berlin"), after=after, before=after + timedelta(days=2))
    ref = [o for o in expand(rule, resolve_zone("Europe/Berlin"), after=datetime(2026, 2, 20, tzinfo=UTC),
                             before=after + timedelta(days=2)) if o.due_at >= after]
    assert got == ref and got


def test_rule_over_budget_is_skipped_loudly_and_others_still_expand(monkeypatch, caplog):
    monkeypatch.setattr(occ_mod, "MAX_STEPS", 1000)
    heavy = RuleRecord("heavy", "t", "2020-01-01T00:00:00", "UTC", "FREQ=SECONDLY;BYSECOND=0,30;COUNT=99999999")
    light = RuleRecord("light", "t", "2026-01-01T09:00:00", "UTC", "FREQ=DAILY")
    now = datetime(2026, 12, 1, tzinfo=UTC)
    with pytest.raises(ExpansionBudgetExceeded, match="rule 'heavy'.*more than 1000 steps") as raised:
        expand(heavy, UTC, after=now, before=now + timedelta(days=1))
    assert raised.value.counts["expansion_budget"] == 1
    assert "heavy" in caplog.text
    assert expand(light, UTC, after=now, before=now + timedelta(days=1))
    assert budget_problem(heavy, UTC, now=now) is not None
    assert budget_problem(light, UTC, now=now) is None


def test_planner_skips_a_rule_over_budget_alone(monkeypatch):
    from deadline_pipeline.plan.planner import Target, plan_target

    monkeypatch.setattr(occ_mod, "MAX_STEPS", 1000)
    target = Target(1, "s", "t", "UTC", 1, "src", None, ("*",), (0,), ("email",))
    heavy = RuleRecord("heavy", "t", "2020-01-01T00:00:00", "UTC", "FREQ=HOURLY;BYMINUTE=0,30;COUNT=99999999")
    light = RuleRecord("light", "t", "2026-12-01T09:00:00", "UTC")
    obligations, problems = plan_target(target, [(1, heavy), (1, light)], datetime(2026, 12, 1, tzinfo=UTC))
    assert [o.rule_id for o in obligations] == ["light"]
    assert [p.rule_id for p in problems] == ["heavy"] and "steps" in problems[0].message


def test_cli_secondly_count_answers_at_once():
    from deadline_pipeline.cli import main

    t0 = time.perf_counter()
    res = CliRunner().invoke(main, ["occurrences", "--dtstart", "20250101T000000Z", "--rrule", "FREQ=SECONDLY",
                                    "--count", "3"])
    assert res.exit_code == 0, res.output
    assert len(res.output.split()) == 3
    assert time.perf_counter() - t0 < 5


# --- class 3: zones defined inside the file ------------------------------------------------------


def test_b05_zone_defined_only_by_the_files_vtimezone(bugcases):
    content = (bugcases / "b05_custom_vtimezone.ics").read_bytes()
    result = parse_ics(content, source="t")
    assert not result.problems, result.problems
    (rule,) = result.rules
    assert rule.extra["tzid"] == "(GMT+01.00) Sarajevo/Warsaw/Zagreb"
    assert rule.tz in ("Europe/Sarajevo", "Europe/Warsaw", "Europe/Zagreb")
    assert [d for _r, d in ics_instants(content)] == [
        utc("2026-03-16T09:00:00Z"), utc("2026-03-23T09:00:00Z"), utc("2026-03-30T08:00:00Z"),
        utc("2026-04-06T08:00:00Z")]


def test_vtimezone_without_an_iana_equivalent_is_refused_clearly():
    vtz = ["BEGIN:VTIMEZONE", "TZID:Odd", "BEGIN:STANDARD", "DTSTART:16010101T030000", "TZOFFSETFROM:+0117",
           "TZOFFSETTO:+0117", "END:STANDARD", "END:VTIMEZONE"]
    content = calendar(*vtz, *event("o", "DTSTART;TZID=Odd:20260316T100000", "RRULE:FREQ=WEEKLY;COUNT=2"))
    result = parse_ics(content, source="t")
    assert not result.rules
    assert "no IANA zone has its offsets" in result.problems[0].message


def test_mozilla_style_tzid_in_a_calendar():
    content = calendar(*event("m", "DTSTART;TZID=/mozilla.org/20050126_1/Asia/Tokyo:20260316T100000"))
    assert [d for _r, d in ics_instants(content)] == [utc("2026-03-16T01:00:00Z")]


def test_cet_tzid_observes_summer_time():
    content = calendar(*event("c", "DTSTART;TZID=CET:20260716T100000"))
    assert [d for _r, d in ics_instants(content)] == [utc("2026-07-16T08:00:00Z")]


# --- class 4: folds, and one bad event among good ones ---------------------------------------------


def test_b04_fold_that_splits_a_utf8_character(bugcases):
    result = parse_ics((bugcases / "b04_fold_utf8.ics").read_bytes(), source="t")
    assert not result.problems
    (rule,) = result.rules
    assert "\u00fcberpr\u00fcfen" in rule.note
    assert [d for _r, d in ics_instants((bugcases / "b04_fold_utf8.ics").read_bytes())] == [
        utc("2026-07-15T10:00:00Z")]


def test_one_unreadable_event_is_reported_and_the_others_are_read():
    content = calendar(*event("good1", "DTSTART:20260101T100000Z"),
                       "BEGIN:VEVENT", "UID:bad", "DTSTART:20260102T100000Z",
                       "DTSTART;TZID=\"Europe/Berlin:20260104T100000",
                       "END:VEVENT",
                       *event("good2", "DTSTART:20260103T100000Z"))
    result = parse_ics(content, source="t")
    assert sorted(r.rule_id for r in result.rules) == ["good1", "good2"]
    (problem,) = result.problems
    assert problem.position == "VEVENT UID=bad (line 10)" and problem.message.startswith("component skipped")
    assert "Europe/Berlin:20260104T100000" in problem.message


@pytest.mark.parametrize(("line", "named"), [("X-NOTE;A=\"b\"c:d", "X-NOTE"),
                                             # A SUMMARY written with "=" for ":" (icalendar-tests' corpus).
                                             ("SUMMARY=testevent", "SUMMARY=testevent")])
def test_an_unreadable_line_of_no_consequence_is_reported_and_the_event_read(line, named):
    content = calendar(*event("e", "DTSTART:20260101T100000Z", line))
    result = parse_ics(content, source="t")
    assert [r.rule_id for r in result.rules] == ["e"]
    (note,) = result.problems
    assert not note.skipped and named in note.message


def test_unfolding_is_linear():
    # 6 MB of one folded DESCRIPTION: joined once, not re-concatenated per fold.
    fold = "\r\n " + "x" * 73
    content = calendar(*event("big", "DTSTART:20260101T100000Z", "DESCRIPTION:a" + fold * 80_000))
    t0 = time.perf_counter()
    (rule,) = parse_ics(content, source="t").rules
    assert time.perf_counter() - t0 < 5
    assert len(rule.note) == 1 + 73 * 80_000


# --- class 5: duplicate UIDs and overrides -------------------------------------------------------


def test_duplicate_uid_highest_sequence_wins_not_the_first():
    content = calendar(
        "BEGIN:VEVENT", "UID:d", "SEQUENCE:2", "DTSTAMP:20260102T000000Z", "DTSTART:20260301T100000Z", "END:VEVENT",
        "BEGIN:VEVENT", "UID:d", "SEQUENCE:1", "DTSTAMP:20260103T000000Z", "DTSTART:20260301T090000Z", "END:VEVENT",
        "BEGIN:VEVENT", "UID:d", "SEQUENCE:3", "DTSTAMP:20260101T000000Z", "DTSTART:20260301T120000Z", "END:VEVENT",
    )
    result = parse_ics(content, source="t")
    assert [r.start for r in result.rules] == ["2026-03-01T12:00:00"]
    assert len(result.problems) == 2 and all("superseded" in p.message for p in result.problems)


def test_duplicate_uid_same_sequence_latest_stamp_wins():
    content = calendar(
        "BEGIN:VEVENT", "UID:d", "DTSTAMP:20260105T000000Z", "DTSTART:20260301T100000Z", "END:VEVENT",
        "BEGIN:VEVENT", "UID:d", "DTSTAMP:20260101T000000Z", "LAST-MODIFIED:20260106T000000Z",
        "DTSTART:20260301T110000Z", "END:VEVENT",
    )
    assert [r.start for r in parse_ics(content, source="t").rules] == ["2026-03-01T11:00:00"]


def test_override_carrying_its_own_rrule_is_not_a_second_series():
    content = calendar(
        *event("m", "DTSTART;TZID=Europe/Berlin:20260105T090000", "RRULE:FREQ=WEEKLY;COUNT=4"),
        *event("m", "RECURRENCE-ID;TZID=Europe/Berlin:20260112T090000", "DTSTART;TZID=Europe/Berlin:20260113T100000",
               "RRULE:FREQ=WEEKLY;COUNT=4"),
    )
    got = [d for _r, d in ics_instants(content)]
    assert got == [utc("2026-01-05T08:00:00Z"), utc("2026-01-13T09:00:00Z"), utc("2026-01-19T08:00:00Z"),
                   utc("2026-01-26T08:00:00Z")]


def test_date_master_with_a_date_time_recurrence_id_replaces_that_date():
    content = calendar(
        *event("a", "DTSTART;VALUE=DATE:20260105", "RRULE:FREQ=WEEKLY;COUNT=3"),
        *event("a", "RECURRENCE-ID;TZID=GMT Standard Time:20260112T000000", "DTSTART;VALUE=DATE:20260114"),
        head=("X-WR-TIMEZONE:America/New_York",),
    )
    ny = resolve_zone("America/New_York")
    got = sorted(d.astimezone(ny).date().isoformat() for _r, d in ics_instants(content))
    # 01-12 is replaced by 01-14 (no ghost on 01-12); the zone of the RECURRENCE-ID does not matter.
    assert got == ["2026-01-05", "2026-01-14", "2026-01-19"]


def test_validate_refuses_a_rule_over_the_expansion_budget(tmp_path, monkeypatch):
    from deadline_pipeline.cli import main

    monkeypatch.setattr(occ_mod, "MAX_STEPS", 1000)
    path = tmp_path / "feed.ics"
    path.write_bytes(calendar(*event("heavy", "DTSTART:20200101T000000Z",
                                     "RRULE:FREQ=HOURLY;BYMINUTE=0,30;COUNT=99999999"),
                              *event("light", "DTSTART:20300101T000000Z")))
    res = CliRunner().invoke(main, ["validate", "--format", "ics", str(path)])
    assert res.exit_code != 0
    assert "rule 'heavy'" in res.output and "steps" in res.output and "INVALID" in res.output


def test_validate_refuses_a_rule_cut_at_the_occurrence_cap(tmp_path):
    """A MINUTELY rule without a practical end holds more than the cap (5000) in the horizon:
    planning would plan only up to the cut, so ``validate`` exits 1 naming the rule, the cap and
    where expansion stops (it printed the ERROR log line and then ``OK``)."""
    from deadline_pipeline.cli import main

    path = tmp_path / "feed.ics"
    path.write_bytes(calendar(*event("minutely@c", "DTSTART:20200101T000000Z",
                                     "RRULE:FREQ=MINUTELY;UNTIL=99991231T000000Z"),
                              *event("light", "DTSTART:20300101T000000Z")))
    res = CliRunner().invoke(main, ["validate", "--format", "ics", str(path)])
    assert res.exit_code == 1, res.output
    assert f"{path}: rule 'minutely@c': more than 5000 occurrences (the expansion cap)" in res.output, res.output
    assert "expansion stopped at" in res.output and "are not planned" in res.output
    assert "INVALID: 1 problem(s), 2 rule(s) readable" in res.output and "OK" not in res.output


# --- class 8: BYSETPOS with WKST, BYWEEKNO across New Year (checked against the RFC by brute force) --

DAYS = ["MO", "TU", "WE", "TH", "FR", "SA", "SU"]


def _iso_like_week(day, wkst):
    """RFC 5545 week of ``day``, by brute force: the week holding January 4th is week 1."""
    start = day - timedelta(days=(day.weekday() - wkst) % 7)
    year = (start + timedelta(days=3)).year
    jan4 = datetime(year, 1, 4).date()
    first = jan4 - timedelta(days=(jan4.weekday() - wkst) % 7)
    nxt = datetime(year + 1, 1, 4).date()
    following = nxt - timedelta(days=(nxt.weekday() - wkst) % 7)
    return (start - first).days // 7 + 1, (following - first).days // 7


@pytest.mark.parametrize("wkst", [0, 2, 6])
@pytest.mark.parametrize("weekno", [1, 52, 53, -1])
@pytest.mark.parametrize("weekday", [0, 6])
def test_byweekno_across_new_year_matches_the_rfc(wkst, weekno, weekday):
    from deadline_pipeline.plan.recurrence import validate_rrule

    recur = validate_rrule(f"FREQ=YEARLY;BYWEEKNO={weekno};BYDAY={DAYS[weekday]};WKST={DAYS[wkst]}")
    got = [x.date() for x in series(recur, datetime(2015, 1, 5, 9), until=datetime(2035, 1, 1))]
    expected, day = [], datetime(2015, 1, 5).date()
    while day.year < 2035:
        week, weeks = _iso_like_week(day, wkst)
        if day.weekday() == weekday and weekno in (week, week - weeks - 1):
            expected.append(day)
        day += timedelta(days=1)
    assert got == expected


def test_byweekno_53_only_in_years_that_have_one():
    rule = RuleRecord("w", "t", "2020-12-28T09:00:00", "UTC", "FREQ=YEARLY;BYWEEKNO=53;BYDAY=MO,SU;COUNT=4")
    got = [o.due_at.date().isoformat() for o in expand(rule, UTC, after=FAR_PAST, before=FAR_FUTURE)]
    # dateutil gave 2022-01-02 (week 52 of 2021) as a "week 53" day and let it consume COUNT.
    assert got == ["2020-12-28", "2021-01-03", "2026-12-28", "2027-01-03"]


@pytest.mark.parametrize("wkst", [0, 6])
@pytest.mark.parametrize("days, pos", [(("MO", "WE", "FR"), 2), (("SU", "MO"), 1), (("TU", "SA", "SU"), -1)])
@pytest.mark.parametrize("offset", range(7))
def test_weekly_bysetpos_counts_positions_from_wkst(wkst, days, pos, offset):
    from deadline_pipeline.plan.recurrence import validate_rrule

    start = datetime(2026, 1, 5 + offset, 9)
    end = datetime(2026, 3, 1)
    recur = validate_rrule(f"FREQ=WEEKLY;BYDAY={','.join(days)};BYSETPOS={pos};WKST={DAYS[wkst]}")
    got = list(series(recur, start, until=end))
    expected, week = [], start.date() - timedelta(days=(start.weekday() - wkst) % 7)
    while week < end.date():
        chosen = [d for d in (week + timedelta(days=i) for i in range(7)) if DAYS[d.weekday()] in days]
        pick = datetime.combine(chosen[pos - 1 if pos > 0 else pos], start.time())
        if start <= pick <= end:
            expected.append(pick)
        week += timedelta(days=7)
    assert got == expected


def test_weekly_bysetpos_from_a_mid_week_dtstart():
    rule = RuleRecord("p", "t", "2026-01-07T09:00:00", "UTC", "FREQ=WEEKLY;BYDAY=MO,WE,FR;BYSETPOS=2;COUNT=3")
    got = [o.due_at.date().isoformat() for o in expand(rule, UTC, after=FAR_PAST, before=FAR_FUTURE)]
    # The week of 2026-01-05 is {Mo 5, We 7, Fr 9}: position 2 is the DTSTART itself, not Friday 9th.
    assert got == ["2026-01-07", "2026-01-14", "2026-01-21"]


# --- class 9: a UTC time written with a TZID (RFC 5545 §3.3.5: the TZID is not applied) ----------

CALENDARS = Path(__file__).with_name("calendars")


def test_a_utc_time_with_a_tzid_is_that_utc_time():
    """``DTSTART;TZID=Europe/Berlin:20260725T121500Z`` was read as 12:15 Berlin wall time (10:15Z)."""
    content = calendar(*event("u", "DTSTART;TZID=Europe/Berlin:20260725T121500Z"))
    result = parse_ics(content, source="t")
    assert ics_instants(content) == [("u", utc("2026-07-25T12:15:00Z"))]
    [note] = result.problems
    assert (note.position, note.skipped) == ("line 8", False)
    assert "DTSTART;TZID=Europe/Berlin:20260725T121500Z" in note.message and "§3.3.5" in note.message


def test_a_date_with_a_z_and_a_tzid_is_skipped_with_one_message_not_noted_as_a_utc_time():
    """``DTSTART;TZID=America/New_York:20270310Z`` is neither a DATE nor a UTC DATE-TIME: the component is
    skipped. It was also noted as "read as the UTC time written", two messages about one line that
    contradicted each other."""
    result = parse_ics(calendar(*event("z", "DTSTART;TZID=America/New_York:20270310Z")), source="t")
    assert result.rules == []
    assert [p.skipped for p in result.problems] == [True], result.problems
    assert "20270310Z" in result.problems[0].message


def test_due_exdate_and_recurrence_id_in_utc_with_a_tzid_are_utc_too():
    """The same reading for a to-do's DUE, an EXDATE and a RECURRENCE-ID: before, the DUE was 4 h
    late, the EXDATE excluded nothing (a reminder for an excluded date) and the override named no
    occurrence (a reminder at the old time and one at the new)."""
    got = ics_instants((CALENDARS / "utc_times_with_tzid.ics").read_bytes())
    assert [(rid.split("#")[0], d.isoformat()) for rid, d in got] == [
        ("utc-exdate@tests", "2026-01-05T14:00:00+00:00"),
        ("utc-exdate@tests", "2026-01-19T14:00:00+00:00"),
        ("utc-due@tests", "2026-04-15T17:00:00+00:00"),
        ("utc-override@tests", "2026-07-06T10:00:00+00:00"),
        ("utc-override@tests", "2026-07-14T10:00:00+00:00"),
        ("utc-override@tests", "2026-07-20T10:00:00+00:00"),
        ("utc-dtstart@tests", "2026-07-25T12:15:00+00:00"),
    ]


def test_a_mixed_exdate_line_reads_each_value_in_its_own_form():
    content = calendar(*event("m", "DTSTART;TZID=Europe/Berlin:20260105T090000", "RRULE:FREQ=DAILY;COUNT=4",
                              "EXDATE;TZID=Europe/Berlin:20260106T080000Z,20260107T090000"))
    assert [d for _r, d in ics_instants(content)] == [utc("2026-01-05T08:00:00Z"), utc("2026-01-08T08:00:00Z")]


def test_until_bounds_the_utc_instants_of_a_utc_dtstart_with_a_tzid():
    # 12:15Z daily until 11:30Z on the 27th: two instances (read as Berlin wall time, the 27th's
    # 10:15Z fell inside UNTIL and made three).
    content = calendar(*event("u", "DTSTART;TZID=Europe/Berlin:20260725T121500Z",
                              "RRULE:FREQ=DAILY;UNTIL=20260727T113000Z"))
    assert [d for _r, d in ics_instants(content)] == [utc("2026-07-25T12:15:00Z"), utc("2026-07-26T12:15:00Z")]


def test_validate_names_the_line_of_a_utc_time_with_a_tzid(tmp_path):
    from deadline_pipeline.cli import main

    path = tmp_path / "feed.ics"
    path.write_bytes(calendar(*event("u", "DTSTART;TZID=Europe/Berlin:20260725T121500Z")))
    res = CliRunner().invoke(main, ["validate", "--format", "ics", str(path)])
    assert res.exit_code == 1, res.output
    assert f"{path}: line 8: DTSTART;TZID=Europe/Berlin:20260725T121500Z is a UTC time" in res.output
    assert "INVALID: 1 problem(s), 1 rule(s) readable" in res.output


# --- class 10: completed to-dos (RFC 5545 §3.8.1.11, §3.8.2.1, §3.8.1.8) -------------------------


def todo(uid: str, *props: str) -> list[str]:
    return ["BEGIN:VTODO", f"UID:{uid}", "DTSTAMP:20260101T000000Z", "SUMMARY:s", *props, "END:VTODO"]


def test_a_completed_occurrence_of_a_recurring_todo_is_not_reminded(monkeypatch):
    """Before, STATUS:COMPLETED was not read: the completed occurrence was reminded, and for a task
    with DTSTART 09:00 and DUE 17:00 (as Thunderbird writes it) the override named no occurrence, so
    the master's 17:00 reminder went out next to the override's."""
    folded = returned_counts(monkeypatch, sys.modules[__name__], "apply_overrides")
    got = ics_instants((CALENDARS / "completed_todos.ics").read_bytes())
    assert [(rid, d.isoformat()) for rid, d in got] == [
        ("timesheet@tests", "2024-08-05T15:00:00+00:00"),
        ("timesheet@tests", "2024-08-19T15:00:00+00:00"),
        ("timesheet@tests", "2024-08-26T15:00:00+00:00"),
        ("payroll@tests", "2026-01-05T22:00:00+00:00"),
        ("payroll@tests", "2026-01-19T22:00:00+00:00"),
        ("open@tests", "2026-04-30T16:00:00+00:00"),
    ]
    assert folded["cancelled_occurrences"] == 2


@pytest.mark.parametrize("says", ["STATUS:COMPLETED", "COMPLETED:20260320T101500Z", "PERCENT-COMPLETE:100"])
def test_a_completed_todo_is_withdrawn_with_a_note(says):
    content = calendar(*todo("done", "DUE;TZID=Europe/London:20260331T170000", says),
                       *todo("open", "DUE;TZID=Europe/London:20260430T170000"),
                       # An explicit open STATUS wins over a COMPLETED date left behind by a reopened to-do.
                       *todo("reopened", "DUE:20260331T170000Z", "STATUS:NEEDS-ACTION", "COMPLETED:20260320T101500Z"))
    result = parse_ics(content, source="t")
    assert [r.rule_id for r in result.rules] == ["open", "reopened"]
    [note] = result.problems
    assert (note.record_id, note.skipped) == ("done", False)
    assert note.message == f"completed ({says}): not in force, its reminders are withdrawn"


def test_a_completed_series_is_withdrawn_but_a_completion_date_on_its_master_is_only_a_note():
    done = calendar(*todo("s", "DUE:20260105T170000Z", "RRULE:FREQ=WEEKLY;COUNT=3", "STATUS:COMPLETED"),
                    *todo("s", "RECURRENCE-ID:20260112T170000Z", "DUE:20260113T170000Z"))
    result = parse_ics(done, source="t")
    assert result.rules == []
    assert [(p.record_id, p.message) for p in result.problems] == [
        ("s", "completed (STATUS:COMPLETED): not in force, its reminders are withdrawn"),
        ("s#2026-01-12T17:00:00Z", "an override of a series that is completed (STATUS:COMPLETED): not in force, "
                                   "its reminders are withdrawn")]
    # A COMPLETED date cannot say which occurrence was done: every occurrence stays, loudly.
    dated = calendar(*todo("s", "DUE:20260105T170000Z", "RRULE:FREQ=WEEKLY;COUNT=3", "COMPLETED:20260106T090000Z"))
    result = parse_ics(dated, source="t")
    assert len(ics_instants(dated)) == 3
    [note] = result.problems
    assert (note.record_id, note.skipped) == ("s", False) and "stays in force" in note.message


# --- class 11: an override of an occurrence its series no longer has (RFC 5545 §3.8.4.4) ----------


def revision(uid: str, sequence: int, *props: str, stamp: str = "20240801T000000Z") -> list[str]:
    return ["BEGIN:VEVENT", f"UID:{uid}", f"SEQUENCE:{sequence}", f"DTSTAMP:{stamp}", "SUMMARY:s", *props, "END:VEVENT"]


def test_an_override_of_an_occurrence_its_series_deleted_is_withdrawn_with_a_note(monkeypatch):
    """The series at SEQUENCE 1, its override of 2024-08-19, then the series at SEQUENCE 2 with that
    date as an EXDATE: before, 2024-08-19 stayed planned as rule ``w#2024-08-19`` and its reminder
    went out for an occurrence its owner had deleted."""
    content = calendar(
        *revision("w", 1, "DTSTART;VALUE=DATE:20240805", "RRULE:FREQ=WEEKLY;COUNT=5"),
        *revision("w", 1, "RECURRENCE-ID;VALUE=DATE:20240819", "DTSTART;VALUE=DATE:20240819"),
        *revision("w", 2, "DTSTART;VALUE=DATE:20240805", "RRULE:FREQ=WEEKLY;COUNT=5", "EXDATE;VALUE=DATE:20240819",
                  stamp="20240810T000000Z"),
    )
    counts = returned_counts(monkeypatch, vanished_mod, "vanished_overrides")
    result = parse_ics(content, source="t", default_tz="UTC")
    assert [r.rule_id for r in result.rules] == ["w"]
    note = result.problems[-1]
    assert (note.position, note.record_id, note.skipped) == ("VEVENT UID=w (line 12)", "w#2024-08-19", False)
    assert note.message == ("an override of 2024-08-19, which the series in force excludes (EXDATE): not in force, "
                            "its reminders are withdrawn")
    assert counts["vanished_overrides"] == 1
    got = [d.date().isoformat() for _r, d in ics_instants(content, default_tz="UTC")]
    assert got == ["2024-08-05", "2024-08-12", "2024-08-26", "2024-09-02"]


def test_overrides_outlive_no_until_count_or_rrule_change_but_moves_and_rdates_stay():
    """Every way a revised series stops having an occurrence (UNTIL, COUNT, a changed RRULE) drops its
    override; an override that moves its occurrence, or replaces one an RDATE adds, stays."""
    content = (CALENDARS / "overrides_of_deleted_occurrences.ics").read_bytes()
    result = parse_ics(content, source="t", default_tz="UTC")
    dropped = [p.record_id for p in result.problems if "series in force" in p.message]
    assert dropped == ["exdate@tests#2024-08-19", "until@tests#2024-08-19", "count@tests#2024-08-19T13:00:00Z",
                       "rrule@tests#2024-08-12T13:00:00Z"]
    got = [(rid, d.isoformat()) for rid, d in ics_instants(content, default_tz="UTC")
           if rid.split("#")[0] in ("moved@tests", "rdate@tests", "until@tests", "rrule@tests")]
    assert got == [
        ("moved@tests", "2024-08-05T23:59:59+00:00"), ("rdate@tests", "2024-08-05T23:59:59+00:00"),
        ("until@tests", "2024-08-05T23:59:59+00:00"), ("rrule@tests", "2024-08-06T13:00:00+00:00"),
        ("rdate@tests", "2024-08-12T23:59:59+00:00"), ("until@tests", "2024-08-12T23:59:59+00:00"),
        ("rrule@tests", "2024-08-13T13:00:00+00:00"), ("moved@tests#2024-08-12", "2024-08-14T23:59:59+00:00"),
        ("moved@tests", "2024-08-19T23:59:59+00:00"), ("rrule@tests", "2024-08-20T13:00:00+00:00"),
        ("rdate@tests#2024-09-01", "2024-09-02T23:59:59+00:00"),
    ]


def test_a_thisandfuture_override_stays_while_the_series_goes_on_after_it():
    """Its own occurrence excluded, a RANGE=THISANDFUTURE override still changes every later one; it
    goes only when the series has nothing from there on."""
    def feed(series_end: str) -> bytes:
        return calendar(
            *event("t", "DTSTART;TZID=Europe/Berlin:20260105T090000", series_end,
                   "EXDATE;TZID=Europe/Berlin:20260112T090000"),
            *event("t", "RECURRENCE-ID;RANGE=THISANDFUTURE;TZID=Europe/Berlin:20260112T090000",
                   "DTSTART;TZID=Europe/Berlin:20260112T100000"))

    assert [d for _r, d in ics_instants(feed("RRULE:FREQ=WEEKLY;COUNT=3"))] == [
        utc("2026-01-05T08:00:00Z"), utc("2026-01-19T09:00:00Z")]
    ended = parse_ics(feed("RRULE:FREQ=WEEKLY;UNTIL=20260111T000000Z"), source="t")
    assert [r.rule_id for r in ended.rules] == ["t"]
    assert "2026-01-12T09:00:00 and every later occurrence" in ended.problems[-1].message


def test_validate_lists_each_override_its_series_no_longer_has(tmp_path):
    from deadline_pipeline.cli import main

    path = CALENDARS / "overrides_of_deleted_occurrences.ics"
    res = CliRunner().invoke(main, ["validate", "--format", "ics", "--timezone", "UTC", str(path)])
    assert res.exit_code == 1, res.output
    assert (f"{path}: VEVENT UID=exdate@tests (line 12): an override of 2024-08-19, which the series in force "
            "excludes (EXDATE): not in force, its reminders are withdrawn") in res.output
    assert res.output.count("which the series in force") == 4


def test_an_override_whose_series_cannot_be_expanded_is_kept_and_counted(monkeypatch):
    """Not knowing whether the series still has the occurrence keeps the override (a duplicate
    reminder at worst, never a missed one), logged and counted."""
    monkeypatch.setattr(occ_mod, "MAX_STEPS", 1000)
    content = calendar(*event("heavy", "DTSTART:20200101T000000Z", "RRULE:FREQ=HOURLY;BYMINUTE=0,30;COUNT=99999999"),
                       *event("heavy", "RECURRENCE-ID:20260301T120000Z", "DTSTART:20260301T123000Z"))
    counts = returned_counts(monkeypatch, vanished_mod, "vanished_overrides")
    result = parse_ics(content, source="t")
    assert [r.rule_id for r in result.rules] == ["heavy", "heavy#2026-03-01T12:00:00Z"]
    assert counts["override_checks_failed"] == 1


def test_the_overrides_of_an_endless_dense_series_are_checked_without_a_truncation_logged(monkeypatch):
    """An override of 12:15 in a series of :00 and :30 is dropped; those of occurrences it has, one of
    them past the 5000 occurrences checked at once, stay. The check looks at the overrides' dates, not
    at a planning window: it counts and logs no truncation and no cut (checks read those counters)."""
    content = calendar(*event("dense", "DTSTART:20200101T000000Z", "RRULE:FREQ=HOURLY;BYMINUTE=0,30"),
                       *event("dense", "RECURRENCE-ID:20200105T120000Z", "DTSTART:20200105T123000Z"),
                       *event("dense", "RECURRENCE-ID:20260301T120000Z", "DTSTART:20260301T123000Z"),
                       *event("dense", "RECURRENCE-ID:20260301T121500Z", "DTSTART:20260301T124500Z"))
    vanished = returned_counts(monkeypatch, vanished_mod, "vanished_overrides")
    expanded = returned_counts(monkeypatch, occ_mod, "expansion")
    result = parse_ics(content, source="t")
    assert [r.rule_id for r in result.rules] == ["dense", "dense#2020-01-05T12:00:00Z", "dense#2026-03-01T12:00:00Z"]
    assert [p.record_id for p in result.problems] == ["dense#2026-03-01T12:15:00Z"]
    assert (expanded["horizon_truncations"], expanded["occurrence_cap"], vanished["vanished_overrides"]) == (0, 0, 1)


# --- class 12: a to-do's DURATION (RFC 5545 §3.6.2, §3.8.2.5; nominal days, exact hours: §3.3.6) --


def test_a_todo_with_dtstart_and_duration_is_due_at_their_sum():
    """DTSTART 17:00 Berlin + P1D is due 17:00 the next day. Before, DURATION was not read and the to-do
    was due at its DTSTART: reminders came a day early, and a PT0S one said "due now" a day early."""
    content = calendar(*todo("i2", "DTSTART;TZID=Europe/Berlin:20270302T170000", "DURATION:P1D"))
    result = parse_ics(content, source="t")
    [rule] = result.rules
    assert (rule.start, rule.tz, result.problems) == ("2027-03-03T17:00:00", "Europe/Berlin", [])
    assert ics_instants(content) == [("i2", utc("2027-03-03T16:00:00Z"))]


@pytest.mark.parametrize(("dtstart", "duration", "head", "start", "due"), [
    # Nominal days keep the wall time across the spring-forward night of 2027-03-28 (23 hours)...
    ("DTSTART;TZID=Europe/Berlin:20270327T170000", "P1D", (), "2027-03-28T17:00:00", "2027-03-28T15:00:00Z"),
    # ...exact hours do not: 24 hours after 16:00Z is 16:00Z, 18:00 summer time.
    ("DTSTART;TZID=Europe/Berlin:20270327T170000", "PT24H", (), "2027-03-28T18:00:00", "2027-03-28T16:00:00Z"),
    # Days first, then hours (§3.3.6): 17:00 the next day, then one hour.
    ("DTSTART;TZID=Europe/Berlin:20270327T170000", "P1DT1H", (), "2027-03-28T18:00:00", "2027-03-28T16:00:00Z"),
    ("DTSTART:20270302T170000Z", "PT2H", (), "2027-03-02T19:00:00", "2027-03-02T19:00:00Z"),
    # Two exact hours over the skipped hour are 04:30 summer time, not the wall clock's 03:30.
    ("DTSTART;TZID=Europe/Berlin:20270328T013000", "PT2H", (), "2027-03-28T04:30:00", "2027-03-28T02:30:00Z"),
    # A floating time: the same, read in the calendar's zone (the rule stays floating in it).
    ("DTSTART:20270328T013000", "PT2H", ("X-WR-TIMEZONE:Europe/Berlin",), "2027-03-28T04:30:00",
     "2027-03-28T02:30:00Z"),
    # A date start + P1D spans that day and ends as the next begins (as an all-day event's DTEND): due at
    # the end of the start day; P2D at the end of the day after; P1W at the end of its seventh day.
    ("DTSTART;VALUE=DATE:20270302", "P1D", ("X-WR-TIMEZONE:Europe/Berlin",), "2027-03-02", "2027-03-02T22:59:59Z"),
    ("DTSTART;VALUE=DATE:20270302", "P2D", ("X-WR-TIMEZONE:Europe/Berlin",), "2027-03-03", "2027-03-03T22:59:59Z"),
    ("DTSTART;VALUE=DATE:20270302", "P1W", ("X-WR-TIMEZONE:Europe/Berlin",), "2027-03-08", "2027-03-08T22:59:59Z"),
])
def test_duration_days_are_calendar_days_and_hours_are_exact(dtstart, duration, head, start, due):
    content = calendar(*todo("d", dtstart, f"DURATION:{duration}"), head=head)
    result = parse_ics(content, source="t")
    assert ([r.start for r in result.rules], result.problems) == ([start], [])
    assert ics_instants(content) == [("d", utc(due))]


def test_a_recurring_todo_with_a_duration_is_due_a_duration_after_each_start_and_its_overrides_name_their_dtstart():
    """Each instance is due a DURATION after its start, and a RECURRENCE-ID (an instance's DTSTART,
    §3.8.4.4) names the occurrence due a DURATION later. Before, each was reminded a day early, and
    the completed occurrence too."""
    content = calendar(
        *todo("w", "DTSTART;TZID=Europe/Berlin:20270301T170000", "DURATION:P1D", "RRULE:FREQ=WEEKLY;COUNT=3"),
        *todo("w", "RECURRENCE-ID;TZID=Europe/Berlin:20270308T170000", "DTSTART;TZID=Europe/Berlin:20270308T170000",
              "DURATION:P1D", "STATUS:COMPLETED"))
    assert ics_instants(content) == [("w", utc("2027-03-02T16:00:00Z")), ("w", utc("2027-03-16T16:00:00Z"))]


@pytest.mark.parametrize("props", [
    ("DUE;TZID=America/New_York:20260306T170000", "RRULE:FREQ=WEEKLY;UNTIL=20260316T130000Z"),
    ("DURATION:P4DT8H", "RRULE:FREQ=WEEKLY;UNTIL=20260316T130000Z"),
    ("DUE;TZID=America/New_York:20260306T170000", "RRULE:FREQ=WEEKLY;BYDAY=MO;COUNT=3"),
    ("DUE;TZID=America/New_York:20260306T170000", "RRULE:FREQ=WEEKLY;COUNT=3",
     "EXDATE;TZID=America/New_York:20260309T090000", "RDATE;TZID=America/New_York:20260325T090000"),
    ("DUE;TZID=America/New_York:20260306T170000", "RRULE:FREQ=MONTHLY;BYDAY=1MO;COUNT=4"),
    # A THISANDFUTURE override moving the series three hours earlier from 9 March on: its due times
    # move with it (they were rebuilt from the unshifted labels, three hours late).
    ("DUE;TZID=America/New_York:20260306T170000", "RRULE:FREQ=WEEKLY;COUNT=4", "END:VTODO", "BEGIN:VTODO",
     "UID:w", "DTSTAMP:20260101T000000Z", "SUMMARY:s", "RECURRENCE-ID;RANGE=THISANDFUTURE;TZID=America/New_York:"
     "20260309T090000", "DTSTART;TZID=America/New_York:20260309T060000", "DUE;TZID=America/New_York:20260313T140000"),
])
def test_a_recurring_todo_recurs_from_its_dtstart_and_is_due_the_same_span_after_each(props):
    """RFC 5545 §3.8.5.3: the recurrence set is generated from DTSTART (the RRULE's UNTIL and BYxxx, RDATE
    and EXDATE name starts), and the span DUE or DURATION gives applies to every instance; compared with
    recurring-ical-events. Stepped from the first due time, the instance starting at UNTIL was cut
    (its due time is after it, so the last week was never reminded), BYDAY=MO made Monday the due day
    of a task due on Fridays, an EXDATE naming a start excluded nothing and an RDATE was due at its start."""
    import icalendar
    import recurring_ical_events

    content = calendar(*todo("w", "DTSTART;TZID=America/New_York:20260302T090000", *props))
    reference = recurring_ical_events.of(icalendar.Calendar.from_ical(content), components=["VTODO"]).between(
        datetime(2026, 1, 1), datetime(2027, 1, 1))
    expected = sorted(("w", (o.get("DUE").dt if o.get("DUE") else o.get("DTSTART").dt + o.get("DURATION").dt)
                       .astimezone(UTC)) for o in reference)
    # Our ids name an override's pieces apart; the reference's instants are compared.
    ours = [("w", instant) for _rid, instant in ics_instants(content)]
    assert len(expected) >= 3, expected
    assert ours == expected


@pytest.mark.parametrize(("props", "message"), [
    (("DTSTART:20270302T170000Z", "DUE:20270303T170000Z", "DURATION:P1D"),
     "DUE (line 9) and DURATION (line 10) in one to-do, which RFC 5545 §3.6.2 forbids (due at the DUE, or at "
     "DTSTART + DURATION?); the due instant is ambiguous"),
    (("DTSTART:20270302T170000Z", "DURATION:-P1D"),
     "DURATION -P1D is negative: the to-do would be due before its DTSTART, which RFC 5545 §3.8.2.3 forbids; the "
     "due instant is unknown"),
    (("DTSTART;VALUE=DATE:20270302", "DURATION:PT12H"),
     "DURATION PT12H has hours, minutes or seconds but DTSTART 2027-03-02 is a DATE, whose due time is a date too "
     "(RFC 5545 §3.8.2.3); the due instant is unknown"),
    (("DTSTART:20270302T170000Z", "DURATION:P1D", "DURATION:P2D"),
     "DURATION appears 2 times (RFC 5545 allows it once); the due instant is ambiguous"),
])
def test_a_todo_whose_duration_leaves_its_due_instant_unknown_is_a_skipped_record(props, message):
    """Not planned at either reading (before, at its DTSTART, or at its DUE without a word): skipped,
    so its last good version stays in force, and the publisher is told which lines to fix."""
    content = calendar(*todo("bad", *props), *todo("good", "DUE:20270401T170000Z"))
    result = parse_ics(content, source="t")
    assert [r.rule_id for r in result.rules] == ["good"]
    [problem] = result.problems
    assert (problem.position, problem.record_id, problem.skipped) == ("VTODO UID=bad (line 4)", "bad", True)
    assert problem.message == message


def test_a_date_written_with_a_tzid_is_an_all_day_date():
    """``DTSTART;TZID=America/New_York;VALUE=DATE:20260320``: a TZID does not apply to a DATE (§3.2.19);
    the library read it as midnight in New York, and the all-day deadline was due at 00:00, a day early."""
    content = calendar(*event("d", "DTSTART;TZID=America/New_York;VALUE=DATE:20270320"),
                       head=("X-WR-TIMEZONE:America/New_York",))
    [rule] = parse_ics(content, source="t").rules
    assert rule.start == "2027-03-20"
    assert ics_instants(content) == [("d", utc("2027-03-21T03:59:59Z"))]


def test_a_todo_with_a_due_is_due_then_whatever_durations_its_alarms_have():
    """A VALARM's DURATION (its repeat interval, §3.8.6.1) is not the to-do's: DUE alone still decides."""
    content = calendar(*todo("due", "DTSTART;TZID=Europe/Berlin:20270302T090000",
                             "DUE;TZID=Europe/Berlin:20270302T170000", "BEGIN:VALARM", "ACTION:DISPLAY",
                             "DESCRIPTION:s", "TRIGGER:-PT15M", "REPEAT:2", "DURATION:PT5M", "END:VALARM"))
    result = parse_ics(content, source="t")
    assert ([r.start for r in result.rules], result.problems) == (["2027-03-02T17:00:00"], [])
    assert ics_instants(content) == [("due", utc("2027-03-02T16:00:00Z"))]


def reference_instants(content: bytes) -> list[datetime]:
    """The instants recurring-ical-events plans for ``content`` (cancelled instances left out)."""
    import icalendar
    import recurring_ical_events

    found = recurring_ical_events.of(icalendar.Calendar.from_ical(content)).between(FAR_PAST, FAR_FUTURE)
    return sorted(e["DTSTART"].dt.astimezone(UTC) for e in found if str(e.get("STATUS", "")).upper() != "CANCELLED")


# A daily 02:30 series in New York: 2026-03-08 02:30 does not exist there (02:00 → 03:00), and that
# instance is at 07:30Z (RFC 5545 §3.3.5); 2026-03-07 is an ordinary day, 2026-11-01 01:30 is repeated.
_GAP_SERIES = ("DTSTART;TZID=America/New_York:20260306T023000", "RRULE:FREQ=DAILY;COUNT=6")
_FALL_SERIES = ("DTSTART;TZID=America/New_York:20261030T013000", "RRULE:FREQ=DAILY;COUNT=4")


@pytest.mark.parametrize(("series", "rid", "moved"), [
    (_GAP_SERIES, "RECURRENCE-ID;TZID=America/New_York:20260308T023000", "20260308T010000"),
    (_GAP_SERIES, "RECURRENCE-ID:20260308T073000Z", "20260308T010000"),
    (_GAP_SERIES, "RECURRENCE-ID;TZID=Europe/Berlin:20260308T083000", "20260308T010000"),
    (_GAP_SERIES, "RECURRENCE-ID;TZID=America/New_York:20260307T023000", "20260307T010000"),
    (_FALL_SERIES, "RECURRENCE-ID;TZID=America/New_York:20261101T013000", "20261101T000000"),
])
@pytest.mark.parametrize("cancelled", [False, True])
def test_an_override_of_an_instance_in_a_spring_forward_gap_replaces_it(series, rid, moved, cancelled):
    """The series names its gap instance by its nominal start (02:30), a RECURRENCE-ID arrives as the
    instant 07:30Z, which reads as 03:30 in New York: the override was added and the original kept
    (two reminders), and a cancelled one stayed planned. Compared with recurring-ical-events."""
    status = ("STATUS:CANCELLED",) if cancelled else ()
    content = calendar(*event("g", *series),
                       *event("g", rid, f"DTSTART;TZID=America/New_York:{moved}", *status))
    expected = reference_instants(content)
    assert len(expected) == (5 if series is _GAP_SERIES else 3) + (not cancelled), expected
    assert [due for _rid, due in ics_instants(content)] == expected
    assert vanished_mod.vanished_overrides(parse_ics(content, source="t").rules) == {}


@pytest.mark.parametrize(("series", "rid", "moved"), [
    (_GAP_SERIES, "RECURRENCE-ID;RANGE=THISANDFUTURE;TZID=America/New_York:20260308T023000", "20260308T010000"),
    (_GAP_SERIES, "RECURRENCE-ID;RANGE=THISANDFUTURE:20260308T073000Z", "20260308T010000"),
    (_GAP_SERIES, "RECURRENCE-ID;RANGE=THISANDFUTURE;TZID=America/New_York:20260307T023000", "20260307T010000"),
    (_FALL_SERIES, "RECURRENCE-ID;RANGE=THISANDFUTURE;TZID=America/New_York:20261101T013000", "20261101T000000"),
])
def test_a_thisandfuture_override_of_an_instance_in_a_spring_forward_gap_moves_it_and_the_rest(series, rid, moved):
    """RFC 5545 §3.8.4.4: the series splits at the named instance, each later one shifted by DTSTART −
    RECURRENCE-ID. Split at 03:30 instead of 02:30, the gap instance stayed at 07:30Z, the moved
    deadline (06:00Z) got no obligation (a -PT1H reminder came after it), and the later ones were
    shifted by 2 h 30 instead of 1 h 30. Compared with recurring-ical-events."""
    content = calendar(*event("g", *series), *event("g", rid, f"DTSTART;TZID=America/New_York:{moved}"))
    expected = reference_instants(content)
    assert [due for _rid, due in ics_instants(content)] == expected
    assert vanished_mod.vanished_overrides(parse_ics(content, source="t").rules) == {}


def test_the_gap_thisandfuture_override_plans_the_expected_instants():
    """The case as found, written out: 8 March moved to 01:00 EST (06:00Z), then 01:00 EDT (05:00Z) daily."""
    content = calendar(*event("g", *_GAP_SERIES), *event(
        "g", "RECURRENCE-ID;RANGE=THISANDFUTURE;TZID=America/New_York:20260308T023000",
        "DTSTART;TZID=America/New_York:20260308T010000"))
    tail = "g#2026-03-08T07:30:00Z"
    assert ics_instants(content) == [
        ("g", utc("2026-03-06T07:30:00Z")), ("g", utc("2026-03-07T07:30:00Z")), (tail, utc("2026-03-08T06:00:00Z")),
        (tail, utc("2026-03-09T05:00:00Z")), (tail, utc("2026-03-10T05:00:00Z")), (tail, utc("2026-03-11T05:00:00Z"))]


@pytest.mark.parametrize("exdate", [
    "EXDATE;TZID=America/New_York:20260308T023000",  # the instance's DTSTART as the series states it
    "EXDATE;TZID=America/New_York:20260308T033000",  # the same instant, read on the wall clock
    "EXDATE:20260308T073000Z",
    "EXDATE;TZID=Europe/Berlin:20260308T083000",
    "EXDATE;TZID=America/New_York:20260307T023000",
])
def test_an_exdate_naming_the_instant_of_a_gap_instance_excludes_it(exdate):
    """RFC 5545 §3.8.5.1, §3.3.5: an EXDATE excludes the instance whose start is the same DATE-TIME, and
    02:30 on a 02:00 → 03:00 night is the instant 07:30Z, as 03:30 is. Matched by instant, as a
    RECURRENCE-ID is; by wall time, only an EXDATE written as 02:30 in New York excluded it. Compared
    with recurring-ical-events."""
    content = calendar(*event("g", *_GAP_SERIES, exdate))
    expected = reference_instants(content)
    assert len(expected) == 5, expected
    assert [due for _rid, due in ics_instants(content)] == expected


def test_the_gap_instance_keeps_its_label_and_an_override_names_it():
    """The occurrence label (the obligation's identity) stays the nominal 02:30, and the override's
    RECURRENCE-ID, read as an instant, names that label (not 03:30)."""
    content = calendar(*event("g", *_GAP_SERIES), *event(
        "g", "RECURRENCE-ID;TZID=America/New_York:20260308T023000", "DTSTART;TZID=America/New_York:20260308T010000"))
    rules = parse_ics(content, source="t").rules
    master = next(r for r in rules if r.rule_id == "g")
    override = next(r for r in rules if r.rule_id != "g")
    zone = resolve_zone("America/New_York")
    labels = [o.period for o in expand(master, zone, after=FAR_PAST, before=FAR_FUTURE)]
    assert "2026-03-08T02:30:00" in labels
    from deadline_pipeline.plan.recurrence import occurrence_named
    assert occurrence_named(master, override, zone) == "2026-03-08T02:30:00"


@pytest.mark.parametrize("components", [
    # BYHOUR=2,3: the gap's 02:30 falls on the instant of 03:30, which the series has and which keeps it;
    # the override names 03:30 however it is written (an override of 02:30 must not split off a ghost).
    (event("g", "DTSTART;TZID=America/New_York:20260307T023000", "RRULE:FREQ=DAILY;BYHOUR=2,3;BYMINUTE=30;COUNT=6"),
     event("g", "RECURRENCE-ID;TZID=America/New_York:20260308T023000",
           "DTSTART;TZID=America/New_York:20260308T010000")),
    # Every other hour from 00:30: the series has 02:30 (in the gap), not 03:30.
    (event("g", "DTSTART;TZID=America/New_York:20260308T003000", "RRULE:FREQ=HOURLY;INTERVAL=2;BYMINUTE=30;COUNT=4"),
     event("g", "RECURRENCE-ID:20260308T073000Z", "DTSTART;TZID=America/New_York:20260308T010000")),
    # A daily 03:30 series: an override or EXDATE written as 02:30 names its 03:30 instance (same instant).
    (event("g", "DTSTART;TZID=America/New_York:20260306T033000", "RRULE:FREQ=DAILY;COUNT=5"),
     event("g", "RECURRENCE-ID;TZID=America/New_York:20260308T023000",
           "DTSTART;TZID=America/New_York:20260308T010000")),
    (event("g", "DTSTART;TZID=America/New_York:20260306T033000", "RRULE:FREQ=DAILY;COUNT=5",
           "EXDATE;TZID=America/New_York:20260308T023000"),),
    # An RDATE in the gap, and a weekly series split at Berlin's gap instance.
    (event("g", "DTSTART;TZID=America/New_York:20260306T090000", "RDATE;TZID=America/New_York:20260308T023000"),
     event("g", "RECURRENCE-ID:20260308T073000Z", "DTSTART;TZID=America/New_York:20260308T010000")),
    (event("g", "DTSTART;TZID=Europe/Berlin:20260315T023000", "RRULE:FREQ=WEEKLY;COUNT=4"),
     event("g", "RECURRENCE-ID;RANGE=THISANDFUTURE;TZID=Europe/Berlin:20260329T023000",
           "DTSTART;TZID=Europe/Berlin:20260329T040000")),
], ids=["both-times", "hourly-interval", "override-03:30-series", "exdate-03:30-series", "rdate", "weekly-split"])
def test_gap_instances_are_named_as_the_series_has_them(components):
    """Which of 02:30 (in the gap) and 03:30 names the instance at 07:30Z is the series' call: the one
    it has, and 03:30 when it has both (once_per_instant keeps the time that exists). Compared with
    recurring-ical-events; no override is dropped as vanished."""
    content = calendar(*[line for component in components for line in component])
    expected = reference_instants(content)
    assert [due for _rid, due in ics_instants(content)] == expected
    assert vanished_mod.vanished_overrides(parse_ics(content, source="t").rules) == {}


@pytest.mark.parametrize("cancelled", [False, True])
def test_an_override_of_a_recurring_todo_starting_in_a_spring_forward_gap_replaces_it(cancelled):
    """A to-do steps in DTSTARTs (its RECURRENCE-IDs name starts): read as 03:30, the override named a
    start the series does not have, was dropped as vanished, and the moved due time (16:00Z) was never
    planned while the original (21:00Z) stayed. Compared with recurring-ical-events."""
    import icalendar
    import recurring_ical_events

    status = ("STATUS:CANCELLED",) if cancelled else ()
    content = calendar(
        *todo("w", "DTSTART;TZID=America/New_York:20260306T023000", "DUE;TZID=America/New_York:20260306T170000",
              "RRULE:FREQ=DAILY;COUNT=5"),
        *todo("w", "RECURRENCE-ID;TZID=America/New_York:20260308T023000",
              "DTSTART;TZID=America/New_York:20260308T010000", "DUE;TZID=America/New_York:20260308T120000", *status))
    reference = recurring_ical_events.of(icalendar.Calendar.from_ical(content), components=["VTODO"]).between(
        datetime(2026, 1, 1), datetime(2027, 1, 1))
    expected = sorted(o["DUE"].dt.astimezone(UTC) for o in reference if str(o.get("STATUS", "")) != "CANCELLED")
    assert len(expected) == 4 + (not cancelled), expected
    assert [due for _rid, due in ics_instants(content)] == expected
    assert vanished_mod.vanished_overrides(parse_ics(content, source="t").rules) == {}
