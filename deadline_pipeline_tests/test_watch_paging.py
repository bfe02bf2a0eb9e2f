"""The paging sensor through Dagster: a real instance, real check evaluations and runs, a real SMTP
receiver on loopback for the escalation channel, and build_sensor_context with the definitions."""

from __future__ import annotations

import json

import dagster as dg
import pytest
import yaml

from deadline_pipeline.orchestration.build import CHECKS_JOB, build_definitions
from deadline_pipeline.orchestration.deliver import DELIVER_JOB
from deadline_pipeline.orchestration.paging import paging_sensor
from deadline_pipeline.orchestration.runner import run_chain
from deadline_pipeline_tests.factories import free_port, ics, write_config


@pytest.fixture
def oncall_smtp(smtp_server):
    controller, handler = smtp_server
    return controller.port, handler


def _write(tmp_path, oncall_port: int, mail_port: int):
    (tmp_path / "cal.ics").write_text(ics(
        dict(uid="report@test", tzid="Europe/Berlin", dtstart="20270115T120000", summary="Quarterly report")),
        newline="")
    return write_config(
        tmp_path,
        sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t1"}],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "Europe/Berlin"}],
        subscriptions=[{"name": "all", "sources": ["cal"], "offsets": ["-P7D", "-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "smtp", "host": "127.0.0.1", "port": mail_port, "timeout_seconds": 2},
                  "oncall": {"type": "smtp", "host": "127.0.0.1", "port": oncall_port,
                             "sender": "pipeline@example.org"}},
        escalation={"channels": ["oncall"], "email": "oncall@example.org", "reminder_minutes": 60},
    )


def _defs(path, db_url, as_of):
    return dg.Definitions.merge(build_definitions(path, db_url=db_url, as_of=as_of),
                                dg.Definitions(sensors=[paging_sensor]))


def _run(defs, job, instance):
    return defs.resolve_job_def(job).execute_in_process(instance=instance, raise_on_error=False)


def _tick(defs, instance, cursor):
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs,
                                  resources={"settings": defs.resources["settings"], "clock": defs.resources["clock"]})
    result = paging_sensor(ctx)
    return ctx.cursor, result


def test_pages_once_reminds_and_resolves(tmp_path, oncall_smtp):
    port, oncall = oncall_smtp
    down = free_port()  # the subscribers' mail server: nobody listens
    path = _write(tmp_path, port, down)
    db_url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    with dg.instance_for_test() as instance:
        # Ingest, plan, a first (failing) sweep and the checks, as `deadline-pipeline run` does.
        run_chain(path, instance=instance, db_url=db_url, as_of="2027-01-10T00:00:00Z")
        t1 = _defs(path, db_url, "2027-01-10T01:00:00Z")
        assert _run(t1, DELIVER_JOB, instance).success  # still failing: retry_wait
        checks = _run(t1, CHECKS_JOB, instance)
        verdicts = {e.check_name: e.passed for e in checks.get_asset_check_evaluations()}
        assert verdicts["alerts_reconciled"] is False and verdicts["sweep_alive"] is True

        cursor, _ = _tick(t1, instance, None)
        assert len(oncall.messages) == 1
        assert oncall.messages[0][0] == ["oncall@example.org"]
        assert "[deadline-pipeline] check alerts/alerts_reconciled failed" in oncall.subjects[0]
        state = json.loads(cursor)["incidents"]
        assert list(state) == ["check alerts/alerts_reconciled"]

        # The next ticks, and a new checks run with the same red result: no page.
        cursor, _ = _tick(t1, instance, cursor)
        assert _run(t1, CHECKS_JOB, instance).success
        cursor, _ = _tick(_defs(path, db_url, "2027-01-10T01:30:00Z"), instance, cursor)
        assert len(oncall.messages) == 1

        # Still open an hour later: one reminder.
        t2 = _defs(path, db_url, "2027-01-10T02:01:00Z")
        cursor, _ = _tick(t2, instance, cursor)
        assert len(oncall.messages) == 2 and "still failing since" in oncall.subjects[1]

        # A failed run of this location is its own incident.
        broken = dg.Definitions.merge(build_definitions(path, db_url="postgresql://nobody@127.0.0.1:1/none",
                                                        as_of="2027-01-10T02:01:00Z"),
                                      dg.Definitions(sensors=[paging_sensor]))
        assert not _run(broken, DELIVER_JOB, instance).success
        cursor, _ = _tick(t2, instance, cursor)
        assert len(oncall.messages) == 3 and "[deadline-pipeline] run deliver_job failed" in oncall.subjects[2]

        # Repair: the mail server is back, the sweep delivers, the checks pass: resolved notices.
        _write(tmp_path, port, port)
        t3 = _defs(path, db_url, "2027-01-10T02:05:00Z")
        summary = run_chain(path, instance=instance, db_url=db_url, as_of="2027-01-10T02:05:00Z")
        assert summary.success and all(ok for ok, _ in summary.checks.values()), summary.checks
        cursor, _ = _tick(t3, instance, cursor)
        resolved = [s for s in oncall.subjects if "resolved" in s]
        assert len(resolved) == 2, oncall.subjects
        assert json.loads(cursor)["incidents"] == {}
        cursor, _ = _tick(t3, instance, cursor)
        assert sum("resolved" in s for s in oncall.subjects) == 2


def test_no_escalation_channel_is_loud_and_retried(tmp_path, oncall_smtp):
    port, oncall = oncall_smtp
    path = _write(tmp_path, port, free_port())
    raw = yaml.safe_load(path.read_text())
    raw["escalation"] = {"channels": []}
    path.write_text(yaml.safe_dump(raw))
    db_url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    with dg.instance_for_test() as instance:
        t1 = _defs(path, db_url, "2027-01-10T01:00:00Z")
        run_chain(path, instance=instance, db_url=db_url, as_of="2027-01-10T01:00:00Z")
        _run(_defs(path, db_url, "2027-01-10T02:00:00Z"), CHECKS_JOB, instance)
        cursor, result = _tick(t1, instance, None)
    assert isinstance(result, dg.SkipReason) and "no escalation channel is configured" in result.skip_message
    assert json.loads(cursor)["incidents"]["check alerts/alerts_reconciled"]["notified_at"] is None
