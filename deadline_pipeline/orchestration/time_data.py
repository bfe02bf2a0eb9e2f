"""Dagster wiring that makes a change of the zone data in force a revision: the sensor that re-plans
the whole horizon when the version planning last used is not the one this process reads.

Why a sensor and not only the hourly horizon schedule: after a deploy that brings newer zone data
(a ``tzdata`` upgrade, or a newer system folder under ``DEADLINE_ZONE_DATA=newest``), every reminder
in a zone whose rules changed sits at the old instant until the next horizon run; a ``PT0S``
reminder due in that hour arrives an hour late. The sensor asks one cheap question — which version
did the last horizon plan record in its heartbeat? — and requests the horizon at once.
"""

from __future__ import annotations

import logging

import dagster as dg

from deadline_pipeline import zone_data
from deadline_pipeline.orchestration.partitions import PartitionRangeError, horizon_range, range_tags
from deadline_pipeline.orchestration.resources import ClockResource, StoreResource
from deadline_pipeline.store import health

log = logging.getLogger(__name__)


def build_time_data_sensor(plan_job, partitions_def: dg.MonthlyPartitionsDefinition, horizon_days: int = 366):
    """The ``replan_on_zone_data`` sensor for ``plan_job``: one run of the whole horizon when the
    ``plan`` heartbeat recorded another IANA version than the one in force (run key per change and
    per plan that recorded it, so a change is re-planned once, and again after a rollback)."""

    @dg.sensor(job=plan_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
               name="replan_on_zone_data",
               description="When the time-zone data in force differs from the version the last horizon plan "
                           "used, re-plan the whole horizon (moved reminders get corrections naming the change).")
    def replan_on_zone_data(context: dg.SensorEvaluationContext, store: StoreResource, clock: ClockResource):
        in_force = zone_data.version()
        with store.engine().connect() as conn:
            planned_with, planned_at = health.plan_zone_data(conn)
        if planned_with is None or planned_with == in_force:
            return dg.SkipReason(f"the horizon was planned with IANA {planned_with or in_force}, the version in force"
                                 if planned_with else "no horizon plan has recorded its zone data yet")
        try:
            first, last = horizon_range(clock.now(), horizon_days, partitions_def)
        except PartitionRangeError as exc:
            context.log.error(f"zone data changed (IANA {planned_with} → {in_force}) but the horizon cannot be "
                              f"re-planned: {exc}")
            return dg.SkipReason(str(exc))
        context.log.warning(f"zone data changed: the horizon was planned with IANA {planned_with}, IANA {in_force} is "
                            f"in force; re-planning {first[:7]}..{last[:7]}")
        # Keyed by the plan that recorded the old version too: Dagster never reuses a run key, so a
        # key of the versions alone skipped the second 2025b → 2026f after an upgrade, a rollback
        # and the same upgrade again.
        stamp = planned_at.isoformat() if planned_at else "-"
        return dg.RunRequest(run_key=f"zone-data:{planned_with}->{in_force}@{stamp}", tags=range_tags(first, last))

    return replan_on_zone_data
