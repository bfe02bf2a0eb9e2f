"""The stages against the real store, on SQLite and on PostgreSQL: ingest, plan, deliver, reconcile."""

from __future__ import annotations

import mailbox
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select, update

from deadline_pipeline.config import SmtpChannel, load_config
from deadline_pipeline.deliver.sweep import sweep
from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.plan.service import plan_all
from deadline_pipeline.store import delivery as dsql
from deadline_pipeline.store.schema import (
    alerts,
    delivery_attempts,
    obligations,
    rule_versions,
    snapshots,
    sources,
)
from deadline_pipeline.watch.checks import alerts_reconciled
from deadline_pipeline_tests.factories import free_port, ics, write_config

T0 = datetime(2027, 1, 10, tzinfo=UTC)

EVENT_A = dict(uid="a@test", tzid="Europe/Berlin", dtstart="20270115T120000", summary="File report A")
EVENT_B = dict(uid="b@test", tzid="America/New_York", dtstart="20270201T090000", summary="File report B")


def _setup(tmp_path, events=(EVENT_A, EVENT_B)):
    src = tmp_path / "cal.ics"
    src.write_text(ics(*events), newline="")
    path = write_config(
        tmp_path,
        sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t1", "freshness": "P1D"}],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "Europe/Berlin"},
                     {"id": "bob", "tenant": "t1", "email": "bob@example.org", "timezone": "Asia/Tokyo"}],
        subscriptions=[{"name": "all", "sources": ["cal"], "offsets": ["-P7D", "-P1D", "PT0S"],
                        "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    )
    cfg, _ = load_config(path)
    return cfg, src


def _ingest(engine, cfg, now):
    for s in cfg.sources:
        fetch_snapshot(engine, s, now)
        apply_latest_snapshot(engine, s, now)


def _count(engine, table, *where):
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one()


def test_ingest_stores_snapshot_and_versions_once(engine, tmp_path):
    cfg, src = _setup(tmp_path)
    _ingest(engine, cfg, T0)
    assert _count(engine, snapshots) == 1
    assert _count(engine, rule_versions) == 2
    # Identical bytes: no new snapshot, no new version, but the source is fresh again.
    later = T0 + timedelta(hours=3)
    _ingest(engine, cfg, later)
    assert _count(engine, snapshots) == 1
    assert _count(engine, rule_versions) == 2
    with engine.connect() as conn:
        row = conn.execute(select(sources.c.last_fresh_at, sources.c.status)).one()
    assert row.last_fresh_at == later and row.status == "fresh"


def test_parse_failure_keeps_last_good_versions_and_marks_stale(engine, tmp_path):
    cfg, src = _setup(tmp_path)
    _ingest(engine, cfg, T0)
    src.write_bytes(b"<!DOCTYPE html><html><body>502 Bad Gateway</body></html>")
    _ingest(engine, cfg, T0 + timedelta(hours=1))
    assert _count(engine, snapshots) == 2, "the broken payload is stored for a human to read"
    assert _count(engine, rule_versions) == 2, "no version changed"
    with engine.connect() as conn:
        row = conn.execute(select(sources.c.status, sources.c.last_error, sources.c.last_fresh_at)).one()
    assert row.status == "stale"
    assert "cal" in row.last_error and "snapshot 2" in row.last_error
    assert row.last_fresh_at == T0
    # Planning still uses the last good rules.
    out = plan_all(engine, cfg, T0)
    assert out.obligations_planned == 4


def test_plan_is_idempotent_and_folds_late_reminders(engine, tmp_path):
    cfg, _ = _setup(tmp_path)
    _ingest(engine, cfg, T0)
    first = plan_all(engine, cfg, T0)
    # 2 rules x 2 subscribers; 3 offsets x 1 channel each.
    assert (first.obligations_planned, first.obligations_inserted) == (4, 4)
    assert first.alerts_planned == 12 and first.alerts_written == 12
    again = plan_all(engine, cfg, T0)
    assert (again.obligations_inserted, again.obligations_updated, again.alerts_written) == (0, 0, 0)
    # A's -P7D reminder (8 Jan) was already past on 10 Jan: it is the only late one, so it stays pending.
    assert _count(engine, alerts, alerts.c.status == "skipped") == 0
    later = plan_all(engine, cfg, datetime(2027, 1, 15, 10, tzinfo=UTC))
    assert later.alerts_written == 0
    # A moved deadline owes reminders for its new instant: new rows; the old instant's open ones are
    # superseded (kept as history, never deleted).
    moved = dict(EVENT_A, dtstart="20270116T120000")
    cfg2, src = _setup(tmp_path, (moved, EVENT_B))
    _ingest(engine, cfg2, T0 + timedelta(hours=1))
    out = plan_all(engine, cfg2, T0 + timedelta(hours=1))
    assert out.obligations_inserted == 0 and out.obligations_moved == 2
    assert out.alerts_written == 6 and _count(engine, alerts) == 18
    assert out.alerts_superseded == 6 and _count(engine, alerts, alerts.c.status == "superseded") == 6


def test_fold_marks_older_late_reminders_skipped(engine, tmp_path):
    cfg, _ = _setup(tmp_path)
    _ingest(engine, cfg, T0)
    # On 15 Jan 08:00 UTC both the -P7D and -P1D reminders of A (due 11:00 UTC) are past.
    plan_all(engine, cfg, datetime(2027, 1, 15, 8, tzinfo=UTC))
    with engine.connect() as conn:
        rows = conn.execute(select(alerts.c.offset_seconds, alerts.c.status, alerts.c.status_reason)
                            .join(obligations, obligations.c.id == alerts.c.obligation_id)
                            .where(obligations.c.rule_id == "a@test")).all()
    by_offset = {}
    for off, status, reason in rows:
        by_offset.setdefault(off, set()).add(status)
        if status == "skipped":
            assert "late at planning" in reason
    assert by_offset == {-7 * 86400: {"skipped"}, -86400: {"pending"}, 0: {"pending"}}


def test_sweep_delivers_once_and_reconciles(engine, tmp_path):
    cfg, _ = _setup(tmp_path)
    _ingest(engine, cfg, T0)
    plan_all(engine, cfg, T0)
    before = alerts_reconciled(engine, T0)
    assert not before.passed and before.count == 2, "the late reminders are overdue until sent"
    out = sweep(engine, cfg, T0)
    assert (out.claimed, out.delivered, out.failed) == (2, 2, 0)
    box = mailbox.Maildir(tmp_path / "maildir", create=False)
    assert sorted(m["To"] for m in box) == ["ann@example.org", "bob@example.org"]
    # Long subjects are folded (RFC 5322 §2.2.3); readers unfold them.
    assert all(" ".join(m["Subject"].split()).startswith("Reminder: File report A") for m in box)
    assert sweep(engine, cfg, T0).claimed == 0
    assert _count(engine, delivery_attempts, delivery_attempts.c.outcome == "sent") == 2
    assert alerts_reconciled(engine, T0).passed


def test_withdrawn_rule_cancels_pending_alerts(engine, tmp_path):
    cfg, _ = _setup(tmp_path)
    _ingest(engine, cfg, T0)
    plan_all(engine, cfg, T0)
    # B disappears from the source; 1 of 2 rules is 50% > 30%, so it would be quarantined: add a third
    # rule first so that one withdrawal is plausible.
    c = dict(uid="c@test", tzid="UTC", dtstart="20270301T000000", summary="C")
    d = dict(uid="d@test", tzid="UTC", dtstart="20270302T000000", summary="D")
    cfg, _ = _setup(tmp_path, (EVENT_A, EVENT_B, c, d))
    _ingest(engine, cfg, T0 + timedelta(minutes=1))
    plan_all(engine, cfg, T0 + timedelta(minutes=1))
    cfg, _ = _setup(tmp_path, (EVENT_A, c, d))
    _ingest(engine, cfg, T0 + timedelta(minutes=2))
    out = plan_all(engine, cfg, T0 + timedelta(minutes=2))
    assert out.obligations_withdrawn == 2 and out.alerts_cancelled == 6
    with engine.connect() as conn:
        withdrawn = conn.execute(select(rule_versions.c.version).where(rule_versions.c.rule_id == "b@test",
                                                                       rule_versions.c.withdrawn.is_(True))).all()
    assert withdrawn == [(2,)], "a withdrawal is a new version, never a delete"


def test_source_dropping_most_rules_is_quarantined(engine, tmp_path):
    cfg, _ = _setup(tmp_path)
    _ingest(engine, cfg, T0)
    cfg, _ = _setup(tmp_path, (EVENT_A,))
    fetch_snapshot(engine, cfg.sources[0], T0)
    out = apply_latest_snapshot(engine, cfg.sources[0], T0)
    assert out.status == "quarantined" and "withdraw 1 of 2" in out.error
    with engine.connect() as conn:
        assert conn.execute(select(sources.c.status)).scalar_one() == "suspect"
    assert _count(engine, rule_versions) == 2


def test_claim_is_null_safe_and_respects_leases(engine, tmp_path):
    cfg, _ = _setup(tmp_path)
    _ingest(engine, cfg, T0)
    plan_all(engine, cfg, T0)
    # Both nullable admission columns NULL on a due row: claimable (NULL-unsafe SQL would skip it).
    with engine.begin() as conn:
        row = conn.execute(select(alerts.c.lease_expires_at, alerts.c.next_attempt_at)
                           .where(alerts.c.send_at <= T0).limit(1)).one()
        assert row == (None, None)
        assert dsql.count_claimable(conn, T0) == 2
        # Lease instants given explicitly (lease_now): the rule under test is "only expiry frees a lease".
        first = dsql.claim_batch(conn, owner="a#1#r", now=T0, lease_seconds=300, limit=10, lease_now=T0)
    assert len(first) == 2
    with engine.begin() as conn:
        assert dsql.claim_batch(conn, owner="b#2#r", now=T0 + timedelta(seconds=299), lease_seconds=300,
                                limit=10, lease_now=T0 + timedelta(seconds=299)) == []
        taken = dsql.claim_batch(conn, owner="b#2#r", now=T0 + timedelta(seconds=301), lease_seconds=300, limit=10,
                                 lease_now=T0 + timedelta(seconds=301))
    assert taken == first, "only expiry frees a lease"
    with engine.begin() as conn:
        # The first owner comes back late: it may not overwrite the new owner's state.
        assert not dsql.mark_delivered(conn, first[0], owner="a#1#r", now=T0, provider_message_id="x")
        assert dsql.mark_delivered(conn, first[0], owner="b#2#r", now=T0, provider_message_id="y")


def test_failed_send_backs_off_then_escalates(engine, tmp_path):
    cfg, _ = _setup(tmp_path)
    _ingest(engine, cfg, T0)
    plan_all(engine, cfg, T0)
    # The mail server is down: a loopback port nobody listens on refuses the connection (retryable).
    smtp = SmtpChannel(type="smtp", host="127.0.0.1", port=free_port(), timeout_seconds=2)
    cfg = cfg.model_copy(update={"channels": {"mail": smtp},
                                 "delivery": cfg.delivery.model_copy(update={"max_attempts": 2})})
    out = sweep(engine, cfg, T0)
    assert (out.failed, out.escalated) == (2, 0)
    with engine.connect() as conn:
        nxt = conn.execute(select(alerts.c.next_attempt_at).where(alerts.c.status == "retry_wait")).scalars().all()
    assert len(nxt) == 2 and all(n > T0 for n in nxt)
    assert sweep(engine, cfg, T0).claimed == 0, "backoff holds the retry"
    out = sweep(engine, cfg, T0 + timedelta(hours=2))
    assert out.escalated == 2
    assert _count(engine, delivery_attempts, delivery_attempts.c.outcome == "failed") == 4
    # Escalated alerts are handled-but-failed: the reconciliation check does not count them as lost.
    assert alerts_reconciled(engine, T0 + timedelta(hours=3)).passed
    with engine.begin() as conn:
        conn.execute(update(alerts).values(status="pending"))
    assert not alerts_reconciled(engine, T0 + timedelta(hours=3)).passed


def test_reminder_after_its_deadline_is_escalated_not_sent(engine, tmp_path):
    """Daemon down past a deadline: the reminders are not sent late with a misleading "due now";
    the miss is escalated (loud, counted by the checks) instead."""
    cfg, _ = _setup(tmp_path, (EVENT_A,))
    _ingest(engine, cfg, T0)
    plan_all(engine, cfg, T0)
    out = sweep(engine, cfg, datetime(2027, 1, 16, tzinfo=UTC))
    assert (out.delivered, out.escalated) == (0, 6)
    assert not (tmp_path / "maildir").exists() or not list(mailbox.Maildir(tmp_path / "maildir", create=False))
    with engine.connect() as conn:
        reasons = conn.execute(select(alerts.c.status_reason).where(alerts.c.status == "escalated")).scalars().all()
    assert len(reasons) == 6 and all(r.startswith("missed: the deadline") for r in reasons)
