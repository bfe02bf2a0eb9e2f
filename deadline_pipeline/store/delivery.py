"""SQL of the delivery stage: the claimable question, the leased batch claim, and result writes that
only a lease holder may make.

Lease rules (DESIGN.md, "Alert lifecycle"): a claim sets ``lease_owner`` and ``lease_expires_at``;
only expiry frees a lease; a result is written with ``WHERE lease_owner = :me`` so that a sender
whose lease was taken over records its attempt but never overwrites the new owner's state.

Attempt rows: a ``delivery_attempts`` row is inserted (and committed) *before* the send. A row with a
start and no ``finished_at`` on an alert someone else has since claimed is the trace of a sender that
died or lost its database between the send and recording it: an unknown outcome
(:func:`close_stale_attempts`).

The hot writes (start attempts, record sends) are one statement per batch on PostgreSQL
(``unnest`` of arrays sent as binary parameters, measured in ``benchmarks/deliver.py``); other
engines update row by row.

Two clocks (docs/operating.md, "Two clocks"): whether an alert is *due* (``send_at``,
``next_attempt_at``) is judged at the sweep's ``now``, which may be a replayed instant (``--as-of``);
whether a *lease* is free, and until when a new lease runs, is judged by the database clock
(:func:`~deadline_pipeline.store.db.db_clock`), the one clock every sweeper shares. A sweeper whose
own clock runs ahead can therefore send a little early, but it can never take a lease another
sweeper still holds.

Text written here is cleaned first (:func:`clean_text`): one receiver answering with a NUL byte in
its message id must not make the whole batch's transaction fail.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from functools import lru_cache

from sqlalchemy import (
    Connection,
    Integer,
    Interval,
    String,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)

from deadline_pipeline.security.redact import redact, redact_optional
from deadline_pipeline.states import CLAIMABLE, AlertState
from deadline_pipeline.store.db import db_clock
from deadline_pipeline.store.schema import (
    UtcDateTime,
    alerts,
    delivery_attempts,
    obligations,
    rule_versions,
    sources,
    subscribers,
)

# Longest text stored from a channel's answer (a provider id, an error): a receiver's body is untrusted.
MAX_TEXT = 4000


def clean_text(value: str | None, limit: int = MAX_TEXT) -> str | None:
    """``value`` safe to store on every engine: NUL bytes (PostgreSQL refuses them in text) and other
    C0 control characters except tab/newline replaced by ``\\xNN``, lone surrogates (a JSON
    ``"\\ud800"``, which no driver can encode) by ``\\udNNN``, cut to ``limit`` characters."""
    if value is None:
        return None
    value = str(value).encode("utf-8", "backslashreplace").decode("utf-8")
    if any(ord(c) < 32 and c not in "\t\n\r" for c in value):
        value = "".join(c if ord(c) >= 32 or c in "\t\n\r" else f"\\x{ord(c):02x}" for c in value)
    return value[:limit]


def claimable(now: datetime, lease_now: datetime | None = None):
    """The admission condition of an alert, null-safe throughout.

    ``now`` (aware UTC): the instant due-ness is judged at (``send_at``, ``next_attempt_at``); may be
    a replayed instant. ``lease_now``: the database clock the lease is judged by (default ``now``,
    for callers that have read it already or compare within one clock).

    ``lease_expires_at`` and ``next_attempt_at`` are nullable: a bare ``col <= :now`` is unknown
    (so false) for NULL and would never admit a fresh row; each gets an explicit ``IS NULL`` branch.
    """
    lease_now = now if lease_now is None else lease_now
    return and_(
        alerts.c.status.in_(CLAIMABLE),
        or_(alerts.c.lease_expires_at.is_(None), alerts.c.lease_expires_at <= lease_now),
        alerts.c.send_at <= now,
        or_(alerts.c.next_attempt_at.is_(None), alerts.c.next_attempt_at <= now),
    )


# ``%(name)b``: a parameter psycopg sends in binary format.
_BINARY_PARAM = re.compile(r"%\((\w+)\)b")


def _pg_execute(conn: Connection, sql: str, params: dict) -> list[tuple]:
    """Run ``sql`` (driver placeholders: ``%(name)s``, or ``%(name)b`` for binary) on PostgreSQL in
    ``conn``'s transaction; returns its rows (``[]`` for a statement without a result). Raises what
    the driver raises: ``psycopg.Error`` with psycopg, ``sqlalchemy.exc.DBAPIError`` otherwise.

    Why binary: the batch statements below take arrays of up to a batch of ids, timestamps and
    texts, and psycopg dumps a list in text format element by element in Python - 500 aware
    datetimes cost 1.9 ms of the sweep's CPU as text, 0.1 ms as binary (500 ids: 0.26 ms vs 0.13 ms).
    A driver without binary parameters (psycopg2, given explicitly in the URL) gets ``%(name)s``:
    the same statement, with the arrays sent as text.

    Why psycopg's own cursor: these statements run once per group of sends (the attempt rows, about
    30 sends a group) and SQLAlchemy's execution around a driver statement (events, execution
    context, result wrapper) cost about 300 µs of the sweep's CPU per call, 40% of the call (the
    same INSERT of 32 attempt rows: 670-730 µs through ``exec_driver_sql``, 390-420 µs on the
    cursor). The cursor is the connection's own, so the statement is in ``conn``'s transaction;
    an error still fails that transaction and reaches the caller.
    """
    if conn.dialect.driver != "psycopg":
        result = conn.exec_driver_sql(_BINARY_PARAM.sub(r"%(\1)s", sql), params)
        return result.all() if result.returns_rows else []
    with conn.connection.driver_connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description is not None else []


def _check_owner(owner: str) -> str:
    # An empty or NULL owner would match rows nobody holds once compared null-safely.
    if not owner:
        raise ValueError("lease owner must be a non-empty string")
    return owner


def count_claimable(conn: Connection, now: datetime) -> int:
    """The sensor's one cheap indexed question: how many alerts could be claimed now (due at ``now``,
    lease free by the database clock)."""
    return conn.execute(select(func.count()).select_from(alerts)
                        .where(claimable(now, db_clock(conn)))).scalar_one()


@contextmanager
def _claim_in_order(conn: Connection) -> Iterator[None]:
    """Plan the statements run inside on PostgreSQL without a sort where another path exists, then
    restore the settings (``enable_sort``, ``jit``: for ``conn``'s transaction only; other engines:
    nothing).

    Why: the pick (``ORDER BY send_at, id LIMIT n FOR UPDATE SKIP LOCKED``) is cheap only as an
    ordered scan of ``ix_alerts_claimable_send_at_id`` that stops after the batch. Its alternative,
    reading every claimable row and sorting them, looks as cheap to the planner whenever its
    statistics know of few claimable rows - after a bulk insert, or a backlog that built up since the
    last ANALYZE, exactly when the backlog is large. Measured in a sweep of 20,000 alerts inserted
    just before it: the planner chose the sort on every claim (10,500 rows read and sorted to claim
    500). With sorts discouraged it takes the ordered scan whatever the statistics say; the one sort
    the claim needs (its 500 rows, for the caller's order) is still made.
    """
    if conn.dialect.name != "postgresql":
        yield
        return
    # jit too: a discouraged sort still made is costed 1e10, far over jit_above_cost, and compiling
    # the statement took ~400 ms per claim (measured).
    sort, jit = conn.exec_driver_sql(
        "SELECT current_setting('enable_sort'), current_setting('jit'), "
        "set_config('enable_sort', 'off', true), set_config('jit', 'off', true)").one()[:2]
    # Not in a finally: a failed statement aborts the transaction, whose rollback drops the local
    # settings, and a restore there would only hide the error under "transaction is aborted".
    yield
    conn.exec_driver_sql("SELECT set_config('enable_sort', %(sort)s, true), set_config('jit', %(jit)s, true)",
                         {"sort": sort, "jit": jit})


def claim_batch(conn: Connection, *, owner: str, now: datetime, lease_seconds: float, limit: int,
                lease_now: datetime | None = None) -> list[int]:
    """Claim up to ``limit`` alerts due at ``now`` in one statement; returns their ids.

    The lease runs ``lease_seconds`` from the database clock (``lease_now``, read here when not
    given; only tests and tools pass it), and a held lease is judged by that clock too, so sweepers
    with skewed clocks never take each other's leases.

    PostgreSQL selects with ``FOR UPDATE SKIP LOCKED`` so concurrent sweeps take disjoint rows without
    waiting; SQLite serialises writers, and the outer ``WHERE`` re-checks admission, which makes the
    statement a compare-and-swap there.
    """
    _check_owner(owner)
    lease_now = db_clock(conn) if lease_now is None else lease_now
    pick = select(alerts.c.id).where(claimable(now, lease_now)).order_by(alerts.c.send_at, alerts.c.id).limit(limit)
    lease = {"status": AlertState.CLAIMED, "lease_owner": owner,
             "lease_expires_at": lease_now + timedelta(seconds=lease_seconds), "updated_at": now}
    if conn.dialect.name == "postgresql":
        # A materialised CTE joined in, not ``WHERE id IN (subquery)``: with the IN form PostgreSQL
        # claimed every due row whatever the LIMIT (measured: 600 of 600 for LIMIT 50), because a
        # locking subquery is not guaranteed to be evaluated once; a MATERIALIZED CTE is.
        picked = pick.with_for_update(skip_locked=True).cte("picked").prefix_with("MATERIALIZED")
        # The picked rows are updated by id alone, claimable() not repeated:
        # * it is already true: the pick locks each row FOR UPDATE, and PostgreSQL re-checks the
        #   pick's conditions on the newest version of a row changed before the lock was taken (a
        #   row another claimer took meanwhile is skipped); once locked, nobody else can change it.
        # * repeated, it let the planner read the UPDATE's target through the claimable index and
        #   join the batch to it row by row - measured in a sweep of 5,000 right after the alerts
        #   were inserted (no statistics yet): 2,500,000 comparisons and ~400 ms per claim of 500
        #   instead of ~20 ms.
        # SQLite (no row locks) keeps the re-check below: it makes that statement a compare-and-swap.
        stmt = update(alerts).where(alerts.c.id == picked.c.id).values(**lease).returning(alerts.c.id)
    else:
        stmt = update(alerts).where(alerts.c.id.in_(pick.scalar_subquery()), claimable(now, lease_now)) \
            .values(**lease).returning(alerts.c.id)
    with _claim_in_order(conn):
        return sorted(r[0] for r in conn.execute(stmt).all())


# What a sweep needs of each claimed alert to send it (load_claimed and claim_and_load).
def _send_columns(a):
    return (a.c.id, a.c.dedup_key, a.c.kind, a.c.channel, a.c.offset_seconds, a.c.attempts, a.c.send_at,
            obligations.c.title, obligations.c.rule_id, obligations.c.due_at,
            subscribers.c.external_id.label("subscriber"), subscribers.c.email, subscribers.c.webhook_url,
            subscribers.c.timezone, sources.c.name.label("source"), obligations.c.rule_version,
            obligations.c.source_id, rule_versions.c.payload,
            # Corrections carry the old due instant.
            a.c.previous_due_at,
            # The booking and Apprise channels' contacts, and the key a booking finds its events by.
            obligations.c.obligation_key, subscribers.c.caldav_url, subscribers.c.apprise_target,
            # The message explains a late send (planner's note) and a rolled due date (period).
            a.c.status_reason, obligations.c.period)


def _send_joins(a):
    return (a.join(obligations, obligations.c.id == a.c.obligation_id)
            # The rule version the obligation was planned from gives the link and note to show.
            .outerjoin(rule_versions, and_(rule_versions.c.source_id == obligations.c.source_id,
                                           rule_versions.c.rule_id == obligations.c.rule_id,
                                           rule_versions.c.version == obligations.c.rule_version))
            .join(subscribers, subscribers.c.id == obligations.c.subscriber_id)
            .join(sources, sources.c.id == obligations.c.source_id))


STALE_ATTEMPT_ERROR = "the sender's lease expired before it recorded an outcome (crash or lost database after the send)"


def claim_and_load(conn: Connection, *, owner: str, now: datetime, lease_seconds: float,
                   limit: int) -> tuple[list[dict], dict[int, int]]:
    """Claim up to ``limit`` alerts due at ``now``, load what sending them needs, and close the
    unfinished attempts a previous holder left: ``(rows, {alert_id: attempts closed})``.

    The same steps as :func:`claim_batch`, :func:`load_claimed`, :func:`close_stale_attempts` and
    :func:`add_attempts` (rows ordered by ``send_at, id``; each row's ``attempts`` already counts its
    closed attempts). On PostgreSQL they are one statement - one round trip instead of five, with the
    lease judged and set on that statement's database clock (``statement_timestamp()``): profiled in
    ``benchmarks/deliver.py``, the claim was the largest of the sweep's database costs. Other engines
    run the steps one by one in ``conn``'s transaction.
    """
    _check_owner(owner)
    if conn.dialect.name != "postgresql":
        ids = claim_batch(conn, owner=owner, now=now, lease_seconds=lease_seconds, limit=limit)
        if not ids:
            return [], {}
        rows = load_claimed(conn, ids)
        stale = close_stale_attempts(conn, ids, owner=owner, now=now)
        add_attempts(conn, stale, owner=owner, now=now)
        for row in rows:
            row["attempts"] += stale.get(row["id"], 0)
        return rows, stale
    stmt = _pg_claim_and_load_statement()
    params = {"claim_owner": owner, "claim_now": now, "claim_lease": timedelta(seconds=lease_seconds),
              "claim_limit": limit}
    with _claim_in_order(conn):
        result = conn.execute(stmt, params)
        keys = list(result.keys())
        # zip over plain rows: a RowMapping per row cost more than the statement itself (cProfile).
        rows = [dict(zip(keys, r, strict=True)) for r in result.all()]
    counts = {}
    for row in rows:
        n = row.pop("n_stale")
        if n:
            counts[row["id"]] = int(n)
    return rows, counts


@lru_cache(maxsize=1)
def _pg_claim_and_load_statement():
    """:func:`claim_and_load`'s one PostgreSQL statement, built once with bind parameters
    (``claim_owner``, ``claim_now``, ``claim_lease`` (an interval), ``claim_limit``).

    Built once: constructing this statement and computing its cache key on every claim cost about
    3 ms of the sweep's CPU per claim of 500 (cProfile), about a tenth of the claim.
    """
    owner = bindparam("claim_owner", type_=String)
    now = bindparam("claim_now", type_=UtcDateTime)
    lease_now = func.statement_timestamp()
    # As in claim_batch: a MATERIALIZED CTE, so the LIMIT holds for a locking pick.
    pick = (select(alerts.c.id).where(claimable(now, lease_now)).order_by(alerts.c.send_at, alerts.c.id)
            .limit(bindparam("claim_limit", type_=Integer)).with_for_update(skip_locked=True).cte("picked")
            .prefix_with("MATERIALIZED"))
    # A previous holder's unfinished attempts (IS DISTINCT FROM: null-safe, never our own). Every
    # part of one statement sees the snapshot from before it, so this count is taken before the
    # "stale" part below closes them. Counted once per picked alert in a CTE of its own: as a
    # subquery of the UPDATE it was run twice per alert (for SET and again for RETURNING).
    n_stale = (select(func.count()).select_from(delivery_attempts)
               .where(delivery_attempts.c.alert_id == pick.c.id, delivery_attempts.c.finished_at.is_(None),
                      delivery_attempts.c.lease_owner.is_distinct_from(owner))
               .scalar_subquery())
    # MATERIALIZED: inlined, the count was substituted into SET and RETURNING, run twice again.
    counted = select(pick.c.id, n_stale.label("n_stale")).cte("counted").prefix_with("MATERIALIZED")
    # RETURNING only what the send needs and the joins below use: the CTE's rows are kept in memory.
    returned = {"id", "obligation_id", "dedup_key", "kind", "channel", "offset_seconds", "attempts", "send_at",
                "previous_due_at", "status_reason"}
    # By id alone, as in claim_batch: the pick holds the rows' locks and checked claimable() on them.
    claimed = (update(alerts).where(alerts.c.id == counted.c.id)
               .values(status=AlertState.CLAIMED, lease_owner=owner,
                       lease_expires_at=lease_now + bindparam("claim_lease", type_=Interval), updated_at=now,
                       attempts=alerts.c.attempts + counted.c.n_stale)
               .returning(*(c for c in alerts.c if c.name in returned), counted.c.n_stale).cte("claimed"))
    stale = (update(delivery_attempts)
             .where(delivery_attempts.c.alert_id == claimed.c.id, delivery_attempts.c.finished_at.is_(None),
                    delivery_attempts.c.lease_owner.is_distinct_from(owner))
             .values(finished_at=now, outcome="unknown", error=STALE_ATTEMPT_ERROR)
             .returning(delivery_attempts.c.id).cte("stale"))
    stmt = (select(*_send_columns(claimed), claimed.c.n_stale).select_from(_send_joins(claimed))
            .order_by(claimed.c.send_at, claimed.c.id).add_cte(stale))
    return stmt


def load_claimed(conn: Connection, ids: list[int]) -> list[dict]:
    """Everything a channel needs to send each claimed alert (ordered by ``send_at, id``)."""
    if not ids:
        return []
    rows = conn.execute(select(*_send_columns(alerts)).select_from(_send_joins(alerts))
                        .where(alerts.c.id.in_(ids)).order_by(alerts.c.send_at, alerts.c.id)).mappings().all()
    return [dict(r) for r in rows]


def close_stale_attempts(conn: Connection, alert_ids: list[int], *, owner: str, now: datetime) -> dict[int, int]:
    """Close every unfinished attempt of ``alert_ids`` that ``owner`` did not start, as ``"unknown"``.

    Call right after claiming ``alert_ids``: the previous holder's lease has expired, so its open
    attempt will never be finished by it (it died, or lost the database after sending). Returns
    ``{alert_id: number of attempts closed}`` for the alerts that had any.
    """
    if not alert_ids:
        return {}
    # IS DISTINCT FROM: attempts rows of this owner (none yet, but never count our own) are skipped
    # null-safely; a plain != would be unknown if an owner column ever held NULL.
    stale = and_(delivery_attempts.c.alert_id.in_(alert_ids), delivery_attempts.c.finished_at.is_(None),
                 delivery_attempts.c.lease_owner.is_distinct_from(owner))
    rows = conn.execute(select(delivery_attempts.c.alert_id, func.count()).where(stale)
                        .group_by(delivery_attempts.c.alert_id)).all()
    if not rows:
        return {}
    conn.execute(update(delivery_attempts).where(stale).values(
        finished_at=now, outcome="unknown",
        error=STALE_ATTEMPT_ERROR))
    return {int(a): int(n) for a, n in rows}


def start_attempts(conn: Connection, items: list[tuple[int, int]], *, owner: str, now: datetime,
                   held_only: bool = False) -> dict[int, int]:
    """Insert one started attempt per ``(alert_id, attempt number)``; returns ``{alert_id: attempt_id}``.

    Committed before the send it announces, so a crash leaves a trace (see the module docstring).
    ``held_only``: insert only for alerts ``owner`` still holds on an unexpired lease by the database
    clock (the ownership check made right before a send); the others are left out of the result
    and must not be sent.
    """
    if not items:
        return {}
    if conn.dialect.name == "postgresql":
        # The lease check is a lookup by primary key per item, not a join: joined, the planner hashed
        # every claimed alert of every sweeper for each group of a few sends (its estimate of
        # 'claimed' rows is stale by design: they come and go within seconds), which made this
        # statement the slowest step before a send.
        held = (f"WHERE (SELECT al.lease_owner = CAST(%(owner)b AS text) AND al.status = '{AlertState.CLAIMED}' "
                "AND al.lease_expires_at > clock_timestamp() FROM alerts AS al WHERE al.id = v.a) "
                ) if held_only else ""
        rows = _pg_execute(conn, (
            "INSERT INTO delivery_attempts (alert_id, attempt, lease_owner, started_at) "
            "SELECT v.a, v.n, CAST(%(owner)b AS text), CAST(%(now)b AS timestamptz) "
            "FROM unnest(CAST(%(a)b AS bigint[]), CAST(%(n)b AS integer[])) AS v(a, n) "
            f"{held}RETURNING alert_id, id"), {"a": [i for i, _ in items], "n": [k for _, k in items],
                                               "owner": owner, "now": now})
        return {int(a): int(i) for a, i in rows}
    if held_only:
        clock = db_clock(conn)
        mine = set(conn.execute(select(alerts.c.id).where(
            alerts.c.id.in_([a for a, _ in items]), alerts.c.lease_owner == owner,
            alerts.c.status == AlertState.CLAIMED, alerts.c.lease_expires_at > clock)).scalars())
        items = [(a, n) for a, n in items if a in mine]
    out = {}
    for alert_id, attempt in items:
        out[alert_id] = start_attempt(conn, alert_id=alert_id, attempt=attempt, owner=owner, now=now)
    return out


def record_sent(conn: Connection, items: list[tuple[int, int, str, datetime]], *, owner: str,
                now: datetime) -> set[int]:
    """Record successful sends ``(alert_id, attempt_id, provider_message_id, sent_at)``.

    Every attempt row is finished as ``"sent"`` (a late writer records its attempt too); an alert is
    marked delivered only while ``owner`` still holds its lease. Returns the ids marked delivered;
    the others had their lease taken over.
    """
    _check_owner(owner)
    if not items:
        return set()
    items = [(a, t, clean_text(p, 1000), s) for a, t, p, s in items]
    if conn.dialect.name == "postgresql":
        params = {"a": [i[0] for i in items], "t": [i[1] for i in items], "p": [i[2] for i in items],
                  "s": [i[3] for i in items], "owner": owner, "now": now}
        _pg_execute(conn, (
            "UPDATE delivery_attempts AS d SET finished_at = v.s, outcome = 'sent', provider_message_id = v.p "
            "FROM unnest(CAST(%(t)b AS bigint[]), CAST(%(p)b AS text[]), CAST(%(s)b AS timestamptz[])) AS v(t, p, s) "
            "WHERE d.id = v.t"), params)
        # The owner check alone selects the claim's rows: a claim sets lease_owner (unique per
        # claim) together with status 'claimed', and every write that moves an alert out of
        # 'claimed' clears it. A status condition here let the planner, whose statistics rarely
        # know how many alerts are claimed, scan an index by status for the batch: every claimed
        # alert's entry, live or dead (the old (status, send_at) index), or the whole partial claim
        # index (the backlog), on every batch (test_delivery_claim_order.py reads the plan). Without
        # it only the primary key (or a scan of a small table) can find the rows.
        rows = _pg_execute(conn, (
            f"UPDATE alerts AS a SET status = '{AlertState.DELIVERED}', provider_message_id = v.p, delivered_at = v.s, "
            "attempts = a.attempts + 1, lease_owner = NULL, lease_expires_at = NULL, last_error = NULL, "
            "next_attempt_at = NULL, updated_at = CAST(%(now)b AS timestamptz) "
            "FROM unnest(CAST(%(a)b AS bigint[]), CAST(%(p)b AS text[]), CAST(%(s)b AS timestamptz[])) AS v(a, p, s) "
            "WHERE a.id = v.a AND a.lease_owner = CAST(%(owner)b AS text) RETURNING a.id"),
            params)
        return {int(r[0]) for r in rows}
    done = set()
    for alert_id, attempt_id, pmid, sent_at in items:
        finish_attempt(conn, attempt_id, now=sent_at, outcome="sent", provider_message_id=pmid)
        if mark_delivered(conn, alert_id, owner=owner, now=sent_at, provider_message_id=pmid):
            done.add(alert_id)
    return done


def release(conn: Connection, alert_ids: list[int], *, owner: str, now: datetime) -> int:
    """Give back claimed alerts that were never sent (the time budget or the lease ran out first):
    lease freed, state ``pending`` / ``retry_wait`` again, their unstarted attempt rows removed (no
    send happened, so no attempt was consumed). Returns how many alerts were released."""
    _check_owner(owner)
    if not alert_ids:
        return 0
    res = conn.execute(
        update(alerts)
        .where(alerts.c.id.in_(alert_ids), alerts.c.lease_owner == owner, alerts.c.status == AlertState.CLAIMED)
        .values(status=case((alerts.c.attempts == 0, literal(AlertState.PENDING, String)),
                            else_=literal(AlertState.RETRY_WAIT, String)), lease_owner=None,
                lease_expires_at=None, updated_at=now)
    )
    conn.execute(delete(delivery_attempts).where(delivery_attempts.c.alert_id.in_(alert_ids),
                                                 delivery_attempts.c.lease_owner == owner,
                                                 delivery_attempts.c.finished_at.is_(None)))
    return res.rowcount


def escalate_unsent(conn: Connection, alert_id: int, *, owner: str, now: datetime, reason: str,
                    attempts_consumed: int) -> bool:
    """Escalate a claimed alert without sending it (an unknown outcome on a booking channel, or
    attempts used up by unrecorded attempts). Only while ``owner`` holds the lease."""
    _check_owner(owner)
    res = conn.execute(
        update(alerts)
        .where(alerts.c.id == alert_id, alerts.c.lease_owner == owner, alerts.c.status == AlertState.CLAIMED)
        .values(status=AlertState.ESCALATED, attempts=alerts.c.attempts + attempts_consumed,
                last_error=clean_text(redact(reason)), status_reason=clean_text(redact(reason)),
                next_attempt_at=None, lease_owner=None, lease_expires_at=None, updated_at=now)
    )
    return res.rowcount == 1


def add_attempts(conn: Connection, counts: dict[int, int], *, owner: str, now: datetime) -> None:
    """Count attempts closed by :func:`close_stale_attempts` on alerts ``owner`` now holds."""
    if not counts:
        return
    conn.execute(
        update(alerts)
        .where(alerts.c.id == bindparam("aid"), alerts.c.lease_owner == owner)
        .values(attempts=alerts.c.attempts + bindparam("n"), updated_at=now),
        [{"aid": a, "n": n} for a, n in counts.items()],
    )


def start_attempt(conn: Connection, *, alert_id: int, attempt: int, owner: str, now: datetime) -> int:
    """Record that a send is about to start (before any network I/O, so a crash leaves a trace)."""
    res = conn.execute(insert(delivery_attempts).values(alert_id=alert_id, attempt=attempt, lease_owner=owner,
                                                        started_at=now))
    return res.inserted_primary_key[0]


def finish_attempt(conn: Connection, attempt_id: int, *, now: datetime, outcome: str,
                   provider_message_id: str | None = None, error: str | None = None) -> None:
    conn.execute(update(delivery_attempts).where(delivery_attempts.c.id == attempt_id).values(
        finished_at=now, outcome=outcome, provider_message_id=clean_text(provider_message_id, 1000),
        error=clean_text(redact_optional(error))))


def mark_delivered(conn: Connection, alert_id: int, *, owner: str, now: datetime, provider_message_id: str) -> bool:
    """Mark delivered if ``owner`` still holds the lease. Returns False when the lease was lost."""
    _check_owner(owner)
    res = conn.execute(
        update(alerts)
        .where(alerts.c.id == alert_id, alerts.c.lease_owner == owner, alerts.c.status == AlertState.CLAIMED)
        .values(status=AlertState.DELIVERED, provider_message_id=clean_text(provider_message_id, 1000),
                delivered_at=now, attempts=alerts.c.attempts + 1, lease_owner=None, lease_expires_at=None,
                last_error=None, next_attempt_at=None, updated_at=now)
    )
    return res.rowcount == 1


def mark_failed(conn: Connection, alert_id: int, *, owner: str, now: datetime, error: str,
                next_attempt_at: datetime | None, escalate: bool) -> bool:
    """Record one consumed attempt: back to ``retry_wait`` until ``next_attempt_at``, or ``escalated``.
    Only while ``owner`` holds the lease; returns False when it was lost."""
    _check_owner(owner)
    # Stored errors are shown in the UI, the watchdog and checks: never a URL's token (redacted here
    # too, whatever channel built the message).
    error = redact(error)
    res = conn.execute(
        update(alerts)
        .where(alerts.c.id == alert_id, alerts.c.lease_owner == owner, alerts.c.status == AlertState.CLAIMED)
        .values(status=AlertState.ESCALATED if escalate else AlertState.RETRY_WAIT, attempts=alerts.c.attempts + 1,
                last_error=clean_text(error), next_attempt_at=None if escalate else next_attempt_at,
                status_reason=clean_text(error) if escalate else None,
                lease_owner=None, lease_expires_at=None, updated_at=now)
    )
    return res.rowcount == 1
