"""The plan's partitions: due months, and the range that covers the planning horizon."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

from deadline_pipeline.plan.occurrences import GRACE

# Obligations and alerts are partitioned by due month (UTC); fourteen months ahead of the current one
# cover the 366-day horizon from any day of the month.
PLAN_PARTITIONS = dg.MonthlyPartitionsDefinition(start_date="2019-01-01", end_offset=14)


def horizon_range(now: datetime, horizon_days: int = 366) -> tuple[str, str]:
    """First and last partition keys (``YYYY-MM-01``) covering ``[now - grace, now + horizon]``,
    clamped to the partitions that exist."""
    keys = PLAN_PARTITIONS.get_partition_keys()
    first = f"{(now - GRACE).astimezone(UTC):%Y-%m}-01"
    last = f"{(now + timedelta(days=horizon_days)).astimezone(UTC):%Y-%m}-01"
    inside = [k for k in keys if first <= k <= last]
    if not inside:
        raise ValueError(f"no plan partition covers {first}..{last}; partitions run {keys[0]}..{keys[-1]}")
    return inside[0], inside[-1]


def range_tags(first: str, last: str) -> dict[str, str]:
    """Run tags that make one run plan a whole range of months (single-run backfill policy)."""
    return {ASSET_PARTITION_RANGE_START_TAG: first, ASSET_PARTITION_RANGE_END_TAG: last}
