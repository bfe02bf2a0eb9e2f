"""Assemble the Dagster ``Definitions`` for one configuration file."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from deadline_pipeline.config import DEFAULT_CONFIG_NAME, load_config
from deadline_pipeline.orchestration.assets import (
    ALERTS,
    OBLIGATIONS,
    RULE_VERSIONS,
    build_assets,
    snapshot_key,
    source_key,
)
from deadline_pipeline.orchestration.checks import ALL_CHECKS
from deadline_pipeline.orchestration.deliver import deliver_job, deliver_sensor
from deadline_pipeline.orchestration.paging import paging_sensor
from deadline_pipeline.orchestration.partitions import (
    PartitionRangeError,
    first_plan_month,
    horizon_range,
    plan_partitions,
)
from deadline_pipeline.orchestration.planning import PLAN_JOB, build_planning_automation
from deadline_pipeline.orchestration.resources import ClockResource, SettingsResource, StoreResource
from deadline_pipeline.orchestration.source_checks import SOURCE_CHECKS_FACTORY
from deadline_pipeline.orchestration.time_data import build_time_data_sensor

EXAMPLES_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "deadlines.yaml"
INGEST_JOB = "ingest_job"
CHECKS_JOB = "watch_checks_job"


def default_config_path() -> Path:
    """``$DEADLINE_CONFIG``, else ``./deadlines.yaml`` if present, else the bundled examples."""
    env = os.environ.get("DEADLINE_CONFIG")
    if env:
        return Path(env).resolve()
    local = Path(DEFAULT_CONFIG_NAME)
    return local.resolve() if local.exists() else EXAMPLES_CONFIG


def build_definitions(config_path: str | os.PathLike, *, db_url: str | None = None,
                      as_of: str | None = None) -> dg.Definitions:
    """Definitions for the configuration at ``config_path``.

    The plan partitions start at ``plan.first_month`` or, by default, at the month of the first
    planning run in the store (see :mod:`deadline_pipeline.orchestration.partitions`); with ``as_of``
    they reach the end of that instant's horizon.

    Raises :class:`deadline_pipeline.config.ConfigError` (naming file, key and problem) for a bad file,
    and for an ``as_of`` whose horizon the partitions cannot cover (before ``plan.first_month``, or more
    than a century ahead).
    Installs log redaction in this process (code servers, run workers and the daemon load this).
    """
    from deadline_pipeline.security.redact import install

    install()
    cfg, path = load_config(config_path)
    # One key per source: two names with one key (a-b, a_b) were refused by load_config, naming both.
    keys = [source_key(s.name) for s in cfg.sources]
    clock = ClockResource(as_of=as_of)
    try:
        if cfg.plan.first_month:
            first_month = f"{cfg.plan.first_month}-01"
        else:
            first_month = first_plan_month(db_url, clock.now())
        partitions_def = plan_partitions(first_month, cfg.plan.horizon_days, clock.now() if as_of else None)
        if as_of:
            # A replay whose horizon has no partitions would plan part of it and say nothing.
            horizon_range(clock.now(), cfg.plan.horizon_days, partitions_def)
    except PartitionRangeError as exc:
        from deadline_pipeline.config import ConfigError

        raise ConfigError(f"{path}: plan.first_month / --as-of {as_of}: {exc}") from None
    assets = build_assets(cfg, partitions_def)
    ingest_job = dg.define_asset_job(
        INGEST_JOB,
        # Without the checks: a source whose fetch failed confirms no snapshot, and its checks would
        # be skipped rows; watch_checks_job evaluates them (the chain runs it right after ingest).
        selection=dg.AssetSelection.assets(*keys, *[snapshot_key(s.name) for s in cfg.sources], RULE_VERSIONS)
        .without_checks(),
        description="Observe every source, confirm fresh snapshots and apply new rule versions.",
        tags={"stage": "ingest"},
    )
    plan_job = dg.define_asset_job(
        PLAN_JOB,
        # Without the checks: a range run planned every check once per month and evaluated it once, so
        # the check history was mostly "Skipped" rows. The checks run in watch_checks_job instead.
        selection=dg.AssetSelection.assets(OBLIGATIONS, ALERTS).without_checks(),
        partitions_def=partitions_def,
        description="Plan obligations and alerts of a range of due months (backfill-safe: idempotent).",
        tags={"stage": "plan"},
    )
    plan_schedules, plan_sensors = build_planning_automation(plan_job, partitions_def, cfg.plan.horizon_days)
    checks_job = dg.define_asset_job(
        CHECKS_JOB, selection=dg.AssetSelection.all_asset_checks(),
        description="Evaluate every asset check without materializing anything.",
        tags={"stage": "watch"},
    )
    return dg.Definitions(
        assets=assets,
        asset_checks=[*ALL_CHECKS, *SOURCE_CHECKS_FACTORY(cfg)],
        jobs=[ingest_job, plan_job, checks_job, deliver_job],
        sensors=[deliver_sensor, *plan_sensors, paging_sensor,
                 build_time_data_sensor(plan_job, partitions_def, cfg.plan.horizon_days)],
        schedules=[
            *plan_schedules,
            dg.ScheduleDefinition(name="ingest_hourly", job=ingest_job, cron_schedule="7 * * * *",
                                  default_status=dg.DefaultScheduleStatus.RUNNING),
            dg.ScheduleDefinition(name="watch_checks_every_5_minutes", job=checks_job, cron_schedule="*/5 * * * *",
                                  default_status=dg.DefaultScheduleStatus.RUNNING),
        ],
        resources={
            "store": StoreResource(db_url=db_url),
            "settings": SettingsResource(config_path=str(path)),
            "clock": clock,
        },
    )
