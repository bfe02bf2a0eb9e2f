"""The targets and rules as planning plans them, for the checks that recompute planning.

``horizon_planned`` (:mod:`~deadline_pipeline.watch.checks`) and ``reminders_owed``
(:mod:`~deadline_pipeline.watch.reconcile`) each recompute what planning should have planned. Each
read the targets and rules its own way (overrides folded, lineage, when each version came into
force), and two copies of one reading drift apart: a check then judges rules as planning no longer
reads them. :func:`planning_view` is that one reading; the one difference the two checks need —
whose word on a withdrawal they take — is its ``trust_withdrawals`` parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from deadline_pipeline.config import DeadlinesConfig
from deadline_pipeline.ingest.parsers.base import ParseProblem
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.store.health import latest_rule_versions, rule_versions_with_reports
from deadline_pipeline.store.plan_inputs import active_targets, claimed_lineage, source_rules


@dataclass(frozen=True)
class SourceReading:
    """One source's rules as planning plans them.

    ``rules``: ``(version, RuleRecord)`` with RECURRENCE-ID overrides folded into their masters
    (:func:`~deadline_pipeline.plan.service.fold_overrides`), each keeping its version. ``lineage``:
    rule id → the id its obligations are keyed on, for the renamed rules read, each claim resolved
    (:func:`~deadline_pipeline.store.plan_inputs.claimed_lineage`). ``valid_from``: rule id (each record
    read, overrides included, before folding) → when the version read came into force (aware UTC).
    ``series_changed``: series (:func:`~deadline_pipeline.plan.scope.series_of`) → the newest
    ``valid_from`` of the latest versions of its rules, withdrawn ones included."""

    rules: list[tuple[int, RuleRecord]]
    lineage: dict[str, str]
    valid_from: dict[str, datetime]
    series_changed: dict[str, datetime]


@dataclass(frozen=True)
class PlanningView:
    """``targets``: planning's targets of the active subscriptions
    (:func:`~deadline_pipeline.plan.service.targets_from_rows`, with the business-day calendars
    planning reads); ``sources``: source id → its :class:`SourceReading`, for every target's source."""

    targets: list
    sources: dict[int, SourceReading]


def planning_view(conn, cfg: DeadlinesConfig, *, trust_withdrawals: bool) -> PlanningView:
    """The targets and each of their sources' rules as planning plans them, read on ``conn``.

    ``trust_withdrawals``: whose word on a withdrawal is taken.

    * True — planning's: the latest version of each rule, a withdrawal withdrawing it
      (:func:`~deadline_pipeline.store.plan_inputs.source_rules`, planning's own read). For judging
      whether planning did what it set out to do (``horizon_planned``): a rule planning rightly
      does not plan must not be red there.
    * False — the reconciliation's (:func:`rules_in_force`): a withdrawal made by a snapshot that
      skipped a record which may have been the rule, and that no human accepted, is not trusted; the
      last good version stays in force. For recomputing what was owed independently of the ingest
      decision it checks (``reminders_owed``): a rule withdrawn because its record failed to parse
      was still owed its reminders, and reading it as planning does would excuse that miss.

    Planning's problems met while reading (a fold that fails, a channel without its contact) are not
    reported: planning reports them (``plan_complete``)."""
    from deadline_pipeline.plan.outcome import PlanOutcome
    from deadline_pipeline.plan.service import business_calendars, targets_from_rows

    scratch = PlanOutcome()  # planning's own problems are reported by planning, not here
    targets = targets_from_rows(cfg, active_targets(conn), scratch, business_calendars(conn, cfg, scratch))
    names = {t.source_id: t.source for t in targets}
    read = _planning_reading if trust_withdrawals else _in_force_reading
    return PlanningView(targets, read(conn, names, scratch))


def _planning_reading(conn, names: dict[int, str], scratch) -> dict[int, SourceReading]:
    """:func:`planning_view` with ``trust_withdrawals``. The versions' instants are read after the
    rules, so a version committed in between is newer than every rule read (a caller that leaves
    out series changed since planning ran leaves it out, never judges it unplanned)."""
    from deadline_pipeline.plan.scope import series_of
    from deadline_pipeline.plan.service import fold_overrides

    read = {sid: source_rules(conn, sid) for sid in names}
    latest = latest_rule_versions(conn)
    out = {}
    for sid, rules in read.items():
        versions = latest.get(sid, {})
        changed: dict[str, datetime] = {}
        for rid, v in versions.items():
            series = series_of(rid)
            changed[series] = max(changed.get(series, v["valid_from"]), v["valid_from"])
        out[sid] = SourceReading(fold_overrides(rules.active, names[sid], scratch), rules.lineage,
                                 {rid: v["valid_from"] for rid, v in versions.items()}, changed)
    return out


def _in_force_reading(conn, names: dict[int, str], scratch) -> dict[int, SourceReading]:
    """:func:`planning_view` without ``trust_withdrawals``: each source's :func:`rules_in_force`."""
    from deadline_pipeline.plan.scope import series_of
    from deadline_pipeline.plan.service import fold_overrides

    out = {}
    for sid, name in names.items():
        rows = rule_versions_with_reports(conn, sid)
        in_force = _rows_in_force(rows)
        changed: dict[str, datetime] = {}
        latest = {r.rule_id: r for r in rows}  # rows come by version: the last one of each rule wins
        for rid, r in latest.items():
            series = series_of(rid)
            changed[series] = max(changed.get(series, r.valid_from), r.valid_from)
        lineage = claimed_lineage({r.rule_id: {"withdrawn": False, "lineage": r.lineage} for r in in_force})
        rules = [(r.version, RuleRecord.from_payload(r.payload)) for r in in_force]
        out[sid] = SourceReading(fold_overrides(rules, name, scratch), lineage,
                                 {r.rule_id: r.valid_from for r in in_force}, changed)
    return out


def _withdrawal_justified(rule_id: str, report: dict | None, known: list[str]) -> bool:
    """Whether a snapshot with this parse report may withdraw ``rule_id``: it skipped no record that
    may have been the rule (``known``: the source's rule ids, so that a skipped record under an id
    never seen may be any rule, see :meth:`ParseProblem.may_be`), or a human accepted its skipped
    records."""
    if not report or report.get("accepted"):
        return True
    if report.get("skipped_count", 0) > len(report.get("skipped") or []):
        # The stored list was capped: an unlisted skipped record may be this rule.
        return False
    return not any(ParseProblem(p.get("position", ""), p.get("message", ""), p.get("record_id")).may_be(rule_id, known)
                   for p in report.get("skipped") or [])


def rules_in_force(rows: list) -> list[tuple[int, RuleRecord, datetime]]:
    """(version, record, valid_from) of every rule of a source in force, from ``rows``
    (:func:`~deadline_pipeline.store.health.rule_versions_with_reports`: every version of the
    source's rules, by rule id then version): the latest version of each rule — unless that version
    is a withdrawal made by a snapshot that *skipped* a record which may have been that rule (its
    ``parse_report``) and no human accepted it; then the last good version is in force (only a
    parseable snapshot that lacks a rule withdraws it)."""
    return [(r.version, RuleRecord.from_payload(r.payload), r.valid_from) for r in _rows_in_force(rows)]


def _rows_in_force(rows: list) -> list:
    """The row of ``rows`` in force of each rule (:func:`rules_in_force`), by rule id."""
    by_rule: dict[str, list] = {}
    for r in rows:
        by_rule.setdefault(r.rule_id, []).append(r)
    known = list(by_rule)
    out = []
    for rule_id, versions in by_rule.items():
        in_force = None
        for v in versions:
            if not v.withdrawn:
                in_force = v
            elif _withdrawal_justified(rule_id, v.parse_report, known):
                in_force = None
        if in_force is not None:
            out.append(in_force)
    return out
