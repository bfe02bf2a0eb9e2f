"""The caldav booking channel against a real Radicale server on loopback: create, duplicate create
(412 = already booked), one event per obligation, corrections (same UID, SEQUENCE + 1),
cancellations (STATUS:CANCELLED or delete), the VALARM, unknown outcomes resolved by asking the
server (a loopback proxy drops the answer after the write, or the write itself), the sweep's
lookup of a dead sender's attempt (SQLite and PostgreSQL), and the outbound guard: Radicale is
reached because ``network.allow`` admits 127.0.0.1; without it a calendar on loopback, in any
spelling, is refused permanently before a connection, and a redirect is never followed.

What the server holds is read back with an independent client, the ``caldav`` library.
"""

from __future__ import annotations

import hashlib
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from sqlalchemy import select, update

from deadline_pipeline.config import CaldavChannel, DeadlinesConfig
from deadline_pipeline.deliver.channels.caldav import CaldavSender, event_uid
from deadline_pipeline.deliver.channels.registry import build_channel
from deadline_pipeline.deliver.notification import DeliveryError, Notification
from deadline_pipeline.deliver.sweep import sweep
from deadline_pipeline.security.outbound import DEFAULT_POLICY, NetworkPolicy
from deadline_pipeline.store import delivery as dsql
from deadline_pipeline.store.schema import alerts, delivery_attempts, obligations, subscribers
from deadline_pipeline_tests.caldav_server import PASSWORD, USER, Radicale
from deadline_pipeline_tests.drip_server import DripServer
from deadline_pipeline_tests.factories import LOOPBACK_NETWORK, loopback_policy
from deadline_pipeline_tests.test_apprise_channel import ConnectionCounter
from deadline_pipeline_tests.test_delivery_sweep import T0, expire_leases, seed

DUE = datetime(2027, 4, 15, 21, 59, tzinfo=UTC)


@pytest.fixture(scope="module")
def radicale(tmp_path_factory):
    server = Radicale(tmp_path_factory.mktemp("radicale"))
    yield server
    server.stop()


@pytest.fixture
def creds(monkeypatch):
    monkeypatch.setenv("CAL_USER", USER)
    monkeypatch.setenv("CAL_PASS", PASSWORD)


def _channel(url: str | None = None, network: NetworkPolicy | None = None, **kw) -> CaldavSender:
    cfg = CaldavChannel(type="caldav", url_template=url, username_env="CAL_USER", password_env="CAL_PASS",
                        timeout_seconds=kw.pop("timeout_seconds", 5), **kw)
    # Radicale listens on loopback, which the outbound guard refuses unless network.allow admits it.
    return build_channel("cal", cfg, network=network or loopback_policy())


def _n(kind="reminder", *, key="a" * 64, obligation="b" * 64, due=DUE, offset=-86400, caldav_url=None,
       previous_due_at=None, title="Federal tax return") -> Notification:
    return Notification(dedup_key=key, kind=kind, subscriber_id="s1", email=None, webhook_url=None,
                        subscriber_tz="America/New_York", source="irs", rule_id="1040", title=title, due_at=due,
                        offset_seconds=offset, url="https://www.irs.gov/", note="File or extend.",
                        previous_due_at=previous_due_at, sent_at=due + timedelta(seconds=offset),
                        obligation_key=obligation, caldav_url=caldav_url)


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_books_one_event_with_deterministic_uid_and_matching_alarm(radicale, creds):
    cal = radicale.make_calendar()
    ch = _channel(cal)
    n = _n(key=_key("remind-1"))
    res = ch.send(n)
    assert res.provider_message_id.startswith('booked, ETag "')
    [ev] = radicale.events(cal)
    assert str(ev["UID"]) == f"{n.dedup_key}@deadline-pipeline" == event_uid(n, "reminder")
    assert ev.decoded("DTSTART") == DUE and int(ev["SEQUENCE"]) == 0 and str(ev["STATUS"]) == "CONFIRMED"
    assert str(ev["SUMMARY"]) == "Federal tax return" and str(ev["URL"]) == "https://www.irs.gov/"
    [alarm] = ev.walk("VALARM")
    assert alarm.decoded("TRIGGER") == timedelta(days=-1) and str(alarm["ACTION"]) == "DISPLAY"
    ch.close()


def test_duplicate_create_is_412_already_booked_and_never_overwrites(radicale, creds):
    cal = radicale.make_calendar()
    ch = _channel(cal)
    first = _n(key=_key("dup"), title="Original title")
    ch.send(first)
    again = ch.send(_n(key=_key("dup"), title="A second body for the same alert"))
    assert again.provider_message_id == "already booked (412)"
    [ev] = radicale.events(cal)
    assert str(ev["SUMMARY"]) == "Original title", "If-None-Match: * kept the first booking"


def test_one_event_per_obligation_when_configured(radicale, creds):
    cal = radicale.make_calendar()
    ch = _channel(cal, book="obligation")
    ch.send(_n(key=_key("week"), offset=-7 * 86400))
    assert ch.send(_n(key=_key("day"), offset=-86400)).provider_message_id == "already booked (412)"
    [ev] = radicale.events(cal)
    assert str(ev["UID"]) == f"obligation-{'b' * 64}@deadline-pipeline"
    [alarm] = ev.walk("VALARM")
    assert alarm.decoded("TRIGGER") == timedelta(days=-7), "the reminder that booked it set the alarm"


def test_subscriber_caldav_url_and_template(radicale, creds):
    own = radicale.make_calendar()
    shared = radicale.make_calendar("team-s1")
    ch = _channel(f"{radicale.base}/{USER}/team-{{subscriber}}/")
    ch.send(_n(key=_key("own"), caldav_url=own))
    ch.send(_n(key=_key("templated")))
    assert len(radicale.events(own)) == 1 and len(radicale.events(shared)) == 1
    with pytest.raises(DeliveryError, match="no caldav_url") as exc:
        _channel(None).send(_n(key=_key("nowhere")))
    assert exc.value.permanent


def test_bad_credentials_are_permanent(radicale, creds, monkeypatch):
    cal = radicale.make_calendar()
    monkeypatch.setenv("CAL_PASS", "wrong")
    with pytest.raises(DeliveryError, match="401") as exc:
        _channel(cal).send(_n(key=_key("auth")))
    assert exc.value.permanent and exc.value.outcome == "failed"
    monkeypatch.delenv("CAL_PASS")
    with pytest.raises(DeliveryError, match="CAL_PASS is not set") as exc:
        _channel(cal).send(_n(key=_key("auth")))
    assert exc.value.permanent


def test_correction_updates_the_same_uids_with_sequence_plus_one(radicale, creds):
    cal = radicale.make_calendar()
    ch = _channel(cal)
    ch.send(_n(key=_key("c-week"), offset=-7 * 86400))
    ch.send(_n(key=_key("c-day"), offset=-86400))
    ch.send(_n(key=_key("other"), obligation="c" * 64))  # another deadline: untouched
    before = {str(e["UID"]): e for e in radicale.events(cal)}
    moved = DUE + timedelta(days=2)
    res = ch.send(_n("correction", key=_key("corr-1"), due=moved, offset=0, previous_due_at=DUE))
    assert res.provider_message_id == "corrected 2 of 2 event(s)"
    after = {str(e["UID"]): e for e in radicale.events(cal)}
    assert after.keys() == before.keys(), "no event added or lost"
    for uid, ev in after.items():
        if uid.startswith(_key("other")):
            assert ev.decoded("DTSTART") == DUE and int(ev["SEQUENCE"]) == 0
            continue
        assert ev.decoded("DTSTART") == moved and int(ev["SEQUENCE"]) == 1
        assert ev.walk("VALARM")[0].decoded("TRIGGER") == before[uid].walk("VALARM")[0].decoded("TRIGGER")
    # Applying the same correction again (a resend after an unknown outcome) changes nothing.
    assert ch.send(_n("correction", key=_key("corr-1"), due=moved, offset=0,
                      previous_due_at=DUE)).provider_message_id == "corrected 0 of 2 event(s)"
    assert sorted(int(e["SEQUENCE"]) for e in radicale.events(cal)) == [0, 1, 1]


def test_correction_of_a_deleted_event_escalates(radicale, creds):
    with pytest.raises(DeliveryError, match="no booked event") as exc:
        _channel(radicale.make_calendar()).send(_n("correction", key=_key("lost"), offset=0))
    assert exc.value.permanent


def test_cancellation_sets_status_cancelled(radicale, creds):
    cal = radicale.make_calendar()
    ch = _channel(cal, book="obligation")
    ch.send(_n(key=_key("x")))
    assert ch.send(_n("cancellation", key=_key("cx"), offset=0)).provider_message_id == "cancelled 1 of 1 event(s)"
    [ev] = radicale.events(cal)
    assert str(ev["STATUS"]) == "CANCELLED" and int(ev["SEQUENCE"]) == 1
    assert ch.send(_n("cancellation", key=_key("cx"), offset=0)).provider_message_id == "cancelled 0 of 1 event(s)"
    assert int(radicale.events(cal)[0]["SEQUENCE"]) == 1


def test_cancellation_deletes_when_configured(radicale, creds):
    cal = radicale.make_calendar()
    ch = _channel(cal, cancel="delete")
    ch.send(_n(key=_key("d1"), offset=-86400))
    ch.send(_n(key=_key("d2"), offset=-3600))
    assert ch.send(_n("cancellation", key=_key("cd"), offset=0)).provider_message_id == "deleted 2 of 2 event(s)"
    assert radicale.events(cal) == []
    assert ch.send(_n("cancellation", key=_key("cd"), offset=0)).provider_message_id == "deleted 0 of 0 event(s)"


def test_escalation_channel_cannot_be_caldav():
    with pytest.raises(ValueError, match="booking"):
        DeadlinesConfig(channels={"cal": {"type": "caldav", "url_template": "https://x/"}},
                        escalation={"channels": ["cal"]})


# --------------------------------------------------------------------------- unknown outcomes


class _Proxy(BaseHTTPRequestHandler):
    """Forwards every request to Radicale; ``mode`` decides what happens to PUTs: ``"forward"``,
    ``"drop_answer"`` (forwards, then closes without answering: the write happened, the client
    cannot know) or ``"drop_request"`` (closes without forwarding). ``"down"`` drops everything."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _handle(self) -> None:
        srv = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
        srv.seen.append(self.command)
        if srv.mode == "down" or (self.command == "PUT" and srv.mode == "drop_request" and srv.drops > 0):
            srv.drops -= 1
            self.close_connection = True
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length", "connection")}
        upstream = httpx.request(self.command, srv.target + self.path, headers=headers, content=body)
        if self.command == "PUT" and srv.mode == "drop_answer" and srv.drops > 0:
            srv.drops -= 1
            self.close_connection = True
            return
        self.send_response(upstream.status_code)
        for k, v in upstream.headers.items():
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(upstream.content)))
        self.end_headers()
        self.wfile.write(upstream.content)

    do_GET = do_PUT = do_DELETE = do_REPORT = do_PROPFIND = _handle


@pytest.fixture
def proxy(radicale):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    server.daemon_threads = True
    server.target, server.mode, server.drops, server.seen = radicale.base, "forward", 1, []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_answer_lost_after_the_write_is_resolved_by_lookup(radicale, proxy, creds):
    server, base = proxy
    cal = radicale.make_calendar()
    server.mode = "drop_answer"
    res = _channel(cal.replace(radicale.base, base)).send(_n(key=_key("lost-answer")))
    assert res.provider_message_id.startswith('found by lookup, ETag "')
    assert server.seen == ["PUT", "GET"], "asked the server, did not book again"
    assert len(radicale.events(cal)) == 1


def test_request_lost_before_the_write_is_booked_again_after_lookup(radicale, proxy, creds):
    server, base = proxy
    cal = radicale.make_calendar()
    server.mode = "drop_request"
    res = _channel(cal.replace(radicale.base, base)).send(_n(key=_key("lost-request")))
    assert res.provider_message_id.startswith("booked, ETag")
    assert server.seen == ["PUT", "GET", "PUT"], "booked again only after the server proved it absent"
    assert len(radicale.events(cal)) == 1


def test_lookup_impossible_is_a_permanent_unknown(radicale, proxy, creds):
    server, base = proxy
    cal = radicale.make_calendar()
    server.mode = "down"
    with pytest.raises(DeliveryError, match="lookup") as exc:
        _channel(cal.replace(radicale.base, base), timeout_seconds=1).send(_n(key=_key("dark")))
    assert exc.value.permanent and exc.value.outcome == "unknown"
    assert server.seen == ["PUT", "GET"]


@pytest.mark.parametrize("where", ["headers", "body"])
def test_each_request_ends_within_the_timeout_however_the_answer_drips(creds, where):
    """A server dripping its answer a byte every 0.2 s (each read well within the 1 s timeout): the
    booking's PUT ends at its timeout as no answer, the lookup's GET likewise, so the send ends as
    a permanent unknown after two timeouts instead of waiting out the drips and reporting booked."""
    with DripServer(where) as server:
        ch = _channel(f"{server.url}/cal/", timeout_seconds=1)
        started = time.monotonic()
        try:
            with pytest.raises(DeliveryError, match="lookup") as exc:
                ch.send(_n(key=_key(f"drip-{where}")))
        finally:
            ch.close()
        elapsed = time.monotonic() - started
        assert server.requests == 2, "the PUT and the lookup's GET"
    assert exc.value.permanent and exc.value.outcome == "unknown"
    # Two requests of at most 1 s each, plus slack for this shared machine (the drips take 12 s).
    assert elapsed < 3.0, f"the send took {elapsed:.1f} s for two requests with a 1 s timeout"


# --------------------------------------------------------------------------- the sweep's lookup after a crash


def _dead_sender(engine, ids, owner="dead#9#r"):
    with engine.begin() as conn:
        assert sorted(dsql.claim_batch(conn, owner=owner, now=T0, lease_seconds=300, limit=100)) == sorted(ids)
        dsql.start_attempts(conn, [(i, 1) for i in ids], owner=owner, now=T0)


def _notification_of(engine, alert_id, cal) -> Notification:
    with engine.connect() as conn:
        row = conn.execute(select(alerts.c.dedup_key, obligations.c.obligation_key, obligations.c.due_at,
                                  obligations.c.title).join(obligations, obligations.c.id == alerts.c.obligation_id)
                           .where(alerts.c.id == alert_id)).one()
    return _n(key=row.dedup_key, obligation=row.obligation_key, due=row.due_at, title=row.title, caldav_url=cal)


def test_sweep_resolves_a_dead_senders_booking_by_lookup(engine, radicale, creds):
    cal = radicale.make_calendar()
    booked, absent = seed(engine, 2, channel="cal")
    with engine.begin() as conn:
        conn.execute(update(subscribers).values(caldav_url=cal))
    _dead_sender(engine, [booked, absent])
    # The dead sender's PUT of the first alert landed; the second never left.
    _channel().send(_notification_of(engine, booked, cal))
    cfg = DeadlinesConfig(channels={"cal": CaldavChannel(type="caldav", username_env="CAL_USER",
                                                         password_env="CAL_PASS")},
                          network=LOOPBACK_NETWORK)
    expire_leases(engine)  # leases run on the database clock, which the test does not advance
    out = sweep(engine, cfg, T0 + timedelta(seconds=301))
    assert (out.recovered_unknown, out.unknown_found, out.unknown_absent, out.delivered) == (2, 1, 1, 2)
    assert len(radicale.events(cal)) == 2, "one event per alert"
    with engine.connect() as conn:
        pmid = dict(conn.execute(select(alerts.c.id, alerts.c.provider_message_id)).all())
        outcomes = conn.execute(select(delivery_attempts.c.alert_id, delivery_attempts.c.outcome)
                                .order_by(delivery_attempts.c.id)).all()
    assert pmid[booked].startswith('found by lookup, ETag "') and pmid[absent].startswith("booked, ETag")
    assert sorted(outcomes) == sorted([(booked, "unknown"), (absent, "unknown"), (booked, "sent"), (absent, "sent")])


def test_sweep_escalates_when_the_lookup_is_impossible(engine, creds):
    [a] = seed(engine, 1, channel="cal")
    _dead_sender(engine, [a])
    dark = "http://127.0.0.1:9/nobody/cal/"  # discard port: nothing listens
    with engine.begin() as conn:
        conn.execute(update(subscribers).values(caldav_url=dark))
    cfg = DeadlinesConfig(channels={"cal": CaldavChannel(type="caldav", username_env="CAL_USER",
                                                         password_env="CAL_PASS", timeout_seconds=1)},
                          network=LOOPBACK_NETWORK)
    expire_leases(engine)  # leases run on the database clock, which the test does not advance
    out = sweep(engine, cfg, T0 + timedelta(seconds=301))
    assert (out.recovered_unknown, out.escalated, out.delivered) == (1, 1, 0)
    with engine.connect() as conn:
        status, reason = conn.execute(select(alerts.c.status, alerts.c.status_reason).where(alerts.c.id == a)).one()
    assert status == "escalated" and "lookup" in reason


# --------------------------------------------------------------------------- the outbound guard


def _to_loopback(host: str, port: int) -> list[str]:
    # Every name resolves to this machine's loopback: were the guard broken, the packet stays here.
    return ["127.0.0.1"]


@pytest.mark.parametrize("template, rule", [
    ("http://127.0.0.1:{port}/alice/cal/", "loopback"),
    ("http://0x7f000001:{port}/alice/cal/", "loopback"),
    ("http://[::ffff:127.0.0.1]:{port}/alice/cal/", "IPv4-mapped loopback"),
    ("http://calendar.test:{port}/alice/cal/", r"'calendar\.test'.* loopback"),
    ("http://alice:pw-7e7e7e@127.0.0.1:{port}/alice/cal/?token=tk-7e7e7e", "loopback"),
])
@pytest.mark.parametrize("kind", ["reminder", "cancellation"])
def test_a_calendar_on_a_refused_address_is_permanent_before_any_connection(creds, template, rule, kind):
    counter = ConnectionCounter()
    try:
        ch = _channel(template.format(port=counter.port), network=DEFAULT_POLICY.with_resolver(_to_loopback))
        with pytest.raises(DeliveryError, match=rule) as exc:
            ch.send(_n(kind, key=_key(f"refused-{kind}"), offset=0 if kind != "reminder" else -86400))
        ch.close()
    finally:
        counter.close()
    assert exc.value.permanent and exc.value.outcome == "failed", "refused: never retried"
    text = str(exc.value)
    assert "network.allow" in text and "pw-7e7e7e" not in text and "tk-7e7e7e" not in text
    assert counter.accepted == 0, "the guard decided on the address before connecting"


def test_the_lookup_after_a_crash_refused_by_the_guard_escalates_as_unknown(creds):
    counter = ConnectionCounter()
    try:
        ch = _channel(f"http://127.0.0.1:{counter.port}/alice/cal/", network=DEFAULT_POLICY)
        with pytest.raises(DeliveryError, match="lookup.* loopback") as exc:
            ch.resolve_unknown(_n(key=_key("refused-lookup")))
    finally:
        counter.close()
    # An earlier attempt may have booked (under another policy): not "failed", a human decides.
    assert exc.value.permanent and exc.value.outcome == "unknown" and counter.accepted == 0


class _Redirect(BaseHTTPRequestHandler):
    """Answers every request with 307 (method kept) to ``server.location``."""

    def log_message(self, *args) -> None:
        pass

    def _handle(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
        self.server.seen.append(self.command)
        self.send_response(307)
        self.send_header("Location", self.server.location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_PUT = do_REPORT = do_DELETE = _handle


def test_a_redirect_to_a_disallowed_address_is_refused_and_not_followed(creds):
    # The allowed server (127.0.0.1) redirects to 127.0.0.2: loopback too, but outside network.allow.
    inner = ConnectionCounter("127.0.0.2")
    outer = ThreadingHTTPServer(("127.0.0.1", 0), _Redirect)
    outer.daemon_threads, outer.seen = True, []
    outer.location = f"http://127.0.0.2:{inner.port}/alice/cal/{_key('moved')}.ics"
    threading.Thread(target=outer.serve_forever, daemon=True).start()
    try:
        ch = _channel(f"http://127.0.0.1:{outer.server_address[1]}/alice/cal/")
        with pytest.raises(DeliveryError, match="307") as exc:
            ch.send(_n(key=_key("moved")))
        ch.close()
    finally:
        outer.shutdown()
        outer.server_close()
        inner.close()
    assert exc.value.permanent and exc.value.outcome == "failed", "the configured calendar URL is wrong"
    assert outer.seen == ["PUT"] and inner.accepted == 0, "the redirect was not followed"


def test_a_calendar_url_without_http_is_a_permanent_configuration_error(creds):
    # Not an unknown outcome: nothing can have left for a scheme httpx cannot speak.
    with pytest.raises(DeliveryError, match="unusable URL") as exc:
        _channel().send(_n(key=_key("ftp"), caldav_url="ftp://127.0.0.1/alice/cal/"))
    assert exc.value.permanent and exc.value.outcome == "failed"
