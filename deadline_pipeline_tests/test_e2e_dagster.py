"""End to end through Dagster: real instance, real sensor evaluation, real SMTP and HTTP receivers on
loopback, and the store on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dagster as dg
import pytest

from deadline_pipeline.orchestration.build import CHECKS_JOB, INGEST_JOB, build_definitions
from deadline_pipeline.orchestration.deliver import DELIVER_JOB, deliver_sensor
from deadline_pipeline.orchestration.planning import PLAN_JOB, horizon_range, range_tags
from deadline_pipeline.orchestration.resources import parse_instant
from deadline_pipeline_tests.factories import LOOPBACK_NETWORK, ai_deadlines, ics, write_config


@pytest.fixture
def webhook_server():
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append({"headers": dict(self.headers), "body": json.loads(body), "path": self.path})
            answer = json.dumps({"id": f"rcv-{len(received)}"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


@pytest.fixture
def config_path(tmp_path, smtp_server, webhook_server):
    controller, _ = smtp_server
    url, _ = webhook_server
    (tmp_path / "cal.ics").write_text(ics(
        dict(uid="report@test", tzid="Europe/Berlin", dtstart="20270115T120000", summary="Quarterly report"),
    ), newline="")
    (tmp_path / "confs.yml").write_text(ai_deadlines({
        "title": "TESTCONF", "year": 2027, "id": "testconf27", "link": "https://conf.example.org/",
        "deadlines": [{"type": "submission", "label": "Paper Submission", "date": "2027-01-20 23:59:59",
                       "timezone": "AoE"}],
    }))
    return write_config(
        tmp_path,
        sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t1"},
                 {"name": "confs", "format": "ai-deadlines", "location": "confs.yml", "tenant": "t1"}],
        subscribers=[
            {"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "Europe/Berlin"},
            {"id": "bob", "tenant": "t1", "email": "bob@example.org", "webhook_url": f"{url}/hooks/bob",
             "timezone": "America/New_York"},
        ],
        # ann has no webhook: she subscribes by mail only (a channel without its contact is a
        # planning problem that turns plan_complete red).
        subscriptions=[{"name": "everything", "subscribers": ["ann"], "sources": ["cal", "confs"],
                        "offsets": ["-P7D", "-P1D"], "channels": ["email"]},
                       {"name": "everything-hooked", "subscribers": ["bob"], "sources": ["cal", "confs"],
                        "offsets": ["-P7D", "-P1D"], "channels": ["email", "hook"]}],
        channels={"email": {"type": "smtp", "host": "127.0.0.1", "port": controller.port,
                            "sender": "reminders@example.org"},
                  "hook": {"type": "webhook", "timeout_seconds": 5}},
        network=LOOPBACK_NETWORK,
    )


def _cycle(config_path, db_url, as_of, instance):
    """One production-like cycle: pipeline job, sensor evaluation, the requested sweep, the checks."""
    defs = build_definitions(config_path, db_url=db_url, as_of=as_of)
    assert defs.resolve_job_def(INGEST_JOB).execute_in_process(instance=instance).success
    # The horizon as one partition range, the way the hourly schedule requests it.
    tags = range_tags(*horizon_range(parse_instant(as_of)))
    assert defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, tags=tags).success
    resources = {"store": defs.resources["store"], "clock": defs.resources["clock"]}
    tick = deliver_sensor(dg.build_sensor_context(instance=instance, resources=resources))
    if isinstance(tick, dg.RunRequest):
        assert defs.resolve_job_def(DELIVER_JOB).execute_in_process(instance=instance).success
    checks = defs.resolve_job_def(CHECKS_JOB).execute_in_process(instance=instance)
    evaluations = {e.check_name: e.passed for e in checks.get_asset_check_evaluations()}
    return tick, evaluations


def test_pipeline_end_to_end(config_path, db_url, smtp_server, webhook_server, tmp_path):
    _, smtp = smtp_server
    _, hooks = webhook_server
    with dg.instance_for_test() as instance:
        # 10 Jan: the report (due 15 Jan 11:00Z) has its -P7D reminder already past → sent at once,
        # once per subscriber and channel: ann by mail, bob by mail and webhook.
        tick, checks = _cycle(config_path, db_url, "2027-01-10T00:00:00Z", instance)
        assert isinstance(tick, dg.RunRequest)
        assert checks["alerts_reconciled"] and all(checks.values()), checks
        assert sorted(r for rcpts, _ in smtp.messages for r in rcpts) == ["ann@example.org", "bob@example.org"]
        subjects = smtp.subjects
        assert all(s.startswith("Reminder: Quarterly report") for s in subjects), subjects
        assert len(hooks) == 1 and hooks[0]["path"] == "/hooks/bob"
        assert hooks[0]["body"]["type"] == "reminder.due"  # the Standard Webhooks envelope
        assert hooks[0]["headers"]["Idempotency-Key"] == hooks[0]["body"]["data"]["id"]
        assert hooks[0]["body"]["data"]["title"] == "Quarterly report"

        # The same instant again: nothing new is sent, and the sensor does not start a sweep.
        tick, checks = _cycle(config_path, db_url, "2027-01-10T00:00:00Z", instance)
        assert isinstance(tick, dg.SkipReason)
        assert (len(smtp.messages), len(hooks)) == (2, 1)

        # 14 Jan 12:00Z: the report's -P1D (14 Jan 11:00Z) and the AoE paper deadline's -P7D
        # (21 Jan 11:59:59Z - 7 days) are due: 2 reminders x (2 mails + 1 webhook).
        tick, checks = _cycle(config_path, db_url, "2027-01-14T12:00:00Z", instance)
        assert isinstance(tick, dg.RunRequest) and checks["alerts_reconciled"] and all(checks.values()), checks
        assert (len(smtp.messages), len(hooks)) == (6, 3)
        titles = sorted(h["body"]["data"]["title"] for h in hooks[1:])
        assert titles == ["Quarterly report", "TESTCONF 2027 — Paper Submission"]
        due = sorted(h["body"]["data"]["due_at"] for h in hooks[1:])
        assert due == ["2027-01-15T11:00:00Z", "2027-01-21T11:59:59Z"]
        tick, _ = _cycle(config_path, db_url, "2027-01-14T12:00:00Z", instance)
        assert isinstance(tick, dg.SkipReason) and (len(smtp.messages), len(hooks)) == (6, 3)

        # Dagster saw it all: source observations carry the payload sha256 as their data version.
        obs = instance.fetch_observations(dg.AssetKey(["source", "cal"]), limit=10).records
        assert obs and all(len(r.asset_observation.tags["dagster/data_version"]) == 64 for r in obs)


def test_a_subscriber_no_subscription_reaches_turns_the_asset_check_red(config_path, db_url, tmp_path):
    """carl (tenant t1, his tenant cell left empty would give 'default' alike) is listed by neither
    subscription: the plan job succeeds, its obligations materialization counts the planning
    problem, and the plan_complete asset check is red."""
    import yaml

    doc = yaml.safe_load(config_path.read_text())
    doc["subscribers"].append({"id": "carl", "email": "carl@example.org", "timezone": "UTC"})
    config_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with dg.instance_for_test() as instance:
        _, checks = _cycle(config_path, db_url, "2027-01-10T00:00:00Z", instance)
        event = instance.get_latest_materialization_event(dg.AssetKey("obligations"))
    assert checks["plan_complete"] is False, checks
    # Judged by the real clock, not the replayed 2027 instant: a replay does not turn it red.
    assert checks["clock_agrees"] is True, checks
    assert event.asset_materialization.metadata["planning_problems"].value == 1


def test_overdue_alert_turns_the_check_red(config_path, db_url, tmp_path, smtp_server):
    """With the mail server gone, the due reminders stay undelivered past the grace window: red."""
    controller, _ = smtp_server
    controller.stop()
    with dg.instance_for_test() as instance:
        _cycle(config_path, db_url, "2027-01-10T00:00:00Z", instance)
        _, checks = _cycle(config_path, db_url, "2027-01-10T01:00:00Z", instance)
    assert checks["alerts_reconciled"] is False


def test_deadline_moved_into_the_past_is_escalated_through_dagster(config_path, db_url, tmp_path, smtp_server):
    """The paper deadline (21 Jan 11:59:59Z, nothing delivered yet) is revised to 9 Jan, already past
    on 11 Jan: each of its subscribers' channels gets a reminder the deliver job escalates as
    missed, escalations_acknowledged is red, and the plan's `alerts` materialization counts them."""
    _, smtp = smtp_server
    with dg.instance_for_test() as instance:
        _cycle(config_path, db_url, "2027-01-10T00:00:00Z", instance)
        sent = len(smtp.messages)
        (tmp_path / "confs.yml").write_text(ai_deadlines({
            "title": "TESTCONF", "year": 2027, "id": "testconf27", "link": "https://conf.example.org/",
            "deadlines": [{"type": "submission", "label": "Paper Submission", "date": "2027-01-08 23:59:59",
                           "timezone": "AoE"}],
        }))
        tick, checks = _cycle(config_path, db_url, "2027-01-11T12:00:00Z", instance)
        assert isinstance(tick, dg.RunRequest)
        assert checks["escalations_acknowledged"] is False, checks
        event = instance.get_latest_materialization_event(dg.AssetKey("alerts"))
        # ann by mail, bob by mail and webhook.
        assert event.asset_materialization.metadata["moved_into_past_missed"].value == 3
        assert len(smtp.messages) == sent  # nobody was sent a reminder for a deadline already past
