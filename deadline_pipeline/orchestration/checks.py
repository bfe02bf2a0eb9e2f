"""Dagster asset checks, thin wrappers around ``deadline_pipeline.watch.checks``."""

from __future__ import annotations

from datetime import timedelta

import dagster as dg

from deadline_pipeline.orchestration.assets import ALERTS
from deadline_pipeline.orchestration.resources import ClockResource, SettingsResource, StoreResource
from deadline_pipeline.watch.checks import CheckOutcome, alerts_reconciled


def to_result(out: CheckOutcome, severity=dg.AssetCheckSeverity.ERROR) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=out.passed, severity=severity,
        metadata={"count": out.count, "summary": out.summary,
                  "offenders": dg.MetadataValue.json(out.offenders)},
        description=out.summary,
    )


@dg.asset_check(asset=ALERTS, name="alerts_reconciled",
                description="Alerts due longer ago than the grace window must be delivered, escalated or cancelled.")
def alerts_reconciled_check(store: StoreResource, settings: SettingsResource, clock: ClockResource):
    grace = timedelta(minutes=settings.load().watch.grace_minutes)
    return to_result(alerts_reconciled(store.engine(), clock.now(), grace))


ALL_CHECKS = [alerts_reconciled_check]
