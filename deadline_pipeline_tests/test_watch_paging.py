"""The paging sensor through Dagster: a real instance, real check evaluations and runs, a real SMTP
receiver on loopback for the escalation channel (and a real HTTP receiver for a webhook escalation
channel), and build_sensor_context with the definitions."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dagster as dg
import pytest
import yaml

from deadline_pipeline.orchestration.build import CHECKS_JOB, build_definitions
from deadline_pipeline.orchestration.deliver import DELIVER_JOB
from deadline_pipeline.orchestration.paging import paging_sensor
from deadline_pipeline.orchestration.partitions import range_tags
from deadline_pipeline.orchestration.planning import PLAN_JOB
from deadline_pipeline.orchestration.runner import run_chain
from deadline_pipeline_tests.factories import free_port, ics, write_config


@pytest.fixture
def oncall_smtp(smtp_server):
    controller, handler = smtp_server
    return controller.port, handler


class _Pager(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.server.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def pager():
    """A webhook receiver on loopback for the on-call: ``(server, url)``; ``server.bodies`` in order."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pager)
    server.bodies = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}/page"
    server.shutdown()
    server.server_close()


def _write(tmp_path, oncall_port: int, mail_port: int, pager_url: str = "http://127.0.0.1:9/page"):
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
                             "sender": "pipeline@example.org"},
                  "pager": {"type": "webhook", "timeout_seconds": 5}},
        escalation={"channels": ["oncall", "pager"], "email": "oncall@example.org", "webhook_url": pager_url,
                    "reminder_minutes": 60, "dagster_ui_url": "http://dagster.internal:3000"},
        network={"allow": ["127.0.0.1/32"]},
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


def test_pages_once_reminds_and_resolves(tmp_path, oncall_smtp, pager):
    port, oncall = oncall_smtp
    hook, pager_url = pager
    down = free_port()  # the subscribers' mail server: nobody listens
    path = _write(tmp_path, port, down, pager_url)
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
        _write(tmp_path, port, port, pager_url)
        t3 = _defs(path, db_url, "2027-01-10T02:05:00Z")
        summary = run_chain(path, instance=instance, db_url=db_url, as_of="2027-01-10T02:05:00Z")
        assert summary.success and all(ok for ok, _ in summary.checks.values()), summary.checks
        cursor, _ = _tick(t3, instance, cursor)
        resolved = [s for s in oncall.subjects if "resolved" in s]
        assert len(resolved) == 2, oncall.subjects
        assert json.loads(cursor)["incidents"] == {}
        cursor, _ = _tick(t3, instance, cursor)
        assert sum("resolved" in s for s in oncall.subjects) == 2

    # Every page is an incident, never a reminder: the e-mail says so with the key, and the webhook
    # pages trigger, repeat and resolve each incident under one key.
    checks_key = "deadline-pipeline/dagster/alerts_reconciled/alerts"
    run_key = "deadline-pipeline/dagster/run/deliver_job"
    # (After the repair the subscribers' reminders land on the same SMTP server, addressed to ann.)
    paged = [s for (to, _), s in zip(oncall.messages, oncall.subjects, strict=True) if to == ["oncall@example.org"]]
    assert all(s.startswith("[incident ") for s in paged), paged
    assert paged[0].startswith(f"[incident triggered] {checks_key}: "), paged
    assert paged[2].startswith(f"[incident triggered] {run_key}: "), paged
    assert sorted(s.split(": ")[0] for s in paged[3:]) == [f"[incident resolved] {checks_key}",
                                                           f"[incident resolved] {run_key}"]
    pages = [(b["type"], b["data"]["incident_key"], b["data"]["notice"]) for b in hook.bodies]
    assert pages[:3] == [("incident.triggered", checks_key, "opened"), ("incident.triggered", checks_key, "reminder"),
                         ("incident.triggered", run_key, "opened")]
    assert sorted(pages[3:]) == [("incident.resolved", checks_key, "resolved"),
                                 ("incident.resolved", run_key, "resolved")]
    first = hook.bodies[0]["data"]
    assert first["links"][0]["href"] == "http://dagster.internal:3000/assets/alerts?view=checks"
    assert (first["check"], first["target"], first["severity"]) == ("alerts_reconciled", "alerts", "critical")
    assert hook.bodies[2]["data"]["links"][0]["path"].startswith("/runs/")


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


def _plan(defs, instance, partition_key=None, tags=None):
    return defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, partition_key=partition_key,
                                                             tags=tags, raise_on_error=False)


def _good_and_broken(tmp_path, instance, oncall_port: int, pager_url: str = "http://127.0.0.1:9/page"):
    """After the chain ran at 10 March 2027: definitions over the store, and over a store nobody serves
    (every run touching the store fails)."""
    path = _write(tmp_path, oncall_port, free_port(), pager_url)
    db_url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    as_of = "2027-03-10T00:00:00Z"
    run_chain(path, instance=instance, db_url=db_url, as_of=as_of)
    return _defs(path, db_url, as_of), _defs(path, "postgresql://nobody@127.0.0.1:1/none", as_of)


def test_failed_month_pages_until_that_month_plans(tmp_path, oncall_smtp, pager):
    """March's plan run fails and April's succeeds a moment later: the plan_job incident opens naming
    March and its run, stays open, and resolves only once a run covering March succeeds."""
    port, oncall = oncall_smtp
    hook, pager_url = pager
    with dg.instance_for_test() as instance:
        good, broken = _good_and_broken(tmp_path, instance, port, pager_url)
        cursor, _ = _tick(good, instance, None)
        assert "run plan_job" not in json.loads(cursor)["incidents"]

        march = _plan(broken, instance, "2027-03-01")
        assert not march.success
        assert _plan(good, instance, "2027-04-01").success
        cursor, _ = _tick(good, instance, cursor)
        incident = json.loads(cursor)["incidents"]["run plan_job"]
        assert incident["summary"] == (f"partition 2027-03-01 of plan_job failed in run {march.run_id} "
                                       "(no later run of it succeeded)")
        assert incident["problem"]["links"][0][1] == f"/runs/{march.run_id}"
        assert sum("run plan_job failed" in s and "2027-03-01" in s for s in oncall.subjects) == 1

        # Another month planned again, and a range that leaves March out: March is still unplanned.
        assert _plan(good, instance, "2027-04-01").success
        assert _plan(good, instance, tags=range_tags("2027-04-01", "2027-06-01")).success
        cursor, _ = _tick(good, instance, cursor)
        assert march.run_id in json.loads(cursor)["incidents"]["run plan_job"]["summary"]

        assert _plan(good, instance, "2027-03-01").success
        cursor, _ = _tick(good, instance, cursor)
        assert "run plan_job" not in json.loads(cursor)["incidents"]
        assert [(b["type"], b["data"]["notice"]) for b in hook.bodies
                if b["data"]["incident_key"] == "deadline-pipeline/dagster/run/plan_job"] == [
            ("incident.triggered", "opened"), ("incident.resolved", "resolved")]

        # A failed range run is covered month by month: the months planned since are no longer named.
        spring = _plan(broken, instance, tags=range_tags("2027-03-01", "2027-05-01"))
        assert not spring.success
        assert _plan(good, instance, "2027-04-01").success
        cursor, _ = _tick(good, instance, cursor)
        assert json.loads(cursor)["incidents"]["run plan_job"]["summary"].startswith(
            f"partitions 2027-03-01, 2027-05-01 of plan_job failed in run {spring.run_id}")
        # The hourly horizon run covers both.
        assert _plan(good, instance, tags=range_tags("2027-03-01", "2028-03-01")).success
        cursor, _ = _tick(good, instance, cursor)
        assert "run plan_job" not in json.loads(cursor)["incidents"]
        # Every failed run is covered now: the next ticks read no history before the latest.
        assert json.loads(cursor)["settled"]["plan_job"] == \
            instance.get_run_record_by_id(spring.run_id).create_timestamp.isoformat()
        # Read again from a cursor that forgot how far the history is settled: the same verdict.
        cursor, _ = _tick(good, instance, json.dumps({"incidents": json.loads(cursor)["incidents"]}))
        assert "run plan_job" not in json.loads(cursor)["incidents"]


def test_unpartitioned_job_judged_by_its_latest_run(tmp_path, oncall_smtp):
    """deliver_job has no partitions: its latest finished run decides, as before."""
    port, _ = oncall_smtp
    with dg.instance_for_test() as instance:
        good, broken = _good_and_broken(tmp_path, instance, port)
        failed = _run(broken, DELIVER_JOB, instance)
        assert not failed.success
        cursor, _ = _tick(good, instance, None)
        incident = json.loads(cursor)["incidents"]["run deliver_job"]
        assert incident["summary"] == f"run {failed.run_id} of deliver_job failed"
        assert _run(good, DELIVER_JOB, instance).success
        cursor, _ = _tick(good, instance, cursor)
        assert "run deliver_job" not in json.loads(cursor)["incidents"]

        # The implicit asset job is partitioned, but a run of its unpartitioned assets names no
        # partition: it reads as before.
        asset_job = broken.resolve_implicit_global_asset_job_def()
        failed = asset_job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("rule_versions")],
                                              raise_on_error=False)
        assert not failed.success
        cursor, _ = _tick(good, instance, cursor)
        assert json.loads(cursor)["incidents"]["run __ASSET_JOB"]["summary"] == \
            f"run {failed.run_id} of __ASSET_JOB failed"
