"""The exact bytes a webhook alert goes out as: body, headers, signature, wire request and errors.

Every expected value is built here from the Notification's fields and the documented format (module
docstring of :mod:`deadline_pipeline.deliver.channels.webhook`, Standard Webhooks v1 signing), never
captured from the code under test, so a faster implementation of the same contract must produce the
same bytes.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import re
import time
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import aiohttp
import pytest

from deadline_pipeline.config import DeadlinesConfig, WebhookChannel
from deadline_pipeline.deliver.channels.webhook import WebhookSender
from deadline_pipeline.deliver.notification import DeliveryError, Notification, notification_from_row
from deadline_pipeline.security.redact import redact
from deadline_pipeline_tests.factories import loopback_policy

KEY = "9c1e0b7a44d2f00d"
DUE = datetime(2026, 5, 7, 11, 59, tzinfo=UTC)

# Zone names as sources and subscribers write them, with the offset each means (None = unknown).
ZONES = {
    "Europe/Berlin": ZoneInfo("Europe/Berlin"),
    "America/New_York": ZoneInfo("America/New_York"),
    "Asia/Kolkata": ZoneInfo("Asia/Kolkata"),
    "AoE": timezone(timedelta(hours=-12)),
    "UTC": UTC,
    "UTC+5:30": timezone(timedelta(hours=5, minutes=30)),
    "Mars/Olympus_Mons": None,
}

# offset seconds -> (ISO 8601 duration, words), as the wording module documents them.
OFFSETS = {
    -604800: ("-P7D", "7 days before"),
    -5400: ("-PT1H30M", "1 hour 30 minutes before"),
    0: ("PT0S", "at the deadline"),
    -93600: ("-P1DT2H", "1 day 2 hours before"),
    3600: ("PT1H", "1 hour after"),
    -90061: ("-P1DT1H1M1S", "1 day 1 hour before"),
    -30: ("-PT30S", "30 seconds before"),
}

EVENT = {"reminder": "reminder.due", "correction": "reminder.corrected", "cancellation": "reminder.cancelled",
         "escalation": "reminder.escalated"}


def _z(when: datetime | None) -> str | None:
    if when is None:
        return None
    u = when.astimezone(UTC)
    frac = f".{u.microsecond:06d}" if u.microsecond else ""
    return f"{u:%Y-%m-%dT%H:%M:%S}{frac}Z"


def _local(when: datetime, name: str | None) -> str | None:
    zone = ZONES.get(name) if name else None
    return when.astimezone(zone).isoformat() if zone is not None else None


def _expected_body(n: Notification, body: str) -> bytes:
    if body == "legacy":
        doc = {"id": n.dedup_key, "kind": n.kind, "subscriber": n.subscriber_id, "source": n.source,
               "rule_id": n.rule_id, "title": n.title, "due_at": _z(n.due_at), "previous_due_at": _z(n.previous_due_at),
               "url": n.url, "note": n.note}
    else:
        late = (n.kind == "reminder" and n.sent_at is not None and n.planned_at is not None
                and n.sent_at - n.planned_at > timedelta(minutes=15))
        iso, words = OFFSETS[n.offset_seconds]
        doc = {"type": EVENT[n.kind], "timestamp": _z(n.sent_at), "data": {
            "id": n.dedup_key, "subscriber": n.subscriber_id, "source": n.source, "rule_id": n.rule_id,
            "title": n.title, "due_at": _z(n.due_at), "previous_due_at": _z(n.previous_due_at), "offset": iso,
            "offset_seconds": n.offset_seconds, "offset_words": words, "subscriber_timezone": n.subscriber_tz,
            "due_local": _local(n.due_at, n.subscriber_tz), "deadline_timezone": n.rule_tz,
            "due_in_deadline_timezone": _local(n.due_at, n.rule_tz), "business_day_note": n.roll_note,
            "planned_send_at": _z(n.planned_at), "late": late, "late_reason": n.planned_reason if late else None,
            "url": n.url, "note": n.note}}
    # Compact UTF-8 JSON, keys in the documented order.
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _signature(secret: str, msg_id: str, timestamp: str, body: bytes) -> str:
    raw = secret.removeprefix("whsec_")
    key = base64.b64decode(raw + "=" * (-len(raw) % 4))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def _notification(**changes) -> Notification:
    fields = {"dedup_key": KEY, "kind": "reminder", "subscriber_id": "ana", "email": None,
              "webhook_url": "http://127.0.0.1:9/hook", "subscriber_tz": "Europe/Berlin", "source": "conf-feed",
              "rule_id": "icml-2026", "title": "ICML 2026 paper – “camera-ready” ✓", "due_at": DUE,
              "offset_seconds": -604800, "url": "https://icml.cc/Conferences/2026",
              "note": "Abstract first.\nThen PDF.",
              "sent_at": datetime(2026, 4, 30, 11, 59, 3, 250000, tzinfo=UTC), "rule_tz": "AoE",
              "planned_at": datetime(2026, 4, 30, 11, 59, tzinfo=UTC)}
    return Notification(**(fields | changes))


SENT = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
VARIED = [
    _notification(),
    _notification(subscriber_tz="America/New_York", rule_tz=None, offset_seconds=-5400, url=None, note=None),
    _notification(subscriber_tz="Mars/Olympus_Mons", rule_tz="Mars/Olympus_Mons", offset_seconds=0),
    _notification(subscriber_tz="UTC", rule_tz="UTC+5:30", offset_seconds=-93600,
                  sent_at=datetime(2026, 4, 30, 12, 0, tzinfo=UTC)),
    _notification(kind="correction", previous_due_at=DUE - timedelta(days=2), subscriber_tz="Asia/Kolkata",
                  offset_seconds=3600, sent_at=SENT, planned_reason="moved"),
    # Late: more than 15 minutes after the planned instant, with the planner's note.
    _notification(sent_at=SENT, planned_reason="late at planning: reminder time already past", offset_seconds=-90061),
    _notification(sent_at=SENT, planned_at=SENT - timedelta(minutes=15), planned_reason="exactly the grace"),
    _notification(kind="cancellation", offset_seconds=-30, roll_note="Sunday 31 Jan falls on a weekend; due Monday "
                  "1 Feb (IRC §7503 following)", due_at=datetime(2026, 5, 7, 13, 59, 59, 999999, tzinfo=UTC)),
    _notification(kind="escalation", planned_at=None, title='quote " backslash \\ tab \t nul \x00 emoji 🎉'),
    _notification(due_at=datetime(2026, 5, 7, 13, 59, tzinfo=timezone(timedelta(hours=2))), sent_at=None,
                  planned_at=None),
]


def _sender(body: str = "standard-webhooks", secret_env: str | None = None) -> WebhookSender:
    return WebhookSender("hook", WebhookChannel(type="webhook", timeout_seconds=5, body=body, secret_env=secret_env),
                         network=loopback_policy())


@pytest.mark.parametrize("body", ["standard-webhooks", "legacy"])
@pytest.mark.parametrize("signed", [False, True])
def test_body_and_headers_are_the_documented_bytes(monkeypatch, body, signed):
    secret = "whsec_" + base64.b64encode(b"pin-test-signing-key").decode().rstrip("=")
    monkeypatch.setenv("DP_PIN_SECRET", secret)
    sender = _sender(body, "DP_PIN_SECRET" if signed else None)
    for n in VARIED:
        before = int(time.time())
        url, sent_body, headers = sender._prepare(n)
        after = int(time.time())
        if n.sent_at is None and body != "legacy":
            # The timestamp is "now": take it from the body, check it, then compare the rest.
            stamp = json.loads(sent_body)["timestamp"]
            assert before <= datetime.fromisoformat(stamp).timestamp() <= after + 1
            n = Notification(**{**n.__dict__, "sent_at": datetime.fromisoformat(stamp)})
        assert url == n.webhook_url
        assert sent_body == _expected_body(n, body), n
        timestamp = headers["webhook-timestamp"]
        assert re.fullmatch(r"\d+", timestamp) and before <= int(timestamp) <= after
        expected = {"Content-Type": "application/json", "Idempotency-Key": KEY, "webhook-id": KEY,
                    "webhook-timestamp": timestamp}
        if signed:
            expected["webhook-signature"] = _signature(secret, KEY, timestamp, sent_body)
        assert list(headers.items()) == list(expected.items())


def test_notification_from_row_carries_every_field_and_the_roll_note():
    cfg = DeadlinesConfig(sources=[
        {"name": "tax", "format": "ics", "location": "t.ics", "tenant": "t",
         "business_days": {"calendar": "US-IRS", "convention": "following"}},
        {"name": "plain", "format": "ics", "location": "p.ics", "tenant": "t"}])
    due = datetime(2027, 2, 2, 4, 59, tzinfo=UTC)  # Monday 1 Feb 23:59 in New York
    row = {"dedup_key": KEY, "kind": "correction", "subscriber": "ann", "email": "ann@example.org",
           "webhook_url": "http://127.0.0.1:9/h", "timezone": "Europe/Berlin", "source": "tax", "rule_id": "r1",
           "title": "Tax", "due_at": due, "offset_seconds": -86400, "previous_due_at": due - timedelta(days=1),
           "send_at": due - timedelta(days=1), "status_reason": "why", "attempts": 2, "period": "2027-01-31",
           "payload": {"url": "https://x.example/1", "note": "n", "tz": "America/New_York"},
           "obligation_key": "ab" * 32, "caldav_url": "https://dav.example/c", "apprise_target": "json://x"}
    sent = datetime(2027, 1, 31, 5, 0, 0, 123456, tzinfo=timezone(timedelta(hours=1)))
    n = notification_from_row(row, sent, cfg)
    assert n == Notification(
        dedup_key=KEY, kind="correction", subscriber_id="ann", email="ann@example.org",
        webhook_url="http://127.0.0.1:9/h", subscriber_tz="Europe/Berlin", source="tax", rule_id="r1", title="Tax",
        due_at=due, offset_seconds=-86400, url="https://x.example/1", note="n", previous_due_at=due - timedelta(days=1),
        sent_at=sent, obligation_key="ab" * 32, caldav_url="https://dav.example/c", apprise_target="json://x",
        rule_tz="America/New_York", planned_at=due - timedelta(days=1), planned_reason="why", earlier_attempts=2,
        roll_note="Sunday 31 Jan falls on a weekend; due Monday 1 Feb (IRC §7503 following)")
    assert n.sent_at.tzinfo is UTC and n.sent_at == sent
    # No note without a rolling source, a configuration, a nominal date or a known zone.
    assert notification_from_row(row | {"source": "plain"}, sent, cfg).roll_note is None
    assert notification_from_row(row, sent, None).roll_note is None
    assert notification_from_row(row | {"period": "once", "payload": {"tz": "America/New_York"}}, sent,
                                 cfg).roll_note is None
    assert notification_from_row(row | {"payload": {"tz": "Mars/Olympus_Mons"}}, sent, cfg).roll_note is None
    with pytest.raises(ValueError, match="naive"):
        notification_from_row(row | {"due_at": datetime(2027, 2, 2)}, sent, cfg)


def test_secret_and_url_variables_are_read_at_every_send(monkeypatch):
    first = "whsec_" + base64.b64encode(b"first-key-0001").decode()
    second = base64.b64encode(b"second-key-0002").decode()  # bare base64 is accepted too
    sender = _sender(secret_env="DP_PIN_ROTATE")
    n = _notification(webhook_url="http://127.0.0.1:9/hook?token=${DP_PIN_TOKEN}")
    monkeypatch.setenv("DP_PIN_TOKEN", "token-value-aaaa")
    monkeypatch.setenv("DP_PIN_ROTATE", first)
    url, body, headers = sender._prepare(n)
    assert url == "http://127.0.0.1:9/hook?token=token-value-aaaa"
    assert headers["webhook-signature"] == _signature(first, KEY, headers["webhook-timestamp"], body)
    # A rotated secret and a changed token take effect on the next send, and both are redacted.
    monkeypatch.setenv("DP_PIN_TOKEN", "token-value-bbbb")
    monkeypatch.setenv("DP_PIN_ROTATE", second)
    url, body, headers = sender._prepare(n)
    assert url == "http://127.0.0.1:9/hook?token=token-value-bbbb"
    assert headers["webhook-signature"] == _signature(second, KEY, headers["webhook-timestamp"], body)
    assert redact("a token-value-aaaa b token-value-bbbb") == "a *** b ***"
    assert redact(second) == "***" and redact(first) == "***"

    # Errors, each permanent, with the documented wording; a good value afterwards works again.
    where = "channel 'hook' (webhook http://127.0.0.1:9/hook?token=***): "
    monkeypatch.setenv("DP_PIN_ROTATE", "not base64 at all!")
    assert _permanent_error(sender, n) == where + (
        "environment variable DP_PIN_ROTATE does not hold a Standard Webhooks secret ('whsec_<base64>'): not "
        "base64: Only base64 data is allowed")
    monkeypatch.setenv("DP_PIN_ROTATE", "  ")  # too short to be registered as a secret
    assert _permanent_error(sender, n).endswith("('whsec_<base64>'): empty secret")
    monkeypatch.delenv("DP_PIN_ROTATE")
    assert _permanent_error(sender, n) == where + (
        "environment variable DP_PIN_ROTATE (named in the configuration as secret_env) is not set")
    monkeypatch.setenv("DP_PIN_ROTATE", first)
    url, body, headers = sender._prepare(n)
    assert headers["webhook-signature"] == _signature(first, KEY, headers["webhook-timestamp"], body)
    monkeypatch.delenv("DP_PIN_TOKEN")
    assert _permanent_error(sender, n) == where + (
        "environment variable DP_PIN_TOKEN (referenced in webhook_url) is not set")
    assert _permanent_error(sender, _notification(webhook_url=None)) == (
        "channel 'hook' (webhook (none)): subscriber 'ana' has no webhook_url")


def _permanent_error(sender: WebhookSender, n: Notification) -> str:
    with pytest.raises(DeliveryError) as info:
        sender._prepare(n)
    assert info.value.permanent and info.value.outcome == "failed"
    return str(info.value)


def test_a_password_in_the_url_is_registered_as_secret():
    sender = _sender()
    url, _, _ = sender._prepare(_notification(webhook_url="http://user:pw-in-url-7731@127.0.0.1:9/h"))
    assert url == "http://user:pw-in-url-7731@127.0.0.1:9/h"
    assert redact("said pw-in-url-7731") == "said ***"


def test_the_wire_request_equals_a_plain_aiohttp_post_of_the_documented_bytes(monkeypatch):
    """What ``send_async`` writes on the socket: the bytes of a plain aiohttp POST of the expected body
    and headers (so no header, order or framing changes with how the request is handed to aiohttp)."""
    secret = "whsec_" + base64.b64encode(b"wire-pin-key").decode()
    monkeypatch.setenv("DP_PIN_WIRE", secret)
    captured: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1))
            captured.append(head + await reader.readexactly(length))
            answer = b'{"id":"evt_1"}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(answer)).encode() + b"\r\n\r\n" + answer)
            await writer.drain()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        sender = _sender(secret_env="DP_PIN_WIRE")
        for n in VARIED[:3] + [VARIED[4]]:
            n = Notification(**{**n.__dict__, "webhook_url": f"http://127.0.0.1:{port}/hook/ä?x=1"})
            assert (await sender.send_async(n)).provider_message_id == "evt_1"
            got = captured[-1]
            timestamp = re.search(rb"\r\nwebhook-timestamp: (\d+)\r\n", got).group(1).decode()
            body = _expected_body(n, "standard-webhooks")
            headers = {"Content-Type": "application/json", "Idempotency-Key": KEY, "webhook-id": KEY,
                       "webhook-timestamp": timestamp, "webhook-signature": _signature(secret, KEY, timestamp, body)}
            async with aiohttp.ClientSession() as plain, plain.post(n.webhook_url, data=body, headers=headers,
                                                                    allow_redirects=False) as response:
                await response.read()
            assert got == captured[-1], (got, captured[-1])
        await sender.aclose()
        server.close()
        await server.wait_closed()

    asyncio.run(main())


@pytest.mark.parametrize("title", [
    "Plain", "Prüfungsanmeldung – Frist", "截止日期 🎓", 'quote " and back\\slash', "tab\there, new\nline",
    "controls \x00\x01\x1f and DEL \x7f", "separators \u2028\u2029", "</script>", "",
])
def test_a_body_is_the_stdlib_json_bytes_of_its_document(title):
    """The body encoder (orjson) writes exactly what ``json.dumps(ensure_ascii=False, compact)``
    wrote before it, escapes and all: receivers that verify a signature over the bytes, or compare
    bodies, see no change."""
    from deadline_pipeline.deliver.channels.webhook import _encode_body, payload

    n = notification_from_row({
        "dedup_key": "k" * 32, "kind": "reminder", "subscriber": "s", "email": None, "webhook_url": "http://x/",
        "timezone": "Europe/Berlin", "source": "src", "rule_id": "r", "title": title,
        "due_at": datetime(2027, 3, 1, 9, tzinfo=UTC), "offset_seconds": -86400, "payload": {"note": title},
        "send_at": datetime(2027, 2, 28, 9, tzinfo=UTC), "attempts": 2}, datetime(2027, 2, 28, 9, 0, 1, tzinfo=UTC))
    doc = payload(n)
    assert _encode_body(doc) == json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
    assert json.loads(_encode_body(doc))["data"]["title"] == title


def _stdlib_response_id(text: str):
    """The receiver's id as the standard library's JSON reader gives it: the reference."""
    import json

    try:
        data = json.loads(text) if text else None
    except ValueError:
        return None
    value = data.get("id") if isinstance(data, dict) else None
    return None if value is None or isinstance(value, dict | list) else str(value)


@pytest.mark.parametrize("answer", [
    "", "{}", '{"id": "msg-1"}', '{"id": 12}', '{"id": 1.5}', '{"id": true}', '{"id": null}',
    '{"id": {"a": 1}}', '{"id": [1]}', "[1]", "not json", '{"id": "a", "id": "b"}',
    # orjson refuses these, or reads them otherwise than the standard library:
    '{"id": NaN}', '{"id": Infinity}', '{"id": 1e400}', '{"id": 123456789012345678901234567890}',
    '{"id": -98765432109876543210}', '"\\ud800"', '{"id": "\\ud800"}',
])
def test_the_receivers_id_is_read_as_the_standard_library_reads_it(answer):
    from deadline_pipeline.deliver.channels.webhook import response_id_of

    assert response_id_of(answer) == _stdlib_response_id(answer)
