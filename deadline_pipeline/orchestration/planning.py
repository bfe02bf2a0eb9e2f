"""Dagster wiring that keeps the horizon planned: the hourly horizon schedule and the sensor that
re-plans exactly the months a rule revision touched."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg

from deadline_pipeline.orchestration.assets import RULE_VERSIONS
from deadline_pipeline.orchestration.partitions import horizon_range, range_tags

PLAN_JOB = "plan_job"


def build_planning_automation(plan_job, partitions_def: dg.MonthlyPartitionsDefinition, horizon_days: int = 366):
    """The hourly horizon schedule and the revision sensor for ``plan_job`` over ``partitions_def``."""

    @dg.schedule(job=plan_job, cron_schedule="17 * * * *", default_status=dg.DefaultScheduleStatus.RUNNING,
                 description="Re-plan the whole 366-day horizon every hour (idempotent; a no-op writes nothing).")
    def plan_horizon_hourly(context: dg.ScheduleEvaluationContext):
        now = context.scheduled_execution_time or datetime.now(UTC)
        first, last = horizon_range(now.astimezone(UTC), horizon_days, partitions_def)
        return dg.RunRequest(run_key=None, tags=range_tags(first, last))

    @dg.asset_sensor(asset_key=RULE_VERSIONS, job=plan_job, default_status=dg.DefaultSensorStatus.RUNNING,
                     minimum_interval_seconds=30,
                     description="After new rule versions, re-plan exactly the due months they touch.")
    def replan_on_revision(context: dg.SensorEvaluationContext, asset_event: dg.EventLogEntry):
        mat = asset_event.asset_materialization
        value = mat.metadata.get("affected_partitions") if mat else None
        months = list(value.value) if value is not None else []
        existing = set(partitions_def.get_partition_keys())
        missing = [m for m in months if m not in existing]
        if missing:
            context.log.error(f"revision touches months without a plan partition: {missing}")
        wanted = [m for m in months if m in existing]
        if not wanted:
            return dg.SkipReason("the latest rule versions change no planned month")
        # run_key makes a re-evaluation of the same materialization request nothing twice.
        return [dg.RunRequest(run_key=f"{asset_event.run_id}:{m}", partition_key=m) for m in wanted]

    return [plan_horizon_hourly], [replan_on_revision]
