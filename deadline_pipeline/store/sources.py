"""SQL of the ingest stage: sources, snapshots and rule versions.

The pipeline never deletes: a withdrawal is a new rule version and a failed fetch or parse keeps
everything. The deletes here, :func:`prune_snapshots` and :func:`prune_fetch_log`, serve the operator's
retention command; the first re-checks in the DELETE itself that no rule version references what it
removes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, and_, delete, exists, func, or_, select, update

from deadline_pipeline.security.redact import redact
from deadline_pipeline.store.schema import fetch_log, rule_versions, snapshots, sources
from deadline_pipeline.store.upsert import dialect_insert


@dataclass(frozen=True)
class SourceRow:
    id: int
    name: str
    tenant: str
    format: str
    location: str
    freshness_seconds: int
    status: str
    last_fresh_at: datetime | None
    last_attempt_at: datetime | None
    last_error: str | None
    current_snapshot_id: int | None


def sync_source(conn: Connection, *, name: str, tenant: str, fmt: str, location: str,
                freshness_seconds: int) -> SourceRow:
    """Create or update the ``sources`` row of a configured source; returns it.

    ``location`` is stored redacted (:func:`~deadline_pipeline.security.redact.redact`): query values,
    user info and registered secrets never reach the row, whoever calls this."""
    location = redact(location)
    ins = dialect_insert(conn, sources).values(
        name=name, tenant=tenant, format=fmt, location=location, freshness_seconds=freshness_seconds,
        status="new",
    )
    conn.execute(
        ins.on_conflict_do_update(
            index_elements=["name"],
            set_={"tenant": tenant, "format": fmt, "location": location,
                  "freshness_seconds": freshness_seconds},
        )
    )
    return get_source(conn, name)


def get_source(conn: Connection, name: str) -> SourceRow:
    row = conn.execute(select(*[c for c in sources.c]).where(sources.c.name == name)).mappings().one()
    return SourceRow(**row)


def all_sources(conn: Connection) -> list[SourceRow]:
    rows = conn.execute(select(*[c for c in sources.c]).order_by(sources.c.name)).mappings().all()
    return [SourceRow(**r) for r in rows]


def safe_text(text: str | None) -> str | None:
    """``text`` without NUL characters (shown as ``\\x00``): PostgreSQL refuses NUL in text columns,
    and an error message quoting a hostile payload must not make recording the error fail. Also
    redacted (:func:`~deadline_pipeline.security.redact.redact`): stored errors are shown everywhere."""
    return redact(text).replace("\x00", "\\x00") if text is not None else None


def mark_source(conn: Connection, source_id: int, **values) -> None:
    if "last_error" in values:
        values["last_error"] = safe_text(values["last_error"])
    conn.execute(update(sources).where(sources.c.id == source_id).values(**values))


def snapshot_by_sha(conn: Connection, source_id: int, sha256: str):
    return conn.execute(
        select(snapshots.c.id, snapshots.c.parse_status)
        .where(snapshots.c.source_id == source_id, snapshots.c.sha256 == sha256)
    ).first()


def insert_snapshot(conn: Connection, *, source_id: int, fetched_at: datetime, sha256: str, content: bytes,
                    http_status: int | None, etag: str | None, last_modified: str | None) -> tuple[int, bool]:
    """Store raw bytes before any parsing. Returns ``(snapshot_id, created)``; identical bytes of the
    same source are one snapshot (unique on source, sha256)."""
    existing = snapshot_by_sha(conn, source_id, sha256)
    if existing is not None:
        return existing.id, False
    res = conn.execute(
        snapshots.insert().values(
            source_id=source_id, fetched_at=fetched_at, sha256=sha256, size=len(content), content=content,
            http_status=http_status, etag=etag, last_modified=last_modified, parse_status="pending",
        )
    )
    return res.inserted_primary_key[0], True


def snapshot_meta(conn: Connection, snapshot_id: int):
    return conn.execute(
        select(snapshots.c.id, snapshots.c.source_id, snapshots.c.sha256, snapshots.c.etag,
               snapshots.c.last_modified, snapshots.c.parse_status, snapshots.c.parse_error,
               snapshots.c.fetched_at, snapshots.c.size, snapshots.c.parse_report)
        .where(snapshots.c.id == snapshot_id)
    ).one()


def snapshot_content(conn: Connection, snapshot_id: int) -> bytes:
    return conn.execute(select(snapshots.c.content).where(snapshots.c.id == snapshot_id)).scalar_one()


def latest_snapshot(conn: Connection, source_id: int):
    """The most recently fetched snapshot of a source (any parse status), or None: a row of id,
    parse_status, etag, last_modified, sha256, parse_settings (dict, None when not recorded) and
    parse_report (dict or None)."""
    return conn.execute(
        select(snapshots.c.id, snapshots.c.parse_status, snapshots.c.etag, snapshots.c.last_modified,
               snapshots.c.sha256, snapshots.c.parse_settings, snapshots.c.parse_report)
        .where(snapshots.c.source_id == source_id)
        .order_by(snapshots.c.fetched_at.desc(), snapshots.c.id.desc())
        .limit(1)
    ).first()


def requeue_snapshot(conn: Connection, snapshot_id: int, now: datetime) -> None:
    """Make an older snapshot the latest again (its bytes came back) so that it is re-applied.
    ``fetched_at`` then means "last fetched"; the bytes and their hash are unchanged."""
    conn.execute(
        update(snapshots).where(snapshots.c.id == snapshot_id).values(fetched_at=now, parse_status="pending")
    )


def set_parse_report(conn: Connection, snapshot_id: int, report: dict) -> None:
    """Store what parsing made of a snapshot (see ``snapshots.parse_report``)."""
    conn.execute(update(snapshots).where(snapshots.c.id == snapshot_id).values(parse_report=report))


def set_snapshot_status(conn: Connection, snapshot_id: int, status: str, error: str | None = None,
                        settings: dict | None = None) -> None:
    """Record a parse's outcome on a snapshot: ``status`` (parsed | failed | quarantined), its error
    text, and ``settings``, the source settings it was parsed with (see ``snapshots.parse_settings``;
    None leaves them as stored)."""
    values = {"parse_status": status, "parse_error": safe_text(error)}
    if settings is not None:
        values["parse_settings"] = settings
    conn.execute(update(snapshots).where(snapshots.c.id == snapshot_id).values(**values))


def latest_versions(conn: Connection, source_id: int) -> dict[str, dict]:
    """rule_id → its latest version row (``version``, ``withdrawn``, ``content_hash``, ``payload``,
    ``snapshot_id``, ``lineage``)."""
    latest = (
        select(rule_versions.c.rule_id, func.max(rule_versions.c.version).label("v"))
        .where(rule_versions.c.source_id == source_id)
        .group_by(rule_versions.c.rule_id)
        .subquery()
    )
    rows = conn.execute(
        select(rule_versions.c.rule_id, rule_versions.c.version, rule_versions.c.withdrawn,
               rule_versions.c.content_hash, rule_versions.c.payload, rule_versions.c.snapshot_id,
               rule_versions.c.lineage)
        .join(latest, and_(latest.c.rule_id == rule_versions.c.rule_id, latest.c.v == rule_versions.c.version))
        .where(rule_versions.c.source_id == source_id)
    ).mappings().all()
    return {r["rule_id"]: dict(r) for r in rows}


def insert_versions(conn: Connection, rows: list[dict]) -> None:
    """Insert rule version rows (dicts of ``rule_versions`` columns) in the caller's transaction.

    On PostgreSQL the table is first locked against other writers (``SHARE ROW EXCLUSIVE``, held until
    the caller's transaction ends; plain reads are not blocked), so that rule version ids become
    visible in id order. The ``replan_on_revision`` sensor's cursor is the highest id it handled: two
    ingests committing out of id order (the lower id still uncommitted when the sensor reads the
    higher) would have the lower id's revision skipped for good. SQLite has a single writer already.
    """
    if rows:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("LOCK TABLE rule_versions IN SHARE ROW EXCLUSIVE MODE")
        conn.execute(rule_versions.insert(), rows)


def get_source_by_id(conn: Connection, source_id: int) -> SourceRow:
    """The source row with this id; raises ``sqlalchemy.exc.NoResultFound`` when there is none."""
    row = conn.execute(select(*[c for c in sources.c]).where(sources.c.id == source_id)).mappings().one()
    return SourceRow(**row)


def find_source(conn: Connection, name: str) -> SourceRow | None:
    """The source row named ``name``, or None."""
    row = conn.execute(select(*[c for c in sources.c]).where(sources.c.name == name)).mappings().first()
    return SourceRow(**row) if row is not None else None


def list_snapshots(conn: Connection, source_id: int, statuses: tuple[str, ...] | None = None) -> list:
    """Snapshots of a source without their bytes, newest first (by ``fetched_at``, then id).

    ``statuses`` restricts to these parse statuses (``parsed``, ``pending``, ``failed``,
    ``quarantined``). Each row has id, fetched_at, sha256, size, http_status, etag, parse_status,
    parse_error.
    """
    query = (
        select(snapshots.c.id, snapshots.c.fetched_at, snapshots.c.sha256, snapshots.c.size,
               snapshots.c.http_status, snapshots.c.etag, snapshots.c.parse_status, snapshots.c.parse_error)
        .where(snapshots.c.source_id == source_id)
        .order_by(snapshots.c.fetched_at.desc(), snapshots.c.id.desc())
    )
    if statuses is not None:
        query = query.where(snapshots.c.parse_status.in_(statuses))
    return list(conn.execute(query).all())


def _newer_snapshot_exists():
    """SQL: a snapshot of the same source fetched after the outer ``snapshots`` row (ties by id)."""
    newer = snapshots.alias("newer")
    return exists().where(
        newer.c.source_id == snapshots.c.source_id,
        or_(newer.c.fetched_at > snapshots.c.fetched_at,
            and_(newer.c.fetched_at == snapshots.c.fetched_at, newer.c.id > snapshots.c.id)),
    )


def _prunable(before: datetime):
    """SQL condition of a snapshot the retention command may delete (see :func:`prune_snapshots`)."""
    referenced = exists().where(rule_versions.c.snapshot_id == snapshots.c.id)
    # A snapshot re-fetched (same bytes) within the retention was fetched within it: its log rows
    # keep it, so a kept fetch never points at bytes that are gone.
    refetched = exists().where(fetch_log.c.snapshot_id == snapshots.c.id, fetch_log.c.fetched_at >= before)
    owner = sources.alias("owner")  # an alias: the listing query joins `sources` itself
    current = exists().where(owner.c.id == snapshots.c.source_id, owner.c.current_snapshot_id == snapshots.c.id)
    return and_(snapshots.c.fetched_at < before, ~referenced, ~refetched, ~current, _newer_snapshot_exists())


def prunable_snapshots(conn: Connection, before: datetime) -> list:
    """Snapshots fetched before ``before`` (aware UTC) that no rule version references and that are
    neither their source's latest nor its current snapshot: rows of id, source name, fetched_at,
    size (bytes), parse_status; oldest first."""
    return list(conn.execute(
        select(snapshots.c.id, sources.c.name.label("source"), snapshots.c.fetched_at, snapshots.c.size,
               snapshots.c.parse_status)
        .join(sources, sources.c.id == snapshots.c.source_id)
        .where(_prunable(before))
        .order_by(snapshots.c.fetched_at, snapshots.c.id)
    ).all())


def prune_snapshots(conn: Connection, ids: list[int], before: datetime) -> list[int]:
    """Delete the snapshots among ``ids`` that are still prunable at ``before``; returns the ids
    deleted. The conditions are repeated in the DELETE so that a snapshot that became referenced
    (or latest) since it was listed survives."""
    deleted: list[int] = []
    for start in range(0, len(ids), 500):
        part = ids[start:start + 500]
        res = conn.execute(
            delete(snapshots).where(snapshots.c.id.in_(part), _prunable(before)).returning(snapshots.c.id)
        )
        deleted.extend(r[0] for r in res.all())
    return sorted(deleted)


def log_fetch(conn: Connection, *, source_id: int, fetched_at: datetime, outcome: str, http_status: int | None = None,
              sha256: str | None = None, snapshot_id: int | None = None, error: str | None = None) -> None:
    """Record one fetch of a source in ``fetch_log`` (``fetched_at`` aware UTC; ``outcome``:
    new_snapshot | unchanged | not_modified | failed). Every fetch is logged, not only changed
    content: the first-seen judgment (``plan.first_seen``) needs to know when the source was looked
    at and what it said."""
    conn.execute(fetch_log.insert().values(
        source_id=source_id, fetched_at=fetched_at, outcome=outcome, http_status=http_status, sha256=sha256,
        snapshot_id=snapshot_id, error=safe_text(error)))


def fetches(conn: Connection, source_id: int, since: datetime | None = None) -> list:
    """The logged fetches of a source, oldest first: rows of fetched_at (aware UTC), outcome,
    http_status, sha256, snapshot_id, error, and parse_status of the snapshot (None when there is
    none). ``since``: only those fetched at or after it."""
    query = (
        select(fetch_log.c.fetched_at, fetch_log.c.outcome, fetch_log.c.http_status, fetch_log.c.sha256,
               fetch_log.c.snapshot_id, fetch_log.c.error, snapshots.c.parse_status)
        .outerjoin(snapshots, snapshots.c.id == fetch_log.c.snapshot_id)
        .where(fetch_log.c.source_id == source_id)
        .order_by(fetch_log.c.fetched_at, fetch_log.c.id)
    )
    if since is not None:
        query = query.where(fetch_log.c.fetched_at >= since)
    return list(conn.execute(query).all())


def last_fetch(conn: Connection, source_id: int):
    """The source's latest logged fetch, a row of fetched_at (aware UTC) and outcome, or None."""
    return conn.execute(
        select(fetch_log.c.fetched_at, fetch_log.c.outcome).where(fetch_log.c.source_id == source_id)
        .order_by(fetch_log.c.fetched_at.desc(), fetch_log.c.id.desc()).limit(1)
    ).first()


def _prunable_fetch(before: datetime):
    """SQL condition of a fetch log row the retention command may delete: fetched before ``before``
    and not its source's latest row (which says when the source was last looked at: kept, as the
    source's latest snapshot is)."""
    newer = fetch_log.alias("newer")
    return and_(fetch_log.c.fetched_at < before, exists().where(
        newer.c.source_id == fetch_log.c.source_id,
        or_(newer.c.fetched_at > fetch_log.c.fetched_at,
            and_(newer.c.fetched_at == fetch_log.c.fetched_at, newer.c.id > fetch_log.c.id))))


def count_prunable_fetches(conn: Connection, before: datetime) -> int:
    """How many fetch log rows :func:`prune_fetch_log` would delete at ``before`` (aware UTC)."""
    return conn.execute(select(func.count()).select_from(fetch_log).where(_prunable_fetch(before))).scalar_one()


def prune_fetch_log(conn: Connection, before: datetime) -> int:
    """Delete the fetch log rows fetched before ``before`` (aware UTC), except each source's latest;
    returns how many. The snapshots' retention: ``snapshots prune --keep-days`` calls both."""
    return conn.execute(delete(fetch_log).where(_prunable_fetch(before))).rowcount


def first_versions_since(conn: Connection, source_id: int, since: datetime) -> list:
    """The first version of each rule of a source that came into force at or after ``since`` (aware
    UTC), not a rename (``lineage`` null: a renamed rule keeps its history): rows of rule_id, version,
    payload, valid_from (when the pipeline first saw it, aware UTC) and snapshot_id, oldest first."""
    r2 = rule_versions.alias("r2")
    first = (select(func.min(r2.c.version))
             .where(r2.c.source_id == rule_versions.c.source_id, r2.c.rule_id == rule_versions.c.rule_id)
             .scalar_subquery())
    return list(conn.execute(
        select(rule_versions.c.rule_id, rule_versions.c.version, rule_versions.c.payload, rule_versions.c.valid_from,
               rule_versions.c.snapshot_id)
        .where(rule_versions.c.source_id == source_id, rule_versions.c.version == first,
               rule_versions.c.lineage.is_(None), rule_versions.c.withdrawn.is_(False),
               rule_versions.c.valid_from >= since)
        .order_by(rule_versions.c.valid_from, rule_versions.c.rule_id)
    ).all())


def _watching_fetch(source_id: int, without_snapshot: int | None):
    """SQL condition of a fetch that showed the source's content: not failed, and its bytes parsed
    (a payload that did not parse showed nothing), other than ``without_snapshot``."""
    cond = and_(fetch_log.c.source_id == source_id, fetch_log.c.outcome != "failed",
                snapshots.c.parse_status == "parsed")
    if without_snapshot is not None:
        cond = and_(cond, fetch_log.c.snapshot_id != without_snapshot)
    return cond


def last_watching_fetch_before(conn: Connection, source_id: int, before: datetime,
                               without_snapshot: int | None = None) -> datetime | None:
    """When the source was last fetched before ``before`` (aware UTC) with content that parsed, other
    than snapshot ``without_snapshot``; None when the log has no such fetch."""
    return conn.execute(
        select(func.max(fetch_log.c.fetched_at))
        .join(snapshots, snapshots.c.id == fetch_log.c.snapshot_id)
        .where(_watching_fetch(source_id, without_snapshot), fetch_log.c.fetched_at < before)
    ).scalar()


def first_fetch_since(conn: Connection, source_id: int, since: datetime) -> datetime | None:
    """The first successful (not failed) fetch of the source at or after ``since`` (aware UTC), or None."""
    return conn.execute(
        select(func.min(fetch_log.c.fetched_at))
        .where(fetch_log.c.source_id == source_id, fetch_log.c.outcome != "failed", fetch_log.c.fetched_at >= since)
    ).scalar()


def freshness_window(conn: Connection, source_id: int) -> timedelta:
    """The source's expected freshness window as stored (``sources.freshness_seconds``)."""
    seconds = conn.execute(select(sources.c.freshness_seconds).where(sources.c.id == source_id)).scalar_one()
    return timedelta(seconds=seconds)
