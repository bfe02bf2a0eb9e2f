"""The plan partitions start where the data starts (``plan.first_month``, else the first planning run)
and reach the end of the horizon of any ``--as-of`` the command line accepts; others are refused."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from deadline_pipeline.cli import main
from deadline_pipeline.config import ConfigError
from deadline_pipeline.orchestration.build import build_definitions
from deadline_pipeline.orchestration.partitions import horizon_range, month_key
from deadline_pipeline.orchestration.planning import PLAN_JOB
from deadline_pipeline.store import health
from deadline_pipeline.store.db import make_engine, upgrade
from deadline_pipeline_tests.test_watch_checks import setup_config


def _partitions(path, db_url, as_of=None):
    return build_definitions(path, db_url=db_url, as_of=as_of).resolve_job_def(PLAN_JOB).partitions_def


def test_partitions_start_at_the_first_planning_run(tmp_path, db_url):
    _, path = setup_config(tmp_path)
    now = datetime.now(UTC)
    fresh = _partitions(path, db_url)
    # A store that never planned: this month, not years of empty months.
    assert fresh.get_first_partition_key() == month_key(now - health_grace())
    engine = make_engine(db_url)
    upgrade(engine)
    first_run = datetime(2026, 3, 10, 8, 0, tzinfo=UTC)
    with engine.begin() as conn:
        health.beat(conn, "plan", started_at=first_run, completed_at=first_run, outcome="ok")
        # Later runs do not move the start.
        health.beat(conn, "plan", started_at=now, completed_at=now, outcome="ok")
    engine.dispose()
    keys = _partitions(path, db_url).get_partition_keys()
    assert keys[0] == "2026-03-01"
    # The end covers the whole horizon from today's month.
    assert keys[-1] >= month_key(now.replace(year=now.year + 1))
    assert len(keys) < 40


def health_grace():
    from deadline_pipeline.plan.occurrences import GRACE

    return GRACE


def test_configured_first_month_and_a_replay_far_ahead_are_covered(tmp_path, db_url):
    _, path = setup_config(tmp_path, plan={"first_month": "2025-07"})
    as_of = datetime(2029, 6, 1, tzinfo=UTC)  # more than 13 months ahead of the real clock
    parts = _partitions(path, db_url, as_of.isoformat())
    assert parts.get_first_partition_key() == "2025-07-01"
    first, last = horizon_range(as_of, 366, parts)
    assert (first, last) == ("2029-05-01", "2030-06-01")
    assert parts.has_partition_key(last)


def test_replay_before_first_month_is_refused_clearly(tmp_path, db_url):
    _, path = setup_config(tmp_path, plan={"first_month": "2025-07"})
    with pytest.raises(ConfigError, match=r"plan.first_month.*2025-07\.\.|set plan.first_month"):
        build_definitions(path, db_url=db_url, as_of="2024-01-10T00:00:00Z")
    res = CliRunner().invoke(main, ["run", "--config", str(path), "--db-url", db_url, "--as-of",
                                    "2024-01-10T00:00:00Z"],
                             env={"DEADLINE_HOME": str(tmp_path / "h"), "DAGSTER_HOME": str(tmp_path / "d")})
    assert res.exit_code == 2, res.output
    assert "plan.first_month" in res.output and "2024-01" in res.output and "Traceback" not in res.output
    far = CliRunner().invoke(main, ["run", "--config", str(path), "--db-url", db_url, "--as-of",
                                    "2300-01-10T00:00:00Z"],
                             env={"DEADLINE_HOME": str(tmp_path / "h"), "DAGSTER_HOME": str(tmp_path / "d")})
    assert far.exit_code == 2 and "100 years ahead" in far.output, far.output


def test_first_month_is_validated(tmp_path):
    with pytest.raises(ConfigError, match="plan.first_month: first_month '2025-13': expected a month 'YYYY-MM'"):
        setup_config(tmp_path, plan={"first_month": "2025-13"})
