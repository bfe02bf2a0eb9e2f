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


def test_a_code_location_loaded_early_in_a_month_plans_the_horizon_on_its_last_day(tmp_path, db_url):
    """The code location is loaded once (a code server runs for weeks) and Dagster moves the last
    partition with its own clock, not the load instant's. Loaded on 10 January 2027 the horizon
    ended 12 months on; on 31 January it ends 13 months on (1 February 2028), and that month had
    no partition: every hourly horizon tick of the day failed (PartitionRangeError), nothing planned
    the day's configuration changes, and the first of February 2028 was planned a day late. The tick
    is evaluated at its instant, as the daemon does, and its run executed against the store."""
    import dagster as dg
    from dagster._core.definitions.partitions.context import partition_loading_context
    from sqlalchemy import select

    from deadline_pipeline.orchestration.assets import ALERTS, OBLIGATIONS, build_assets
    from deadline_pipeline.orchestration.partitions import plan_partitions
    from deadline_pipeline.orchestration.planning import build_planning_automation
    from deadline_pipeline.orchestration.resources import ClockResource, SettingsResource, StoreResource
    from deadline_pipeline.store.schema import obligations
    from deadline_pipeline_tests.test_watch_checks import ingest

    cfg, path = setup_config(tmp_path)
    loaded = datetime(2027, 1, 10, 9, 0, tzinfo=UTC)
    tick_at = datetime(2027, 1, 31, 23, 17, tzinfo=UTC)
    engine = make_engine(db_url)
    upgrade(engine)
    ingest(engine, cfg, loaded)
    parts = plan_partitions("2027-01-01", cfg.plan.horizon_days, real_now=loaded)
    plan_job = dg.define_asset_job(PLAN_JOB, selection=dg.AssetSelection.assets(OBLIGATIONS, ALERTS),
                                   partitions_def=parts)
    (schedule,), _ = build_planning_automation(plan_job, parts, cfg.plan.horizon_days)
    defs = dg.Definitions(assets=build_assets(cfg, parts), jobs=[plan_job], schedules=[schedule],
                          resources={"store": StoreResource(db_url=db_url),
                                     "settings": SettingsResource(config_path=str(path)),
                                     "clock": ClockResource(as_of=tick_at.isoformat())})
    with dg.instance_for_test() as instance, partition_loading_context(tick_at):
        ctx = dg.build_schedule_context(instance=instance, scheduled_execution_time=tick_at,
                                        repository_def=defs.get_repository_def())
        (request,) = schedule.evaluate_tick(ctx).run_requests
        assert (request.tags["dagster/asset_partition_range_start"],
                request.tags["dagster/asset_partition_range_end"]) == ("2027-01-01", "2028-02-01")
        assert defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, tags=request.tags).success
    with engine.connect() as conn:
        dues = set(conn.execute(select(obligations.c.due_at).where(obligations.c.rule_id == "b@test")).scalars())
        beats = health.read_heartbeats(conn)
    # File report B, monthly on the 1st at 09:00 New York: 1 February 2028 is inside the horizon.
    assert datetime(2028, 2, 1, 14, 0, tzinfo=UTC) in dues
    assert beats["plan"]["last_outcome"] == "ok"  # a run of the whole horizon: the planner is alive
    engine.dispose()
