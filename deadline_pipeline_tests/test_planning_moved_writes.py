"""How a moved deadline's reminders are written, on SQLite and PostgreSQL: the new instant's
reminders go straight in (PostgreSQL: a binary COPY under a savepoint), the old instant's open ones
are superseded, and a deadline moved back to an instant it had gets that instant's superseded
reminders back (the COPY meets them in the unique indexes and the merge revives them) — never a
second set."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select

from deadline_pipeline.store.schema import alerts, obligations
from deadline_pipeline_tests.test_planning import _alerts, _configure, _ingest_plan

T0 = datetime(2027, 1, 10, tzinfo=UTC)
A = {"uid": "a@test", "tzid": "Europe/Berlin", "dtstart": "20270215T120000", "summary": "Report A"}
B = {"uid": "b@test", "tzid": "UTC", "dtstart": "20270301T090000", "summary": "Report B"}
FIRST, SECOND = datetime(2027, 2, 15, 11, tzinfo=UTC), datetime(2027, 2, 22, 11, tzinfo=UTC)
FELL_BACK = "moved back"


def _reminders(engine) -> dict[tuple[datetime, int], str]:
    """(due instant, offset seconds) → status of A's reminders; fails on a duplicate."""
    rows = [r for r in _alerts(engine, "a@test") if r["kind"] == "reminder"]
    out = {(r["due_at"], r["offset_seconds"]): r["status"] for r in rows}
    assert len(out) == len(rows), rows
    return out


def test_a_deadline_moved_away_and_back_gets_its_reminders_back_never_twice(engine, tmp_path, caplog):
    cfg = _configure(tmp_path, [A, B])
    _ingest_plan(engine, cfg, T0)
    caplog.set_level(logging.INFO, logger="deadline_pipeline")

    cfg = _configure(tmp_path, [dict(A, dtstart="20270222T120000"), B])
    away = _ingest_plan(engine, cfg, T0 + timedelta(hours=1))
    assert (away.obligations_moved, away.alerts_superseded, away.alerts_inserted) == (1, 2, 2)
    assert FELL_BACK not in caplog.text  # a new instant: written straight in
    assert _reminders(engine) == {(FIRST, -7 * 86400): "superseded", (FIRST, -86400): "superseded",
                                  (SECOND, -7 * 86400): "pending", (SECOND, -86400): "pending"}

    cfg = _configure(tmp_path, [A, B])
    back = _ingest_plan(engine, cfg, T0 + timedelta(hours=2))
    assert (back.obligations_moved, back.alerts_superseded, back.alerts_inserted) == (1, 2, 0)
    if engine.dialect.name == "postgresql":
        assert FELL_BACK in caplog.text  # the COPY met the first instant's rows and was undone
    assert _reminders(engine) == {(FIRST, -7 * 86400): "pending", (FIRST, -86400): "pending",
                                  (SECOND, -7 * 86400): "superseded", (SECOND, -86400): "superseded"}
    with engine.connect() as conn:
        keys = conn.execute(select(func.count(alerts.c.dedup_key.distinct()), func.count())
                            .select_from(alerts.join(obligations))
                            .where(obligations.c.rule_id == "a@test")).one()
    assert keys[0] == keys[1]

    again = _ingest_plan(engine, cfg, T0 + timedelta(hours=3))
    assert (again.obligations_moved, again.alerts_written) == (0, 0)
