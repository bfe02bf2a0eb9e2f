"""What one planning run did, in row counts (:class:`PlanOutcome`), shared by every planning step."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from deadline_pipeline.plan.planner import PlanProblem

log = logging.getLogger(__name__)

#: The names of :attr:`PlanOutcome.override_folds` (``plan.recurrence.Folded.counts``).
OVERRIDE_FOLD_COUNTS = ("orphan_overrides", "cancelled_occurrences", "override_rrule_ignored")

#: The heartbeat count of one noted decree calendar is this prefix and its spec (``"decrees_listed_to:CN"``),
#: its value the last year the release lists the calendar's moved days for (:attr:`PlanOutcome.calendar_decree_notes`).
DECREES_LISTED_TO = "decrees_listed_to:"


@dataclass
class PlanOutcome:
    """Counts of one planning run (every number is a row count)."""

    targets: int = 0
    obligations_planned: int = 0
    obligations_inserted: int = 0
    obligations_moved: int = 0
    # Obligations of RECURRENCE-ID overrides stored under their own id, re-keyed as the occurrence
    # they replace (plan.override_keys).
    obligations_rekeyed: int = 0
    obligations_updated: int = 0
    obligations_unchanged: int = 0
    obligations_withdrawn: int = 0
    alerts_planned: int = 0
    alerts_inserted: int = 0
    alerts_moved: int = 0
    alerts_cancelled: int = 0
    alerts_superseded: int = 0
    corrections: int = 0
    cancellation_notices: int = 0
    # Late reminders left to send at once for moved obligations of ``late_policy: skip``
    # subscriptions (:data:`~deadline_pipeline.plan.planner.MOVED_DESPITE_SKIP`; logged).
    moved_sent_despite_skip: int = 0
    # Reminders left for the delivery sweep to escalate as missed: one per channel of a deadline a
    # revision moved into the past before any reminder of it was delivered on that channel
    # (:func:`~.notices.missed_row`; logged).
    moved_into_past_missed: int = 0
    # Reminders left for the delivery sweep to escalate as missed: one per channel of a deadline that
    # passed while its source was not fetched (plan.first_seen; :func:`~.escalations.missed_while_unwatched`,
    # logged at ERROR with the gap).
    missed_while_unwatched: int = 0
    # Obligations whose due instant moved although their rule did not: the zone data, the working-day
    # calendar or the recurrence engine changed (:func:`~.notices.time_data_cause`; logged, named in
    # the corrections).
    moved_by_time_data: int = 0
    # The IANA zone-data version, calendar library and recurrence engine this run planned with.
    zone_data: str = ""
    calendar_data: str = ""
    recurrence_engine: str = ""
    problems: list[PlanProblem] = field(default_factory=list)
    # Chunks guessed all new whose direct COPY met a stored key, and that were merged instead
    # (logged; shown in the plan's metadata).
    direct_write_fallbacks: int = 0
    # Quiet-window edges read by the gap rule because no gap of the zone held a nonexistent time
    # (planner._gap_end, counted by this run's planner.PlanMemo; logged, in the plan heartbeat's
    # counts, shown by plan_complete).
    gap_rule_fallbacks: int = 0
    # What folding the RECURRENCE-ID overrides into their masters left loose or took out, summed over
    # the sources read (plan.recurrence.Folded.counts, logged by apply_overrides): ``orphan_overrides``
    # (planned as they are), ``cancelled_occurrences`` (taken out as the calendar says),
    # ``override_rrule_ignored`` (planned as one instance). In the heartbeat's counts, shown by
    # plan_complete.
    override_folds: Counter[str] = field(default_factory=Counter)
    # A revision re-plan's scope (:meth:`~deadline_pipeline.plan.scope.RuleScope.describe`); empty for a
    # plan of every rule.
    scope: str = ""
    # Subscribers kept although the subscriber list leaves them out: it would have withdrawn too
    # large a share of those owed reminders (plan.subscriber_hold; logged, a planning problem).
    subscribers_held: int = 0
    # Subscribers whose zone is an ambiguous abbreviation (CST, IST) or IANA's Etc/GMT±N (POSIX's
    # inverted sign): read as written, logged and shown in plan_complete, as a source's are noted.
    subscriber_zone_notes: int = 0
    # Library calendars of yearly decree countries (spec, upper case → the last year the installed
    # holidays release lists their moved days for) that rolled a due date past that year
    # (business_days.DecreeCoverage): logged once per calendar, in the heartbeat's counts, shown by
    # plan_complete, not a problem (the country may have moved no day that year).
    calendar_decree_notes: dict[str, int] = field(default_factory=dict)
    # (source, rule id, message) of each problem in ``problems``: a problem every subscriber of a
    # subscription meets (a refused rule) is listed and logged once, not once per subscriber.
    _seen: set[tuple[str, str, str]] = field(default_factory=set, repr=False, compare=False)

    def add_problems(self, problems: Iterable[PlanProblem], log_as: str = "planning problem") -> list[PlanProblem]:
        """Add the problems not already listed (same source, rule id and message), log each new one
        once (error, prefixed ``log_as``) and return them."""
        new = []
        for p in problems:
            key = (p.source, p.rule_id, p.message)
            if key in self._seen:
                continue
            self._seen.add(key)
            self.problems.append(p)
            new.append(p)
            log.error("%s: source %s rule %s: %s", log_as, p.source, p.rule_id, p.message)
        return new

    def note_calendar_decrees(self, spec: str, last: int, message: str) -> None:
        """Note that calendar ``spec`` rolled a due date past ``last``, the last year the release lists
        its decreed moved days for: the first note of a spec (letter case ignored) is kept and logged
        as a warning (``message``), later ones (another source on the same calendar) are not."""
        key = spec.strip().upper()
        if key in self.calendar_decree_notes:
            return
        self.calendar_decree_notes[key] = last
        log.warning("planning: %s", message)

    def heartbeat_counts(self) -> dict[str, int]:
        """The counts the run's heartbeat records (``heartbeats.counts``) for ``plan_complete``:
        ``gap_rule_fallbacks``, ``subscriber_zone_notes``, ``calendar_decree_notes`` (how many calendars
        :meth:`note_calendar_decrees` noted) and each of :attr:`override_folds` (every name present, 0
        included), and per noted calendar :data:`DECREES_LISTED_TO` + spec → its last listed year."""
        return {"gap_rule_fallbacks": self.gap_rule_fallbacks, "subscriber_zone_notes": self.subscriber_zone_notes,
                "calendar_decree_notes": len(self.calendar_decree_notes),
                **{name: self.override_folds.get(name, 0) for name in OVERRIDE_FOLD_COUNTS},
                **{DECREES_LISTED_TO + spec: last for spec, last in sorted(self.calendar_decree_notes.items())}}

    @property
    def alerts_written(self) -> int:
        return self.alerts_inserted + self.alerts_moved
