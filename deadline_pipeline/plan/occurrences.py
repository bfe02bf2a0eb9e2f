"""Expanding a rule into concrete due instants (pure; no I/O).

Expansion runs in the rule's *local wall-clock time* with python-dateutil and converts each
occurrence to UTC only at the end, so "15 April" stays 15 April across daylight-saving changes.

DST policy (RFC 5545 §3.3.5 and §3.8.5.3, "DTSTART … that does not exist"):

* a local time inside a spring-forward gap is shifted forward by the gap's length
  (02:30 on the night clocks jump 02:00→03:00 becomes 03:30);
* a local time repeated by a fall-back takes its first occurrence.

Python's ``zoneinfo`` with ``fold=0`` implements exactly this, which is why the conversion below is
a plain ``replace(tzinfo=zone)``.

Past occurrences are not replayed: expansion starts at ``now - GRACE`` (15 minutes).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo

from dateutil.rrule import rruleset, rrulestr

from deadline_pipeline.rules import END_OF_DAY, RuleRecord, format_local, parse_local

log = logging.getLogger(__name__)

GRACE = timedelta(minutes=15)
HORIZON = timedelta(days=366)
# A rule that yields more than this inside the horizon is a data bug (e.g. FREQ=SECONDLY); stop.
MAX_OCCURRENCES = 5000


@dataclass(frozen=True)
class Occurrence:
    """One occurrence: ``period`` is its identity (the original local start, ISO, unadjusted);
    ``due_at`` the aware UTC instant it is due."""

    period: str
    due_at: datetime


def to_instant(local: datetime, zone: tzinfo) -> datetime:
    """Local wall-clock time in ``zone`` → aware UTC, with the DST policy of this module."""
    return local.replace(tzinfo=zone, fold=0).astimezone(UTC)


_UNTIL = re.compile(r"UNTIL=([0-9TZ]+)", re.IGNORECASE)


def normalise_until(rrule: str, zone: tzinfo) -> str:
    """Rewrite UNTIL into the local wall-clock form dateutil needs next to a naive DTSTART.

    Real feeds write UNTIL as a UTC time (RFC 5545), a floating time, or a bare DATE even when
    DTSTART is timed; dateutil refuses the mix (ValueError) and older versions compared naive with
    aware values. Rules (from the bug cases of calendar clients):

    * ``…Z`` → converted from UTC to ``zone``'s local time;
    * a DATE → the end of that day in ``zone`` (inclusive);
    * floating → read in ``zone`` as it is.
    """

    def repl(m: re.Match) -> str:
        value = m.group(1).upper()
        if value.endswith("Z"):
            instant = datetime.strptime(value, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
            local = instant.astimezone(zone).replace(tzinfo=None)
        elif "T" in value:
            local = datetime.strptime(value, "%Y%m%dT%H%M%S")
        else:
            local = datetime.combine(datetime.strptime(value, "%Y%m%d").date(), END_OF_DAY)
        return "UNTIL=" + local.strftime("%Y%m%dT%H%M%S")

    return _UNTIL.sub(repl, rrule)


def expand(rule: RuleRecord, zone: tzinfo, *, after: datetime, before: datetime) -> list[Occurrence]:
    """Occurrences of ``rule`` whose instant lies in ``[after, before]`` (aware UTC), sorted.

    ``zone`` is the resolved zone of the rule (or of the subscriber, for a floating rule). A one-off
    rule yields at most one occurrence. All-day starts expand by date and are due at the end of the
    local day. Raises ``ValueError`` naming the rule for an RRULE dateutil cannot read.
    """
    start = rule.start_local()
    if not rule.rrule and not rule.rdates:
        due = to_instant(start, zone)
        return [Occurrence(rule.start, due)] if after <= due <= before else []

    lo = after.astimezone(zone).replace(tzinfo=None) - timedelta(days=1)
    hi = before.astimezone(zone).replace(tzinfo=None) + timedelta(days=1)
    rs = rruleset()
    try:
        if rule.rrule:
            rs.rrule(rrulestr(normalise_until(rule.rrule, zone), dtstart=start, ignoretz=True))
        else:
            rs.rdate(start)
        for text in rule.rdates:
            rs.rdate(parse_local(text))
        for text in rule.exdates:
            rs.exdate(parse_local(text))
    except (ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"rule {rule.rule_id!r}: RRULE {rule.rrule!r} cannot be expanded: {exc}") from None

    out: list[Occurrence] = []
    for local in rs.xafter(lo, inc=True):
        if local > hi:
            break
        due = to_instant(local, zone)
        if after <= due <= before:
            period = format_local(local.date()) if rule.all_day else format_local(local)
            out.append(Occurrence(period, due))
        if len(out) >= MAX_OCCURRENCES:
            log.error("rule %s: more than %d occurrences inside the horizon; truncated", rule.rule_id,
                      MAX_OCCURRENCES)
            break
    return out


def window(now: datetime, horizon: timedelta = HORIZON) -> tuple[datetime, datetime]:
    """The planning window ``[now - GRACE, now + horizon]`` (aware UTC)."""
    return now - GRACE, now + horizon


__all__ = ["GRACE", "HORIZON", "Occurrence", "expand", "normalise_until", "to_instant", "window", "date"]
