"""Planning as a pure function: (subscription target, active rules, now) → obligations and alerts.

No database and no Dagster here, so every rule of planning is testable on its own.
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from deadline_pipeline.plan.keys import alert_dedup_key, obligation_key
from deadline_pipeline.plan.occurrences import HORIZON, expand, window
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.timezones import UnknownTimeZone, resolve_zone

log = logging.getLogger(__name__)

ONCE = "once"  # the period of a one-off rule: its identity survives a moved due time


@dataclass(frozen=True)
class Target:
    """One active subscription of one subscriber to one source."""

    subscriber_id: int
    subscriber: str  # external id
    tenant: str
    subscriber_tz: str
    source_id: int
    source: str
    source_tz: str | None
    rule_patterns: tuple[str, ...]
    offsets_seconds: tuple[int, ...]
    channels: tuple[str, ...]

    def wants(self, rule_id: str) -> bool:
        return any(fnmatch.fnmatchcase(rule_id, p) for p in self.rule_patterns)


@dataclass
class PlannedAlert:
    offset_seconds: int
    channel: str
    kind: str
    dedup_key: str
    send_at: datetime
    status: str = "pending"
    status_reason: str | None = None


@dataclass
class PlannedObligation:
    key: str
    tenant: str
    subscriber_id: int
    source_id: int
    rule_id: str
    rule_version: int
    period: str
    title: str
    due_at: datetime
    alerts: list[PlannedAlert] = field(default_factory=list)


@dataclass
class PlanProblem:
    source: str
    rule_id: str
    message: str


def fold_late(alerts: list[PlannedAlert], now: datetime) -> None:
    """Among reminders of one obligation and channel already past at planning time, keep only the
    most recent (it goes out at once); the others are marked ``skipped`` with the reason.

    Without this a new subscriber would get the 90-, 7- and 1-day reminders of one deadline at once.
    """
    by_channel: dict[str, list[PlannedAlert]] = {}
    for a in alerts:
        if a.kind == "reminder" and a.send_at <= now:
            by_channel.setdefault(a.channel, []).append(a)
    for late in by_channel.values():
        late.sort(key=lambda a: a.send_at)
        for a in late[:-1]:
            a.status = "skipped"
            a.status_reason = (f"late at planning: the reminder at offset {a.offset_seconds}s was already past "
                               "and a later one of the same deadline is sent instead")


def plan_target(target: Target, rules: list[tuple[int, RuleRecord]], now: datetime,
                horizon: timedelta = HORIZON) -> tuple[list[PlannedObligation], list[PlanProblem]]:
    """Obligations and alerts of one target for ``rules`` (``(version, record)`` pairs) due inside
    ``[now - 15 min, now + horizon]``; ``now`` is aware UTC.

    A rule that cannot be expanded (unknown zone, unreadable RRULE) is reported as a problem and
    skipped alone — it never stops the other rules.
    """
    lo, hi = window(now, horizon)
    out: list[PlannedObligation] = []
    problems: list[PlanProblem] = []
    for version, rule in rules:
        if not target.wants(rule.rule_id):
            continue
        try:
            # A floating rule is read in the source's declared zone, else the subscriber's.
            zone = resolve_zone(rule.tz or target.source_tz or target.subscriber_tz)
            occurrences = expand(rule, zone, after=lo, before=hi)
        except (UnknownTimeZone, ValueError) as exc:
            problems.append(PlanProblem(target.source, rule.rule_id, str(exc)))
            continue
        recurring = bool(rule.rrule or rule.rdates)
        for occ in occurrences:
            period = occ.period if recurring else ONCE
            key = obligation_key(target.tenant, target.subscriber, target.source, rule.rule_id, period)
            ob = PlannedObligation(key, target.tenant, target.subscriber_id, target.source_id, rule.rule_id,
                                   version, period, rule.title, occ.due_at)
            for offset in target.offsets_seconds:
                for channel in target.channels:
                    ob.alerts.append(PlannedAlert(
                        offset, channel, "reminder", alert_dedup_key(key, offset, channel, "reminder"),
                        occ.due_at + timedelta(seconds=offset),
                    ))
            fold_late(ob.alerts, now)
            out.append(ob)
    return out, problems
