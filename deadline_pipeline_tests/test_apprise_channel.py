"""The apprise channel through the real Apprise library to a loopback receiver: Apprise's generic
``json://`` and ``form://`` webhooks, Mattermost's incoming webhook (``mmost://``, the
Slack-compatible chat form) and ntfy (``ntfy://``, push), each with the subscriber's target filled
into the service URL; failures classified honestly (retried with backoff as unknown outcomes,
configuration errors permanent); and the sweep delivering through it (SQLite and PostgreSQL).
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest
from sqlalchemy import select, update

from deadline_pipeline.config import AppriseChannel, DeadlinesConfig
from deadline_pipeline.deliver.channels.base import IDEMPOTENCY_NOTIFICATION, build_channel
from deadline_pipeline.deliver.notification import DeliveryError, Notification
from deadline_pipeline.deliver.sweep import sweep
from deadline_pipeline.store.schema import alerts, subscribers
from deadline_pipeline_tests.test_delivery_sweep import T0, attempts_of, seed

KEY = "0123456789abcdef" * 4


class _Receiver(BaseHTTPRequestHandler):
    """Records ``(path, content type, body)`` of every POST; answers 500 while ``failures`` > 0."""

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        srv = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with srv.lock:
            srv.posts.append((self.path, self.headers.get("Content-Type", ""), body))
            failing = srv.failures > 0
            srv.failures -= 1
        status = 500 if failing else 200
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")


@pytest.fixture
def receiver():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.daemon_threads = True
    server.posts, server.lock, server.failures = [], threading.Lock(), 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _n(target: str | None = "ops-team", kind: str = "reminder") -> Notification:
    due = datetime(2027, 4, 15, 21, 59, tzinfo=UTC)
    return Notification(dedup_key=KEY, kind=kind, subscriber_id="s1", email=None, webhook_url=None,
                        subscriber_tz="Europe/Berlin", source="irs", rule_id="1040", title="Tax <return>", due_at=due,
                        offset_seconds=-86400, sent_at=due - timedelta(days=1), apprise_target=target)


def _send(monkeypatch, url: str, n: Notification | None = None):
    monkeypatch.setenv("APPRISE_URL", url)
    ch = build_channel("push", AppriseChannel(type="apprise", url_env="APPRISE_URL", timeout_seconds=3))
    assert ch.idempotency_class == IDEMPOTENCY_NOTIFICATION
    return ch.send(n or _n())


def test_json_target_per_subscriber(receiver, monkeypatch):
    server, host = receiver
    res = _send(monkeypatch, f"json://{host}/hooks/{{target}}")
    assert res.provider_message_id == "apprise JSON"
    [(path, ctype, body)] = server.posts
    assert path.split("?")[0] == "/hooks/ops-team" and ctype.startswith("application/json")
    doc = json.loads(body)
    assert doc["title"].startswith("Reminder: Tax <return>") and KEY in doc["message"], "the reference travels"


def test_form_target(receiver, monkeypatch):
    server, host = receiver
    _send(monkeypatch, f"form://{host}/forms/{{target}}")
    [(path, ctype, body)] = server.posts
    assert path.split("?")[0] == "/forms/ops-team" and ctype.startswith("application/x-www-form-urlencoded")
    form = parse_qs(body.decode())
    assert KEY in form["message"][0]


def test_chat_service_through_its_incoming_webhook(receiver, monkeypatch):
    server, host = receiver
    res = _send(monkeypatch, f"mmost://{host}/hooktoken123")
    assert res.provider_message_id == "apprise Mattermost"
    [(path, _ctype, body)] = server.posts
    assert path == "/hooks/hooktoken123"
    assert "Tax <return>" in json.loads(body)["text"]


def test_push_service_topic_per_subscriber(receiver, monkeypatch):
    server, host = receiver
    assert _send(monkeypatch, f"ntfy://{host}/{{target}}").provider_message_id == "apprise ntfy"
    [(_path, _ctype, body)] = server.posts
    assert json.loads(body)["topic"] == "ops-team"


def test_a_failure_is_a_retryable_unknown_outcome(receiver, monkeypatch):
    server, host = receiver
    server.failures = 1
    with pytest.raises(DeliveryError, match="500") as exc:
        _send(monkeypatch, f"json://{host}/hooks/{{target}}")
    assert not exc.value.permanent and exc.value.outcome == "unknown"
    assert len(server.posts) == 1, "Apprise did not retry on its own behind our back"


@pytest.mark.parametrize("url, n, problem", [
    ("bogus://nowhere", None, "not a URL Apprise supports"),
    ("json://127.0.0.1:9/{target}", _n(target=None), "has no apprise_target"),
])
def test_configuration_errors_are_permanent(monkeypatch, url, n, problem):
    with pytest.raises(DeliveryError, match=problem) as exc:
        _send(monkeypatch, url, n)
    assert exc.value.permanent


def test_unset_url_variable_is_permanent(monkeypatch):
    monkeypatch.delenv("APPRISE_URL", raising=False)
    ch = build_channel("push", AppriseChannel(type="apprise", url_env="APPRISE_URL"))
    with pytest.raises(DeliveryError, match="APPRISE_URL") as exc:
        ch.send(_n())
    assert exc.value.permanent


def test_sweep_retries_with_backoff_then_delivers(engine, receiver, monkeypatch):
    server, host = receiver
    monkeypatch.setenv("APPRISE_URL", f"json://{host}/hooks/{{target}}")
    [a] = seed(engine, 1, channel="push")
    with engine.begin() as conn:
        conn.execute(update(subscribers).values(apprise_target="desk-7"))
    cfg = DeadlinesConfig(channels={"push": AppriseChannel(type="apprise", url_env="APPRISE_URL", timeout_seconds=3)},
                          delivery={"backoff_base_seconds": 30})
    server.failures = 1
    first = sweep(engine, cfg, T0)
    assert (first.failed, first.delivered) == (1, 0)
    with engine.connect() as conn:
        status, retry_at = conn.execute(select(alerts.c.status, alerts.c.next_attempt_at)
                                        .where(alerts.c.id == a)).one()
    assert status == "retry_wait" and T0 + timedelta(seconds=15) <= retry_at <= T0 + timedelta(seconds=30)
    assert sweep(engine, cfg, T0 + timedelta(seconds=10)).claimed == 0, "backoff holds"
    second = sweep(engine, cfg, retry_at)
    assert second.delivered == 1
    assert [p.split("?")[0] for p, _, _ in server.posts] == ["/hooks/desk-7", "/hooks/desk-7"]
    assert [o for _, o, _ in attempts_of(engine, a)] == ["unknown", "sent"]


def test_escalation_notice_reaches_the_operators_target(engine, receiver, monkeypatch):
    server, host = receiver
    monkeypatch.setenv("PUSH_URL", f"json://{host}/people/{{target}}")
    monkeypatch.setenv("OPS_URL", f"json://{host}/ops/{{target}}")
    [a] = seed(engine, 1, channel="push")  # its subscriber has no apprise_target: a permanent error
    cfg = DeadlinesConfig(channels={"push": AppriseChannel(type="apprise", url_env="PUSH_URL"),
                                    "ops": AppriseChannel(type="apprise", url_env="OPS_URL")},
                          escalation={"channels": ["ops"], "apprise_target": "oncall"})
    out = sweep(engine, cfg, T0)
    assert (out.escalated, out.escalation_notices) == (1, 1)
    [(path, _ctype, body)] = server.posts
    assert path.split("?")[0] == "/ops/oncall" and "has no apprise_target" in json.loads(body)["message"]
    with engine.connect() as conn:
        assert conn.execute(select(alerts.c.status).where(alerts.c.id == a)).scalar_one() == "escalated"
