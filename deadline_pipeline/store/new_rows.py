"""SQL of the all-new write path (step 1 of a plan write, see :mod:`~deadline_pipeline.store.staging`):
obligations and reminders no stored row can conflict with, written by a binary ``COPY`` straight
into ``obligations`` and ``alerts`` (PostgreSQL; SQLite takes batched inserts), the guess that a
chunk is all new, and the binary encoding itself.

Separate because it is the first plan's hot path and the only code that encodes rows in
PostgreSQL's binary ``COPY`` format, whose mistakes the server does not catch (a value of the wrong
type is stored as whatever its bytes mean); a wrong "all new" guess is caught by the unique indexes
and the chunk is merged instead (:mod:`~deadline_pipeline.store.merge`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy import (
    Connection,
    exists,
    select,
)

from deadline_pipeline.states import ObligationState
from deadline_pipeline.store.schema import (
    alerts,
    obligations,
)
from deadline_pipeline.store.staging import OB_COLS, planned_ids, stage_rows

NEW_ALERT_COLUMNS = ["obligation_id", "offset_seconds", "channel", "kind", "revision", "dedup_key", "send_at",
                     "status", "status_reason", "attempts", "created_at", "updated_at", "due_at"]
# Their column types, for the binary COPY of new reminders.
_NEW_ALERT_KINDS = ("int8", "int4", "text", "text", "int4", "text", "timestamptz", "text", "text", "int4",
                    "timestamptz", "timestamptz", "timestamptz")


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
                         "text", "text", "text", "text", "timestamptz", "int4")


def new_obligation_records(rows: Iterable[tuple], now: datetime) -> list[bytes]:
    """The binary COPY fields of new obligations (``rows`` in
    :data:`~deadline_pipeline.store.staging.OB_COLS` order, planned at ``now``, aware UTC) after their
    id (:data:`NEW_OBLIGATION_COLUMNS`). Pure: a planning thread encodes the next chunk while the
    database writes this one."""
    return list(_binary_fields(((*row, ObligationState.ACTIVE, now, 0) for row in rows), _NEW_OBLIGATION_KINDS))


def copy_new_obligations(conn: Connection, rows: list[tuple], now: datetime,
                         records: list[bytes] | None = None) -> dict[str, int]:
    """``COPY`` obligations known to be new (see :func:`none_stored`) straight into ``obligations``,
    with ids drawn from its sequence up front, and their ids into ``planned_ids`` (PostgreSQL only).
    ``rows`` are in :data:`~deadline_pipeline.store.staging.OB_COLS` order; ``records``, when given,
    their :func:`new_obligation_records` (encoded beforehand, off the writing thread). Returns
    obligation_key → id.

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
