"""Migration 0006 on a store written by the previous schema (SQLite and PostgreSQL): every alert gets
the due instant it was planned for, history is kept row for row, and the new identity lets a moved
deadline's reminder exist next to the one delivered for its old instant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from deadline_pipeline.store.db import make_engine, upgrade

OLD = datetime(2027, 1, 15, 11, tzinfo=UTC)
NEW = datetime(2027, 1, 22, 11, tzinfo=UTC)


def _ts(engine, value: datetime):
    # The previous schema's column type stores naive UTC text on SQLite, aware values on PostgreSQL.
    return value.replace(tzinfo=None) if engine.dialect.name == "sqlite" else value


@pytest.fixture
def old_store(db_url):
    eng = make_engine(db_url)
    upgrade(eng, "0005")
    yield eng
    eng.dispose()


def test_existing_alerts_get_the_instant_they_were_planned_for(old_store):
    eng = old_store
    t = lambda v: _ts(eng, v)  # noqa: E731
    with eng.begin() as conn:
        conn.execute(text("INSERT INTO sources (id, name, tenant, format, location, freshness_seconds, status) "
                          "VALUES (1, 'cal', 't', 'ics', 'cal.ics', 86400, 'fresh')"))
        conn.execute(text("INSERT INTO subscribers (id, external_id, tenant, timezone, active) "
                          "VALUES (1, 'ann', 't', 'UTC', true)"))
        # A deadline moved from 15 to 22 January after its -P7D reminder was delivered.
        conn.execute(text("INSERT INTO obligations (id, obligation_key, tenant, subscriber_id, source_id, rule_id, "
                          "rule_version, period, title, due_at, status, planned_at, revision, previous_due_at) "
                          "VALUES (1, 'k', 't', 1, 1, 'a', 2, 'once', 'A', :new, 'active', :now, 1, :old)"),
                     {"new": t(NEW), "old": t(OLD), "now": t(OLD - timedelta(days=6))})
        rows = [  # (id, offset, kind, revision, send_at, status)
            (1, -7 * 86400, "reminder", 0, OLD - timedelta(days=7), "delivered"),  # for the old instant
            (2, -86400, "reminder", 0, NEW - timedelta(days=1), "pending"),  # moved along with the deadline
            (3, 0, "correction", 1, OLD - timedelta(days=6), "delivered"),
        ]
        for i, offset, kind, rev, send_at, status in rows:
            conn.execute(text("INSERT INTO alerts (id, obligation_id, offset_seconds, channel, kind, dedup_key, "
                              "send_at, status, attempts, created_at, updated_at, revision) VALUES "
                              "(:i, 1, :o, 'mail', :k, :d, :s, :st, 0, :s, :s, :r)"),
                         {"i": i, "o": offset, "k": kind, "d": f"key{i}", "s": t(send_at), "st": status, "r": rev})
    upgrade(eng)
    from sqlalchemy import select

    from deadline_pipeline.store.schema import alerts

    with eng.connect() as conn:
        got = dict(conn.execute(select(alerts.c.id, alerts.c.due_at)).all())
    assert got == {1: OLD, 2: NEW, 3: NEW}
    # The new identity: the reminder owed for the new instant can sit next to the delivered one.
    with eng.begin() as conn:
        conn.execute(alerts.insert().values(
            id=4, obligation_id=1, offset_seconds=-7 * 86400, channel="mail", kind="reminder", dedup_key="key4",
            send_at=NEW - timedelta(days=7), status="pending", attempts=0, created_at=NEW, updated_at=NEW,
            revision=0, due_at=NEW))
        assert conn.execute(select(alerts.c.id).where(alerts.c.due_at == NEW)).all()
