"""Dagster wiring of delivery: the sweep job and the sensor that starts it when anything is due."""

from __future__ import annotations

import dagster as dg

from deadline_pipeline.deliver.sweep import lease_owner, sweep
from deadline_pipeline.orchestration.resources import ClockResource, SettingsResource, StoreResource
from deadline_pipeline.store import health
from deadline_pipeline.store.delivery import count_claimable

DELIVER_JOB = "deliver_job"


@dg.op(tags={"stage": "deliver"}, description="Claim due alerts with a lease, send them, record each result.")
def deliver_sweep(context, store: StoreResource, settings: SettingsResource, clock: ClockResource):
    cfg = settings.load()
    engine = store.engine()
    started = clock.now()
    out = sweep(engine, cfg, started, owner=lease_owner(context.run_id),
                clock=clock.now if not clock.frozen else None)
    finished = clock.now()
    with engine.begin() as conn:
        health.beat(conn, "deliver", started_at=started, completed_at=finished,
                    outcome="ok" if not out.escalated else "escalations",
                    detail=f"delivered {out.delivered}, failed {out.failed}, escalated {out.escalated}")
    late = sorted(out.lateness_seconds)
    p99 = late[min(len(late) - 1, int(len(late) * 0.99))] if late else 0.0
    for err in out.errors[:20]:
        context.log.warning(err)
    yield dg.AssetObservation(asset_key=dg.AssetKey("alerts"), metadata={
        "claimed": out.claimed, "sent": out.delivered, "failed": out.failed, "escalated": out.escalated,
        "lease_lost": out.lease_lost, "lateness_p99_seconds": float(p99),
    })
    yield dg.Output(None)


@dg.job(name=DELIVER_JOB, tags={"stage": "deliver"},
        description="One delivery sweep: every claimable alert, in leased batches, within a time budget.")
def deliver_job():
    deliver_sweep()


@dg.sensor(job=deliver_job, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Asks one indexed question — is any alert claimable now? — and starts a sweep.")
def deliver_sensor(context: dg.SensorEvaluationContext, store: StoreResource, clock: ClockResource):
    # A sweep already queued or running will pick everything up; piling runs on it adds nothing.
    active = context.instance.get_runs(
        filters=dg.RunsFilter(job_name=DELIVER_JOB, statuses=[dg.DagsterRunStatus.QUEUED,
                                                              dg.DagsterRunStatus.NOT_STARTED,
                                                              dg.DagsterRunStatus.STARTING]),
        limit=1,
    )
    if active:
        return dg.SkipReason(f"a delivery run is already waiting to start ({active[0].run_id})")
    with store.engine().connect() as conn:
        due = count_claimable(conn, clock.now())
    if not due:
        return dg.SkipReason("no alert is claimable now")
    return dg.RunRequest(tags={"claimable_at_request": str(due)})
