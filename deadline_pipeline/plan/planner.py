"""Planning as pure functions: (subscription target, active rules, now) → obligations and alerts.

No database and no Dagster here, so every rule of planning is testable on its own:

* late reminders fold (:func:`fold_late`): of the reminders already past at planning time only the
  most recent goes out, at once; the others are ``skipped`` with the reason — or all are skipped
  under the ``skip`` late policy, except for a deadline a revision moved (its subscriber expects
  the old date: the most recent goes out at once);
* offsets (:func:`~deadline_pipeline.plan.offsets.send_instant`): days and weeks are calendar days
  in the deadline's own zone, hours and smaller are exact (RFC 5545 §3.3.6);
* quiet hours (:func:`apply_quiet_hours`): a reminder inside the subscriber's local quiet window is
  deferred to the window's end, unless that would put it after the deadline — then it is not
  deferred. Never dropped.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta, tzinfo

from deadline_pipeline import zone_data
from deadline_pipeline.config import parse_quiet_hours
from deadline_pipeline.instants import instant_text
from deadline_pipeline.plan.business_days import calendar_data_of
from deadline_pipeline.plan.gaps import zone_gaps
from deadline_pipeline.plan.keys import obligation_key, reminder_dedup_keys
from deadline_pipeline.plan.occurrences import HORIZON, Expansion, cap_problem, expansion, window
from deadline_pipeline.plan.offsets import Offset, send_instant
from deadline_pipeline.plan.recurrence import REPLACES, master_id_of, to_instant
from deadline_pipeline.recurrence_engine import recurrence_engine_version
from deadline_pipeline.rules import RuleRecord, kinds_admit, kinds_allow, rule_kinds, selected_kinds
from deadline_pipeline.states import AlertState
from deadline_pipeline.timezones import UnknownTimeZone, resolve_zone
from deadline_pipeline.wording import near_name

log = logging.getLogger(__name__)


class PlanMemo(dict):
    """The memo one planning run shares across its targets, chunks and helper threads (the ``cache``
    of :func:`plan_target`, :func:`reminder_rows`: deterministic values by key), and that run's own
    count of quiet-window edges read by the gap rule (``gap_rule_fallbacks``, :func:`_gap_end`).

    Counted per run, not per process: a process-wide counter read before and after a run took the
    fallbacks of another run in the same process meanwhile (a backfill next to the hourly plan) as
    its own. Counted once per alert template computed, as the template is memoised. A plain dict as
    ``cache`` memoises without counting (a check's recomputation, ``preview``: planning reports the
    fallbacks)."""

    def __init__(self) -> None:
        super().__init__()
        self.gap_rule_fallbacks = 0
        # Alert rows are built on the planning thread and on a helper thread at once.
        self._lock = threading.Lock()

    def count_gap_rule_fallback(self) -> None:
        with self._lock:
            self.gap_rule_fallbacks += 1

REFUSED_FREQUENCIES = ("SECONDLY", "MINUTELY")
ONCE = "once"  # the period of a one-off rule: its identity survives a moved due time


@dataclass(frozen=True, slots=True)
class Target:
    """One active subscription of one subscriber to one source.

    Slotted: a plan holds one per subscription for the whole run (20,000 at 20,000 subscribers),
    and a ``__dict__`` each doubled what they took."""

    subscriber_id: int
    subscriber: str  # external id
    tenant: str
    subscriber_tz: str
    source_id: int
    source: str
    source_tz: str | None
    rule_patterns: tuple[str, ...]
    # Reminder offsets as written (nominal days + exact seconds); a bare int is exact seconds.
    offsets: tuple[Offset, ...]
    channels: tuple[str, ...]
    quiet_hours: str | None = None
    late_policy: str = "send_latest"
    # (holiday calendar, convention) applied to every due date of the source, or None.
    business_days: tuple | None = field(default=None, compare=False)
    # Rule kinds to include (None = all) and to exclude (see rules.rule_kinds).
    kinds: tuple[str, ...] | None = None
    exclude_kinds: tuple[str, ...] = ()
    # The subscription's name, for naming it in a problem ("" when unknown); not part of its identity.
    subscription: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "offsets", tuple(o if isinstance(o, Offset) else Offset.exact(o)
                                                  for o in self.offsets))

    @property
    def offsets_seconds(self) -> tuple[int, ...]:
        """Each offset's nominal length in seconds (``-P7D`` → ``-604800``), as the store keys it."""
        return tuple(o.nominal_seconds for o in self.offsets)

    def wants(self, rule_id: str) -> bool:
        return any(fnmatch.fnmatchcase(rule_id, p) for p in self.rule_patterns)

    def wants_rule(self, rule: RuleRecord) -> bool:
        """:meth:`wants` on the rule's id, and its kinds pass ``kinds`` / ``exclude_kinds``."""
        return self.wants(rule.rule_id) and kinds_allow(self.kinds, self.exclude_kinds, rule)


@dataclass
class PlannedAlert:
    offset_seconds: int
    channel: str
    kind: str
    dedup_key: str
    send_at: datetime
    status: str = AlertState.PENDING
    status_reason: str | None = None
    # The due instant this reminder is owed for (aware UTC): part of the alert's identity.
    due_at: datetime | None = None
    # The offset as written (``offset_seconds`` is its nominal length), for showing it.
    offset: Offset | None = None


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
    fingerprint: str = ""
    alerts: list[PlannedAlert] = field(default_factory=list)
    # The deadline's own zone (its calendar days carry the nominal part of every offset).
    zone: str = ""
    tz: tzinfo | None = field(default=None, repr=False, compare=False)
    # The IANA zone-data version, the business-day calendar library (None: no library roll) and the
    # recurrence expansion engine (None: a one-off date no expansion decided) that computed ``due_at``:
    # a change of any that moves it is named in the correction.
    zone_data: str | None = None
    calendar_data: str | None = None
    recurrence_engine: str | None = None
    # The nominal local wall time (naive, in ``zone``) of a due instant whose wall time a spring-forward
    # gap skips (:attr:`~deadline_pipeline.plan.occurrences.Occurrence.wall`), else None: calendar-day
    # offsets count from it.
    wall: datetime | None = None


@dataclass
class PlanProblem:
    source: str
    rule_id: str
    message: str


# Why a late reminder goes out although its subscription skips late reminders: the obligation
# existed and a revision moved its due instant, so its subscriber knows only the old date. Under
# ``skip`` a deadline moved to 23 hours away had every reminder skipped, and with nothing delivered
# for the old date no correction went out either: a silent miss. Also what planning counts
# (``PlanOutcome.moved_sent_despite_skip``) and the store is searched for.
MOVED_DESPITE_SKIP = "this subscription skips late reminders, but not those of a deadline that moved"

# The end of the reason of a late reminder sent at once under ``late_policy: skip`` because it was owed
# before it was late: its send time came after the deadline was first planned for the subscriber, and
# a configuration edit (an offset taken out and put back, a channel renamed) cancelled it before it
# went out. Skipped as late when asked for again, it was never sent, every check green.
OWED_DESPITE_SKIP = ("this subscription skips late reminders, but not one owed since before its time, "
                     "when the deadline was already planned for its subscriber")

# The reason of a late reminder ``skip`` left unsent (what planning looks for when it re-folds the
# reminders of a deadline the subscriber already knew: ``plan.chunks._fold_as_known``).
SKIPPED_BY_POLICY = "late reminders are skipped by this subscription's policy"


def fold_late(alerts: list[PlannedAlert], now: datetime, late_policy: str = "send_latest",
              reason_prefix: str = "late at planning", *, moved: bool = False,
              owed_since: datetime | None = None) -> None:
    """Set the status of reminders already past at ``now`` (aware UTC), per channel.

    ``send_latest``: the most recent past reminder stays ``pending`` (it goes out at once); earlier
    ones become ``skipped`` with the reason. ``skip``: every past reminder is ``skipped`` — unless
    ``moved`` (an obligation already planned whose due instant a revision changed): its subscriber
    expects the old date, so the most recent past reminder goes out at once as under
    ``send_latest``, its reason ending in :data:`MOVED_DESPITE_SKIP`. Future reminders are
    ``pending``. Without folding, a new subscriber would get the 90-, 7- and 1-day reminders of one
    deadline in the same minute. The reason of the one sent at once says whether the deadline
    (``due_at``) is still ahead or has just passed (planning looks back
    :data:`~deadline_pipeline.plan.occurrences.GRACE`, and delivery still sends within its own
    grace after the deadline).

    ``owed_since`` (aware UTC): when the deadline was first planned for the subscriber (a stored
    obligation). Under ``skip``, a late reminder whose time came after it was owed then, not new: the
    most recent such one per channel goes out at once, its reason ending in :data:`OWED_DESPITE_SKIP`.
    """
    skip = late_policy == "skip" and not moved
    if skip and owed_since is not None:
        _fold_owed(alerts, now, reason_prefix, owed_since)
        return
    for late in _late_by_channel(alerts, now):
        keep = None if skip else late[-1]
        for a in late:
            past = f"{reason_prefix}: reminder time {instant_text(a.send_at)} already past; "
            if a is keep:
                a.status = AlertState.PENDING
                a.status_reason = past + _sent_at_once(a.due_at, now) + (
                    f"; {MOVED_DESPITE_SKIP}" if late_policy == "skip" else "")
            else:
                a.status = AlertState.SKIPPED
                a.status_reason = past + (SKIPPED_BY_POLICY if skip
                                          else "a later reminder of the same deadline is sent instead")


def _late_by_channel(alerts: list[PlannedAlert], now: datetime) -> list[list[PlannedAlert]]:
    """Set the reminders of ``alerts`` still ahead of ``now`` ``pending``; return the late ones, per
    channel, oldest first."""
    by_channel: dict[str, list[PlannedAlert]] = {}
    for a in alerts:
        if a.kind != "reminder":
            continue
        if a.send_at > now:
            a.status = AlertState.PENDING
        else:
            by_channel.setdefault(a.channel, []).append(a)
    for late in by_channel.values():
        late.sort(key=lambda a: a.send_at)
    return list(by_channel.values())


def _fold_owed(alerts: list[PlannedAlert], now: datetime, reason_prefix: str, owed_since: datetime) -> None:
    """:func:`fold_late` under ``skip`` for a deadline planned for the subscriber since ``owed_since``:
    per channel, the most recent late reminder whose time came after it is sent at once; every other
    late one is skipped (by the policy when its time came before)."""
    for late in _late_by_channel(alerts, now):
        owed = [a for a in late if a.send_at >= owed_since]
        keep = owed[-1] if owed else None
        for a in late:
            past = f"{reason_prefix}: reminder time {instant_text(a.send_at)} already past; "
            if a is keep:
                a.status = AlertState.PENDING
                a.status_reason = f"{past}{_sent_at_once(a.due_at, now)}; {OWED_DESPITE_SKIP}"
            else:
                a.status = AlertState.SKIPPED
                a.status_reason = past + (SKIPPED_BY_POLICY if a.send_at < owed_since
                                          else "a later reminder of the same deadline is sent instead")


def _sent_at_once(due_at: datetime | None, now: datetime) -> str:
    """Why a late reminder is still sent, true on either side of the deadline: a reminder planned
    one second after its deadline said "the deadline is still ahead" above a mail saying "It is
    due now"."""
    if due_at is not None and due_at <= now:
        return f"sent at once although the deadline has just passed ({instant_text(due_at)})"
    return "sent at once because the deadline is still ahead"


def _first_shown(wall: datetime, zone: tzinfo, on_fallback: Callable[[], None] | None = None) -> datetime:
    """The first instant (aware UTC) at which the clock in ``zone`` shows ``wall`` (naive) or a later
    time: the first of a time a fall-back repeats; for a time a spring-forward gap skips, the end of
    the gap (on a 02:00→03:00 night, 02:30 → the instant of 03:00)."""
    first = to_instant(wall, zone)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first
    return _gap_end(wall, zone, on_fallback)


def _last_shown(wall: datetime, zone: tzinfo, on_fallback: Callable[[], None] | None = None) -> datetime:
    """The last instant (aware UTC) at which the clock in ``zone`` runs from an earlier time onto
    ``wall`` (naive): the second of a time a fall-back repeats (``fold=1``) — unless the clock jumps
    back onto it (``wall`` is the first repeated time: the second pass starts there, not before), then
    the first; for a time a gap skips, the end of the gap (the clock then shows a later time)."""
    last = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if last.astimezone(zone).replace(tzinfo=None) != wall:
        return _gap_end(wall, zone, on_fallback)
    first = to_instant(wall, zone)
    if last != first and (last - timedelta(microseconds=1)).astimezone(zone).replace(tzinfo=None) > wall:
        return first
    return last


def _gap_end(wall: datetime, zone: tzinfo, on_fallback: Callable[[], None] | None = None) -> datetime:
    """The instant a spring-forward gap holding ``wall`` (a naive time ``zone`` skips) ends.
    ``on_fallback`` is called when it is read by the gap rule instead (below)."""
    for start, end in zone_gaps(zone, wall.year):
        if start <= wall < end:
            return to_instant(end, zone)
    # Not reached for a time that does not exist while zone_gaps holds every gap touching its year; it
    # is reached by zone data whose offset changes and changes back within zone_gaps' scan step. The
    # planner's gap rule then gives an instant at or after the gap's end: later, never inside. Counted
    # (PlanMemo), so plan_complete shows it: a warning alone scrolled away while quiet windows ended late.
    log.warning("no spring-forward gap of %s holds %s; the window's edge read by the gap rule", zone, wall)
    if on_fallback is not None:
        on_fallback()
    return to_instant(wall, zone)


def quiet_until(instant: datetime, window_: tuple[time, time], zone: tzinfo,
                on_fallback: Callable[[], None] | None = None) -> datetime | None:
    """The end (aware UTC) of the quiet window ``instant`` (aware) lies in, or None when it lies in none.

    ``window_``: ``(start, end)`` local wall times in ``zone`` (:func:`~deadline_pipeline.config.parse_quiet_hours`),
    wrapping midnight when ``end < start``. The window of local day *d* runs from the first instant the
    clock shows *d* ``start`` (or later) to the *last* instant it comes to show ``end`` (on *d*, or *d*+1
    when it wraps): a fall-back night that repeats the end keeps the whole window quiet to the second
    pass (22:00-01:30 in New York on 1 November 2026 ends at 01:30 EST, 06:30Z; ending it at the first
    01:30 sent the reminder an hour before the end, and one sent at 01:15 EST was moved 45 minutes
    *back* to it), and a start or end that a spring-forward gap skips is where the gap ends, when the
    clock first shows a later time. A window whose end is the start of another (a gap of a whole day,
    Samoa 2011-12-30) continues into it. ``on_fallback`` is called for each edge read by the gap rule
    (:class:`PlanMemo`)."""
    start, end = window_
    wraps = timedelta(days=1) if end <= start else timedelta(0)
    t, inside = instant, False
    for _ in range(4):  # a window reaches into the next only across a skipped day: at most a chain of two
        day = t.astimezone(zone).date()
        for d in (day - timedelta(days=2), day - timedelta(days=1), day):
            lo = _first_shown(datetime.combine(d, start), zone, on_fallback)
            hi = _last_shown(datetime.combine(d + wraps, end), zone, on_fallback)
            if lo <= t < hi:
                t, inside = hi, True
                break
        else:
            break
    return t if inside else None


def apply_quiet_hours(send_at: datetime, due_at: datetime, quiet: str | None,
                      zone: tzinfo | None,
                      on_fallback: Callable[[], None] | None = None) -> tuple[datetime, str | None]:
    """Defer ``send_at`` (aware UTC) to the end of the subscriber's quiet window when it falls inside
    (:func:`quiet_until`; ``quiet``: ``"HH:MM-HH:MM"`` wall times in ``zone``, the subscriber's).

    Returns ``(send_at, reason)``; ``reason`` is None when nothing changed. A deferral that would land
    after ``due_at`` is not made: the reminder goes out inside the quiet hours rather than too late.
    Raises ``ValueError`` for a ``quiet`` that is not such a window (configuration loading refuses it).
    ``on_fallback``: as for :func:`quiet_until`.
    """
    if not quiet:
        return send_at, None
    until = quiet_until(send_at, parse_quiet_hours(quiet), zone, on_fallback)
    if until is None:
        return send_at, None
    deferred = until.astimezone(send_at.tzinfo)
    if deferred > due_at:
        return send_at, f"inside quiet hours {quiet}, not deferred: the window ends after the deadline"
    return deferred, f"deferred from {instant_text(send_at)} by quiet hours {quiet}"


def fingerprint(due_at: datetime, target: Target, zone: tzinfo | None = None, wall: datetime | None = None) -> str:
    """What the alert rows of an obligation derive from; equal fingerprints mean equal alerts.
    ``zone``: the deadline's own zone, whose calendar the offsets' days are counted in; ``wall``: the
    nominal wall time of a due instant inside a spring-forward gap (``PlannedObligation.wall``)."""
    parts = (due_at.isoformat(), tuple((o.days, o.seconds) for o in target.offsets), target.channels,
             target.quiet_hours, target.subscriber_tz, target.late_policy, str(zone))
    if wall is not None:
        # Only then: every other obligation keeps the fingerprint it is stored with (no re-plan of all
        # alerts), while one due in a gap, whose reminders counted from the wrong wall time, is re-planned.
        parts += (wall.isoformat(),)
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def merged_fingerprint(first: str, other: str) -> str:
    """The fingerprint of one obligation two subscriptions of one subscriber to one source ask for
    (planned once, with the reminders of both): ``first``'s (the obligation as planned so far, in the
    subscriptions' order) combined with ``other``'s. Planning and ``reminders_owed`` both combine
    with this, so what the check recomputes is what planning stored."""
    return hashlib.sha256((first + other).encode()).hexdigest()


def _freq(rrule: str | None) -> str | None:
    for part in (rrule or "").upper().split(";"):
        if part.startswith("FREQ="):
            return part[5:].strip()
    return None


def refused_frequency(rrule: str | None) -> str | None:
    """The ``FREQ`` of ``rrule`` (an RRULE value, or None) when planning refuses it
    (:data:`REFUSED_FREQUENCIES`: ``SECONDLY``, ``MINUTELY``), else None. Such a rule is never planned
    (a planning problem instead), so the watchers must not expect obligations of it."""
    freq = _freq(rrule)
    return freq if freq in REFUSED_FREQUENCIES else None


def zone_for(rule: RuleRecord, target: Target) -> tzinfo:
    """The deadline's own zone: the rule's ``tz``; a floating rule is read in the source's declared
    zone, else the subscriber's. Its wall time is expanded in this zone, and the calendar days of
    every offset are counted in it."""
    return resolve_zone(rule.tz or target.source_tz or target.subscriber_tz)


# How many of a source's rule ids a problem quotes: enough to show their shape (a UID's "@host").
RULE_ID_SAMPLE = 5


# A source's withdrawn rules: rule id -> the kinds of the record it last had
# (:func:`~deadline_pipeline.rules.rule_kinds` of its last record,
# :func:`~deadline_pipeline.store.plan_inputs.active_rules`).
Withdrawn = Mapping[str, Collection[str]]


def _name(target: Target) -> str:
    """How a problem's message starts: ``"subscription 'papers': "`` (``"subscription "`` unnamed)."""
    return f"subscription {target.subscription!r}: " if target.subscription else "subscription "


def _pattern_problem(target: Target, rules: list[tuple[int, RuleRecord]],
                     withdrawn: Withdrawn) -> list[PlanProblem] | None:
    """``None`` when ``target``'s rule patterns select an active rule of ``rules`` (non-empty); else
    the problem that they select none, as a one-item list — empty when they match a ``withdrawn``
    rule id (the source dropped it: nothing is owed)."""
    # any() stops at the first match: with the usual "*" this costs one fnmatch per target.
    if any(target.wants(r.rule_id) for _, r in rules):
        return None
    if any(target.wants(rid) for rid in withdrawn):
        return []
    ids = sorted(r.rule_id for _, r in rules)
    more = f", … ({len(ids)} in all)" if len(ids) > RULE_ID_SAMPLE else ""
    shown = ", ".join(repr(i) for i in ids[:RULE_ID_SAMPLE])
    return [PlanProblem(target.source, "*", f"{_name(target)}rule patterns {list(target.rule_patterns)} match no "
                        f"rule id of this source; its rule ids are [{shown}{more}] (patterns match the whole id, "
                        "fnmatch)")]


def _kinds_problem(target: Target, rules: list[tuple[int, RuleRecord]], withdrawn: Withdrawn,
                   of: str = "this source") -> PlanProblem | None:
    """The problem of ``target``'s ``kinds`` and ``exclude_kinds`` together admitting none of the
    active ``rules`` its patterns select (``of``: how the message names the source); ``None`` when
    they admit one, when neither is set, or when a ``withdrawn`` rule the patterns select was
    admitted. The message names what shut the rules out — ``kinds`` that match none of them, else
    ``exclude_kinds`` that exclude every one the ``kinds`` left — and the kinds those rules have."""
    kinds, exclude = target.kinds, target.exclude_kinds
    if not kinds and not exclude:
        return None
    selected = [r for _, r in rules if target.wants(r.rule_id)]
    if any(kinds_allow(kinds, exclude, r) for r in selected):
        return None
    if any(target.wants(rid) and kinds_admit(kinds, exclude, had) for rid, had in withdrawn.items()):
        return None
    present = sorted({k for r in selected for k in rule_kinds(r)})
    if kinds and not any(kinds_allow(kinds, (), r) for r in selected):
        what = f"kinds {list(kinds)} match no rule of {of}"
    else:
        # Excluded, not unmatched: `exclude_kinds: [submission]` meant to drop a conference's admin
        # dates drops every deadline of WACV, which types its paper deadlines `submission`, and
        # planned nothing for it while every check stayed green.
        left = f" that kinds {list(kinds)} select" if kinds else ""
        what = f"exclude_kinds {list(exclude)} exclude every rule of {of}{left}"
    return PlanProblem(target.source, "*", f"{_name(target)}{what}; its kinds are {present}")


def editions_left_out(target: Target, rules: list[tuple[int, RuleRecord]]) -> list[str]:
    """The editions (``extra["edition_id"]``, an ai-deadlines conference year) with active ``rules``
    that ``target``'s patterns select but none its ``kinds`` / ``exclude_kinds`` admit, sorted; ``[]``
    when neither is set. Information, not a problem: an edition that lists only its notification
    yet is rightly left out by ``kinds: [paper]``; but a kind named differently by one edition (WACV's
    ``submission``) left out every deadline of it while other editions kept the source's checks
    green, so the planning run logs these (:func:`~deadline_pipeline.plan.service.subscriptions_selection_problems`)."""
    if not target.kinds and not target.exclude_kinds:
        return []
    seen: set[str] = set()
    admitted: set[str] = set()
    for _, rule in rules:
        edition = rule.extra.get("edition_id")
        if edition is None or not target.wants(rule.rule_id):
            continue
        seen.add(str(edition))
        if kinds_allow(target.kinds, target.exclude_kinds, rule):
            admitted.add(str(edition))
    return sorted(seen - admitted)


def misspelt_kinds_problem(per_source: list[tuple[Target, list[tuple[int, RuleRecord]], Withdrawn]], *,
                           with_kinds: bool = True) -> PlanProblem | None:
    """The problem of one subscription's ``kinds`` / ``exclude_kinds`` entries that are no kind of any
    rule of its sources (active or withdrawn; ``per_source`` as for
    :func:`subscription_selection_problems`, every target of one subscription) but close to one
    (:func:`~deadline_pipeline.wording.near_name`): ``exclude_kinds: [submision]`` beside the kind ``submission``;
    ``with_kinds`` false: the ``exclude_kinds`` entries only. ``None`` when there is none. The
    message names the subscription, each entry by its key and the kind it nearly matches, and the
    kinds the sources have.

    Kinds are the sources' data (an ai-deadlines ``type`` is free text), so an entry no rule has is
    judged here, after ingest, not when the file is loaded. Such an entry matches nothing, so it
    never changes what is planned; an entry that nearly matches a kind the sources do have is a
    typo: in ``exclude_kinds`` every deadline of the kind meant was reminded (a conference's
    notification dates sent to its authors), in ``kinds`` beside a correct entry the kind meant was
    left out (``kinds: [abstract, papr]`` planned no paper deadline), and no check said a word. An
    entry near no kind the sources have is left alone: a kind they may give later."""
    target = per_source[0][0]
    if not (with_kinds and target.kinds) and not target.exclude_kinds:
        return None
    present = {k for _, rules, _ in per_source for _, r in rules for k in rule_kinds(r)}
    present |= {str(k).lower() for _, _, withdrawn in per_source for had in (withdrawn or {}).values() for k in had}
    found = []
    listed = (("kinds", (target.kinds or ()) if with_kinds else ()), ("exclude_kinds", target.exclude_kinds))
    for key, entries in listed:
        for entry in entries:
            # A `kinds` entry selects its aliases too: `paper` over WACV's `submission` is no typo.
            if (selected_kinds([entry]) if key == "kinds" else {entry.lower()}) & present:
                continue
            close = near_name(entry.lower(), present)
            if close:
                found.append(f"{key} entry {entry!r} (did you mean {close!r}?)")
    if not found:
        return None
    names = sorted({t.source for t, _, _ in per_source})
    verb = "is no kind" if len(found) == 1 else "are no kinds"
    return PlanProblem(", ".join(names), "*", f"{_name(target)}{', '.join(found)} {verb} of a rule of its sources "
                       f"{names}, so selects or excludes nothing; their kinds are {sorted(present)}")


def subscription_selection_problems(
        per_source: Iterable[tuple[Target, list[tuple[int, RuleRecord]], Withdrawn]]) -> list[PlanProblem]:
    """The selection problems of one subscription over its sources: rule patterns, or ``kinds`` and
    ``exclude_kinds``, that select none of a source's active rules, which would otherwise plan
    nothing for it in silence (a misspelt pattern, ``filing-1`` for the UID ``filing-1@example.org``,
    or kind, ``papr``; an exclusion that drops every rule of a source).
    ``per_source`` holds one ``(target, active rules, withdrawn)`` per source, the rules as
    ``(version, record)`` pairs (:data:`Withdrawn`).

    * Rule patterns are judged over the whole subscription: none when they select a rule in any
      judged source (a subscription over ``cal`` and ``conf`` with ``filing-*`` is meant for
      ``cal``'s filings). Otherwise one problem: a single judged source's own, or one naming every
      judged source (source field ``"cal, conf"``) with each source's rule ids.
    * ``kinds`` / ``exclude_kinds`` are judged per source, among the rules the patterns select
      there: one problem for each source none of whose selected rules they admit, naming the source,
      the kinds asked for (``submission`` where ``paper`` was asked) or the kinds excluded, and the
      kinds it has.
    * An entry of ``kinds`` / ``exclude_kinds`` that no rule of the sources has, but close to a kind
      one has (``submision``), is one more problem for the subscription
      (:func:`misspelt_kinds_problem`), last; a ``kinds`` entry only when ``kinds`` raised no problem
      above (which already names the kinds each source has).

    Not judged: a source with no rule in force (never ingested, or every rule withdrawn), which its
    own checks report; patterns that match only withdrawn rule ids, and kinds that only a withdrawn
    rule the patterns select was admitted by (the source dropped the deadline, e.g. a past
    conference's paper date; nothing is owed).
    """
    judged = [(t, rules, withdrawn or {}) for t, rules, withdrawn in per_source if rules]
    patterns, kinds = _selection_problems(judged)
    # A `kinds` list that admits nothing of a source is reported already, with that source's kinds;
    # the misspelt entry's own problem would say it twice.
    misspelt = misspelt_kinds_problem(judged, with_kinds=not kinds) if judged else None
    return patterns + kinds + ([misspelt] if misspelt else [])


def _selection_problems(judged: list[tuple[Target, list[tuple[int, RuleRecord]], Withdrawn]]
                        ) -> tuple[list[PlanProblem], list[PlanProblem]]:
    """:func:`subscription_selection_problems` of the sources with rules in force (``judged``) but the
    misspelt kinds (:func:`misspelt_kinds_problem`), as (the rule patterns' problems, the kinds' ones)."""
    patterns = [(t, _pattern_problem(t, rules, withdrawn)) for t, rules, withdrawn in judged]
    if judged and all(found for _, found in patterns):
        if len(judged) == 1:
            return patterns[0][1], []
        name = _name(judged[0][0])
        names = [t.source for t, _ in patterns]
        each = "; ".join(f"{t.source}: {p.message.removeprefix(name)}" for t, found in patterns for p in found)
        return [PlanProblem(", ".join(names), "*", f"{name}selects no rule in any of its sources {names} — {each}")], []
    # Kinds per source, unlike patterns: every source of a subscription is named in its `sources`
    # (the configuration has no wildcard for sources, and refuses a name it does not know), so each
    # is wanted for the kinds listed. Judged over the whole subscription, `sources: [all, wacv]` with
    # `kinds: [paper, abstract]` passed because `all` has paper deadlines, while WACV, which types
    # its paper deadline `submission`, had none planned and every check stayed green. A source whose
    # rules the patterns leave out is not judged on kinds (the patterns say it is not meant).
    # `exclude_kinds` is judged with them, per source alike.
    several = len(judged) > 1
    found = (_kinds_problem(t, rules, withdrawn, f"source {t.source!r}" if several else "this source")
             for (t, rules, withdrawn), (_, pattern) in zip(judged, patterns, strict=True) if pattern is None)
    return [], [p for p in found if p is not None]


def renamed_out_problem(target: Target, lineage: dict[str, str],
                        recorded_lineage: dict[str, str]) -> PlanProblem | None:
    """The problem of rules of ``target``'s source that were renamed out of its rule patterns: the
    patterns match an id the rule had (its first id, or one between) but not the id it has now, so
    its obligations are withdrawn although the source still states the deadline. ``None`` when there
    is none. ``lineage``: active rule id → the first id of a renamed rule
    (:attr:`~deadline_pipeline.store.plan_inputs.SourceRules.lineage`); ``recorded_lineage``: every
    renamed id, active or withdrawn → its first id, which gives the ids between.

    A publisher moving ``filing-1@x`` to ``irs-filing-1@x`` under ``rules: ["filing-*"]`` had every
    reminder of it cancelled as "no longer asked for" while every check stayed green: a pattern
    matching only withdrawn ids counts as "the source dropped it", and this one was not dropped."""
    earlier: dict[str, list[str]] = {}
    for rid, first in recorded_lineage.items():
        earlier.setdefault(first, []).append(rid)
    out = []
    for rid, first in sorted(lineage.items()):
        if target.wants(rid):
            continue
        matched = sorted(old for old in {first, *earlier.get(first, ())} if old != rid and target.wants(old))
        if matched:
            out.append(f"{matched[0]!r} is now {rid!r}")
    if not out:
        return None
    more = f", … ({len(out)} in all)" if len(out) > RULE_ID_SAMPLE else ""
    return PlanProblem(target.source, "*", f"{_name(target)}rule patterns {list(target.rule_patterns)} select "
                       f"rules of source {target.source!r} by ids it has renamed ({'; '.join(out[:RULE_ID_SAMPLE])}"
                       f"{more}): their reminders are withdrawn although the source still states them; add "
                       "the new ids to the patterns (or remove the old ones if the rules are not wanted)")


def plan_target(target: Target, rules: Iterable[tuple[int, RuleRecord]], now: datetime,
                horizon: timedelta = HORIZON, *, after: datetime | None = None, before: datetime | None = None,
                cache: dict | None = None,
                lineage: dict[str, str] | None = None) -> tuple[list[PlannedObligation], list[PlanProblem]]:
    """Obligations and alerts of one target for ``rules`` (``(version, record)`` pairs).

    Occurrences are those due inside ``[now - 15 min, now + horizon]``, further limited to
    ``[after, before)`` when given (a partition's month); ``now`` is aware UTC. ``cache`` memoises
    expansions across targets that share a rule and a zone. A rule that cannot be expanded (unknown
    zone, unreadable RRULE) is reported as a problem and skipped alone — never the other rules; a rule
    whose expansion is cut at the occurrence cap is planned up to the cut and reported as a problem.
    ``lineage``: rule_id → the id its obligations are keyed on (a renamed rule keeps its first id's
    obligations and their history; :attr:`~deadline_pipeline.store.plan_inputs.SourceRules.lineage`).
    Whether the subscription selects any rule at all is not judged here (it is one judgement per
    subscription, not per subscriber: :func:`subscription_selection_problems`).
    """
    cache = {} if cache is None else cache
    obs, problems = plan_obligations(target, rules, now, horizon, after=after, before=before, cache=cache,
                                     lineage=lineage)
    for ob in obs:
        ob.alerts = reminder_alerts(ob, target, now, cache)
    return obs, problems


def plan_obligations(target: Target, rules: Iterable[tuple[int, RuleRecord]], now: datetime,
                     horizon: timedelta = HORIZON, *, after: datetime | None = None,
                     before: datetime | None = None, cache: dict | None = None,
                     lineage: dict[str, str] | None = None) -> tuple[list[PlannedObligation], list[PlanProblem]]:
    """:func:`plan_target` without the alert rows: each obligation's key, due instant and fingerprint
    (what its alerts derive from), ``alerts`` left empty. Build them with :func:`reminder_alerts`
    only where the stored fingerprint differs: an unchanged re-plan never computes an alert."""
    lo, hi = window(now, horizon)
    if after is not None:
        lo = max(lo, after)
    if before is not None:
        hi = min(hi, before - timedelta(microseconds=1))
    out: list[PlannedObligation] = []
    problems: list[PlanProblem] = []
    # Masters first: an override is keyed as the occurrence of its master it replaces, in the form
    # (date or full label) the master's occurrences take in this window (``occurrence_identity``).
    rules = sorted(rules, key=lambda vr: REPLACES in vr[1].extra)
    seen: dict[str, tuple[bool, set[str] | frozenset[str]]] = {}
    profile = _profile(target)
    zone_version = zone_data.version()
    calendar_version = calendar_data_of(target.business_days[0]) if target.business_days else None
    engine_version = recurrence_engine_version()
    for version, rule in rules:
        if not target.wants_rule(rule):
            continue
        freq = refused_frequency(rule.rrule)
        if freq:
            # A reminder every second or minute is a data bug, not a deadline; planning it would flood
            # every subscriber. The rule is refused loudly (logged, counted in the plan's metadata).
            problems.append(PlanProblem(target.source, rule.rule_id,
                                        f"FREQ={freq} is refused: deadlines recur at most hourly"))
            continue
        try:
            zone, expanded = target_expansion(target, version, rule, lo, hi, cache)
            if target.quiet_hours:
                resolve_zone(target.subscriber_tz)  # an unknown subscriber zone is this rule's problem
        except (UnknownTimeZone, ValueError) as exc:
            problems.append(PlanProblem(target.source, rule.rule_id, str(exc)))
            continue
        occurrences = expanded.occurrences
        if expanded.cut_at is not None:
            # What was expanded is planned; the occurrences past the cut are not, and only the log said
            # so while plan_complete and `run` stayed green (a silent miss of every later reminder).
            problems.append(PlanProblem(target.source, rule.rule_id, cap_problem(expanded.cut_at, hi)))
        identity, periods = occurrence_identity(rule, occurrences, lineage, seen)
        zone_name = str(zone)
        # Only an RRULE or RDATE is expanded by the engine: naming its upgrade as the cause of a
        # one-off date's move would name something that never computed it.
        engine = engine_version if rule.rrule or rule.rdates else None
        for occ, period in zip(occurrences, periods, strict=True):
            key = obligation_key(target.tenant, target.subscriber, target.source, identity, period)
            out.append(PlannedObligation(key, target.tenant, target.subscriber_id, target.source_id, rule.rule_id,
                                         version, period, rule.title, occ.due_at,
                                         _fingerprint(occ.due_at, target, zone, profile, cache, occ.wall),
                                         zone=zone_name, tz=zone, zone_data=zone_version,
                                         calendar_data=calendar_version, recurrence_engine=engine,
                                         wall=occ.wall))
    return out, problems


def target_expansion(target: Target, version: int, rule: RuleRecord, lo: datetime, hi: datetime,
                     cache: dict | None) -> tuple[tzinfo, Expansion]:
    """``(zone, expansion)`` of ``rule`` (``version``) for ``target`` over ``[lo, hi]`` (aware UTC):
    in the deadline's zone (:func:`zone_for`), rolled by the target's business days. ``cache``
    memoises it across targets that share the source, rule version, zone and calendar (None: not
    memoised). Raises :class:`~deadline_pipeline.timezones.UnknownTimeZone` for an unknown zone and
    ``ValueError`` for a rule that cannot be expanded (over the work budget included)."""
    zone = zone_for(rule, target)
    ckey = (target.source_id, rule.rule_id, version, str(zone), lo, hi, id(target.business_days))
    expanded: Expansion | None = cache.get(ckey) if cache is not None else None
    if expanded is None:
        expanded = expansion(rule, zone, after=lo, before=hi, business_days=target.business_days)
        if cache is not None:
            cache[ckey] = expanded
    return zone, expanded


#: ``seen``'s entry of a one-off rule (:func:`occurrence_identity`): its override is keyed ``once`` too.
#: One object shared by every plan of the process and compared by identity, so it is immutable: a
#: ``taken.add`` reaching it would have given every later one-off's entry that period too.
_ONE_OFF: tuple[bool, frozenset[str]] = (False, frozenset({ONCE}))


def occurrence_identity(rule: RuleRecord, occurrences: list, lineage: dict[str, str] | None,
                        seen: dict[str, tuple[bool, set[str] | frozenset[str]]]) -> tuple[str, list[str]]:
    """The id the obligations of ``rule``'s ``occurrences`` (its expansion in one window) are keyed on,
    and each one's period: :data:`ONCE` for a one-off; for a recurring rule its local date when the
    rule yields at most one per day in the window (a revised time of day then moves the obligation
    instead of replacing it: the reminder moves, a delivered one gets a correction), else the full
    local label. A RECURRENCE-ID override (``extra[REPLACES]``, :func:`~.recurrence.apply_overrides`)
    is keyed as the occurrence of its master it replaces, so an override added by a revision moves
    that occurrence: before, it was a deadline of its own and the occurrence was withdrawn with a
    cancellation notice where a reminder had been delivered. ``lineage``: rule id → the id its
    obligations are keyed on (a renamed rule's first id). ``seen``: id → (whether by date, periods
    taken) of the recurring rules keyed so far in this window, updated; a master must come before its
    overrides. An override falls back to the full label when its date is taken by another occurrence
    of its series (two obligations must never share a key)."""
    def keyed_on(rule_id: str) -> str:
        return lineage.get(rule_id, rule_id) if lineage else rule_id

    replaces = rule.extra.get(REPLACES)
    if replaces is not None and not (rule.rrule or rule.rdates):
        identity = keyed_on(master_id_of(rule) or rule.rule_id)
        if seen.get(identity) is _ONE_OFF:
            # The override of a one-off's one occurrence is that one-off, moved: keyed as it was
            # (``once``), the move is a correction, not a cancellation and a new deadline.
            return identity, [ONCE] * len(occurrences)
        # A master with no occurrence in this window is keyed by date (its one-a-day default).
        by_date, taken = seen.setdefault(identity, (True, set()))
        period = replaces[:10] if by_date and replaces[:10] not in taken else replaces
        if occurrences:
            taken.add(period)
        return identity, [period] * len(occurrences)
    identity = keyed_on(rule.rule_id)
    if not (rule.rrule or rule.rdates):
        seen[identity] = _ONE_OFF
        return identity, [ONCE] * len(occurrences)
    by_date = len({o.period[:10] for o in occurrences}) == len(occurrences)
    periods = [o.period[:10] if by_date else o.period for o in occurrences]
    seen[identity] = (by_date, set(periods))
    return identity, periods


def _profile(target: Target) -> tuple:
    """Everything of a target the alert rows of one due instant depend on (offsets as written too,
    since an alert shows its offset as written)."""
    return (tuple((o.days, o.seconds, o.written) for o in target.offsets), target.channels, target.quiet_hours,
            target.subscriber_tz, target.late_policy)


def _fingerprint(due_at: datetime, target: Target, zone: tzinfo, profile: tuple, cache: dict | None,
                 wall: datetime | None = None) -> str:
    """:func:`fingerprint`, memoised in ``cache``: subscribers sharing a rule, zone and subscription
    shape share it (a large plan has many obligations, few distinct fingerprints)."""
    if cache is None:
        return fingerprint(due_at, target, zone, wall)
    ckey = ("fingerprint", due_at, wall, str(zone), profile)
    fp = cache.get(ckey)
    if fp is None:
        fp = cache[ckey] = fingerprint(due_at, target, zone, wall)
    return fp


def reminder_alerts(ob: PlannedObligation, target: Target, now: datetime,
                    cache: dict | None = None, *, moved: bool = False) -> list[PlannedAlert]:
    """The reminder alerts ``target`` owes for obligation ``ob`` (planned by :func:`plan_obligations`
    for that target): one per offset and channel, with its send instant (calendar-day offsets in the
    deadline's zone, quiet hours), late ones folded (:func:`fold_late`). ``cache`` memoises the
    instants and statuses, which depend on the due instant and the subscription's shape only; the
    dedup keys are the obligation's own. ``moved``: ``ob`` is stored already and a revision changed
    its due instant (late ones then fold as under ``send_latest`` even for ``skip``)."""
    template = _template(ob, target, now, cache, moved)
    keys = reminder_dedup_keys(ob.key, ob.due_at, [slot for slot, _ in template])
    return [PlannedAlert(seconds, channel, "reminder", key, send_at, status, reason, ob.due_at, offset)
            for ((seconds, channel, send_at, status, reason), offset), key in zip(template, keys, strict=True)]


def reminder_rows(ob: PlannedObligation, target: Target, now: datetime,
                  cache: dict | None = None, *, moved: bool = False,
                  owed_since: datetime | None = None) -> list[tuple[tuple, str]]:
    """:func:`reminder_alerts` as ``(slot, dedup_key)`` pairs, ``slot`` = ``(offset_seconds, channel,
    send_at, status, status_reason)``: what a large plan writes, without an object per alert. The
    slot tuples are shared by every obligation with the same due instant and subscription shape
    (do not mutate them). ``moved`` as for :func:`reminder_alerts`, ``owed_since`` as for
    :func:`fold_late`."""
    template = _template(ob, target, now, cache, moved, owed_since)
    slots = [slot for slot, _ in template]
    return list(zip(slots, reminder_dedup_keys(ob.key, ob.due_at, slots), strict=True))


def _template(ob: PlannedObligation, target: Target, now: datetime, cache: dict | None,
              moved: bool = False, owed_since: datetime | None = None) -> list[tuple]:
    # The nominal wall time is part of the key: 02:30 in a gap and 03:30 share an instant, not reminders.
    ckey = ("alerts", ob.due_at, ob.wall, ob.zone, _profile(target), now, moved, owed_since)
    template = cache.get(ckey) if cache is not None else None
    if template is None:
        template = _alert_template(ob.due_at, target, ob.tz or resolve_zone(ob.zone), now, moved, owed_since,
                                   ob.wall, cache.count_gap_rule_fallback if isinstance(cache, PlanMemo) else None)
        if cache is not None:
            cache[ckey] = template
    return template


def _alert_template(due_at: datetime, target: Target, zone: tzinfo, now: datetime,
                    moved: bool = False, owed_since: datetime | None = None,
                    wall: datetime | None = None, on_fallback: Callable[[], None] | None = None) -> list[tuple]:
    """``((offset seconds, channel, send_at, status, status_reason), offset)`` of each reminder of one
    due instant for ``target``'s subscription shape (``moved``: see :func:`fold_late`; ``wall``: the
    due instant's nominal wall time when a gap skips it, ``PlannedObligation.wall``; ``on_fallback``:
    as for :func:`quiet_until`)."""
    subscriber_zone = resolve_zone(target.subscriber_tz) if target.quiet_hours else None
    alerts: list[PlannedAlert] = []
    for offset in target.offsets:
        seconds = offset.nominal_seconds
        send_at, reason = apply_quiet_hours(send_instant(due_at, offset, zone, wall), due_at,
                                            target.quiet_hours, subscriber_zone, on_fallback)
        for channel in target.channels:
            alerts.append(PlannedAlert(seconds, channel, "reminder", "", send_at, status_reason=reason,
                                       due_at=due_at, offset=offset))
    fold_late(alerts, now, target.late_policy, moved=moved, owed_since=owed_since)
    if target.quiet_hours:
        for a in alerts:
            if a.status == AlertState.PENDING and a.send_at <= now:
                # A late reminder goes out now — unless now is inside the subscriber's quiet
                # hours, where it waits for the window's end like any other reminder.
                later, why = apply_quiet_hours(now, due_at, target.quiet_hours, subscriber_zone, on_fallback)
                if later != now:
                    a.send_at, a.status_reason = later, f"{a.status_reason}; {why}"
    return [((a.offset_seconds, a.channel, a.send_at, a.status, a.status_reason), a.offset) for a in alerts]
