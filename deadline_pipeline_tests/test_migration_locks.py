"""A migration that loses a lock race against live sweepers rolls back and retries instead of failing.

The rolling-deploy test failed once with ``deadlock detected`` on ``ALTER TABLE alerts ADD COLUMN
due_at``: the migration held ``rule_versions`` (ACCESS EXCLUSIVE) and waited for ``alerts`` while an
old sweeper's transaction held ``alerts`` and waited for ``rule_versions``. These tests build that
race on purpose, on a real PostgreSQL server, with an open transaction standing in for the sweeper.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from sqlalchemy import text

from deadline_pipeline.store import db
from deadline_pipeline.store.db import StoreMigrationError, make_engine, upgrade


def _waiting_on_lock(engine, query_start: str) -> bool:
    """Whether some backend waits for a lock while running a statement starting with ``query_start``."""
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE :q"
        ), {"q": query_start + "%"}).scalar_one() > 0


def _wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for the migration to block"
        time.sleep(0.02)


def _head(engine) -> str:
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar_one()


def _upgrade_in_thread(url: str) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            upgrade(url)
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def test_a_deadlock_with_a_live_transaction_rolls_back_and_retries(pg_url, caplog):
    engine = make_engine(pg_url)
    upgrade(engine, "0005")  # the previous release's schema; 0006 alters rule_versions, then alerts
    sweeper = engine.connect()
    # The stand-in sweeper must never be the one PostgreSQL aborts: its deadlock check comes late.
    sweeper.exec_driver_sql("SET deadlock_timeout = '20s'")
    sweeper.commit()  # a session setting; the next statement opens the sweeper's transaction
    sweeper.exec_driver_sql("SELECT count(*) FROM alerts")  # holds ACCESS SHARE on alerts
    caplog.set_level(logging.WARNING, logger=db.__name__)
    thread, errors = _upgrade_in_thread(pg_url)
    try:
        _wait_for(lambda: _waiting_on_lock(engine, "ALTER TABLE alerts"))
        # The cycle: the migration holds rule_versions and waits for alerts; now the sweeper waits
        # for rule_versions. PostgreSQL aborts the migration's transaction with deadlock_detected.
        sweeper.exec_driver_sql("SELECT count(*) FROM rule_versions")
        sweeper.commit()
    finally:
        sweeper.close()
    thread.join(120)
    assert not thread.is_alive()
    assert errors == []
    assert _head(engine) == db_head()
    retries = [r for r in caplog.records if "lost a lock race" in r.getMessage()]
    assert retries and "40P01" in retries[0].getMessage()
    engine.dispose()


def test_a_long_transaction_makes_the_migration_give_up_the_lock_and_retry(pg_url, caplog, monkeypatch):
    monkeypatch.setattr(db, "MIGRATION_LOCK_TIMEOUT_S", 0.2)
    engine = make_engine(pg_url)
    upgrade(engine, "0005")
    sweeper = engine.connect()
    sweeper.exec_driver_sql("SELECT count(*) FROM alerts")
    caplog.set_level(logging.WARNING, logger=db.__name__)
    thread, errors = _upgrade_in_thread(pg_url)
    try:
        _wait_for(lambda: any("55P03" in r.getMessage() for r in caplog.records))
        # While the migration backs off, nothing queues behind it: a new reader of alerts is served.
        with engine.connect() as reader:
            reader.exec_driver_sql("SET lock_timeout = '5s'")
            reader.exec_driver_sql("SELECT count(*) FROM alerts")
        assert thread.is_alive(), "the migration waits while the transaction holds alerts"
        sweeper.commit()
    finally:
        sweeper.close()
    thread.join(120)
    assert errors == []
    assert _head(engine) == db_head()
    engine.dispose()


def test_every_attempt_lost_is_a_clear_error_and_changes_nothing(pg_url, monkeypatch):
    monkeypatch.setattr(db, "MIGRATION_LOCK_TIMEOUT_S", 0.05)
    monkeypatch.setattr(db, "MIGRATION_ATTEMPTS", 2)
    engine = make_engine(pg_url)
    upgrade(engine, "0005")
    sweeper = engine.connect()
    sweeper.exec_driver_sql("SELECT count(*) FROM alerts")
    try:
        with pytest.raises(StoreMigrationError) as caught:
            upgrade(pg_url)
    finally:
        sweeper.rollback()
        sweeper.close()
    message = str(caught.value)
    assert "lost 2 lock races" in message and "nothing was changed" in message
    assert engine.url.database in message
    assert _head(engine) == "0005"
    engine.dispose()


def db_head() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(db.alembic_config("sqlite://")).get_current_head()
