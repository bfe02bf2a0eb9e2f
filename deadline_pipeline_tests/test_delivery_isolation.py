"""One bad item harms only itself, on the delivery side (SQLite and PostgreSQL, real loopback
receivers): a receiver's unstorable answer or absurd ``Retry-After`` stays with its own alert; a
sweep that meets its own expired claim again treats its unfinished attempts like a dead sender's;
leases are judged by the database clock, so a sweeper with a skewed clock takes no live lease;
only sends that started are charged; ``alerts retry`` gives a fresh attempt budget; the watchdog
reports unacknowledged escalations.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from deadline_pipeline.cli import main
from deadline_pipeline.config import DeadlinesConfig, MaildirChannel, WebhookChannel
from deadline_pipeline.deliver.channels.base import IDEMPOTENCY_BOOKING
from deadline_pipeline.deliver.notification import DeliveryError, SendResult
from deadline_pipeline.deliver.sweep import sweep
from deadline_pipeline.store import delivery as dsql
from deadline_pipeline.store.schema import alerts, delivery_attempts
from deadline_pipeline.watch.watchdog import evaluate
from deadline_pipeline_tests.factories import LOOPBACK_NETWORK
from deadline_pipeline_tests.test_delivery_sweep import T0, FakeChannel, expire_leases, seed, states

# --------------------------------------------------------------------------- a receiver per path


class Answers(BaseHTTPRequestHandler):
    """Answers each POST by path: ``/ok`` 200 ``{"id": "evt-<n>"}``; ``/nul`` 200 with a NUL in the
    id (``{"id":"evt\\u0000x"}``, which PostgreSQL refuses in text); ``/huge`` 429 with
    ``Retry-After: 300000000000``; ``/y9999`` 429 with an HTTP date in year 9999. Counts every
    request's ``Idempotency-Key``."""

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        srv = self.server
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with srv.lock:
            srv.keys.append(self.headers["Idempotency-Key"])
        status, headers, body = {
            "/ok": (200, {}, json.dumps({"id": f"evt-{len(srv.keys)}"}).encode()),
            "/nul": (200, {}, b'{"id":"evt\\u0000x"}'),
            "/huge": (429, {"Retry-After": "300000000000"}, b"slow down"),
            "/y9999": (429, {"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, b"slow down"),
        }[self.path]
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def answers():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    server.daemon_threads = True
    server.keys, server.lock = [], threading.Lock()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def hook_config(**delivery) -> DeadlinesConfig:
    # A generous timeout and few connections: the shared test machine must not turn a slow loopback
    # answer into an "unknown" outcome (and a legitimate resend) in tests that count sends.
    return DeadlinesConfig(channels={"hook": WebhookChannel(type="webhook", timeout_seconds=20, max_concurrency=8)},
                           delivery={"batch_size": 100, **delivery}, network=LOOPBACK_NETWORK)


# --------------------------------------------------------------------------- 1. results per alert


def test_a_nul_in_one_receivers_id_harms_no_other_alert(engine, answers):
    """One subscriber among 50 answers ``200 {"id":"evt\\u0000x"}``: the other 49 are delivered
    exactly once, nobody is escalated, and the odd id is stored sanitised."""
    server, base = answers
    innocent = [a for _ in range(49) for a in seed(engine, 1, webhook_url=f"{base}/ok")]
    [poisoned] = seed(engine, 1, webhook_url=f"{base}/nul")
    out = sweep(engine, hook_config(), T0)
    # Later sweeps, after any lease could have expired, find nothing left to send.
    expire_leases(engine)
    again = sweep(engine, hook_config(), T0 + timedelta(minutes=10))
    assert (out.delivered, out.escalated, out.batch_failures) == (50, 0, 0)
    assert again.claimed == 0
    counts = Counter(server.keys)
    assert len(counts) == 50 and set(counts.values()) == {1}, "every alert sent exactly once"
    assert states(engine) == {"delivered": 50}
    with engine.connect() as conn:
        pid = conn.execute(select(alerts.c.provider_message_id).where(alerts.c.id == poisoned)).scalar_one()
        assert pid == "evt\\x00x", "the NUL is stored escaped, the rest of the id kept"
        assert len(innocent) == 49


def test_a_result_that_cannot_be_stored_is_recorded_alone(pg_url, answers, monkeypatch):
    """If an unstorable value slips past the sanitiser, the batch's transaction fails on PostgreSQL;
    each alert is then recorded alone and the bad one as its own problem (delivered, the id dropped)."""
    from deadline_pipeline.store.db import make_engine, upgrade

    engine = make_engine(pg_url)
    upgrade(engine)
    server, base = answers
    for _ in range(9):
        seed(engine, 1, webhook_url=f"{base}/ok")
    [poisoned] = seed(engine, 1, webhook_url=f"{base}/nul")
    monkeypatch.setattr(dsql, "clean_text", lambda value, limit=4000: value)  # the sanitiser misses it
    out = sweep(engine, hook_config(), T0)
    assert (out.delivered, out.escalated, out.results_unstorable) == (10, 0, 1)
    assert states(engine) == {"delivered": 10} and len(server.keys) == 10
    with engine.connect() as conn:
        pid = conn.execute(select(alerts.c.provider_message_id).where(alerts.c.id == poisoned)).scalar_one()
    assert pid.startswith("unstorable provider id: the result could not be stored")
    engine.dispose()


@pytest.mark.parametrize("path", ["/huge", "/y9999"])
def test_absurd_retry_after_is_capped(engine, answers, path):
    """``Retry-After: 300000000000`` overflowed the date and failed the batch; a date in 9999 parked
    the alert until then. Both are capped at ``delivery.retry_after_cap_seconds`` (default the
    backoff cap), and the innocent alerts of the batch are delivered."""
    server, base = answers
    [bad] = seed(engine, 1, webhook_url=base + path)
    ok = [a for _ in range(5) for a in seed(engine, 1, webhook_url=f"{base}/ok")]
    out = sweep(engine, hook_config(), T0)
    assert (out.delivered, out.failed, out.retry_after_capped, out.batch_failures) == (5, 1, 1, 0)
    with engine.connect() as conn:
        st, nxt = conn.execute(select(alerts.c.status, alerts.c.next_attempt_at).where(alerts.c.id == bad)).one()
    assert st == "retry_wait" and T0 < nxt <= T0 + timedelta(seconds=3600)
    assert len(ok) == 5


def test_a_wait_past_the_deadline_is_escalated_as_a_miss_at_once(engine, answers):
    server, base = answers
    [a] = seed(engine, 1, webhook_url=f"{base}/y9999")  # due one day after T0
    out = sweep(engine, hook_config(retry_after_cap_seconds=7 * 86400), T0)
    assert out.escalated == 1
    with engine.connect() as conn:
        st, reason = conn.execute(select(alerts.c.status, alerts.c.status_reason).where(alerts.c.id == a)).one()
    assert st == "escalated" and reason.startswith("missed: the next attempt could come only at")


# --------------------------------------------------------------------------- 4. own unfinished attempts


class Killed(BaseException):
    """The sweep process dies mid-batch (raised from inside a send, after the send happened)."""


class CrashingBooking(FakeChannel):
    def __init__(self) -> None:
        super().__init__("book", IDEMPOTENCY_BOOKING)
        self.crash = True

    def send(self, n):
        self.sent.append(n.dedup_key)
        if self.crash:
            raise Killed()
        return SendResult(provider_message_id="booked")


def test_a_sweep_meeting_its_own_unfinished_booking_escalates_and_closes_the_attempt(engine):
    """The same lease owner (a retried run keeps its run id) meets its own expired claim: the booking
    whose send started is escalated, never sent twice, and its attempt row is closed."""
    [booking] = seed(engine, 1, channel="book")
    [note] = seed(engine, 1, channel="note")
    book, notify = CrashingBooking(), FakeChannel("note")
    cfg = DeadlinesConfig(channels={"book": MaildirChannel(type="maildir", path="/x"),
                                    "note": MaildirChannel(type="maildir", path="/x")})
    with pytest.raises(Killed):
        sweep(engine, cfg, T0, owner="host#1#run-7", channels={"book": book, "note": notify})
    expire_leases(engine)
    book.crash = False
    out = sweep(engine, cfg, T0, owner="host#1#run-7", channels={"book": book, "note": notify})
    assert len(book.sent) == 1, "the booking is never repeated blindly"
    assert out.escalated == 1 and out.recovered_unknown >= 1
    with engine.connect() as conn:
        st = dict(conn.execute(select(alerts.c.id, alerts.c.status)).all())
        open_rows = conn.execute(select(delivery_attempts.c.id).where(delivery_attempts.c.finished_at.is_(None))).all()
        outcome = conn.execute(select(delivery_attempts.c.outcome)
                               .where(delivery_attempts.c.alert_id == booking)).scalars().all()
    assert st == {booking: "escalated", note: "delivered"}
    assert open_rows == [] and outcome == ["unknown"], "the attempt row is closed, not left open forever"


def test_only_started_sends_are_charged_after_a_crash(engine):
    """A batch of 5 killed during its first send (one send at a time): only the sends that had
    started (or were starting at that instant, which cannot be told apart: charged, the safe side)
    are charged an unknown attempt, never the whole batch."""
    ids = seed(engine, 5, channel="book")
    book = CrashingBooking()
    cfg = DeadlinesConfig(channels={"book": MaildirChannel(type="maildir", path="/x", max_concurrency=1)})
    with pytest.raises(Killed):
        sweep(engine, cfg, T0, channels={"book": book})
    with engine.connect() as conn:
        started = conn.execute(select(delivery_attempts.c.alert_id)).scalars().all()
    assert 1 <= len(started) <= 2 and len(book.sent) == 1
    expire_leases(engine)
    book.crash = False
    out = sweep(engine, cfg, T0, channels={"book": book})
    k = len(started)
    assert (out.recovered_unknown, out.escalated, out.delivered) == (k, k, 5 - k)
    with engine.connect() as conn:
        attempts = dict(conn.execute(select(alerts.c.id, alerts.c.attempts)).all())
    assert [attempts[i] for i in ids] == [1] * 5, "each charged once: sent, or started with no outcome"


# --------------------------------------------------------------------------- 6. the database clock


def test_a_sweeper_with_a_clock_25_s_ahead_takes_no_live_lease(engine):
    """Lease 20 s; sweeper B holds a batch; sweeper A's clock runs 25 s ahead. By A's own clock B's
    lease has expired, and A used to take it and send everything a second time."""
    ids = seed(engine, 10, channel="fake", send_at=datetime.now(UTC) - timedelta(minutes=1))
    cfg = DeadlinesConfig(channels={"fake": MaildirChannel(type="maildir", path="/x")},
                          delivery={"lease_seconds": 20, "time_budget_seconds": 10})
    with engine.begin() as conn:
        assert dsql.claim_batch(conn, owner="b#2#r", now=datetime.now(UTC), lease_seconds=20, limit=100) == ids
    ahead = lambda: datetime.now(UTC) + timedelta(seconds=25)  # noqa: E731
    fake = FakeChannel()
    out = sweep(engine, cfg, ahead(), clock=ahead, channels={"fake": fake})
    assert out.claimed == 0 and fake.sent == []
    # A replayed instant (--as-of) still decides what is due: far in the future, everything unclaimed is.
    [later] = seed(engine, 1, channel="fake", send_at=T0)
    out = sweep(engine, cfg, T0, channels={"fake": fake})
    assert out.delivered == 1 and states(engine)["claimed"] == 10 and later


def test_a_host_clock_hours_behind_the_store_turns_clock_agrees_red_where_the_other_checks_stay_green(pg_url):
    """PostgreSQL, whose clock is the store's. A reminder is 2 h overdue by the real clock, but this
    host's clock runs 3 h behind: by it the reminder is not due yet, so the sweep holds it back and
    alerts_reconciled and sweep_alive, judging by the same clock, stay green - a silent miss for as
    long as the clock is wrong. clock_agrees (a Dagster check and a watchdog row) is red naming the
    offset, and green with the right clock."""
    from deadline_pipeline.store import health
    from deadline_pipeline.store.db import db_clock, make_engine, upgrade
    from deadline_pipeline.watch import checks as w

    engine = make_engine(pg_url)
    upgrade(engine)
    try:
        with engine.connect() as conn:
            real = db_clock(conn)
        behind = real - timedelta(hours=3)
        # The watchdog row, on the store before seeding (the seeded rule rows are not full rules).
        row = {r.check: r for r in evaluate(engine, behind, host_now=behind).rows}["clock_agrees"]
        assert not row.ok and "behind" in row.detail, row.detail
        assert {r.check: r for r in evaluate(engine, behind).rows}["clock_agrees"].ok
        [a] = seed(engine, 1, channel="fake", send_at=real - timedelta(hours=2))
        cfg = DeadlinesConfig(channels={"fake": MaildirChannel(type="maildir", path="/x")})
        fake = FakeChannel()
        assert sweep(engine, cfg, behind, channels={"fake": fake}).claimed == 0 and fake.sent == []
        with engine.begin() as conn:  # what the sensor writes when it finds nothing claimable
            health.beat(conn, "deliver:idle", started_at=behind, completed_at=behind, outcome="idle")
        assert w.alerts_reconciled(engine, behind).passed and w.sweep_alive(engine, behind).passed
        assert states(engine) == {"pending": 1} and a

        out = w.clock_agrees(engine, behind)
        assert not out.passed and "3 h 0 min behind" in out.summary and "behind" in out.summary, out.summary
        assert -3 * 3600 - 60 < out.metadata["offset_seconds"] < -3 * 3600 + 60
        ahead = w.clock_agrees(engine, datetime.now(UTC) + timedelta(hours=5))
        assert not ahead.passed and "ahead of" in ahead.summary, ahead.summary
        assert w.clock_agrees(engine, datetime.now(UTC)).passed
    finally:
        engine.dispose()


def _deliver_on_host(pg_url, tmp_path, *, behind: timedelta = timedelta(0), as_of: datetime | None = None):
    """``deliver_job`` in process on the PostgreSQL store (nothing to send), its process deciding by
    a clock ``behind`` the real one (a host whose clock is wrong, not a replay: ``frozen`` is false),
    or replaying ``as_of`` (``--as-of``). Returns the ``deliver`` heartbeat row."""
    import dagster as dg
    import yaml

    from deadline_pipeline.orchestration.deliver import deliver_job
    from deadline_pipeline.orchestration.resources import ClockResource, SettingsResource, StoreResource
    from deadline_pipeline.store import health
    from deadline_pipeline.store.db import make_engine

    class HostClock(ClockResource):
        """The real clock of a host that runs ``behind_seconds`` behind."""

        behind_seconds: float = 0.0

        def now(self) -> datetime:
            return super().now() - timedelta(seconds=0 if self.as_of else self.behind_seconds)

    path = tmp_path / "deadlines.yaml"
    path.write_text(yaml.safe_dump({
        "sources": [{"name": "cal", "format": "ics", "location": "cal.ics"}],
        "subscribers": [{"id": "s1", "email": "s1@example.org"}],
        "subscriptions": [{"name": "all", "sources": ["cal"], "channels": ["box"]}],
        "channels": {"box": {"type": "maildir", "path": str(tmp_path / "mail")}},
    }))
    clock = HostClock(as_of=as_of.isoformat() if as_of else None, behind_seconds=behind.total_seconds())
    result = deliver_job.execute_in_process(
        instance=dg.DagsterInstance.ephemeral(), raise_on_error=False,
        resources={"store": StoreResource(db_url=pg_url), "settings": SettingsResource(config_path=str(path)),
                   "clock": clock})
    assert result.success
    engine = make_engine(pg_url)
    try:
        with engine.connect() as conn:
            return health.read_heartbeats(conn)["deliver"]
    finally:
        engine.dispose()


def test_a_sweeper_on_another_host_three_hours_behind_turns_clock_agrees_red_naming_deliver(pg_url, tmp_path):
    """PostgreSQL. The sweep runs on a host whose clock is 3 h behind (every reminder is "not due
    yet" there), and clock_agrees runs on a host whose clock is right: it compared only its own
    clock and was green, a silent miss. The sweep's heartbeat now records its host's offset against
    the store's clock as it is written, and clock_agrees (the check and the watchdog row) is red
    naming 'deliver', the offset and the direction - though the heartbeat's own stamps are 3 h old,
    older than the check's window by them."""
    from deadline_pipeline.store.db import make_engine, upgrade
    from deadline_pipeline.watch import checks as w

    engine = make_engine(pg_url)
    upgrade(engine)
    try:
        beat = _deliver_on_host(pg_url, tmp_path, behind=timedelta(hours=3))
        out = w.clock_agrees(engine, datetime.now(UTC))
        assert not out.passed, out.summary
        assert "deliver's host clock is 3 h 0 min behind the store's" in out.summary, out.summary
        assert "held back" in out.summary and "this host's clock" not in out.summary, out.summary
        [offender] = out.offenders
        assert offender["component"] == "deliver" and -3 * 3600 - 60 < offender["offset_seconds"] < -3 * 3600 + 60
        row = {r.check: r for r in evaluate(engine, datetime.now(UTC)).rows}["clock_agrees"]
        assert not row.ok and "deliver's host clock is 3 h 0 min behind" in row.detail, row.detail
        assert beat["clock"] == "live" and 3 * 3600 - 60 < beat["clock_offset_seconds"] < 3 * 3600 + 60, beat
        # Written before the window (by the store's clock): a host that stopped writing is not judged.
        assert w.clock_agrees(engine, datetime.now(UTC), window=timedelta(0)).passed
    finally:
        engine.dispose()


def test_a_replayed_sweep_heartbeat_never_counts_and_a_sweep_on_the_right_clock_is_green(pg_url, tmp_path):
    """PostgreSQL. A replay (``--as-of`` 3 h back) writes a heartbeat stamped 3 h before the store's
    clock: its instant is made up, so it records no offset and clock_agrees stays green (measured
    against the replayed instant it would read as a host 3 h behind). A sweep on a right clock
    records an offset within a second or so, and clock_agrees is green with it measured."""
    from deadline_pipeline.store.db import make_engine, upgrade
    from deadline_pipeline.watch import checks as w

    engine = make_engine(pg_url)
    upgrade(engine)
    try:
        replayed = _deliver_on_host(pg_url, tmp_path, as_of=datetime.now(UTC) - timedelta(hours=3))
        assert replayed["clock"] == "replay" and replayed["clock_offset_seconds"] is None, replayed
        out = w.clock_agrees(engine, datetime.now(UTC))
        assert out.passed and out.metadata["heartbeats_measured"] == 0, out.summary

        live = _deliver_on_host(pg_url, tmp_path)
        assert live["clock"] == "live" and abs(live["clock_offset_seconds"]) < 5, live
        out = w.clock_agrees(engine, datetime.now(UTC))
        assert out.passed and out.metadata["heartbeats_measured"] == 1, out.summary
        assert {r.check: r for r in evaluate(engine, datetime.now(UTC)).rows}["clock_agrees"].ok
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- 7. retry, watchdog


def test_retry_gives_an_exhausted_alert_a_fresh_budget_and_the_watchdog_reports_escalations(engine, db_url):
    [a] = seed(engine, 1, channel="fake")
    fake = FakeChannel()
    fake.default_error = DeliveryError("busy", permanent=False)
    cfg = DeadlinesConfig(channels={"fake": MaildirChannel(type="maildir", path="/x")},
                          delivery={"max_attempts": 2})
    sweep(engine, cfg, T0, channels={"fake": fake})
    sweep(engine, cfg, T0 + timedelta(hours=2), channels={"fake": fake})
    assert states(engine) == {"escalated": 1}
    row = {r.check: r for r in evaluate(engine, T0 + timedelta(hours=3)).rows}["escalations_acknowledged"]
    assert not row.ok and f"alert {a}" in row.detail
    res = CliRunner().invoke(main, ["alerts", "retry", str(a), "--by", "alice", "--db-url", db_url,
                                    "--as-of", "2027-03-01T12:00:00Z"])
    assert res.exit_code == 0, res.output
    with engine.connect() as conn:
        got = conn.execute(select(alerts.c.status, alerts.c.attempts, alerts.c.retried_by, alerts.c.retried_at,
                                  alerts.c.status_reason).where(alerts.c.id == a)).one()
    assert got[:4] == ("pending", 0, "alice", datetime(2027, 3, 1, 12, tzinfo=UTC))
    assert "after 2 attempt(s)" in got[4]
    fake.default_error = None
    out = sweep(engine, cfg, datetime(2027, 3, 1, 12, 1, tzinfo=UTC), channels={"fake": fake})
    assert out.delivered == 1 and out.escalated == 0, "not escalated again at once"
    assert {r.check: r for r in evaluate(engine, T0 + timedelta(hours=4)).rows}["escalations_acknowledged"].ok
