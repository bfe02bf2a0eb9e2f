"""The ingest stage without Dagster: fetch → snapshot (raw bytes first) → parse → rule versions.

Both functions return an outcome and never raise for a source's own failure (down, broken payload,
implausible revision): the outcome is recorded on the source row, the last good rule versions stay
in force, and the loop serving the other sources goes on. Checks turn the recorded state red.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Engine

from deadline_pipeline.config import SourceConfig
from deadline_pipeline.ingest.fetch import FetchError, fetch
from deadline_pipeline.ingest.parsers import ParseError, parse_payload
from deadline_pipeline.ingest.versions import diff_rules, quarantine_reason
from deadline_pipeline.store import sources as sql

log = logging.getLogger(__name__)


@dataclass
class FetchOutcome:
    """What one observation of a source found. ``status``: new_snapshot | unchanged | not_modified |
    fetch_failed."""

    source: str
    status: str
    snapshot_id: int | None = None
    sha256: str | None = None
    size: int = 0
    error: str | None = None


@dataclass
class ApplyOutcome:
    """What applying a source's latest snapshot did. ``status``: applied | unchanged | parse_failed |
    quarantined | no_snapshot."""

    source: str
    status: str
    snapshot_id: int | None = None
    rules: int = 0
    added: int = 0
    changed: int = 0
    withdrawn: int = 0
    unchanged: int = 0
    problems: list[str] = field(default_factory=list)
    error: str | None = None


def ensure_source(engine: Engine, src: SourceConfig) -> sql.SourceRow:
    with engine.begin() as conn:
        return sql.sync_source(conn, name=src.name, tenant=src.tenant, fmt=src.format, location=src.location,
                               freshness_seconds=int(src.freshness_window.total_seconds()))


def fetch_snapshot(engine: Engine, src: SourceConfig, now: datetime) -> FetchOutcome:
    """Fetch one source and store its bytes as a snapshot before any parsing.

    Identical bytes create no new snapshot but move ``last_fresh_at`` (the source is alive). A 304
    counts as fresh. A failed fetch stores nothing, keeps every rule version, and records the error.
    """
    row = ensure_source(engine, src)
    with engine.connect() as conn:
        prev = sql.latest_snapshot(conn, row.id)
    try:
        result = fetch(src.name, src.location, now=now,
                       etag=prev.etag if prev else None, last_modified=prev.last_modified if prev else None)
    except FetchError as exc:
        log.warning("source %s: fetch failed: %s", src.name, exc)
        with engine.begin() as conn:
            sql.mark_source(conn, row.id, last_attempt_at=now, last_error=str(exc), status="stale")
        return FetchOutcome(src.name, "fetch_failed", error=str(exc))

    with engine.begin() as conn:
        if result.not_modified:
            healthy = prev is not None and prev.parse_status == "parsed"
            sql.mark_source(conn, row.id, last_attempt_at=now,
                            **({"last_fresh_at": now, "status": "fresh", "last_error": None} if healthy else {}))
            return FetchOutcome(src.name, "not_modified", prev.id if prev else None,
                                prev.sha256 if prev else None)
        snap_id, created = sql.insert_snapshot(
            conn, source_id=row.id, fetched_at=now, sha256=result.sha256, content=result.content,
            http_status=result.http_status, etag=result.etag, last_modified=result.last_modified,
        )
        sql.mark_source(conn, row.id, last_attempt_at=now)
        if not created and prev is not None and prev.id != snap_id:
            # The source went back to bytes it served before (A → B → A). Those bytes must be
            # applied again, or the rules of B would silently stay in force.
            sql.requeue_snapshot(conn, snap_id, now)
        elif not created:
            status = sql.snapshot_meta(conn, snap_id).parse_status
            # The same bytes that failed to parse before are still broken: they prove the source
            # answers, not that it is fresh.
            if status == "parsed":
                sql.mark_source(conn, row.id, last_fresh_at=now, status="fresh", last_error=None)
    return FetchOutcome(src.name, "new_snapshot" if created else "unchanged", snap_id, result.sha256,
                        result.size)


def apply_latest_snapshot(engine: Engine, src: SourceConfig, now: datetime,
                          max_withdraw_share: float = 0.30) -> ApplyOutcome:
    """Parse the source's latest snapshot (if not yet applied) into rule versions.

    A broken payload is kept, marked failed, and the source marked stale with an error naming the
    source, the snapshot and the position. A snapshot that parses to zero rules or withdraws more
    than ``max_withdraw_share`` of the active rules is quarantined and the source marked suspect.
    """
    row = ensure_source(engine, src)
    with engine.connect() as conn:
        snap = sql.latest_snapshot(conn, row.id)
        if snap is None:
            return ApplyOutcome(src.name, "no_snapshot", error=row.last_error)
        if snap.parse_status != "pending":
            latest = sql.latest_versions(conn, row.id)
            active = sum(1 for v in latest.values() if not v["withdrawn"])
            return ApplyOutcome(src.name, "unchanged" if snap.parse_status == "parsed" else snap.parse_status,
                                snap.id, rules=active, error=row.last_error)
        content = sql.snapshot_content(conn, snap.id)
        latest = sql.latest_versions(conn, row.id)

    try:
        parsed = parse_payload(src.format, content, source=src.name, default_tz=src.timezone)
    except ParseError as exc:
        msg = f"snapshot {snap.id}: {exc}"
        log.error("source %s: %s", src.name, msg)
        with engine.begin() as conn:
            sql.set_snapshot_status(conn, snap.id, "failed", msg)
            sql.mark_source(conn, row.id, status="stale", last_error=msg)
        return ApplyOutcome(src.name, "parse_failed", snap.id, error=msg)

    problems = [f"{p.position}: {p.message}" for p in parsed.problems]
    for p in problems:
        log.warning("source %s: snapshot %s: skipped record: %s", src.name, snap.id, p)
    diff = diff_rules(latest, parsed.rules)
    active_before = sum(1 for v in latest.values() if not v["withdrawn"])
    reason = quarantine_reason(diff, active_before, len(parsed.rules), max_withdraw_share)
    if reason:
        msg = f"snapshot {snap.id} quarantined: {reason}; run 'deadline-pipeline source accept {snap.id}'"
        log.error("source %s: %s", src.name, msg)
        with engine.begin() as conn:
            sql.set_snapshot_status(conn, snap.id, "quarantined", msg)
            sql.mark_source(conn, row.id, status="suspect", last_error=msg)
        return ApplyOutcome(src.name, "quarantined", snap.id, rules=active_before, error=msg,
                            problems=problems)

    rows = []
    for rec in diff.added + diff.changed:
        prev = latest.get(rec.rule_id)
        rows.append(dict(source_id=row.id, rule_id=rec.rule_id, version=(prev["version"] + 1) if prev else 1,
                         snapshot_id=snap.id, valid_from=now, withdrawn=False,
                         content_hash=rec.content_hash(), payload=rec.to_payload()))
    for rid in diff.withdrawn:
        prev = latest[rid]
        rows.append(dict(source_id=row.id, rule_id=rid, version=prev["version"] + 1, snapshot_id=snap.id,
                         valid_from=now, withdrawn=True, content_hash=prev["content_hash"],
                         payload=prev["payload"]))
    with engine.begin() as conn:
        sql.insert_versions(conn, rows)
        sql.set_snapshot_status(conn, snap.id, "parsed", "\n".join(problems) or None)
        sql.mark_source(conn, row.id, status="fresh", last_fresh_at=now, current_snapshot_id=snap.id,
                        last_error=(f"{len(problems)} record(s) skipped: {problems[0]}" if problems else None))
    return ApplyOutcome(src.name, "applied", snap.id, rules=len(parsed.rules), added=len(diff.added),
                        changed=len(diff.changed), withdrawn=len(diff.withdrawn), unchanged=diff.unchanged,
                        problems=problems)
