"""Planning's writes, one chunk of obligations at a time: plan the chunk (obligations only),
build its reminder rows, compare it with the stored obligations, and write what differs — new
obligations and their reminders copied straight in, moved ones' old-instant reminders superseded
and new-instant ones written, late reminders folded by each subscription's late policy, and the
corrections a move or a restored deadline owes. Memory stays bounded by a chunk, not the plan."""

from __future__ import annotations

import logging
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy.exc import IntegrityError

from deadline_pipeline.instants import instant_text
from deadline_pipeline.plan.notices import (
    RESTORED_BEFORE_NOTICE,
    correction_row,
    moved_reason,
    restored_row,
    time_data_cause,
)
from deadline_pipeline.plan.planner import (
    MOVED_DESPITE_SKIP,
    SKIPPED_BY_POLICY,
    PlannedObligation,
    Target,
    merged_fingerprint,
    plan_obligations,
    reminder_rows,
)
from deadline_pipeline.plan.scope import series_of
from deadline_pipeline.states import SENT_OR_SENDING, UNSENT, AlertState
from deadline_pipeline.store import merge, new_rows, notice_rows, plan_history, staging, supersession

if TYPE_CHECKING:
    from deadline_pipeline.plan.outcome import PlanOutcome

log = logging.getLogger(__name__)


# Obligations planned, compared and written per chunk: memory stays bounded by the chunk (not the
# plan), and each chunk's statements stay small. A chunk is cut only between subscribers, because
# two subscriptions of one subscriber merge into one obligation. Two chunks are in memory at once
# (one written, the next planned): at 20,000 the peak RSS of a 960,000-alert plan was 30% above a
# 96,000-alert one (whose chunks never grew that large); at 10,000 both reach the same size. A first
# plan lost about 5% to the smaller chunks (each ends in a round trip the pipeline waits on), won back
# by not sampling a chunk expected to be new (see write_chunk).
CHUNK_OBLIGATIONS = 10_000


@dataclass
class Planned:
    """One obligation of a chunk and the targets (subscriptions) that ask for it, in plan order."""

    ob: PlannedObligation
    targets: list[Target]
    alert_count: int


def planned_chunks(targets, rules_cache, now, horizon, lo, hi, out: PlanOutcome, lineage: dict,
                    failed: set[tuple[int, str]], cache: dict, size: int | None = None, start_small: bool = False):
    """Expand every target (obligations only, no alert rows yet) and yield the obligations in chunks
    of about ``size`` as ``{obligation key: Planned}``. Rules with a planning problem (failed to
    expand, or cut at the occurrence cap: their stored obligations past the cut are kept, not
    withdrawn) are added to ``failed`` as (source id, rule id); counts and problems go to ``out``.
    ``size`` defaults to :data:`CHUNK_OBLIGATIONS`. With ``start_small`` (a first plan) the first chunks are smaller (an
    eighth of it, doubling), because the database idles while the first chunk is planned and made
    ready to COPY: a small one gets the writes going sooner, and each next chunk is prepared while
    the one before it is written. (A re-plan's chunks cost the database little next to their
    planning, so there more chunks would only add statements.)"""
    size = size or CHUNK_OBLIGATIONS
    limit = max(1, size // 8) if start_small else size
    chunk: dict[str, Planned] = {}
    last_subscriber = None
    for t in targets:
        if len(chunk) >= limit and t.subscriber_id != last_subscriber:
            yield chunk
            chunk = {}
            limit = min(size, limit * 2)
        last_subscriber = t.subscriber_id
        rules, _withdrawn = rules_cache[t.source_id]
        obs, problems = plan_obligations(t, rules, now, horizon, after=lo, before=hi + timedelta(microseconds=1),
                                         cache=cache, lineage=lineage.get(t.source_id))
        for p in problems:
            failed.add((t.source_id, p.rule_id))
        out.add_problems(problems)
        slots = len(t.offsets) * len(t.channels)
        for o in obs:
            first = chunk.get(o.key)
            if first is None:
                chunk[o.key] = Planned(o, [t], slots)
                out.obligations_planned += 1
                out.alerts_planned += slots
                continue
            # Two subscriptions of one subscriber to the same source plan the same obligation once,
            # with the reminders of both (a second subscription must never be silently dropped).
            have = {(o_.nominal_seconds, ch) for tt in first.targets for o_ in tt.offsets for ch in tt.channels}
            extra = len({(o_.nominal_seconds, ch) for o_ in t.offsets for ch in t.channels} - have)
            first.targets.append(t)
            first.alert_count += extra
            out.alerts_planned += extra
            first.ob.fingerprint = merged_fingerprint(first.ob.fingerprint, o.fingerprint)
        out.targets += 1
    if chunk:
        yield chunk


def alerts_of(p: Planned, now: datetime, cache: dict, moved: bool = False,
               owed_since: datetime | None = None) -> list[tuple[tuple, str]]:
    """The reminder rows (:func:`~deadline_pipeline.plan.planner.reminder_rows`: ``(slot,
    dedup_key)``) of one planned obligation: those of its first subscription, then any (offset,
    channel) only a later subscription asks for. ``moved``: a stored obligation whose due instant
    changed; ``owed_since``: when a stored one was first planned (both: see
    :func:`~deadline_pipeline.plan.planner.fold_late`)."""
    rows = reminder_rows(p.ob, p.targets[0], now, cache, moved=moved, owed_since=owed_since)
    if len(p.targets) == 1:
        return rows
    at = {(slot[0], slot[1]): i for i, (slot, _) in enumerate(rows)}
    for t in p.targets[1:]:
        for slot, key in reminder_rows(p.ob, t, now, cache, moved=moved, owed_since=owed_since):
            i = at.get((slot[0], slot[1]))
            if i is None:
                at[(slot[0], slot[1])] = len(rows)
                rows.append((slot, key))
            elif _wins(slot, rows[i][0]):
                rows[i] = (slot, key)
    return rows


def _wins(slot: tuple, kept: tuple) -> bool:
    """Whether a later subscription's reminder ``slot`` replaces the ``kept`` one of the same
    (offset, channel) of one obligation (slots as :func:`~deadline_pipeline.plan.planner.reminder_rows`
    makes them). A reminder one subscription sends beats one another subscription skips: with
    ``late_policy: skip`` in the first subscription and ``send_latest`` in the second, the late
    reminder was skipped and the subscriber got nothing, or got it, depending only on the order the
    subscriptions were written in. Otherwise the earlier instant (one identity, two spellings:
    ``-P7D`` here, ``-PT168H`` there), because a reminder may come early but never late."""
    sends, sent_kept = slot[3] == AlertState.PENDING, kept[3] == AlertState.PENDING
    if sends != sent_kept:
        return sends
    return slot[2] < kept[2]


@dataclass
class Prepared:
    """One planned chunk, ready to write: its obligation rows (:data:`~deadline_pipeline.store.staging.OB_COLS`
    order) and, for a chunk expected to be all new, each obligation's alert rows and binary COPY
    fields (in the chunk's order; ``None`` otherwise)."""

    chunk: dict[str, Planned]
    rows: list[tuple]
    alerts: list[list[tuple[tuple, str]]] | None = None
    records: list[bytes] | None = None


def prepare(chunk: dict[str, Planned], now: datetime, cache: dict, expect_new: bool) -> Prepared:
    """Everything a chunk's write needs that is pure Python, built on the planning thread: the
    obligation rows and, when ``expect_new``, the alert rows (one hash per alert: most of a first
    plan's client time) and the obligations' binary COPY fields, so the writing thread only streams them.
    A wrong expectation costs only this work: a chunk that is not all new is merged as usual."""
    rows = [(o.key, o.tenant, o.subscriber_id, o.source_id, o.rule_id, o.rule_version, o.period, o.title, o.due_at,
             o.fingerprint, o.zone_data, o.calendar_data, o.recurrence_engine) for o in (p.ob for p in chunk.values())]
    if not expect_new:
        return Prepared(chunk, rows)
    return Prepared(chunk, rows, [alerts_of(p, now, cache) for p in chunk.values()],
                     new_rows.new_obligation_records(rows, now))


def write_chunk(conn, prepared: Prepared, now: datetime, out: PlanOutcome, cache: dict,
                 pool: Executor | None = None) -> bool:
    """Stage one chunk's obligations, compare them with the stored ones in one statement, merge only
    those that differ, and build and write alert rows only for obligations whose fingerprint
    changed (new obligations' alerts go straight in): an unchanged chunk costs a read, no write.
    Returns whether the chunk was all new and written directly."""
    chunk, rows = prepared.chunk, prepared.rows
    # A chunk prepared as new (every chunk before it was) skips the sample and is copied at once: the
    # unique index still catches a stored key, and the sample cost a first plan 4% (a query per chunk).
    if conn.dialect.name == "postgresql" and (prepared.alerts is not None or new_rows.none_stored(conn, list(chunk))):
        # A chunk of new obligations only (a first plan, new subscribers): COPY them and their
        # alerts straight in. A stored key the sample missed, or one another run stored meanwhile,
        # makes the COPY fail on the unique index; the savepoint undoes it and the chunk is merged
        # as usual below.
        try:
            with conn.begin_nested():
                _write_new_chunk(conn, prepared, now, out, cache, pool)
            return True
        except (IntegrityError, conn.dialect.loaded_dbapi.IntegrityError) as exc:
            # (The COPY runs on the driver's cursor, so its error arrives unwrapped.)
            out.direct_write_fallbacks += 1
            log.warning("planning: a chunk guessed all new met stored keys (missed by the sample, or stored by "
                        "a concurrent plan run); merged instead: %s", getattr(exc, "orig", exc))
    staging.clear_stage(conn)
    staging.stage_rows(conn, staging.stage_obligations, rows)
    with staging.key_lookups(conn):
        _merge_chunk(conn, chunk, now, out, cache, pool)
    return False


def _merge_chunk(conn, chunk: dict[str, Planned], now: datetime, out: PlanOutcome, cache: dict,
                 pool: Executor | None) -> None:
    """The staged chunk: compare, merge what differs, write the alert rows of what changed.

    Order of the writes: the obligations' merge; the moved obligations' old-instant reminders
    superseded; the new obligations' reminders and the moved ones' new-instant reminders written
    straight in (PostgreSQL); every other changed obligation's reminders staged and merged; the
    corrections last (after the reminders, as the sweep's (send_at, id) order has always had them)."""
    diff = merge.compare_staged(conn)
    _count_compared(diff, len(chunk), out)
    staging.remember_staged(conn)
    if not diff.need_alerts and not diff.moved and not diff.changed:
        return  # nothing differs: no merge, no alert rows
    compared = _Compared.of(diff)
    built, ids, delivered = _merge_while_building(conn, chunk, compared, now, out, cache, pool)
    out.alerts_inserted += _write_new_reminders(conn, chunk, compared, built, ids, now, cache, out)
    out.alerts_inserted += _write_changed_reminders(conn, chunk, compared, built, ids, now, cache, out)
    out.alerts_cancelled += merge.cancel_unwanted_reminders(
        conn, [key for key in diff.need_alerts if key not in compared.new and key not in compared.old_due], now)
    _tell_changes(conn, chunk, compared, ids, delivered, now, out)


def _count_compared(diff: merge.StagedDiff, size: int, out: PlanOutcome) -> None:
    """Count a compared chunk of ``size`` obligations in ``out``: new, moved, changed, unchanged."""
    out.obligations_inserted += len(diff.new)
    out.obligations_moved += len(diff.moved)
    out.obligations_updated += diff.changed
    out.obligations_unchanged += size - len(diff.new) - len(diff.moved) - diff.changed


@dataclass
class _Compared:
    """A staged chunk's comparison with the stored obligations (``diff``) and the lookups its writes
    make: obligation key → old due instant (``old_due``) and id (``moved_ids``) of those this run
    moves; ``moved_from``: ``old_due`` plus those a run of another partition moved here."""

    diff: merge.StagedDiff
    new: set[str]
    old_due: dict[str, datetime]
    moved_ids: dict[str, int]
    moved_from: dict[str, datetime]

    @classmethod
    def of(cls, diff: merge.StagedDiff) -> _Compared:
        old_due = {m["obligation_key"]: m["old_due_at"] for m in diff.moved}
        # Moved here by a run of another partition (the old instant's month planned first): without
        # this its late reminders were folded as a new deadline's and, under late_policy skip, never
        # sent, while the old instant's had been superseded.
        return cls(diff, set(diff.new), old_due, {m["obligation_key"]: m["id"] for m in diff.moved},
                   {**diff.moved_before, **old_due})


@dataclass
class _Built:
    """Every alert row a merged chunk writes: the new obligations' (``new``, one list per key of
    ``diff.new``), each other changed obligation's (``changed``: key → rows, in write order: the moved
    ones by obligation id) and the moved ones' as binary COPY records (``records``, PostgreSQL).
    Emptied as they are written: a chunk's rows are the largest part of planning's memory."""

    new: list[list[tuple[tuple, str]]]
    changed: dict[str, list[tuple[tuple, str]]]
    records: list[bytes]


def _merge_while_building(conn, chunk: dict[str, Planned], compared: _Compared, now: datetime, out: PlanOutcome,
                          cache: dict, pool: Executor | None) -> tuple[_Built, dict[str, int], dict[int, set[str]]]:
    """Merge the staged obligations and supersede the moved ones' old-instant reminders on the
    ``pool``'s thread while this one builds every alert row the chunk writes (without a pool: build,
    then write). Returns the rows, obligation key → id, and obligation id → channels with a
    delivered reminder (read by the supersession)."""
    def write_obligations() -> tuple[dict[str, int], tuple[int, dict[int, set[str]]]]:
        # The moved obligations' old-instant reminders are superseded before the new instants' are
        # written: the update skips the current instant's rows, so it finds the same rows either way.
        return (merge.merge_obligations(conn, now),
                supersession.supersede_moved(conn, list(compared.moved_ids.values()), now))

    writing = pool.submit(write_obligations) if pool is not None else None
    try:
        built = _build_reminders(conn, chunk, compared, now, cache)
    finally:
        # Never leave the writes running on the connection, even when building the rows failed.
        written = writing.result() if writing is not None else None
    ids, (superseded, delivered) = written if written is not None else write_obligations()
    out.alerts_superseded += superseded
    return built, ids, delivered


def _build_reminders(conn, chunk: dict[str, Planned], compared: _Compared, now: datetime, cache: dict) -> _Built:
    """The alert rows of a chunk's new and changed obligations (:class:`_Built`). A set's order
    varies per process: sorted, a chunk writes its rows in the same order on every run."""
    diff, moved_ids = compared.diff, compared.moved_ids
    new = [alerts_of(chunk[key], now, cache) for key in diff.new]
    changed = {key: alerts_of(chunk[key], now, cache, moved=key in compared.moved_from or key in diff.restored)
               for key in sorted(diff.need_alerts - compared.new, key=lambda k: (moved_ids.get(k, 0), k))}
    return _Built(new, changed, _moved_records(conn, chunk, compared, changed, now))


def _moved_records(conn, chunk: dict[str, Planned], compared: _Compared,
                   changed: dict[str, list[tuple[tuple, str]]], now: datetime) -> list[bytes]:
    """The moved obligations' new-instant reminders (from ``changed``) as binary COPY records
    (:func:`~deadline_pipeline.store.new_rows.new_alert_records`); none on SQLite, which merges them."""
    if conn.dialect.name != "postgresql":
        return []
    moved_ids, moved_from = compared.moved_ids, compared.moved_from
    return list(new_rows.new_alert_records((
        (moved_ids[key], (seconds, channel, send_at, status, moved_reason(reason, moved_from[key])), dedup,
         chunk[key].ob.due_at)
        for key, rows in changed.items() if key in moved_ids
        for (seconds, channel, send_at, status, reason), dedup in rows), now))


def _write_new_reminders(conn, chunk: dict[str, Planned], compared: _Compared, built: _Built, ids: dict[str, int],
                         now: datetime, cache: dict, out: PlanOutcome) -> int:
    """Write the new obligations' reminders straight in, those of a deadline its subscriber already
    knew folded as a moved one's (:func:`_fold_as_known`); returns the rows written."""
    new_keys = compared.diff.new
    _fold_as_known(conn, [chunk[key] for key in new_keys], built.new, now, cache, out)
    rows, built.new = built.new, []
    return new_rows.insert_new_alerts(conn, (
        (ids[key], slot, dedup, chunk[key].ob.due_at)
        for key, alerts_ in zip(new_keys, rows, strict=True) for slot, dedup in alerts_
    ), now)


def _write_changed_reminders(conn, chunk: dict[str, Planned], compared: _Compared, built: _Built,
                             ids: dict[str, int], now: datetime, cache: dict, out: PlanOutcome) -> int:
    """Write every other changed obligation's reminders, late ones owed since the obligation was
    first planned re-folded (:func:`_fold_as_owed`): the moved ones' new-instant rows copied straight
    in where they can be (:func:`_insert_moved_alerts`), the rest staged and merged. Returns the rows
    inserted; the rows revived or moved by the merge are counted in ``out.alerts_moved``."""
    changed, records, moved_ids, moved_from = built.changed, built.records, compared.moved_ids, compared.moved_from
    built.changed, built.records = {}, []
    before_fold = {key: changed[key] for key in moved_ids if key in changed}
    _fold_as_owed(conn, changed, chunk, ids, compared.diff.reactivated, now, cache)
    if any(changed[key] is not rows for key, rows in before_fold.items()):
        records = _moved_records(conn, chunk, compared, changed, now)  # re-folded: encode them again
    del before_fold
    direct = 0
    if _insert_moved_alerts(conn, records):
        direct = len(records)
        changed = {key: rows for key, rows in changed.items() if key not in moved_ids}
    del records
    staged = staging.stage_rows(conn, staging.stage_alerts, (
        (key, seconds, channel, "reminder", dedup, send_at, status, moved_reason(reason, moved_from.get(key)),
         chunk[key].ob.due_at)
        for key, rows in changed.items() for (seconds, channel, send_at, status, reason), dedup in rows
    ))
    del changed
    merged, moved_alerts = merge.merge_alerts(conn, now) if staged else (0, 0)
    out.alerts_moved += moved_alerts
    return direct + merged


def _tell_changes(conn, chunk: dict[str, Planned], compared: _Compared, ids: dict[str, int],
                  delivered: dict[int, set[str]], now: datetime, out: PlanOutcome) -> None:
    """After the reminders: the corrections of moved and restored deadlines, and the count of late
    reminders sent despite ``late_policy: skip`` because their subscriber knew the deadline."""
    diff, old_due = compared.diff, compared.old_due
    _correct_moves(conn, diff.moved, {key: p.ob for key, p in chunk.items()}, delivered, now, out)
    _tell_restored(conn, [key for key in sorted(diff.reactivated) if key not in old_due], ids, chunk, now, out)
    # Restored, or moved by another partition's run: their late reminders go out despite skip too.
    also = [{"id": ids[key], "obligation_key": key, "old_due_at": diff.moved_before.get(key),
             "new_due_at": chunk[key].ob.due_at}
            for key in sorted((diff.restored | set(diff.moved_before)) - set(old_due)) if key in ids]
    _count_moved_despite_skip(conn, diff.moved + also, chunk, out)


def _insert_moved_alerts(conn, records: list[bytes]) -> bool:
    """Write the new instants' reminders of moved obligations (their binary COPY ``records``,
    :func:`~deadline_pipeline.store.new_rows.new_alert_records`; PostgreSQL) straight into ``alerts``
    under a savepoint. False when the caller must merge them instead: no records (SQLite), or one
    already stored (a deadline moved back to an instant it had: its superseded reminders are
    revived by the merge, never duplicated). The unique indexes tell the second case, as they do for
    a chunk guessed new, and the savepoint undoes the COPY. Written directly, they skip the staging
    table, its join and the per-row conflict check of the merge."""
    if not records:
        return False
    try:
        with conn.begin_nested():
            new_rows.copy_new_alerts(conn, records)
        return True
    except (IntegrityError, conn.dialect.loaded_dbapi.IntegrityError):
        # (The COPY runs on the driver's cursor, so its error arrives unwrapped.) Expected, not a
        # wrong guess of a chunk: not counted in ``direct_write_fallbacks``.
        log.info("planning: a moved deadline's new instant already has reminders (moved back); merged instead")
        return False


def _count_moved_despite_skip(conn, moved: list[dict], chunk: dict[str, Planned], out: PlanOutcome) -> None:
    """Count and log the late reminders of moved obligations (``moved``: dicts with ``id``,
    ``obligation_key``, ``old_due_at`` — None for one its source withdrew and restored — and
    ``new_due_at``) that go out at once although their subscription skips late reminders: a
    deliberate exception to the configured policy, so it is visible in the plan's metadata and log,
    not only in each alert's reason."""
    ids = {m["id"]: m for m in moved
           if any(t.late_policy == "skip" for t in chunk[m["obligation_key"]].targets)}
    if not ids:
        return
    found = supersession.pending_reminders_noting(conn, sorted(ids), MOVED_DESPITE_SKIP)
    if not found:
        return
    out.moved_sent_despite_skip += len(found)
    first = ids[found[0][0]]
    how = (f"moved from {instant_text(first['old_due_at'])} to" if first["old_due_at"] is not None
           else "withdrawn and restored by its source, due")
    log.warning("planning: %d late reminder(s) of %d moved deadline(s) sent at once although their subscription "
                "has late_policy skip (its subscriber knew only the old date); first: obligation %s %s %s",
                len(found), len({oid for oid, _ in found}), first["obligation_key"], how,
                instant_text(first["new_due_at"]))


def _write_new_chunk(conn, prepared: Prepared, now: datetime, out: PlanOutcome, cache: dict,
                     pool: Executor | None) -> None:
    """Write a chunk whose obligations are all new (:func:`~deadline_pipeline.store.new_rows.copy_new_obligations`).
    Its alert rows come prepared, or are built while the obligations are copied; counts go to
    ``out`` only once the chunk is written."""
    chunk, rows = prepared.chunk, prepared.rows
    built = prepared.alerts
    if built is not None:
        ids = new_rows.copy_new_obligations(conn, rows, now, prepared.records)
    else:
        copying = pool.submit(new_rows.copy_new_obligations, conn, rows, now) if pool is not None else None
        try:
            built = [alerts_of(p, now, cache) for p in chunk.values()]
        finally:
            # Never leave the COPY running on the connection, even when building the rows failed.
            ids = copying.result() if copying is not None else None
        if ids is None:
            ids = new_rows.copy_new_obligations(conn, rows, now)
    _fold_as_known(conn, list(chunk.values()), built, now, cache, out)
    written = new_rows.insert_new_alerts(conn, (
        (ids[key], slot, dedup, p.ob.due_at)
        for (key, p), alerts_ in zip(chunk.items(), built, strict=True) for slot, dedup in alerts_
    ), now)
    out.obligations_inserted += len(chunk)
    out.alerts_inserted += written


def _fold_as_known(conn, planned: list[Planned], built: list[list[tuple[tuple, str]]], now: datetime, cache: dict,
                   out: PlanOutcome) -> None:
    """Re-fold, in place, the reminder rows (``built``, one list per obligation of ``planned``) of new
    obligations whose subscriber was planned for their rule under an older version: a revision made
    them (a weekly series moved from Wednesdays to Tuesdays, a monthly one from the 15th to the
    10th), so ``late_policy: skip`` does not skip their late reminders — as for a deadline that moved
    (:func:`~deadline_pipeline.plan.planner.fold_late`, ``moved``). Planned as new, the 10th's
    reminder was skipped as late while the 15th's was withdrawn: its subscriber got nothing, or a
    "Cancelled" notice. A new subscriber, or a deadline new to a rule nobody was planned for, keeps
    ``skip``. Reads the store only when some row was skipped by that policy.

    A RECURRENCE-ID override (``UID#<RECURRENCE-ID>``, RFC 5545 §3.8.4.4) is a rule of its own, new
    at version 1 when the source adds it, but the occurrence it replaces was its series': an override
    new to a subscriber planned for its series (the master ``UID``) before this run moved a deadline
    the subscriber knew. Judged by its rule alone, an override moving the 18th to the 8th had its late
    reminder skipped while the 18th's was withdrawn: nobody was told."""
    maybe = [i for i, rows in enumerate(built) if _skipped_by_policy(rows)]
    if not maybe:
        return
    asked = {(planned[i].ob.subscriber_id, planned[i].ob.source_id, rule_id)
             for i in maybe for rule_id in {planned[i].ob.rule_id, series_of(planned[i].ob.rule_id)}}
    stored = plan_history.planned_rule_versions(conn, asked, now)
    for i in maybe:
        if not _known_before(planned[i].ob, stored):
            continue
        built[i] = alerts_of(planned[i], now, cache, moved=True)
        out.moved_sent_despite_skip += sum(1 for slot, _ in built[i]
                                           if slot[3] == AlertState.PENDING and slot[2] <= now)


def _skipped_by_policy(rows: list[tuple[tuple, str]]) -> bool:
    """Whether one of an obligation's reminder rows (:func:`alerts_of`) was skipped by ``late_policy:
    skip`` (not by a later reminder of the same deadline)."""
    return any(slot[3] == AlertState.SKIPPED and (slot[4] or "").endswith(SKIPPED_BY_POLICY) for slot, _ in rows)


def _known_before(ob: PlannedObligation, stored: dict[tuple[int, int, str], int]) -> bool:
    """Whether ``ob``'s subscriber was planned, before this run, for its rule under an older version
    (``stored``: :func:`~deadline_pipeline.store.plan_history.planned_rule_versions`), or, for an override
    never planned for them, for its series."""
    version = stored.get((ob.subscriber_id, ob.source_id, ob.rule_id))
    if version is not None:
        return version < ob.rule_version
    series = series_of(ob.rule_id)
    return series != ob.rule_id and (ob.subscriber_id, ob.source_id, series) in stored


def _fold_as_owed(conn, stored: dict[str, list[tuple[tuple, str]]], chunk: dict[str, Planned], ids: dict[str, int],
                  reactivated: set[str], now: datetime, cache: dict) -> None:
    """Re-fold, in place, the reminder rows (``stored``: obligation key → rows) of stored obligations
    that ``late_policy: skip`` skipped as late although their time came after the obligation was
    first planned (its first alert row, ``ids``: key → obligation id): they were owed, and a
    configuration edit (an offset taken out and put back, a channel renamed, a contact blanked and
    fixed) had cancelled them before they went out. Skipped as a new deadline's, they were never
    sent and every check stayed green (:func:`~deadline_pipeline.plan.planner.fold_late`,
    ``owed_since``). Not for obligations coming back from withdrawn (``reactivated``): a subscriber
    removed and added back was owed nothing meanwhile. Reads the store only when some row was skipped
    by that policy."""
    maybe = [key for key, rows in stored.items() if key in ids and key not in reactivated and _skipped_by_policy(rows)]
    if not maybe:
        return
    first = plan_history.first_planned(conn, [ids[key] for key in maybe])
    for key in maybe:
        since = first.get(ids[key])
        if since is not None:
            stored[key] = alerts_of(chunk[key], now, cache, owed_since=since)


def _tell_restored(conn, keys: list[str], ids: dict[str, int], chunk: dict[str, Planned], now: datetime,
                   out: PlanOutcome) -> None:
    """For obligations coming back from withdrawn at the same due instant (``keys``; ``ids``: key →
    id): a cancellation notice of the withdrawal not yet sent is cancelled, and each channel where
    one was sent (or is being sent) gets a correction saying the deadline stands again
    (:func:`~.notices.restored_row`). Before, "Cancelled … no further reminders will be sent" was the
    subscriber's last word on a deadline its source had restored, with every reminder already
    delivered: nothing more was sent, every check green. A subscriber removed and added back got no
    notice when removed, so gets none now."""
    oids = {ids[key]: key for key in keys if key in ids}
    if not oids:
        return
    notices = notice_rows.cancellation_notices(conn, sorted(oids))
    if not notices:
        return
    unsent = [aid for aid, _oid, _ch, status, _rev in notices if status in UNSENT]
    out.alerts_cancelled += notice_rows.cancel_unsent_notices(conn, unsent, RESTORED_BEFORE_NOTICE, now)
    rows = [restored_row(oid, oids[oid], channel, revision, chunk[oids[oid]].ob.due_at, now)
            for _aid, oid, channel, status, revision in notices
            if status in SENT_OR_SENDING]
    written = notice_rows.insert_notices(conn, rows)
    out.corrections += written
    if written:
        log.warning("planning: %d correction(s) tell subscribers that %d deadline(s) withdrawn with a cancellation "
                    "notice are back", written, len({r["obligation_id"] for r in rows}))


def _correct_moves(conn, moved: list[dict], by_key: dict, delivered: dict[int, set[str]], now: datetime,
                   out: PlanOutcome) -> None:
    """After the merge and the supersession of their old instants' open reminders
    (:func:`~deadline_pipeline.store.supersession.supersede_moved`, which read ``delivered``: obligation id →
    channels with a delivered reminder): log each move's time-data cause and send one correction per
    channel where a reminder was already delivered."""
    if not moved:
        return
    notices = []
    for m in moved:
        ob = by_key[m["obligation_key"]]
        revision = m["revision"] + 1  # the merge bumped it once for this move
        cause = time_data_cause(m, ob)
        if cause:
            out.moved_by_time_data += 1
            log.warning("planning: obligation %s moved from %s to %s: %s", ob.key, instant_text(m["old_due_at"]),
                        instant_text(ob.due_at), cause)
        for channel in sorted(delivered.get(m["id"], ())):
            notices.append(correction_row(m["id"], ob.key, channel, revision, m["old_due_at"], ob.due_at, now,
                                          cause=cause))
    out.corrections += notice_rows.insert_notices(conn, notices)
