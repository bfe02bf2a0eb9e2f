"""SQL of a planning transaction and its staging tables: the planning lock, the transaction's settings
(no JIT, index look-ups for key joins), the temporary tables a chunk is staged in and the keys a run
planned, their statistics, and the text ``COPY`` that loads them.

Separate because every write path of a plan goes through it (the all-new path of
:mod:`~deadline_pipeline.store.new_rows`, the compare-and-merge of :mod:`~deadline_pipeline.store.merge`,
the withdrawal of :mod:`~deadline_pipeline.store.unplanned`), while it knows nothing of how they write.

Shape of a plan write (the statement shape matters more than anything else at scale), per chunk of
about 10,000 obligations (memory is bounded by the chunk, not the plan):

1. a chunk guessed all new (:func:`~deadline_pipeline.store.new_rows.none_stored`; PostgreSQL) is
   ``COPY``-ed straight into ``obligations`` and ``alerts`` under a savepoint; the keys' unique index
   catches a wrong guess, and the chunk then takes the path below;
2. otherwise the planned rows go into a temporary staging table — ``COPY`` on PostgreSQL, a batched
   insert on SQLite — and one read (:func:`~deadline_pipeline.store.merge.compare_staged`) says which
   are new, moved or changed;
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
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy import (
    Column,
    Connection,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    select,
)

from deadline_pipeline.rules import RULE_ID_MAX
from deadline_pipeline.store.schema import (
    Id,
    UtcDateTime,
)

_stage_md = MetaData()
stage_obligations = Table(
    "stage_obligations", _stage_md,
    Column("obligation_key", String(64), primary_key=True),
    Column("tenant", String(200)), Column("subscriber_id", Id), Column("source_id", Id),
    Column("rule_id", String(RULE_ID_MAX)), Column("rule_version", Integer), Column("period", String(64)),
    Column("title", Text), Column("due_at", UtcDateTime), Column("fingerprint", String(64)),
    Column("zone_data", String(20)), Column("calendar_data", String(40)), Column("recurrence_engine", String(40)),
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
    re-plan's chunks; new rows go in binary, :func:`~deadline_pipeline.store.new_rows._binary_fields`).
    Every value but an int is formatted once per 50,000 distinct values (a plan repeats channels,
    statuses and instants on every row). Instants are written in ISO 8601 with their offset; a naive datetime raises
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
