"""Dagster wiring that makes a change of the time data in force a revision: the sensor that re-plans
the whole horizon when the zone data, the holiday calendars or the recurrence engine planning last
used are not the ones this process reads.

Why a sensor and not only the hourly horizon schedule: after a deploy that brings newer zone data
(a ``tzdata`` upgrade, or a newer system folder under ``DEADLINE_ZONE_DATA=newest``), every reminder
in a zone whose rules changed sits at the old instant until the next horizon run; a ``PT0S``
reminder due in that hour arrives an hour late. A ``holidays`` upgrade that adds or moves a holiday
does the same to a business-day-rolled deadline: its reminders stay a working day off; so does a
python-dateutil upgrade that expands an RRULE to other dates. The sensor
asks one cheap question — which versions did the last horizon plan record in its heartbeat? — and
requests the horizon at once.
"""

from __future__ import annotations

import logging

import dagster as dg

from deadline_pipeline.orchestration.partitions import PartitionRangeError, horizon_range, range_tags
from deadline_pipeline.orchestration.resources import ClockResource, StoreResource
from deadline_pipeline.store import health
from deadline_pipeline.watch.checks import time_data_change, time_data_in_force

log = logging.getLogger(__name__)


def build_time_data_sensor(plan_job, partitions_def: dg.MonthlyPartitionsDefinition, horizon_days: int = 366):
    """The ``replan_on_time_data`` sensor for ``plan_job``: one run of the whole horizon when the
    ``plan`` heartbeat recorded another IANA zone-data version, ``holidays`` release or recurrence
    engine than the ones in force (run key per change and per plan that recorded it, so a change is re-planned once, and
    again after a rollback). The cursor holds the change requested: it is not requested again until the
    plan and the versions in force have agreed once, so planning processes on other time data than the
    sensor's (time_data_agrees red) get one re-plan, not one a minute."""

    @dg.sensor(job=plan_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
               name="replan_on_time_data",
               description="When the time-zone data, the holiday calendars or the recurrence engine in force differ "
                           "from the versions the last horizon plan used, re-plan the whole horizon (moved "
                           "reminders get corrections naming the change).")
    def replan_on_time_data(context: dg.SensorEvaluationContext, store: StoreResource, clock: ClockResource):
        in_force = time_data_in_force()
        with store.engine().connect() as conn:
            planned, planned_at = health.plan_time_data(conn)
        if not any(planned):
            return dg.SkipReason("no horizon plan has recorded its time data yet")
        planned_zone, planned_calendar, planned_engine = planned
        changes = time_data_change(planned, in_force)
        # The cursor: "<agreements seen>|<change requested since the last agreement>".
        seen_text, _, requested = (context.cursor or "0|").partition("|")
        agreements = int(seen_text) if seen_text.isdigit() else 0
        if not changes:
            return dg.SensorResult(skip_reason=f"the horizon was planned with IANA {planned_zone or in_force[0]}, "
                                               f"{planned_calendar or in_force[1]} and "
                                               f"{planned_engine or in_force[2]}, the versions in force",
                                   cursor=f"{agreements + 1 if requested else agreements}|")
        change = "; ".join(changes.values())
        if requested == change:
            # Requested once for this change already. Requested again on every evaluation until the
            # plan recorded the new data, each re-plan by processes on other time data than this
            # sensor's (a code server not restarted after a tzdata upgrade, another DEADLINE_ZONE_DATA)
            # wrote a new heartbeat and so a new run key: a full horizon re-plan every minute.
            return dg.SkipReason(f"a re-plan for {change} was requested; the last horizon plan still records IANA "
                                 f"{planned_zone}, {planned_calendar} and {planned_engine}: either that run has not "
                                 "completed, or the planning processes use other time data than this sensor's "
                                 "(time_data_agrees is red then)")
        try:
            first, last = horizon_range(clock.now(), horizon_days, partitions_def)
        except PartitionRangeError as exc:
            context.log.error(f"time data changed ({change}) but the horizon cannot be re-planned: {exc}")
            return dg.SkipReason(str(exc))
        context.log.warning(f"time data changed since the horizon was planned ({change}); "
                            f"re-planning {first[:7]}..{last[:7]}")
        # Keyed by the agreements seen and the plan that recorded the old version too: Dagster never
        # reuses a run key, so a key of the versions alone skipped the second 2025b → 2026f after an
        # upgrade, a rollback and the same upgrade again.
        stamp = planned_at.isoformat() if planned_at else "-"
        return dg.SensorResult(run_requests=[dg.RunRequest(run_key=f"time-data:{change}#{agreements}@{stamp}",
                                                           tags=range_tags(first, last))],
                               cursor=f"{agreements}|{change}")

    return replan_on_time_data
