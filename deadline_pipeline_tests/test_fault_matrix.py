"""Issue 7's fault matrix on PostgreSQL: inject each fault, advance the clock, and assert that the
named detector turns red within its bound and green after repair, with nothing lost. Plus a clean
simulated day with thousands of alerts and no red check at all.

The stages run through their services (ingest, plan_all, sweep) with heartbeats recorded the way
the Dagster wiring does; the sources are served by a real loopback HTTP server, mail by a real
aiosmtpd server. "Now" is a parameter everywhere, so time advances without waiting.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiosmtpd.controller import Controller
from click.testing import CliRunner
from sqlalchemy import func, select, update

from deadline_pipeline.cli import main
from deadline_pipeline.config import load_config
from deadline_pipeline.ingest import service as ingest_service
from deadline_pipeline.store import delivery as dsql
from deadline_pipeline.store.db import make_engine, upgrade
from deadline_pipeline.store.schema import alerts, delivery_attempts, obligations, rule_versions
from deadline_pipeline.watch import checks as w
from deadline_pipeline.watch.reconcile import reminders_owed
from deadline_pipeline.watch.sources import rules_complete, source_fresh, source_not_quarantined
from deadline_pipeline.watch.watchdog import evaluate
from deadline_pipeline_tests.factories import LOOPBACK_NETWORK, ics, write_config
from deadline_pipeline_tests.test_delivery_sweep import expire_leases
from deadline_pipeline_tests.test_watch_checks import all_checks, cycle, deliver, ingest, plan

T0 = datetime(2027, 1, 10, tzinfo=UTC)
RULES = [dict(uid=f"r{i}@test", tzid="Europe/Berlin", dtstart=f"2027011{i}T120000", summary=f"Report {i}")
         for i in range(2, 6)]
MONTHLY = dict(uid="monthly@test", tzid="UTC", dtstart="20270201T090000", summary="Monthly filing",
               rrule="FREQ=MONTHLY")


class Feed:
    """A loopback HTTP source whose answer the test switches: ``ok`` (the ICS body), ``500``, ``html``."""

    def __init__(self, body: str):
        self.body, self.mode = body, "ok"
        feed = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if feed.mode == "500":
                    payload, status, ctype = b"internal error", 500, "text/plain"
                elif feed.mode == "html":
                    payload, status, ctype = b"<!DOCTYPE html><html><body>Maintenance</body></html>", 200, "text/html"
                else:
                    payload, status, ctype = feed.body.encode(), 200, "text/calendar"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/cal.ics"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine(pg_url):
    eng = make_engine(pg_url)
    upgrade(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def feed():
    f = Feed(ics(*RULES, MONTHLY))
    yield f
    f.close()


@pytest.fixture
def smtp(smtp_server):
    return smtp_server


def _config(tmp_path, feed: Feed, channel: dict | None = None, subscribers: int = 2,
            offsets=("-P2D", "-P1D"), **extra):
    # Offsets ahead of the deadline: the simulated sweeps run hours apart, and a reminder whose deadline
    # has passed when it is swept is escalated as a miss instead of being sent.
    path = write_config(
        tmp_path,
        sources=[{"name": "cal", "format": "ics", "location": feed.url, "tenant": "t1", "freshness": "P1D"}],
        subscribers=[{"id": f"s{i}", "tenant": "t1", "email": f"s{i}@example.org", "timezone": "UTC"}
                     for i in range(subscribers)],
        subscriptions=[{"name": "all", "sources": ["cal"], "offsets": list(offsets), "channels": ["mail"]}],
        channels={"mail": channel or {"type": "maildir", "path": str(tmp_path / "maildir")}},
        **{"network": LOOPBACK_NETWORK, **extra},
    )
    return load_config(path)[0], path


def _red(engine, cfg, now) -> set[str]:
    reds = {n for n, o in all_checks(engine, cfg, now).items() if not o.passed}
    if not reminders_owed(engine, cfg, now, timedelta(minutes=cfg.watch.grace_minutes)).passed:
        reds.add("reminders_owed")
    reds |= {f"{c.name}:{c.source}" for c in (source_fresh(engine, "cal", now, timedelta(days=1)),
                                             source_not_quarantined(engine, "cal"), rules_complete(engine, "cal"))
             if not c.passed}
    return reds


def _count(engine, table, *where):
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one()


def test_source_500_for_three_days(engine, tmp_path, feed):
    cfg, _ = _config(tmp_path, feed)
    cycle(engine, cfg, T0)
    versions, planned = _count(engine, rule_versions), _count(engine, obligations)
    feed.mode = "500"
    for hours in range(6, 73, 6):
        now = T0 + timedelta(hours=hours)
        cycle(engine, cfg, now)
        fresh = source_fresh(engine, "cal", now, timedelta(days=1))
        # Red from the first failed fetch (the source is stale) and certainly past its window.
        assert not fresh.passed and "500" in fresh.summary, fresh.summary
        if hours > 24:
            assert "longer than its window" in fresh.summary
            assert not {r.check for r in evaluate(engine, now, cfg).failing}.isdisjoint({"source_fresh"})
    assert _count(engine, rule_versions) == versions, "a failed fetch changes no rule"
    assert _count(engine, obligations, obligations.c.status == "active") >= planned - 4, "nothing withdrawn"
    assert _count(engine, obligations, obligations.c.status == "withdrawn") == 0
    feed.mode = "ok"
    now = T0 + timedelta(hours=73)
    cycle(engine, cfg, now)
    assert _red(engine, cfg, now) == set()


def test_html_error_page_with_200(engine, tmp_path, feed):
    cfg, _ = _config(tmp_path, feed)
    cycle(engine, cfg, T0)
    feed.mode = "html"
    now = T0 + timedelta(hours=1)
    cycle(engine, cfg, now)
    fresh = source_fresh(engine, "cal", now, timedelta(days=1))
    assert not fresh.passed and "stale" in fresh.summary and "snapshot 2" in fresh.summary
    assert _red(engine, cfg, now) == {"source_fresh:cal"}
    feed.mode = "ok"
    cycle(engine, cfg, now + timedelta(hours=1))
    assert _red(engine, cfg, now + timedelta(hours=1)) == set()


def test_source_silently_drops_half_its_rules(engine, tmp_path, feed):
    cfg, _ = _config(tmp_path, feed)
    cycle(engine, cfg, T0)
    versions = _count(engine, rule_versions)
    full = feed.body
    feed.body = ics(*RULES[:2])
    now = T0 + timedelta(hours=1)
    cycle(engine, cfg, now)  # the next ingest
    assert _red(engine, cfg, now) == {"source_not_quarantined:cal"}
    assert _count(engine, rule_versions) == versions, "the quarantined snapshot applied nothing"
    assert _count(engine, obligations, obligations.c.status == "withdrawn") == 0
    feed.body = full
    cycle(engine, cfg, now + timedelta(hours=1))
    assert _red(engine, cfg, now + timedelta(hours=1)) == set()


def test_sweep_stopped(engine, tmp_path, feed, pg_url):
    cfg, path = _config(tmp_path, feed)
    cycle(engine, cfg, T0)
    assert _red(engine, cfg, T0 + timedelta(minutes=15)) == set()
    bound = T0 + timedelta(minutes=cfg.watch.sweep_interval_minutes + cfg.watch.heartbeat_grace_minutes, seconds=1)
    assert "sweep_alive" in _red(engine, cfg, bound)
    res = CliRunner().invoke(main, ["watchdog", "--config", str(path), "--db-url", pg_url,
                                    "--as-of", bound.isoformat()])
    assert res.exit_code == 1 and "sweep_alive" in res.output and "stopped" in res.output, res.output
    deliver(engine, cfg, bound)
    assert "sweep_alive" not in _red(engine, cfg, bound)
    ok = CliRunner().invoke(main, ["watchdog", "--config", str(path), "--db-url", pg_url,
                                   "--as-of", bound.isoformat()])
    assert ok.exit_code == 0, ok.output


def test_smtp_down_for_two_hours(engine, tmp_path, feed, smtp):
    controller, received = smtp
    cfg, _ = _config(tmp_path, feed, {"type": "smtp", "host": "127.0.0.1", "port": controller.port,
                                      "timeout_seconds": 2}, offsets=("-P1D", "PT0S"))
    cycle(engine, cfg, T0)
    controller.stop()
    start = datetime(2027, 1, 11, 10, 55, tzinfo=UTC)  # r2's -P1D reminder is due at 11:00Z
    now = start
    while now < start + timedelta(hours=2):  # the stages keep running every 5 minutes; mail is down
        now += timedelta(minutes=5)
        cycle(engine, cfg, now)
        # The backoff schedule (5 attempts, 30 s base) escalates well inside the grace window, so
        # reconciliation never sees an unhandled overdue alert.
        assert w.alerts_reconciled(engine, now).passed
        assert "sweep_alive" not in _red(engine, cfg, now)
    due = _count(engine, alerts, alerts.c.send_at <= now - timedelta(minutes=10), alerts.c.status != "skipped")
    escalated = _count(engine, alerts, alerts.c.status == "escalated")
    assert due > 0 and escalated == due, "every due alert was retried on the backoff schedule, then escalated"
    failed = _count(engine, delivery_attempts, delivery_attempts.c.outcome == "failed")
    assert failed == due * cfg.delivery.max_attempts
    assert _red(engine, cfg, now) == {"escalations_acknowledged"}
    # Green only because escalated: reopen them and reconciliation turns red.
    with engine.begin() as conn:
        conn.execute(update(alerts).where(alerts.c.status == "escalated").values(status="retry_wait"))
    assert not w.alerts_reconciled(engine, now).passed
    with engine.begin() as conn:
        conn.execute(update(alerts).where(alerts.c.status == "retry_wait").values(status="escalated"))
    # The server is back: the next reminders go out.
    back = Controller(received, hostname="127.0.0.1", port=controller.port)
    back.start()
    try:
        later = datetime(2027, 1, 12, 11, 1, tzinfo=UTC)
        cycle(engine, cfg, later)
        assert received.messages and w.alerts_reconciled(engine, later).passed
    finally:
        back.stop()


def test_alert_stuck_claimed_by_a_killed_process(engine, tmp_path, feed):
    cfg, _ = _config(tmp_path, feed)
    at = datetime(2027, 1, 11, 11, 0, tzinfo=UTC)  # r2's -P1D reminders are due
    ingest(engine, cfg, at)
    plan(engine, cfg, at)
    with engine.begin() as conn:  # a sweep claims, then its process is killed before sending
        stuck = dsql.claim_batch(conn, owner="host#999#killed", now=at, lease_seconds=cfg.delivery.lease_seconds,
                                 limit=100)
    assert stuck
    lease = timedelta(seconds=cfg.delivery.lease_seconds)
    assert deliver(engine, cfg, at + lease - timedelta(seconds=1)).claimed == 0, "the lease holds until expiry"
    after = at + lease + timedelta(seconds=1)
    # Leases run on the database clock, which the simulated day does not move: let this one expire.
    expire_leases(engine, stuck)
    out = deliver(engine, cfg, after)
    assert out.delivered == len(stuck)
    with engine.connect() as conn:
        states = set(conn.execute(select(alerts.c.status).where(alerts.c.id.in_(stuck))).scalars())
    assert states == {"delivered"}
    assert _count(engine, delivery_attempts, delivery_attempts.c.alert_id.in_(stuck),
                  delivery_attempts.c.outcome == "sent") == len(stuck)
    assert _red(engine, cfg, after + timedelta(minutes=1)) == set()


def test_alert_edited_to_delivered_without_receipt(engine, tmp_path, feed):
    cfg, _ = _config(tmp_path, feed)
    cycle(engine, cfg, T0)
    with engine.begin() as conn:
        victim = conn.execute(select(alerts.c.id).where(alerts.c.status == "pending")
                              .order_by(alerts.c.send_at).limit(1)).scalar_one()
        conn.execute(update(alerts).where(alerts.c.id == victim).values(status="delivered", delivered_at=T0))
    assert _red(engine, cfg, T0) == {"alerts_reconciled"}
    out = w.alerts_reconciled(engine, T0)
    assert out.offenders[0]["alert_id"] == victim
    # Repair: back to pending; the next sweep at its time sends it for real, with a receipt.
    with engine.begin() as conn:
        conn.execute(update(alerts).where(alerts.c.id == victim).values(status="pending", delivered_at=None))
        send_at = conn.execute(select(alerts.c.send_at).where(alerts.c.id == victim)).scalar_one()
    ingest(engine, cfg, send_at)
    plan(engine, cfg, send_at)
    deliver(engine, cfg, send_at)
    assert _red(engine, cfg, send_at) == set()


def test_moved_deadline_whose_new_reminders_were_never_planned(engine, tmp_path, feed):
    """The planner keyed reminders on (obligation, offset, channel): after a move, the reminder
    delivered for the old instant stood in for the one owed for the new instant. Injected as the
    state it left behind: the new instant's reminder rows are missing."""
    cfg, _ = _config(tmp_path, feed)
    cycle(engine, cfg, T0 + timedelta(hours=12))  # r2's -P2D reminder (10 Jan 11:00Z) goes out
    feed.body = ics(dict(RULES[0], dtstart="20270119T120000"), *RULES[1:], MONTHLY)  # r2 moves a week later
    moved_at = T0 + timedelta(hours=13)
    cycle(engine, cfg, moved_at)
    new_due = datetime(2027, 1, 19, 11, tzinfo=UTC)
    with engine.begin() as conn:
        conn.execute(alerts.delete().where(alerts.c.due_at == new_due, alerts.c.kind == "reminder"))
    # fanout_complete sees the missing rows at once (they are inside the horizon); the reconciliation,
    # which never reads the planned rows to decide what is owed, turns red one grace after the send
    # instant (17 Jan 11:00Z + 30 min).
    assert _red(engine, cfg, moved_at) == {"fanout_complete"}
    send_at = datetime(2027, 1, 17, 11, tzinfo=UTC)
    now = moved_at
    while now < send_at:  # the pipeline keeps running; every other reminder goes out on time
        now += timedelta(hours=12)
        cycle(engine, cfg, min(now, send_at + timedelta(minutes=29)))
    assert _red(engine, cfg, send_at + timedelta(minutes=29)) == {"fanout_complete"}
    detected = send_at + timedelta(minutes=31)
    cycle(engine, cfg, detected)
    assert _red(engine, cfg, detected) == {"fanout_complete", "reminders_owed"}
    out = reminders_owed(engine, cfg, detected)
    assert {o["due_at"] for o in out.offenders} == {new_due.isoformat()} and out.count == 2  # two subscribers
    # Repair: force the obligations to be re-planned; the late reminders go out; every check green.
    with engine.begin() as conn:
        conn.execute(update(obligations).where(obligations.c.due_at == new_due).values(fingerprint=None))
    cycle(engine, cfg, detected)
    assert _red(engine, cfg, detected) == set()


def test_record_that_stops_parsing_withdrawn_by_ingest(engine, tmp_path, feed, monkeypatch):
    """Ingest withdrew a rule whose record merely failed to parse (an RRULE typo)."""
    cfg, _ = _config(tmp_path, feed)
    cycle(engine, cfg, T0)
    good = feed.body
    feed.body = ics(*RULES, dict(MONTHLY, rrule="FREQ=MONTHLYY"))
    monkeypatch.setattr(ingest_service, "held_back", lambda withdrawn, problems, known=(): [])  # the fault
    broke_at = T0 + timedelta(hours=1)
    cycle(engine, cfg, broke_at)
    assert _count(engine, obligations, obligations.c.status == "withdrawn", obligations.c.rule_id == "monthly@test")
    # The skipped record is red at once; the reminders it cost one grace after their send instant
    # (the first: 1 Feb 09:00Z - 2 days).
    assert _red(engine, cfg, broke_at) == {"rules_complete:cal"}
    send_at = datetime(2027, 1, 30, 9, tzinfo=UTC)
    now = broke_at
    while now < send_at:
        now += timedelta(hours=12)
        cycle(engine, cfg, min(now, send_at + timedelta(minutes=29)))
    assert _red(engine, cfg, send_at + timedelta(minutes=29)) == {"rules_complete:cal"}
    detected = send_at + timedelta(minutes=31)
    cycle(engine, cfg, detected)
    assert _red(engine, cfg, detected) == {"rules_complete:cal", "reminders_owed"}
    assert "cancelled as withdrawn" in reminders_owed(engine, cfg, detected).offenders[0]["reason"]
    monkeypatch.undo()
    feed.body = good  # the source is fixed: the rule comes back, its reminders are revived and sent
    cycle(engine, cfg, detected)
    assert _red(engine, cfg, detected) == set()


def test_planner_stopped_for_a_month(engine, tmp_path, feed):
    cfg, _ = _config(tmp_path, feed, plan={"horizon_days": 20})
    cycle(engine, cfg, T0)
    interval = timedelta(minutes=cfg.watch.plan_interval_minutes)
    assert "horizon_planned" not in _red(engine, cfg, T0 + interval)
    assert "horizon_planned" in _red(engine, cfg, T0 + interval + timedelta(seconds=1))
    for day in range(36):
        now = T0 + timedelta(days=day, minutes=1)
        ingest(engine, cfg, now)
        deliver(engine, cfg, now)
        reds = _red(engine, cfg, now)
        if now - T0 > interval:
            assert "horizon_planned" in reds
    # A month without planning: the monthly rule's 1 March occurrence (inside the 20-day horizon
    # now) was never planned, and the check names the subscriptions with nothing ahead.
    out = w.horizon_planned(engine, cfg, now, interval, timedelta(days=20))
    assert {o.get("subscriber") for o in out.offenders} >= {"s0", "s1"}, out
    cycle(engine, cfg, now)
    assert _red(engine, cfg, now) == set()
    assert _count(engine, obligations, obligations.c.due_at >= now, obligations.c.status == "active") > 0


def test_clean_day_with_thousands_of_alerts(engine, tmp_path):
    """24 simulated hours, a sweep every 5 minutes, ingest and plan hourly, checks every 30 minutes:
    no check is ever red."""
    daily = [dict(uid=f"d{i}@test", tzid="UTC", dtstart=f"20270101T{i:02d}3000", summary=f"Daily {i}",
                  rrule="FREQ=DAILY") for i in range(0, 24, 2)]
    feed = Feed(ics(*daily))
    try:
        cfg, _ = _config(tmp_path, feed, subscribers=80, plan={"horizon_days": 3})
        cycle(engine, cfg, T0)
        total = _count(engine, alerts)
        assert total >= 5000
        now = T0
        for tick in range(1, 24 * 12 + 1):
            now = T0 + timedelta(minutes=5 * tick)
            if tick % 12 == 0:
                ingest(engine, cfg, now)
                plan(engine, cfg, now)
            deliver(engine, cfg, now)
            if tick % 6 == 0:
                reds = _red(engine, cfg, now)
                assert reds == set(), (now, reds)
        delivered = _count(engine, alerts, alerts.c.status == "delivered")
        assert delivered >= 1900
        assert _count(engine, delivery_attempts, delivery_attempts.c.outcome == "sent") == delivered
        assert evaluate(engine, now, cfg).healthy
    finally:
        feed.close()
