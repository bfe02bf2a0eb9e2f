"""A rule revision re-plans exactly the due months it touches, through Dagster: the rule_versions
materialization names the affected partitions and the sensor requests those, not the horizon."""

from __future__ import annotations

import dagster as dg

from deadline_pipeline.orchestration.build import INGEST_JOB, build_definitions
from deadline_pipeline.orchestration.planning import PLAN_JOB, horizon_range, range_tags
from deadline_pipeline.orchestration.resources import parse_instant
from deadline_pipeline_tests.factories import ics, write_config

AS_OF = "2027-01-10T00:00:00Z"
EVENTS = [
    {"uid": "a@test", "tzid": "Europe/Berlin", "dtstart": "20270315T120000", "summary": "A"},
    {"uid": "b@test", "tzid": "UTC", "dtstart": "20270601T090000", "summary": "B"},
    {"uid": "c@test", "tzid": "UTC", "dtstart": "20270602T090000", "summary": "C"},
    {"uid": "d@test", "tzid": "UTC", "dtstart": "20270603T090000", "summary": "D"},
]


def _config(tmp_path, events):
    (tmp_path / "cal.ics").write_text(ics(*events), newline="")
    return write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    )


def _sensor(defs, name):
    return next(s for s in defs.sensors if s.name == name)


def test_revision_requests_only_the_months_it_touches(tmp_path, db_url):
    with dg.instance_for_test() as instance:
        defs = build_definitions(_config(tmp_path, EVENTS), db_url=db_url, as_of=AS_OF)
        assert defs.resolve_job_def(INGEST_JOB).execute_in_process(instance=instance).success
        tags = range_tags(*horizon_range(parse_instant(AS_OF)))
        assert defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, tags=tags).success
        sensor = _sensor(defs, "replan_on_revision")
        first = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs))
        # The first ingest added every rule: their months.
        assert sorted(r.partition_key for r in first.run_requests) == ["2027-03-01", "2027-06-01"]

        # A moves from March to April; B, C, D are unchanged.
        moved = [dict(EVENTS[0], dtstart="20270410T120000"), *EVENTS[1:]]
        defs = build_definitions(_config(tmp_path, moved), db_url=db_url, as_of=AS_OF)
        assert defs.resolve_job_def(INGEST_JOB).execute_in_process(instance=instance).success
        tick = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs,
                                                            cursor=first.cursor))
        assert sorted(r.partition_key for r in tick.run_requests) == ["2027-03-01", "2027-04-01"]

        # Re-planning just those two partitions moves A; a second run of them changes nothing.
        for key in ("2027-03-01", "2027-04-01"):
            assert defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, partition_key=key).success
        again = defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, partition_key="2027-04-01")
        mats = [e.materialization for e in again.get_asset_materialization_events()]
        ob = next(m for m in mats if m.asset_key == dg.AssetKey("obligations"))
        assert (ob.metadata["inserted"].value, ob.metadata["moved"].value, ob.metadata["updated"].value) == (0, 0, 0)
        assert ob.metadata["unchanged"].value == 1
