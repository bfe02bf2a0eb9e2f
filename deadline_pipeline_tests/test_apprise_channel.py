"""The apprise channel through the real Apprise library to a loopback receiver: Apprise's generic
``json://`` and ``form://`` webhooks, Mattermost's incoming webhook (``mmost://``, the
Slack-compatible chat form) and ntfy (``ntfy://``, push), each with the subscriber's target filled
into the service URL; failures classified honestly (retried with backoff as unknown outcomes,
configuration errors permanent); the outbound guard checked before Apprise is called (the loopback
receivers are admitted by ``network.allow``; without it, loopback in any spelling is refused before
a connection), redirects not followed; and the sweep delivering through it (SQLite and PostgreSQL).
"""

from __future__ import annotations

import json
import socket
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest
from sqlalchemy import select, update

from deadline_pipeline.config import AppriseChannel, DeadlinesConfig
from deadline_pipeline.deliver.channels.apprise_channel import register_url_secrets
from deadline_pipeline.deliver.channels.base import IDEMPOTENCY_NOTIFICATION
from deadline_pipeline.deliver.channels.registry import build_channel
from deadline_pipeline.deliver.notification import DeliveryError, Notification
from deadline_pipeline.deliver.sweep import sweep
from deadline_pipeline.security import redact as rd
from deadline_pipeline.security.outbound import DEFAULT_POLICY, NetworkPolicy
from deadline_pipeline.store.schema import alerts, subscribers
from deadline_pipeline_tests.factories import LOOPBACK_NETWORK, loopback_policy
from deadline_pipeline_tests.test_delivery_sweep import T0, attempts_of, seed

KEY = "0123456789abcdef" * 4


class _Receiver(BaseHTTPRequestHandler):
    """Records ``(path, content type, body)`` of every POST; answers 500 while ``failures`` > 0, and
    ``307`` to ``server.redirect_to`` for paths under ``/redirect``."""

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        srv = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with srv.lock:
            srv.posts.append((self.path, self.headers.get("Content-Type", ""), body))
            failing = srv.failures > 0
            srv.failures -= 1
        if self.path.startswith("/redirect"):
            self.send_response(307)  # keeps the method: a followed redirect would POST again
            self.send_header("Location", srv.redirect_to)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        status = 500 if failing else 200
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")


def _start_receiver(host: str = "127.0.0.1") -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, 0), _Receiver)
    server.daemon_threads = True
    server.posts, server.lock, server.failures, server.redirect_to = [], threading.Lock(), 0, ""
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def receiver():
    server = _start_receiver()
    yield server, f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _n(target: str | None = "ops-team", kind: str = "reminder") -> Notification:
    due = datetime(2027, 4, 15, 21, 59, tzinfo=UTC)
    return Notification(dedup_key=KEY, kind=kind, subscriber_id="s1", email=None, webhook_url=None,
                        subscriber_tz="Europe/Berlin", source="irs", rule_id="1040", title="Tax <return>", due_at=due,
                        offset_seconds=-86400, sent_at=due - timedelta(days=1), apprise_target=target)


def _send(monkeypatch, url: str, n: Notification | None = None, network: NetworkPolicy | None = None):
    """Send through a channel built as the sweep builds it; ``network`` defaults to admitting the
    loopback receivers (``network.allow: [127.0.0.1/32]``)."""
    monkeypatch.setenv("APPRISE_URL", url)
    ch = build_channel("push", AppriseChannel(type="apprise", url_env="APPRISE_URL", timeout_seconds=3),
                       network=network or loopback_policy())
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
                          delivery={"backoff_base_seconds": 30}, network=LOOPBACK_NETWORK)
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
                          escalation={"channels": ["ops"], "apprise_target": "oncall"}, network=LOOPBACK_NETWORK)
    out = sweep(engine, cfg, T0)
    assert (out.escalated, out.escalation_notices) == (1, 1)
    [(path, _ctype, body)] = server.posts
    assert path.split("?")[0] == "/ops/oncall" and "has no apprise_target" in json.loads(body)["message"]
    with engine.connect() as conn:
        assert conn.execute(select(alerts.c.status).where(alerts.c.id == a)).scalar_one() == "escalated"


# --------------------------------------------------------------------------- the outbound guard


class ConnectionCounter:
    """A bare TCP listener on ``host`` (loopback) counting the connections it accepts, whatever the
    protocol (HTTP, SMTP): a refusal "before any connection" means ``accepted == 0``."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_server((host, 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def listener():
    lst = ConnectionCounter()
    yield lst
    lst.close()


def _to_loopback(host: str, port: int) -> list[str]:
    # Every name resolves to this machine's loopback: were the guard broken, the packet stays here.
    return ["127.0.0.1"]


@pytest.mark.parametrize("template, rule", [
    ("json://127.0.0.1:{port}/hooks/{{target}}", "loopback"),
    ("json://0x7f000001:{port}/hooks/{{target}}", "loopback"),
    ("json://2130706433:{port}/hooks/{{target}}", "loopback"),
    ("ntfy://push.test:{port}/{{target}}", r"'push\.test'.* loopback"),
    ("mmost://innocent.test:{port}/hooktoken123", "loopback"),
    ("mailto://mailer:pw-5c5c5c@example.org?smtp=127.0.0.1&port={port}&to=ops@example.org", "loopback"),
])
def test_a_disallowed_target_is_refused_before_apprise_connects(listener, monkeypatch, template, rule):
    policy = DEFAULT_POLICY.with_resolver(_to_loopback)  # loopback not in network.allow
    with pytest.raises(DeliveryError, match=rule) as exc:
        _send(monkeypatch, template.format(port=listener.port), network=policy)
    assert exc.value.permanent and exc.value.outcome == "failed", "refused: never retried"
    assert "network.allow" in str(exc.value) and "pw-5c5c5c" not in str(exc.value)
    assert listener.accepted == 0, "the guard decided before any connection"


def test_the_allow_list_admits_the_receiver_that_was_refused(receiver, monkeypatch):
    server, host = receiver
    url = f"json://{host}/hooks/{{target}}"
    with pytest.raises(DeliveryError, match="loopback") as exc:
        _send(monkeypatch, url, network=DEFAULT_POLICY)
    assert exc.value.permanent and server.posts == []
    assert _send(monkeypatch, url).provider_message_id == "apprise JSON"
    assert len(server.posts) == 1


def test_a_name_that_does_not_resolve_is_retryable_and_nothing_is_sent(monkeypatch):
    def nowhere(host, port):
        raise socket.gaierror(f"{host} not known")

    with pytest.raises(DeliveryError, match="cannot resolve 'gone.test'") as exc:
        _send(monkeypatch, "json://gone.test:8080/x", network=DEFAULT_POLICY.with_resolver(nowhere))
    assert not exc.value.permanent and exc.value.outcome == "failed"


def test_redirects_are_not_followed_even_when_the_url_asks(receiver, monkeypatch):
    # The second receiver listens on 127.0.0.2: loopback too, but outside the allow-list, and never
    # checked by the guard (Apprise's own requests would connect to it).
    server, host = receiver
    inner = _start_receiver("127.0.0.2")
    server.redirect_to = f"http://127.0.0.2:{inner.server_address[1]}/inside"
    try:
        with pytest.raises(DeliveryError) as exc:
            _send(monkeypatch, f"json://{host}/redirect/{{target}}?redirect=yes")
        assert not exc.value.permanent and exc.value.outcome == "unknown"
        assert len(server.posts) == 1 and inner.posts == [], "the 307 was not followed"
    finally:
        inner.shutdown()
        inner.server_close()


def test_the_service_url_and_its_token_never_appear_in_errors(receiver, monkeypatch):
    server, host = receiver
    server.failures = 1
    token = "tok3n-a9a9a9"
    with pytest.raises(DeliveryError) as exc:
        _send(monkeypatch, f"json://{host}/notify/{token}/{{target}}")
    assert token not in str(exc.value) and "$APPRISE_URL" in str(exc.value)
    assert server.posts[0][0].startswith(f"/notify/{token}/ops-team"), "the token was really used"
    # Registered when read: whatever prints the filled-in URL or the part holding the token later
    # (Apprise's own log lines, a traceback) is masked too.
    assert token not in rd.redact(f"JSON POST URL: http://{host}/notify/{token}/ops-team (cert_verify=True)")
    assert token not in rd.redact(f"json://{host}/notify/{token}/ops-team?cto=3&rto=3&redirect=no")


def test_a_token_in_the_hosts_place_is_masked_but_a_bare_server_address_is_not():
    register_url_secrets("tgram://123456789:AAHtok-en_x/{target}")
    assert "AAHtok-en_x" not in rd.redact("GET https://api.telegram.org/bot123456789:AAHtok-en_x/sendMessage")
    # A server's address is no secret: masking it in every message would garble unrelated ones.
    register_url_secrets("json://10.9.8.7:8080/{target}")
    assert rd.redact("connect to 10.9.8.7:8080/x failed") == "connect to 10.9.8.7:8080/x failed"
