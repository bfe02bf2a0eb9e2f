"""Dagster wiring that keeps the horizon planned: the hourly horizon schedule and the sensor that
re-plans exactly the months a rule revision touched."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import dagster as dg

from deadline_pipeline.orchestration.partitions import horizon_range, range_tags, revision_tags
from deadline_pipeline.orchestration.resources import ClockResource, SettingsResource, StoreResource
from deadline_pipeline.plan.service import affected_partitions, max_version_id

PLAN_JOB = "plan_job"

# The revision sensor's cursor: {"rule_version_id": N}, every stored rule version with id <= N handled.
_CURSOR_KEY = "rule_version_id"


def revision_cursor(handled_version_id: int) -> str:
    """The cursor of ``replan_on_revision`` once every rule version with id <= ``handled_version_id``
    was handled: ``'{"rule_version_id": N}'``."""
    return json.dumps({_CURSOR_KEY: handled_version_id})


def handled_version_id(cursor: str | None, log) -> int:
    """The highest rule version id a ``replan_on_revision`` cursor says was handled (0 for none).

    No cursor (a new or reset sensor) means nothing was handled yet. A cursor of another shape — the
    event storage id the former ``asset_sensor`` kept, or anything unreadable — is logged as a
    warning through ``log`` and also counts as 0: every stored rule version is handled again, which
    re-plans the months they touch once (planning is idempotent), instead of guessing which were
    handled and losing one. Never raises."""
    if cursor is None:
        return 0
    try:
        value = json.loads(cursor)
        handled = value.get(_CURSOR_KEY) if isinstance(value, dict) else None
        if type(handled) is int and handled >= 0:
            return handled
    except ValueError:
        pass
    log.warning(f"replan_on_revision: cursor {cursor!r} is not a rule version cursor (the former asset "
                "sensor's event id?): every stored rule version is handled again, re-planning each month "
                "they touch once")
    return 0


def build_planning_automation(plan_job, partitions_def: dg.MonthlyPartitionsDefinition, horizon_days: int = 366):
    """The hourly horizon schedule and the revision sensor for ``plan_job`` over ``partitions_def``:
    ``([plan_horizon_hourly], [replan_on_revision])``.

    ``replan_on_revision`` needs the ``store``, ``settings`` and ``clock`` resources. Each tick
    requests one ``plan_job`` run per planned due month (UTC, ``partition_key`` ``YYYY-MM-01``)
    touched by the rule versions stored after its cursor (:func:`handled_version_id`), tagged with
    those versions (:func:`~deadline_pipeline.orchestration.partitions.revision_tags`: the run plans
    only the rules they changed), and moves the cursor to the store's highest rule version id. Months
    without a plan partition are logged as errors; a store or configuration that cannot be read fails
    the tick, leaving the cursor where it was (the next tick retries)."""

    @dg.schedule(job=plan_job, cron_schedule="17 * * * *", default_status=dg.DefaultScheduleStatus.RUNNING,
                 description="Re-plan the whole 366-day horizon every hour (idempotent; a no-op writes nothing).")
    def plan_horizon_hourly(context: dg.ScheduleEvaluationContext):
        now = context.scheduled_execution_time or datetime.now(UTC)
        first, last = horizon_range(now.astimezone(UTC), horizon_days, partitions_def)
        return dg.RunRequest(run_key=None, tags=range_tags(first, last))

    # A plain sensor over the store, not an asset_sensor on rule_versions: an asset_sensor sees only
    # the newest materialization since its cursor (two ingests in one interval lost the October
    # re-plan, only December's was requested), and nothing at all of rule versions whose ingest run
    # failed after writing them (no materialization, or none with its metadata). The store is the
    # truth: the cursor is the highest rule version id handled, and each tick handles every version
    # stored after it, whichever run or command wrote it.
    @dg.sensor(name="replan_on_revision", job=plan_job, default_status=dg.DefaultSensorStatus.RUNNING,
               minimum_interval_seconds=30,
               description="Re-plans exactly the due months and rules touched by every rule version stored "
                           "since its last tick, whatever wrote it: several ingest runs, one that failed after "
                           "writing, `source accept`.")
    def replan_on_revision(context: dg.SensorEvaluationContext, store: StoreResource, settings: SettingsResource,
                           clock: ClockResource):
        since = handled_version_id(context.cursor, context.log)
        engine = store.engine()
        top = max_version_id(engine)
        if top < since:
            # Ids below the cursor again: the store was replaced or restored from a backup. Skipping
            # up to the old cursor would leave the new store's versions unplanned.
            context.log.error(f"replan_on_revision: the store's highest rule version id {top} is below the "
                              f"handled {since} (store replaced or restored?): every stored rule version is "
                              "handled again")
            since = 0
        cursor = revision_cursor(top)
        if top == since:
            return dg.SensorResult(skip_reason=f"no rule version stored after id {since}", cursor=cursor)
        # Bounded by ``top``: a version committed while this tick runs is the next tick's, and is
        # not requested twice under two run keys.
        months = affected_partitions(engine, settings.load(), since, clock.now(), until_version_id=top)
        existing = set(partitions_def.get_partition_keys())
        missing = [m for m in months if m not in existing]
        if missing:
            context.log.error(f"rule versions {since + 1}..{top} touch months without a plan partition: {missing}")
        wanted = [m for m in months if m in existing]
        if not wanted:
            return dg.SensorResult(skip_reason=f"rule versions {since + 1}..{top} change no planned month",
                                   cursor=cursor)
        # The run key names the versions handled: a tick evaluated again from the same cursor (its
        # cursor update lost) requests nothing twice, while a later revision of the same month is a
        # new key and is planned again.
        return dg.SensorResult(
            run_requests=[dg.RunRequest(run_key=f"rule_versions:{since + 1}-{top}:{m}", partition_key=m,
                                        tags=revision_tags(since + 1, top))
                          for m in wanted],
            cursor=cursor)

    return [plan_horizon_hourly], [replan_on_revision]
