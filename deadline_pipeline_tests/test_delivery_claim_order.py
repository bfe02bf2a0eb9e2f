"""The delivery claim's pick: oldest first by ``(send_at, id)`` across every claimable state,
disjoint full batches for concurrent claimers, and on PostgreSQL a cost bounded by the batch, not
by the backlog of claimable alerts (the plan is read, not timed)."""

from __future__ import annotations

import json
import random
import threading
from datetime import timedelta

import pytest
from sqlalchemy import text, update

from deadline_pipeline.store import delivery as dsql
from deadline_pipeline.store.db import db_clock, make_engine, upgrade
from deadline_pipeline.store.schema import alerts
from deadline_pipeline_tests.test_delivery_sweep import T0, seed

# (status, lease held?, retry due?) of each kind of row the random store below mixes.
KINDS = ("pending", "retry_due", "retry_later", "claimed_expired", "claimed_live", "delivered")
CLAIMABLE_KINDS = ("pending", "retry_due", "claimed_expired")


def _mixed_store(engine, n: int, rnd: random.Random) -> list[int]:
    """``n`` alerts of random kinds (:data:`KINDS`) whose ``send_at`` takes one of four instants,
    assigned so that ids do not follow ``send_at``; returns the claimable ids in the order a claim
    must take them (``send_at``, then ``id``)."""
    ids = seed(engine, n)
    instants = [T0 - timedelta(minutes=m) for m in (0, 5, 30, 90)]
    expected = []
    with engine.begin() as conn:
        clock = db_clock(conn)
        for alert_id in ids:
            kind, send_at = rnd.choice(KINDS), rnd.choice(instants)
            values = {"send_at": send_at}
            if kind == "retry_due":
                values.update(status="retry_wait", next_attempt_at=T0 - timedelta(minutes=1), attempts=1)
            elif kind == "retry_later":
                values.update(status="retry_wait", next_attempt_at=T0 + timedelta(minutes=1), attempts=1)
            elif kind == "claimed_expired":
                values.update(status="claimed", lease_owner="dead#1#r", lease_expires_at=clock - timedelta(minutes=1))
            elif kind == "claimed_live":
                values.update(status="claimed", lease_owner="live#1#r", lease_expires_at=clock + timedelta(hours=1))
            elif kind == "delivered":
                values.update(status="delivered")
            conn.execute(update(alerts).where(alerts.c.id == alert_id).values(**values))
            if kind in CLAIMABLE_KINDS:
                expected.append((send_at, alert_id))
    return [alert_id for _, alert_id in sorted(expected)]


@pytest.mark.parametrize("rnd_seed", [1, 2, 3])
def test_claims_take_the_oldest_across_states_with_ties_broken_by_id(engine, rnd_seed):
    """Pending, due retries and expired leases mixed, four send_at instants shared by many rows
    (ties broken by id), ids not in send_at order: consecutive claims of 7 take exactly the next 7 in
    (send_at, id) order, never a retry not yet due or a row on a live lease."""
    expected = _mixed_store(engine, 90, random.Random(rnd_seed))
    assert len(expected) > 30
    got = []
    for i in range(0, len(expected) + 7, 7):
        with engine.begin() as conn:
            rows, _ = dsql.claim_and_load(conn, owner=f"me#{i}#r", now=T0, lease_seconds=300, limit=7)
        batch = [r["id"] for r in rows]
        assert batch == expected[i:i + 7], f"claim {i // 7}"
        got += batch
    assert got == expected


def test_claim_batch_takes_the_same_order(engine):
    """claim_batch (the claim without the load, one statement on every engine) picks as claim_and_load."""
    expected = _mixed_store(engine, 60, random.Random(7))
    got = []
    for i in range(0, len(expected) + 5, 5):
        with engine.begin() as conn:
            ids = dsql.claim_batch(conn, owner=f"me#{i}#r", now=T0, lease_seconds=300, limit=5)
        assert sorted(ids) == sorted(expected[i:i + 5])
        got += sorted(ids, key=expected.index)
    assert got == expected


def test_an_expired_lease_is_claimable_again_and_a_live_one_is_not(engine):
    ids = seed(engine, 3)
    with engine.begin() as conn:
        clock = db_clock(conn)
        conn.execute(update(alerts).where(alerts.c.id == ids[0]).values(
            status="claimed", lease_owner="dead#1#r", lease_expires_at=clock - timedelta(seconds=1)))
        conn.execute(update(alerts).where(alerts.c.id == ids[1]).values(
            status="claimed", lease_owner="live#1#r", lease_expires_at=clock + timedelta(hours=1)))
    with engine.begin() as conn:
        rows, _ = dsql.claim_and_load(conn, owner="me#1#r", now=T0, lease_seconds=300, limit=10)
    assert [r["id"] for r in rows] == [ids[0], ids[2]]


def _claim_in_open_transactions(engine, n_claimers: int, limit: int, claim: str, order: list[int]) -> list[list[int]]:
    """Each of ``n_claimers`` claims ``limit`` in a transaction of its own, all kept open (their row
    locks held) until every claim is made; the batches, each in ``order``."""
    conns = [engine.connect() for _ in range(n_claimers)]
    try:
        batches = []
        for i, conn in enumerate(conns):
            conn.begin()
            if claim == "claim_and_load":
                rows, _ = dsql.claim_and_load(conn, owner=f"w#{i}#r", now=T0, lease_seconds=300, limit=limit)
                batches.append([r["id"] for r in rows])
            else:
                ids = dsql.claim_batch(conn, owner=f"w#{i}#r", now=T0, lease_seconds=300, limit=limit)
                batches.append(sorted(ids, key=order.index))
        for conn in conns:
            conn.commit()
        return batches
    finally:
        for conn in conns:
            conn.close()


@pytest.mark.parametrize("claim", ["claim_and_load", "claim_batch"])
def test_claimers_holding_their_locks_take_the_next_oldest_pending_batches(pg_url, claim):
    """Pending rows only (the steady state): three claimers with their locks held get full,
    disjoint batches, each the next oldest after the others' - no row is locked and left."""
    engine = make_engine(pg_url)
    try:
        upgrade(engine)
        ids = seed(engine, 150)
        assert _claim_in_open_transactions(engine, 3, 40, claim, ids) == [ids[0:40], ids[40:80], ids[80:120]]
    finally:
        engine.dispose()


@pytest.mark.parametrize("claim", ["claim_and_load", "claim_batch"])
def test_claimers_holding_their_locks_take_the_next_oldest_batches_across_states(pg_url, claim):
    """Pending rows, due retries and expired leases mixed: three claimers with their locks held get
    full, disjoint batches, each the next oldest across the states after the others' - a claim locks
    only rows it claims, so none is passed over."""
    engine = make_engine(pg_url)
    try:
        upgrade(engine)
        expected = _mixed_store(engine, 400, random.Random(11))
        assert len(expected) >= 150
        batches = _claim_in_open_transactions(engine, 3, 40, claim, expected)
        assert batches == [expected[0:40], expected[40:80], expected[80:120]]
    finally:
        engine.dispose()


def test_concurrent_claimers_each_fill_their_batch(pg_url):
    """Four threads claim at the same instant: four full batches, disjoint, together the oldest."""
    engine = make_engine(pg_url)
    try:
        upgrade(engine)
        expected = _mixed_store(engine, 400, random.Random(5))
        got: dict[int, list[int]] = {}
        barrier = threading.Barrier(4)

        def claim(i: int) -> None:
            barrier.wait()
            with engine.begin() as conn:
                rows, _ = dsql.claim_and_load(conn, owner=f"w#{i}#r", now=T0, lease_seconds=300, limit=30)
                got[i] = [r["id"] for r in rows]

        threads = [threading.Thread(target=claim, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [len(b) for b in got.values()] == [30] * 4
        assert sorted(i for b in got.values() for i in b) == sorted(expected[:120])
    finally:
        engine.dispose()


def _scan_rows(plan: dict) -> int:
    """Rows the scans of ``alerts`` in an EXPLAIN ANALYZE (JSON) plan produced or filtered out."""
    n = 0
    if plan.get("Relation Name") == "alerts" and "Scan" in plan["Node Type"]:
        n += (plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)
              + plan.get("Rows Removed by Index Recheck", 0)) * plan["Actual Loops"]
    return n + sum(_scan_rows(p) for p in plan.get("Plans", []))


def _sort_input(plan: dict) -> int:
    """The most rows any Sort node of the plan took in."""
    own = 0
    if plan["Node Type"] == "Sort":  # its input: the child it sorts (not the CTEs hung on it)
        own = sum(p["Actual Rows"] * p["Actual Loops"] for p in plan.get("Plans", [])
                  if p.get("Parent Relationship") == "Outer")
    return max([own] + [_sort_input(p) for p in plan.get("Plans", [])])


def _nearly_empty_statistics(engine) -> int:
    """A migrated store of one alert whose statistics are taken now and kept (no autovacuum ANALYZE):
    the planner will believe the table nearly empty whatever is inserted next, as after a bulk insert
    or a backlog grown since the last ANALYZE. Returns that alert's id."""
    upgrade(engine)
    [first] = seed(engine, 1)
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE alerts")
        conn.exec_driver_sql("ALTER TABLE alerts SET (autovacuum_enabled = false)")
    return first


@pytest.mark.parametrize("claim", ["claim_and_load", "claim_batch"])
def test_a_claim_reads_about_a_batch_whatever_the_backlog(pg_url, claim):
    """50,000 claimable alerts (pending, due retries, expired leases) plus retries not yet due, and
    statistics from before they were inserted (the planner believes the table nearly empty, as after
    a bulk insert or a backlog grown since the last ANALYZE): the claim's scans of ``alerts`` read
    and sort about a batch, not the backlog. Read from the plan of the claim as it ran (auto_explain),
    not from a timing. Before: every claimable row read and sorted on every claim."""
    engine = make_engine(pg_url)
    try:
        first = _nearly_empty_statistics(engine)
        with engine.begin() as conn:
            clock = db_clock(conn)
            conn.execute(text(
                "INSERT INTO alerts (obligation_id, offset_seconds, channel, kind, dedup_key, send_at, status, "
                "attempts, next_attempt_at, lease_owner, lease_expires_at, created_at, updated_at) "
                "SELECT o.obligation_id, i, 'hook', 'reminder', md5(i::text), "
                "       :t0 - (i % 997) * interval '1 minute', "
                "       CASE WHEN i % 50 = 0 THEN 'retry_wait' WHEN i % 70 = 0 THEN 'claimed' ELSE 'pending' END, "
                "       0, CASE WHEN i % 100 = 0 THEN :t0 + interval '1 hour' WHEN i % 50 = 0 THEN :t0 END, "
                "       CASE WHEN i % 70 = 0 THEN 'dead#1#r' END, CASE WHEN i % 70 = 0 THEN :expired END, :t0, :t0 "
                "FROM generate_series(1, 50000) i, (SELECT obligation_id FROM alerts WHERE id = :first) o"),
                {"t0": T0, "expired": clock - timedelta(minutes=1), "first": first})
            assert dsql.count_claimable(conn, T0) > 49_000

        plans: list = []
        with engine.connect() as conn:
            _explained(conn, plans)
            with conn.begin():
                if claim == "claim_and_load":
                    rows, _ = dsql.claim_and_load(conn, owner="me#1#r", now=T0, lease_seconds=300, limit=100)
                else:
                    rows = dsql.claim_batch(conn, owner="me#1#r", now=T0, lease_seconds=300, limit=100)
                assert len(rows) == 100
        docs = [json.loads(p.split("plan:", 1)[1]) for p in plans if "SKIP LOCKED" in p]
        assert len(docs) == 1, plans
        plan = docs[0]["Plan"]
        assert _scan_rows(plan) < 2_000, _scan_rows(plan)
        assert _sort_input(plan) <= 100, _sort_input(plan)
        buffers = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
        assert buffers < 5_000, buffers
    finally:
        engine.dispose()


def test_a_claim_leaves_the_transactions_planner_settings_as_it_found_them(pg_url):
    """The claim plans without sorts and without jit; the caller's later statements in the same
    transaction are planned with the settings they had (here a session that turned jit off itself)."""
    engine = make_engine(pg_url)
    try:
        upgrade(engine)
        seed(engine, 3)
        with engine.begin() as conn:
            conn.exec_driver_sql("SET LOCAL jit = off")
            rows, _ = dsql.claim_and_load(conn, owner="me#1#r", now=T0, lease_seconds=300, limit=2)
            assert len(rows) == 2
            assert dsql.claim_batch(conn, owner="me#2#r", now=T0, lease_seconds=300, limit=2)
            assert conn.exec_driver_sql("SELECT current_setting('enable_sort'), current_setting('jit')").one() \
                == ("on", "off")
    finally:
        engine.dispose()


def _explained(conn, plans: list) -> None:
    """Log the plan of every statement ``conn`` runs from now on (auto_explain, JSON, with the rows
    each node really read) as a notice into ``plans``."""
    raw = conn.connection.driver_connection
    raw.add_notice_handler(lambda diag: plans.append(diag.message_primary))
    for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                    "SET auto_explain.log_analyze = on", "SET auto_explain.log_buffers = on",
                    "SET auto_explain.log_timing = off", "SET auto_explain.log_format = json",
                    "SET auto_explain.log_level = notice"):
        conn.exec_driver_sql(setting)
    conn.commit()  # session settings: they stay for the transactions that follow


def test_recording_a_batch_reads_about_a_batch_whatever_the_backlog(pg_url):
    """50,000 claimable alerts, 7,000 of them claimed by other sweepers, and statistics from before
    they were inserted: recording one claim's 100 deliveries reads about those 100 rows of
    ``alerts``, not the backlog and not the other claims. Read from the plan as it ran.

    Before (migration 0012 and a status condition in the record statement): the planner, believing
    few alerts claimed, found them through the ``(status, send_at)`` index and read every claimed
    alert's entry, live or dead, on every batch (23 entries per delivered alert in a sweep of
    20,000); without that index it read the whole partial claim index instead."""
    engine = make_engine(pg_url)
    try:
        first = _nearly_empty_statistics(engine)
        with engine.begin() as conn:
            clock = db_clock(conn)
            conn.execute(text(
                "INSERT INTO alerts (obligation_id, offset_seconds, channel, kind, dedup_key, send_at, status, "
                "attempts, lease_owner, lease_expires_at, created_at, updated_at) "
                "SELECT o.obligation_id, i, 'hook', 'reminder', md5(i::text), :t0, "
                "       CASE WHEN i % 7 = 0 THEN 'claimed' ELSE 'pending' END, 0, "
                "       CASE WHEN i % 7 = 0 THEN 'other#' || (i % 14) || '#r' END, "
                "       CASE WHEN i % 7 = 0 THEN :live END, :t0, :t0 "
                "FROM generate_series(1, 50000) i, (SELECT obligation_id FROM alerts WHERE id = :first) o"),
                {"t0": T0, "live": clock + timedelta(hours=1), "first": first})
            rows, _ = dsql.claim_and_load(conn, owner="me#1#r", now=T0, lease_seconds=300, limit=100)
            assert len(rows) == 100
            started = dsql.start_attempts(conn, [(r["id"], 1) for r in rows], owner="me#1#r", now=T0,
                                          held_only=True)
        plans: list = []
        with engine.connect() as conn:
            _explained(conn, plans)
            with conn.begin():
                done = dsql.record_sent(conn, [(a, t, "HTTP 200", T0) for a, t in started.items()],
                                        owner="me#1#r", now=T0)
        assert len(done) == 100
        docs = [json.loads(p.split("plan:", 1)[1]) for p in plans if "'delivered'" in p]
        assert len(docs) == 1, plans
        assert _scan_rows(docs[0]["Plan"]) <= 300, json.dumps(docs[0]["Plan"], indent=1)
    finally:
        engine.dispose()
