"""Overrides whose occurrence their series no longer has (RFC 5545 §3.8.4.4, §3.8.5.1).

Pure domain logic (no I/O). It needs both the override folding of
:mod:`deadline_pipeline.plan.recurrence` and the expansion of :mod:`deadline_pipeline.plan.occurrences`,
which itself imports recurrence: living here, above both, it keeps the imports one way
(occurrences → recurrence, vanished → both).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from datetime import UTC, tzinfo

from deadline_pipeline.plan.occurrences import has_occurrence, present_labels
from deadline_pipeline.plan.recurrence import master_id_of, occurrence_named, range_of
from deadline_pipeline.rules import RuleRecord

# The logger these messages always had (they were written in recurrence): log filters and
# configurations that name it keep working.
log = logging.getLogger("deadline_pipeline.plan.recurrence")


class Vanished(dict):
    """What :func:`vanished_overrides` returns: ``{override rule_id: why}`` (a ``dict``), and in
    ``counts`` how many overrides were found gone (``vanished_overrides``) and how many could not be
    checked (``override_checks_failed``)."""

    def __init__(self, gone=(), counts: Counter[str] | None = None) -> None:
        super().__init__(gone)
        self.counts: Counter[str] = counts if counts is not None else Counter()


def vanished_overrides(rules: list[RuleRecord], *, zone_of=None) -> Vanished:
    """The overrides whose occurrence their master no longer has: ``{override rule_id: why}``.

    ``rules``: one snapshot's records as for
    :func:`~deadline_pipeline.plan.recurrence.apply_overrides` (the master in force, i.e. the latest
    revision, among them); ``zone_of`` as there (a floating master is expanded in UTC here:
    only its wall-clock labels matter). An override replaces one occurrence of its series (RFC 5545
    §3.8.4.4); when the series in force excludes it (EXDATE, §3.8.5.1) or no longer generates it
    (an UNTIL, COUNT or RRULE that no longer reaches it, no RDATE naming it), its owner deleted that
    occurrence, and planning the override reminded of it (the override of an older SEQUENCE outlived
    the revision that deleted its instance). An override that moves its occurrence (DTSTART other
    than its RECURRENCE-ID) is judged by its RECURRENCE-ID; a ``RANGE=THISANDFUTURE`` one is gone when
    the series has no occurrence from its RECURRENCE-ID on. Cancelled and completed overrides plan
    nothing and are not judged, nor are overrides without their master (``orphan_overrides``).

    Each one found is logged and counted (``counts["vanished_overrides"]`` of the returned
    :class:`Vanished`). The overrides of a master that cannot be expanded (over the work budget, a
    floating master named by a UTC RECURRENCE-ID…) are kept, logged and counted
    (``counts["override_checks_failed"]``): a duplicate reminder at worst, never a missed one.
    Raises nothing for such a master.
    """
    from deadline_pipeline.timezones import resolve_zone

    masters = {r.rule_id: r for r in rules if "recurrence_id" not in r.extra}
    groups: dict[str, list[RuleRecord]] = {}
    for r in rules:
        master_id = master_id_of(r) if "recurrence_id" in r.extra and not r.extra.get("cancelled") else None
        if master_id in masters:
            groups.setdefault(master_id, []).append(r)
    gone = Vanished()
    for master_id, overrides in groups.items():
        master = masters[master_id]
        zone = zone_of(master) if zone_of is not None else (resolve_zone(master.tz) if master.tz else None)
        gone.update(_vanished_of(master, overrides, zone, gone.counts))
    for rule_id, why in gone.items():
        gone.counts["vanished_overrides"] += 1
        log.warning("override %s: %s; it is not in force", rule_id, why)
    return gone


def _vanished_of(master: RuleRecord, overrides: list[RuleRecord], zone: tzinfo | None,
                 counts: Counter[str]) -> dict[str, str]:
    """:func:`vanished_overrides` for the overrides of one master (``zone``: the master's, None when
    floating): ``{override rule_id: why}``; none when the master cannot be expanded (logged, counted
    in ``counts["override_checks_failed"]``)."""
    frame = zone or UTC
    later = {o.rule_id for o in overrides if range_of(o) == "THISANDFUTURE"}

    def missing(rule: RuleRecord, named: dict[str, str]) -> list[str]:
        """The overrides of ``named`` (``{rule_id: label}``) whose occurrence ``rule`` lacks."""
        plain = present_labels(rule, frame, [label for rid, label in named.items() if rid not in later])
        tails = {rid for rid in named if rid in later and has_occurrence(rule, frame, named[rid], or_later=True)}
        return [rid for rid, label in named.items() if label not in plain and rid not in tails]

    try:
        named = {o.rule_id: occurrence_named(master, o, zone) for o in overrides}
        gone = missing(master, named)
        # Which of them the EXDATEs took: the same check on the series without its EXDATEs.
        generated = missing(replace(master, exdates=()), {rid: named[rid] for rid in gone}) if master.exdates else gone
    except ValueError as exc:  # RRuleError, ExpansionBudgetExceeded, a UTC RECURRENCE-ID of a floating master
        counts["override_checks_failed"] += len(overrides)
        log.warning("series %s: whether it still has the occurrences its %d override(s) name cannot be told (%s); "
                    "they are kept", master.rule_id, len(overrides), exc)
        return {}
    return {rid: _vanished_words(named[rid], rid in later, rid not in generated) for rid in gone}


def _vanished_words(label: str, later: bool, excluded: bool) -> str:
    """The note for an override of ``label`` (``later``: and every later occurrence) gone by an EXDATE
    (``excluded``) or because the series no longer generates it."""
    named = f"{label} and every later occurrence" if later else label
    cause = ("excludes (EXDATE)" if excluded
             else "no longer has (its RRULE, UNTIL or COUNT do not reach it and no RDATE names it)")
    return f"an override of {named}, which the series in force {cause}"


__all__ = ["Vanished", "vanished_overrides"]
