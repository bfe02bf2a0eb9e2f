"""Planning runs on one PostgreSQL store take turns (an advisory lock held for the run's
transaction), and a run that fails reports its own error, not a cleanup's."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select

from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.plan.service import plan_all
from deadline_pipeline.store import staging
from deadline_pipeline.store.schema import obligations
from deadline_pipeline_tests.test_planning_chunks import MONTHLY, OTHERS, _config

T0 = datetime(2027, 1, 10, tzinfo=UTC)


def _ingest(engine, cfg, now):
    for s in cfg.sources:
        fetch_snapshot(engine, s, now)
        apply_latest_snapshot(engine, s, now)


def _postgresql_only(engine) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("the planning lock is PostgreSQL's; SQLite has one writer at a time")


def test_a_planning_run_waits_for_the_one_holding_the_store(engine, tmp_path):
    """Two runs planning one store at once each compared, then merged, and rows the other merged in
    between made one fail (``KeyError`` on an obligation key). A run now waits while another holds
    the planning lock, and plans once it is released."""
    _postgresql_only(engine)
    cfg = _config(tmp_path, [MONTHLY, *OTHERS])
    _ingest(engine, cfg, T0)
    done = threading.Event()
    outcome: dict = {}

    def run():
        try:
            outcome["out"] = plan_all(engine, cfg, T0)
        except Exception as exc:  # reported by the assertions below
            outcome["error"] = exc
        finally:
            done.set()

    with engine.connect() as holder, holder.begin():
        assert staging.lock_planning(holder) is False
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        assert not done.wait(2.0), outcome  # blocked on the lock, not planning beside the holder
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(obligations)).scalar() == 0
    assert done.wait(60), "the run did not plan after the lock was released"
    thread.join()
    assert "error" not in outcome, outcome
    assert outcome["out"].obligations_inserted > 0


def test_a_failed_run_reports_its_own_error(engine, tmp_path, monkeypatch):
    """A statement failing mid-plan aborts PostgreSQL's transaction; the staging tables' DROP in a
    ``finally`` then failed too ("current transaction is aborted") and was the error reported."""
    _postgresql_only(engine)
    cfg = _config(tmp_path, [MONTHLY, *OTHERS])
    _ingest(engine, cfg, T0)

    def failing(conn, *args, **kwargs):
        conn.exec_driver_sql("SELECT 1 / 0")

    monkeypatch.setattr(staging, "analyze_planned", failing)
    with pytest.raises(Exception) as info:
        plan_all(engine, cfg, T0)
    assert "division by zero" in str(info.value), info.value
    assert "current transaction is aborted" not in str(info.value), info.value
