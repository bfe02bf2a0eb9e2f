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
from sqlalchemy.exc import NoResultFound

from deadline_pipeline import zone_data
from deadline_pipeline.config import SourceConfig
from deadline_pipeline.ingest.diff import pair_renames
from deadline_pipeline.ingest.fetch import FetchError, fetch
from deadline_pipeline.ingest.parsers import ParseError, parse_payload
from deadline_pipeline.ingest.parsers.base import counted_problems
from deadline_pipeline.ingest.reader import reader_version
from deadline_pipeline.ingest.versions import (
    DEFAULT_MAX_WITHDRAW_SHARE,
    RuleDiff,
    diff_rules,
    held_back,
    quarantine_reason,
    returned_to_series,
)
from deadline_pipeline.plan import first_seen
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.security.redact import redact
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
    # Set when ``source accept`` applied the snapshot over this quarantine reason.
    forced_over: str | None = None
    # Records the snapshot skipped, and the rules kept in force because such a record may be them.
    skipped: int = 0
    held: list[str] = field(default_factory=list)
    renamed: int = 0
    # Rules this snapshot brought that were already past (plan.first_seen): the source published
    # them late (a note), they passed while nothing was fetched (planning escalates them), or the
    # source was not watched before (history). One line each in ``first_seen_notes``.
    first_seen_late: int = 0
    first_seen_missed: int = 0
    first_seen_history: int = 0
    first_seen_notes: list[str] = field(default_factory=list)
    # Set when a snapshot already parsed was parsed again because the source settings it was parsed
    # with changed: "source settings changed: timezone Europe/Berlin → America/New_York".
    reparsed: str | None = None


class UnknownSnapshot(LookupError):
    """A snapshot id that does not exist, or that belongs to another source than the one named."""


def parse_settings(src: SourceConfig) -> dict[str, str | None]:
    """The inputs a parse of ``src``'s bytes depends on, besides the bytes: ``{"format": the parser,
    "timezone": the zone of times written without one (None when unset), "zone_data": the IANA
    version of the zone database in force (:func:`~deadline_pipeline.zone_data.refresh`), "reader":
    the version of the code and libraries that read
    (:func:`~deadline_pipeline.ingest.reader.reader_version`)}``. Every key is an input of
    :func:`apply_snapshot`'s parse; each parse stores them on its snapshot (``snapshots.parse_settings``),
    and :func:`apply_latest_snapshot` parses the latest snapshot again when they differ from the
    configuration's and this process's.

    The zone data is one because a parse reads instants with it: a RECURRENCE-ID is stored as its UTC
    instant, and a TZID only a VTIMEZONE defines is matched to the IANA zone with the same rules.
    Parsed under 2025b, where Vancouver still changed clocks, the cancelled 16 November 09:00
    occurrence of a weekly series was stored as 17:00Z; planned under 2026f (09:00 is 16:00Z) it
    named no occurrence, so the cancelled one was reminded, every check green, until the file's bytes
    changed."""
    return {"format": src.format, "timezone": src.timezone, "zone_data": zone_data.refresh().version,
            "reader": reader_version()}


def settings_change(stored: dict | None, current: dict[str, str | None]) -> str | None:
    """Why a snapshot parsed with ``stored`` (None: not recorded, a parse before they were) is read
    differently with ``current`` (:func:`parse_settings`), for a log line: ``"source settings changed:
    timezone Europe/Berlin → America/New_York"`` (each changed setting; an unset one is ``(unset)``),
    ``"its reader changed (9233fe974cb6 → 0f1e2d3c4b5a): ..."`` when only the reader did, or None when
    nothing differs."""
    if stored is None:
        return "the source settings of its last parse were not recorded (parsed before this release)"
    changed = [f"{key} {stored.get(key) or '(unset)'} → {value or '(unset)'}"
               for key, value in current.items() if key != "reader" and stored.get(key) != value]
    if changed:
        return "source settings changed: " + ", ".join(changed)
    if stored.get("reader") != current.get("reader"):
        return (f"its reader changed ({stored.get('reader') or '(unrecorded)'} → {current.get('reader')}): this "
                "release reads the format with other code or libraries, so the same bytes are read again")
    return None


def settings_pending(conn, src: SourceConfig) -> str | None:
    """Why the store's reading of ``src``'s latest snapshot is not what the configuration says: a
    sentence naming the snapshot and the settings changed since it was parsed (the next ingest
    parses it again), or None when they agree, nothing was parsed yet, or the settings of the parse
    were not recorded. ``conn``: a connection to the store; reads only. For commands that show the
    store's rules (``preview``) or parse snapshots with the configuration (``rules diff``): without
    it they disagreed with each other and with the store, without a word, until the next ingest."""
    row = sql.find_source(conn, src.name)
    snap = sql.latest_snapshot(conn, row.id) if row is not None else None
    if snap is None or snap.parse_status == "pending" or snap.parse_settings is None:
        return None
    change = settings_change(snap.parse_settings, parse_settings(src))
    if change is None:
        return None
    return (f"source {src.name}: snapshot {snap.id} is read differently now ({change}); the store holds its "
            f"old reading until the next ingest (or run) parses it again")


def ensure_source(engine: Engine, src: SourceConfig) -> sql.SourceRow:
    """The ``sources`` row of ``src``, created or updated to match the configuration.

    Read first and written only when missing or different: an unchanged re-ingest would otherwise
    pay a write transaction (an fsync on SQLite) per source and per stage for nothing.
    """
    freshness = int(src.freshness_window.total_seconds())
    # The row keeps the location as shown, never a token in its query (credentials live in the
    # environment only): the sources table is read by the UI, the watchdog and backups.
    location = redact(src.location)
    with engine.connect() as conn:
        row = sql.find_source(conn, src.name)
    if row is not None and (row.tenant, row.format, row.location, row.freshness_seconds) == (
            src.tenant, src.format, location, freshness):
        return row
    with engine.begin() as conn:
        return sql.sync_source(conn, name=src.name, tenant=src.tenant, fmt=src.format, location=location,
                               freshness_seconds=freshness)


def fetch_snapshot(engine: Engine, src: SourceConfig, now: datetime, **fetch_options) -> FetchOutcome:
    """Fetch one source and store its bytes as a snapshot before any parsing.

    ``now`` is aware UTC. Identical bytes create no new snapshot but move ``last_fresh_at`` (the
    source is alive). A 304 counts as fresh. A failed fetch stores nothing, keeps every rule version,
    and records the error. Every fetch, failed or not, gets a ``fetch_log`` row (time, outcome, HTTP
    status, sha256, the snapshot used). ``fetch_options`` go to :func:`~deadline_pipeline.ingest.fetch.fetch`
    (``timeout_seconds``, ``max_bytes``, ``max_redirects``, ``network``…); the source's own
    credential variables (``token_env``, ``username_env``/``password_env``, ``headers_env``) are
    passed from ``src``. Never raises for the source's own failures.
    """
    row = ensure_source(engine, src)
    credentials = {"auth_env": src.token_env, "headers_env": dict(src.headers_env) or None,
                   "username_env": src.username_env, "password_env": src.password_env}
    fetch_options = {**credentials, **fetch_options}
    with engine.connect() as conn:
        prev = sql.latest_snapshot(conn, row.id)
    try:
        result = fetch(src.name, src.location, now=now,
                       etag=prev.etag if prev else None, last_modified=prev.last_modified if prev else None,
                       **fetch_options)
    except FetchError as exc:
        log.warning("source %s: fetch failed: %s", src.name, exc)
        with engine.begin() as conn:
            sql.mark_source(conn, row.id, last_attempt_at=now, last_error=str(exc), status="stale")
            sql.log_fetch(conn, source_id=row.id, fetched_at=now, outcome="failed", error=str(exc))
        return FetchOutcome(src.name, "fetch_failed", error=str(exc))

    with engine.begin() as conn:
        if result.not_modified:
            healthy = prev is not None and prev.parse_status == "parsed"
            sql.mark_source(conn, row.id, last_attempt_at=now,
                            **({"last_fresh_at": now, "status": "fresh", "last_error": None} if healthy else {}))
            sql.log_fetch(conn, source_id=row.id, fetched_at=now, outcome="not_modified",
                          http_status=result.http_status, sha256=prev.sha256 if prev else None,
                          snapshot_id=prev.id if prev else None)
            return FetchOutcome(src.name, "not_modified", prev.id if prev else None,
                                prev.sha256 if prev else None)
        snap_id, created = sql.insert_snapshot(
            conn, source_id=row.id, fetched_at=now, sha256=result.sha256, content=result.content,
            http_status=result.http_status, etag=result.etag, last_modified=result.last_modified,
        )
        sql.mark_source(conn, row.id, last_attempt_at=now)
        # Every fetch is logged, unchanged bytes too: when the source was looked at is what tells a
        # deadline published after it passed from one that passed while nothing was fetched.
        sql.log_fetch(conn, source_id=row.id, fetched_at=now, outcome="new_snapshot" if created else "unchanged",
                      http_status=result.http_status, sha256=result.sha256, snapshot_id=snap_id)
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
                          max_withdraw_share: float = DEFAULT_MAX_WITHDRAW_SHARE) -> ApplyOutcome:
    """Parse the source's latest snapshot (if not yet applied) into rule versions.

    A snapshot already parsed (parsed, failed or quarantined) is parsed again when the source
    settings it was parsed with (:func:`parse_settings`) differ from ``src``'s: a new ``timezone:``
    moves the rules written without a zone, as a revision of the bytes would. The outcome's
    ``reparsed`` then says which settings changed; a snapshot a human accepted stays accepted.
    ``now`` is aware UTC. A broken payload is kept, marked failed, and the source marked stale with
    an error naming the source, the snapshot and the position. A snapshot that parses to zero rules
    or withdraws more than ``max_withdraw_share`` (a fraction, 0.30 = 30 %) of the active rules is
    quarantined and the source marked suspect. Never raises for the source's own failures.
    """
    row = ensure_source(engine, src)
    with engine.connect() as conn:
        snap = sql.latest_snapshot(conn, row.id)
        if snap is None:
            return ApplyOutcome(src.name, "no_snapshot", error=row.last_error)
        change = settings_change(snap.parse_settings, parse_settings(src))
        if snap.parse_status != "pending" and change is None:
            latest = sql.latest_versions(conn, row.id)
            active = sum(1 for v in latest.values() if not v["withdrawn"])
            # A still-broken or still-quarantined latest snapshot keeps reporting as such on every run,
            # so callers that count failed sources keep counting it.
            status = {"parsed": "unchanged", "failed": "parse_failed"}.get(snap.parse_status, snap.parse_status)
            return ApplyOutcome(src.name, status, snap.id, rules=active, error=row.last_error)
    if snap.parse_status == "pending":
        return apply_snapshot(engine, src, snap.id, now, max_withdraw_share=max_withdraw_share)
    reason = change
    # A new reader re-reads every source once after each release that changes it: expected, and
    # written to the rule_versions metadata either way; a settings change is the operator's edit.
    level = logging.INFO if reason.startswith("its reader changed") else logging.WARNING
    log.log(level, "source %s: snapshot %s re-parsed: %s", src.name, snap.id, reason)
    # The same bytes a human accepted over the quarantine (``source accept``) stay accepted: only
    # their reading changed, and refusing them now would withdraw what was accepted.
    accepted = snap.parse_status == "parsed" and bool((snap.parse_report or {}).get("accepted"))
    return apply_snapshot(engine, src, snap.id, now, force=accepted, max_withdraw_share=max_withdraw_share,
                          reparsed=reason)


def apply_snapshot(engine: Engine, src: SourceConfig, snapshot_id: int, now: datetime, force: bool = False,
                   max_withdraw_share: float = DEFAULT_MAX_WITHDRAW_SHARE, reparsed: str | None = None) -> ApplyOutcome:
    """Parse one stored snapshot of ``src`` and write the rule versions it implies.

    ``now`` (aware UTC) becomes ``valid_from`` of the new versions and the source's ``last_fresh_at``.
    ``force=True`` applies a snapshot the quarantine would refuse (``source accept``: a human looked);
    a payload that does not parse is never applied, forced or not. Returns the outcome; records parse
    failures and quarantines on the snapshot and source rows instead of raising. The source settings
    parsed with (:func:`parse_settings`) are stored on the snapshot.

    ``reparsed``: why bytes parsed before are parsed again (:func:`apply_latest_snapshot`), carried
    into the outcome. Such a parse proves nothing about the source being alive: the source counts
    fresh as of its latest fetch, and stays stale when that fetch failed.

    Raises :class:`UnknownSnapshot` when ``snapshot_id`` does not exist or belongs to another source.
    """
    row = ensure_source(engine, src)
    with engine.connect() as conn:
        try:
            meta = sql.snapshot_meta(conn, snapshot_id)
        except NoResultFound:
            raise UnknownSnapshot(f"snapshot {snapshot_id} does not exist") from None
        if meta.source_id != row.id:
            raise UnknownSnapshot(f"snapshot {snapshot_id} does not belong to source {src.name!r}")
        content = sql.snapshot_content(conn, snapshot_id)
        latest = sql.latest_versions(conn, row.id)

    settings = parse_settings(src)
    try:
        parsed = parse_payload(settings["format"], content, source=src.name, default_tz=settings["timezone"])
    except ParseError as exc:
        return _record_parse_failure(engine, src, row.id, snapshot_id, f"snapshot {snapshot_id}: {exc}", settings,
                                     reparsed)
    except Exception as exc:  # noqa: BLE001 — a parser bug must not stop the loop serving other sources
        # Loud: logged with its traceback, stored on the source, and the source check turns red.
        log.exception("source %s: snapshot %s: parser crashed", src.name, snapshot_id)
        return _record_parse_failure(
            engine, src, row.id, snapshot_id,
            f"snapshot {snapshot_id}: source {src.name!r}: position unknown: parser failed unexpectedly: "
            f"{exc.__class__.__name__}: {exc}", settings, reparsed)

    problems = [sql.safe_text(f"{p.position}: {p.message}") for p in parsed.problems]
    repairs: list[str] = []
    rules = [_storable(rec, repairs) for rec in parsed.rules]
    diff = diff_rules(latest, rules)
    # Only skipped records that may be a rule in force count; an entry announcing no deadline yet
    # (a real feed's "not announced") is information: not red, not an error keeping the source unconfirmed.
    counted = counted_problems(parsed.problems, diff.withdrawn)
    _log_problems(src.name, snapshot_id, parsed.problems, problems, counted, repairs)
    problems += repairs
    active_before = sum(1 for v in latest.values() if not v["withdrawn"])
    skipped = [p for p in parsed.problems if p.skipped]
    if not rules and not active_before and not force:
        # Bytes that parse to nothing (the wrong ``format:``, every record unreadable) are a broken
        # payload, not a fresh source with no deadlines.
        first = f"; first skipped: {skipped[0]}" if skipped else ""
        return _record_parse_failure(
            engine, src, row.id, snapshot_id,
            f"snapshot {snapshot_id}: source {src.name!r}: line 1: {len(content)} bytes yield 0 rules as format "
            f"{src.format!r} ({len(skipped)} record(s) skipped{first})", settings, reparsed)
    # Only a parseable snapshot that lacks a rule withdraws it: a rule whose record failed to parse
    # keeps its last good version (until the source is fixed, or a human accepts the withdrawal).
    held = [] if force else held_back(diff.withdrawn, counted, known=latest.keys())
    if held:
        diff.withdrawn = [rid for rid in diff.withdrawn if rid not in set(held)]
        log.error("source %s: snapshot %s: %d rule(s) kept in force because their record failed to parse: %s",
                  src.name, snapshot_id, len(held), ", ".join(held[:5]))
    report = _parse_report(len(rules), counted, skipped, held, force,
                           notes=[p for p in parsed.problems if not p.skipped])
    # A rule whose id changed (same due time, same kind, same thing; ingest.diff.pair_renames) is a
    # rename: the new id inherits the old one's lineage, so its obligations and history carry over.
    renames = pair_renames([RuleRecord.from_payload(latest[rid]["payload"]) for rid in diff.withdrawn], diff.added)
    lineage_of = {new.rule_id: latest[old.rule_id].get("lineage") or old.rule_id for old, new in renames}
    renamed_away = {old.rule_id for old, _new in renames}
    report["renamed"] = [[old.rule_id, new.rule_id] for old, new in renames][:200]
    returned = returned_to_series(diff.withdrawn, latest, {r.rule_id for r in rules})
    judged = RuleDiff(diff.added, diff.changed, [r for r in diff.withdrawn if r not in renamed_away | returned],
                      diff.unchanged)
    reason = quarantine_reason(judged, active_before, len(rules), max_withdraw_share, latest=latest, now=now)
    if reason and not force:
        msg = f"snapshot {snapshot_id} quarantined: {reason}; run 'deadline-pipeline source accept {snapshot_id}'"
        log.error("source %s: %s", src.name, msg)
        with engine.begin() as conn:
            sql.set_snapshot_status(conn, snapshot_id, "quarantined", msg, settings)
            sql.set_parse_report(conn, snapshot_id, report)
            sql.mark_source(conn, row.id, status="suspect", last_error=msg)
        return ApplyOutcome(src.name, "quarantined", snapshot_id, rules=active_before, error=msg,
                            problems=problems, reparsed=reparsed)
    if reason:
        log.warning("source %s: snapshot %s applied by force despite: %s", src.name, snapshot_id, reason)

    rows = _version_rows(row.id, snapshot_id, now, diff, latest, lineage_of)
    with engine.begin() as conn:
        sql.insert_versions(conn, rows)
        sql.set_snapshot_status(conn, snapshot_id, "parsed", "\n".join(problems) or None, settings)
        sql.set_parse_report(conn, snapshot_id, report)
        error = f"{len(counted)} record(s) skipped: {sql.safe_text(str(counted[0]))}" if counted else None
        sql.mark_source(conn, row.id, current_snapshot_id=snapshot_id,
                        **_freshness(conn, row, now, error, reparsed is not None))
    out = ApplyOutcome(src.name, "applied", snapshot_id, rules=len(rules), added=len(diff.added) - len(renames),
                       changed=len(diff.changed), withdrawn=len(diff.withdrawn) - len(renames),
                       unchanged=diff.unchanged, renamed=len(renames),
                       problems=problems, forced_over=reason if force else None, skipped=len(counted),
                       held=held, reparsed=reparsed)
    _note_first_seen_passed(engine, src, row.id, now, out)
    return out


def _freshness(conn, row: sql.SourceRow, now: datetime, error: str | None, reparsed: bool) -> dict:
    """The freshness columns of source ``row`` after a snapshot parsed (``error``: its skipped
    records, or None): fresh at ``now`` for bytes just fetched; for bytes parsed again
    (``reparsed``), fresh as of the latest fetch, and unchanged when that fetch failed (its error
    stays the source's: bytes read again say nothing of the source answering now)."""
    if not reparsed:
        return {"status": "fresh", "last_fresh_at": now, "last_error": error}
    last = sql.last_fetch(conn, row.id)
    if last is not None and last.outcome == "failed":
        return {}
    fresh_at = last.fetched_at if last is not None else now
    if row.last_fresh_at is not None and row.last_fresh_at > fresh_at:
        fresh_at = row.last_fresh_at
    return {"status": "fresh", "last_fresh_at": fresh_at, "last_error": error}


def _log_problems(source: str, snapshot_id: int, parsed_problems: list, texts: list[str], counted: list,
                  repairs: list[str]) -> None:
    """Log one WARNING per parse problem (``texts``: their stored lines, in the same order) and per
    repaired record (``repairs``), each labelled with what happened to its record."""
    # Each line says what happened to its record, as rules_complete counts it: "skipped record" for a
    # repaired one (kept and planned), for a note that skips nothing, or for an entry announcing no
    # deadline yet, sent an operator looking for a reminder that was sent or never owed.
    for p, text in zip(parsed_problems, texts, strict=True):
        label = ("skipped record" if p in counted else "not announced yet, nothing to plan" if p.skipped
                 else "note, nothing skipped")
        log.warning("source %s: snapshot %s: %s: %s", source, snapshot_id, label, text)
    for text in repairs:
        log.warning("source %s: snapshot %s: record kept, its text repaired: %s", source, snapshot_id, text)


def _parse_report(rule_count: int, counted: list, skipped: list, held: list[str], force: bool,
                  notes: list | None = None) -> dict:
    """The snapshot's stored parse report (JSON-ready): ``rule_count`` rules parsed, the ``counted``
    skipped records (at most 50 listed), the ``skipped`` ones that are not counted as
    ``informational`` (at most 50), the rule ids ``held`` in force (at most 200), ``accepted``:
    applied by force, and the ``notes`` that skip nothing (``notes_count``, at most 50 listed: a
    reading said but kept, such as a VTIMEZONE that disagrees with the IANA zone of its TZID).
    Positions and messages are made storable (:func:`sql.safe_text`)."""
    info = [p for p in skipped if p not in counted]
    notes = notes or []

    def listed(problems: list) -> list[dict]:
        return [{"record_id": p.record_id, "position": sql.safe_text(p.position),
                 "message": sql.safe_text(p.message)} for p in problems[:50]]

    return {"rules": rule_count, "skipped_count": len(counted), "held": held[:200], "accepted": force,
            "skipped": listed(counted), "informational": listed(info),
            "notes_count": len(notes), "notes": listed(notes)}


def _version_rows(source_id: int, snapshot_id: int, now: datetime, diff: RuleDiff, latest: dict[str, dict],
                  lineage_of: dict[str, str]) -> list[dict]:
    """The ``rule_versions`` rows a snapshot writes: the next version of each added or changed rule
    (version 1 for a new id; its lineage from ``lineage_of`` for a renamed rule, else the previous
    version's), then a withdrawn version of each withdrawn rule repeating its last payload.
    ``latest``: the latest version of each rule id (dicts with version, content_hash, payload,
    lineage); ``now`` (aware UTC) is every row's ``valid_from``."""
    rows = []
    for rec in diff.added + diff.changed:
        prev = latest.get(rec.rule_id)
        rows.append(dict(source_id=source_id, rule_id=rec.rule_id, version=(prev["version"] + 1) if prev else 1,
                         snapshot_id=snapshot_id, valid_from=now, withdrawn=False,
                         content_hash=rec.content_hash(), payload=rec.to_payload(),
                         lineage=lineage_of.get(rec.rule_id) or (prev.get("lineage") if prev else None)))
    for rid in diff.withdrawn:
        prev = latest[rid]
        rows.append(dict(source_id=source_id, rule_id=rid, version=prev["version"] + 1, snapshot_id=snapshot_id,
                         valid_from=now, withdrawn=True, content_hash=prev["content_hash"],
                         payload=prev["payload"], lineage=prev.get("lineage")))
    return rows


def _note_first_seen_passed(engine: Engine, src: SourceConfig, source_id: int, now: datetime,
                            out: ApplyOutcome) -> None:
    """Judge the rules that came into force at ``now`` already past (:mod:`plan.first_seen`), log
    each and count them in ``out``: a deadline that passed unseen must not be only a rule version."""
    with engine.connect() as conn:
        judged = first_seen.judge_source(conn, source_id, src.name, src.freshness_window, since=now)
    first_seen.log_judgments(judged)
    counts = {v: sum(1 for j in judged if j.verdict == v) for v in
              (first_seen.LATE_PUBLISHED, first_seen.MISSED_UNWATCHED, first_seen.NOT_WATCHED)}
    out.first_seen_late = counts[first_seen.LATE_PUBLISHED]
    out.first_seen_missed = counts[first_seen.MISSED_UNWATCHED]
    out.first_seen_history = counts[first_seen.NOT_WATCHED]
    out.first_seen_notes = [j.describe() for j in judged if j.verdict != first_seen.NOT_WATCHED][:50]


def _record_parse_failure(engine: Engine, src: SourceConfig, source_id: int, snapshot_id: int,
                          msg: str, settings: dict, reparsed: str | None) -> ApplyOutcome:
    """Keep the bytes, mark the snapshot failed (parsed with ``settings``) and the source stale; the
    last good versions stay. ``reparsed``: as :func:`apply_snapshot`'s, into the outcome."""
    msg = sql.safe_text(msg)
    log.error("source %s: %s", src.name, msg)
    with engine.begin() as conn:
        sql.set_snapshot_status(conn, snapshot_id, "failed", msg, settings)
        sql.mark_source(conn, source_id, status="stale", last_error=msg)
    return ApplyOutcome(src.name, "parse_failed", snapshot_id, error=msg, reparsed=reparsed)


def _storable(rec: RuleRecord, problems: list[str]) -> RuleRecord:
    """``rec`` with text no store refuses, each repair noted in ``problems``: NUL characters shown as
    ``\\x00``; a surrogate pair written as two escapes joined into its character; a lone surrogate
    (``"\\ud800"`` in a YAML or JSON title, not a character at all) shown as the text ``\\ud800``.

    PostgreSQL refuses NUL in text and JSONB, and no UTF-8 encoder takes a lone surrogate: storing
    the rule unchanged failed the whole snapshot on one engine, and on the other stored it and then
    failed planning for every source (UnicodeEncodeError in the staging insert). The rule is kept
    (its date is fine) and the repair is reported like a skipped part of a record.
    """
    found: set[str] = set()

    def clean(value):
        if isinstance(value, str):
            if "\x00" in value:
                found.add("NUL character(s) replaced by \\x00")
                value = value.replace("\x00", "\\x00")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                # The codecs do both repairs: through UTF-16 a pair becomes its character, and what
                # is still unencodable is escaped as clean_text does (backslashreplace: \\ud800).
                value = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
                fixed = value.encode("utf-8", "backslashreplace").decode("utf-8")
                found.add("unpaired UTF-16 surrogate(s) (not text) shown as \\uXXXX" if fixed != value
                          else "UTF-16 surrogate pair(s) joined into their character")
                value = fixed
            return value
        if isinstance(value, dict):
            return {clean(k): clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    payload = clean(rec.to_payload())
    if not found:
        return rec
    for what in sorted(found):
        problems.append(f"rule {sql.safe_text(clean(rec.rule_id))!r}: {what}")
    return RuleRecord.from_payload(payload)
