"""Which rules a revision re-plan must plan: the rules changed by a range of rule versions, widened
to everything planned together with them.

A full re-plan expands every rule for every subscriber and compares every stored obligation, so a
revision of one rule in a hundred cost as much as a re-plan of all of them. A re-plan scoped to the
changed rules expands, compares and withdraws only their obligations: its cost follows what changed.
The scope is widened, never narrowed, wherever another rule's obligations depend on a changed one:

* a RECURRENCE-ID override (``UID#<RECURRENCE-ID>``) and its master are one series: a changed override
  moves an occurrence out of its master (an EXDATE folded into it), a changed master changes what
  every override of it replaces, so a change to either re-plans the whole series;
* a renamed rule keeps its obligations keyed on its lineage (the id it had), so every rule sharing a
  lineage is planned together (the old id coming back takes the key back from the renamed rule);
* a source whose business days are built from a holiday source (``source:NAME``) rolls every due
  date over those holidays, so a revision of the holiday source plans that source whole.

What a scoped re-plan does not look at is exactly what its rule versions cannot have changed; the
hourly horizon plan still re-plans everything (configuration, zone data, calendars).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from deadline_pipeline.rules import RuleRecord


def series_of(rule_id: str) -> str:
    """The series a rule id belongs to: the UID before ``#`` (``UID#<RECURRENCE-ID>`` is an override of
    master ``UID``, RFC 5545 §3.8.4.4), the id itself otherwise."""
    return rule_id.split("#", 1)[0]


@dataclass(frozen=True)
class RuleScope:
    """The (source id, rule id) pairs a revision changed (``changed``) and the versions that changed
    them (``first_version_id``..``last_version_id``, ``rule_versions.id``, both included), for
    messages and metadata. ``whole_sources``: source ids planned with every rule (a source whose
    business days are built from a changed holiday source: each of its due dates may roll anew)."""

    changed: frozenset[tuple[int, str]]
    first_version_id: int
    last_version_id: int
    whole_sources: frozenset[int] = frozenset()

    @property
    def source_ids(self) -> frozenset[int]:
        return frozenset(s for s, _ in self.changed) | self.whole_sources

    def with_whole_sources(self, source_ids: Iterable[int]) -> RuleScope:
        """This scope, planning every rule of ``source_ids`` too."""
        return replace(self, whole_sources=self.whole_sources | frozenset(source_ids))

    def describe(self) -> str:
        """E.g. ``"3 rule(s) of 1 source(s) changed by rule versions 12..14"``, and the sources planned
        whole, if any."""
        text = (f"{len(self.changed)} rule(s) of {len({s for s, _ in self.changed})} source(s) changed by rule "
                f"versions {self.first_version_id}..{self.last_version_id}")
        if self.whole_sources:
            text += f", every rule of {len(self.whole_sources)} source(s) rolled over a changed holiday source"
        return text

    def rule_ids(self, source_id: int, active: Iterable[tuple[int, RuleRecord]], withdrawn: Iterable[str],
                 lineage: dict[str, str]) -> frozenset[str] | None:
        """Every rule id of ``source_id`` a scoped re-plan plans and may withdraw obligations of:
        ``None`` for every rule (a source planned whole, or one whose every rule is in scope); the
        empty set for a source the revision did not touch; else the changed ids, every id sharing a
        lineage with one (``lineage``: rule id → the lineage its latest version records, active or
        withdrawn: an id back beside the rule renamed from it takes the obligations' key back, so
        both must be planned), and every id of a changed series (``active`` records after overrides
        were folded, ``withdrawn`` ids)."""
        if source_id in self.whole_sources:
            return None
        changed = {r for s, r in self.changed if s == source_id}
        if not changed:
            return frozenset()
        known = {r.rule_id for _, r in active} | set(withdrawn)
        roots = {lineage.get(r, r) for r in changed} | changed
        linked = {r for r in known | set(lineage) if r in roots or lineage.get(r, r) in roots}
        series = {series_of(r) for r in changed | linked}
        ids = frozenset(changed | linked | {r for r in known if series_of(r) in series})
        # Every rule in scope (a cursor reset re-handles every version): plan the source whole, with
        # no list of ids (tens of thousands of bound parameters would pass a driver's limit).
        return None if known <= ids else ids
