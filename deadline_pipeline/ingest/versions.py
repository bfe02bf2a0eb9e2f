"""Rule versioning decisions (pure): what a parsed snapshot adds, changes and withdraws, and
whether applying it is plausible or must be quarantined for a human to look at."""

from __future__ import annotations

from dataclasses import dataclass, field

from deadline_pipeline.rules import RuleRecord

DEFAULT_MAX_WITHDRAW_SHARE = 0.30


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


def quarantine_reason(diff: RuleDiff, active_before: int, parsed_count: int,
                      max_withdraw_share: float = DEFAULT_MAX_WITHDRAW_SHARE) -> str | None:
    """Why a snapshot must not be applied, or None.

    A source that suddenly parses to nothing, or drops a large share of its rules, is far more often
    broken than truthful; applying it would cancel every affected reminder — a silent miss.
    """
    if parsed_count == 0 and active_before > 0:
        return f"parses to zero rules where the last good snapshot had {active_before}"
    if active_before and len(diff.withdrawn) / active_before > max_withdraw_share:
        return (f"would withdraw {len(diff.withdrawn)} of {active_before} active rules "
                f"(more than {max_withdraw_share:.0%})")
    return None
