"""ICS instants as planning plans them, through the real parse and plan path (fetch, snapshot, rule
versions, ``plan_all`` on the test database): a recurring to-do starting in a spring-forward gap (RFC
5545 §3.3.5, §3.8.5.3)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from deadline_pipeline.config import load_config
from deadline_pipeline.store import health
from deadline_pipeline.store.schema import obligations
from deadline_pipeline.watch import checks
from deadline_pipeline_tests.factories import ingest_and_plan, write_config


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


def _watched(engine, now: datetime) -> dict[str, datetime | None]:
    """rule id → the first instant ``horizon_planned`` expects of it after ``now``: the rules in force
    with their overrides folded, each read with the watchers' bounded expansion."""
    with engine.connect() as conn:
        [versions] = health.latest_rule_versions(conn).values()
    return {p["rule_id"]: checks._first_within(p, now, datetime(2028, 1, 1, tzinfo=UTC))
            for p, _since in checks._planned_rules(versions)}


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
    # DUE 04:30 EDT = 08:30Z: the first instance is due at it, and every later one the same *exact*
    # duration after its start (§3.8.5.3): 08:30Z − 07:30Z = 1 h, so 06:30Z + 1 h = 07:30Z (03:30 EDT).
    ("DUE;TZID=America/New_York:20270314T043000", ["2027-03-14T08:30:00Z", "2027-03-21T07:30:00Z",
                                                   "2027-03-28T07:30:00Z"]),
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
    assert _watched(engine, now) == {"gap@test": _utc(expected[0])}
