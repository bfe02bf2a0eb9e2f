"""One zone database, chosen on purpose and recorded: the IANA data every instant is computed with is
the project's (the ``tzdata`` package, or a newer system folder), the same in every process, named
on every obligation and heartbeat; a change of it is a revision whose corrections name the zones.

The old database of these tests is built, not read from the machine: a copy of the package's zoneinfo
folder marked ``2025b`` whose ``America/Vancouver`` and ``America/Edmonton`` follow the rules those zones had
before British Columbia and Alberta stayed on summer time from 2026-11-01 (the same transitions as
``America/Los_Angeles`` and ``America/Denver``, which is what 2025b says for 2026–2027).
"""

from __future__ import annotations

import mailbox
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from pathlib import Path

import pytest
from sqlalchemy import select

from deadline_pipeline import zone_data
from deadline_pipeline.config import load_config
from deadline_pipeline.store.schema import alerts, heartbeats, obligations
from deadline_pipeline.watch import checks as w
from deadline_pipeline_tests.factories import cal_ics_config, ics, write_config
from deadline_pipeline_tests.test_watch_checks import cycle, plan

PACKAGE = zone_data.package_version()


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def package_copy(folder: Path, version: str) -> Path:
    """A system zoneinfo folder marked IANA ``version``: every zone file of the ``tzdata`` package and
    its ``tzdata.zi`` (links included) under that version's first line, as a distribution ships one."""
    shutil.copytree(str(files("tzdata").joinpath("zoneinfo")), folder, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__init__.py", "__pycache__"))
    rest = (folder / "tzdata.zi").read_text().split("\n", 1)[1]
    (folder / "tzdata.zi").write_text(f"# version {version}\n{rest}")
    return folder


def old_zone_folder(folder: Path, version: str = "2025b") -> Path:
    """A zoneinfo folder of IANA ``version`` in which Vancouver and Edmonton still observe standard
    time in winter (their pre-2026 rules), every other zone as the ``tzdata`` package has it."""
    package_copy(folder, version)
    for zone, same_as in (("America/Vancouver", "America/Los_Angeles"), ("America/Edmonton", "America/Denver")):
        (folder / zone).write_bytes(files("tzdata.zoneinfo").joinpath(same_as).read_bytes())
    return folder


@contextmanager
def zone_database(choice: zone_data.ZoneData):
    """Compute with ``choice`` inside the block; the project's own choice again after it."""
    zone_data.activate(choice)
    try:
        yield choice
    finally:
        zone_data.activate()


def old(tmp_path) -> zone_data.ZoneData:
    return zone_data.ZoneData("system", "2025b", str(old_zone_folder(tmp_path / "zoneinfo-2025b")), "system")


def test_the_package_is_2026f_or_newer():
    """The project depends on the rules of 2026f (BC and Alberta on UTC-7 / UTC-6 all year)."""
    assert zone_data.version_key(PACKAGE) >= zone_data.version_key("2026f"), PACKAGE


def test_version_order_and_bad_versions():
    assert zone_data.version_key("2025b") < zone_data.version_key("2026a") < zone_data.version_key("2026f")
    with pytest.raises(zone_data.ZoneDataError, match="'latest'"):
        zone_data.version_key("latest")


def test_choose_newest_package_and_system(tmp_path, monkeypatch):
    older = old_zone_folder(tmp_path / "older", "2025b")
    newer = old_zone_folder(tmp_path / "newer", "2099a")
    monkeypatch.setenv("PYTHONTZPATH", str(older))
    assert zone_data.choose("newest").source == "package"
    assert zone_data.choose("newest").other == "2025b"
    assert zone_data.choose("package").version == PACKAGE
    pinned = zone_data.choose("system")
    assert (pinned.source, pinned.version, pinned.folder) == ("system", "2025b", str(older))
    monkeypatch.setenv("PYTHONTZPATH", str(newer))
    assert (zone_data.choose("newest").source, zone_data.choose("newest").version) == ("system", "2099a")
    monkeypatch.setenv("PYTHONTZPATH", str(tmp_path / "nothing-here"))
    assert zone_data.choose("newest").source == "package"
    with pytest.raises(zone_data.ZoneDataError, match="DEADLINE_ZONE_DATA=system: no versioned zoneinfo folder"):
        zone_data.choose("system")
    with pytest.raises(zone_data.ZoneDataError, match="DEADLINE_ZONE_DATA='sytem': expected one of newest"):
        zone_data.choose("sytem")


def _utc_in_process(env: dict) -> subprocess.CompletedProcess:
    code = ("import deadline_pipeline\nfrom datetime import datetime, UTC\nfrom zoneinfo import ZoneInfo\n"
            "from deadline_pipeline import zone_data\n"
            "print(zone_data.version(), datetime(2026, 11, 16, 9, tzinfo=ZoneInfo('America/Vancouver'))"
            ".astimezone(UTC).strftime('%H:%MZ'))")
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=60)


def test_every_process_reads_the_chosen_database_not_the_machine_folder(tmp_path):
    """A fresh process (planner, sweeper, Celery worker alike) imports the package and reads the
    chosen database, whatever zoneinfo would read first on its own."""
    folder = str(old_zone_folder(tmp_path / "zoneinfo"))
    newest = _utc_in_process({"PYTHONTZPATH": folder, "DEADLINE_ZONE_DATA": "newest"})
    assert newest.stdout.split() == [PACKAGE, "16:00Z"], newest.stderr
    pinned = _utc_in_process({"PYTHONTZPATH": folder, "DEADLINE_ZONE_DATA": "system"})
    assert pinned.stdout.split() == ["2025b", "17:00Z"], pinned.stderr
    bad = _utc_in_process({"DEADLINE_ZONE_DATA": "latest"})
    assert bad.returncode != 0
    assert "DEADLINE_ZONE_DATA='latest': expected one of newest, package, system" in bad.stderr
    assert "Traceback" not in bad.stderr


def setup(tmp_path, offsets=("-P7D", "PT0S")):
    """ann (UTC) subscribed to an ICS source of one-off deadlines at 09:00 local on 2026-11-16 in
    Vancouver and Edmonton (moved by 2026f), Berlin (unchanged), and 2027-07-01 in Vancouver
    (summer: unchanged), reminded on a maildir channel."""
    events = [dict(uid="van", tzid="America/Vancouver", dtstart="20261116T090000", summary="Vancouver filing"),
              dict(uid="edm", tzid="America/Edmonton", dtstart="20261116T090000", summary="Edmonton filing"),
              dict(uid="ber", tzid="Europe/Berlin", dtstart="20261116T090000", summary="Berlin filing"),
              dict(uid="van-summer", tzid="America/Vancouver", dtstart="20270701T090000", summary="Summer filing")]
    (tmp_path / "cal.ics").write_text(ics(*events))
    path = write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": list(offsets), "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}})
    return load_config(path)[0]


def due_instants(engine) -> dict[str, tuple[datetime, str | None]]:
    with engine.connect() as conn:
        return {r.rule_id: (r.due_at, r.zone_data) for r in conn.execute(
            select(obligations.c.rule_id, obligations.c.due_at, obligations.c.zone_data))}


def messages(tmp_path) -> list:
    import email
    import email.policy

    box = mailbox.Maildir(tmp_path / "maildir", create=False,
                          factory=lambda f: email.message_from_binary_file(f, policy=email.policy.default))
    return sorted(box, key=lambda m: m["Date"].datetime)


def test_vancouver_is_planned_with_the_project_zone_data(engine, tmp_path):
    """DTSTART;TZID=America/Vancouver:20261116T090000 is 16:00Z under 2026f (UTC-7 all year from
    2026-11-01), not 17:00Z as the machine's 2025b says; its PT0S reminder goes out at 16:00Z, and
    the obligation and the planning heartbeat record the version."""
    cfg = setup(tmp_path)
    cycle(engine, cfg, at("2026-11-01T00:00:00"))
    due = due_instants(engine)
    assert due["van"] == (at("2026-11-16T16:00:00"), PACKAGE)
    assert due["edm"] == (at("2026-11-16T15:00:00"), PACKAGE)
    assert due["ber"] == (at("2026-11-16T08:00:00"), PACKAGE)
    with engine.connect() as conn:
        at_deadline = conn.execute(select(alerts.c.send_at)
                                   .join(obligations, obligations.c.id == alerts.c.obligation_id)
                                   .where(obligations.c.rule_id == "van", alerts.c.offset_seconds == 0)).scalar_one()
        planned_with = conn.execute(select(heartbeats.c.zone_data).where(heartbeats.c.component == "plan")).scalar()
    assert at_deadline == at("2026-11-16T16:00:00")
    assert planned_with == PACKAGE


def test_a_zone_data_switch_corrects_exactly_the_moved_obligations(engine, tmp_path):
    """Planned and partly delivered with 2025b, then re-planned with the package: the two
    obligations whose instants moved (Vancouver, Edmonton, an hour earlier) get one correction each
    naming the zone and both versions, and (a reminder is owed for the due instant in force) their
    7-day reminder for the new instant; Berlin and the summer deadline, unchanged, get nothing."""
    cfg = setup(tmp_path)
    with zone_database(old(tmp_path)):
        cycle(engine, cfg, at("2026-11-01T00:00:00"))
        before = due_instants(engine)
        # Every -P7D reminder of 2026-11-16 goes out (the latest at 17:00Z for Vancouver under 2025b).
        cycle(engine, cfg, at("2026-11-09T18:00:00"))
    assert before["van"] == (at("2026-11-16T17:00:00"), "2025b")
    assert before["edm"] == (at("2026-11-16T16:00:00"), "2025b")
    sent_before = len(messages(tmp_path))
    assert sent_before == 3

    out = plan(engine, cfg, at("2026-11-09T18:30:00"))
    after = due_instants(engine)
    assert after["van"] == (at("2026-11-16T16:00:00"), PACKAGE)
    assert after["edm"] == (at("2026-11-16T15:00:00"), PACKAGE)
    assert after["ber"] == (before["ber"][0], PACKAGE)  # re-recorded, not moved
    assert after["van-summer"] == (before["van-summer"][0], PACKAGE)
    assert (out.obligations_moved, out.moved_by_time_data, out.corrections) == (2, 2, 2)

    cycle(engine, cfg, at("2026-11-09T18:31:00"))
    new = messages(tmp_path)[sent_before:]
    subjects = sorted(str(m["Subject"]) for m in new)
    assert subjects == [
        "Correction: Edmonton filing moved from 2026-11-16 16:00 UTC to 2026-11-16 15:00 UTC",
        "Correction: Vancouver filing moved from 2026-11-16 17:00 UTC to 2026-11-16 16:00 UTC",
        "Reminder: Edmonton filing due 2026-11-16 15:00 UTC (6 days 20 hours left, sent late)",
        "Reminder: Vancouver filing due 2026-11-16 16:00 UTC (6 days 21 hours left, sent late)",
    ], subjects
    corrections = [m for m in new if str(m["Subject"]).startswith("Correction")]
    bodies = {m.get_body(("plain",)).get_content() for m in corrections}
    assert len(bodies) == 2
    assert any(f"Why: the time-zone rules of America/Vancouver changed (IANA 2025b → {PACKAGE})" in b for b in bodies)
    assert any(f"Why: the time-zone rules of America/Edmonton changed (IANA 2025b → {PACKAGE})" in b for b in bodies)
    # A second re-plan with the same data sends nothing.
    cycle(engine, cfg, at("2026-11-09T19:00:00"))
    assert len(messages(tmp_path)) == sent_before + len(new)


@contextmanager
def older_time_data(kind: str, tmp_path, monkeypatch):
    """Within the block this process computes with older time data of ``kind``: ``"zone data"`` (IANA
    2025b, a real older database) or ``"holidays"`` (release 0.100; one process cannot import two
    releases of the library, so the version it records is set, which is what the comparison reads)."""
    if kind == "zone data":
        with zone_database(old(tmp_path)):
            yield
    else:
        import holidays

        with monkeypatch.context() as patched:
            patched.setattr(holidays, "__version__", "0.100")
            yield


def older_and_ours(kind: str) -> tuple[str, dict, str]:
    """(the older version as named in summaries, its offender fields, this process's version as named)."""
    from deadline_pipeline.holiday_calendars import calendar_data_version

    if kind == "zone data":
        return "IANA 2025b", {"zone_data": "2025b"}, f"IANA {PACKAGE}"
    return "holidays 0.100", {"calendar_data": "holidays 0.100"}, calendar_data_version()


@pytest.mark.parametrize("kind", ["zone data", "holidays"])
def test_processes_on_different_time_data_turn_the_check_red(engine, tmp_path, monkeypatch, kind):
    """A planner that computed with 2025b (or rolled working days with another ``holidays`` release)
    and a sweep and checker on ours: red, naming each process's version; green again once the planner
    runs on ours too. (Only the zone data was compared once: a planner on another ``holidays`` release,
    rolling a deadline to another working day than the checker expects, was green.)"""
    older, fields, ours = older_and_ours(kind)
    cfg = setup(tmp_path)
    real_now = datetime.now(UTC)
    with older_time_data(kind, tmp_path, monkeypatch):
        plan(engine, cfg, real_now)
    from deadline_pipeline_tests.test_watch_checks import deliver

    deliver(engine, cfg, real_now)
    out = w.time_data_agrees(engine, datetime.now(UTC), timedelta(minutes=90))
    assert not out.passed
    assert f"plan {older}" in out.summary and f"this check {ours}" in out.summary, out.summary
    assert {"component": "plan", **fields} in out.offenders
    plan(engine, cfg, datetime.now(UTC))
    out = w.time_data_agrees(engine, datetime.now(UTC), timedelta(minutes=90))
    assert out.passed, out.summary
    assert ours in out.summary


def test_a_horizon_planned_with_other_zone_data_is_red_however_old_its_heartbeat(engine, tmp_path):
    """The horizon's instants are the ones reminders go out at: planned with 2025b, the check on the
    package is red even when the plan's heartbeat is older than the window of live processes."""
    cfg = setup(tmp_path)
    with zone_database(old(tmp_path)):
        plan(engine, cfg, datetime.now(UTC))
    later = datetime.now(UTC) + timedelta(days=1)
    out = w.time_data_agrees(engine, later, timedelta(minutes=90))
    assert not out.passed
    assert "horizon plan IANA 2025b" in out.summary, out.summary


def test_status_says_when_the_horizon_was_planned_with_other_zone_data(engine, tmp_path):
    """``status`` printed the versions the horizon was planned with beside the ones in force and said
    nothing when they differed; now it says so, and nothing once the horizon is re-planned."""
    from deadline_pipeline.commands.ops_cmds import status_text

    cfg = setup(tmp_path)
    now = at("2026-11-01T00:00:00")
    with zone_database(old(tmp_path)):
        cycle(engine, cfg, now)
    text = status_text(engine, now, cfg)
    assert "IANA 2025b / -: 4" in text and "DIFFERENT TIME DATA: 4 of them" in text, text
    plan(engine, cfg, now)
    text = status_text(engine, now, cfg)
    assert f"IANA {PACKAGE} / -: 4" in text and "DIFFERENT TIME DATA" not in text, text


def test_the_cause_of_a_move_names_what_changed():
    """Only a move under an unchanged rule is blamed on the time data; a fixed offset has no rules
    to change; a calendar library upgrade is named with both versions; NULL is no version."""
    from zoneinfo import ZoneInfo

    from deadline_pipeline.plan.notices import time_data_cause
    from deadline_pipeline.plan.planner import PlannedObligation
    from deadline_pipeline.timezones import resolve_zone

    def ob(zone: str, version: int = 3, cal: str | None = None) -> PlannedObligation:
        return PlannedObligation("k", "t", 1, 1, "r", version, "once", "T", at("2026-11-16T16:00:00"), zone=zone,
                                 tz=resolve_zone(zone), zone_data="2026f", calendar_data=cal)

    stored = {"rule_version": 3, "zone_data": "2025b", "calendar_data": "holidays 0.108"}
    assert isinstance(ob("America/Vancouver").tz, ZoneInfo)
    assert time_data_cause(stored, ob("America/Vancouver")) == \
        "the time-zone rules of America/Vancouver changed (IANA 2025b → 2026f)"
    assert time_data_cause(stored, ob("AoE")) is None
    assert time_data_cause({**stored, "rule_version": 2}, ob("America/Vancouver")) is None
    assert time_data_cause({**stored, "zone_data": None}, ob("America/Vancouver")) is None
    assert time_data_cause(stored, ob("UTC", cal="holidays 0.109")) == \
        "the working-day calendar changed (holidays 0.108 → holidays 0.109)"


@pytest.mark.parametrize("kind", ["zone data", "holidays"])
def test_new_time_data_requests_a_replan_of_the_whole_horizon(tmp_path, db_url, monkeypatch, kind):
    """``replan_on_time_data``, evaluated with the Dagster sensor API: the horizon planned with 2025b
    (or another ``holidays`` release) and ours in force → one run of the whole horizon, which moves
    Vancouver; then nothing. (A ``holidays`` upgrade waited for the hourly horizon run, leaving
    business-day-rolled reminders a working day off for up to an hour.)"""
    import dagster as dg

    from deadline_pipeline.orchestration.build import INGEST_JOB, build_definitions
    from deadline_pipeline.orchestration.partitions import horizon_range, range_tags
    from deadline_pipeline.orchestration.planning import PLAN_JOB
    from deadline_pipeline.store.db import make_engine

    older, _fields, ours = older_and_ours(kind)
    setup(tmp_path)
    with dg.instance_for_test() as instance:
        defs = build_definitions(tmp_path / "deadlines.yaml", db_url=db_url, as_of="2026-11-01T00:00:00Z")
        sensor = next(s for s in defs.sensors if s.name == "replan_on_time_data")
        resources = {"store": defs.resources["store"], "clock": defs.resources["clock"]}
        tags = range_tags(*horizon_range(at("2026-11-01T00:00:00")))
        with older_time_data(kind, tmp_path, monkeypatch):
            assert defs.resolve_job_def(INGEST_JOB).execute_in_process(instance=instance).success
            assert defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, tags=tags).success
            quiet = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, resources=resources))
            assert not quiet.run_requests and older in quiet.skip_message, quiet.skip_message
        tick = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, resources=resources))
        (request,) = tick.run_requests
        assert {k: v for k, v in request.tags.items() if k in tags} == tags
        # The change as the sensor logs it: "IANA 2025b → 2026f", "holidays 0.100 → holidays 0.109".
        assert request.run_key.startswith(f"time-data:{older} → {ours.removeprefix('IANA ')}#"), request.run_key
        # Evaluated again before the requested run completed: nothing more.
        waiting = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, resources=resources,
                                                               cursor=tick.cursor))
        assert not waiting.run_requests and "was requested" in waiting.skip_message
        with older_time_data(kind, tmp_path, monkeypatch):
            # The re-plan ran in a process on the older data (a code server or worker not restarted):
            # the plan records it again, with a new heartbeat, and a request now would be the next of
            # a full horizon re-plan every minute.
            assert defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, tags=tags).success
        stuck = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, resources=resources,
                                                             cursor=tick.cursor))
        assert not stuck.run_requests and "other time data than this sensor's" in stuck.skip_message
        assert defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, tags=tags).success
        if kind == "zone data":
            assert due_instants(make_engine(db_url))["van"] == (at("2026-11-16T16:00:00"), PACKAGE)
        again = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, resources=resources,
                                                             cursor=tick.cursor))
        assert not again.run_requests and again.cursor == "1|"
        # The same change once more after agreement (a rollback and the same upgrade again): requested.
        with older_time_data(kind, tmp_path, monkeypatch):
            assert defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, tags=tags).success
        redo = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, resources=resources,
                                                            cursor=again.cursor))
        (request,) = redo.run_requests
        assert "#1@" in request.run_key, request.run_key


def test_a_zone_data_switch_reads_an_unchanged_calendar_again(engine, tmp_path):
    """The zone data is an input of a parse, not only of planning: a RECURRENCE-ID is stored as its
    UTC instant. Read under 2025b (Vancouver on PST in November), the cancelled occurrence of
    16 November 09:00 was stored as 17:00Z; planned under the package's data (09:00 is 16:00Z) it
    named no occurrence, so the occurrence its publisher cancelled was reminded with every check
    green, for as long as the file's bytes stayed the same. Now the next ingest reads it again."""
    from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
    from deadline_pipeline.plan.service import plan_all

    series = dict(uid="weekly", tzid="America/Vancouver", dtstart="20261109T090000", summary="Weekly filing",
                  rrule="FREQ=WEEKLY;COUNT=3")
    cancelled = dict(series, rrule=None, recurrence_id="20261116T090000", status="CANCELLED")
    (tmp_path / "cal.ics").write_text(ics(series, cancelled))
    cfg = cal_ics_config(tmp_path)
    (src,) = cfg.sources

    def ingest_and_plan(now: datetime):
        fetch_snapshot(engine, src, now)
        applied = apply_latest_snapshot(engine, src, now)
        plan_all(engine, cfg, now)
        with engine.connect() as conn:
            due = conn.execute(select(obligations.c.due_at).where(obligations.c.status == "active")
                               .order_by(obligations.c.due_at)).scalars().all()
        return applied, [d.replace(tzinfo=UTC) for d in due]

    with zone_database(old(tmp_path)):
        _, due = ingest_and_plan(at("2026-11-01T00:00:00"))
    assert due == [at("2026-11-09T17:00:00"), at("2026-11-23T17:00:00")]
    applied, due = ingest_and_plan(at("2026-11-01T01:00:00"))
    assert applied.status == "applied"
    assert f"zone_data 2025b → {PACKAGE}" in applied.reparsed, applied.reparsed
    assert due == [at("2026-11-09T16:00:00"), at("2026-11-23T16:00:00")]


def test_a_zone_data_switch_reaches_the_local_times_a_webhook_shows(tmp_path):
    """The webhook body's local due times follow the zone data in force, like the e-mail's: its
    per-name caches of zones and texts are emptied when the database switches."""
    from deadline_pipeline.deliver.channels.webhook import payload
    from deadline_pipeline.deliver.notification import Notification

    n = Notification(dedup_key="k", kind="reminder", subscriber_id="ann", email=None, webhook_url=None,
                     subscriber_tz="America/Vancouver", source="s", rule_id="r", title="t",
                     due_at=at("2026-11-16T17:00:00"), offset_seconds=0, rule_tz="America/Edmonton")
    data = payload(n)["data"]
    assert (data["due_local"], data["due_in_deadline_timezone"]) == ("2026-11-16T10:00:00-07:00",
                                                                     "2026-11-16T11:00:00-06:00")
    with zone_database(old(tmp_path)):
        data = payload(n)["data"]
    assert (data["due_local"], data["due_in_deadline_timezone"]) == ("2026-11-16T09:00:00-08:00",
                                                                     "2026-11-16T10:00:00-07:00")


def test_a_zone_the_system_folder_lacks_is_not_read_from_the_package(tmp_path):
    """With a system folder in force, a key it lacks is read as the zone its ``tzdata.zi`` links it to
    in that folder, or refused naming the remedies; never with the package's rules under the folder's
    version (Debian 13 and Ubuntu put ``Canada/Pacific``, ``US/Eastern`` in tzdata-legacy)."""
    from deadline_pipeline.timezones import UnknownTimeZone, resolve_zone

    folder = old_zone_folder(tmp_path / "zoneinfo-2025b")
    (folder / "Canada" / "Pacific").unlink()  # tzdata-legacy not installed; tzdata.zi still lists the link
    (folder / "US" / "Eastern").unlink()
    zi = folder / "tzdata.zi"
    zi.write_text("".join(line for line in zi.read_text().splitlines(keepends=True) if " US/Eastern" not in line))
    nine = datetime(2026, 11, 16, 9)
    with zone_database(zone_data.ZoneData("system", "2025b", str(folder), "system")):
        vancouver = nine.replace(tzinfo=resolve_zone("America/Vancouver")).astimezone(UTC)
        pacific = nine.replace(tzinfo=resolve_zone("Canada/Pacific")).astimezone(UTC)
        with pytest.raises(UnknownTimeZone) as refused:
            resolve_zone("US/Eastern")
    assert vancouver == pacific == at("2026-11-16T17:00:00"), (vancouver, pacific)
    assert str(refused.value) == (
        "time zone 'US/Eastern' is not in the zone data in force (IANA 2025b (system folder "
        f"{folder})): read from the tzdata package instead (IANA {PACKAGE}), it would be planned with another "
        "version's rules than the one recorded; write 'America/New_York', the zone it names, install the "
        "folder's missing zones (Debian and Ubuntu: tzdata-legacy) or set DEADLINE_ZONE_DATA=package")
    assert resolve_zone("US/Eastern").key == "US/Eastern"  # the package holds every name of its list


# Readers of zone rules that bypass the database in force: dateutil's and pytz's own zone lookups read
# the machine's folder (dateutil.tz.gettz: America/Vancouver on UTC-8 in November 2026 on a 2025b
# machine) or their own copy, tzlocal the machine's zone, and a ZoneInfo(key) built outside timezones
# falls back to the tzdata package where a system folder in force lacks the key.
_OTHER_ZONE_READERS = ("dateutil.tz", "dateutil.zoneinfo", "pytz", "tzlocal")


def _zone_reads(tree) -> list[tuple[int, str]]:
    import ast

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, f"import {a.name}") for a in node.names if a.name.startswith(_OTHER_ZONE_READERS)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = {a.name for a in node.names}
            if node.module.startswith(_OTHER_ZONE_READERS) or (node.module == "dateutil" and "tz" in names):
                out.append((node.lineno, f"from {node.module} import {', '.join(sorted(names))}"))
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in ("ZoneInfo", "gettz", "get_localzone", "from_file", "no_cache"):
                out.append((node.lineno, f"{name}(...)"))
    return out


def test_zone_rules_are_read_only_through_timezones():
    """Every zone of the package is built by ``timezones`` (``resolve_zone`` and its helpers), which
    reads the database in force and nothing else."""
    import ast

    import deadline_pipeline

    root = Path(deadline_pipeline.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for line, what in _zone_reads(ast.parse(path.read_text(encoding="utf-8"))):
            if not (rel == "timezones.py" and what == "ZoneInfo(...)"):
                found.append(f"deadline_pipeline/{rel}:{line}: {what}")
    assert found == [], "zone rules read around timezones.resolve_zone:\n" + "\n".join(found)


# A process that plans, has tzdata upgraded under it (Vancouver's rules changed, version 2099a), then
# plans a calendar that now holds a Vancouver deadline; prints that obligation's due instant and version.
_UPGRADED_UNDER_A_RUNNING_PROCESS = """
import json, pathlib, re, sys
import tzdata
from deadline_pipeline.config import load_config
from deadline_pipeline.store.db import make_engine, upgrade
from deadline_pipeline_tests.factories import ics
from deadline_pipeline_tests.test_watch_checks import cycle
from deadline_pipeline_tests.test_zone_data import at, due_instants

config = pathlib.Path(sys.argv[1])
berlin = dict(uid="ber", tzid="Europe/Berlin", dtstart="20261116T090000", summary="Berlin filing")
vancouver = dict(uid="van", tzid="America/Vancouver", dtstart="20261116T090000", summary="Vancouver filing")
cfg = load_config(config)[0]
engine = make_engine(f"sqlite:///{config.parent / 'store.sqlite3'}")
upgrade(engine)
cycle(engine, cfg, at("2026-11-01T00:00:00"))
package = pathlib.Path(tzdata.__file__).parent
(package / "zoneinfo" / "America" / "Vancouver").write_bytes(
    (package / "zoneinfo" / "America" / "Los_Angeles").read_bytes())
init = package / "__init__.py"
init.write_text(re.sub(r'IANA_VERSION = "[^"]+"', 'IANA_VERSION = "2099a"', init.read_text()))
(config.parent / "cal.ics").write_text(ics(berlin, vancouver))
cycle(engine, cfg, at("2026-11-01T01:00:00"))
due, version = due_instants(engine)["van"]
print(json.dumps([due.isoformat(), version]))
"""


def test_a_tzdata_upgrade_under_a_running_process_is_planned_and_recorded_as_one_version(tmp_path):
    """A long-lived process (a Celery worker plans in-process) whose ``tzdata`` is upgraded while it
    runs plans the next run with the new version and records that version, not new rules for the
    zones it builds from then on under the version it imported at start."""
    import json

    site = tmp_path / "site"
    shutil.copytree(Path(files("tzdata").joinpath("__init__.py")).parent, site / "tzdata",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "cal.ics").write_text(ics(dict(uid="ber", tzid="Europe/Berlin", dtstart="20261116T090000",
                                               summary="Berlin filing")))
    config = write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["PT0S"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}})
    worktree = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(worktree)]), "DEADLINE_ZONE_DATA": "package"}
    env.pop("PYTHONTZPATH", None)
    done = subprocess.run([sys.executable, "-c", _UPGRADED_UNDER_A_RUNNING_PROCESS, str(config)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    # 2099a's Vancouver keeps changing clocks (09:00 PST is 17:00Z), and the obligation says 2099a.
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["2026-11-16T17:00:00+00:00", "2099a"]
    assert "zone data changed under this process: IANA " in done.stderr
