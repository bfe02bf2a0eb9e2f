"""When a one-off rule is due, as one aware UTC instant (pure, no I/O).

Shared by planning's first-seen judgment (:mod:`~deadline_pipeline.plan.first_seen`) and ingest's
snapshot diff (:mod:`~deadline_pipeline.ingest.diff`), so both compute the instant exactly as
planning does (:func:`~deadline_pipeline.plan.occurrences.to_instant` in the zone from
:func:`~deadline_pipeline.timezones.resolve_zone`; a date-only rule is due at the end of that day).
"""

from __future__ import annotations

from datetime import datetime, tzinfo

from deadline_pipeline.plan.occurrences import to_instant
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.timezones import UnknownTimeZone, resolve_zone


def rule_zone(rule: RuleRecord) -> tzinfo | None:
    """The zone ``rule.tz`` resolves to, or ``None`` for a floating rule or an unknown zone."""
    if rule.tz is None:
        return None
    try:
        return resolve_zone(rule.tz)
    except UnknownTimeZone:
        return None


def instant_of(rule: RuleRecord) -> datetime | None:
    """The aware UTC instant a one-off rule is due, or ``None`` for a recurring rule, a floating rule
    or a rule whose zone is unknown. Raises ``ValueError`` for an unreadable ``start``."""
    if rule.rrule or rule.rdates:
        return None
    zone = rule_zone(rule)
    if zone is None:
        return None
    return to_instant(rule.start_local(), zone)
