"""Source health as plain functions of the store and a clock: is each source fresh, is it quarantined?

"Nothing is due" and "the source has been dead for three days" look the same downstream; these
checks tell them apart. The Dagster asset checks (:mod:`deadline_pipeline.orchestration.source_checks`)
and any command-line watcher call these, so the UI and cron agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Engine

from deadline_pipeline.instants import instant_text
from deadline_pipeline.store import sources as sql
from deadline_pipeline.watch.checks import CLOCK_SKEW
from deadline_pipeline.wording import human_duration


@dataclass
class SourceCheckOutcome:
    """One check of one source. ``metadata`` is JSON-safe: ``last_fresh_at`` (ISO UTC to the second, or None),
    ``last_error``, ``window`` (ISO-like text and ``window_seconds``), ``snapshot_id`` (the latest
    snapshot, or None), ``status`` (the source row's status)."""

    name: str
    source: str
    passed: bool
    summary: str
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SourceState:
    """What the store knows about one source's health (``None`` fields: never happened)."""

    name: str
    status: str
    freshness_seconds: int
    last_fresh_at: datetime | None
    last_attempt_at: datetime | None
    last_error: str | None
    latest_snapshot_id: int | None
    latest_snapshot_status: str | None


def read_source_state(engine: Engine, name: str) -> SourceState | None:
    """The health facts of the source ``name`` from the store, or None when it was never synced."""
    with engine.connect() as conn:
        row = sql.find_source(conn, name)
        if row is None:
            return None
        latest = sql.latest_snapshot(conn, row.id)
    return SourceState(row.name, row.status, row.freshness_seconds, row.last_fresh_at, row.last_attempt_at,
                       row.last_error, latest.id if latest else None, latest.parse_status if latest else None)


def _metadata(state: SourceState | None, window: timedelta) -> dict:
    return {
        # Written as the summary writes them (whole seconds), so the two never disagree in the UI.
        "last_fresh_at": instant_text(state.last_fresh_at) if state and state.last_fresh_at else None,
        "last_attempt_at": instant_text(state.last_attempt_at) if state and state.last_attempt_at else None,
        "last_error": state.last_error if state else None,
        "window": str(window),
        "window_seconds": int(window.total_seconds()),
        "snapshot_id": state.latest_snapshot_id if state else None,
        "status": state.status if state else "unknown",
    }


def evaluate_fresh(name: str, state: SourceState | None, now: datetime, window: timedelta) -> SourceCheckOutcome:
    """``source_fresh``: passes when the source was fresh within ``window`` before ``now`` (aware UTC)
    and its last attempt did not fail. Pure.

    Fails (each with its reason in ``summary``) when the source was never ingested, never fresh,
    last fresh longer ago than ``window`` or later than ``now`` (beyond :data:`CLOCK_SKEW`), or is
    ``stale`` (its last fetch or parse failed: the last good versions are still in force, but the
    source itself is broken now).
    """
    meta = _metadata(state, window)
    if state is None:
        return SourceCheckOutcome("source_fresh", name, False,
                                  f"source {name!r} has never been ingested into this store", meta)
    if state.last_fresh_at is None:
        why = f": {state.last_error}" if state.last_error else ""
        return SourceCheckOutcome("source_fresh", name, False, f"source {name!r} has never been fresh{why}", meta)
    age = now - state.last_fresh_at
    meta["age_seconds"] = int(age.total_seconds())
    if -age > CLOCK_SKEW:
        # Fresh "-13 d ago" passed: until the real clock reached that instant a source nobody fetched
        # any more looked fresh, in the Dagster check as in the watchdog.
        return SourceCheckOutcome(
            "source_fresh", name, False,
            f"source {name!r} was last fresh {instant_text(state.last_fresh_at)}, {human_duration(-age)} after "
            "now: a replay (--as-of) wrote into this store, or clocks disagree; its freshness proves nothing "
            "until then (see time_travel in the watchdog)", meta)
    if age > window:
        why = f"; last error: {state.last_error}" if state.last_error else ""
        return SourceCheckOutcome(
            "source_fresh", name, False,
            f"source {name!r} last fresh {instant_text(state.last_fresh_at)}, {human_duration(age)} ago, "
            f"longer than its window of {human_duration(window)}{why}", meta)
    if state.status == "stale":
        return SourceCheckOutcome(
            "source_fresh", name, False,
            f"source {name!r} is stale: {state.last_error} (last good data from "
            f"{instant_text(state.last_fresh_at)} stays in force)", meta)
    return SourceCheckOutcome("source_fresh", name, True, f"source {name!r} fresh {human_duration(age)} ago "
                              f"(window {human_duration(window)})", meta)


def evaluate_not_quarantined(name: str, state: SourceState | None) -> SourceCheckOutcome:
    """``source_not_quarantined``: fails when the source's latest snapshot is quarantined (stored,
    not applied, waiting for ``deadline-pipeline source accept``), naming the snapshot. Pure."""
    meta = _metadata(state, timedelta(seconds=state.freshness_seconds if state else 0))
    if state is not None and state.latest_snapshot_status == "quarantined":
        meta["quarantined_snapshot_id"] = state.latest_snapshot_id
        # The stored error starts "snapshot N quarantined: …" (ingest.service); said once here.
        reason = (state.last_error or "").removeprefix(f"snapshot {state.latest_snapshot_id} quarantined: ")
        return SourceCheckOutcome(
            "source_not_quarantined", name, False,
            f"source {name!r}: snapshot {state.latest_snapshot_id} is quarantined: {reason}", meta)
    return SourceCheckOutcome("source_not_quarantined", name, True,
                              f"source {name!r} has no quarantined snapshot waiting", meta)


def source_fresh(engine: Engine, name: str, now: datetime, window: timedelta | None = None) -> SourceCheckOutcome:
    """:func:`evaluate_fresh` on the store. ``window`` defaults to the source row's freshness window."""
    state = read_source_state(engine, name)
    if window is None:
        window = timedelta(seconds=state.freshness_seconds if state else 0)
    return evaluate_fresh(name, state, now, window)


def source_not_quarantined(engine: Engine, name: str) -> SourceCheckOutcome:
    """:func:`evaluate_not_quarantined` on the store."""
    return evaluate_not_quarantined(name, read_source_state(engine, name))


def evaluate_rules_complete(name: str, snapshot_id: int | None, status: str | None,
                            report: dict | None, quarantined: tuple[int, dict | None] | None = None
                            ) -> SourceCheckOutcome:
    """``rules_complete``: fails while the snapshot whose rules are in force (``snapshot_id``: the
    latest applied one, else the latest) skipped records (an unknown zone, an unreadable RRULE or id)
    and no human accepted it (``deadline-pipeline source accept``), or while a newer quarantined
    snapshot skipped records. The summary gives the counts and the first offenders; ``metadata``
    lists them with record id and position, and the rules kept in force because their record failed
    to parse; also the snapshot's notes (``notes_count``, ``notes``: readings kept but said, which do
    not turn the check red), counted in a passing summary. ``quarantined``: ``(id, parse report)`` of a
    newer snapshot waiting for ``source accept``; it is named in the summary either way (its counts are
    not the rules in force). Pure.

    Why the snapshot in force: judged on the latest snapshot alone, a quarantined one that parsed
    cleanly turned the check green ("yielded N rules, none skipped", N of a snapshot never applied)
    while the snapshot in force still held rules back."""
    if quarantined is not None:
        q_id, q_report = quarantined
        if q_report and q_report.get("skipped_count") and not q_report.get("accepted"):
            out = evaluate_rules_complete(name, q_id, "quarantined", q_report)
        else:
            out = evaluate_rules_complete(name, snapshot_id, status, report)
        out.metadata["quarantined_snapshot_id"] = q_id
        if q_id != out.metadata.get("snapshot_id"):
            out.summary += (f"; the newer snapshot {q_id} is quarantined, not applied (see "
                            f"source_not_quarantined; 'deadline-pipeline source accept {q_id}')")
        return out
    meta = {"snapshot_id": snapshot_id, "snapshot_status": status}
    if not report:
        return SourceCheckOutcome("rules_complete", name, True,
                                  f"source {name!r}: no parsed snapshot with skipped records", meta)
    label = (f"quarantined snapshot {snapshot_id} (not applied)" if status == "quarantined"
             else f"snapshot {snapshot_id}")
    skipped, held = report.get("skipped_count", 0), report.get("held") or []
    notes = report.get("notes_count", 0)
    meta.update(rules=report.get("rules"), skipped_count=skipped, held_count=len(held), held=held[:20],
                skipped=(report.get("skipped") or [])[:10], accepted=bool(report.get("accepted")),
                notes_count=notes, notes=(report.get("notes") or [])[:10])
    # Notes skip nothing and keep the check green, but a reading the parser kept while saying it may be
    # wrong (a VTIMEZONE the IANA zone overrides, PST on a July date) is counted where the check is read.
    noted = f"; {notes} note(s) on readings kept (metadata 'notes')" if notes else ""
    if skipped and not report.get("accepted"):
        first = "; ".join(f"{p['position']}: {p['message']}" for p in (report.get("skipped") or [])[:3])
        kept = f"; {len(held)} rule(s) kept in force from their last good version" if held else ""
        return SourceCheckOutcome(
            "rules_complete", name, False,
            f"source {name!r}: {label} skipped {skipped} record(s) and yielded "
            f"{report.get('rules')} rule(s){kept}; first: {first}. Fix the source, or run 'deadline-pipeline "
            f"source accept {snapshot_id}' to accept the loss", meta)
    return SourceCheckOutcome("rules_complete", name, True,
                              f"source {name!r}: {label} yielded {report.get('rules')} rule(s)"
                              + (", its skipped records accepted by a human" if skipped else ", none skipped")
                              + noted, meta)


def rules_complete(engine: Engine, name: str) -> SourceCheckOutcome:
    """:func:`evaluate_rules_complete` on the store: the snapshot in force (the latest applied one,
    also when a newer one failed to parse or waits to be parsed; the latest when none was applied),
    and a newer quarantined snapshot if one waits."""
    quarantined = None
    with engine.connect() as conn:
        row = sql.find_source(conn, name)
        latest = sql.latest_snapshot(conn, row.id) if row is not None else None
        meta = sql.snapshot_meta(conn, latest.id) if latest is not None else None
        if meta is not None and meta.parse_status == "quarantined":
            quarantined = (meta.id, meta.parse_report)
            applied = sql.list_snapshots(conn, row.id, statuses=("parsed",))[:1]
            meta = sql.snapshot_meta(conn, applied[0].id) if applied else meta
        elif meta is not None and meta.parse_status in ("failed", "pending"):
            # A newer payload that failed to parse (source_fresh is red for it) or is not parsed yet
            # has no report: judged on it, the check turned green while the snapshot in force still
            # held records back that it had skipped.
            applied = sql.list_snapshots(conn, row.id, statuses=("parsed",))[:1]
            meta = sql.snapshot_meta(conn, applied[0].id) if applied else meta
    return evaluate_rules_complete(name, meta.id if meta else None, meta.parse_status if meta else None,
                                   meta.parse_report if meta else None, quarantined)
