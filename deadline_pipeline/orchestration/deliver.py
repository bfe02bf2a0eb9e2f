"""Dagster wiring of delivery: the sweep job and the sensor that starts it when anything is due."""

from __future__ import annotations

import logging

import dagster as dg

from deadline_pipeline.deliver.channels.environment import unresolved_env
from deadline_pipeline.deliver.outcome import SweepOutcome, sweep_beat_detail, sweep_beat_outcome
from deadline_pipeline.deliver.sweep import (
    SweepFailed,
    lease_owner,
    sweep,
    utcnow,
)
from deadline_pipeline.deliver.throttle import ThrottledLogger, log_first
from deadline_pipeline.orchestration.resources import ClockResource, SettingsResource, StoreResource
from deadline_pipeline.store import health
from deadline_pipeline.store.delivery import count_claimable

DELIVER_JOB = "deliver_job"

# The sensor runs in the long-lived daemon process, once per interval: during a database outage
# every evaluation fails the same way. First failure with traceback, then every 20th with a count.
_sensor_failures = ThrottledLogger(logging.getLogger(__name__), every=20)


@dg.op(tags={"stage": "deliver"}, description="Claim due alerts with a lease, send them, record each result.")
def deliver_sweep(context, store: StoreResource, settings: SettingsResource, clock: ClockResource):
    cfg = settings.load()
    problems = unresolved_env(cfg)
    if problems:
        # Sending would fail on every alert of the channel and escalate each one as permanent:
        # fail the run instead (red in the UI, paged once), with nothing claimed or escalated.
        raise dg.Failure(description="configuration error, nothing was sent: " + "; ".join(map(str, problems)),
                         metadata={"unresolved_env": [p.variable or p.key for p in problems]})
    engine = store.engine()
    started = clock.now()
    try:
        out = sweep(engine, cfg, started, owner=lease_owner(context.run_id),
                    # utcnow, not clock.now: it can be sent to the worker processes (delivery.processes).
                    clock=utcnow if not clock.frozen else None)
    except SweepFailed as exc:
        # The run fails (red in the UI, no "ok" heartbeat), and still says what was done before.
        if exc.outcome is not None:
            log_first(context.log.error, exc.outcome.errors, what="error(s)")
            yield _observation(exc.outcome)
        raise dg.Failure(description=f"delivery sweep failed: {exc}") from exc
    finished = clock.now()
    # This op's process writes the sweep's heartbeat, with its clock's offset against the store's
    # (clock_agrees reads it from any host). The worker processes of delivery.processes write none:
    # they are started on this host and read the same host clock, so this offset is theirs too.
    with engine.begin() as conn:
        health.beat(conn, "deliver", started_at=started, completed_at=finished, outcome=sweep_beat_outcome(out),
                    detail=sweep_beat_detail(out), replay=clock.frozen, host_clock=clock.now)
    log_first(context.log.warning, out.errors, what="error(s)")
    yield _observation(out)
    yield dg.Output(None)


def _observation(out: SweepOutcome) -> dg.AssetObservation:
    """The sweep's counts as an observation of the ``alerts`` asset (lateness p99 in seconds)."""
    late = sorted(out.lateness_seconds)
    p99 = late[min(len(late) - 1, int(len(late) * 0.99))] if late else 0.0
    return dg.AssetObservation(asset_key=dg.AssetKey("alerts"), metadata={
        "claimed": out.claimed, "sent": out.delivered, "failed": out.failed, "escalated": out.escalated,
        "lease_lost": out.lease_lost, "released": out.released, "recovered_unknown": out.recovered_unknown,
        "escalation_notices": out.escalation_notices,
        "escalation_notice_failures": out.escalation_notice_failures, "batches": out.batches,
        "batch_failures": out.batch_failures, "lateness_p99_seconds": float(p99),
        "retry_after_capped": out.retry_after_capped, "results_unstorable": out.results_unstorable,
        "processes": out.processes, "event_loop": out.event_loop,
    })


# max_runtime: with run monitoring on, a hung sweep (its budget is 240 s) is failed and retried
# instead of holding a delivery slot forever.
@dg.job(name=DELIVER_JOB, tags={"stage": "deliver", "dagster/max_runtime": "900"},
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
    try:
        with store.engine().connect() as conn:
            due = count_claimable(conn, clock.now())
    except Exception as exc:  # the store is down: the sensor must keep ticking and say so
        _sensor_failures.failure("deliver_sensor", f"deliver_sensor cannot ask the store: {exc}", exc)
        return dg.SkipReason(f"store unavailable ({type(exc).__name__}); "
                             f"{_sensor_failures.count('deliver_sensor')} failed evaluation(s) in a row")
    _sensor_failures.success("deliver_sensor")
    if not due:
        # Proof that the sweep is caught up: without it sweep_alive would go red in every quiet hour.
        now = clock.now()
        with store.engine().begin() as conn:
            health.beat(conn, "deliver:idle", started_at=now, completed_at=now, outcome="idle",
                        detail="nothing claimable", replay=clock.frozen, host_clock=clock.now)
        return dg.SkipReason("no alert is claimable now")
    return dg.RunRequest(tags={"claimable_at_request": str(due)})
