"""The watchdog: the pipeline's invariants evaluated straight from the store, sharing nothing with the
Dagster daemon or the stages' code path (no dagster, no orchestration, no stage services), so it
still speaks when the daemon, the sensor or the pipeline's own code is what broke.

It reads the store through the named statements of :mod:`deadline_pipeline.store.health` and evaluates:

* reconciliation — alerts overdue past the grace window, and ``delivered`` alerts without a
  ``sent`` receipt;
* heartbeats — the sweep (``deliver`` or ``deliver:idle``) within ``sweep_interval + grace``,
  planning (``plan``) and each source's ingest (``ingest:<name>``) within ``plan_interval + grace``;
  a heartbeat whose last run ``crashed`` is red too, and so is one completed after the watchdog's now;
* time travel — any heartbeat, delivery receipt or source fetch recorded after the watchdog's now
  (beyond :data:`CLOCK_SKEW`) is red by itself: a replay (``--as-of``) wrote into a live store, or
  clocks disagree. Without this a future heartbeat read as "completed -1 day ago (ok)" and hid a
  dead sweep for as long as the replay was ahead;
* clocks — this host's clock within :data:`CLOCK_SKEW` of the store's (``clock_agrees``): the rows
  above judge ages by this host's clock, so one hours behind hid reminders it held back; and so the
  clock of every process whose live heartbeat of the last plan interval recorded its offset (a
  sweeper on another host, hours behind, claims nothing due);
* escalations — escalated alerts no human has acknowledged yet (``escalations_acknowledged``), saying
  so when the last sweep's heartbeat (``deliver``, outcome ``notices_failed``) could not send every
  escalation notice;
* freshness and quarantine of each source, with the pure rules of
  :mod:`deadline_pipeline.watch.sources` (``evaluate_fresh`` / ``evaluate_not_quarantined``).

It also holds what the paging sensor and ``watchdog --notify`` share: the incident bookkeeping
(:func:`incident_notices` / :func:`record_notice`, state as JSON-safe dicts) and
:func:`send_notice`, which pages the escalation channels with one notice as an incident
(``incident.triggered`` / ``incident.resolved`` under a stable incident key, see
:mod:`deadline_pipeline.deliver.incident`), never in a reminder's shape.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from deadline_pipeline.config import DeadlinesConfig, WatchConfig
from deadline_pipeline.instants import instant_text
from deadline_pipeline.plan.first_seen import LOOKBACK as FIRST_SEEN_LOOKBACK
from deadline_pipeline.store.health import (
    count_escalated_unacknowledged,
    count_unreceipted_deliveries,
    future_instants,
    oldest_escalated_unacknowledged_ids,
    overdue_alerts,
    read_heartbeats,
    source_health_rows,
)
from deadline_pipeline.store.sources import all_sources
from deadline_pipeline.watch.checks import CLOCK_SKEW, clock_agrees, oldest_text, plan_complete, time_data_agrees
from deadline_pipeline.watch.reconcile import reminders_owed, unwatched_misses
from deadline_pipeline.watch.sources import SourceState, evaluate_fresh, evaluate_not_quarantined, rules_complete
from deadline_pipeline.wording import human_duration

if TYPE_CHECKING:
    from deadline_pipeline.deliver.incident import Incident

log = logging.getLogger(__name__)

SWEEP_COMPONENTS = ("deliver", "deliver:idle")


@dataclass
class WatchRow:
    """One line of the watchdog's table: ``check`` (e.g. ``source_fresh``), ``target`` (e.g. the
    source name, or ``-``), ``ok``, ``detail`` (one line, the reason when red)."""

    check: str
    target: str
    ok: bool
    detail: str

    @property
    def key(self) -> str:
        """The incident identity: stable while the same thing stays broken."""
        return f"{self.check}:{self.target}"


@dataclass
class WatchReport:
    now: datetime
    rows: list[WatchRow] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return all(r.ok for r in self.rows)

    @property
    def failing(self) -> list[WatchRow]:
        return [r for r in self.rows if not r.ok]

    def table(self) -> str:
        """The rows as a fixed-width text table (status, check, target, detail)."""
        width_c = max([len("CHECK")] + [len(r.check) for r in self.rows])
        width_t = max([len("TARGET")] + [len(r.target) for r in self.rows])
        lines = [f"{'STATE':<5}  {'CHECK':<{width_c}}  {'TARGET':<{width_t}}  DETAIL"]
        for r in self.rows:
            lines.append(f"{'ok' if r.ok else 'FAIL':<5}  {r.check:<{width_c}}  {r.target:<{width_t}}  {r.detail}")
        return "\n".join(lines)


def _reconciliation(conn, now: datetime, grace: timedelta) -> list[WatchRow]:
    overdue, oldest = overdue_alerts(conn, now - grace, 1)
    forged = count_unreceipted_deliveries(conn)
    rows = [WatchRow("alerts_reconciled", "overdue", overdue == 0,
                     f"{overdue} alert(s) due before {instant_text(now - grace)} not delivered/escalated/cancelled; "
                     f"oldest due {oldest_text(oldest[0]) if oldest else '-'}" if overdue else
                     f"nothing overdue past the {human_duration(grace)} grace window"),
            WatchRow("alerts_reconciled", "receipts", forged == 0,
                     f"{forged} alert(s) marked delivered without a 'sent' delivery attempt" if forged else
                     "every delivered alert has its 'sent' receipt")]
    return rows


def _escalations_row(conn, beats: dict) -> WatchRow:
    # An escalation is the loud end of a failed delivery; until a human acknowledges it, it is an
    # open incident the watchdog must keep reporting (cron, without the Dagster daemon).
    count = count_escalated_unacknowledged(conn)
    oldest = oldest_escalated_unacknowledged_ids(conn, 3)
    shown = ", ".join(f"alert {i}" for i in oldest)
    detail = f"{count} escalated alert(s) not acknowledged" + (f" (oldest: {shown}; "
                                                               "`deadline-pipeline alerts acknowledge ID`)"
                                                               if count else "")
    last = beats.get("deliver") or {}
    if count and last.get("last_outcome") == "notices_failed":
        # The notices are the on-call's only word of an escalation: when the last sweep could not
        # send them, the unacknowledged alerts above may be unknown to anyone.
        detail += (f"; the last delivery sweep could not send every escalation notice, so the on-call may not "
                   f"know ({last.get('detail')})")
    return WatchRow("escalations_acknowledged", "alerts", count == 0, detail)


def _heartbeat_row(check: str, target: str, beats: dict, components: tuple[str, ...], now: datetime,
                   allowed: timedelta) -> WatchRow:
    seen = [beats[c] for c in components if c in beats and beats[c]["last_completed_at"]]
    if not seen:
        return WatchRow(check, target, False, f"never completed (no heartbeat {' / '.join(components)})")
    newest = max(seen, key=lambda b: b["last_completed_at"])
    age = now - newest["last_completed_at"]
    if age < -CLOCK_SKEW:
        return WatchRow(check, target, False, f"completed {instant_text(newest['last_completed_at'])}, "
                        f"{human_duration(-age)} in the future of now: proves nothing (a replay wrote into a live "
                        "store, or clocks disagree)")
    crashed = [b for b in (beats.get(c) for c in components) if b and b["last_outcome"] == "crashed"]
    if age > allowed:
        return WatchRow(check, target, False, f"stopped: last completed {instant_text(newest['last_completed_at'])}, "
                        f"{human_duration(age)} ago (allowed {human_duration(allowed)}); "
                        f"last outcome {newest['last_outcome']}")
    if crashed:
        return WatchRow(check, target, False, f"last run crashed: {crashed[0]['detail']}")
    return WatchRow(check, target, True, f"completed {human_duration(age)} ago ({newest['last_outcome']})")


def _unwatched_row(conn, now: datetime) -> WatchRow:
    """``passed_unwatched``: deadlines first seen in the last week after they passed while their
    source was not fetched (plan.first_seen). Counted always; red while one has no reminder in the
    outbox (planning did not leave the one the sweep escalates: nobody, not even on-call, was told).
    The escalated ones stay red in ``escalations_acknowledged`` until a human acknowledges them."""
    found = unwatched_misses(conn, {s.id: s.name for s in all_sources(conn)}, now - FIRST_SEEN_LOOKBACK)
    silent = [j for j, statuses in found if not statuses]
    if not found:
        return WatchRow("passed_unwatched", "sources", True,
                        f"no deadline passed while its source was not fetched (first seen since "
                        f"{instant_text(now - FIRST_SEEN_LOOKBACK)})")
    head = silent[0] if silent else found[0][0]
    return WatchRow("passed_unwatched", "sources", not silent,
                    f"{len(found)} deadline(s) passed while their source was not fetched, {len(silent)} never "
                    f"escalated; first: {head.describe()}")


def _source_states(conn, names: list[str] | None) -> dict[str, SourceState]:
    return {r[0]: SourceState(*r) for r in source_health_rows(conn, names)}


def evaluate(engine: Engine, now: datetime, cfg: DeadlinesConfig | None = None,
             host_now: datetime | None = None) -> WatchReport:
    """Every invariant at ``now`` (aware UTC). ``cfg`` gives the intervals and the list of sources
    (a configured source missing from the store is red); without it the defaults apply and every
    source in the store is watched. ``host_now`` (aware UTC, default this host's real clock, also
    under a replayed ``now``) is what ``clock_agrees`` compares with the store's clock. A store that
    cannot be read is one red row, never an exception."""
    watch = cfg.watch if cfg else WatchConfig()
    grace = timedelta(minutes=watch.grace_minutes)
    hb_grace = timedelta(minutes=watch.heartbeat_grace_minutes)
    plan_allowed = timedelta(minutes=watch.plan_interval_minutes) + hb_grace
    report = WatchReport(now)
    names = [s.name for s in cfg.sources] if cfg else None
    try:
        with engine.connect() as conn:
            report.rows += _reconciliation(conn, now, grace)
            beats = read_heartbeats(conn)
            report.rows.append(_escalations_row(conn, beats))
            states = _source_states(conn, names)
            report.rows.append(_unwatched_row(conn, now))
            ahead = future_instants(conn, now + CLOCK_SKEW)
    except Exception as exc:  # the watchdog's one job is to say so, not to crash silently in cron
        log.error("watchdog: cannot read the store: %s", exc)
        report.rows.append(WatchRow("store", "-", False, f"cannot read the store: {exc.__class__.__name__}: {exc}"))
        return report
    report.rows.append(WatchRow(
        "time_travel", "store", not ahead,
        (f"{len(ahead)} record(s) in the future of now: "
         + ", ".join(f"{what} at {instant_text(when)}" for what, when in ahead[:5])
         + "; a replay (--as-of) wrote into a live store, or clocks disagree") if ahead
        else f"nothing recorded after now (+{CLOCK_SKEW} skew)"))
    report.rows.append(_heartbeat_row("sweep_alive", "deliver", beats, SWEEP_COMPONENTS, now,
                                      timedelta(minutes=watch.sweep_interval_minutes) + hb_grace))
    report.rows.append(_heartbeat_row("plan_alive", "plan", beats, ("plan",), now, plan_allowed))
    # Planning that ran on time but reported problems (its heartbeat says "partial").
    planned = plan_complete(engine, now)
    report.rows.append(WatchRow("plan_complete", "plan", planned.passed, planned.summary))
    # Processes on different zone data or holiday calendars put one deadline at two instants (the
    # real clock: recent heartbeats).
    agrees = time_data_agrees(engine, datetime.now(UTC), timedelta(minutes=watch.plan_interval_minutes))
    report.rows.append(WatchRow("time_data_agrees", "time data", agrees.passed, agrees.summary))
    # A host clock hours behind the store's holds every reminder back while the rows above, judged
    # by that same clock, stay green: this host's, and those the recent heartbeats recorded (a
    # sweeper on another host).
    clocks = clock_agrees(engine, host_now or datetime.now(UTC),
                          window=timedelta(minutes=watch.plan_interval_minutes))
    report.rows.append(WatchRow("clock_agrees", "host clock", clocks.passed, clocks.summary))
    windows = {s.name: s.freshness_window for s in cfg.sources} if cfg else {}
    for name in names if names is not None else sorted(states):
        state = states.get(name)
        report.rows.append(_heartbeat_row("ingest_alive", name, beats, (f"ingest:{name}",), now, plan_allowed))
        window = windows.get(name) or timedelta(seconds=state.freshness_seconds if state else 0)
        fresh = evaluate_fresh(name, state, now, window)
        report.rows.append(WatchRow("source_fresh", name, fresh.passed, fresh.summary))
        quarantine = evaluate_not_quarantined(name, state)
        report.rows.append(WatchRow("source_not_quarantined", name, quarantine.passed, quarantine.summary))
        complete = rules_complete(engine, name)
        report.rows.append(WatchRow("rules_complete", name, complete.passed, complete.summary))
    if cfg is not None:
        # Recomputed from the rule versions in force, so it sees a reminder that was never planned.
        try:
            owed = reminders_owed(engine, cfg, now, grace)
            report.rows.append(WatchRow("reminders_owed", "alerts", owed.passed, owed.summary))
        except Exception as exc:  # noqa: BLE001 — a broken check is a red row, never a crashed watchdog
            log.exception("watchdog: reminders_owed failed")
            report.rows.append(WatchRow("reminders_owed", "alerts", False,
                                        f"reconciliation failed: {exc.__class__.__name__}: {exc}"))
    return report


# ---------------------------------------------------------------------------------------------------
# Incidents: once per incident, a reminder while it stays open, a resolved notice when it clears.


@dataclass(frozen=True)
class Problem:
    """What is red now, as an incident sees it: ``check`` (``source_fresh``, ``run``) on ``target``
    (a source, an asset key, a job) watched by ``component`` (``watchdog``, ``dagster``, …; see
    :mod:`deadline_pipeline.deliver.incident`), with a one-line ``summary``. ``severity``: one of
    ``critical|error|warning|info``, by default :func:`~deadline_pipeline.deliver.incident.severity_for`
    the check. ``links``: ``(text, Dagster UI route)`` pairs, e.g. ``("run 1a2b", "/runs/1a2b")``."""

    check: str
    target: str
    summary: str
    component: str = "pipeline"
    severity: str = ""
    links: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.severity:
            from deadline_pipeline.deliver.incident import severity_for

            object.__setattr__(self, "severity", severity_for(self.check))

    def to_state(self) -> dict:
        """The JSON-safe form kept in the incident state (so a resolve knows what it resolves)."""
        return {"check": self.check, "target": self.target, "component": self.component,
                "severity": self.severity, "links": [list(link) for link in self.links]}

    @classmethod
    def from_state(cls, saved: dict | None, key: str, summary: str) -> Problem:
        """The problem saved by :meth:`to_state`; for state written before problems were kept (or
        edited beyond reading), the incident's state key stands for its check. Never raises: the
        resolve of an incident must go out whatever its stored state looks like."""
        from deadline_pipeline.deliver.incident import SEVERITIES

        try:
            links = tuple((str(text), str(path)) for text, path in saved.get("links", []))
            severity = saved.get("severity") if saved.get("severity") in SEVERITIES else ""
            return cls(str(saved["check"]), str(saved["target"]), summary, str(saved.get("component", "pipeline")),
                       severity, links)
        except (AttributeError, KeyError, TypeError, ValueError):
            return cls(check=key, target="-", summary=summary)


@dataclass(frozen=True)
class Notice:
    """One message to the escalation channels. ``phase``: ``opened`` | ``reminder`` | ``resolved``.
    ``problem``: what the incident is about (its check and target give the incident key); ``None``
    stands for ``Problem(check=key, target="-")``."""

    key: str
    phase: str
    title: str
    detail: str
    opened_at: datetime
    number: int = 0
    problem: Problem | None = None

    @property
    def about(self) -> Problem:
        return self.problem or Problem(check=self.key, target="-", summary=self.detail)

    @property
    def dedup_key(self) -> str:
        """Stable for this notice (a resend after an unknown outcome is recognisable), distinct per notice."""
        raw = f"{self.key}|{self.opened_at.isoformat()}|{self.phase}|{self.number}"
        return hashlib.sha256(raw.encode()).hexdigest()


def incident_notices(state: dict, failing: dict[str, str | Problem], now: datetime,
                     reminder: timedelta) -> list[Notice]:
    """Update ``state`` (state key → ``{"opened_at", "summary", "notified_at", "reminders",
    "problem"}``, JSON-safe, mutated in place) from ``failing`` (state key → the :class:`Problem`
    red now, or just its one-line summary) and return the notices due at ``now`` (aware UTC).

    An incident stays the *same* incident, whatever its summary says, until its key stops failing:
    a backlog that drains partially changes the count in the summary and pages nobody again. A new
    incident's notice stays due until :func:`record_notice` confirms it was sent. Each notice
    carries its problem, so a resolve names the same check and target (the same incident key) as
    the trigger, even after the process that triggered it is gone.
    """
    out: list[Notice] = []
    for key, value in failing.items():
        problem = value if isinstance(value, Problem) else Problem(check=key, target="-", summary=value)
        inc = state.get(key)
        if inc is None:
            inc = state[key] = {"opened_at": now.isoformat(), "summary": problem.summary, "notified_at": None,
                                "reminders": 0}
        inc["summary"], inc["problem"] = problem.summary, problem.to_state()
        notice = _open_notice(key, inc, problem, now, reminder)
        if notice is not None:
            out.append(notice)
    for key in [k for k in state if k not in failing]:
        inc = state[key]
        if inc["notified_at"] is None:
            del state[key]  # it healed before anyone was told: nothing to resolve
            continue
        opened = datetime.fromisoformat(inc["opened_at"])
        out.append(Notice(key, "resolved", f"[deadline-pipeline] resolved: {key} passes again "
                          f"(failing since {instant_text(opened)})", f"was: {inc['summary']}", opened,
                          problem=Problem.from_state(inc.get("problem"), key, inc["summary"])))
    return out


def _open_notice(key: str, inc: dict, problem: Problem, now: datetime, reminder: timedelta) -> Notice | None:
    """The notice due for the open incident ``inc`` at ``now``: its first page until one was sent,
    then a reminder every ``reminder``; ``None`` in between."""
    summary = problem.summary
    opened = datetime.fromisoformat(inc["opened_at"])
    if inc["notified_at"] is None:
        return Notice(key, "opened", f"[deadline-pipeline] {key} failed: {summary}", summary, opened, problem=problem)
    if now - datetime.fromisoformat(inc["notified_at"]) >= reminder:
        return Notice(key, "reminder", f"[deadline-pipeline] still failing since {instant_text(opened)}: {key}: "
                      f"{summary}", summary, opened, inc["reminders"] + 1, problem=problem)
    return None


def record_notice(state: dict, notice: Notice, now: datetime) -> None:
    """Record in ``state`` that ``notice`` was sent at ``now``; a resolved incident is forgotten."""
    if notice.phase == "resolved":
        state.pop(notice.key, None)
        return
    inc = state.get(notice.key)
    if inc is not None:
        inc["notified_at"] = now.isoformat()
        if notice.phase == "reminder":
            inc["reminders"] = notice.number


def notice_incident(notice: Notice, now: datetime, esc) -> Incident:
    """The :class:`~deadline_pipeline.deliver.incident.Incident` a notice pages about at ``now``:
    ``triggered`` for the first page and its reminders, ``resolved`` (ended ``now``) for the resolve;
    the incident key from the notice's check and target. ``esc``: the
    :class:`~deadline_pipeline.config.EscalationConfig` (the Dagster UI's base URL for links; the
    reminder interval, twice which an Alertmanager alert stays firing without a repeat)."""
    from deadline_pipeline.deliver.incident import Incident, Link

    about = notice.about
    resolved = notice.phase == "resolved"
    return Incident(
        component=about.component, check=about.check, target=about.target,
        status="resolved" if resolved else "triggered", severity=about.severity, summary=notice.title,
        detail=notice.detail, started_at=notice.opened_at, at=now, ended_at=now if resolved else None,
        links=tuple(Link(text, path).under(esc.dagster_ui_url) for text, path in about.links),
        notice=notice.phase, repeat=notice.number,
        expires_at=None if resolved else now + 2 * timedelta(minutes=esc.reminder_minutes),
        client_url=esc.dagster_ui_url,
    )


def send_notice(cfg: DeadlinesConfig, notice: Notice, now: datetime) -> list[str]:
    """Send ``notice`` on every channel of ``cfg.escalation.channels``; returns the errors (empty =
    every channel took it). Raises nothing: a failed page is returned for the caller to log and retry.

    Uses the channels of the delivery stage, one message per channel: a page (kind ``incident``,
    :func:`notice_incident`), sent as ``incident.triggered`` while open and ``incident.resolved``
    when it clears, under the same incident key; the recipient is ``escalation.email``,
    ``escalation.webhook_url`` or ``escalation.apprise_target``. No escalation channel configured is
    an error, never a silent no-op. Each channel's page ends within that channel's
    ``timeout_seconds`` for the webhook, slack and smtp channels, however slowly the receiver answers.
    """
    from deadline_pipeline.deliver.channels.registry import build_channel
    from deadline_pipeline.deliver.notification import incident_notification, notice_error

    esc = cfg.escalation
    if not esc.channels:
        return ["no escalation channel is configured (escalation.channels is empty)"]
    try:
        note = incident_notification(notice_incident(notice, now, esc), esc, notice.dedup_key)
    except ValueError as exc:  # a page that cannot be built is a failed page, reported, not a crash
        return [f"cannot build the page for {notice.key}: {exc}"]
    errors = []
    for name in esc.channels:
        channel = None
        try:
            channel = build_channel(name, cfg.channels[name], network=cfg.network.policy())
            channel.send(note)
        except Exception as exc:  # one broken channel must not stop the page on the others
            from deadline_pipeline.security.redact import redact

            errors.append(redact(f"escalation channel {name!r}: {notice_error(exc)}"))
        finally:
            if channel is not None:
                try:
                    channel.close()
                except Exception as exc:  # closing must not hide whether the page went out
                    log.warning("escalation channel %s: close failed: %s", name, exc)
    return errors
