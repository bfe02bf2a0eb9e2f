"""Pages to the on-call are incidents, never reminders.

Every page path through real channels to real loopback receivers: the watchdog command
(``watchdog --notify``) and the delivery sweep through the webhook channel to an HTTP receiver,
Apprise's ``json://`` service to the same kind of receiver, e-mail pages into a maildir, and the
``pagerduty`` / ``alertmanager`` bodies of the webhook channel. Every page must carry an incident
event type and one incident key from trigger to resolve; subscribers' reminders on the same channel
keep their ``reminder.*`` envelope.

The PagerDuty and Alertmanager rules below are written from their specifications (PagerDuty Events
API v2, "Send an Alert Event"; Alertmanager's webhook body version 4 and ``POST /api/v2/alerts``),
not taken from the code under test.
"""

from __future__ import annotations

import email
import email.policy
import json
import mailbox
import re
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from deadline_pipeline.cli import main
from deadline_pipeline_tests.factories import LOOPBACK_NETWORK, ics, loopback_policy, write_config

T0 = datetime(2027, 1, 10, tzinfo=UTC)

# PagerDuty Events API v2, "Send an Alert Event": the fields an alert event may carry and their rules.
PD_TOP = {"routing_key", "event_action", "dedup_key", "payload", "images", "links", "client", "client_url"}
PD_PAYLOAD = {"summary", "source", "severity", "timestamp", "component", "group", "class", "custom_details"}
PD_SEVERITIES = {"critical", "error", "warning", "info"}
PD_ACTIONS = {"trigger", "acknowledge", "resolve"}
# Alertmanager: one alert of the webhook body (version 4), label names as its data model allows.
AM_ALERT = {"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"}
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
ZERO_TIME = "0001-01-01T00:00:00Z"


def assert_pagerduty_event(event: dict, *, routing_key: str | None = None) -> None:
    """``event`` is a valid PagerDuty Events v2 alert event (trigger with payload, or resolve)."""
    assert set(event) <= PD_TOP, set(event) - PD_TOP
    assert event["event_action"] in PD_ACTIONS
    key = event["dedup_key"]
    assert isinstance(key, str) and 0 < len(key) <= 255
    if routing_key is None:
        assert "routing_key" not in event  # left to the operator's relay or the pagerduty body
    else:
        assert event["routing_key"] == routing_key
    if event["event_action"] != "trigger":
        assert set(event) <= {"routing_key", "event_action", "dedup_key"}, event
        return
    payload = event["payload"]
    assert set(payload) <= PD_PAYLOAD, set(payload) - PD_PAYLOAD
    assert isinstance(payload["summary"], str) and 0 < len(payload["summary"]) <= 1024
    assert isinstance(payload["source"], str) and payload["source"]
    assert payload["severity"] in PD_SEVERITIES
    assert RFC3339.match(payload["timestamp"]), payload["timestamp"]
    for link in event.get("links", []):
        assert link["href"].startswith(("http://", "https://")), link


def assert_alertmanager_alert(alert: dict, status: str) -> None:
    assert set(alert) == AM_ALERT
    assert alert["status"] == status
    assert alert["labels"] and all(LABEL_NAME.match(k) and isinstance(v, str) for k, v in alert["labels"].items())
    assert all(LABEL_NAME.match(k) and isinstance(v, str) for k, v in alert["annotations"].items())
    assert alert["annotations"]["summary"]
    assert RFC3339.match(alert["startsAt"])
    assert re.fullmatch(r"[0-9a-f]{16}", alert["fingerprint"])
    if status == "firing":
        assert alert["endsAt"] == ZERO_TIME
    else:
        assert RFC3339.match(alert["endsAt"]) and alert["endsAt"] >= alert["startsAt"]


def assert_incident_body(body: dict) -> dict:
    """``body`` is a Standard Webhooks envelope of a page; returns its ``data``."""
    assert set(body) == {"type", "timestamp", "data"}
    assert body["type"] in ("incident.triggered", "incident.resolved"), body["type"]
    data = body["data"]
    status = body["type"].split(".")[1]
    assert data["status"] == status
    for name in ("incident_key", "severity", "source", "summary", "check", "target", "links", "started_at"):
        assert name in data, name
    assert data["incident_key"].startswith("deadline-pipeline/") and len(data["incident_key"]) <= 255
    assert data["severity"] in PD_SEVERITIES
    assert data["summary"] and "\n" not in data["summary"]
    assert (data["ended_at"] is None) == (status == "triggered")
    assert_pagerduty_event(data["pagerduty"])
    assert data["pagerduty"]["dedup_key"] == data["incident_key"]
    assert data["pagerduty"]["event_action"] == ("trigger" if status == "triggered" else "resolve")
    assert_alertmanager_alert(data["alertmanager"], "firing" if status == "triggered" else "resolved")
    assert data["alertmanager"]["labels"]["alertname"] == data["check"]
    return data


class _Receiver(BaseHTTPRequestHandler):
    """Records ``(path, headers, JSON body)`` of every POST; answers 202 like PagerDuty's enqueue."""

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.server.lock:
            self.server.posts.append((self.path, dict(self.headers.items()), json.loads(raw)))
        answer = b'{"status":"success","message":"Event processed"}'
        self.send_response(202)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


@pytest.fixture
def receiver():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.daemon_threads = True
    server.posts, server.lock = [], threading.Lock()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _bodies(server, path: str) -> list[dict]:
    with server.lock:
        return [body for p, _, body in server.posts if p == path]


# --------------------------------------------------------------------------- the watchdog command


def _cli(args, tmp_path):
    env = {"DEADLINE_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    return CliRunner().invoke(main, args, env=env, catch_exceptions=False)


def _two_sources_one_webhook(tmp_path, url: str):
    """Sources ``cal`` and ``cal2`` (freshness P1D); subscriber ann gets her reminders on the
    webhook channel ``hook`` (``/hook``), and the same channel pages the on-call (``/page``)."""
    for name, uid in (("cal", "a@test"), ("cal2", "b@test")):
        (tmp_path / f"{name}.ics").write_text(ics(dict(uid=uid, tzid="Europe/Berlin", dtstart="20270115T120000",
                                                       summary=f"File report {name}")), newline="")
    return write_config(
        tmp_path,
        sources=[{"name": n, "format": "ics", "location": f"{n}.ics", "tenant": "t1", "freshness": "P1D"}
                 for n in ("cal", "cal2")],
        subscribers=[{"id": "ann", "tenant": "t1", "webhook_url": f"{url}/hook", "timezone": "Europe/Berlin"}],
        subscriptions=[{"name": "all", "sources": ["cal", "cal2"], "offsets": ["-P7D", "-P1D"], "channels": ["hook"]}],
        channels={"hook": {"type": "webhook", "timeout_seconds": 5}},
        escalation={"channels": ["hook"], "webhook_url": f"{url}/page", "reminder_minutes": 60},
        network=LOOPBACK_NETWORK,
    )


def test_watchdog_pages_are_incidents_with_one_key_from_trigger_to_resolve(tmp_path, receiver):
    """Two silent days: every red row pages ``incident.triggered``; after a run the watchdog is green
    and resolves each with ``incident.resolved`` under the same key; two days later the same rows
    trigger again under the same keys. The reminders the run sent on the same channel stay
    ``reminder.due``."""
    server, url = receiver
    path = _two_sources_one_webhook(tmp_path, url)
    db = ["--config", str(path), "--db-url", f"sqlite:///{tmp_path / 'store.sqlite3'}"]
    state = ["--notify", "--state", str(tmp_path / "watchdog.json")]

    assert _cli(["run", *db, "--as-of", T0.isoformat()], tmp_path).exit_code == 0
    reminders = _bodies(server, "/hook")
    assert reminders and {b["type"] for b in reminders} == {"reminder.due"}, reminders
    assert all("incident_key" not in b["data"] for b in reminders)

    red = _cli(["watchdog", *db, *state, "--as-of", (T0 + timedelta(days=2)).isoformat()], tmp_path)
    assert red.exit_code == 1, red.output
    first = [assert_incident_body(b) for b in _bodies(server, "/page")]
    assert first and {d["status"] for d in first} == {"triggered"}
    keys = [d["incident_key"] for d in first]
    assert len(set(keys)) == len(keys), "one page per incident, each with its own key"
    # One check on two targets: two incidents, two keys; the key reads as component/check/target.
    assert {"deadline-pipeline/watchdog/source_fresh/cal", "deadline-pipeline/watchdog/source_fresh/cal2",
            "deadline-pipeline/watchdog/sweep_alive/deliver"} <= set(keys), keys
    sweep = next(d for d in first if d["check"] == "sweep_alive")
    assert (sweep["target"], sweep["severity"], sweep["component"]) == ("deliver", "critical", "watchdog")

    assert _cli(["run", *db, "--as-of", (T0 + timedelta(days=2)).isoformat()], tmp_path).exit_code == 0
    green = _cli(["watchdog", *db, *state, "--as-of", (T0 + timedelta(days=2, minutes=5)).isoformat()], tmp_path)
    assert green.exit_code == 0, green.output
    resolved = [assert_incident_body(b) for b in _bodies(server, "/page")[len(first):]]
    assert {d["status"] for d in resolved} == {"resolved"}
    assert sorted(d["incident_key"] for d in resolved) == sorted(keys), "each resolve names its trigger's key"
    by_key = {d["incident_key"]: d for d in first}
    for done in resolved:
        opened = by_key[done["incident_key"]]
        assert done["alertmanager"]["fingerprint"] == opened["alertmanager"]["fingerprint"]
        assert done["started_at"] == opened["started_at"] and done["ended_at"] >= done["started_at"]

    again = _cli(["watchdog", *db, *state, "--as-of", (T0 + timedelta(days=4)).isoformat()], tmp_path)
    assert again.exit_code == 1
    second = [assert_incident_body(b) for b in _bodies(server, "/page")[len(first) + len(resolved):]]
    assert {d["status"] for d in second} == {"triggered"}
    assert set(keys) <= {d["incident_key"] for d in second}, "the same check and target, the same key"
    # Every page is its own message (webhook-id), equal to the Idempotency-Key.
    with server.lock:
        ids = [h["webhook-id"] for p, h, _ in server.posts if p == "/page"]
        assert all(h["webhook-id"] == h["Idempotency-Key"] for p, h, _ in server.posts if p == "/page")
    assert len(set(ids)) == len(ids)


def test_the_incident_key_is_the_same_in_another_process():
    from deadline_pipeline.deliver.incident import incident_key

    code = ("from deadline_pipeline.deliver.incident import incident_key; "
            "print(incident_key('watchdog', 'source_fresh', 'us federal/tax'))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "12345", "PATH": "", "PYTHONPATH": ":".join(sys.path)})
    here = incident_key("watchdog", "source_fresh", "us federal/tax")
    assert other.stdout.strip() == here == "deadline-pipeline/watchdog/source_fresh/us%20federal%2Ftax"
    # Parts are encoded, so they cannot run into each other.
    assert incident_key("dagster", "a/b", "c") != incident_key("dagster", "a", "b/c")
    # PagerDuty's 255 characters: a long target keeps a readable start and a digest of the whole key.
    long = incident_key("watchdog", "source_fresh", "x" * 400)
    assert len(long) == 255 and long.startswith("deadline-pipeline/watchdog/source_fresh/xxx")
    assert long == incident_key("watchdog", "source_fresh", "x" * 400) != incident_key("watchdog", "source_fresh",
                                                                                       "x" * 401)


# --------------------------------------------------------------------------- the delivery sweep


def test_an_escalated_alert_is_paged_as_an_incident(engine, receiver):
    from deadline_pipeline.config import DeadlinesConfig, EscalationConfig, MaildirChannel, WebhookChannel
    from deadline_pipeline.deliver.notification import DeliveryError
    from deadline_pipeline.deliver.sweep import sweep
    from deadline_pipeline_tests.test_delivery_sweep import T0 as SWEEP_T0
    from deadline_pipeline_tests.test_delivery_sweep import FakeChannel, seed

    server, url = receiver
    [a] = seed(engine, 1, channel="fake", title="Tax return")
    fake = FakeChannel()
    fake.default_error = DeliveryError("550 no such user", permanent=True)
    cfg = DeadlinesConfig(
        channels={"fake": MaildirChannel(type="maildir", path="/nonexistent"),
                  "pager": WebhookChannel(type="webhook", timeout_seconds=5)},
        escalation=EscalationConfig(channels=["pager"], webhook_url=f"{url}/page"), network=LOOPBACK_NETWORK)
    out = sweep(engine, cfg, SWEEP_T0, channels={"fake": fake})
    assert (out.escalated, out.escalation_notices) == (1, 1)
    [body] = _bodies(server, "/page")
    data = assert_incident_body(body)
    assert body["type"] == "incident.triggered"
    assert data["incident_key"] == f"deadline-pipeline/delivery/alert_delivered/alert-{a}"
    assert (data["check"], data["target"], data["severity"]) == ("alert_delivered", f"alert-{a}", "error")
    assert data["summary"] == "NOT DELIVERED: Tax return" and "550 no such user" in data["detail"]


# --------------------------------------------------------------------------- other channels


def _notices(problem, reminder=timedelta(minutes=60)):
    """The trigger at T0 and the resolve at T0 + 1 h of one incident about ``problem``."""
    from deadline_pipeline.watch.watchdog import incident_notices, record_notice

    state: dict = {}
    [opened] = incident_notices(state, {"watchdog sweep_alive:deliver": problem}, T0, reminder)
    record_notice(state, opened, T0)
    [resolved] = incident_notices(state, {}, T0 + timedelta(hours=1), reminder)
    return opened, resolved


def _sweep_problem():
    from deadline_pipeline.watch.watchdog import Problem

    return Problem("sweep_alive", "deliver", "stopped: last completed 2 days ago", component="watchdog")


def test_apprise_pages_say_incident_in_title_body_and_notify_type(receiver, monkeypatch):
    """Through Apprise's generic JSON service (it posts title, message and the notify type)."""
    from deadline_pipeline.config import AppriseChannel, DeadlinesConfig, EscalationConfig
    from deadline_pipeline.deliver.channels.registry import build_channel
    from deadline_pipeline.watch.watchdog import send_notice
    from deadline_pipeline_tests.test_apprise_channel import _n

    server, url = receiver
    monkeypatch.setenv("PAGER_URL", f"json://{url.removeprefix('http://')}/apprise")
    cfg = DeadlinesConfig(channels={"push": AppriseChannel(type="apprise", url_env="PAGER_URL", timeout_seconds=3)},
                          escalation=EscalationConfig(channels=["push"]), network=LOOPBACK_NETWORK)
    opened, resolved = _notices(_sweep_problem())
    assert send_notice(cfg, opened, T0) == []
    assert send_notice(cfg, resolved, T0 + timedelta(hours=1)) == []
    build_channel("push", cfg.channels["push"], network=loopback_policy()).send(_n(target=None))
    trigger, resolve, reminder = _bodies(server, "/apprise")
    key = "deadline-pipeline/watchdog/sweep_alive/deliver"
    assert trigger["title"].startswith(f"[incident triggered] {key}: ") and trigger["type"] == "failure"
    assert resolve["title"].startswith(f"[incident resolved] {key}: ") and resolve["type"] == "success"
    assert f"Incident key: {key}" in trigger["message"] and "Severity: critical" in trigger["message"]
    assert resolve["message"].startswith("Incident resolved: ")
    # A subscriber's reminder on the same service is what it always was.
    assert reminder["title"].startswith("Reminder: ") and reminder["type"] == "info"


def test_apprise_pagerduty_and_opsgenie_urls_carry_the_incident_key():
    """Apprise parses the URL the channel builds per page: PagerDuty gets the incident key as its
    dedup key and the action of the page; Opsgenie gets it as the alert's alias."""
    import apprise

    from deadline_pipeline.config import EscalationConfig
    from deadline_pipeline.deliver.channels.apprise_channel import incident_service_url
    from deadline_pipeline.watch.watchdog import notice_incident

    opened, resolved = _notices(_sweep_problem())
    esc = EscalationConfig()
    seen = []
    for notice, action in ((opened, "trigger"), (resolved, "resolve")):
        incident = notice_incident(notice, T0, esc)
        for url in ("pagerduty://intkey1234@apikey5678/pipeline?action=map", "opsgenie://apikey5678"):
            app = apprise.Apprise(asset=apprise.AppriseAsset(storage_mode="memory"))
            assert app.add(incident_service_url(url, incident))
            seen.append(next(iter(app)))
        pd, og = seen[-2:]
        assert (pd.dedup, pd.action, pd.severity) == (incident.key, action, "critical")
        assert og.alias == incident.key
    assert seen[0].dedup == seen[2].dedup == "deadline-pipeline/watchdog/sweep_alive/deliver"


def test_email_pages_say_incident_and_the_key_in_the_subject(tmp_path):
    from deadline_pipeline.config import DeadlinesConfig, EscalationConfig, MaildirChannel
    from deadline_pipeline.watch.watchdog import send_notice

    cfg = DeadlinesConfig(channels={"ops": MaildirChannel(type="maildir", path=str(tmp_path / "ops"))},
                          escalation=EscalationConfig(channels=["ops"], email="ops@example.org"))
    opened, resolved = _notices(_sweep_problem())
    assert send_notice(cfg, opened, T0) == [] and send_notice(cfg, resolved, T0 + timedelta(hours=1)) == []
    box = mailbox.Maildir(tmp_path / "ops", factory=None, create=False)
    mails = sorted((email.message_from_bytes(box.get_bytes(k), policy=email.policy.default) for k in box.keys()),
                   key=lambda m: m["Date"].datetime)
    subjects = [str(m["Subject"]) for m in mails]
    key = "deadline-pipeline/watchdog/sweep_alive/deliver"
    assert subjects[0].startswith(f"[incident triggered] {key}: [deadline-pipeline] watchdog sweep_alive:deliver "
                                  "failed: stopped"), subjects
    assert subjects[1].startswith(f"[incident resolved] {key}: [deadline-pipeline] resolved"), subjects
    text = mails[1].get_body(("plain",)).get_content()
    assert "Incident resolved: " in text and "Resolved at: 2027-01-10 01:00 UTC" in text
    assert not any(s.startswith("Reminder") for s in subjects)


def _page_channel(url: str, body: str, **extra):
    from deadline_pipeline.config import DeadlinesConfig, EscalationConfig, WebhookChannel

    return DeadlinesConfig(channels={"pd": WebhookChannel(type="webhook", timeout_seconds=5, body=body, **extra)},
                           escalation=EscalationConfig(channels=["pd"], webhook_url=url,
                                                       dagster_ui_url="http://dagster.internal:3000/"),
                           network=LOOPBACK_NETWORK)


def test_pagerduty_body_is_the_events_v2_event(receiver, monkeypatch):
    from deadline_pipeline.watch.watchdog import Problem, send_notice

    server, url = receiver
    monkeypatch.setenv("PD_ROUTING_KEY", "R0UT1NGKEY0000000000000000000000")
    cfg = _page_channel(f"{url}/v2/enqueue", "pagerduty", routing_key_env="PD_ROUTING_KEY")
    problem = Problem("run", "deliver_job", "run 1a2b of deliver_job failed " + "x" * 2000, component="dagster",
                      links=(("run 1a2b in the Dagster UI", "/runs/1a2b"),))
    opened, resolved = _notices(problem)
    assert send_notice(cfg, opened, T0) == [] and send_notice(cfg, resolved, T0 + timedelta(hours=1)) == []
    trigger, resolve = _bodies(server, "/v2/enqueue")
    for event in (trigger, resolve):
        assert_pagerduty_event(event, routing_key="R0UT1NGKEY0000000000000000000000")
    key = "deadline-pipeline/dagster/run/deliver_job"
    assert (trigger["event_action"], trigger["dedup_key"]) == ("trigger", key)
    assert resolve == {"routing_key": "R0UT1NGKEY0000000000000000000000", "event_action": "resolve", "dedup_key": key}
    assert len(trigger["payload"]["summary"]) == 1024  # cut to PagerDuty's limit, not refused
    assert trigger["links"] == [{"href": "http://dagster.internal:3000/runs/1a2b",
                                 "text": "run 1a2b in the Dagster UI"}]
    assert (trigger["payload"]["class"], trigger["payload"]["component"]) == ("run", "dagster")
    assert trigger["client_url"] == "http://dagster.internal:3000"


def test_alertmanager_body_fires_then_resolves_one_alert(receiver):
    from deadline_pipeline.watch.watchdog import send_notice

    server, url = receiver
    cfg = _page_channel(f"{url}/api/v2/alerts", "alertmanager")
    opened, resolved = _notices(_sweep_problem())
    assert send_notice(cfg, opened, T0) == [] and send_notice(cfg, resolved, T0 + timedelta(hours=1)) == []
    [firing], [done] = _bodies(server, "/api/v2/alerts")
    assert set(firing) == {"labels", "annotations", "startsAt", "endsAt"}
    assert firing["labels"] == done["labels"], "one alert: the same labels from firing to resolved"
    assert firing["labels"]["incident_key"] == "deadline-pipeline/watchdog/sweep_alive/deliver"
    assert (firing["startsAt"], firing["endsAt"]) == ("2027-01-10T00:00:00Z", "2027-01-10T02:00:00Z")
    assert done["endsAt"] == "2027-01-10T01:00:00Z"


def test_page_only_bodies_refuse_reminders_and_need_their_settings(monkeypatch):
    from pydantic import ValidationError

    from deadline_pipeline.config import ConfigError, DeadlinesConfig, WebhookChannel
    from deadline_pipeline.deliver.channels.registry import build_channel
    from deadline_pipeline.deliver.notification import DeliveryError
    from deadline_pipeline_tests.test_apprise_channel import _n

    ch = build_channel("am", WebhookChannel(type="webhook", body="alertmanager"), network=loopback_policy())
    reminder = _n()
    reminder = type(reminder)(**{**reminder.__dict__, "webhook_url": "http://127.0.0.1:9/api/v2/alerts"})
    with pytest.raises(DeliveryError, match="carries pages only") as info:
        ch.send(reminder)
    assert info.value.permanent
    with pytest.raises(ValidationError, match="needs routing_key_env"):
        WebhookChannel(type="webhook", body="pagerduty")
    with pytest.raises((ValidationError, ConfigError), match="carries pages only"):
        DeadlinesConfig(channels={"am": {"type": "webhook", "body": "alertmanager"}},
                        sources=[{"name": "s", "format": "ics", "location": "x.ics", "tenant": "t"}],
                        subscriptions=[{"name": "all", "sources": ["s"], "offsets": ["-P1D"], "channels": ["am"]}])


def test_a_page_is_never_a_reminder_shaped_notification():
    from deadline_pipeline.config import EscalationConfig
    from deadline_pipeline.deliver.notification import Notification
    from deadline_pipeline.watch.watchdog import notice_incident

    base = dict(dedup_key="ab", subscriber_id="on-call", email=None, webhook_url=None, subscriber_tz="UTC",
                source="s", rule_id="r", title="t", due_at=T0, offset_seconds=0)
    with pytest.raises(ValueError, match="incident missing"):
        Notification(kind="incident", **base)
    incident = notice_incident(_notices(_sweep_problem())[0], T0, EscalationConfig())
    with pytest.raises(ValueError, match="incident set"):
        Notification(kind="reminder", incident=incident, **base)


def test_an_incident_opened_before_problems_were_kept_is_resolved_under_its_check_key():
    """State files and sensor cursors written by earlier releases hold no check or target. While the
    incident is still red its entry learns them, so its resolve names the proper key; one that
    resolves first (or whose stored problem is unreadable) is resolved under a key made from its
    state key, and the page is still built."""
    from deadline_pipeline.config import EscalationConfig
    from deadline_pipeline.watch.watchdog import incident_notices, notice_incident

    reminder, esc = timedelta(minutes=60), EscalationConfig()
    old = {"opened_at": T0.isoformat(), "summary": "stopped", "notified_at": T0.isoformat(), "reminders": 0}
    state = {"watchdog sweep_alive:deliver": dict(old)}
    assert incident_notices(state, {"watchdog sweep_alive:deliver": _sweep_problem()}, T0 + timedelta(minutes=5),
                            reminder) == []
    [done] = incident_notices(state, {}, T0 + timedelta(minutes=10), reminder)
    incident = notice_incident(done, T0 + timedelta(minutes=10), esc)
    assert (incident.key, incident.status) == ("deadline-pipeline/watchdog/sweep_alive/deliver", "resolved")

    for stored in (None, {"check": "sweep_alive"}, {"check": "x", "target": "y", "severity": "bogus", "links": 3}):
        state = {"watchdog sweep_alive:deliver": dict(old) | ({"problem": stored} if stored else {})}
        [done] = incident_notices(state, {}, T0 + timedelta(minutes=10), reminder)
        incident = notice_incident(done, T0 + timedelta(minutes=10), esc)
        assert incident.status == "resolved" and incident.key.startswith("deadline-pipeline/")
