"""The plan's partitions: due months (UTC) from the first month with data to the end of the horizon,
and the range of partition keys that covers the planning horizon at an instant.

Where the partitions start: ``plan.first_month`` when configured (``YYYY-MM``), else the month of the
first planning run recorded in the store (the ``plan`` heartbeat's first completion), else the month
of the run being prepared. A fixed start years before any data made the catalog show almost every
month missing and "Materialize all" target a century of empty months.

Where they end: far enough ahead of the real clock for the configured horizon at any instant of any
month the clock reads while the code location stays loaded, and, for a replay
(``--as-of``), for the horizon after that instant, so no month a run must plan lacks its partition.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import dagster as dg
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    PARTITION_NAME_TAG,
)

from deadline_pipeline.instants import instant_text
from deadline_pipeline.plan.occurrences import GRACE

log = logging.getLogger(__name__)

# A replay further ahead than this is refused: Dagster enumerates monthly partitions one by one, and
# nobody plans reminders a century ahead.
MAX_YEARS_AHEAD = 100


class PartitionRangeError(ValueError):
    """An instant whose planning horizon the plan partitions cannot cover; the message says why and
    what to change."""


def month_key(instant: datetime) -> str:
    """``YYYY-MM-01`` of the UTC month containing ``instant`` (aware)."""
    return f"{instant.astimezone(UTC):%Y-%m}-01"


def _months_between(first: str, last: str) -> int:
    return (int(last[:4]) - int(first[:4])) * 12 + int(last[5:7]) - int(first[5:7])


def first_plan_month(db_url: str | None, clock_now: datetime) -> str:
    """The default start: the month (UTC) of the first completed planning run in the store, or of
    ``clock_now`` when there was none (both less the 15-minute planning grace, whose occurrences a run
    still plans). ``db_url``: the store (None: ``$DEADLINE_DB_URL`` or the embedded file). A store
    that cannot be read falls back to ``clock_now``, logged at WARNING: the code location still loads."""
    from deadline_pipeline.store.db import get_engine
    from deadline_pipeline.store.health import first_plan_completion

    first = None
    try:
        with get_engine(db_url).connect() as conn:
            first = first_plan_completion(conn)
    except Exception as exc:  # the partitions still load; the start is then this run's month
        log.warning("plan partitions: cannot read the first planning run from the store (%s); "
                    "starting at the current month", exc)
    start = min(first, clock_now) if first is not None else clock_now
    return month_key(start - GRACE)


def months_ahead(horizon_days: int) -> int:
    """The most months by which the month (UTC) of ``now + horizon_days`` can follow the month of
    ``now``, over every instant ``now``: reached at a month's last instant, and judged over four
    years of months so that every month length and a leap day are among them (366 days from 31
    January 2027 end in February 2028, 13 months on; from 10 January, in January, 12 on)."""
    worst = 0
    for i in range(48):
        year, month = 2024 + i // 12, i % 12 + 1
        start = datetime(year, month, 1, tzinfo=UTC)
        last_instant = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC) - timedelta(microseconds=1)
        worst = max(worst, _months_between(month_key(start), month_key(last_instant + timedelta(days=horizon_days))))
    return worst


def plan_partitions(first_month: str, horizon_days: int = 366, through: datetime | None = None,
                    real_now: datetime | None = None) -> dg.MonthlyPartitionsDefinition:
    """Monthly partitions from ``first_month`` (``YYYY-MM-01``) to :func:`months_ahead` months after
    the current month of the real clock (moving with it: whatever instant of whichever month the
    clock reads, the month of ``now + horizon_days`` has its partition), extended to the month of
    ``through + horizon_days`` when a replay's instant is later. ``real_now``: the load instant
    (default the real clock). Raises :class:`PartitionRangeError` for ``through`` more than
    :data:`MAX_YEARS_AHEAD` years ahead."""
    real_now = real_now or datetime.now(UTC)
    # end_offset counts months after the last complete one (the month before the current one), and
    # Dagster applies it to the month of the instant it evaluates at, not to the load instant: a
    # code location loaded on 10 January (12 months ahead then) refused the hourly horizon plan all
    # day on 31 January, whose horizon ends in the 13th month (PartitionRangeError in every tick).
    current = month_key(real_now)
    ahead = months_ahead(horizon_days)
    if through is not None:
        if through > real_now + timedelta(days=365 * MAX_YEARS_AHEAD):
            raise PartitionRangeError(f"{instant_text(through)} is more than {MAX_YEARS_AHEAD} years ahead; plan "
                                      "partitions are not kept that far")
        ahead = max(ahead, _months_between(current, month_key(through + timedelta(days=horizon_days))))
    return dg.MonthlyPartitionsDefinition(start_date=first_month, end_offset=ahead + 1)


def horizon_range(now: datetime, horizon_days: int = 366,
                  partitions_def: dg.MonthlyPartitionsDefinition | None = None) -> tuple[str, str]:
    """First and last partition keys (``YYYY-MM-01``) covering ``[now - grace, now + horizon]``.

    With ``partitions_def``, raises :class:`PartitionRangeError` when part of that range has no
    partition (naming the range, the partitions and ``plan.first_month``): planning only part of the
    horizon would leave months unplanned without a red check."""
    first = month_key(now - GRACE)
    last = month_key(now + timedelta(days=horizon_days))
    if partitions_def is not None:
        start = partitions_def.get_first_partition_key()
        end = partitions_def.get_last_partition_key()
        if start is None or end is None or first < start or last > end:
            raise PartitionRangeError(
                f"the planning horizon at {instant_text(now)} needs months {first[:7]}..{last[:7]}, but the plan "
                f"partitions run {(start or '-')[:7]}..{(end or '-')[:7]}; set plan.first_month (YYYY-MM) no later "
                f"than {first[:7]} to replay that far back")
    return first, last


def range_tags(first: str, last: str) -> dict[str, str]:
    """Run tags that make one run plan a whole range of months (single-run backfill policy)."""
    return {ASSET_PARTITION_RANGE_START_TAG: first, ASSET_PARTITION_RANGE_END_TAG: last}


# A run the revision sensor requested carries the rule versions it re-plans: the run plans only the
# rules they changed (see :mod:`deadline_pipeline.plan.scope`). A run without it plans every rule.
def run_scope(tags: Mapping[str, str]) -> tuple[str, str] | None:
    """``(first, last)`` partition keys a run ran, from its tags (``dagster/partition``, or the
    single-run range tags of :func:`range_tags` that a backfill or the horizon schedule sets), or
    ``None`` for no partition."""
    if PARTITION_NAME_TAG in tags:
        return tags[PARTITION_NAME_TAG], tags[PARTITION_NAME_TAG]
    if ASSET_PARTITION_RANGE_START_TAG in tags and ASSET_PARTITION_RANGE_END_TAG in tags:
        return tags[ASSET_PARTITION_RANGE_START_TAG], tags[ASSET_PARTITION_RANGE_END_TAG]
    return None


REVISION_TAG = "deadline_pipeline/rule_versions"


def revision_tags(first_version_id: int, last_version_id: int) -> dict[str, str]:
    """The run tag of a revision re-plan of rule versions ``first..last`` (``rule_versions.id``, both
    included): ``{REVISION_TAG: "first-last"}``."""
    return {REVISION_TAG: f"{first_version_id}-{last_version_id}"}


def revision_range(tags: dict[str, str]) -> tuple[int, int] | None:
    """``(first, last)`` rule version ids of a run's :data:`REVISION_TAG`, or ``None`` without the tag.
    Raises ``ValueError`` naming the tag and its value when it is not ``first-last`` with
    ``1 <= first <= last`` (a hand-edited tag must fail the run, not plan a guessed scope)."""
    value = tags.get(REVISION_TAG)
    if value is None:
        return None
    # ASCII digits only ('١-٢' is 1-2 to int()), and ids the store's BIGINT can hold: a larger one
    # failed deep inside the driver (SQLite: "Python int too large to convert to SQLite INTEGER").
    found = re.fullmatch(r"(\d{1,19})-(\d{1,19})", value, re.ASCII)
    if found:
        first, last = int(found[1]), int(found[2])
        if 1 <= first <= last <= _MAX_VERSION_ID:
            return first, last
    raise ValueError(f"run tag {REVISION_TAG}={value!r}: expected 'FIRST-LAST', two rule version ids with "
                     f"1 <= FIRST <= LAST <= {_MAX_VERSION_ID}; remove the tag to plan every rule")


# rule_versions.id is a BIGINT.
_MAX_VERSION_ID = 2**63 - 1
