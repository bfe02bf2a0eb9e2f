"""Rule versioning decisions (pure): what a parsed snapshot adds, changes and withdraws, and
whether applying it is plausible or must be quarantined for a human to look at."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from deadline_pipeline.config.quantities import MAX_WITHDRAW_SHARE
from deadline_pipeline.plan.recurrence import master_id_of
from deadline_pipeline.rules import RuleRecord

log = logging.getLogger(__name__)

# The subscribers' hold uses the same share by default (plan.max_subscriber_withdraw_share).
DEFAULT_MAX_WITHDRAW_SHARE = MAX_WITHDRAW_SHARE


@dataclass
class RuleDiff:
    """``added``/``changed``: records to store as a new version; ``withdrawn``: rule ids missing from
    the snapshot whose latest version is active; ``unchanged``: count of identical rules."""

    added: list[RuleRecord] = field(default_factory=list)
    changed: list[RuleRecord] = field(default_factory=list)
    withdrawn: list[str] = field(default_factory=list)
    unchanged: int = 0

    @property
    def is_noop(self) -> bool:
        return not (self.added or self.changed or self.withdrawn)


def diff_rules(latest: dict[str, dict], parsed: list[RuleRecord]) -> RuleDiff:
    """Compare parsed records with the latest stored versions (``rule_id → {content_hash, withdrawn}``).

    A rule that comes back after a withdrawal counts as changed (it gets a new active version).
    Duplicate rule ids within one snapshot keep the first (the parser reports the repeat).
    """
    diff = RuleDiff()
    seen: set[str] = set()
    for rec in parsed:
        if rec.rule_id in seen:
            continue
        seen.add(rec.rule_id)
        prev = latest.get(rec.rule_id)
        if prev is None:
            diff.added.append(rec)
        elif prev["withdrawn"] or prev["content_hash"] != rec.content_hash():
            diff.changed.append(rec)
        else:
            diff.unchanged += 1
    diff.withdrawn = sorted(rid for rid, prev in latest.items() if not prev["withdrawn"] and rid not in seen)
    return diff


def held_back(withdrawn: Iterable[str], problems: Iterable, known: Iterable[str] = ()) -> list[str]:
    """The rule ids among ``withdrawn`` (missing from a snapshot) that a skipped record of that
    snapshot may have yielded (:meth:`ParseProblem.may_be`; ``known``: the source's rule ids before
    the snapshot, so that a skipped record under an id never seen may be any of them): they are not
    withdrawn — only a parseable snapshot that lacks a rule withdraws it — and keep their last good
    version in force."""
    skipped = [p for p in problems if p.skipped]
    known = list(known)
    return sorted(rid for rid in withdrawn if any(p.may_be(rid, known) for p in skipped))


# Slack around "now" when judging whether a rule is still ahead: a zone offset is at most ±14 h.
_ZONE_SLACK = timedelta(days=1)
# How far ahead a rule's next instant is looked for (a rule whose next instant is later is past).
_FAR_AHEAD = timedelta(days=366 * 100)


def is_future(payload: dict, now: datetime) -> bool:
    """Whether a stored rule (its payload) may still have an instant after ``now`` (aware UTC).

    Wall-clock times are compared with a day of slack, so a rule near ``now`` counts as future; a
    payload that cannot be read counts as future too (the quarantine then errs on the safe side).
    """
    from deadline_pipeline.plan.occurrences import occurs_between

    try:
        # Bounded expansion: an unbounded dateutil ``after()`` stepped a FREQ=SECONDLY rule through
        # every second since its DTSTART. A rule over the budget raises and counts as future below.
        return occurs_between(payload, now - _ZONE_SLACK, now + _FAR_AHEAD)
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("quarantine: rule payload %s unreadable, counted as future: %s", payload.get("rule_id"), exc)
        return True


def quarantine_reason(diff: RuleDiff, active_before: int, parsed_count: int,
                      max_withdraw_share: float = DEFAULT_MAX_WITHDRAW_SHARE, *,
                      latest: dict[str, dict] | None = None, now: datetime | None = None) -> str | None:
    """Why a snapshot must not be applied, or None.

    A source that suddenly parses to nothing, or drops a large share of its rules, is far more often
    broken than truthful; applying it would cancel every affected reminder — a silent miss. Given
    ``latest`` (the stored versions) and ``now``, only the *future* is judged: withdrawn rules whose
    instants are all past cancel nothing, so a rolling window (a holiday file dropping its oldest
    years) is not quarantined; the share is of the active future rules.
    """
    if parsed_count == 0 and active_before > 0:
        return f"parses to zero rules where the last good snapshot had {active_before}"
    withdrawn, base = len(diff.withdrawn), active_before
    if latest is not None and now is not None:
        withdrawn = sum(1 for rid in diff.withdrawn if is_future(latest[rid]["payload"], now))
        base = sum(1 for v in latest.values() if not v["withdrawn"] and is_future(v["payload"], now))
    if base and withdrawn / base > max_withdraw_share:
        return (f"would withdraw {withdrawn} of {base} active future rules "
                f"(more than {max_withdraw_share:.0%})")
    return None


def returned_to_series(withdrawn: list[str], latest: dict[str, dict], parsed_ids: set[str]) -> set[str]:
    """The ``withdrawn`` rule ids that are RECURRENCE-ID overrides (RFC 5545 §3.8.4.4; their stored
    ``latest`` payload has ``extra.recurrence_id``) whose master is in the new snapshot (``parsed_ids``):
    their occurrences go back to the series (moved back, a correction where a reminder was delivered),
    nothing is cancelled. :func:`quarantine_reason` must not count them: taking the overrides of two
    series back out of a feed withdrew 2 of its 4 rules, and the routine edit was quarantined."""
    out = set()
    for rid in withdrawn:
        payload = (latest.get(rid) or {}).get("payload") or {}
        if (payload.get("extra") or {}).get("recurrence_id") is None:
            continue
        if master_id_of(RuleRecord.from_payload(payload)) in parsed_ids:
            out.add(rid)
    return out
