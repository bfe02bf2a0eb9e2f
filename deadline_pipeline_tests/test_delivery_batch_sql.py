"""The delivery sweep's batch statements on PostgreSQL: values survive the binary array parameters
(and the text fallback of a driver without them), and migration 0011 keeps the update that finishes
an attempt row heap-only; the migration upgrades and downgrades on both engines."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from alembic import command
from sqlalchemy import insert, select, text

from deadline_pipeline.deliver.channels.base import IDEMPOTENCY_NOTIFICATION
from deadline_pipeline.deliver.notification import SendResult
from deadline_pipeline.store import delivery as dsql
from deadline_pipeline.store.db import alembic_config, make_engine, upgrade
from deadline_pipeline.store.schema import alerts, delivery_attempts, obligations, sources, subscribers

T0 = datetime(2027, 3, 1, 9, tzinfo=UTC)


def _seed(engine, n: int) -> list[int]:
    """``n`` due alerts on one obligation (distinct offsets keep them apart); their ids."""
    tag = uuid.uuid4().hex[:8]
    with engine.begin() as conn:
        src = conn.execute(insert(sources).values(name=f"src-{tag}", tenant="t", format="ics", location="x",
                                                  freshness_seconds=86400)).inserted_primary_key[0]
        sub = conn.execute(insert(subscribers).values(external_id=f"sub-{tag}", tenant="t",
                                                      timezone="UTC")).inserted_primary_key[0]
        obl = conn.execute(insert(obligations).values(
            obligation_key=tag, tenant="t", subscriber_id=sub, source_id=src, rule_id="r", rule_version=1,
            period="p", title="A deadline", due_at=T0 + timedelta(days=1), status="active", planned_at=T0,
        )).inserted_primary_key[0]
        conn.execute(insert(alerts), [
            {"obligation_id": obl, "offset_seconds": -i, "channel": "hook", "kind": "reminder",
             "dedup_key": f"{tag}-{i}", "send_at": T0, "status": "pending", "attempts": 0, "created_at": T0,
             "updated_at": T0} for i in range(n)])
        return conn.execute(select(alerts.c.id).where(alerts.c.obligation_id == obl)
                            .order_by(alerts.c.id)).scalars().all()


def _claim_and_start(engine, owner: str, n: int) -> dict[int, int]:
    """Claim ``n`` alerts for ``owner`` and start their attempts in groups of 30 (as the sweep's
    gate does); ``{alert_id: attempt_id}``."""
    with engine.begin() as conn:
        rows, _ = dsql.claim_and_load(conn, owner=owner, now=T0, lease_seconds=300, limit=n)
    started = {}
    for i in range(0, len(rows), 30):
        with engine.begin() as conn:
            started.update(dsql.start_attempts(conn, [(r["id"], r["attempts"] + 1) for r in rows[i:i + 30]],
                                               owner=owner, now=T0, held_only=True))
    assert len(started) == n
    return started


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_recorded_sends_keep_every_value_on_both_drivers(pg_url, driver):
    """Provider ids with the characters an array literal treats specially, a NULL one and the
    string "NULL", and send instants a microsecond apart are stored exactly: through psycopg's
    binary arrays and through the text fallback of a driver without binary parameters."""
    url = pg_url.replace("postgresql+psycopg://", f"postgresql+{driver}://")
    engine = make_engine(url)
    try:
        upgrade(engine)
        assert engine.dialect.driver == driver
        ids = _seed(engine, 8)
        owner = "me#1#r"
        started = _claim_and_start(engine, owner, 8)
        pmids = ['a"b', "back\\slash", "{1,2}", "NULL", None, "é ✓ tab\tnewline\n", "", " spaced "]
        sent_at = [T0 + timedelta(seconds=5, microseconds=k) for k in range(8)]
        items = [(a, started[a], p, s) for a, p, s in zip(ids, pmids, sent_at, strict=True)]
        with engine.begin() as conn:
            assert dsql.record_sent(conn, items, owner=owner, now=T0 + timedelta(seconds=6)) == set(ids)
        with engine.connect() as conn:
            got = conn.execute(select(alerts.c.id, alerts.c.provider_message_id, alerts.c.delivered_at,
                                      alerts.c.status, alerts.c.lease_owner, alerts.c.attempts)
                               .order_by(alerts.c.id)).all()
            assert got == [(a, p, s, "delivered", None, 1) for a, p, s in zip(ids, pmids, sent_at, strict=True)]
            att = conn.execute(select(delivery_attempts.c.alert_id, delivery_attempts.c.attempt,
                                      delivery_attempts.c.lease_owner, delivery_attempts.c.started_at,
                                      delivery_attempts.c.provider_message_id, delivery_attempts.c.finished_at,
                                      delivery_attempts.c.outcome).order_by(delivery_attempts.c.alert_id)).all()
            assert att == [(a, 1, owner, T0, p, s, "sent") for a, p, s in zip(ids, pmids, sent_at, strict=True)]
        # Lease-checked: a writer whose lease was taken over records its attempt, never the alert.
        [late] = _seed(engine, 1)
        [(alert, attempt)] = _claim_and_start(engine, owner, 1).items()
        assert alert == late
        with engine.begin() as conn:
            conn.execute(alerts.update().where(alerts.c.id == late).values(lease_owner="them#2#r"))
        with engine.begin() as conn:
            assert dsql.record_sent(conn, [(late, attempt, "x", T0)], owner=owner, now=T0) == set()
        with engine.connect() as conn:
            assert conn.execute(select(alerts.c.status, alerts.c.lease_owner)
                                .where(alerts.c.id == late)).one() == ("claimed", "them#2#r")
            assert conn.execute(select(delivery_attempts.c.outcome)
                                .where(delivery_attempts.c.id == attempt)).scalar_one() == "sent"
    finally:
        engine.dispose()


def _hot_share_of_finishing(engine, n: int) -> float:
    """Share of the attempt-row updates of one recorded batch of ``n`` sends that were heap-only,
    read from this backend's own not yet reported statistics before and after (exact, no wait for
    the statistics to be flushed; they may still hold earlier transactions' counts, hence the
    difference)."""
    ids = _seed(engine, n)
    owner = f"bench-host#4242#cli-{uuid.uuid4().hex[:8]}#c1.{uuid.uuid4().hex[:6]}"
    started = _claim_and_start(engine, owner, n)
    counts = text("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'delivery_attempts'")
    with engine.begin() as conn:
        upd0, hot0 = conn.execute(counts).one()
        dsql.record_sent(conn, [(a, started[a], f"<{uuid.uuid4()}@mail.example.org>", T0) for a in ids],
                         owner=owner, now=T0)
        upd, hot = conn.execute(counts).one()
    assert upd - upd0 == n
    return (hot - hot0) / n


def test_finishing_an_attempt_row_is_heap_only_from_0011(pg_url):
    """With the default fillfactor the inserts pack the attempt pages full and nearly every
    finishing update moves its row (new index entries); from 0011 nearly all stay heap-only."""
    engine = make_engine(pg_url)
    try:
        upgrade(engine, "0010")
        before = _hot_share_of_finishing(engine, 400)
        upgrade(engine)
        with engine.begin() as conn:  # fresh pages, as after the migration in a live store
            conn.execute(text("TRUNCATE delivery_attempts, alerts, obligations, subscribers, sources CASCADE"))
        after = _hot_share_of_finishing(engine, 400)
    finally:
        engine.dispose()
    assert before < 0.2, before
    assert after >= 0.8, after


def test_migration_0011_upgrades_and_downgrades(db_url):
    engine = make_engine(db_url)
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))

    def options() -> list[str] | None:
        if engine.dialect.name != "postgresql":
            return None
        with engine.connect() as conn:
            return conn.execute(text("SELECT reloptions FROM pg_class WHERE relname = 'delivery_attempts'")
                                ).scalar_one()

    try:
        upgrade(engine)
        assert options() == (["fillfactor=40"] if engine.dialect.name == "postgresql" else None)
        command.downgrade(cfg, "0010")
        assert options() is None
        upgrade(engine)
        assert options() == (["fillfactor=40"] if engine.dialect.name == "postgresql" else None)
        # The table works on the migrated store on both engines.
        [a] = _seed(engine, 1)
        with engine.begin() as conn:
            assert dsql.start_attempts(conn, [(a, 1)], owner="me#1#r", now=T0)
    finally:
        engine.dispose()


class _CheckingChannel:
    """A channel whose every send first reads, on a connection of its own (so only committed rows
    are visible), the unfinished attempt rows of the alert it is asked to send."""

    name = "fake"
    idempotency_class = IDEMPOTENCY_NOTIFICATION

    def __init__(self, engine) -> None:
        self.engine = engine
        self.seen: dict[str, list[tuple]] = {}

    def send(self, n):
        with self.engine.connect() as conn:
            self.seen[n.dedup_key] = conn.execute(
                select(delivery_attempts.c.attempt, delivery_attempts.c.lease_owner)
                .join(alerts, alerts.c.id == delivery_attempts.c.alert_id)
                .where(alerts.c.dedup_key == n.dedup_key, delivery_attempts.c.finished_at.is_(None))).all()
        return SendResult(provider_message_id=f"fake-{n.dedup_key[:8]}")

    def close(self) -> None:
        pass


def test_every_send_starts_after_its_attempt_row_is_committed(engine):
    """The guarantee behind the attempt rows, on both engines (on PostgreSQL the rows are written
    outside an explicit transaction): when a send starts, its attempt row is already visible to
    any other connection, so a crash right then leaves its trace."""
    from deadline_pipeline.config import DeadlinesConfig, MaildirChannel
    from deadline_pipeline.deliver.sweep import sweep

    ids = _seed(engine, 12)
    channel = _CheckingChannel(engine)
    cfg = DeadlinesConfig(channels={"hook": MaildirChannel(type="maildir", path="/nonexistent")},
                          delivery={"batch_size": 5})
    out = sweep(engine, cfg, T0, channels={"hook": channel})
    assert out.delivered == len(ids)
    with engine.connect() as conn:
        keys = conn.execute(select(alerts.c.dedup_key).where(alerts.c.id.in_(ids))).scalars().all()
    assert sorted(channel.seen) == sorted(keys)
    for key, rows in channel.seen.items():
        assert [attempt for attempt, _ in rows] == [1], (key, rows)


def test_every_way_out_of_a_claim_ends_its_lease_so_a_late_record_changes_nothing(db_url):
    """The record statement selects a claim's rows by ``lease_owner`` alone (no status condition,
    which misled PostgreSQL's planner into scanning the backlog): that holds only while no alert
    keeps a lease owner outside ``claimed``. Every write that moves an alert out of ``claimed``
    (delivered, released, retry, escalated after a failure, escalated unsent) is walked here; a late
    record by the old owner must then change none of them."""
    engine = make_engine(db_url)
    try:
        upgrade(engine)
        ids = _seed(engine, 5)
        started = _claim_and_start(engine, "old#1#r", 5)
        assert sorted(started) == sorted(ids)
        a, b, c, d, e = ids
        with engine.begin() as conn:
            assert dsql.record_sent(conn, [(a, started[a], "HTTP 200", T0)], owner="old#1#r", now=T0) == {a}
            assert dsql.release(conn, [b], owner="old#1#r", now=T0) == 1
            assert dsql.mark_failed(conn, c, owner="old#1#r", now=T0, error="503", next_attempt_at=T0, escalate=False)
            assert dsql.mark_failed(conn, d, owner="old#1#r", now=T0, error="410", next_attempt_at=None, escalate=True)
            assert dsql.escalate_unsent(conn, e, owner="old#1#r", now=T0, reason="missed", attempts_consumed=0)
        with engine.connect() as conn:
            held = conn.execute(select(alerts.c.id, alerts.c.status).where(alerts.c.lease_owner.is_not(None))).all()
            before = conn.execute(select(alerts.c.id, alerts.c.status, alerts.c.attempts, alerts.c.delivered_at)
                                  .order_by(alerts.c.id)).all()
        assert held == []
        with engine.begin() as conn:
            late = dsql.record_sent(conn, [(i, started[i], "HTTP 200", T0 + timedelta(minutes=1)) for i in ids],
                                    owner="old#1#r", now=T0 + timedelta(minutes=1))
        assert late == set()
        with engine.connect() as conn:
            after = conn.execute(select(alerts.c.id, alerts.c.status, alerts.c.attempts, alerts.c.delivered_at)
                                 .order_by(alerts.c.id)).all()
        assert after == before
        assert [s for _, s, _, _ in after] == ["delivered", "pending", "retry_wait", "escalated", "escalated"]
    finally:
        engine.dispose()
