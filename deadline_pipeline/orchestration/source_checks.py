"""Dagster asset checks on each source's confirmed snapshot (``snapshot/<name>``, a materialized
asset, so the graph node shows their pass/fail): ``source_fresh``, ``source_not_quarantined`` and
``rules_complete``.

Thin wrappers around :mod:`deadline_pipeline.watch.sources`. Add them to the Definitions with
``asset_checks=[*ALL_CHECKS, *SOURCE_CHECKS_FACTORY(cfg)]``.
"""

from __future__ import annotations

import dagster as dg

from deadline_pipeline.config import DeadlinesConfig, SourceConfig
from deadline_pipeline.orchestration.assets import snapshot_key
from deadline_pipeline.orchestration.resources import ClockResource, StoreResource
from deadline_pipeline.watch.sources import (
    SourceCheckOutcome,
    rules_complete,
    source_fresh,
    source_not_quarantined,
)
from deadline_pipeline.wording import human_duration


def _result(out: SourceCheckOutcome, evaluated_at=None) -> dg.AssetCheckResult:
    meta = {**{k: v for k, v in out.metadata.items() if v is not None}, "summary": out.summary}
    if evaluated_at is not None:  # the instant judged (differs from the event's time under --as-of)
        meta["evaluated_at"] = dg.MetadataValue.timestamp(evaluated_at)
    return dg.AssetCheckResult(passed=out.passed, severity=dg.AssetCheckSeverity.ERROR, description=out.summary,
                               metadata=meta)


def _checks_for(src: SourceConfig) -> list[dg.AssetChecksDefinition]:
    key = snapshot_key(src.name)
    window = src.freshness_window

    @dg.asset_check(asset=key, name="source_fresh", blocking=False,
                    description=f"Source '{src.name}' was fresh within {human_duration(window)} and its last "
                                "fetch/parse worked.")
    def fresh(store: StoreResource, clock: ClockResource) -> dg.AssetCheckResult:
        now = clock.now()
        return _result(source_fresh(store.engine(), src.name, now, window), evaluated_at=now)

    @dg.asset_check(asset=key, name="source_not_quarantined", blocking=False,
                    description=f"Source '{src.name}' has no quarantined snapshot waiting for a human.")
    def not_quarantined(store: StoreResource, clock: ClockResource) -> dg.AssetCheckResult:
        return _result(source_not_quarantined(store.engine(), src.name), evaluated_at=clock.now())

    @dg.asset_check(asset=key, name="rules_complete", blocking=False,
                    description=f"Source '{src.name}''s latest snapshot skipped no record (or a human accepted it).")
    def complete(store: StoreResource, clock: ClockResource) -> dg.AssetCheckResult:
        return _result(rules_complete(store.engine(), src.name), evaluated_at=clock.now())

    return [fresh, not_quarantined, complete]


def SOURCE_CHECKS_FACTORY(cfg: DeadlinesConfig) -> list[dg.AssetChecksDefinition]:  # noqa: N802 — named by the lead
    """Three ERROR-severity checks per configured source, evaluated against the store at the clock's now."""
    return [check for src in cfg.sources for check in _checks_for(src)]
