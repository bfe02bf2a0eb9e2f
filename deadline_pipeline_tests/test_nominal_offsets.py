"""Reminder offsets: days and weeks are calendar days in the deadline's own zone, hours are exact
(RFC 5545 §3.3.6) — in the pure arithmetic, the planner, a real planning run on SQLite and
PostgreSQL, the independent ``reminders_owed`` reconciliation and ``preview``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner
from sqlalchemy import and_, delete, select

from deadline_pipeline.cli import main
from deadline_pipeline.config import ConfigError, load_config
from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.plan.keys import alert_dedup_key
from deadline_pipeline.plan.offsets import Offset, send_instant
from deadline_pipeline.plan.planner import Target, fingerprint, plan_target
from deadline_pipeline.plan.service import plan_all
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.store.schema import alerts, obligations, subscribers
from deadline_pipeline.timezones import resolve_zone
from deadline_pipeline.watch.reconcile import reminders_owed
from deadline_pipeline_tests.factories import ics, write_config

NY = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")


def z(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# ------------------------------------------------------------------------------ the arithmetic


@pytest.mark.parametrize("due_local, zone, offset, expected", [
    # New York springs forward on 2026-03-08: 09:00 New York a week earlier is 14:00Z, 168 h is 13:00Z.
    ("2026-03-09T09:00", "America/New_York", "-P7D", "2026-03-02T14:00Z"),
    ("2026-03-09T09:00", "America/New_York", "-P1W", "2026-03-02T14:00Z"),
    ("2026-03-09T09:00", "America/New_York", "-PT168H", "2026-03-02T13:00Z"),
    # Days first, then the exact hours (RFC 5545 §3.3.6): 03-07 09:00 EST = 14:00Z, minus 12 h.
    ("2026-03-09T09:00", "America/New_York", "-P2DT12H", "2026-03-07T02:00Z"),
    ("2026-03-09T09:00", "America/New_York", "-PT60H", "2026-03-07T01:00Z"),
    # Berlin springs forward on 2026-03-29 and falls back on 2026-10-25.
    ("2026-04-02T12:00", "Europe/Berlin", "-P7D", "2026-03-26T11:00Z"),
    ("2026-04-02T12:00", "Europe/Berlin", "-PT168H", "2026-03-26T10:00Z"),
    ("2026-10-30T12:00", "Europe/Berlin", "-P7D", "2026-10-23T10:00Z"),
    ("2026-10-30T12:00", "Europe/Berlin", "-PT168H", "2026-10-23T11:00Z"),
    # AoE (fixed UTC-12) and UTC have no transitions: calendar days are 24 h.
    ("2026-03-09T23:59", "AoE", "-P7D", "2026-03-03T11:59Z"),
    ("2026-03-09T23:59", "AoE", "-PT168H", "2026-03-03T11:59Z"),
    ("2026-03-09T09:00", "UTC", "-P7D", "2026-03-02T09:00Z"),
    # 2026-03-08 02:30 does not exist in New York: the DST policy shifts it by the gap (03:30 EDT).
    ("2026-03-15T02:30", "America/New_York", "-P7D", "2026-03-08T07:30Z"),
    # 2026-11-01 01:30 happens twice in New York: the first one (EDT) is taken.
    ("2026-11-08T01:30", "America/New_York", "-P7D", "2026-11-01T05:30Z"),
    ("2026-03-09T09:00", "America/New_York", "PT0S", "2026-03-09T13:00Z"),
])
def test_send_instant_counts_days_on_the_deadlines_calendar(due_local, zone, offset, expected):
    tz = resolve_zone(zone)
    due = datetime.fromisoformat(due_local).replace(tzinfo=tz).astimezone(UTC)
    assert send_instant(due, Offset.parse(offset), tz) == z(expected)


def test_offset_parts_length_and_text():
    assert (Offset.parse("-P1W"), Offset.parse("-P1DT12H"), Offset.parse("-PT36H")) == (
        Offset(-7, 0), Offset(-1, -43200), Offset(0, -129600))
    # The store keys a reminder on the nominal length: -P7D and -PT168H are the same reminder there.
    assert Offset.parse("-P7D").nominal_seconds == Offset.parse("-PT168H").nominal_seconds == -604800
    assert Offset.parse("-P7D").text() == "-P7D, 7 days before"
    assert Offset.parse("-PT168H").text() == "-PT168H, 168 hours before"
    assert Offset(-1, -43200).text() == "-P1DT12H, 1 day 12 hours before"
    assert Offset.exact(-5400).text() == "-PT1H30M, 1 hour 30 minutes before"
    with pytest.raises(ValueError, match="'-P1M' is not an ISO 8601 duration"):
        Offset.parse("-P1M")


def test_offsets_of_one_length_in_one_subscription_are_refused(tmp_path):
    path = write_config(tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
                        subscribers=[{"id": "ann", "tenant": "t", "email": "a@example.org", "timezone": "UTC"}],
                        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["-P7D", "-PT168H"],
                                        "channels": ["mail"]}],
                        channels={"mail": {"type": "maildir", "path": str(tmp_path / "md")}})
    with pytest.raises(ConfigError, match=r"subscriptions\[0\]\.offsets.*'-P7D' and '-PT168H' have the same length"):
        load_config(path)


# ------------------------------------------------------------------------------ the planner


def _target(*offsets, subscriber_tz="Asia/Tokyo", source_tz=None) -> Target:
    return Target(1, "ann", "t", subscriber_tz, 1, "cal", source_tz, ("*",), tuple(offsets), ("mail",))


def test_planner_counts_days_in_the_deadlines_zone_not_the_subscribers():
    rule = RuleRecord("r", "R", "2026-03-09T09:00:00", "America/New_York")
    now = z("2026-02-01T00:00Z")
    (ob,), problems = plan_target(_target(Offset.parse("-P7D"), Offset.parse("-P2DT12H")), [(1, rule)], now)
    assert not problems and ob.zone == "America/New_York"
    by = {a.offset_seconds: a for a in ob.alerts}
    assert by[-604800].send_at == z("2026-03-02T14:00Z") and by[-604800].offset == Offset(-7, 0)
    assert by[-216000].send_at == z("2026-03-07T02:00Z")  # 03-07 09:00 EST (14:00Z) minus 12 h
    # The dedup key is the one a 168-hour offset always had: existing stores keep their identities.
    assert by[-604800].dedup_key == alert_dedup_key(ob.key, -604800, "mail", "reminder", due_at=ob.due_at)
    # A bare number of seconds is exact.
    (ob,), _ = plan_target(_target(-604800), [(1, rule)], now)
    assert ob.alerts[0].send_at == z("2026-03-02T13:00Z")


def test_a_floating_deadline_counts_days_in_the_zone_it_is_read_in():
    rule = RuleRecord("r", "R", "2026-04-02T12:00:00", None)
    (ob,), _ = plan_target(_target(Offset.parse("-P7D"), source_tz="Europe/Berlin"), [(1, rule)],
                           z("2026-02-01T00:00Z"))
    assert ob.due_at == z("2026-04-02T10:00Z") and ob.alerts[0].send_at == z("2026-03-26T11:00Z")


def test_the_fingerprint_follows_the_written_offset():
    rule = RuleRecord("r", "R", "2026-03-09T09:00:00", "America/New_York")
    now = z("2026-02-01T00:00Z")
    (nominal,), _ = plan_target(_target(Offset.parse("-P7D")), [(1, rule)], now)
    (exact,), _ = plan_target(_target(Offset.parse("-PT168H")), [(1, rule)], now)
    assert nominal.fingerprint != exact.fingerprint  # so a re-plan moves the stored reminder


# ------------------------------------------------------------------------------ planning on the store

EVENTS = [
    {"uid": "ny@test", "tzid": "America/New_York", "dtstart": "20260309T090000", "summary": "New York"},
    {"uid": "gap@test", "tzid": "America/New_York", "dtstart": "20260315T023000", "summary": "In the gap"},
    {"uid": "be@test", "tzid": "Europe/Berlin", "dtstart": "20260402T120000", "summary": "Berlin"},
    {"uid": "utc@test", "tzid": "UTC", "dtstart": "20260309T090000", "summary": "UTC"},
]
T0 = z("2026-02-20T12:00Z")


def _configure(tmp_path, ann_offsets=("-P7D", "-PT36H"), bob_offsets=("-PT168H",)):
    (tmp_path / "cal.ics").write_text(ics(*EVENTS), newline="")
    path = write_config(
        tmp_path,
        sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "Asia/Tokyo"},
                     {"id": "bob", "tenant": "t", "email": "bob@example.org", "timezone": "America/New_York"}],
        subscriptions=[{"name": "nominal", "subscribers": ["ann"], "sources": ["cal"], "offsets": list(ann_offsets),
                        "channels": ["mail"]},
                       {"name": "exact", "subscribers": ["bob"], "sources": ["cal"], "offsets": list(bob_offsets),
                        "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    )
    return load_config(path)[0], path


def _reminders(engine) -> dict[tuple[str, str, int], datetime]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(subscribers.c.external_id, obligations.c.rule_id, alerts.c.offset_seconds, alerts.c.send_at)
            .join(obligations, obligations.c.id == alerts.c.obligation_id)
            .join(subscribers, subscribers.c.id == obligations.c.subscriber_id)
            .where(alerts.c.kind == "reminder", alerts.c.status == "pending")).all()
    return {(s, r, o): at for s, r, o, at in rows}


def test_planning_run_sends_calendar_day_reminders_on_the_deadlines_wall_clock(engine, tmp_path):
    cfg, _ = _configure(tmp_path)
    for s in cfg.sources:
        fetch_snapshot(engine, s, T0)
        apply_latest_snapshot(engine, s, T0)
    plan_all(engine, cfg, T0)
    got = _reminders(engine)
    assert got[("ann", "ny@test", -604800)] == z("2026-03-02T14:00Z")  # 09:00 New York, a week earlier
    assert got[("bob", "ny@test", -604800)] == z("2026-03-02T13:00Z")  # exactly 168 h earlier
    assert got[("ann", "ny@test", -129600)] == z("2026-03-08T01:00Z")  # PT36H: exact
    assert got[("ann", "gap@test", -604800)] == z("2026-03-08T07:30Z")  # 02:30 does not exist: 03:30 EDT
    assert got[("ann", "be@test", -604800)] == z("2026-03-26T11:00Z")  # 12:00 CET
    assert got[("bob", "be@test", -604800)] == z("2026-03-26T10:00Z")
    assert got[("ann", "utc@test", -604800)] == got[("bob", "utc@test", -604800)] == z("2026-03-02T09:00Z")
    # Recomputing writes nothing.
    again = plan_all(engine, cfg, T0 + timedelta(hours=1))
    assert (again.alerts_written, again.obligations_updated) == (0, 0)
    # Bob rewrites -PT168H as -P7D: the same reminder (same identity and dedup key) moves to 09:00 New York.
    cfg, _ = _configure(tmp_path, bob_offsets=("-P7D",))
    out = plan_all(engine, cfg, T0 + timedelta(hours=2))
    got_before, got = got, _reminders(engine)
    # Exactly the reminders whose instant changed are counted as moved, none as new.
    moved = sum(1 for k, at in got.items() if got_before[k] != at)
    assert moved >= 2 and (out.alerts_inserted, out.alerts_moved) == (0, moved)
    assert got[("bob", "ny@test", -604800)] == z("2026-03-02T14:00Z")
    assert got[("bob", "be@test", -604800)] == z("2026-03-26T11:00Z")


def test_reconciliation_recomputes_the_same_calendar_day_instants(engine, tmp_path):
    cfg, _ = _configure(tmp_path, bob_offsets=("-P1D",))
    for s in cfg.sources:
        fetch_snapshot(engine, s, T0)
        apply_latest_snapshot(engine, s, T0)
    plan_all(engine, cfg, T0)
    # Planned reminders, still pending, explain what is owed: green.
    assert reminders_owed(engine, cfg, z("2026-03-02T15:00Z")).passed
    # The fault the check exists for: ann's -P7D row for the New York deadline was never written.
    with engine.begin() as conn:
        ob_ids = select(obligations.c.id).where(obligations.c.rule_id == "ny@test")
        conn.execute(delete(alerts).where(and_(alerts.c.obligation_id.in_(ob_ids), alerts.c.offset_seconds == -604800)))
    # hi = now - 30 min = 13:45Z: 168 h before would be owed (13:00Z), 09:00 New York (14:00Z) is not yet.
    assert reminders_owed(engine, cfg, z("2026-03-02T14:15Z")).passed
    late = reminders_owed(engine, cfg, z("2026-03-02T14:31Z"))
    assert not late.passed and late.count == 1
    assert late.offenders[0]["send_at"] == "2026-03-02T14:00:00+00:00"  # the instant planning used
    assert late.offenders[0]["offset_seconds"] == -604800 and late.offenders[0]["reason"].startswith("never planned")


def test_preview_shows_the_offset_as_written_and_its_calendar(engine, db_url, tmp_path):
    cfg, path = _configure(tmp_path)
    for s in cfg.sources:
        fetch_snapshot(engine, s, T0)
        apply_latest_snapshot(engine, s, T0)
    plan_all(engine, cfg, T0)

    def preview(who: str, *extra: str) -> CliRunner:
        res = CliRunner().invoke(main, ["preview", "--subscriber", who, "--from", "2026-03-02T00:00:00Z",
                                        "--to", "2026-03-03T00:00:00Z", "--as-of", "2026-02-21T00:00:00Z",
                                        "--config", str(path), "--db-url", db_url, *extra])
        assert res.exit_code == 0, res.output
        return res

    ann = {r["rule"]: r for r in json.loads(preview("ann", "--json").output)}
    assert ann["ny@test"]["offset"] == "-P7D, 7 days before"
    assert ann["ny@test"]["offset_zone"] == "America/New_York"
    assert ann["ny@test"]["send_at"]["utc"] == "2026-03-02T14:00:00+00:00"
    (bob,) = [r for r in json.loads(preview("bob", "--json").output) if r["rule"] == "ny@test"]
    assert bob["offset"] == "-PT168H, 168 hours before" and bob["send_at"]["utc"] == "2026-03-02T13:00:00+00:00"
    text = preview("ann").output
    assert "calendar days in the deadline's zone" in text.splitlines()[0]
    assert "-P7D, 7 days before, calendar days in America/New_York" in text
    assert "calendar days in" not in preview("bob").output.split("\n", 1)[1]  # exact hours: no calendar


def _ingest_plan(engine, cfg, now=T0):
    for s in cfg.sources:
        fetch_snapshot(engine, s, now)
        apply_latest_snapshot(engine, s, now)
    return plan_all(engine, cfg, now)


def test_one_length_spelt_two_ways_by_two_subscriptions_keeps_the_earlier_instant(engine, tmp_path):
    cfg, path = _configure(tmp_path)
    raw = path.read_text().replace("subscribers:\n  - bob", "subscribers:\n  - ann")
    path.write_text(raw)
    cfg = load_config(path)[0]
    assert [s.subscribers for s in cfg.subscriptions] == [["ann"], ["ann"]]
    _ingest_plan(engine, cfg)
    got = _reminders(engine)
    # -P7D (14:00Z) and -PT168H (13:00Z) are one reminder to the store: sent once, never late.
    assert got[("ann", "ny@test", -604800)] == z("2026-03-02T13:00Z")
    with engine.connect() as conn:
        n = conn.execute(select(alerts.c.id).join(obligations, obligations.c.id == alerts.c.obligation_id)
                         .where(obligations.c.rule_id == "ny@test", alerts.c.offset_seconds == -604800)).all()
    assert len(n) == 1


def test_a_subscription_edited_since_planning_is_read_as_stored_seconds_loudly(engine, tmp_path, caplog):
    from deadline_pipeline.plan.outcome import PlanOutcome
    from deadline_pipeline.plan.service import targets_from_rows
    from deadline_pipeline.store.plan_inputs import active_targets

    cfg, _ = _configure(tmp_path)
    _ingest_plan(engine, cfg)
    with engine.connect() as conn:
        rows = list(active_targets(conn))
    by = {t.subscriber: t for t in targets_from_rows(cfg, rows, PlanOutcome(), {})}
    assert by["ann"].offsets == (Offset(-7, 0), Offset(0, -129600)) and by["bob"].offsets == (Offset(0, -604800),)
    edited, _ = _configure(tmp_path, ann_offsets=("-P2D",))  # not planned yet: the store still says -P7D/-PT36H
    out = PlanOutcome()
    by = {t.subscriber: t for t in targets_from_rows(edited, rows, out, {})}
    assert by["ann"].offsets == (Offset(0, -604800), Offset(0, -129600))
    assert [p.source for p in out.problems] == ["cal"] and "exact seconds" in out.problems[0].message
    assert "do not match the stored" in caplog.text and "'nominal'" in caplog.text


def test_targets_sharing_equal_offsets_keep_each_subscriptions_text(engine, tmp_path):
    """Planning shares one offsets tuple between targets with equal offsets; offsets compare by length
    only, so ``-P1W`` and ``-P7D`` are equal, and a shared tuple keyed on that would show one
    subscription's reminders with the other's text."""
    from deadline_pipeline.plan.outcome import PlanOutcome
    from deadline_pipeline.plan.service import targets_from_rows
    from deadline_pipeline.store.plan_inputs import active_targets

    cfg, _ = _configure(tmp_path, ann_offsets=("-P1W",), bob_offsets=("-P7D",))
    _ingest_plan(engine, cfg)
    with engine.connect() as conn:
        by = {t.subscriber: t for t in targets_from_rows(cfg, active_targets(conn), PlanOutcome(), {})}
    assert by["ann"].offsets == by["bob"].offsets == (Offset(-7, 0),)
    assert [o.written for o in by["ann"].offsets] == ["-P1W"]
    assert [o.written for o in by["bob"].offsets] == ["-P7D"]


# ------------------------------------------------------------------------------ a deadline in a gap


@pytest.mark.parametrize("start, rrule, expected", [
    # 02:30 on 8 March does not exist in New York: due at 07:30Z (the clock shows 03:30 EDT). A day
    # before is 02:30 EST on 7 March = 07:30Z; counted from 03:30 it was 08:30Z, an hour late.
    ("2026-03-08T02:30:00", None, "2026-03-07T07:30Z"),
    ("2026-03-08T02:00:00", None, "2026-03-07T07:00Z"),  # the first skipped minute: due at 03:00 EDT
    ("2026-03-06T02:30:00", "FREQ=DAILY;COUNT=3", "2026-03-07T07:30Z"),  # a series' gap occurrence
    # 03:30 EDT as written exists: its day before is 03:30 EST (08:30Z), the same instant's other name.
    ("2026-03-08T03:30:00", None, "2026-03-07T08:30Z"),
])
def test_a_calendar_day_before_a_deadline_in_a_gap_keeps_its_nominal_wall_time(start, rrule, expected):
    rule = RuleRecord("r", "R", start, "America/New_York", rrule=rrule)
    obs, problems = plan_target(_target(Offset.parse("-P1D"), Offset.parse("-P1DT30M")), [(1, rule)],
                                z("2026-02-01T00:00Z"))
    (ob,) = [o for o in obs if o.due_at.date().isoformat() == "2026-03-08"]
    assert not problems
    by = {a.offset_seconds: a.send_at for a in ob.alerts}
    assert by[-86400] == z(expected)
    assert by[-86400 - 1800] == z(expected) - timedelta(minutes=30)  # days first, then exact time
    # A store planned before keeps the fingerprint of every obligation but one due in a gap: only those
    # have their reminders recomputed (and moved) by the next planning run.
    before = fingerprint(ob.due_at, _target(Offset.parse("-P1D"), Offset.parse("-P1DT30M")), NY)
    assert (ob.fingerprint == before) == (ob.wall is None) and (ob.wall is None) == start.startswith("2026-03-08T03")


def test_planning_run_and_preview_remind_a_gap_deadline_at_its_wall_time_the_day_before(engine, db_url, tmp_path):
    """The user's case on the store and the CLI: a deadline at 02:30 New York on 8 March 2026 (a time
    the change to daylight saving skips) with -P1D and -PT24H is reminded at 07:30Z both times."""
    (tmp_path / "cal.ics").write_text(ics({"uid": "gap1@test", "tzid": "America/New_York",
                                           "dtstart": "20260308T023000", "summary": "In the gap"}), newline="")
    path = write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "America/New_York"},
                     {"id": "bob", "tenant": "t", "email": "bob@example.org", "timezone": "America/New_York"}],
        subscriptions=[{"name": "days", "subscribers": ["ann"], "sources": ["cal"], "offsets": ["-P1D"],
                        "channels": ["mail"]},
                       {"name": "hours", "subscribers": ["bob"], "sources": ["cal"], "offsets": ["-PT24H"],
                        "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}})
    cfg = load_config(path)[0]
    _ingest_plan(engine, cfg)
    got = _reminders(engine)
    assert got[("ann", "gap1@test", -86400)] == got[("bob", "gap1@test", -86400)] == z("2026-03-07T07:30Z")
    res = CliRunner().invoke(main, ["preview", "--subscriber", "ann", "--from", "2026-03-06T00:00:00Z",
                                    "--to", "2026-03-09T00:00:00Z", "--as-of", "2026-02-21T00:00:00Z",
                                    "--config", str(path), "--db-url", db_url, "--json"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.output)
    assert row["send_at"]["utc"] == "2026-03-07T07:30:00+00:00", row
    # The independent reconciliation recomputes the same instant: still pending, nothing unexplained.
    assert reminders_owed(engine, cfg, z("2026-03-07T08:05Z")).passed
