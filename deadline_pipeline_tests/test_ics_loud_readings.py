"""iCalendar readings that passed unseen: what ``validate`` lists, ``run`` acts on the same way, through
real Dagster runs (``deadline-pipeline run``) on PostgreSQL with a maildir channel."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from deadline_pipeline.cli import main
from deadline_pipeline.config import load_config
from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.store.db import make_engine, upgrade
from deadline_pipeline.store.schema import obligations
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
], ids=["rdate-fold-lost", "dtstart-not-a-date", "stray-line", "note-only"])
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
