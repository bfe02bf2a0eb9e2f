"""The recurrence expansion engine is a versioned input of an instant, like the zone data and the
holiday calendars: every obligation an RRULE or RDATE decided records the python-dateutil release
that expanded it, every heartbeat the release its process imports; a move under another release with
the rule and the time data unchanged is named in the correction, and a planner on another release
than the checker turns ``time_data_agrees`` red.

One process cannot import two releases of python-dateutil, so the older release is simulated where
it is read: the version stored on an obligation (with the instant it would have expanded) or on a
heartbeat.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from importlib.metadata import version as dist_version

from sqlalchemy import select, update

from deadline_pipeline.config import load_config
from deadline_pipeline.plan.keys import alert_dedup_key
from deadline_pipeline.recurrence_engine import recurrence_engine_version
from deadline_pipeline.store.schema import alerts, heartbeats, obligations
from deadline_pipeline.watch import checks as w
from deadline_pipeline_tests.factories import ics, write_config
from deadline_pipeline_tests.test_watch_checks import cycle, deliver, plan
from deadline_pipeline_tests.test_zone_data import at, messages

OLD = "python-dateutil 2.8.2"
# Read from the installed distribution, not through the code under test.
OURS = f"python-dateutil {dist_version('python-dateutil')}"


def setup(tmp_path):
    """ann (UTC) subscribed to an ICS source of a weekly deadline (three Mondays from 2026-11-16,
    09:00 Berlin, 08:00Z) and a one-off one (2026-11-18), reminded 7 days before and at the deadline."""
    events = [dict(uid="weekly", tzid="Europe/Berlin", dtstart="20261116T090000", summary="Weekly filing",
                   rrule="FREQ=WEEKLY;COUNT=3"),
              dict(uid="once", tzid="Europe/Berlin", dtstart="20261118T090000", summary="One-off filing")]
    (tmp_path / "cal.ics").write_text(ics(*events))
    path = write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["-P7D", "PT0S"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}})
    return load_config(path)[0]


def engines(engine) -> dict[tuple[str, object], str | None]:
    """(rule id, due instant) → recorded recurrence engine of every obligation."""
    with engine.connect() as conn:
        return {(r.rule_id, r.due_at): r.recurrence_engine for r in conn.execute(
            select(obligations.c.rule_id, obligations.c.due_at, obligations.c.recurrence_engine))}


def test_the_engine_version_names_the_installed_python_dateutil():
    assert recurrence_engine_version() == OURS


def test_planned_obligations_record_the_engine_that_expanded_them(engine, tmp_path):
    """Each occurrence of the RRULE records the python-dateutil release; the one-off date, which no
    expansion decided, records none; the planning heartbeat records the release its process imports."""
    cfg = setup(tmp_path)
    cycle(engine, cfg, at("2026-11-01T00:00:00"))
    assert engines(engine) == {("weekly", at("2026-11-16T08:00:00")): OURS,
                               ("weekly", at("2026-11-23T08:00:00")): OURS,
                               ("weekly", at("2026-11-30T08:00:00")): OURS,
                               ("once", at("2026-11-18T08:00:00")): None}
    with engine.connect() as conn:
        recorded = dict(conn.execute(select(heartbeats.c.component, heartbeats.c.recurrence_engine)).all())
    assert recorded["plan"] == OURS and recorded["deliver"] == OURS, recorded
    # The run names it too (the plan's metadata), as it names the zone data and the calendars.
    assert plan(engine, cfg, at("2026-11-01T00:00:00")).recurrence_engine == OURS


def test_the_versioned_inputs_line_names_the_engine():
    """``--version`` and ``status`` name every versioned input of an instant besides the sources."""
    from click.testing import CliRunner

    from deadline_pipeline.cli import main

    res = CliRunner().invoke(main, ["--version"])
    assert res.exit_code == 0
    assert f", recurrence engine {OURS}" in res.output, res.output


def test_a_move_under_another_engine_is_corrected_naming_the_engine(engine, tmp_path):
    """The first weekly occurrence was planned (and its 7-day reminder delivered) by python-dateutil
    2.8.2, which expanded it an hour later than ours; the rule, the zone data and the calendar are
    unchanged. The re-plan under ours moves it back and the correction says the recurrence engine
    changed, naming both releases; the other occurrences, planned by ours, neither move nor get one."""
    cfg = setup(tmp_path)
    cycle(engine, cfg, at("2026-11-01T00:00:00"))
    first = at("2026-11-16T08:00:00")
    old_due = first + timedelta(hours=1)
    with engine.begin() as conn:
        oid, key = conn.execute(select(obligations.c.id, obligations.c.obligation_key)
                                .where(obligations.c.rule_id == "weekly", obligations.c.due_at == first)).one()
        # What 2.8.2's plan stored: its instant, its fingerprint, its version, and the reminders of
        # that instant (keyed and sent by it).
        conn.execute(update(obligations).where(obligations.c.id == oid)
                     .values(due_at=old_due, fingerprint="planned by 2.8.2", recurrence_engine=OLD))
        for aid, seconds, channel, send_at in conn.execute(
                select(alerts.c.id, alerts.c.offset_seconds, alerts.c.channel, alerts.c.send_at)
                .where(alerts.c.obligation_id == oid)).all():
            conn.execute(update(alerts).where(alerts.c.id == aid).values(
                due_at=old_due, send_at=send_at + timedelta(hours=1),
                dedup_key=alert_dedup_key(key, seconds, channel, "reminder", 0, old_due)))
    # The 7-day reminder of the old instant goes out (09:00Z on 2026-11-09), then ours re-plans.
    deliver(engine, cfg, at("2026-11-09T09:00:00"))
    sent_before = len(messages(tmp_path))
    assert sent_before == 1
    out = plan(engine, cfg, at("2026-11-09T09:30:00"))
    assert (out.obligations_moved, out.moved_by_time_data, out.corrections) == (1, 1, 1)
    assert engines(engine)[("weekly", first)] == OURS
    with engine.connect() as conn:
        (reason,) = conn.execute(select(alerts.c.status_reason).where(alerts.c.kind == "correction")).scalars()
    assert f"the recurrence engine changed ({OLD} → {OURS})" in reason, reason

    deliver(engine, cfg, at("2026-11-09T09:31:00"))
    corrections = [m for m in messages(tmp_path)[sent_before:] if str(m["Subject"]).startswith("Correction")]
    assert [str(m["Subject"]) for m in corrections] == [
        "Correction: Weekly filing moved from 2026-11-16 09:00 UTC to 2026-11-16 08:00 UTC"]
    assert f"Why: the recurrence engine changed ({OLD} → {OURS})" in corrections[0].get_body(("plain",)).get_content()


def test_the_cause_of_a_move_names_the_engine():
    """An engine upgrade under an unchanged rule is named with both releases, beside a zone-data
    change when both differ; a changed rule or an unrecorded (NULL) engine is no cause."""
    from deadline_pipeline.plan.notices import time_data_cause
    from deadline_pipeline.plan.planner import PlannedObligation
    from deadline_pipeline.timezones import resolve_zone

    def ob(zone_data: str = "2026f") -> PlannedObligation:
        return PlannedObligation("k", "t", 1, 1, "r", 3, "once", "T", at("2026-11-16T16:00:00"),
                                 zone="America/Vancouver", tz=resolve_zone("America/Vancouver"),
                                 zone_data=zone_data, recurrence_engine=OURS)

    stored = {"rule_version": 3, "zone_data": "2026f", "calendar_data": None, "recurrence_engine": OLD}
    assert time_data_cause(stored, ob()) == f"the recurrence engine changed ({OLD} → {OURS})"
    assert time_data_cause({**stored, "zone_data": "2025b"}, ob()) == (
        "the time-zone rules of America/Vancouver changed (IANA 2025b → 2026f); "
        f"the recurrence engine changed ({OLD} → {OURS})")
    assert time_data_cause({**stored, "rule_version": 2}, ob()) is None
    assert time_data_cause({**stored, "recurrence_engine": None}, ob()) is None
    assert time_data_cause({**stored, "recurrence_engine": OURS}, ob()) is None


def test_the_time_data_change_the_sensor_and_the_check_share_names_the_engine():
    """``replan_on_time_data`` re-plans the horizon on what ``time_data_change`` reports."""
    ours = ("2026f", "holidays 0.109", OURS)
    assert w.time_data_change(("2026f", "holidays 0.109", OLD), ours) == {"recurrence_engine": f"{OLD} → {OURS}"}
    assert w.time_data_change(("2026f", "holidays 0.109", None), ours) == {}
    assert w.time_data_change(("2025b", None, OURS), ours) == {"zone_data": "IANA 2025b → 2026f"}


def test_a_planner_on_another_engine_turns_the_check_red(engine, tmp_path):
    """A planner that expanded with 2.8.2 and a sweep and checker on ours: red, naming each process's
    release; green again once the planner runs on ours too."""
    cfg = setup(tmp_path)
    real_now = datetime.now(UTC)
    plan(engine, cfg, real_now)
    with engine.begin() as conn:
        conn.execute(update(heartbeats).where(heartbeats.c.component == "plan").values(recurrence_engine=OLD))
    deliver(engine, cfg, real_now)
    out = w.time_data_agrees(engine, datetime.now(UTC), timedelta(minutes=90))
    assert not out.passed
    assert f"plan {OLD}" in out.summary and f"this check {OURS}" in out.summary, out.summary
    assert "different engines" in out.summary and "python-dateutil release" in out.summary, out.summary
    assert {"component": "plan", "recurrence_engine": OLD} in out.offenders
    assert {"component": "horizon plan", "recurrence_engine": OLD} in out.offenders
    plan(engine, cfg, datetime.now(UTC))
    out = w.time_data_agrees(engine, datetime.now(UTC), timedelta(minutes=90))
    assert out.passed, out.summary
    assert OURS in out.summary


def test_migration_0021_upgrades_and_downgrades(db_url):
    """Expand only: the two nullable columns come and go; a store downgraded to 0020 upgrades again."""
    from alembic import command
    from sqlalchemy import inspect

    from deadline_pipeline.store.db import alembic_config, make_engine, upgrade

    engine = make_engine(db_url)
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))

    def columns() -> dict[str, bool]:
        found = {}
        for table in ("obligations", "heartbeats"):
            cols = {c["name"]: c for c in inspect(engine).get_columns(table)}
            found[table] = "recurrence_engine" in cols and cols["recurrence_engine"]["nullable"]
        return found

    try:
        upgrade(engine)
        assert columns() == {"obligations": True, "heartbeats": True}
        command.downgrade(cfg, "0020")
        assert columns() == {"obligations": False, "heartbeats": False}
        upgrade(engine)
        assert columns() == {"obligations": True, "heartbeats": True}
    finally:
        engine.dispose()
