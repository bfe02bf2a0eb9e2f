"""Delivery channels and message rendering against real servers on loopback.

SMTP: an aiosmtpd server whose handler records envelopes and answers chosen recipients with 450,
550 or a DATA reply slower than the client's timeout. Webhook: a stdlib ThreadingHTTPServer that
records requests and answers by path. Maildir: a folder under ``tmp_path`` read back with
:mod:`mailbox`.
"""

from __future__ import annotations

import asyncio
import base64
import email.parser
import email.policy
import email.utils
import hashlib
import hmac
import json
import mailbox
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult

from deadline_pipeline.config import MaildirChannel, SlackChannel, SmtpChannel, WebhookChannel
from deadline_pipeline.deliver.channels.base import Channel
from deadline_pipeline.deliver.channels.registry import build_channel
from deadline_pipeline.deliver.channels.webhook import parse_retry_after
from deadline_pipeline.deliver.notification import DeliveryError, Notification, SendResult
from deadline_pipeline.deliver.render import RenderError, build_email, message_id, render
from deadline_pipeline_tests.drip_server import DripServer
from deadline_pipeline_tests.factories import free_port, loopback_policy

DUE = datetime(2024, 6, 15, 21, 59, tzinfo=UTC)  # 23:59 CEST in Berlin
KEY = "3f2a9c0de1b4"


def make_notification(**changes) -> Notification:
    fields = {
        "dedup_key": KEY, "kind": "reminder", "subscriber_id": "ana", "email": "ana@example.org",
        "webhook_url": None, "subscriber_tz": "Europe/Berlin", "source": "conf-feed",
        "rule_id": "icml-2024", "title": "ICML 2024 paper", "due_at": DUE, "offset_seconds": -7 * 86400,
        "url": "https://icml.cc/Conferences/2024", "note": "Abstract first.", "previous_due_at": None,
    }
    return Notification(**(fields | changes))


def parse(raw: bytes):
    return email.parser.BytesParser(policy=email.policy.default).parsebytes(raw)


# --------------------------------------------------------------------------- rendering


def test_reminder_subject_shows_subscriber_zone_and_days_left():
    r = render(make_notification())
    assert r.subject == "Reminder: ICML 2024 paper due 2024-06-15 23:59 CEST (7 days left)"
    assert "2024-06-15 23:59 CEST (Europe/Berlin, UTC+02:00)" in r.text
    assert "2024-06-15 21:59 UTC" in r.text
    assert "2024-06-15 23:59 CEST" in r.html and "2024-06-15 21:59 UTC" in r.html


def test_long_title_is_shortened_but_due_time_stays_in_subject():
    r = render(make_notification(title="A" * 400, offset_seconds=-5400, subscriber_tz="AoE"))
    assert r.subject.endswith("… due 2024-06-15 09:59 UTC-12:00 (1 hour 30 minutes left)")
    assert "A" * 400 in r.text


def test_correction_and_cancellation_subjects():
    moved = make_notification(kind="correction", previous_due_at=DUE - timedelta(days=2),
                              subscriber_tz="America/Los_Angeles")
    assert render(moved).subject == (
        "Correction: ICML 2024 paper moved from 2024-06-13 14:59 PDT to 2024-06-15 14:59 PDT"
    )
    assert render(make_notification(kind="cancellation")).subject == "Cancelled: ICML 2024 paper"


def test_crlf_in_title_cannot_add_a_header():
    evil = "Paper\r\nBcc: victim@example.net\r\n\r\nbody\u2028X-Other: 1\x00"
    raw = build_email(make_notification(title=evil), "alerts@example.org").as_bytes()
    msg = parse(raw)
    assert msg["Bcc"] is None and msg["X-Other"] is None
    assert sorted(k.lower() for k in msg) == sorted([
        "from", "to", "subject", "date", "message-id", "x-deadline-dedup-key", "auto-submitted",
        "mime-version", "content-type",
    ])
    assert msg["Subject"].startswith("Reminder: Paper Bcc: victim@example.net body X-Other: 1 due ")
    assert msg["To"] == "ana@example.org"


def test_html_in_note_is_escaped_in_html_part():
    n = make_notification(note='<script>alert("x")</script> & <b>bold</b>', url="javascript:alert(1)")
    msg = parse(build_email(n, "alerts@example.org").as_bytes())
    html = msg.get_body(("html",)).get_content()
    text = msg.get_body(("plain",)).get_content()
    assert "<script>" not in html and "<b>" not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in html
    assert 'href="javascript' not in html  # only http(s) URLs become links
    assert '<script>alert("x")</script>' in text  # plain text is shown as written


def test_message_id_is_derived_from_dedup_key():
    assert message_id(KEY) == f"<{KEY}@deadline-pipeline.invalid>"
    a = build_email(make_notification(), "alerts@example.org")
    b = build_email(make_notification(), "alerts@example.org")
    assert a["Message-ID"] == b["Message-ID"] == f"<{KEY}@example.org>"  # the sender's domain
    assert a["X-Deadline-Dedup-Key"] == KEY
    with pytest.raises(ValueError):
        message_id("abc>\r\nBcc: x")


def test_the_date_header_is_the_attempts_instant_also_in_a_replay():
    """A replay (``--as-of``) worded the body from the replayed instant ("due in 7 days") but dated
    the mail by the machine's clock."""
    sent = datetime(2024, 7, 15, 9, 30, tzinfo=UTC)
    msg = build_email(make_notification(sent_at=sent), "alerts@example.org")
    assert email.utils.parsedate_to_datetime(msg["Date"]) == sent


def test_render_error_names_dedup_key():
    with pytest.raises(RenderError, match=KEY):
        render(make_notification(subscriber_tz="Mars/Olympus_Mons"))


def test_naive_due_time_is_refused():
    with pytest.raises(ValueError, match="aware"):
        make_notification(due_at=datetime(2024, 6, 15, 21, 59))


# --------------------------------------------------------------------------- maildir


def test_maildir_creates_folder_and_stores_message(tmp_path):
    path = tmp_path / "nested" / "alerts"
    ch = build_channel("local", MaildirChannel(type="maildir", path=str(path), sender="alerts@example.org"))
    assert isinstance(ch, Channel) and ch.idempotency_class == "notification"
    first = ch.send(make_notification())
    second = ch.send(make_notification())  # a retry: at-least-once, same Message-ID
    ch.close()
    box = mailbox.Maildir(path, create=False)
    assert sorted(box.keys()) == sorted([first.provider_message_id, second.provider_message_id])
    msg = parse(box.get_bytes(first.provider_message_id))
    assert msg["To"] == "ana@example.org"
    assert msg["Subject"] == "Reminder: ICML 2024 paper due 2024-06-15 23:59 CEST (7 days left)"
    assert {parse(box.get_bytes(k))["Message-ID"] for k in box.iterkeys()} == {f"<{KEY}@example.org>"}
    assert b"\r\n" not in box.get_bytes(first.provider_message_id)


def test_maildir_without_email_is_permanent(tmp_path):
    ch = build_channel("local", MaildirChannel(type="maildir", path=str(tmp_path / "m")))
    with pytest.raises(DeliveryError) as info:
        ch.send(make_notification(email=None))
    assert info.value.permanent and info.value.outcome == "failed" and KEY in str(info.value)


# --------------------------------------------------------------------------- SMTP


class RecordingHandler:
    """Records accepted envelopes; ``replies`` maps a recipient to an RCPT reply such as "550 …",
    ``data_replies`` to a reply to its message data; a recipient in ``slow`` gets its DATA reply after
    ``slow_seconds``."""

    def __init__(self) -> None:
        self.envelopes: list[dict] = []
        self.replies: dict[str, str] = {}
        self.data_replies: dict[str, str] = {}
        self.slow: set[str] = set()
        self.slow_seconds = 0.0

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address in self.replies:
            return self.replies[address]
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        for rcpt in envelope.rcpt_tos:
            if rcpt in self.data_replies:
                return self.data_replies[rcpt]
        self.envelopes.append({"from": envelope.mail_from, "to": list(envelope.rcpt_tos),
                               "data": bytes(envelope.original_content)})
        if self.slow & set(envelope.rcpt_tos):
            await asyncio.sleep(self.slow_seconds)
        return "250 Message accepted"


def _authenticate(server, session, envelope, mechanism, auth_data):
    ok = auth_data.login == b"mailer" and auth_data.password == b"s3cret"
    # handled=False makes aiosmtpd answer "535" itself on failure (handled=True would leave the
    # client waiting for a reply nobody sends).
    return AuthResult(success=ok, handled=ok)


@pytest.fixture
def smtp_server():
    handler = RecordingHandler()
    controller = Controller(handler, hostname="127.0.0.1", port=free_port(),
                            authenticator=_authenticate, auth_require_tls=False)
    controller.start()
    yield handler, controller.port
    controller.stop()


def smtp_channel(port: int, **kw):
    return build_channel("mail", SmtpChannel(type="smtp", host="127.0.0.1", port=port,
                                             sender="alerts@example.org", **kw))


def test_smtp_delivers_with_deterministic_message_id(smtp_server):
    handler, port = smtp_server
    ch = smtp_channel(port)
    first = ch.send(make_notification())
    retry = ch.send(make_notification())
    assert first.provider_message_id == retry.provider_message_id == f"<{KEY}@example.org>"
    assert [e["to"] for e in handler.envelopes] == [["ana@example.org"], ["ana@example.org"]]
    assert handler.envelopes[0]["from"] == "alerts@example.org"
    msgs = [parse(e["data"]) for e in handler.envelopes]
    assert [m["Message-ID"] for m in msgs] == [f"<{KEY}@example.org>"] * 2
    assert msgs[0]["Subject"] == "Reminder: ICML 2024 paper due 2024-06-15 23:59 CEST (7 days left)"
    assert msgs[0]["To"] == "ana@example.org"


def test_smtp_4xx_is_retryable_and_5xx_permanent(smtp_server):
    handler, port = smtp_server
    handler.replies["busy@example.org"] = "450 4.2.1 Mailbox busy, try later"
    handler.replies["nobody@example.org"] = "550 5.1.1 No such user"
    ch = smtp_channel(port)
    with pytest.raises(DeliveryError) as busy:
        ch.send(make_notification(email="busy@example.org"))
    assert (busy.value.permanent, busy.value.outcome) == (False, "failed")
    assert "450" in str(busy.value)
    with pytest.raises(DeliveryError) as gone:
        ch.send(make_notification(email="nobody@example.org"))
    assert (gone.value.permanent, gone.value.outcome) == (True, "failed")
    assert "550" in str(gone.value)
    assert handler.envelopes == []


def test_smtp_data_rejection_is_failed_not_unknown(smtp_server):
    handler, port = smtp_server
    handler.data_replies["spam@example.org"] = "554 5.7.1 Message rejected as spam"
    handler.data_replies["full@example.org"] = "452 4.3.1 Insufficient system storage"
    ch = smtp_channel(port)
    with pytest.raises(DeliveryError) as spam:
        ch.send(make_notification(email="spam@example.org"))
    assert (spam.value.permanent, spam.value.outcome) == (True, "failed")
    with pytest.raises(DeliveryError) as full:
        ch.send(make_notification(email="full@example.org"))
    assert (full.value.permanent, full.value.outcome) == (False, "failed")


def test_smtp_timeout_after_data_is_unknown(smtp_server):
    handler, port = smtp_server
    handler.slow = {"ana@example.org"}
    handler.slow_seconds = 1.5
    ch = smtp_channel(port, timeout_seconds=0.4)
    with pytest.raises(DeliveryError) as info:
        ch.send(make_notification())
    assert (info.value.permanent, info.value.outcome) == (False, "unknown")
    assert len(handler.envelopes) == 1  # the server did take the message


def test_smtp_connection_refused_is_retryable_failed():
    ch = smtp_channel(free_port(), timeout_seconds=2)
    with pytest.raises(DeliveryError) as info:
        ch.send(make_notification())
    assert (info.value.permanent, info.value.outcome) == (False, "failed")


def test_smtp_login_reads_credentials_from_named_variables(smtp_server, monkeypatch):
    handler, port = smtp_server
    ch = smtp_channel(port, username_env="DP_TEST_SMTP_USER", password_env="DP_TEST_SMTP_PASSWORD")
    monkeypatch.delenv("DP_TEST_SMTP_USER", raising=False)
    monkeypatch.setenv("DP_TEST_SMTP_PASSWORD", "s3cret")
    with pytest.raises(DeliveryError) as unset:
        ch.send(make_notification())
    assert unset.value.permanent and "DP_TEST_SMTP_USER" in str(unset.value)

    monkeypatch.setenv("DP_TEST_SMTP_USER", "mailer")
    monkeypatch.setenv("DP_TEST_SMTP_PASSWORD", "wrong")
    with pytest.raises(DeliveryError) as refused:
        ch.send(make_notification())
    assert refused.value.permanent and "535" in str(refused.value)

    monkeypatch.setenv("DP_TEST_SMTP_PASSWORD", "s3cret")
    assert ch.send(make_notification()).provider_message_id == f"<{KEY}@example.org>"
    assert len(handler.envelopes) == 1


# --------------------------------------------------------------------------- webhook


class Receiver(BaseHTTPRequestHandler):
    """Answers by path: /ok (200 with id), /plain (204), /limited (429, Retry-After: 7), /busy (503),
    /error (500), /bad (400), /slow (reads the body, then sleeps past the client timeout)."""

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.requests.append({"path": self.path, "headers": dict(self.headers.items()), "body": body})
        if self.path == "/slow":
            time.sleep(1.5)
        answers = {
            "/ok": (200, {"Content-Type": "application/json"}, b'{"id": "evt_42"}'),
            "/plain": (204, {}, b""),
            "/limited": (429, {"Retry-After": "7"}, b"slow down"),
            "/busy": (503, {}, b"maintenance"),
            "/error": (500, {}, b"boom"),
            "/bad": (400, {}, b"bad payload"),
            "/slow": (200, {}, b"{}"),
            # Slack-compatible receivers: Slack and Mattermost answer a bare "ok"; the Slack Web API
            # (a chat.postMessage URL configured by mistake) and Rocket.Chat refuse with a 200.
            "/slack-ok": (200, {"Content-Type": "text/plain"}, b"ok"),
            "/slack-refused": (200, {"Content-Type": "application/json"}, b'{"ok": false, "error": "not_authed"}'),
            "/slack-limited": (200, {"Content-Type": "application/json"}, b'{"ok": false, "error": "ratelimited"}'),
            "/rocket-refused": (200, {"Content-Type": "application/json"},
                                b'{"success": false, "error": "Invalid integration id or token provided."}'),
            "/rocket-ok": (200, {"Content-Type": "application/json"}, b'{"success": true}'),
            "/queued": (202, {}, b""),
            "/moved": (307, {"Location": "http://127.0.0.2:9/elsewhere"}, b""),
        }
        status, headers, payload = answers[self.path]
        try:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # /slow: the client gave up waiting, which is the point of that test


@pytest.fixture
def http_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_webhook_posts_json_with_idempotency_key(http_server):
    server, base = http_server
    # The earlier flat body, kept behind the channel option for receivers written against it.
    ch = build_channel("hook", WebhookChannel(type="webhook", timeout_seconds=5, body="legacy"),
                       network=loopback_policy())
    assert ch.idempotency_class == "notification"
    n = make_notification(kind="correction", webhook_url=f"{base}/ok", previous_due_at=DUE - timedelta(days=1))
    assert ch.send(n).provider_message_id == "evt_42"
    assert ch.send(make_notification(webhook_url=f"{base}/plain")).provider_message_id == "HTTP 204"
    ch.close()
    req = server.requests[0]
    assert req["headers"]["Idempotency-Key"] == KEY
    assert req["headers"]["Content-Type"] == "application/json"
    assert json.loads(req["body"]) == {
        "id": KEY, "kind": "correction", "subscriber": "ana", "source": "conf-feed", "rule_id": "icml-2024",
        "title": "ICML 2024 paper", "due_at": "2024-06-15T21:59:00Z", "previous_due_at": "2024-06-14T21:59:00Z",
        "url": "https://icml.cc/Conferences/2024", "note": "Abstract first.",
    }


@pytest.mark.parametrize(
    ("path", "permanent", "outcome", "retry_after"),
    [
        ("/limited", False, "failed", 7.0),
        ("/busy", False, "failed", None),
        ("/error", False, "unknown", None),
        ("/bad", True, "failed", None),
    ],
)
def test_webhook_error_classification(http_server, path, permanent, outcome, retry_after):
    server, base = http_server
    ch = build_channel("hook", WebhookChannel(type="webhook", timeout_seconds=5), network=loopback_policy())
    with pytest.raises(DeliveryError) as info:
        ch.send(make_notification(webhook_url=base + path))
    ch.close()
    err = info.value
    assert (err.permanent, err.outcome, err.retry_after) == (permanent, outcome, retry_after)
    assert len(server.requests) == 1


def test_webhook_timeout_after_request_is_unknown(http_server):
    server, base = http_server
    ch = build_channel("hook", WebhookChannel(type="webhook", timeout_seconds=0.4), network=loopback_policy())
    with pytest.raises(DeliveryError) as info:
        ch.send(make_notification(webhook_url=f"{base}/slow"))
    ch.close()
    assert (info.value.permanent, info.value.outcome) == (False, "unknown")
    assert json.loads(server.requests[0]["body"])["data"]["id"] == KEY  # the receiver did get it


def test_webhook_connect_error_is_retryable_failed():
    ch = build_channel("hook", WebhookChannel(type="webhook", timeout_seconds=2), network=loopback_policy())
    with pytest.raises(DeliveryError) as info:
        ch.send(make_notification(webhook_url=f"http://127.0.0.1:{free_port()}/ok"))
    ch.close()
    assert (info.value.permanent, info.value.outcome) == (False, "failed")


def test_webhook_signs_with_standard_webhooks_headers(http_server, monkeypatch):
    from standardwebhooks.webhooks import Webhook

    server, base = http_server
    secret = "whsec_" + base64.b64encode(b"k3y-bytes-for-the-test").decode()
    ch = build_channel("hook", WebhookChannel(type="webhook", timeout_seconds=5, secret_env="DP_TEST_HOOK_SECRET"),
                       network=loopback_policy())
    monkeypatch.delenv("DP_TEST_HOOK_SECRET", raising=False)
    with pytest.raises(DeliveryError) as unset:
        ch.send(make_notification(webhook_url=f"{base}/ok"))
    assert unset.value.permanent and "DP_TEST_HOOK_SECRET" in str(unset.value)
    assert server.requests == []

    monkeypatch.setenv("DP_TEST_HOOK_SECRET", secret)
    ch.send(make_notification(webhook_url=f"{base}/ok"))
    ch.close()
    req = server.requests[0]
    headers = {k.lower(): v for k, v in req["headers"].items()}
    assert headers["webhook-id"] == KEY and headers["webhook-timestamp"].isdigit()
    # The reference implementation accepts it (raises WebhookVerificationError otherwise) ...
    Webhook(secret).verify(req["body"].decode(), headers)
    # ... and so does the spec's formula written out.
    key = base64.b64decode(secret.removeprefix("whsec_"))
    to_sign = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + req["body"]
    expected = base64.b64encode(hmac.new(key, to_sign, hashlib.sha256).digest()).decode()
    assert headers["webhook-signature"] == f"v1,{expected}"


@pytest.mark.parametrize(
    ("path", "permanent", "outcome", "retry_after"),
    [
        ("/limited", False, "failed", 7.0),
        ("/busy", False, "failed", None),
        ("/error", False, "unknown", None),
        ("/bad", True, "failed", None),
        ("/slow", False, "unknown", None),
    ],
)
def test_webhook_async_transport_classifies_like_the_blocking_one(http_server, path, permanent, outcome,
                                                                 retry_after):
    server, base = http_server
    ch = build_channel("hook", WebhookChannel(type="webhook", timeout_seconds=0.4), network=loopback_policy())

    async def go():
        try:
            ok = await ch.send_async(make_notification(webhook_url=f"{base}/ok"))
            with pytest.raises(DeliveryError) as info:
                await ch.send_async(make_notification(webhook_url=base + path))
            return ok, info.value
        finally:
            await ch.aclose()

    ok, err = asyncio.run(go())
    assert ok.provider_message_id == "evt_42"
    assert (err.permanent, err.outcome, err.retry_after) == (permanent, outcome, retry_after)
    assert server.requests[1]["headers"]["Idempotency-Key"] == KEY


# The slack a send may take past its timeout on this shared 2-core machine: the bound itself overshoots
# by one socket call's wake-up (milliseconds); the rest is scheduling noise. An unbounded send takes
# the drip's whole 6 s (drip_server.DRIP_BYTES * DRIP_EVERY).
DRIP_TIMEOUT, DRIP_SLACK = 1.0, 1.0


def _ends_in_time(send, server: DripServer) -> DeliveryError:
    """Run ``send()`` against ``server``; assert it raised within the timeout plus the slack, after
    the request reached the receiver. Returns the error."""
    started = time.monotonic()
    with pytest.raises(DeliveryError) as info:
        send()
    elapsed = time.monotonic() - started
    assert elapsed < DRIP_TIMEOUT + DRIP_SLACK, f"the send took {elapsed:.1f} s with a {DRIP_TIMEOUT:g} s timeout"
    assert server.requests == 1, "the receiver got the request"
    return info.value


def test_webhook_send_ends_within_its_timeout_however_the_answer_drips():
    """A receiver dripping its header block a byte every 0.2 s (each read well within the 1 s
    timeout) must not hold the blocking send (escalation notices, watchdog pages) past its timeout:
    unknown, retryable, on time."""
    with DripServer("headers") as server:
        ch = build_channel("hook", WebhookChannel(type="webhook", timeout_seconds=DRIP_TIMEOUT),
                           network=loopback_policy())
        try:
            err = _ends_in_time(lambda: ch.send(make_notification(webhook_url=f"{server.url}/ok")), server)
        finally:
            ch.close()
    assert (err.permanent, err.outcome) == (False, "unknown")
    assert "ReadTimeout" in str(err)


def test_webhook_async_send_ends_within_its_timeout_however_the_answer_drips():
    """The sweep's transport, the same receiver: the send must not outlast the timeout its lease
    was sized for: unknown, retryable, on time."""
    with DripServer("headers") as server:
        ch = build_channel("hook", WebhookChannel(type="webhook", timeout_seconds=DRIP_TIMEOUT),
                           network=loopback_policy())

        async def go():
            try:
                await ch.send_async(make_notification(webhook_url=f"{server.url}/ok"))
            finally:
                await ch.aclose()

        err = _ends_in_time(lambda: asyncio.run(go()), server)
    assert (err.permanent, err.outcome) == (False, "unknown")


def _both_transports(url: str) -> list:
    """``(name, result or DeliveryError, seconds)`` of one send to ``url`` through each transport."""
    out = []
    for name in ("blocking", "async"):
        ch = build_channel("hook", WebhookChannel(type="webhook", timeout_seconds=DRIP_TIMEOUT),
                           network=loopback_policy())
        started = time.monotonic()
        try:
            if name == "blocking":
                res = ch.send(make_notification(webhook_url=url))
            else:
                async def go(ch=ch):
                    try:
                        return await ch.send_async(make_notification(webhook_url=url))
                    finally:
                        await ch.aclose()

                res = asyncio.run(go())
        except DeliveryError as exc:
            res = exc
        finally:
            ch.close()
        out.append((name, res, time.monotonic() - started))
    return out


def test_a_2xx_whose_body_drips_is_delivered_on_time_not_resent():
    """The status line is the acknowledgement: a 200 whose body drips past the timeout is delivered
    (without the receiver's id), on time. As an unknown outcome it was resent - a duplicate each
    attempt - and finally escalated as failed."""
    with DripServer("body") as server:
        results = _both_transports(f"{server.url}/ok")
    for name, res, took in results:
        assert isinstance(res, SendResult), (name, res)
        assert res.provider_message_id.startswith("HTTP 200 (answer body unread"), (name, res)
        assert took < DRIP_TIMEOUT + DRIP_SLACK, (name, took)
    assert server.requests == 2


class _FloodServer:
    """Answers every request with ``status`` and a body announced as 10 GB, streamed as fast as the
    client reads it, until the client goes away."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.sent = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(f"HTTP/1.1 {self.status} X\r\nContent-Type: text/plain\r\n"
                             f"Content-Length: {10 ** 10}\r\n\r\n".encode())
                block = b"0" * 65536
                while self.sent < 10 ** 10:
                    conn.sendall(block)
                    self.sent += len(block)
            except OSError:
                return

    def close(self) -> None:
        self._listener.close()


@pytest.mark.parametrize(("status", "delivered"), [(200, True), (500, False)])
def test_an_endless_answer_is_read_only_up_to_the_limit(status, delivered):
    """A receiver announcing and streaming a 10 GB answer: each transport reads at most
    ANSWER_LIMIT bytes (it filled memory for the whole timeout), then judges the status: 200
    delivered, 500 a retryable unknown naming the status."""
    from deadline_pipeline.deliver.channels.webhook import ANSWER_LIMIT

    server = _FloodServer(status)
    try:
        results = _both_transports(f"{server.url}/ok")
    finally:
        server.close()
    for name, res, took in results:
        if delivered:
            assert isinstance(res, SendResult) and res.provider_message_id == "HTTP 200", (name, res)
        else:
            assert isinstance(res, DeliveryError) and res.outcome == "unknown" and "HTTP 500" in str(res), (name, res)
        assert took < DRIP_TIMEOUT, (name, took)
    # What the receiver got out before the client closed: the limit plus the socket buffers, not GBs.
    assert server.sent < 2 * 10 ** 8, server.sent
    assert ANSWER_LIMIT == 64 * 1024


@pytest.mark.parametrize("where", ["headers", "body"])
def test_slack_send_ends_within_its_timeout_however_the_answer_drips(where, monkeypatch):
    with DripServer(where) as server:
        monkeypatch.setenv("DP_TEST_SLACK_DRIP", f"{server.url}/services/T0/B0/drip")
        ch = build_channel("chat", SlackChannel(type="slack", url_env="DP_TEST_SLACK_DRIP",
                                                timeout_seconds=DRIP_TIMEOUT), network=loopback_policy())
        try:
            err = _ends_in_time(lambda: ch.send(make_notification()), server)
        finally:
            ch.close()
    assert (err.permanent, err.outcome) == (False, "unknown")


@pytest.mark.parametrize(("path", "expected"), [
    ("/slack-ok", "HTTP 200"),
    ("/rocket-ok", "HTTP 200"),
    ("/plain", "HTTP 204"),
    ("/slack-refused", (True, "failed", "not_authed")),
    ("/rocket-refused", (True, "failed", "Invalid integration id")),
    ("/slack-limited", (False, "failed", "ratelimited")),
    # Accepted for later processing: all a receiver promises; the post is not judged further.
    ("/queued", "HTTP 202"),
    # Never followed to another host: a permanent failure (escalated), naming why.
    ("/moved", (True, "failed", "redirects are not followed")),
])
def test_slack_a_200_that_says_the_post_was_refused_is_not_delivered(http_server, monkeypatch, path, expected):
    """A 2xx whose JSON body says ``"ok": false`` (the Slack Web API, e.g. a chat.postMessage URL
    configured by mistake) or ``"success": false`` (Rocket.Chat) posted nothing: recorded as
    delivered, the reminder was a silent miss with every check green. It is a failure naming the
    receiver's error: permanent (escalated at once), retryable for a rate limit."""
    _server, base = http_server
    monkeypatch.setenv("DP_TEST_SLACK_BODY", base + path)
    ch = build_channel("chat", SlackChannel(type="slack", url_env="DP_TEST_SLACK_BODY", timeout_seconds=5),
                       network=loopback_policy())
    try:
        if isinstance(expected, str):
            assert ch.send(make_notification()).provider_message_id == expected
            return
        with pytest.raises(DeliveryError) as info:
            ch.send(make_notification())
    finally:
        ch.close()
    permanent, outcome, named = expected
    assert (info.value.permanent, info.value.outcome) == (permanent, outcome)
    assert named in str(info.value) and "$DP_TEST_SLACK_BODY" in str(info.value)


def test_a_spent_request_deadline_stops_before_connecting_and_only_inside_its_block():
    """A deadline that passed before the connection is a connect timeout (nothing was sent: the
    channels classify it retryable "failed"); outside the block the same client has no deadline."""
    import httpx

    from deadline_pipeline.security.outbound import guarded_httpx_client, request_deadline

    with DripServer("body", every=0.01) as server, guarded_httpx_client(loopback_policy()) as client:
        with request_deadline(0), pytest.raises(httpx.ConnectTimeout):
            client.get(server.url)
        assert server.requests == 0
        assert client.get(server.url).json() == {"id": "dripped"}


def test_webhook_async_connect_error_is_retryable_failed():
    ch = build_channel("hook", WebhookChannel(type="webhook", timeout_seconds=2), network=loopback_policy())

    async def go():
        try:
            await ch.send_async(make_notification(webhook_url=f"http://127.0.0.1:{free_port()}/ok"))
        finally:
            await ch.aclose()

    with pytest.raises(DeliveryError) as info:
        asyncio.run(go())
    assert (info.value.permanent, info.value.outcome) == (False, "failed")


@pytest.mark.parametrize("title", [
    "Pay rent\n", "Pay rent =?UTF-8?Q?=0A?=Bcc: attacker@example.org", "Pay rent\nBcc: attacker@example.org",
    "x =?UTF-8?Q?=3D=3FUTF-8=3FQ=3F=3D0A=3F=3D?=Bcc: y",
])
def test_c28_encoded_words_cannot_add_a_header(title):
    """Case C28 (shared cases): one single-line Subject, no Bcc, MIME headers stay in the header block."""
    msg = parse(build_email(make_notification(title=title), "alerts@example.org").as_bytes())
    assert msg["Bcc"] is None and len(msg.get_all("Subject")) == 1
    assert msg["MIME-Version"] == "1.0" and msg.get_content_type() == "multipart/alternative"


def test_retry_after_accepts_http_date():
    now = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
    assert parse_retry_after("Sat, 01 Jun 2024 12:00:30 GMT", now=now) == 30.0
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("soon") is None
