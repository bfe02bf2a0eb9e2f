"""The delivery sweep against the real store (SQLite and PostgreSQL) and real loopback receivers:
admission, attempts counted once, escalation, unknown outcomes after a crash, Retry-After, limits,
one bad alert failing alone, header injection, Standard Webhooks signatures, and the delivery-side
cases of ``../shared/cases/recurrence_and_delivery_cases.json`` (C23, C24, C25, C27, C28).

Alerts are seeded with direct inserts (:func:`seed`), so each test states exactly the rows it needs.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import hashlib
import json
import logging
import mailbox
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import func, insert, select, update

from deadline_pipeline.config import (
    DeadlinesConfig,
    EscalationConfig,
    MaildirChannel,
    SlackChannel,
    WebhookChannel,
)
from deadline_pipeline.deliver.channels.base import IDEMPOTENCY_BOOKING, IDEMPOTENCY_NOTIFICATION
from deadline_pipeline.deliver.channels.slack import SlackSender
from deadline_pipeline.deliver.notification import DeliveryError, SendResult
from deadline_pipeline.deliver.sweep import lease_owner, sweep
from deadline_pipeline.deliver.throttle import ThrottledLogger
from deadline_pipeline.store import delivery as dsql
from deadline_pipeline.store.db import db_clock
from deadline_pipeline.store.schema import (
    alerts,
    delivery_attempts,
    obligations,
    rule_versions,
    snapshots,
    sources,
    subscribers,
)
from deadline_pipeline_tests.drip_server import DripServer
from deadline_pipeline_tests.factories import LOOPBACK_NETWORK, loopback_policy

T0 = datetime(2027, 3, 1, 9, 0, tzinfo=UTC)
SECRET = "whsec_" + base64.b64encode(b"a test signing key of 24b").decode()


# --------------------------------------------------------------------------- seeding


def seed(engine, n: int, *, channel: str = "hook", webhook_url: str | None = None, email: str | None = "a@example.org",
         tz: str = "UTC", send_at: datetime = T0, title: str = "Deadline {i}", note: str | None = None,
         kind: str = "reminder") -> list[int]:
    """Insert ``n`` due alerts (one obligation each) for one new subscriber; returns the alert ids."""
    tag = uuid.uuid4().hex[:8]
    with engine.begin() as conn:
        src = conn.execute(insert(sources).values(name=f"src-{tag}", tenant="t", format="ics", location="x",
                                                  freshness_seconds=86400)).inserted_primary_key[0]
        snap = conn.execute(insert(snapshots).values(source_id=src, fetched_at=T0, sha256=tag, size=1,
                                                     content=b"x")).inserted_primary_key[0]
        conn.execute(insert(rule_versions).values(source_id=src, rule_id="r1", version=1, snapshot_id=snap,
                                                  valid_from=T0, withdrawn=False, content_hash=tag,
                                                  payload={"note": note, "url": "https://example.org/x"}))
        sub = conn.execute(insert(subscribers).values(external_id=f"sub-{tag}", tenant="t", email=email,
                                                      webhook_url=webhook_url, timezone=tz)).inserted_primary_key[0]
        conn.execute(insert(obligations), [
            {"obligation_key": f"{tag}-{i}", "tenant": "t", "subscriber_id": sub, "source_id": src, "rule_id": "r1",
             "rule_version": 1, "period": str(i), "title": title.format(i=i), "due_at": send_at + timedelta(days=1),
             "status": "active", "planned_at": T0} for i in range(n)])
        obl = conn.execute(select(obligations.c.id).where(obligations.c.source_id == src)
                           .order_by(obligations.c.id)).scalars().all()
        conn.execute(insert(alerts), [
            {"obligation_id": o, "offset_seconds": -86400, "channel": channel, "kind": kind,
             "dedup_key": hashlib.sha256(f"{tag}-{o}".encode()).hexdigest(), "send_at": send_at,
             "status": "pending", "attempts": 0, "created_at": T0, "updated_at": T0} for o in obl])
        return conn.execute(select(alerts.c.id).where(alerts.c.obligation_id.in_(obl))
                            .order_by(alerts.c.id)).scalars().all()


def config(channels: dict, **delivery) -> DeadlinesConfig:
    # The receivers of these tests listen on loopback, which the outbound guard admits only when allowed.
    return DeadlinesConfig(channels=channels, delivery={"backoff_base_seconds": 30, **delivery},
                           network=LOOPBACK_NETWORK)


def states(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(select(alerts.c.status, func.count()).group_by(alerts.c.status)).all())


def attempts_of(engine, alert_id: int) -> list[tuple]:
    with engine.connect() as conn:
        return conn.execute(select(delivery_attempts.c.attempt, delivery_attempts.c.outcome,
                                   delivery_attempts.c.lease_owner)
                            .where(delivery_attempts.c.alert_id == alert_id)
                            .order_by(delivery_attempts.c.id)).all()


# --------------------------------------------------------------------------- receivers


class Recorder(BaseHTTPRequestHandler):
    """Records every POST; answers by path: /ok 200, /slow (sleeps ``delay`` s, then 200), /limited 429
    with Retry-After 7200, /error 500, /bad 400, /hang (reads the body, then sleeps past the client
    timeout). Tracks the most requests in flight at once."""

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        srv = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with srv.lock:
            srv.requests.append({"path": self.path, "headers": dict(self.headers.items()), "body": body,
                                 "at": time.monotonic()})
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
        if self.path == "/slow":
            time.sleep(srv.delay)
        if self.path == "/hang":
            time.sleep(2.0)
        # Counted out before answering: the client may send its next request as soon as it reads this.
        with srv.lock:
            srv.in_flight -= 1
        try:
            status, headers = {"/ok": (200, {}), "/slow": (200, {}), "/limited": (429, {"Retry-After": "7200"}),
                               "/error": (500, {}), "/bad": (400, {}), "/hang": (200, {})}[self.path]
            payload = b'{"id": "evt"}' if status == 200 else b"no"
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def receiver():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.daemon_threads = True
    server.requests, server.lock, server.in_flight, server.max_in_flight, server.delay = [], threading.Lock(), 0, 0, 0.0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class FakeChannel:
    """A channel under the test's control: ``plan`` maps a dedup key to an exception to raise."""

    def __init__(self, name: str = "fake", idempotency_class: str = IDEMPOTENCY_NOTIFICATION) -> None:
        self.name = name
        self.idempotency_class = idempotency_class
        self.sent: list[str] = []
        self.errors: dict[str, BaseException] = {}
        self.default_error: BaseException | None = None

    def send(self, n):
        self.sent.append(n.dedup_key)
        err = self.errors.get(n.dedup_key, self.default_error)
        if err is not None:
            raise err
        return SendResult(provider_message_id=f"fake-{n.dedup_key[:8]}")

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- admission


def test_admission_is_null_safe_with_both_nullable_sides_null(engine):
    [due] = seed(engine, 1)
    [future] = seed(engine, 1, send_at=T0 + timedelta(hours=1))
    with engine.begin() as conn:
        row = conn.execute(select(alerts.c.lease_owner, alerts.c.lease_expires_at, alerts.c.next_attempt_at)
                           .where(alerts.c.id == due)).one()
        assert row == (None, None, None)
        assert dsql.count_claimable(conn, T0) == 1
        # An attempt row by an owner compared null-safely: a fresh claim sees no stale attempt of its own.
        assert dsql.claim_batch(conn, owner="me#1#r", now=T0, lease_seconds=60, limit=10) == [due]
        assert dsql.close_stale_attempts(conn, [due], owner="me#1#r", now=T0) == {}
        with pytest.raises(ValueError):
            dsql.claim_batch(conn, owner="", now=T0, lease_seconds=60, limit=10)
    assert future not in (due,)


def test_claim_honours_the_batch_limit(engine):
    seed(engine, 120)
    with engine.begin() as conn:
        first = dsql.claim_batch(conn, owner="a#1#r", now=T0, lease_seconds=60, limit=50)
        second = dsql.claim_batch(conn, owner="b#1#r", now=T0, lease_seconds=60, limit=50)
        third = dsql.claim_batch(conn, owner="c#1#r", now=T0, lease_seconds=60, limit=50)
    assert (len(first), len(second), len(third)) == (50, 50, 20)
    assert not set(first) & set(second)


def test_claim_and_load_is_the_step_by_step_claim_in_one_statement(engine):
    """The sweep's claim (one statement on PostgreSQL) returns what claim_batch + load_claimed +
    close_stale_attempts + add_attempts did: the oldest due alerts up to the limit, never one held
    on a live lease, each row's attempts counting a dead holder's unfinished attempt, which is
    closed as unknown."""
    ids = seed(engine, 6)
    dead, held = ids[1], ids[2]
    with engine.begin() as conn:
        clock = db_clock(conn)
        conn.execute(update(alerts).where(alerts.c.id == dead).values(
            status="claimed", lease_owner="dead#1#r", lease_expires_at=clock - timedelta(hours=1)))
        conn.execute(insert(delivery_attempts).values(alert_id=dead, attempt=1, lease_owner="dead#1#r",
                                                      started_at=T0))
        conn.execute(update(alerts).where(alerts.c.id == held).values(
            status="claimed", lease_owner="live#2#r", lease_expires_at=clock + timedelta(hours=1)))
    with engine.begin() as conn:
        rows, stale = dsql.claim_and_load(conn, owner="me#1#r", now=T0, lease_seconds=60, limit=3)
    assert [r["id"] for r in rows] == [ids[0], dead, ids[3]]
    assert stale == {dead: 1}
    assert {r["id"]: r["attempts"] for r in rows} == {ids[0]: 0, dead: 1, ids[3]: 0}
    with engine.begin() as conn:
        loaded = {r["id"]: r for r in dsql.load_claimed(conn, [r["id"] for r in rows])}
        assert rows == [loaded[r["id"]] for r in rows], "the same columns and values as load_claimed"
        held_rows = conn.execute(select(alerts.c.id, alerts.c.lease_owner, alerts.c.attempts)
                                 .where(alerts.c.id.in_(ids)).order_by(alerts.c.id)).all()
        assert [(i, o) for i, o, _ in held_rows] == [
            (ids[0], "me#1#r"), (dead, "me#1#r"), (held, "live#2#r"), (ids[3], "me#1#r"), (ids[4], None),
            (ids[5], None)]
        assert conn.execute(select(delivery_attempts.c.outcome, delivery_attempts.c.finished_at.is_not(None))
                            .where(delivery_attempts.c.alert_id == dead)).all() == [("unknown", True)]
    with engine.begin() as conn:
        rest, stale = dsql.claim_and_load(conn, owner="me#2#r", now=T0, lease_seconds=60, limit=10)
        assert ([r["id"] for r in rest], stale) == ([ids[4], ids[5]], {})
        assert dsql.claim_and_load(conn, owner="me#3#r", now=T0, lease_seconds=60, limit=10) == ([], {})


def test_attempt_rows_start_only_on_a_lease_still_held(engine):
    """The check right before a send: an attempt row is written only for an alert this owner holds
    on an unexpired lease by the database clock; the others get none and must not be sent."""
    mine, expired, other, done = seed(engine, 4)
    with engine.begin() as conn:
        clock = db_clock(conn)
        for alert, owner, until, status in [(mine, "me#1#r", clock + timedelta(minutes=5), "claimed"),
                                            (expired, "me#1#r", clock - timedelta(seconds=1), "claimed"),
                                            (other, "them#2#r", clock + timedelta(minutes=5), "claimed"),
                                            (done, "me#1#r", clock + timedelta(minutes=5), "delivered")]:
            conn.execute(update(alerts).where(alerts.c.id == alert).values(status=status, lease_owner=owner,
                                                                           lease_expires_at=until))
    with engine.begin() as conn:
        started = dsql.start_attempts(conn, [(a, 1) for a in (mine, expired, other, done)], owner="me#1#r",
                                      now=T0, held_only=True)
    assert list(started) == [mine]
    with engine.connect() as conn:
        assert conn.execute(select(delivery_attempts.c.alert_id, delivery_attempts.c.lease_owner)).all() == [
            (mine, "me#1#r")]


# --------------------------------------------------------------------------- attempts and escalation


def test_a_failure_consumes_exactly_one_attempt(engine):
    [a] = seed(engine, 1, channel="fake")
    fake = FakeChannel()
    err = DeliveryError("provider said no", permanent=False)
    fake.default_error = err
    cfg = config({"fake": MaildirChannel(type="maildir", path="/nonexistent")})
    out = sweep(engine, cfg, T0, channels={"fake": fake})
    assert (out.failed, out.escalated) == (1, 0)
    assert err.recorded, "the sweep marks the failure as counted"
    with engine.connect() as conn:
        assert conn.execute(select(alerts.c.attempts, alerts.c.status).where(alerts.c.id == a)).one() == (
            1, "retry_wait")
    assert [o for _, o, _ in attempts_of(engine, a)] == ["failed"]
    # A handler further out that records the same failure of the same attempt again does not count it.
    from deadline_pipeline.deliver.lanes import AlertSend
    from deadline_pipeline.deliver.sweep import Sweep

    with engine.begin() as conn:
        conn.execute(update(alerts).where(alerts.c.id == a).values(status="claimed", lease_owner="o#1#r"))
        row = dsql.load_claimed(conn, [a])[0]
    runner = Sweep(engine, cfg, T0, "o#1#r", lambda: T0, None, {"fake": fake})
    [(attempt_id,)] = [(i,) for i in [err.recorded_attempt]]
    runner._record([AlertSend(row=row, attempt_id=attempt_id, attempt_no=1, error=err)], "o#1#r")
    with engine.connect() as conn:
        assert conn.execute(select(alerts.c.attempts).where(alerts.c.id == a)).scalar_one() == 1


def test_permanent_error_escalates_loudly_and_notifies_escalation_channel(engine, tmp_path, caplog):
    [a] = seed(engine, 1, channel="fake", title="Tax return")
    fake = FakeChannel()
    fake.default_error = DeliveryError("550 no such user", permanent=True)
    cfg = DeadlinesConfig(
        channels={"fake": MaildirChannel(type="maildir", path="/nonexistent"),
                  "ops": MaildirChannel(type="maildir", path=str(tmp_path / "ops"))},
        escalation=EscalationConfig(channels=["ops"], email="ops@example.org"),
    )
    with caplog.at_level(logging.ERROR, logger="deadline_pipeline.deliver.sweep"):
        out = sweep(engine, cfg, T0, channels={"fake": fake})
    assert (out.escalated, out.escalation_notices, out.escalation_notice_failures) == (1, 1, 0)
    assert any(r.levelno == logging.ERROR and f"alert {a} escalated" in r.getMessage() for r in caplog.records)
    with engine.connect() as conn:
        status, reason = conn.execute(select(alerts.c.status, alerts.c.status_reason).where(alerts.c.id == a)).one()
    assert status == "escalated" and "550" in reason
    [msg] = list(mailbox.Maildir(tmp_path / "ops", create=False))
    # A page, not a reminder: the subject names the incident and its key (folded when long).
    assert msg["To"] == "ops@example.org" and " ".join(msg["Subject"].split()) == (
        f"[incident triggered] deadline-pipeline/delivery/alert_delivered/alert-{a}: NOT DELIVERED: Tax return")
    assert "550 no such user" in msg.get_payload()[0].get_payload(decode=True).decode()


def test_an_alert_on_a_channel_no_longer_configured_is_escalated_not_left_claimed(engine, tmp_path):
    """A channel renamed in the configuration (``box`` became ``mail``) left its alerts claimed: the
    error came before any attempt row, was taken for one already recorded, and nothing was written;
    every sweep claimed them again and reported "failed 0, escalated 0"."""
    [a] = seed(engine, 1, channel="box", title="Tax return")
    cfg = DeadlinesConfig(
        channels={"mail": MaildirChannel(type="maildir", path=str(tmp_path / "mail")),
                  "ops": MaildirChannel(type="maildir", path=str(tmp_path / "ops"))},
        escalation=EscalationConfig(channels=["ops"], email="ops@example.org"),
    )
    out = sweep(engine, cfg, T0)
    assert (out.claimed, out.escalated, out.escalation_notices) == (1, 1, 1), out
    with engine.connect() as conn:
        status, reason = conn.execute(select(alerts.c.status, alerts.c.status_reason).where(alerts.c.id == a)).one()
    assert status == "escalated" and "channel 'box' is no longer configured" in reason, (status, reason)
    assert len(list(mailbox.Maildir(tmp_path / "ops", create=False))) == 1


def _oncall_config(oncall: DripServer, **delivery) -> DeadlinesConfig:
    """Webhook alerts (timeout 5 s) whose escalation notices go to ``oncall`` (timeout 1 s)."""
    return DeadlinesConfig(
        channels={"hook": WebhookChannel(type="webhook", timeout_seconds=5),
                  "ops": WebhookChannel(type="webhook", timeout_seconds=1)},
        escalation=EscalationConfig(channels=["ops"], webhook_url=f"{oncall.url}/page"),
        delivery=delivery, network=LOOPBACK_NETWORK)


def test_a_dripping_escalation_receiver_does_not_hold_the_sweep(engine, receiver, caplog):
    """Escalation notices are sent synchronously from the bookkeeping thread, which records every
    batch: a notice receiver dripping its answer (a byte every 0.5 s, each read within the 1 s
    timeout) held it for the whole drip (15 s), past the sweep's time budget, with the later
    batches' sent alerts unrecorded meanwhile. The notice now ends at its timeout, as a failed
    notice, and the sweep records every alert within its budget. Its log line says the notice may
    have been delivered: the channel's own words, "the alert may have been delivered", were read
    as news of the escalated alert, which was not."""
    server, base = receiver
    [bad] = seed(engine, 1, webhook_url=f"{base}/bad")  # 400: permanent, escalated in the first batch
    good = seed(engine, 5, webhook_url=f"{base}/ok")
    # Dripping its header block: a dripping body after a 200 would be an acknowledged notice.
    with DripServer("headers", every=0.5) as oncall:
        cfg = _oncall_config(oncall, batch_size=2, time_budget_seconds=4)
        started = time.monotonic()
        with caplog.at_level(logging.ERROR, logger="deadline_pipeline.deliver.sweep"):
            out = sweep(engine, cfg, T0)
        elapsed = time.monotonic() - started
        assert oncall.requests == 1
    assert elapsed < cfg.delivery.time_budget_seconds, f"the sweep took {elapsed:.1f} s"
    [failed] = [r.getMessage() for r in caplog.records if "escalation notice on channel 'ops' failed" in r.getMessage()]
    assert "the notice may have been delivered" in failed and "the alert may" not in failed, failed
    assert f"alert {bad}: escalation notice on channel 'ops' failed: DeliveryError:" in failed, failed
    assert (out.delivered, out.escalated, out.escalation_notices, out.escalation_notice_failures) == (5, 1, 0, 1)
    assert states(engine) == {"delivered": 5, "escalated": 1}
    assert len(server.requests) == 1 + len(good)
    with engine.connect() as conn:
        assert conn.execute(select(alerts.c.status).where(alerts.c.id == bad)).scalar_one() == "escalated"


def test_a_mass_escalation_to_a_timing_out_receiver_does_not_hold_the_sweep(engine, receiver, caplog):
    """Escalation notices go out one by one from the thread that records every batch, each for up
    to its channel's timeout. Twelve alerts escalated at once (their receiver refuses them) with an
    on-call receiver that never answers in time held that thread for 12 timeouts, past the sweep's
    time budget, while the other subscribers' sent alerts waited unrecorded. After three failed
    notices in a row the channel gets no more in this sweep: each alert is still escalated, its
    missing notice counted and logged, and the suspension said once."""
    server, base = receiver
    bad = seed(engine, 12, webhook_url=f"{base}/bad")  # 400: permanent, escalated at once
    good = seed(engine, 5, webhook_url=f"{base}/ok")
    with DripServer("headers", every=0.5) as oncall:
        cfg = _oncall_config(oncall, batch_size=20, time_budget_seconds=8)
        started = time.monotonic()
        with caplog.at_level(logging.ERROR, logger="deadline_pipeline.deliver.sweep"):
            out = sweep(engine, cfg, T0)
        elapsed = time.monotonic() - started
        assert oncall.requests == 3
    # Three 1-s timeouts and the sweep's own work; twelve would be 12 s. The margin is for a loaded
    # machine (this bound failed at 6 s while two test suites shared the two cores).
    assert elapsed < 3 + 6, f"the sweep took {elapsed:.1f} s"
    assert (out.delivered, out.escalated, out.escalation_notices, out.escalation_notice_failures) == (5, 12, 0, 12)
    assert states(engine) == {"delivered": 5, "escalated": 12}
    assert len(server.requests) == len(bad) + len(good)
    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("escalation notices on channel 'ops' suspended") for m in messages) == 1
    assert sum("notices there are suspended" in m for m in messages) == 12 - 3


def test_attempts_exhausted_escalate_after_max_attempts(engine):
    [a] = seed(engine, 1, channel="fake")
    fake = FakeChannel()
    fake.default_error = DeliveryError("busy", permanent=False)
    cfg = config({"fake": MaildirChannel(type="maildir", path="/x")}, max_attempts=3)
    t = T0
    for _ in range(3):
        sweep(engine, cfg, t, channels={"fake": fake})
        t += timedelta(hours=2)
    with engine.connect() as conn:
        assert conn.execute(select(alerts.c.status, alerts.c.attempts).where(alerts.c.id == a)).one() == (
            "escalated", 3)
    assert len(fake.sent) == 3


# --------------------------------------------------------------------------- unknown outcome after a crash


def _crash_after_claim(engine, alert_ids, owner="dead#7#r"):
    """A sender that claimed, started its attempts, maybe sent, and died before recording."""
    with engine.begin() as conn:
        ids = dsql.claim_batch(conn, owner=owner, now=T0, lease_seconds=300, limit=100)
        assert sorted(ids) == sorted(alert_ids)
        dsql.start_attempts(conn, [(i, 1) for i in ids], owner=owner, now=T0)


def expire_leases(engine, ids=None):
    """Let the leases of ``ids`` (default: all) run out: leases are judged by the database clock,
    which a test does not advance, so their expiry is moved to one second before it."""
    from deadline_pipeline.store.db import db_clock

    with engine.begin() as conn:
        past = db_clock(conn) - timedelta(seconds=1)
        stmt = update(alerts).where(alerts.c.lease_expires_at.is_not(None))
        if ids is not None:
            stmt = stmt.where(alerts.c.id.in_(ids))
        conn.execute(stmt.values(lease_expires_at=past))


def test_unknown_outcome_resends_notification_with_same_key(engine):
    [a] = seed(engine, 1, channel="fake")
    _crash_after_claim(engine, [a])
    fake = FakeChannel()
    cfg = config({"fake": MaildirChannel(type="maildir", path="/x")})
    # A replayed "now" past the lease does not free it: leases run on the database clock.
    assert sweep(engine, cfg, T0 + timedelta(seconds=301), channels={"fake": fake}).claimed == 0, "lease holds"
    expire_leases(engine)
    out = sweep(engine, cfg, T0 + timedelta(seconds=301), channels={"fake": fake})
    assert (out.delivered, out.recovered_unknown) == (1, 1)
    with engine.connect() as conn:
        key = conn.execute(select(alerts.c.dedup_key).where(alerts.c.id == a)).scalar_one()
    assert fake.sent == [key]
    assert [(n, o) for n, o, _ in attempts_of(engine, a)] == [(1, "unknown"), (2, "sent")]


def test_unknown_outcome_on_booking_channel_escalates_without_resending(engine, caplog):
    [a] = seed(engine, 1, channel="book")
    _crash_after_claim(engine, [a])
    expire_leases(engine)
    booking = FakeChannel("book", IDEMPOTENCY_BOOKING)
    cfg = config({"book": MaildirChannel(type="maildir", path="/x")})
    with caplog.at_level(logging.ERROR):
        out = sweep(engine, cfg, T0 + timedelta(seconds=301), channels={"book": booking})
    assert booking.sent == [], "a permanent side effect is never repeated blindly"
    assert out.escalated == 1
    with engine.connect() as conn:
        status, reason = conn.execute(select(alerts.c.status, alerts.c.status_reason).where(alerts.c.id == a)).one()
    assert status == "escalated" and "unknown outcome on booking channel" in reason
    assert any("escalated" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)


def test_c25_job_stuck_after_worker_loss_is_reclaimed_by_a_new_incarnation(engine):
    """Case C25: the lease lives on the alert row; expiry alone frees it, whatever happened to the worker."""
    ids = seed(engine, 3, channel="fake")
    _crash_after_claim(engine, ids, owner="host#1#cli-deadbeef")
    expire_leases(engine)
    a, b = lease_owner(), lease_owner()
    assert a != b and a.split("#")[:2] == b.split("#")[:2], "same host and pid, new incarnation"
    fake = FakeChannel()
    out = sweep(engine, config({"fake": MaildirChannel(type="maildir", path="/x")}), T0 + timedelta(seconds=301),
                owner=a, channels={"fake": fake})
    assert out.delivered == 3 and states(engine) == {"delivered": 3}


# --------------------------------------------------------------------------- leases (C23, C24, C27)


def test_c24_claim_race_takes_disjoint_rows(pg_url):
    """Case C24: two claimers at the same instant; each row is started by exactly one of them."""
    from deadline_pipeline.store.db import make_engine, upgrade

    eng = make_engine(pg_url)
    upgrade(eng)
    seed(eng, 200)
    got: dict[str, list[int]] = {}
    barrier = threading.Barrier(4)

    def claim(owner):
        barrier.wait()
        with eng.begin() as conn:
            got[owner] = dsql.claim_batch(conn, owner=owner, now=T0, lease_seconds=300, limit=80)

    threads = [threading.Thread(target=claim, args=(f"w#{i}#r",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = [i for ids in got.values() for i in ids]
    assert len(claimed) == len(set(claimed)) == 200
    eng.dispose()


def test_c23_no_send_starts_after_the_lease_margin(engine, receiver):
    """Case C23: work longer than the lease must not run on an expired lease; unsent alerts are given back."""
    server, base = receiver
    seed(engine, 40, webhook_url=f"{base}/ok")
    hook = WebhookChannel(type="webhook", timeout_seconds=0.5, rate_per_second=20)
    # lease 6 s - (5 s safety + 0.5 s timeout) = sends may start for 0.5 s after the claim.
    cfg = config({"hook": hook}, lease_seconds=6, time_budget_seconds=5)
    out = sweep(engine, cfg, T0, max_batches=1)
    assert 5 <= out.delivered <= 15 and out.released == 40 - out.delivered
    assert states(engine) == {"delivered": out.delivered, "pending": out.released}
    with engine.connect() as conn:
        # Released alerts keep no attempt row: no attempt was consumed.
        assert conn.execute(select(func.count()).select_from(delivery_attempts)).scalar_one() == out.delivered


def test_c27_backlog_drains_over_consecutive_runs_within_limits(engine, receiver):
    """Case C27 / requirement 7: bounded batches and a time budget; every alert handled exactly once."""
    server, base = receiver
    server.delay = 0.02
    seed(engine, 300, webhook_url=f"{base}/slow")
    hook = WebhookChannel(type="webhook", timeout_seconds=2, max_concurrency=4, rate_per_second=400)
    cfg = config({"hook": hook}, batch_size=50, time_budget_seconds=0.6)
    runs = []
    while states(engine).get("delivered", 0) < 300:
        out = sweep(engine, cfg, T0)
        runs.append(out.delivered)
        # A guard against a sweep that makes no progress, not a rate: how much a 0.6 s budget delivers
        # depends on the machine's load (about 100 a run when idle, 4-21 seen under heavy load).
        assert len(runs) < 300, runs
    assert len(runs) >= 2, "the budget split the backlog over several runs"
    ids = [json.loads(r["body"])["data"]["id"] for r in server.requests]
    assert len(ids) == len(set(ids)) == 300
    assert server.max_in_flight <= 4


def test_rate_limit_spaces_sends(engine, receiver):
    server, base = receiver
    seed(engine, 10, webhook_url=f"{base}/ok")
    sweep(engine, config({"hook": WebhookChannel(type="webhook", rate_per_second=20)}), T0)
    at = sorted(r["at"] for r in server.requests)
    # 10 sends at 20/s span 9 intervals (0.45 s); the first connection's setup can swallow one of them,
    # so 8 intervals are required. Without the limit all ten arrive within milliseconds.
    assert len(at) == 10 and at[-1] - at[0] >= 8 / 20 * 0.9


# --------------------------------------------------------------------------- HTTP outcomes through the sweep


@pytest.mark.parametrize(("path", "status", "outcome"), [
    ("/limited", "retry_wait", "failed"), ("/error", "retry_wait", "unknown"), ("/bad", "escalated", "failed"),
    ("/hang", "retry_wait", "unknown"),
])
def test_http_outcomes_through_the_sweep(engine, receiver, path, status, outcome):
    server, base = receiver
    [a] = seed(engine, 1, webhook_url=base + path)
    # The receiver's Retry-After (7200 s) is within this cap (the default cap is the backoff cap, 1 h).
    out = sweep(engine, config({"hook": WebhookChannel(type="webhook", timeout_seconds=0.5)},
                               retry_after_cap_seconds=10800), T0)
    assert out.failed == 1
    with engine.connect() as conn:
        st, nxt = conn.execute(select(alerts.c.status, alerts.c.next_attempt_at).where(alerts.c.id == a)).one()
    assert st == status
    assert [o for _, o, _ in attempts_of(engine, a)] == [outcome]
    if path == "/limited":
        assert nxt >= T0 + timedelta(seconds=7200), "429 Retry-After is honoured end to end"
    if path in ("/error", "/hang"):
        # Retried with the same idempotency key.
        sweep(engine, config({"hook": WebhookChannel(type="webhook", timeout_seconds=0.5)}), T0 + timedelta(hours=2))
        keys = {r["headers"]["Idempotency-Key"] for r in server.requests}
        ids = {r["headers"]["webhook-id"] for r in server.requests}
        assert len(server.requests) == 2 and len(keys) == 1 and keys == ids


def test_standard_webhooks_signature_verifies_with_reference_package(engine, receiver, monkeypatch):
    from standardwebhooks.webhooks import Webhook

    server, base = receiver
    monkeypatch.setenv("DP_TEST_WH_SECRET", SECRET)
    seed(engine, 2, webhook_url=f"{base}/ok")
    out = sweep(engine, config({"hook": WebhookChannel(type="webhook", secret_env="DP_TEST_WH_SECRET")}), T0)
    assert out.delivered == 2
    for req in server.requests:
        headers = {k.lower(): v for k, v in req["headers"].items()}
        assert headers["webhook-signature"].startswith("v1,")
        assert headers["webhook-id"] == headers["idempotency-key"] == json.loads(req["body"])["data"]["id"]
        Webhook(SECRET).verify(req["body"].decode(), headers)  # raises WebhookVerificationError on mismatch
        # Bare base64 (without whsec_) is the same key.
        Webhook(SECRET.removeprefix("whsec_")).verify(req["body"].decode(), headers)
        with pytest.raises(Exception, match="signature"):
            Webhook("whsec_" + base64.b64encode(b"another key").decode()).verify(req["body"].decode(), headers)


def test_secret_that_is_not_base64_is_a_permanent_configuration_error(engine, receiver, monkeypatch):
    server, base = receiver
    monkeypatch.setenv("DP_TEST_WH_SECRET", "not base64!")
    seed(engine, 1, webhook_url=f"{base}/ok")
    out = sweep(engine, config({"hook": WebhookChannel(type="webhook", secret_env="DP_TEST_WH_SECRET")}), T0)
    assert out.escalated == 1 and server.requests == []
    assert "DP_TEST_WH_SECRET" in out.errors[0]


# --------------------------------------------------------------------------- one bad alert; untrusted text


def test_one_bad_alert_fails_alone(engine, tmp_path):
    good = seed(engine, 3, channel="box")
    [bad_zone] = seed(engine, 1, channel="box", tz="Mars/Olympus_Mons")
    [bad_address] = seed(engine, 1, channel="box", email="not-an-address")
    fake_bug = FakeChannel("box")
    out = sweep(engine, config({"box": MaildirChannel(type="maildir", path=str(tmp_path / "box"))}), T0)
    assert out.delivered == 3 and out.escalated == 2
    assert len(list(mailbox.Maildir(tmp_path / "box", create=False))) == 3
    with engine.connect() as conn:
        st = dict(conn.execute(select(alerts.c.id, alerts.c.status)).all())
    assert [st[i] for i in good] == ["delivered"] * 3
    assert st[bad_zone] == st[bad_address] == "escalated"
    # An unexpected exception (a bug) in one alert is a retryable failure of that alert only.
    ids = seed(engine, 2, channel="box2")
    fake_bug.errors = {}
    fake_bug.default_error = None
    with engine.connect() as conn:
        keys = conn.execute(select(alerts.c.dedup_key).where(alerts.c.id.in_(ids))
                            .order_by(alerts.c.id)).scalars().all()
    fake_bug.errors[keys[0]] = KeyError("payload")
    out = sweep(engine, config({"box2": MaildirChannel(type="maildir", path="/x")}), T0, channels={"box2": fake_bug})
    assert (out.delivered, out.failed, out.escalated) == (1, 1, 0)


C28_TITLES = ["Pay rent\n", "Pay rent =?UTF-8?Q?=0A?=Bcc: attacker@example.org", "Pay rent\nBcc: attacker@example.org",
              "Pay rent\r\nBcc: attacker@example.org\r\n\r\nbody"]


def test_c28_header_injection_and_html_escaping_through_the_sweep(engine, tmp_path):
    """Case C28: titles from a feed can never add a header; HTML in a note is escaped."""
    for t in C28_TITLES:
        seed(engine, 1, channel="box", title=t, note='<script>alert("x")</script> <b>b</b>')
    out = sweep(engine, config({"box": MaildirChannel(type="maildir", path=str(tmp_path / "box"))}), T0)
    assert out.delivered == len(C28_TITLES)
    box = mailbox.Maildir(tmp_path / "box", create=False)
    for key in box.iterkeys():
        msg = email.parser.BytesParser(policy=email.policy.default).parsebytes(box.get_bytes(key))
        assert msg["Bcc"] is None
        assert len(msg.get_all("Subject")) == 1 and "\n" not in str(msg["Subject"])
        assert msg["Subject"].startswith("Reminder: Pay rent")
        assert msg.get_content_type() == "multipart/alternative" and msg["MIME-Version"] == "1.0"
        html = msg.get_body(("html",)).get_content()
        assert "<script>" not in html and "&lt;script&gt;" in html and "<b>b</b>" not in html


# --------------------------------------------------------------------------- slack, throttled logging


def test_slack_channel_posts_escaped_text(receiver, monkeypatch):
    from deadline_pipeline_tests.test_channels import make_notification

    server, base = receiver
    monkeypatch.setenv("DP_TEST_SLACK_URL", f"{base}/ok")
    ch = SlackSender("chat", SlackChannel(type="slack", url_env="DP_TEST_SLACK_URL"), network=loopback_policy())
    assert ch.idempotency_class == "notification"
    assert ch.send(make_notification(title="<!channel> & <https://evil|click>")).provider_message_id == "HTTP 200"
    text = json.loads(server.requests[0]["body"])["text"]
    assert "<!channel>" not in text and "&lt;!channel&gt; &amp; &lt;https://evil|click&gt;" in text
    monkeypatch.delenv("DP_TEST_SLACK_URL")
    with pytest.raises(DeliveryError) as info:
        ch.send(make_notification())
    assert info.value.permanent and "DP_TEST_SLACK_URL" in str(info.value)
    monkeypatch.setenv("DP_TEST_SLACK_URL", f"{base}/limited")
    with pytest.raises(DeliveryError) as limited:
        ch.send(make_notification())
    assert limited.value.retry_after == 7200 and base not in str(limited.value), "the URL is a secret"
    ch.close()


def test_throttled_logger_logs_first_with_traceback_then_every_nth(caplog):
    logger = logging.getLogger("dp.test.throttle")
    t = ThrottledLogger(logger, every=5)
    with caplog.at_level(logging.ERROR, logger="dp.test.throttle"):
        for _ in range(12):
            try:
                raise ConnectionError("database down")
            except ConnectionError as exc:
                t.failure("db", "sweep failed", exc)
    lines = [r for r in caplog.records if r.name == "dp.test.throttle"]
    assert len(lines) == 3  # failures 1, 6, 11
    assert lines[0].exc_info is not None and lines[1].exc_info is None
    assert "failed 6 times" in lines[1].getMessage() and "failed 11 times" in lines[2].getMessage()
    with caplog.at_level(logging.WARNING, logger="dp.test.throttle"):
        t.success("db")
    assert "recovered after 12" in caplog.records[-1].getMessage() and t.count("db") == 0


def test_sweep_with_database_down_fails_loudly_without_flooding(tmp_path, caplog):
    from deadline_pipeline.deliver.sweep import SweepFailed
    from deadline_pipeline.store.db import make_engine

    dead = make_engine(f"sqlite:///{tmp_path / 'missing' / 'x.sqlite3'}")
    cfg = config({}, time_budget_seconds=3.5)
    with caplog.at_level(logging.ERROR, logger="deadline_pipeline.deliver.sweep"):
        with pytest.raises(SweepFailed, match="failed batch"):
            sweep(dead, cfg, T0)
    lines = [r for r in caplog.records if "delivery batch failed" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is not None, "the first failure with traceback, repeats counted"


def _refuse_attempt_rows(engine) -> None:
    """A database that refuses every new attempt row (as with a missing INSERT grant or a full disk)."""
    with engine.begin() as conn:
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql("CREATE TRIGGER refuse_attempts BEFORE INSERT ON delivery_attempts "
                                 "BEGIN SELECT RAISE(ABORT, 'permission denied for table delivery_attempts'); END")
        else:
            conn.exec_driver_sql("CREATE FUNCTION refuse_attempts() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                                 "RAISE EXCEPTION 'permission denied for table delivery_attempts'; END $$")
            conn.exec_driver_sql("CREATE TRIGGER refuse_attempts BEFORE INSERT ON delivery_attempts "
                                 "FOR EACH ROW EXECUTE FUNCTION refuse_attempts()")


def test_attempt_rows_refused_fail_the_sweep_instead_of_claiming_in_a_loop(engine):
    """Incident: with INSERT on delivery_attempts refused, the sweep released and reclaimed the same
    alerts 65,920 times in 50 s, sent nothing and ended "ok". Now each such batch is a failed batch:
    backed off, counted, and the sweep ends in SweepFailed naming the cause; nothing is charged."""
    from deadline_pipeline.deliver.sweep import SweepFailed

    ids = seed(engine, 6, channel="fake")
    _refuse_attempt_rows(engine)
    cfg = config({"fake": MaildirChannel(type="maildir", path="/nonexistent")}, time_budget_seconds=4,
                 batch_size=2)
    fake = FakeChannel()
    t = time.monotonic()
    with pytest.raises(SweepFailed, match="attempt rows could not be written") as failed:
        sweep(engine, cfg, T0, channels={"fake": fake})
    out = failed.value.outcome
    assert fake.sent == [], "no send without its attempt row"
    # Backoff between failed batches (1 s, 2 s, ...): a handful of claims in the 4 s budget, not
    # thousands; the sweep spends its budget waiting, then gives up.
    assert out.batch_failures >= 1 and out.batches <= 10, out
    assert time.monotonic() - t >= 3, "it backs off until the budget is spent"
    assert out.released == out.claimed and out.delivered == 0
    with engine.connect() as conn:
        rows = conn.execute(select(alerts.c.status, alerts.c.attempts, alerts.c.lease_owner)
                            .where(alerts.c.id.in_(ids))).all()
    assert rows == [("pending", 0, None)] * 6, "released, nothing charged"


def test_update_guard_late_writer_cannot_overwrite(engine):
    [a] = seed(engine, 1)
    with engine.begin() as conn:
        dsql.claim_batch(conn, owner="old#1#r", now=T0, lease_seconds=10, limit=5, lease_now=T0)
        dsql.claim_batch(conn, owner="new#2#r", now=T0 + timedelta(seconds=11), lease_seconds=10, limit=5,
                         lease_now=T0 + timedelta(seconds=11))
        att = dsql.start_attempts(conn, [(a, 1)], owner="old#1#r", now=T0)
        assert dsql.record_sent(conn, [(a, att[a], "x", T0)], owner="old#1#r", now=T0) == set()
        conn.execute(update(alerts).where(alerts.c.id == a).values(updated_at=T0))
        assert conn.execute(select(alerts.c.lease_owner).where(alerts.c.id == a)).scalar_one() == "new#2#r"
    assert [o for _, o, _ in attempts_of(engine, a)] == ["sent"], "the late writer records its attempt"


def test_one_slow_receiver_does_not_hold_back_the_following_batches(engine, receiver):
    """The sweep pipelines batches: while one send of the first batch waits on a slow receiver, the
    next batches are claimed, sent and recorded around it (with a barrier per batch, nothing after
    the first batch could start before that send ended). The slow alert is delivered too."""
    server, base = receiver
    server.delay = 4.0
    [slow] = seed(engine, 1, webhook_url=f"{base}/slow", send_at=T0 - timedelta(minutes=1))  # first claimed
    rest = seed(engine, 40, webhook_url=f"{base}/ok")
    hook = WebhookChannel(type="webhook", timeout_seconds=10, max_concurrency=4)
    out = sweep(engine, config({"hook": hook}, batch_size=5), T0)
    assert out.delivered == 41 and states(engine) == {"delivered": 41}
    slow_at = next(r["at"] for r in server.requests if r["path"] == "/slow")
    last_ok = max(r["at"] for r in server.requests if r["path"] == "/ok")
    assert last_ok - slow_at < server.delay, "the other batches went out while the slow send was pending"
    with engine.connect() as conn:
        # Every other alert was recorded in its own batch's transaction, each with one attempt row.
        assert conn.execute(select(func.count()).select_from(delivery_attempts)
                            .where(delivery_attempts.c.alert_id.in_(rest + [slow]),
                                   delivery_attempts.c.outcome == "sent")).scalar_one() == 41
