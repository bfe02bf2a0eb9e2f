"""Dagster asset checks, thin wrappers around :mod:`deadline_pipeline.watch.checks`.

They run on their own schedule (the checks-only job ``watch_checks_job``) as well as after
materializations. Severity ERROR wherever a red check means a reminder may be missed; WARN for
escalations a human has not yet taken over (the miss itself was already announced).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import dagster as dg

from deadline_pipeline.orchestration.assets import ALERTS, OBLIGATIONS
from deadline_pipeline.orchestration.resources import ClockResource, SettingsResource, StoreResource
from deadline_pipeline.watch import checks as w


def to_result(out: w.CheckOutcome, severity=dg.AssetCheckSeverity.ERROR,
              evaluated_at: datetime | None = None) -> dg.AssetCheckResult:
    """The Dagster result of one evaluation. ``evaluated_at`` (aware UTC): the instant the check
    judged, recorded as ``evaluated_at`` metadata; under ``--as-of`` it differs from the event's own
    time, which is what Dagster's history table and plots show."""
    meta = {"count": out.count, "summary": out.summary, "offenders": dg.MetadataValue.json(out.offenders),
            **out.metadata}
    if evaluated_at is not None:
        meta["evaluated_at"] = dg.MetadataValue.timestamp(evaluated_at)
    return dg.AssetCheckResult(passed=out.passed, severity=severity, metadata=meta, description=out.summary)


@dg.asset_check(asset=ALERTS, name="alerts_reconciled",
                description="Alerts due longer ago than the grace window must be delivered, escalated or cancelled, "
                            "and every delivered alert must have its 'sent' receipt.")
def alerts_reconciled_check(store: StoreResource, settings: SettingsResource, clock: ClockResource):
    grace = timedelta(minutes=settings.load().watch.grace_minutes)
    now = clock.now()
    return to_result(w.alerts_reconciled(store.engine(), now, grace), evaluated_at=now)


@dg.asset_check(asset=ALERTS, name="sweep_alive",
                description="The delivery sweep completed, or found nothing to claim, within its interval plus grace.")
def sweep_alive_check(store: StoreResource, settings: SettingsResource, clock: ClockResource):
    cfg, now = settings.load().watch, clock.now()
    return to_result(w.sweep_alive(store.engine(), now, timedelta(minutes=cfg.sweep_interval_minutes),
                                   timedelta(minutes=cfg.heartbeat_grace_minutes)), evaluated_at=now)


@dg.asset_check(asset=OBLIGATIONS, name="horizon_planned",
                description="Planning ran within its interval and every occurrence a subscription selects "
                            "ahead has its obligation.")
def horizon_planned_check(store: StoreResource, settings: SettingsResource, clock: ClockResource):
    cfg, now = settings.load(), clock.now()
    return to_result(w.horizon_planned(store.engine(), cfg, now,
                                       timedelta(minutes=cfg.watch.plan_interval_minutes),
                                       timedelta(days=cfg.plan.horizon_days)), evaluated_at=now)


@dg.asset_check(asset=OBLIGATIONS, name="plan_complete",
                description="The last planning run planned every reminder asked for: no subscriber without the "
                            "contact its channel needs, no kinds matching no rule, no rule refused by the planner "
                            "or cut at the occurrence cap.")
def plan_complete_check(store: StoreResource, clock: ClockResource):
    now = clock.now()
    return to_result(w.plan_complete(store.engine(), now), evaluated_at=now)


@dg.asset_check(asset=ALERTS, name="fanout_complete",
                description="Every obligation due in the horizon has one reminder per offset and usable channel.")
def fanout_complete_check(store: StoreResource, settings: SettingsResource, clock: ClockResource):
    cfg = settings.load()
    types = {name: ch.type for name, ch in cfg.channels.items()}
    now = clock.now()
    return to_result(w.fanout_complete(store.engine(), now, timedelta(days=cfg.plan.horizon_days), types),
                     evaluated_at=now)


@dg.asset_check(asset=ALERTS, name="reminders_owed",
                description="Every reminder owed by now, recomputed from the rule versions in force (not from the "
                            "outbox), was sent for its due instant or has a recorded reason.")
def reminders_owed_check(store: StoreResource, settings: SettingsResource, clock: ClockResource):
    from deadline_pipeline.watch.reconcile import reminders_owed

    cfg = settings.load()
    now = clock.now()
    return to_result(reminders_owed(store.engine(), cfg, now, timedelta(minutes=cfg.watch.grace_minutes)),
                     evaluated_at=now)


@dg.asset_check(asset=ALERTS, name="escalations_acknowledged",
                description="Escalated alerts a human has not acknowledged yet (deadline-pipeline acknowledge).")
def escalations_acknowledged_check(store: StoreResource, clock: ClockResource):
    now = clock.now()
    return to_result(w.escalations_acknowledged(store.engine(), now), dg.AssetCheckSeverity.WARN, evaluated_at=now)


@dg.asset_check(asset=OBLIGATIONS, name="time_data_agrees",
                description="Every process serving the store (planner, sweep, checks) computes instants with the same "
                            "IANA time-zone data version, and the horizon was planned with the version in force.")
def time_data_agrees_check(store: StoreResource, settings: SettingsResource, clock: ClockResource):
    from datetime import UTC, datetime

    cfg = settings.load()
    # Recent by the real clock: only live heartbeats count (a replay's prove nothing about the
    # processes serving the store), and live means recent now, whatever instant a replay judges.
    return to_result(w.time_data_agrees(store.engine(), datetime.now(UTC),
                                        timedelta(minutes=cfg.watch.plan_interval_minutes)),
                     evaluated_at=clock.now())


@dg.asset_check(asset=ALERTS, name="clock_agrees",
                description="This host's clock, by which the sweep judges what is due and the checks judge ages, is "
                            "within 2 minutes of the store's, and so was the clock of every process whose "
                            "heartbeat was written in the last plan interval.")
def clock_agrees_check(store: StoreResource, settings: SettingsResource, clock: ClockResource):
    from datetime import UTC, datetime

    # The real clock even in a replay: the host's clock is what is judged, not the instant replayed.
    # The heartbeats' window is the one time_data_agrees uses: the processes serving the store now.
    window = timedelta(minutes=settings.load().watch.plan_interval_minutes)
    return to_result(w.clock_agrees(store.engine(), datetime.now(UTC), window=window), evaluated_at=clock.now())


ALL_CHECKS = [alerts_reconciled_check, sweep_alive_check, horizon_planned_check, plan_complete_check,
              time_data_agrees_check, clock_agrees_check,
              fanout_complete_check,
              reminders_owed_check, escalations_acknowledged_check]
