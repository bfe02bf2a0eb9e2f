"""SQL of the planning stage: subscribers, subscriptions, and the keyed upserts of obligations and
alerts. Re-running any of it with the same input changes no row.

Shape of a plan write (the statement shape matters more than anything else at scale), per chunk of
about 10,000 obligations (memory is bounded by the chunk, not the plan):

1. a chunk guessed all new (:func:`none_stored`; PostgreSQL) is ``COPY``-ed straight into
   ``obligations`` and ``alerts`` under a savepoint; the keys' unique index catches a wrong guess,
   and the chunk then takes the path below;
2. otherwise the planned rows go into a temporary staging table — ``COPY`` on PostgreSQL, a batched
   insert on SQLite — and one read (:func:`compare_staged`) says which are new, moved or changed;
3. only those are offered to one ``INSERT … SELECT … ON CONFLICT … DO UPDATE … WHERE <something
   really changed>`` (null-safe ``IS DISTINCT FROM``), so an unchanged row is neither locked nor
   rewritten;
4. alert rows are only built and written for obligations whose fingerprint changed, so a no-op
   re-plan touches the alerts table not at all;
5. every planned key goes into ``planned_keys`` (the id of an obligation written by step 1 goes into
   ``planned_ids`` instead: an id from the sequence is far cheaper to index than a random 64-character
   key); the withdrawal anti-joins both once at the end.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    Column,
    Connection,
    Integer,
    MetaData,
    RowMapping,
    String,
    Table,
    Text,
    and_,
    any_,
    case,
    exists,
    func,
    literal,
    literal_column,
    or_,
    select,
    true,
    type_coerce,
    union_all,
    update,
)

from deadline_pipeline.rules import RULE_ID_MAX, RuleRecord, rule_kinds
from deadline_pipeline.states import OPEN, PLANNED, REVISABLE, UNSENT, AlertState, ObligationState
from deadline_pipeline.store.schema import (
    Id,
    UtcDateTime,
    alerts,
    obligations,
    rule_versions,
    sources,
    subscribers,
    subscriptions,
)
from deadline_pipeline.store.sources import latest_versions
from deadline_pipeline.store.upsert import dialect_insert, pages, upsert

# Cancellations made by planning carry this prefix; only those are undone when an obligation returns.
WITHDRAWN_REASON_PREFIX = "withdrawn: "
# Revisable reminders (states.REVISABLE) of a due instant the obligation moved away from are
# superseded with this prefix; only those come back if the deadline moves back to that instant.
MOVED_REASON_PREFIX = "deadline moved: "

_stage_md = MetaData()
stage_obligations = Table(
    "stage_obligations", _stage_md,
    Column("obligation_key", String(64), primary_key=True),
    Column("tenant", String(200)), Column("subscriber_id", Id), Column("source_id", Id),
    Column("rule_id", String(RULE_ID_MAX)), Column("rule_version", Integer), Column("period", String(64)),
    Column("title", Text), Column("due_at", UtcDateTime), Column("fingerprint", String(64)),
    Column("zone_data", String(20)), Column("calendar_data", String(40)),
    prefixes=["TEMPORARY"],
)
stage_alerts = Table(
    "stage_alerts", _stage_md,
    Column("obligation_key", String(64)), Column("offset_seconds", Integer), Column("channel", String(100)),
    Column("kind", String(20)), Column("dedup_key", String(64)), Column("send_at", UtcDateTime),
    Column("status", String(20)), Column("status_reason", Text), Column("due_at", UtcDateTime),
    prefixes=["TEMPORARY"],
)
# Every obligation key this run planned (all chunks): what the withdrawal's anti-join reads.
# Indexed: right after a first plan the stored obligations have no statistics yet, so the
# withdrawal's anti-join runs as a nested loop that must probe this table by key.
planned_keys = Table(
    "planned_keys", _stage_md, Column("obligation_key", String(64), primary_key=True), prefixes=["TEMPORARY"],
)
# The ids of the obligations this run wrote by a direct COPY (all new, so planned by this run):
# what the withdrawal's anti-join reads next to ``planned_keys``.
planned_ids = Table("planned_ids", _stage_md, Column("id", Id, primary_key=True), prefixes=["TEMPORARY"])
_STAGE_TABLES = (stage_obligations, stage_alerts, planned_keys, planned_ids)
OB_COLS = [c.name for c in stage_obligations.c]
AL_COLS = [c.name for c in stage_alerts.c]


# --------------------------------------------------------------------------- configuration mirror

SUBSCRIBER_FIELDS = ["tenant", "email", "webhook_url", "timezone", "quiet_hours", "active", "caldav_url",
                     "apprise_target"]
SUBSCRIPTION_FIELDS = ["rule_patterns", "offsets", "channels", "late_policy", "active", "kinds", "exclude_kinds"]


def _differing(rows: list[dict], stored: dict, key, fields: list[str]) -> list[dict]:
    """The rows that are not stored yet or differ from the stored row in one of ``fields``
    (``stored``: key → row): an unchanged configuration is a read, not even a locking upsert."""
    out = []
    for r in rows:
        have = stored.get(key(r))
        if have is None or any(have[f] != r.get(f) for f in fields):
            out.append(r)
    return out


# Rows compared and written per page by the mirror: the configuration's rows are built, compared
# with their stored rows and upserted a page at a time, so syncing 20,000 subscribers does not hold
# every row three times over (as built, as stored, as differing); held whole, they lifted a plan's
# memory by 28 MiB, 16 of which it kept for the rest of the run.
MIRROR_PAGE = 2_000


def sync_subscribers(conn: Connection, rows: Iterable[dict], keep: Collection[str] = ()) -> dict[str, int]:
    """Upsert subscribers (``external_id, tenant, email, webhook_url, timezone, quiet_hours`` and
    optionally ``caldav_url, apprise_target``), read from ``rows`` a page of :data:`MIRROR_PAGE` at
    a time; subscribers absent from ``rows`` become inactive (never deleted), except those whose
    external id is in ``keep`` (held by the planning guard: they stay as stored). Returns
    external_id → id of the subscribers in ``rows``."""
    wanted: set[str] = set()
    for page in pages(rows, MIRROR_PAGE):
        for r in page:
            r.setdefault("active", True)
            r.setdefault("caldav_url", None)
            r.setdefault("apprise_target", None)
        ids = [r["external_id"] for r in page]
        wanted.update(ids)
        stored = {r.external_id: r._mapping
                  for r in conn.execute(select(subscribers).where(subscribers.c.external_id.in_(ids)))}
        upsert(conn, subscribers, _differing(page, stored, lambda r: r["external_id"], SUBSCRIBER_FIELDS),
               conflict=["external_id"], update=SUBSCRIBER_FIELDS, count=False)
    out: dict[str, int] = {}
    gone = []
    for i, ext, active in conn.execute(select(subscribers.c.id, subscribers.c.external_id, subscribers.c.active)):
        if ext in wanted:
            out[ext] = i
        elif active and ext not in keep:
            gone.append(i)
    for part in pages(gone, 500):
        conn.execute(update(subscribers).where(subscribers.c.id.in_(part)).values(active=False))
    return out


def sync_subscriptions(conn: Connection, rows: Iterable[dict], keep_subscribers: Collection[int] = ()) -> None:
    """Upsert subscription rows (``name, subscriber_id, source_id, rule_patterns, offsets, channels,
    late_policy``, optional ``kinds`` / ``exclude_kinds``), read from ``rows`` a page of
    :data:`MIRROR_PAGE` at a time; rows absent from ``rows`` become inactive, except those of the
    subscriber ids in ``keep_subscribers`` (held subscribers keep what they were planned with)."""
    keep_subscribers = set(keep_subscribers)

    def key(r):
        return r["name"], r["subscriber_id"], r["source_id"]

    wanted: set[tuple[str, int, int]] = set()
    for page in pages(rows, MIRROR_PAGE):
        for r in page:
            r.setdefault("active", True)
            r.setdefault("kinds", None)
            r.setdefault("exclude_kinds", None)
        wanted.update(key(r) for r in page)
        # A subscriber's other subscriptions may be on another page: they are read there too, and
        # only the keys of this page's rows are looked up.
        who = sorted({r["subscriber_id"] for r in page})
        stored = {key(r._mapping): r._mapping
                  for r in conn.execute(select(subscriptions).where(subscriptions.c.subscriber_id.in_(who)))}
        upsert(conn, subscriptions, _differing(page, stored, key, SUBSCRIPTION_FIELDS),
               conflict=["name", "subscriber_id", "source_id"], update=SUBSCRIPTION_FIELDS, count=False)
    active = conn.execute(select(subscriptions.c.id, subscriptions.c.name, subscriptions.c.subscriber_id,
                                 subscriptions.c.source_id).where(subscriptions.c.active.is_(True)))
    gone = [i for i, name, subscriber_id, source_id in active
            if (name, subscriber_id, source_id) not in wanted and subscriber_id not in keep_subscribers]
    for part in pages(gone, 500):
        conn.execute(update(subscriptions).where(subscriptions.c.id.in_(part)).values(active=False))


def active_subscriber_ids(conn: Connection) -> dict[str, int]:
    """external_id → id of every active subscriber."""
    return {ext: i for i, ext in conn.execute(select(subscribers.c.id, subscribers.c.external_id)
                                              .where(subscribers.c.active.is_(True)))}


def subscribers_owed_reminders(conn: Connection) -> set[str]:
    """external_id of every active subscriber with an active obligation that has a reminder still
    to send (an alert in :data:`~deadline_pipeline.states.OPEN`): who would lose a reminder if
    withdrawn now."""
    o = obligations
    query = (select(subscribers.c.external_id).distinct()
             .join(o, o.c.subscriber_id == subscribers.c.id)
             .join(alerts, alerts.c.obligation_id == o.c.id)
             .where(subscribers.c.active.is_(True), o.c.status == ObligationState.ACTIVE,
                    alerts.c.status.in_(OPEN)))
    return set(conn.execute(query).scalars())


#: Rows of :func:`active_targets` read from the cursor at a time.
TARGET_PAGE = 1_000


def active_targets(conn: Connection) -> Iterator[RowMapping]:
    """Rows of active subscriptions joined with their active subscriber and source, streamed: read
    a page of :data:`TARGET_PAGE` rows at a time (a server-side cursor on PostgreSQL), once, when
    the caller iterates. Read whole, 20,000 subscriptions' rows lifted a plan's memory by 15 MiB,
    which it kept for the rest of the run."""
    result = conn.execute(
        select(subscriptions.c.name, subscriptions.c.rule_patterns, subscriptions.c.offsets,
               subscriptions.c.channels, subscriptions.c.late_policy, subscriptions.c.kinds,
               subscriptions.c.exclude_kinds, subscribers.c.id.label("subscriber_id"), subscribers.c.external_id,
               subscribers.c.tenant,
               subscribers.c.timezone, subscribers.c.email, subscribers.c.webhook_url, subscribers.c.quiet_hours,
               subscribers.c.caldav_url,
               sources.c.id.label("source_id"), sources.c.name.label("source"))
        .join(subscribers, subscribers.c.id == subscriptions.c.subscriber_id)
        .join(sources, sources.c.id == subscriptions.c.source_id)
        .where(subscriptions.c.active.is_(True), subscribers.c.active.is_(True))
        # Deterministic order: a subscriber's several subscriptions to one source merge the same way
        # on every run, so the merged fingerprint is stable.
        .order_by(subscribers.c.external_id, sources.c.name, subscriptions.c.id)
        .execution_options(yield_per=TARGET_PAGE)
    ).mappings()
    try:
        yield from result
    finally:
        result.close()  # a caller that stops early must not leave the cursor open on the connection


def active_rules(conn: Connection, source_id: int) -> tuple[list[tuple[int, RuleRecord]], dict[str, frozenset[str]]]:
    """The latest active version of each rule of a source (``(version, record)``, by rule id), and
    each withdrawn rule's id → its kinds (:func:`~deadline_pipeline.rules.rule_kinds` of the record it
    last had: a withdrawal keeps that payload), so a subscription's ``kinds`` that only a withdrawn
    rule had are not judged a typo."""
    return _active_of(latest_versions(conn, source_id))


@dataclass(frozen=True)
class SourceRules:
    """What planning reads of one source's rules, all from one read of their latest versions.

    ``active`` and ``withdrawn``: as :func:`active_rules` returns them. ``lineage``: rule id → lineage
    (the id its obligations are keyed on) of the active rules that were renamed, each claim resolved
    (see :func:`claimed_lineage`). ``recorded_lineage``: rule id → the lineage its latest version
    records, active or withdrawn, for every rule that was ever renamed, no claim resolved (what a
    scoped re-plan widens over)."""

    active: list[tuple[int, RuleRecord]]
    withdrawn: dict[str, frozenset[str]]
    lineage: dict[str, str]
    recorded_lineage: dict[str, str]


def source_rules(conn: Connection, source_id: int) -> SourceRules:
    """The :class:`SourceRules` of a source: one query, so the active rules, their lineage and the
    recorded lineage all describe the same versions (three reads could each see another ingest's
    commit under PostgreSQL's READ COMMITTED)."""
    latest = latest_versions(conn, source_id)
    active, withdrawn = _active_of(latest)
    recorded = {rid: v["lineage"] for rid, v in latest.items() if v.get("lineage") and v["lineage"] != rid}
    return SourceRules(active, withdrawn, claimed_lineage(latest), recorded)


def _active_of(latest: dict[str, dict]) -> tuple[list[tuple[int, RuleRecord]], dict[str, frozenset[str]]]:
    rules = [(v["version"], RuleRecord.from_payload(v["payload"])) for v in latest.values() if not v["withdrawn"]]
    withdrawn = {rid: frozenset(rule_kinds(v["payload"] or {})) for rid, v in latest.items() if v["withdrawn"]}
    return sorted(rules, key=lambda r: r[1].rule_id), withdrawn


def claimed_lineage(latest: dict[str, dict]) -> dict[str, str]:
    """rule_id → lineage of the active rules in ``latest`` (:func:`latest_versions` rows) that were
    renamed. Two active rules claiming one lineage (an old id back next to its new one) keep it only
    for the rule that owns the id; the other is keyed on its own id — never two rules on one
    obligation, which would silently drop one of them."""
    claims: dict[str, list[str]] = {}
    for rid, v in latest.items():
        if not v["withdrawn"]:
            claims.setdefault(v.get("lineage") or rid, []).append(rid)
    out: dict[str, str] = {}
    for lineage, rids in claims.items():
        for rid in rids:
            if rid != lineage and (len(rids) == 1 or lineage not in rids):
                out[rid] = lineage
    # Several renamed rules on one lineage without its owner: only the first (by id) keeps it.
    seen: set[str] = set()
    for rid in sorted(out):
        if out[rid] in seen:
            del out[rid]
        else:
            seen.add(out[rid])
    return out


# --------------------------------------------------------------------------- staging

#: The advisory lock key one planning run holds for its transaction (PostgreSQL).
PLANNING_LOCK = 0x646c706c616e  # "dlplan"


def lock_planning(conn: Connection) -> bool:
    """Hold the planning lock (a transaction-level advisory lock on PostgreSQL) until ``conn``'s
    transaction ends, waiting for a planning run that holds it. Returns whether another run held it
    (the caller logs the wait). SQLite has one writer at a time already: nothing to do, ``False``.

    Two planning runs on one store (the hourly run, a revision sensor's runs: ``dagster.yaml``
    allows four at once) each compared staged obligations, then merged them; rows the other run
    merged in between were neither new nor returned by the merge, and the run failed with a
    ``KeyError`` on an obligation key. Runs now plan one after another."""
    if conn.dialect.name != "postgresql":
        return False
    if conn.exec_driver_sql("SELECT pg_try_advisory_xact_lock(%(k)s)", {"k": PLANNING_LOCK}).scalar():
        return False
    conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%(k)s)", {"k": PLANNING_LOCK})
    return True


def without_jit(conn: Connection) -> None:
    """Turn PostgreSQL's JIT compilation off for the rest of ``conn``'s transaction (nothing elsewhere).

    A plan's statements touch a chunk's rows by index, but their cost estimates pass ``jit_above_cost``
    (100,000) once ``alerts`` holds about a million rows, and compiling each one took longer than
    running it: a revision re-plan's five supersede statements spent 80 ms each, most of it in JIT
    (``EXPLAIN ANALYZE``: execution 19 ms, JIT 8-50 ms), which made a re-plan of 1% of the rules
    cost 16% of a full one."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SELECT set_config('jit', 'off', true)")


def create_stage(conn: Connection) -> None:
    """(Re)create the empty staging tables for this transaction."""
    for t in _STAGE_TABLES:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {t.name}")
        t.create(conn)


def drop_stage(conn: Connection) -> None:
    for t in _STAGE_TABLES:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {t.name}")


def clear_stage(conn: Connection) -> None:
    """Empty the per-chunk staging tables (``planned_keys`` and ``planned_ids`` keep accumulating)."""
    for t in (stage_obligations, stage_alerts):
        conn.exec_driver_sql(f"{'TRUNCATE' if conn.dialect.name == 'postgresql' else 'DELETE FROM'} {t.name}")


def remember_staged(conn: Connection) -> None:
    """Add the staged chunk's obligation keys to ``planned_keys``."""
    conn.execute(planned_keys.insert().from_select(["obligation_key"], select(stage_obligations.c.obligation_key)))


def analyze_planned(conn: Connection) -> None:
    """Statistics for ``planned_keys`` and ``planned_ids`` before the withdrawal reads them
    (temporary tables are never auto-analysed on PostgreSQL)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"ANALYZE {planned_keys.name}, {planned_ids.name}")


# Statistics target of the ANALYZE after a bulk write: a sample of 300 × this many rows per table.
ANALYZE_WRITTEN_TARGET = 10


def analyze_written(conn: Connection) -> None:
    """Statistics for ``obligations`` and ``alerts`` after a bulk write (PostgreSQL: ``ANALYZE`` of a
    sample of 3,000 rows each, :data:`ANALYZE_WRITTEN_TARGET`; SQLite: nothing). Autovacuum analyses
    a table only a minute or more after the commit; until then the planner believes a freshly
    loaded table is nearly empty and, e.g., answers the withdrawal's "open alerts of these
    obligations" by reading the status index for every pending alert — measured 0.7 s per 500
    obligations on a 9.6M-alert store. Row counts and coarse distributions are what those plans
    need; the server's default sample (30,000 rows, read from as many pages) cost a first plan of
    96,000 alerts 0.17 s, a quarter of its COPY floor, and autovacuum takes the full sample later."""
    if conn.dialect.name == "postgresql":
        before = conn.exec_driver_sql("SHOW default_statistics_target").scalar()
        conn.exec_driver_sql(f"SET LOCAL default_statistics_target = {ANALYZE_WRITTEN_TARGET}")
        conn.exec_driver_sql("ANALYZE obligations, alerts")
        conn.exec_driver_sql("SELECT set_config('default_statistics_target', %(v)s, true)", {"v": before})


# COPY text format (PostgreSQL): backslash, tab, newline and carriage return are escaped, NULL is \N.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_COPY_SPECIAL = re.compile(r"[\\\t\n\r]")
_COPY_BATCH = 5_000


def _row_texts(rows: Iterable[tuple]) -> Iterator[str]:
    """Rows of ``None``/``int``/``str``/aware ``datetime`` values → one COPY text line each (without
    its newline).

    Formatted here rather than by ``Copy.write_row``: about 3x faster per row (the staging of a
    re-plan's chunks; new rows go in binary, :func:`_binary_fields`). Every value but an int is
    formatted once per 50,000 distinct values (a plan repeats channels, statuses and instants on
    every row). Instants are written in ISO 8601 with their offset; a naive datetime raises
    ``ValueError``, as the store's column type does."""
    special = _COPY_SPECIAL.search
    memo: dict = {}

    def text(v) -> str:
        if type(v) is int:
            return str(v)
        s = memo.get(v)
        if s is None:
            if v is None:
                s = "\\N"
            elif isinstance(v, str):
                s = v.translate(_COPY_ESCAPES) if special(v) else v
            elif isinstance(v, datetime):
                if v.tzinfo is None:
                    raise ValueError(f"naive datetime {v!r} given to the store; instants must be aware UTC")
                s = v.isoformat()
            else:
                s = str(v)
            if len(memo) >= 50_000:
                memo.clear()  # bounded: unique values (keys) must not pile up
            memo[v] = s
        return s

    for row in rows:
        yield "\t".join([text(v) for v in row])


def _copy_lines(rows: Iterable[tuple]) -> Iterator[str]:
    """:func:`_row_texts` in blocks of up to :data:`_COPY_BATCH` lines, each line ending in a newline."""
    batch: list[str] = []
    for line in _row_texts(rows):
        batch.append(line)
        if len(batch) >= _COPY_BATCH:
            batch.append("")
            yield "\n".join(batch)
            batch = []
    if batch:
        batch.append("")
        yield "\n".join(batch)


def stage_rows(conn: Connection, table: Table, rows: Iterable[tuple], columns: list[str] | None = None,
               analyze: bool = True) -> int:
    """Load tuples (in ``columns`` order, default the table's) into a table; returns the row count.
    PostgreSQL streams them with ``COPY`` (the fastest path in), formatted by :func:`_copy_lines`;
    SQLite takes batched inserts."""
    names = columns or [c.name for c in table.c]
    n = 0
    if conn.dialect.name == "postgresql":
        raw = conn.connection.dbapi_connection
        with raw.cursor() as cur:
            with cur.copy(f"COPY {table.name} ({', '.join(names)}) FROM STDIN") as copy:
                for block in _copy_lines(rows):
                    copy.write(block)
                    n += block.count("\n")
            if analyze and n:
                # Temporary tables are never auto-analysed; without statistics the merge joins below
                # are planned as nested loops over a "small" table that holds many thousand rows.
                cur.execute(f"ANALYZE {table.name}")
        return n
    buf: list[dict] = []
    for row in rows:
        buf.append(dict(zip(names, row, strict=True)))
        n += 1
        if len(buf) >= 5000:
            conn.execute(table.insert(), buf)
            buf = []
    if buf:
        conn.execute(table.insert(), buf)
    return n


NEW_ALERT_COLUMNS = ["obligation_id", "offset_seconds", "channel", "kind", "revision", "dedup_key", "send_at",
                     "status", "status_reason", "attempts", "created_at", "updated_at", "due_at"]
# Their column types, for the binary COPY of new reminders.
_NEW_ALERT_KINDS = ("int8", "int4", "text", "text", "int4", "text", "timestamptz", "text", "text", "int4",
                    "timestamptz", "timestamptz", "timestamptz")
# The alert identity (the unique constraint): a reminder is owed per due instant.
ALERT_IDENTITY = ["obligation_id", "offset_seconds", "channel", "kind", "revision", "due_at"]


def insert_new_alerts(conn: Connection, rows: Iterable[tuple], now: datetime) -> int:
    """Write the reminders of obligations created in this run straight into ``alerts``: a new
    obligation has no alert rows yet, so no conflict is possible and a staging pass would only double
    the work. ``rows``: ``(obligation_id, slot, dedup_key, due_at)`` with ``slot`` =
    ``(offset_seconds, channel, send_at, status, status_reason)`` (instants aware UTC); ``now`` is
    their created/updated instant. Returns the rows written.

    PostgreSQL: one binary ``COPY`` of :func:`new_alert_records`, streamed as they are encoded.
    SQLite: batched inserts."""
    if conn.dialect.name != "postgresql":
        return stage_rows(conn, alerts, (
            (oid, seconds, channel, "reminder", 0, dedup, send_at, status, reason, 0, now, now, due)
            for oid, (seconds, channel, send_at, status, reason), dedup, due in rows
        ), NEW_ALERT_COLUMNS, analyze=False)
    return copy_new_alerts(conn, new_alert_records(rows, now))


def new_alert_records(rows: Iterable[tuple], now: datetime) -> Iterator[bytes]:
    """The binary COPY records (:data:`NEW_ALERT_COLUMNS`) of new reminder rows (``rows`` as
    :func:`insert_new_alerts` takes them), lazily: each record an id, the key and the fields of its
    slot, encoded once per distinct (slot, due instant), because a plan repeats them for every
    subscriber with the same subscription shape. Pure: a planning thread may encode them while the
    database works."""
    parts: dict[tuple, tuple[bytes, bytes]] = {}
    width = len(NEW_ALERT_COLUMNS)
    last_oid, first = None, b""
    for oid, slot, dedup, due in rows:
        part = parts.get((slot, due))
        if part is None:
            seconds, channel, send_at, status, reason = slot
            (head,) = _binary_fields([(seconds, channel, "reminder", 0)], _NEW_ALERT_KINDS[1:5])
            (tail,) = _binary_fields([(send_at, status, reason, 0, now, now, due)], _NEW_ALERT_KINDS[6:])
            part = parts[(slot, due)] = (head, tail)
        if oid != last_oid:  # an obligation's reminders come one after another
            if type(oid) is not int:
                raise TypeError(f"obligation id {oid!r} is not an int")
            last_oid, first = oid, _pack_row_id(width, 8, oid)
        key = dedup.encode()
        yield b"".join((first, part[0], _pack_length(len(key)), key, part[1]))


def copy_new_alerts(conn: Connection, records: Iterable[bytes]) -> int:
    """``COPY`` :func:`new_alert_records` into ``alerts`` (PostgreSQL only). Returns the rows written.
    A row whose identity or dedup key is stored already fails the whole ``COPY`` with a unique
    violation (``IntegrityError``): the caller holds a savepoint and merges instead."""
    return copy_binary(conn, alerts.name, NEW_ALERT_COLUMNS, records)


# COPY binary format (PostgreSQL): a header; per row a 16-bit field count, then per field a 32-bit
# length (-1: NULL) and the value in its type's binary form; a 16-bit -1 at the end. The server
# then parses nothing: with text, reading the lines, numbers and ISO instants of a first plan's
# rows cost about 12% of the backend's CPU (perf, 96,000 alerts), with binary about 6%.
_BINARY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # signature, flags, header extension length
_BINARY_TRAILER = b"\xff\xff"
_BINARY_NULL = b"\xff\xff\xff\xff"
_pack_count = struct.Struct("!h").pack
_pack_length = struct.Struct("!i").pack
_pack_int4 = struct.Struct("!ii").pack  # (length 4, value)
_pack_int8 = struct.Struct("!iq").pack  # (length 8, value)
_pack_row_id = struct.Struct("!hiq").pack  # (field count, length 8, an int8 first field)
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # timestamptz: microseconds since then, UTC
_MICROSECOND = timedelta(microseconds=1)
# The binary block sent per write: large enough that the calls cost nothing, small enough that the
# server works on one block while the next is formatted.
_BINARY_BLOCK = 1 << 19


def _binary_value(v, kind: str) -> bytes:
    """One field (its length, then its value) of a column of type ``kind`` ("int4", "int8", "text",
    "timestamptz"). Raises ``ValueError`` for a naive datetime (as the store's column type does) and
    ``TypeError`` for a value that is not of the column's type: binary data is not checked by the
    server beyond its length, so a 4-character string sent as an int4 would be stored as a number."""
    if v is None:
        return _BINARY_NULL
    if kind == "text" and isinstance(v, str):
        b = v.encode()
        return _pack_length(len(b)) + b
    if kind == "timestamptz" and isinstance(v, datetime):
        if v.tzinfo is None:
            raise ValueError(f"naive datetime {v!r} given to the store; instants must be aware UTC")
        return _pack_int8(8, (v - _PG_EPOCH) // _MICROSECOND)
    if type(v) is int:
        if kind == "int4":
            return _pack_int4(4, v)
        if kind == "int8":
            return _pack_int8(8, v)
    raise TypeError(f"{v!r} ({type(v).__name__}) cannot be written to a {kind} column")


def _binary_fields(rows: Iterable[tuple], kinds: Sequence[str]) -> Iterator[bytes]:
    """The fields of each row (``kinds``: each column's type, see :func:`_binary_value`), without the
    row's field count. Every value but an int is encoded once per 50,000 distinct values of its
    column (a plan repeats tenants, channels, statuses and instants on every row)."""
    memos: list[dict] = [{} for _ in kinds]
    for row in rows:
        parts = []
        for v, kind, memo in zip(row, kinds, memos, strict=True):  # a row of the wrong width raises
            if type(v) is int:
                parts.append(_pack_int4(4, v) if kind == "int4" else _binary_value(v, kind))
                continue
            b = memo.get(v)
            if b is None:
                b = _binary_value(v, kind)
                if len(memo) >= 50_000:
                    memo.clear()  # bounded: unique values (keys) must not pile up
                memo[v] = b
            parts.append(b)
        yield b"".join(parts)


def copy_binary(conn: Connection, table: str, columns: list[str], records: Iterable[bytes]) -> int:
    """``COPY table (columns) FROM STDIN (FORMAT BINARY)`` of ready records (each a field count and
    its fields, see :func:`_binary_fields`), sent in blocks (PostgreSQL only). Returns the records
    written."""
    n = 0
    block = bytearray(_BINARY_HEADER)
    with conn.connection.dbapi_connection.cursor() as cur, \
            cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)") as copy:
        for record in records:
            block += record
            n += 1
            if len(block) >= _BINARY_BLOCK:
                copy.write(block)
                block = bytearray()  # a new buffer: the driver may still hold the one just sent
        block += _BINARY_TRAILER
        copy.write(block)
    return n


@contextmanager
def key_lookups(conn: Connection) -> Iterator[None]:
    """Within the block, PostgreSQL joins a chunk's staged rows to ``obligations`` and ``alerts`` by
    index lookups (nested loops), never by hashing or merging a scan of the whole table.

    A chunk of 20,000 keys against millions of stored rows is cheapest as 20,000 index probes, but
    the planner, with statistics that lag a bulk load, prefers a sequential scan per chunk: a
    quadratic plan (measured: 120 chunks × 2.4M obligations on a 9.6M-alert plan). SQLite always
    uses the indexes, so nothing changes there."""
    if conn.dialect.name != "postgresql":
        yield
        return
    conn.exec_driver_sql("SET LOCAL enable_hashjoin = off")
    conn.exec_driver_sql("SET LOCAL enable_mergejoin = off")
    yield
    # Not in a `finally`: the settings are the transaction's (SET LOCAL), which an error rolls back,
    # and a RESET on the aborted transaction failed and hid that error.
    conn.exec_driver_sql("RESET enable_hashjoin")
    conn.exec_driver_sql("RESET enable_mergejoin")


def store_has_no_obligations(conn: Connection) -> bool:
    """Whether ``obligations`` holds no row at all (one index probe): a plan of such a store is a
    first plan, whose chunks are all new."""
    return not conn.execute(select(exists().select_from(obligations))).scalar()


def none_stored(conn: Connection, keys: list[str], sample: int = 256) -> bool:
    """Whether none of ``sample`` keys spread evenly over ``keys`` is stored (PostgreSQL only): a
    cheap guess that a chunk is all new. A wrong "yes" is caught by the keys' unique index (see
    :func:`copy_new_obligations`), never trusted."""
    step = max(1, len(keys) // sample)
    return not conn.exec_driver_sql(
        "SELECT EXISTS (SELECT 1 FROM obligations WHERE obligation_key = ANY(%(keys)s))",
        {"keys": keys[::step]}).scalar()


NEW_OBLIGATION_COLUMNS = [*OB_COLS, "status", "planned_at", "revision"]
# Their column types (after the id), for the binary COPY of new obligations.
_NEW_OBLIGATION_KINDS = ("text", "text", "int8", "int8", "text", "int4", "text", "text", "timestamptz", "text",
                         "text", "text", "text", "timestamptz", "int4")


def new_obligation_records(rows: Iterable[tuple], now: datetime) -> list[bytes]:
    """The binary COPY fields of new obligations (``rows`` in :data:`OB_COLS` order, planned at
    ``now``, aware UTC) after their id (:data:`NEW_OBLIGATION_COLUMNS`). Pure: a planning thread
    encodes the next chunk while the database writes this one."""
    return list(_binary_fields(((*row, ObligationState.ACTIVE, now, 0) for row in rows), _NEW_OBLIGATION_KINDS))


def copy_new_obligations(conn: Connection, rows: list[tuple], now: datetime,
                         records: list[bytes] | None = None) -> dict[str, int]:
    """``COPY`` obligations known to be new (see :func:`none_stored`) straight into ``obligations``,
    with ids drawn from its sequence up front, and their ids into ``planned_ids`` (PostgreSQL only).
    ``rows`` are in :data:`OB_COLS` order; ``records``, when given, their :func:`new_obligation_records`
    (encoded beforehand, off the writing thread). Returns obligation_key → id.

    No staging, comparing or merging: for a chunk of new obligations that is most of the work.
    Raises ``IntegrityError`` when another run stored one of the keys meanwhile (a unique
    violation); the caller wraps this in a savepoint and merges instead."""
    with conn.connection.dbapi_connection.cursor() as cur:
        # One array, read by the driver (not 20,000 result rows through the ORM layer), and the
        # sequence looked up once (a scalar subquery), not once per row: per row that lookup cost
        # more than drawing the ids themselves (80 ms against 10 ms for 20,000 ids). The same
        # statement remembers the ids in ``planned_ids`` (the CTE is evaluated once, so both see
        # the same ids): one round trip per chunk where a second COPY took three. Undone with the
        # chunk's savepoint when the obligations' COPY below fails.
        cur.execute("WITH ids AS MATERIALIZED (SELECT nextval((SELECT pg_get_serial_sequence('obligations', 'id')"
                    "::regclass)) AS id FROM generate_series(1, %(n)s)), "
                    f"remembered AS (INSERT INTO {planned_ids.name} (id) SELECT id FROM ids) "
                    "SELECT array(SELECT id FROM ids)", {"n": len(rows)})
        (ids,) = cur.fetchone()
    if records is None:
        records = new_obligation_records(rows, now)
    width = 1 + len(NEW_OBLIGATION_COLUMNS)
    copy_binary(conn, obligations.name, ["id", *NEW_OBLIGATION_COLUMNS],
                (_pack_row_id(width, 8, i) + fields for i, fields in zip(ids, records, strict=True)))
    return {row[0]: i for row, i in zip(rows, ids, strict=True)}


@dataclass
class StagedDiff:
    """How the staged chunk differs from the stored obligations (see :func:`compare_staged`)."""

    new: list[str] = field(default_factory=list)
    # id, obligation_key, revision (before the merge), old_due_at, new_due_at, and the stored
    # rule_version, zone_data and calendar_data (what planned the old instant) of each moved one.
    moved: list[dict] = field(default_factory=list)
    changed: int = 0
    need_alerts: set[str] = field(default_factory=set)
    # Withdrawn obligations back under a newer rule version (the source withdrew the deadline and
    # restored it): their subscribers knew them. Not one back under the same version (its subscriber
    # or subscription came back: new to them).
    restored: set[str] = field(default_factory=set)
    # obligation_key → the instant it was due before: obligations a run of another partition moved
    # here (:func:`move_obligation`, fingerprint cleared) without planning their new instant's
    # reminders, which this run plans as those of a moved deadline.
    moved_before: dict[str, datetime] = field(default_factory=dict)
    # Every obligation coming back from withdrawn (``restored`` or not): while withdrawn, its subscriber
    # was owed none of its reminders.
    reactivated: set[str] = field(default_factory=set)


def _differs(o, s):
    """Whether stored obligation ``o`` differs from staged/excluded ``s`` in anything planning writes."""
    return or_(o.c.due_at.is_distinct_from(s.due_at), o.c.fingerprint.is_distinct_from(s.fingerprint),
               o.c.status != ObligationState.ACTIVE, o.c.rule_version.is_distinct_from(s.rule_version),
               o.c.title.is_distinct_from(s.title), o.c.rule_id != s.rule_id,
               # A new zone-data or calendar version is recorded even where it moved nothing.
               o.c.zone_data.is_distinct_from(s.zone_data), o.c.calendar_data.is_distinct_from(s.calendar_data))


def compare_staged(conn: Connection) -> StagedDiff:
    """Compare the staged obligations with the stored ones, before the merge, in one read: which are
    ``new``, ``moved`` (due instant changed), ``changed`` (anything else planning writes:
    fingerprint, rule version, title, rule id, reactivation) and which ``need_alerts`` (new,
    fingerprint changed, or coming back from withdrawn). Unchanged rows are not returned at all."""
    s, o = stage_obligations, obligations
    diff = StagedDiff()
    for (key, oid, revision, old_due, new_due, fp_differs, inactive, version, zone, cal, new_version,
         moved_from) in conn.execute(
        select(s.c.obligation_key, o.c.id, o.c.revision, o.c.due_at, s.c.due_at,
               o.c.fingerprint.is_distinct_from(s.c.fingerprint), o.c.status != ObligationState.ACTIVE,
               o.c.rule_version, o.c.zone_data, o.c.calendar_data, s.c.rule_version,
               case((o.c.fingerprint.is_(None), o.c.previous_due_at), else_=None))
        .select_from(s.outerjoin(o, o.c.obligation_key == s.c.obligation_key))
        .where(or_(o.c.id.is_(None), _differs(o, s.c)))
    ):
        if oid is None:
            diff.new.append(key)
            diff.need_alerts.add(key)
            continue
        if old_due != new_due:
            diff.moved.append(dict(id=oid, obligation_key=key, revision=revision, old_due_at=old_due,
                                   new_due_at=new_due, rule_version=version, zone_data=zone,
                                   calendar_data=cal))
        else:
            diff.changed += 1
        if fp_differs or inactive:
            diff.need_alerts.add(key)
        if inactive:
            diff.reactivated.add(key)
        if inactive and version < new_version:
            diff.restored.add(key)
        if moved_from is not None and old_due == new_due:
            diff.moved_before[key] = moved_from
    return diff


def _per_triple(conn: Connection, triples: set[tuple[int, int, str]], aggregates: list, *conditions):
    """``((subscriber_id, source_id, rule_id), (aggregate values…))`` for each of ``triples`` with a stored
    obligation meeting ``conditions``, the ``aggregates`` taken over its obligations (any status). One
    read per 500 subscribers, by the ``(source_id, rule_id)`` index: it reads every obligation of the
    rules asked about (a row-value ``IN`` was planned as one index scan per triple)."""
    o = obligations
    sources_, rules_ = {t[1] for t in triples}, {t[2] for t in triples}
    for part in pages(sorted({t[0] for t in triples}), 500):
        for sub, src, rid, *values in conn.execute(
            select(o.c.subscriber_id, o.c.source_id, o.c.rule_id, *aggregates)
            .where(o.c.source_id.in_(sources_), o.c.rule_id.in_(rules_), o.c.subscriber_id.in_(part), *conditions)
            .group_by(o.c.subscriber_id, o.c.source_id, o.c.rule_id)
        ):
            if (sub, src, rid) in triples:
                yield (sub, src, rid), values


def planned_rule_versions(conn: Connection, triples: set[tuple[int, int, str]],
                          before: datetime) -> dict[tuple[int, int, str], int]:
    """``(subscriber_id, source_id, rule_id)`` → the newest rule version any obligation of that
    subscriber, source and rule (any status) was last planned with before ``before`` (aware UTC: the
    planning run's instant, so what this run wrote does not count), for those of ``triples`` that
    have one (:func:`_per_triple`)."""
    o = obligations
    return {triple: version for triple, (version,) in _per_triple(
        conn, triples, [func.max(o.c.rule_version)], o.c.planned_at < before)}


def series_known_until(conn: Connection, triples: set[tuple[int, int, str]],
                       before: datetime) -> dict[tuple[int, int, str], datetime]:
    """``(subscriber_id, source_id, rule_id)`` → the instant (aware UTC) up to which the subscriber
    knew that rule's occurrences before ``before`` (the planning window's start): the latest due
    instant before it of any stored obligation of theirs (any status), or, if later, the first time
    one was planned (``min(planned_at)``: occurrences before they watched the rule were never theirs
    to know). Triples without a stored obligation are left out (:func:`_per_triple`)."""
    o = obligations
    return {triple: max(first_planned, last_due) if last_due is not None else first_planned
            for triple, (last_due, first_planned) in _per_triple(
                conn, triples, [type_coerce(func.max(case((o.c.due_at < before, o.c.due_at))), UtcDateTime),
                                type_coerce(func.min(o.c.planned_at), UtcDateTime)])}


def first_planned(conn: Connection, obligation_ids: list[int]) -> dict[int, datetime]:
    """obligation id → when its first alert row was written (aware UTC: when the obligation was first
    planned with reminders), for those of ``obligation_ids`` that have one. One read per 500 ids."""
    found: dict[int, datetime] = {}
    for part in pages(obligation_ids, 500):
        found.update(conn.execute(
            select(alerts.c.obligation_id, type_coerce(func.min(alerts.c.created_at), UtcDateTime))
            .where(alerts.c.obligation_id.in_(part)).group_by(alerts.c.obligation_id)).all())
    return found


def merge_obligations(conn: Connection, now: datetime) -> dict[str, int]:
    """Merge the staged obligations that differ from the stored ones into ``obligations`` (unchanged
    ones are not even offered to the upsert, so they are neither locked nor rewritten). A changed due
    instant bumps ``revision`` and keeps the old instant in ``previous_due_at``. Returns
    obligation_key → id of every row inserted or updated. (Counts come from :func:`compare_staged`.)"""
    s, o = stage_obligations, obligations
    stored = o.alias("stored")
    cols = OB_COLS + ["status", "planned_at", "revision"]
    sel = (select(*[s.c[c] for c in OB_COLS], literal(ObligationState.ACTIVE, String).label("status"),
                  literal(now, UtcDateTime).label("planned_at"), literal(0).label("revision"))
           .select_from(s.outerjoin(stored, stored.c.obligation_key == s.c.obligation_key))
           .where(or_(stored.c.id.is_(None), _differs(stored, s.c))))
    ins = dialect_insert(conn, o).from_select(cols, sel)
    ex = ins.excluded
    due_moved = o.c.due_at.is_distinct_from(ex.due_at)
    stmt = ins.on_conflict_do_update(
        index_elements=["obligation_key"],
        set_={
            # A renamed rule keeps its obligation (same key, via the lineage) under its new id.
            "rule_id": ex.rule_id,
            "rule_version": ex.rule_version, "title": ex.title, "due_at": ex.due_at, "status": ex.status,
            "fingerprint": ex.fingerprint, "planned_at": ex.planned_at,
            "zone_data": ex.zone_data, "calendar_data": ex.calendar_data,
            "revision": case((due_moved, o.c.revision + 1), else_=o.c.revision),
            "previous_due_at": case((due_moved, o.c.due_at), else_=o.c.previous_due_at),
        },
        where=_differs(o, ex),
    )
    return dict(conn.execute(stmt.returning(o.c.obligation_key, o.c.id)).all())


def merge_alerts(conn: Connection, now: datetime) -> tuple[int, int]:
    """Merge staged reminder alerts. New rows are inserted with their planned status; an existing
    row's ``send_at`` moves only while it is still revisable
    (:data:`~deadline_pipeline.states.REVISABLE`: pending, waiting to retry or skipped) — a delivered
    alert is history and is never rewritten. Returns (inserted, moved)."""
    sa, o, a = stage_alerts, obligations, alerts
    if not conn.execute(select(exists().select_from(sa))).scalar():
        return 0, 0  # nothing staged: a no-op re-plan never touches the alerts table
    cols = NEW_ALERT_COLUMNS
    sel = (
        select(o.c.id, sa.c.offset_seconds, sa.c.channel, sa.c.kind, literal(0), sa.c.dedup_key, sa.c.send_at,
               sa.c.status, sa.c.status_reason, literal(0), literal(now, UtcDateTime), literal(now, UtcDateTime),
               sa.c.due_at)
        .join(o, o.c.obligation_key == sa.c.obligation_key)
        .where(true())
    )
    ins = dialect_insert(conn, a).from_select(cols, sel)
    # A reminder cancelled because its obligation was withdrawn comes back with the obligation (a
    # source that drops a rule and restores it must not leave its reminders cancelled for good).
    # Likewise a reminder superseded when its deadline moved away comes back when the deadline moves
    # back to that instant (a delivered one stays delivered: a flapping source never repeats a reminder).
    revived = or_(and_(a.c.status == AlertState.CANCELLED, a.c.status_reason.like(f"{WITHDRAWN_REASON_PREFIX}%")),
                  and_(a.c.status == AlertState.SUPERSEDED, a.c.status_reason.like(f"{MOVED_REASON_PREFIX}%")))
    stmt = ins.on_conflict_do_update(
        index_elements=ALERT_IDENTITY,
        set_={"send_at": ins.excluded.send_at, "updated_at": ins.excluded.updated_at,
              "status": case((revived, ins.excluded.status), else_=a.c.status),
              "status_reason": case((revived, ins.excluded.status_reason), else_=a.c.status_reason)},
        where=or_(and_(a.c.status.in_(REVISABLE),
                       a.c.send_at.is_distinct_from(ins.excluded.send_at)), revived),
    )
    if conn.dialect.name == "postgresql":
        return _upsert_counted(conn, stmt)
    # SQLite: counted around the merge (driver rowcounts of INSERT … SELECT … ON CONFLICT are not
    # reliable), from the alerts of the staged obligations only (by index), not of the whole table.
    of_staged = (select(func.count()).select_from(a)
                 .where(a.c.obligation_id.in_(select(o.c.id).join(sa, sa.c.obligation_key == o.c.obligation_key))))
    before = conn.execute(of_staged).scalar_one()
    moved = conn.execute(
        select(func.count()).select_from(
            sa.join(o, o.c.obligation_key == sa.c.obligation_key).join(
                a, and_(a.c.obligation_id == o.c.id, a.c.offset_seconds == sa.c.offset_seconds,
                        a.c.channel == sa.c.channel, a.c.kind == sa.c.kind, a.c.revision == 0,
                        a.c.due_at == sa.c.due_at)))
        .where(a.c.status.in_(REVISABLE), a.c.send_at.is_distinct_from(sa.c.send_at))
    ).scalar_one()
    conn.execute(stmt)
    return conn.execute(of_staged).scalar_one() - before, moved


def _upsert_counted(conn: Connection, stmt) -> tuple[int, int]:
    """Run the alerts upsert ``stmt`` on PostgreSQL and count, in the same statement, the rows it
    inserted and the revisable ones whose ``send_at`` it moved: (inserted, moved).

    ``xmax = 0`` tells an inserted row from an updated one in ``RETURNING``. An updated row was
    either moved (revisable before) or revived (cancelled or superseded before); the outer query
    reads the row as it was before the upsert, because a data-modifying ``WITH`` and its outer query
    share one snapshot (PostgreSQL manual, "Data-Modifying Statements in WITH"). The before-image is
    read by primary key for updated rows only. This replaced two counts of every alert of the
    chunk's obligations and a five-way join: three reads that cost a scoped re-plan more than its
    own insert."""
    merged = stmt.returning(alerts.c.id, literal_column("xmax = 0", Boolean).label("inserted")).cte("merged")
    before = select(alerts.c.status).where(alerts.c.id == merged.c.id).scalar_subquery()
    inserted, moved = conn.execute(
        select(func.count().filter(merged.c.inserted),
               # AND evaluates left to right and stops at false: no look-up for an inserted row.
               func.count().filter(and_(~merged.c.inserted, before.in_(REVISABLE))))
    ).one()
    return inserted, moved


# Why a reminder no subscription asks for any more is cancelled. It starts with the withdrawal
# prefix on purpose: the merge revives such a reminder when a later plan asks for it again (an
# offset removed and put back must not stay cancelled, which would be a silent miss).
UNWANTED_REASON = WITHDRAWN_REASON_PREFIX + "no subscription asks for this reminder any more"


def cancel_unwanted_reminders(conn: Connection, keys: Sequence[str], now: datetime) -> int:
    """Cancel the open reminders (:data:`~deadline_pipeline.states.REVISABLE`) of the obligations with
    these ``keys``, planned for their current due instant, whose (offset, channel) the staged
    reminders no longer contain: an offset or channel taken out of the subscription, a rule pattern
    narrowed while another subscription still wants the obligation. Call after :func:`merge_alerts`,
    with ``stage_alerts`` holding every reminder of each of these obligations, and only for
    obligations that kept their due instant (a moved one's current-instant reminders are the staged
    ones; its old ones are superseded). A leased alert is mid-send and left alone; delivered ones are
    history. Returns alerts cancelled.

    Before, such a reminder stayed pending and was sent although nobody asked for it (an offset
    removed from ``-P30D, -P7D`` still mailed its ``-P30D`` reminder), and ``fanout_complete`` stayed
    red with no run able to clear it. The comparison is made here, per batch of keys, not as one
    anti-join: PostgreSQL planned that as a nested loop over the unindexed staging table (3 s for a
    chunk of 9,600 reminders, quadratic in the chunk)."""
    sa, o, a = stage_alerts, obligations, alerts
    unwanted: list[int] = []
    for part in pages(keys, 500):
        wanted = set(conn.execute(select(sa.c.obligation_key, sa.c.offset_seconds, sa.c.channel)
                                  .where(sa.c.obligation_key.in_(part), sa.c.kind == "reminder")).all())
        unwanted.extend(i for i, *slot in conn.execute(
            select(a.c.id, o.c.obligation_key, a.c.offset_seconds, a.c.channel)
            .join(o, o.c.id == a.c.obligation_id)
            .where(o.c.obligation_key.in_(part), a.c.kind == "reminder", a.c.status.in_(REVISABLE),
                   a.c.due_at == o.c.due_at, or_(a.c.lease_expires_at.is_(None), a.c.lease_expires_at <= now))
        ) if tuple(slot) not in wanted)
    cancelled = 0
    for part in pages(unwanted, 500):
        cancelled += len(conn.execute(
            update(a).where(a.c.id.in_(part), a.c.status.in_(REVISABLE))
            .values(status=AlertState.CANCELLED, status_reason=UNWANTED_REASON, updated_at=now)
            .returning(a.c.id)).all())
    return cancelled


def reminders_of(conn: Connection, obligation_ids: list[int]) -> list[dict]:
    """Reminder alerts of these obligations (every state), for re-folding after a move."""
    out: list[dict] = []
    for part in pages(obligation_ids, 500):
        out.extend(dict(r) for r in conn.execute(
            select(alerts.c.id, alerts.c.obligation_id, alerts.c.offset_seconds, alerts.c.channel, alerts.c.kind,
                   alerts.c.send_at, alerts.c.status, alerts.c.status_reason, alerts.c.due_at)
            .where(alerts.c.obligation_id.in_(part), alerts.c.kind == "reminder")
        ).mappings().all())
    return out


def pending_reminders_noting(conn: Connection, obligation_ids: list[int], note: str) -> list[tuple[int, datetime]]:
    """``(obligation id, due instant)`` of each pending reminder of these obligations, planned for the
    obligation's current due instant, whose ``status_reason`` contains ``note`` (matched literally).
    Read after a merge: what the merge really left to send, not what was staged (a reminder already
    delivered for that instant stays delivered and is not counted)."""
    out: list[tuple[int, datetime]] = []
    for part in pages(obligation_ids, 500):
        out.extend(tuple(r) for r in conn.execute(
            select(alerts.c.obligation_id, alerts.c.due_at)
            .join(obligations, obligations.c.id == alerts.c.obligation_id)
            .where(alerts.c.obligation_id.in_(part), alerts.c.kind == "reminder", alerts.c.status == AlertState.PENDING,
                   alerts.c.due_at == obligations.c.due_at,
                   alerts.c.status_reason.contains(note, autoescape=True))
            .order_by(alerts.c.obligation_id, alerts.c.id)
        ).all())
    return out


def _supersede(which, now: datetime):
    """The update that supersedes the revisable reminders (:data:`~deadline_pipeline.states.REVISABLE`)
    of the obligations ``which`` selects (a condition on ``alerts.obligation_id``) planned for another
    due instant than the obligation's current one, unleased, returning their ids."""
    current = (select(obligations.c.due_at).where(obligations.c.id == alerts.c.obligation_id)
               .scalar_subquery())
    return (update(alerts)
            .where(which, alerts.c.kind == "reminder",
                   alerts.c.status.in_(REVISABLE), alerts.c.due_at.is_distinct_from(current),
                   or_(alerts.c.lease_expires_at.is_(None), alerts.c.lease_expires_at <= now))
            .values(status=AlertState.SUPERSEDED, updated_at=now,
                    status_reason=MOVED_REASON_PREFIX + "planned for an instant the deadline no longer has")
            .returning(alerts.c.id))


def _any_id(ids: Sequence[int]):
    """``alerts.obligation_id = ANY(:ids)`` (PostgreSQL): any number of ids in one array parameter, so
    one statement does what took one per page of 500 ids (each an ``IN`` list of 500 parameters)."""
    return alerts.c.obligation_id == any_(literal(list(ids), ARRAY(BigInteger)))


def supersede_other_instants(conn: Connection, obligation_ids: list[int], now: datetime) -> int:
    """Supersede the revisable reminders (:data:`~deadline_pipeline.states.REVISABLE`) of these
    obligations that were planned for another due instant than the obligation's current one (call
    after the obligations' merge; before or after their alerts' merge, which writes only the current
    instant's rows). Delivered ones are history and stay.
    An alert whose lease is live is mid-send and is left alone. Returns rows superseded."""
    if not obligation_ids:
        return 0
    if conn.dialect.name == "postgresql":
        return len(conn.execute(_supersede(_any_id(obligation_ids), now)).all())
    n = 0
    for part in pages(obligation_ids, 500):
        n += len(conn.execute(_supersede(alerts.c.obligation_id.in_(part), now)).all())
    return n


def supersede_moved(conn: Connection, obligation_ids: list[int], now: datetime) -> tuple[int, dict[int, set[str]]]:
    """:func:`supersede_other_instants` and :func:`delivered_channels` of these obligations: (rows
    superseded, obligation id → channels on which a reminder was already delivered). On PostgreSQL
    one statement (a data-modifying ``WITH``) where 2,400 moved obligations took ten (an update and
    a read per 500 ids; 0.29 s of a 0.95 s scoped re-plan, profiled). The update never touches a
    delivered row, so reading them in the update's snapshot gives what a read after it gives."""
    if not obligation_ids:
        return 0, {}
    if conn.dialect.name != "postgresql":
        return supersede_other_instants(conn, obligation_ids, now), delivered_channels(conn, obligation_ids)
    superseded = _supersede(_any_id(obligation_ids), now).cte("superseded")
    a = alerts
    rows = conn.execute(union_all(
        select(literal(None, BigInteger), literal(None, String), func.count()).select_from(superseded),
        select(a.c.obligation_id, a.c.channel, literal(None, Integer)).distinct()
        .where(_any_id(obligation_ids), a.c.kind == "reminder", a.c.status == AlertState.DELIVERED),
    )).all()
    n = 0
    delivered: dict[int, set[str]] = {}
    for ob, ch, count in rows:
        if count is not None:
            n = count
        else:
            delivered.setdefault(ob, set()).add(ch)
    return n, delivered


def set_alert_status(conn: Connection, alert_id: int, status: str, reason: str | None, now: datetime) -> None:
    conn.execute(update(alerts).where(alerts.c.id == alert_id, alerts.c.status.in_(PLANNED))
                 .values(status=status, status_reason=reason, updated_at=now))


def insert_notices(conn: Connection, rows: list[dict]) -> int:
    """Insert correction / cancellation alerts; an existing one (same obligation revision) is kept,
    so a re-plan never sends a second notice for the same change. Returns rows inserted."""
    if not rows:
        return 0
    n = 0
    for part in pages(rows, 500):
        stmt = dialect_insert(conn, alerts).values(list(part)).on_conflict_do_nothing().returning(alerts.c.id)
        n += len(conn.execute(stmt).all())
    return n


def unplanned_obligations(conn: Connection, source_ids: list[int], lo: datetime, hi: datetime,
                          rule_ids: dict[int, frozenset[str] | None] | None = None):
    """Active obligations of these sources due in ``[lo, hi]`` that this run did not plan (neither in
    ``planned_keys`` nor in ``planned_ids``): (id, key, rule_id, source_id, subscriber_id, revision,
    due_at, period). ``rule_ids`` (a scoped re-plan): source id → the only rule ids to look at
    (``None``: all of that source's); a source missing or with an empty set is left out."""
    if rule_ids is not None:
        source_ids = [sid for sid in source_ids if rule_ids.get(sid, frozenset()) != frozenset()]
    if not source_ids:
        return []
    o, s, ids = obligations, planned_keys, planned_ids
    which = [o.c.source_id.in_(source_ids)]
    if rule_ids is not None:
        which = [or_(*(o.c.source_id == sid if rule_ids[sid] is None
                       else and_(o.c.source_id == sid, o.c.rule_id.in_(sorted(rule_ids[sid]))) for sid in source_ids))]
    return conn.execute(
        select(o.c.id, o.c.obligation_key, o.c.rule_id, o.c.source_id, o.c.subscriber_id, o.c.revision,
               o.c.due_at, o.c.period)
        .where(*which, o.c.status == ObligationState.ACTIVE, o.c.due_at >= lo, o.c.due_at <= hi,
               ~exists().where(s.c.obligation_key == o.c.obligation_key), ~exists().where(ids.c.id == o.c.id))
    ).all()


def override_obligations_keyed_once(conn: Connection, rule_ids: dict[int, list[str]]):
    """Active obligations with the period ``once`` of the given rules (``rule_ids``: source id → the
    rule ids of RECURRENCE-ID overrides in force): (id, obligation_key, rule_id, source_id,
    subscriber_id). Empty for no rule id."""
    o = obligations
    which = [and_(o.c.source_id == sid, o.c.rule_id.in_(ids)) for sid, ids in sorted(rule_ids.items()) if ids]
    if not which:
        return []
    return conn.execute(
        select(o.c.id, o.c.obligation_key, o.c.rule_id, o.c.source_id, o.c.subscriber_id)
        .where(or_(*which), o.c.status == ObligationState.ACTIVE, o.c.period == "once")
        .order_by(o.c.id)
    ).all()


def rekey_obligation(conn: Connection, obligation_id: int, key: str, period: str, retired: str) -> bool:
    """Give obligation ``obligation_id`` the key ``key`` and period ``period``, keeping its id and alerts.
    A withdrawn obligation holding ``key`` gets ``retired`` instead (keys stay unique; it keeps its
    history). Returns False, changing nothing, when an active obligation holds ``key``."""
    o = obligations
    holder = conn.execute(select(o.c.id, o.c.status).where(o.c.obligation_key == key)).first()
    if holder is not None and holder.id != obligation_id:
        if holder.status == ObligationState.ACTIVE:
            return False
        conn.execute(update(o).where(o.c.id == holder.id).values(obligation_key=retired))
    conn.execute(update(o).where(o.c.id == obligation_id).values(obligation_key=key, period=period))
    return True


def move_obligation(conn: Connection, obligation_id: int, due_at: datetime, rule_version: int,
                    now: datetime, *, rule_id: str | None = None) -> None:
    """Move one obligation to ``due_at`` (aware UTC) outside the planning window (a move into the
    past, or into a month another partition plans): the revision is bumped and the old instant kept,
    exactly as a merge does for a move. The fingerprint is cleared: the new instant's reminders are
    not planned yet, and the run that plans them reads that as a move (:attr:`StagedDiff.moved_before`).
    ``rule_id``: the rule that now plans it, when another (a RECURRENCE-ID override moving its
    master's occurrence), as a merge records it: the checks recompute obligations per rule id."""
    o = obligations
    values = dict(due_at=due_at, previous_due_at=o.c.due_at, revision=o.c.revision + 1, rule_version=rule_version,
                  fingerprint=None, planned_at=now)
    if rule_id is not None:
        values["rule_id"] = rule_id
    conn.execute(update(o).where(o.c.id == obligation_id).values(**values))


def delivered_channels(conn: Connection, obligation_ids: list[int]) -> dict[int, set[str]]:
    """obligation id → channels on which a reminder was already delivered."""
    out: dict[int, set[str]] = {}
    for part in pages(obligation_ids, 500):
        for ob, ch in conn.execute(
            select(alerts.c.obligation_id, alerts.c.channel).distinct()
            .where(alerts.c.obligation_id.in_(part), alerts.c.kind == "reminder",
                   alerts.c.status == AlertState.DELIVERED)
        ).all():
            out.setdefault(ob, set()).add(ch)
    return out


def cancellation_notices(conn: Connection, obligation_ids: list[int]) -> list[tuple[int, int, str, str, int]]:
    """``(alert id, obligation id, channel, status, revision)`` of the cancellation notices of these
    obligations for their current revision (the withdrawal they announced), in id order."""
    a, o = alerts, obligations
    out: list[tuple[int, int, str, str, int]] = []
    for part in pages(obligation_ids, 500):
        out.extend(tuple(r) for r in conn.execute(
            select(a.c.id, a.c.obligation_id, a.c.channel, a.c.status, a.c.revision)
            .join(o, o.c.id == a.c.obligation_id)
            .where(a.c.obligation_id.in_(part), a.c.kind == "cancellation", a.c.revision == o.c.revision)
            .order_by(a.c.id)).all())
    return out


def cancel_unsent_notices(conn: Connection, alert_ids: list[int], reason: str, now: datetime) -> int:
    """Cancel these alerts where no send has begun (``pending`` or ``retry_wait``; a ``claimed`` one is
    its sender's), with ``reason``. Returns how many."""
    n = 0
    for part in pages(alert_ids, 500):
        n += conn.execute(update(alerts).where(
            alerts.c.id.in_(part), alerts.c.status.in_(UNSENT)
        ).values(status=AlertState.CANCELLED, status_reason=reason, updated_at=now)).rowcount
    return n


def withdraw_obligations(conn: Connection, ids: list[int], reason: str, now: datetime) -> int:
    """Mark obligations withdrawn and cancel their revisable alerts (never delete). Returns alerts cancelled.

    An alert whose lease is live is mid-send and is left alone: it finishes as delivered, and the
    cancellation notice (if any) follows it.
    """
    cancelled = 0
    for part in pages(ids, 500):
        conn.execute(update(obligations).where(obligations.c.id.in_(part)).values(status=ObligationState.WITHDRAWN,
                                                                                 planned_at=now))
        cancelled += len(conn.execute(
            update(alerts)
            .where(alerts.c.obligation_id.in_(part), alerts.c.status.in_(REVISABLE),
                   or_(alerts.c.lease_expires_at.is_(None), alerts.c.lease_expires_at <= now))
            .values(status=AlertState.CANCELLED, status_reason=WITHDRAWN_REASON_PREFIX + reason, updated_at=now)
            .returning(alerts.c.id)
        ).all())
    return cancelled


def planned_pairs(conn: Connection, source_ids: Sequence[int]) -> set[tuple[int, int]]:
    """(subscriber_id, source_id) of every stored obligation of these sources: who has been planned
    for, per source. No source, no read (the read scans every obligation of its sources)."""
    out: set[tuple[int, int]] = set()
    for part in pages(source_ids, 500):
        out.update((a, b) for a, b in conn.execute(
            select(obligations.c.subscriber_id, obligations.c.source_id).distinct()
            .where(obligations.c.source_id.in_(part))).all())
    return out


def insert_obligations_if_new(conn: Connection, rows: list[dict]) -> dict[str, int]:
    """Insert obligation rows (``obligations`` columns) whose key is not stored yet; an existing key
    is left as it is. Returns obligation_key → id of the rows inserted."""
    out: dict[str, int] = {}
    for part in pages(rows, 500):
        stmt = (dialect_insert(conn, obligations).values(list(part)).on_conflict_do_nothing()
                .returning(obligations.c.id, obligations.c.obligation_key))
        out.update({key: i for i, key in conn.execute(stmt).all()})
    return out


def reminder_statuses_of_rule(conn: Connection, source_id: int, rule_id: str, due_at: datetime) -> set[str]:
    """The statuses of every reminder of ``rule_id`` (of ``source_id``) for the due instant
    ``due_at`` (aware UTC), over all subscribers: what the outbox did about that deadline."""
    return set(conn.execute(
        select(alerts.c.status).distinct().join(obligations, obligations.c.id == alerts.c.obligation_id)
        .where(obligations.c.source_id == source_id, obligations.c.rule_id == rule_id,
               alerts.c.kind == "reminder", alerts.c.due_at == due_at)).scalars())


def max_rule_version_id(conn: Connection) -> int:
    """The highest ``rule_versions.id`` so far (0 when there is none): a version stored later has a
    higher id, so it marks where "new" versions begin."""
    return conn.execute(select(func.coalesce(func.max(rule_versions.c.id), 0))).scalar_one()


def rule_versions_between(conn: Connection, since_id: int, until_id: int | None = None) -> list:
    """The rule versions with ``since_id < id <= until_id`` (no upper bound when ``until_id`` is
    None), in no set order, as rows of ``(source_id, rule_id, withdrawn, payload)``; ``payload`` is
    the rule record as stored (dict)."""
    return conn.execute(
        select(rule_versions.c.source_id, rule_versions.c.rule_id, rule_versions.c.withdrawn,
               rule_versions.c.payload).where(
            rule_versions.c.id > since_id,
            *([rule_versions.c.id <= until_id] if until_id is not None else []))
    ).all()


def obligation_dues(conn: Connection, source_ids: Iterable[int], lo: datetime, hi: datetime) -> list:
    """``(source_id, rule_id, due_at)`` of every obligation of ``source_ids``, whatever its status,
    due in ``[lo, hi]`` (aware UTC), in no set order."""
    return conn.execute(
        select(obligations.c.source_id, obligations.c.rule_id, obligations.c.due_at).where(
            obligations.c.source_id.in_(source_ids), obligations.c.due_at >= lo, obligations.c.due_at <= hi)
    ).all()
