"""Which rules a revision re-plan must plan: the rules changed by a range of rule versions, widened
to everything planned together with them.

A full re-plan expands every rule for every subscriber and compares every stored obligation, so a
revision of one rule in a hundred cost as much as a re-plan of all of them. A re-plan scoped to the
changed rules expands, compares and withdraws only their obligations: its cost follows what changed.
The scope is widened, never narrowed, wherever another rule's obligations depend on a changed one:

* a RECURRENCE-ID override (``UID#<RECURRENCE-ID>``) and its master are one series: a changed override
  moves an occurrence out of its master (an EXDATE folded into it), a changed master changes what
  every override of it replaces, so a change to either re-plans the whole series;
* a renamed rule keeps its obligations keyed on its lineage (the id it had), so the rule and the id
  its obligations are keyed and stored under are planned together.

What a scoped re-plan does not look at is exactly what its rule versions cannot have changed; the
hourly horizon plan still re-plans everything (configuration, zone data, calendars).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from deadline_pipeline.rules import RuleRecord


def series_of(rule_id: str) -> str:
    """The series a rule id belongs to: the UID before ``#`` (``UID#<RECURRENCE-ID>`` is an override of
    master ``UID``, RFC 5545 §3.8.4.4), the id itself otherwise."""
    return rule_id.split("#", 1)[0]


@dataclass(frozen=True)
class RuleScope:
    """The (source id, rule id) pairs a revision changed (``changed``) and the versions that changed
    them (``first_version_id``..``last_version_id``, ``rule_versions.id``, both included), for
    messages and metadata."""

    changed: frozenset[tuple[int, str]]
    first_version_id: int
    last_version_id: int

    @property
    def source_ids(self) -> frozenset[int]:
        return frozenset(s for s, _ in self.changed)

    def describe(self) -> str:
        """E.g. ``"3 rule(s) of 1 source(s) changed by rule versions 12..14"``."""
        return (f"{len(self.changed)} rule(s) of {len(self.source_ids)} source(s) changed by rule versions "
                f"{self.first_version_id}..{self.last_version_id}")

    def rule_ids(self, source_id: int, active: Iterable[tuple[int, RuleRecord]], withdrawn: Iterable[str],
                 lineage: dict[str, str]) -> frozenset[str]:
        """Every rule id of ``source_id`` a scoped re-plan plans and may withdraw obligations of: the
        changed ids, every id of a changed series (``active`` records after overrides were folded,
        ``withdrawn`` ids), and the lineage of each (``lineage``: rule id → the id its obligations
        are keyed on). Empty for a source the revision did not touch."""
        changed = {r for s, r in self.changed if s == source_id}
        if not changed:
            return frozenset()
        known = {r.rule_id for _, r in active} | set(withdrawn)
        # A renamed rule and the id it was renamed from belong together, in both directions.
        linked = {rid for rid, old in lineage.items() if rid in changed or old in changed}
        linked |= {lineage[rid] for rid in linked}
        series = {series_of(r) for r in changed | linked}
        return frozenset(changed | linked | {r for r in known if series_of(r) in series})
