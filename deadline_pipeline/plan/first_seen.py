"""A rule first seen after its deadline had passed: published late by the source, or missed while
nothing was fetched?

The incident: a source published a deadline, and its instant passed while the pipeline was down or
the source could not be fetched. On the next fetch the rule was first seen with every reminder in
the past: nothing was planned and every check stayed green. Escalating every rule first seen after
its instant was tried and reverted: it paged for the PWC ismir20 abstract deadline, due
2020-04-11T11:59:59Z and published by the source only on 2020-04-17, while it was fetched daily.
The fetch log (``fetch_log``, migration 0015) tells the two apart. For a one-off rule whose first
version came into force (``first_seen``) after its due instant ``I``:

* ``late_published``: a fetch within the source's freshness window before ``I`` parsed content
  without the rule — the source was watched and did not have it. A note (logged, counted), no page.
* ``missed_unwatched``: the last fetch before ``I`` that parsed content is older than the freshness
  window: the source was stale or the pipeline down across ``I``. Escalated as a possible miss
  (planning leaves the reminder the delivery sweep escalates, as for a deadline moved into the past).
* ``not_watched``: no fetch before ``I`` is logged: the source's very first fetch (a new
  installation) or a store whose fetch log starts after ``I`` (upgraded to 0015 since). There is no
  evidence the pipeline was running, so nothing is paged — otherwise every new installation pages
  for every past deadline of every source. Logged at INFO and counted.

Recurring rules are not judged here: their occurrences still ahead are planned as usual.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection

from deadline_pipeline.instants import instant_text
from deadline_pipeline.plan.rule_instant import instant_of
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.store import sources as sql

log = logging.getLogger(__name__)

LATE_PUBLISHED = "late_published"
MISSED_UNWATCHED = "missed_unwatched"
NOT_WATCHED = "not_watched"

# How long after a rule is first seen planning and the checks still judge it. Planning runs right
# after ingest; a week covers a planning outage without re-judging a source's whole history each run.
LOOKBACK = timedelta(days=7)


@dataclass(frozen=True)
class FirstSeenPassed:
    """The judgment of one rule first seen after its due instant. Instants aware UTC; ``last_fetch``:
    the last fetch before ``instant`` whose content parsed (None: none logged), ``next_fetch``: the
    first successful one at or after it (the gap's end)."""

    source: str
    rule_id: str
    version: int
    instant: datetime
    first_seen: datetime
    verdict: str
    last_fetch: datetime | None
    next_fetch: datetime | None

    def describe(self) -> str:
        """One line for logs, notes and escalation reasons."""
        due = f"deadline {self.rule_id} at {instant_text(self.instant)}"
        if self.verdict == MISSED_UNWATCHED:
            return (f"no successful fetch of source {self.source} between {instant_text(self.last_fetch)} and "
                    f"{instant_text(self.next_fetch or self.first_seen)}; {due} passed in that gap")
        if self.verdict == LATE_PUBLISHED:
            return (f"source {self.source} published {due} late: its fetch at {instant_text(self.last_fetch)} did "
                    f"not have it, and it was first seen at {instant_text(self.first_seen)}")
        return (f"{due} was already past when source {self.source} was first watched "
                f"(first seen {instant_text(self.first_seen)}): history, not paged")


def passed_instant(rule: RuleRecord, first_seen: datetime) -> datetime | None:
    """The due instant (aware UTC) of a one-off rule already past at ``first_seen``, else None (a
    recurring, floating or still-ahead rule; an unreadable start is judged by planning, not here)."""
    try:
        instant = instant_of(rule)
    except ValueError:
        return None
    return instant if instant is not None and instant < first_seen else None


def verdict(instant: datetime, last_fetch: datetime | None, window: timedelta) -> str:
    """:data:`NOT_WATCHED` without a fetch before ``instant``; :data:`LATE_PUBLISHED` when that fetch
    is within ``window`` (the source's freshness window) before it; else :data:`MISSED_UNWATCHED`."""
    if last_fetch is None:
        return NOT_WATCHED
    return LATE_PUBLISHED if instant - last_fetch <= window else MISSED_UNWATCHED


def judge_source(conn: Connection, source_id: int, source: str, window: timedelta,
                 since: datetime) -> list[FirstSeenPassed]:
    """Every rule of ``source`` first seen at or after ``since`` (aware UTC) whose due instant had
    passed by then, judged from the fetch log (module docstring). Reads only."""
    out = []
    for row in sql.first_versions_since(conn, source_id, since):
        instant = passed_instant(RuleRecord.from_payload(row.payload), row.valid_from)
        if instant is None:
            continue
        # The snapshot that brought the rule is no evidence of its absence, whenever it was fetched.
        last = sql.last_watching_fetch_before(conn, source_id, instant, without_snapshot=row.snapshot_id)
        after = sql.first_fetch_since(conn, source_id, instant)
        out.append(FirstSeenPassed(source, row.rule_id, row.version, instant, row.valid_from,
                                   verdict(instant, last, window), last, after))
    return out


def log_judgments(judged: list[FirstSeenPassed]) -> None:
    """Log each judgment: a possible miss at ERROR, a late publication at WARNING, history at INFO."""
    level = {MISSED_UNWATCHED: logging.ERROR, LATE_PUBLISHED: logging.WARNING, NOT_WATCHED: logging.INFO}
    for j in judged:
        log.log(level[j.verdict], "first seen after its deadline: %s", j.describe())
