"""The delivery sweep without Dagster: claim a leased batch, send each alert, record the result.

At-least-once with idempotency keys: an alert whose send outcome is unknown is retried with the same
dedup key (SMTP Message-ID, webhook Idempotency-Key / webhook-id). One bad alert fails alone; the
rest go out.

One batch, in order:

1. **claim** (one transaction): lease up to ``delivery.batch_size`` claimable alerts under a lease
   owner of its own (``host#pid#run#c<n>.<random>``: every claim, even a sweep's second claim of
   the same alert, is a distinct owner) and close the unfinished attempts a previous holder left
   (unknown outcome, counted as attempts) — including this sweep's own earlier claim whose lease
   expired;
2. **decide**: an alert whose unknown outcome came from a previous holder (a dead sender, or this
   sweep's own expired claim) is resent on a ``notification`` channel; on a ``booking`` channel it
   is looked up at the provider first when the channel offers ``resolve_unknown`` (see
   :func:`_resolve_unknown`), else escalated (never resent); an alert whose attempts are used up is
   escalated;
3. **send** concurrently on one event loop: per channel at most ``max_concurrency`` sends in flight
   and ``rate_per_second`` started per second (per sweep process). Channels with ``send_async``
   run on the loop; the others in a thread pool. Right before a send, its attempt row is inserted
   and committed (grouped: one statement for every send starting in the same moment) and the lease
   re-checked on the database clock: a crash leaves a trace of exactly the sends that started, so
   only those are charged an attempt. No send starts after the time budget, or later than the
   channel's ``timeout_seconds + lease_margin_seconds`` before the lease expires; those alerts are
   released unsent;
4. **record** (one transaction, overlapping the next batch's claim and sends): sent → delivered
   (owner-checked), failed → ``retry_wait`` with jittered exponential backoff (at least the
   receiver's ``Retry-After``, capped at ``delivery.retry_after_cap_seconds``) or ``escalated``;
   a retry that would come after a reminder's deadline is escalated as a miss at once; each
   failure consumes exactly one attempt. Results are recorded per alert: when the batch's
   transaction fails, each alert is recorded in a transaction of its own, and an alert whose result
   cannot be stored at all is recorded as its own failure, so one receiver's odd answer never
   leaves the other alerts of its batch claimed (to be resent after the lease expires);
5. **escalate loudly**: ERROR log, the escalation channels paged (an ``incident.triggered`` page
   keyed ``deadline-pipeline/delivery/alert_delivered/alert-<id>``, :func:`escalation_incident`),
   counted in the outcome.

Lease time is the database's clock (:func:`~deadline_pipeline.store.db.db_clock`); ``now`` and
``clock`` only decide what is due (they may be replayed instants).

Batches are pipelined, at most two claimed at once: the next batch is claimed (and its sends queued
on the channels' lanes) while the current batch's sends are in flight, and each batch is recorded
as soon as its own sends have ended. A sweep killed mid-send therefore leaves at most two batches
claimed until their lease expires: their started sends have attempt rows (charged, resent as unknown
outcomes with the same key), their never-started ones have none (sent once, not charged).

The sends in flight (each channel's lane, a batch's sends, the group commit of attempt rows) are in
:mod:`deadline_pipeline.deliver.lanes`; the counts a sweep returns in
:mod:`deadline_pipeline.deliver.outcome`.

Batches repeat until nothing is claimable or ``delivery.time_budget_seconds`` is spent. A batch that
fails as a whole (database down) is logged through a :class:`ThrottledLogger` and retried after a
pause until the budget is spent; then :class:`SweepFailed` is raised.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from deadline_pipeline import zone_data
from deadline_pipeline.config import DeadlinesConfig, channel_send_window
from deadline_pipeline.deliver.channels.base import IDEMPOTENCY_BOOKING, Channel
from deadline_pipeline.deliver.channels.registry import build_channel
from deadline_pipeline.deliver.incident import Incident, severity_for
from deadline_pipeline.deliver.lanes import AlertSend, Batch, Lane, StartGate
from deadline_pipeline.deliver.notification import (
    DeliveryError,
    Notification,
    SendResult,
    incident_notification,
    notice_error,
    notification_from_row,
)
from deadline_pipeline.deliver.outcome import SweepOutcome
from deadline_pipeline.deliver.runtime import run_on_loop
from deadline_pipeline.deliver.throttle import ThrottledLogger
from deadline_pipeline.deliver.workers import merge_outcomes, run_in_processes
from deadline_pipeline.instants import instant_text
from deadline_pipeline.plan.notices import PASSED_UNWATCHED
from deadline_pipeline.store import delivery as sql

log = logging.getLogger(__name__)

# Per-alert failure warnings during a provider outage would be one line per alert per batch.
_alert_failures = ThrottledLogger(log, every=100, level=logging.WARNING)
# Whole-batch failures (database down) repeat every pause; keep the first traceback and a count.
_batch_failures = ThrottledLogger(log, every=10, level=logging.ERROR)

# A send must end before the lease does, or a second sweep may claim and send the same alert while
# the first is still waiting for its answer. Sends do not start later than their channel's timeout
# plus ``lease_margin_seconds`` before expiry; this margin applies to channels given without a
# configuration entry.
LEASE_SAFETY_SECONDS = 5.0


# A reminder whose deadline passed longer ago than this is escalated instead of sent.
DEADLINE_PASSED_GRACE = timedelta(minutes=15)

# Failed escalation notices in a row after which a channel gets no more notices in this sweep.
# Notices are sent one by one from the thread that records every batch, each for up to its
# channel's timeout: a mass escalation (a provider outage) with an escalation receiver that times
# out held the recording of every other subscriber's deliveries for alerts x timeout (500 x 10 s).
# The alerts stay escalated in the store (escalations_acknowledged, the watchdog); only the
# notices are given up, counted as failed and logged. The next sweep tries the channel again.
ESCALATION_NOTICE_BREAKER = 3


class AttemptRowsFailed(Exception):
    """Sends of a batch could not start because their attempt rows could not be written (the alerts
    were released unsent); the batch counts as failed."""


class SweepFailed(Exception):
    """The sweep's last batch failed as a whole (the message has the last error), or a worker process
    failed or was lost; alerts are untouched, released, or left claimed until their lease expires.
    ``outcome`` (a :class:`SweepOutcome`, when set) counts what was done before."""

    outcome: SweepOutcome | None = None


def lease_owner(run_id: str | None = None) -> str:
    """``hostname#pid#run``: who holds a lease, readable by a human in the alerts table.

    Without a ``run_id`` the run part is a fresh random incarnation (``cli-<8 hex>``): a restarted
    process can get the same host name and pid (pid 1 in a container) and must not look like its
    dead predecessor.
    """
    return f"{socket.gethostname()}#{os.getpid()}#{run_id or 'cli-' + uuid.uuid4().hex[:8]}"


def backoff_seconds(attempt: int, *, base: float, cap: float, rng: Callable[[], float] = random.random) -> float:
    """Delay before retry number ``attempt`` (1-based), in seconds: ``min(cap, base * 2**(attempt-1))``
    scaled by a jitter in [0.5, 1.0) so that alerts failed together do not retry together."""
    return min(cap, base * 2 ** max(0, attempt - 1)) * (0.5 + rng() / 2)


# A failed round (database down) is retried after a pause that doubles, from 1 s up to this.
FAILURE_PAUSE_CAP_SECONDS = 30.0


def _failure_pause(pause: float, remaining: float) -> tuple[float, float]:
    """``(wait, next pause)`` after a failed round: wait ``pause`` seconds, but never past the time
    budget (``remaining`` seconds, possibly negative); the next failure waits twice as long, up to
    :data:`FAILURE_PAUSE_CAP_SECONDS`."""
    return min(pause, max(0.0, remaining)), min(pause * 2, FAILURE_PAUSE_CAP_SECONDS)


def sweep(engine: Engine, cfg: DeadlinesConfig, now: datetime, *, owner: str | None = None,
          clock: Callable[[], datetime] | None = None, max_batches: int | None = None,
          channels: dict[str, Channel] | None = None) -> SweepOutcome:
    """Deliver every alert claimable at ``now`` (aware UTC), in batches of ``delivery.batch_size``,
    until nothing is claimable or ``delivery.time_budget_seconds`` of wall time is spent.

    ``clock`` gives "now" for each batch (default: always ``now``, a replayed instant; pass the real
    clock for production). ``now`` and ``clock`` decide only what is due and the times recorded;
    leases are always taken and judged on the database clock. ``owner`` is the lease owner's prefix
    (default :func:`lease_owner`); each claim appends its own suffix. ``channels`` overrides channel
    instances by name (tests, custom channels); the others are built from ``cfg.channels`` and
    closed at the end. Never raises for one alert's failure; raises :class:`SweepFailed` when every
    batch attempted failed as a whole.

    With ``delivery.processes`` > 1 (PostgreSQL) the sweep runs in that many processes
    (:mod:`deadline_pipeline.deliver.workers`), each claiming its own batches; ``max_batches`` and the
    time budget apply to each. Their outcomes are added up; a worker that gave up or ended without a
    result is logged at ERROR, listed in ``errors`` (one that ended without a result is also counted
    in ``batch_failures``), and :class:`SweepFailed` is raised with the added-up ``outcome``. Raises
    ``ValueError`` for ``channels`` or an unpicklable ``clock`` (use :func:`utcnow`) with more than one
    process.
    """
    owner = owner or lease_owner()
    # Due times are shown in local time: with the zone data installed now, as planning uses it.
    zone_data.refresh()
    processes = cfg.delivery.processes
    if processes > 1 and channels:
        raise ValueError("delivery.processes > 1 cannot use channel instances passed in `channels` (each worker "
                         "process builds its own from the configuration); set delivery.processes: 1")
    if processes > 1 and engine.dialect.name != "postgresql":
        # SQLite admits one writer at a time: more processes would only queue on its lock.
        log.warning("delivery.processes is %d, but the store is %s: sweeping in one process", processes,
                    engine.dialect.name)
        processes = 1
    cores = os.cpu_count() or 1
    if processes > cores:
        # Each worker is CPU-bound (deliver/workers.py): more of them than cores only take turns on
        # them, beside the database. Measured: 32 processes on a 2-core host took 2.5x as long as 2.
        log.warning("delivery.processes is %d, but this host has %d core(s): the extra processes only contend "
                    "for the CPU; set delivery.processes to at most %d", processes, cores, cores)
    if processes == 1:
        return _run_one(Sweep(engine, cfg, now, owner, clock or (lambda: now), max_batches, dict(channels or {})))
    results = run_in_processes(
        engine, cfg, now, owner=owner, clock=clock, max_batches=max_batches,
        run_here=lambda: _run_one(Sweep(engine, cfg, now, f"{owner}#w0", clock or (lambda: now), max_batches, {})),
        run_worker=_sweep_in_worker)
    out = SweepOutcome(processes=processes)
    # Every worker resolves the same setting the same way; a failed worker reports no loop.
    loops = sorted({v.event_loop for status, v in results if status == "ok"})
    out.event_loop = "/".join(loops) or cfg.delivery.event_loop
    merge_outcomes([v for status, v in results if status == "ok"]
                   + [v[1] for status, v in results if status == "failed" and v[1] is not None], out)
    problems = [v[0] if status == "failed" else str(v) for status, v in results if status != "ok"]
    for p in problems:
        log.error("delivery worker: %s", p)
        out.errors.append(p)
    out.batch_failures += sum(1 for status, _ in results if status == "lost")
    if problems:
        # A worker gave up on the database, or died or hung (lost), while others swept: as loud as a
        # one-process failure - the run fails, though its alerts come back after their lease.
        exc = SweepFailed("delivery worker(s) failed: " + "; ".join(problems))
        exc.outcome = out  # what the other workers did, for the caller's report
        raise exc
    return out


def _sweep_in_worker(engine: Engine, cfg: DeadlinesConfig, now: datetime, owner: str,
                     clock: Callable[[], datetime], max_batches: int | None) -> SweepOutcome:
    """The sweep of one worker process of :func:`~deadline_pipeline.deliver.workers.run_in_processes`."""
    return run_sweep_loop(Sweep(engine, cfg, now, owner, clock, max_batches, {}))


def run_sweep_loop(runner: Sweep) -> SweepOutcome:
    """Run ``runner`` to the end on a new event loop of the configured kind (``delivery.event_loop``),
    in the calling thread, which must not be running a loop, with the garbage collector tuned for
    the sweep (:mod:`deadline_pipeline.deliver.runtime`); its outcome names the loop used."""
    out, loop_name = run_on_loop(runner.run, runner.cfg.delivery.event_loop)
    out.event_loop = loop_name
    return out


def _run_one(runner: Sweep) -> SweepOutcome:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_sweep_loop(runner)
    # Called from inside an event loop (a notebook, an async caller): run on a loop of our own.
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("out", run_sweep_loop(runner)), daemon=True)
    thread.start()
    thread.join()
    if "out" not in box:
        raise SweepFailed("the sweep thread ended without a result (see the log)")
    return box["out"]


class Sweep:
    def __init__(self, engine: Engine, cfg: DeadlinesConfig, now: datetime, owner: str,
                 clock: Callable[[], datetime], max_batches: int | None, given: dict[str, Channel]) -> None:
        self.engine = engine
        self.cfg = cfg
        self.d = cfg.delivery
        self.owner = owner
        self.clock = clock
        self.max_batches = max_batches
        self.given = given
        self.built: dict[str, Channel] = {}
        self.lanes: dict[str, Lane] = {}
        self.out = SweepOutcome()
        self.deadline = time.monotonic() + self.d.time_budget_seconds
        self.claims = 0
        self.gate = StartGate(self)
        self.halted = False  # set when a send meets a BaseException: no further send starts
        self.sending: list[Batch] = []  # claimed batches whose sends run (at most two)
        self.pending_write: asyncio.Task | None = None  # the last finished batch's recording (overlaps the rest)
        # Escalation channel name -> failed notices in a row (ESCALATION_NOTICE_BREAKER).
        self.notice_failures_in_row: dict[str, int] = {}
        workers = sum(getattr(c, "max_concurrency", 8) for c in cfg.channels.values()) or 8
        self.pool = ThreadPoolExecutor(max_workers=min(64, workers), thread_name_prefix="deliver-send")
        # The attempt rows' group commits run in one thread on one connection kept for the sweep: a
        # pool checkout per group cost a pre-ping round trip and most of the gate's time (profile in
        # benchmarks/README.md). Broken, it is dropped and the next group connects afresh.
        self.gate_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="deliver-gate")
        self._gate_conn = None

    # ------------------------------------------------------------------ channels

    def channel(self, name: str) -> Channel:
        if name in self.given:
            return self.given[name]
        if name not in self.built:
            if name not in self.cfg.channels:
                raise DeliveryError(f"channel {name!r} is no longer configured", permanent=True)
            self.built[name] = build_channel(name, self.cfg.channels[name], network=self.cfg.network.policy())
        return self.built[name]

    def lane(self, name: str) -> Lane:
        lane = self.lanes.get(name)
        if lane is None:
            ch_cfg = self.cfg.channels.get(name)
            lane = self.lanes[name] = Lane(self, getattr(ch_cfg, "max_concurrency", 8),
                                            getattr(ch_cfg, "rate_per_second", None))
        return lane

    def send_window(self, name: str) -> float:
        """Seconds of lease a send on channel ``name`` needs (timeout + the channel's margin)."""
        ch_cfg = self.cfg.channels.get(name)
        return channel_send_window(ch_cfg) if ch_cfg is not None else LEASE_SAFETY_SECONDS

    def idempotency_class(self, name: str) -> str | None:
        try:
            return self.channel(name).idempotency_class
        except Exception:  # unconfigured or unbuildable: the send step reports it per alert
            return None

    # ------------------------------------------------------------------ the loop

    async def run(self) -> SweepOutcome:
        # A pipeline two batches deep instead of a barrier per batch. With one batch at a time,
        # every batch waited for its slowest send (up to the channel timeout when one receiver
        # hangs) and then for the next claim, while the channel's other send slots stood idle. Now
        # the next batch is claimed while the current one's sends are in flight, and its sends queue
        # on the same channel lane at once, so they fill the slots the stragglers leave free
        # (benchmarks/README.md: +4% on a fast loopback receiver, where the sweep is CPU-bound; the
        # gain is in the slow-straggler case). At most two claims are held at once;
        # each keeps its own lease owner, start gate and recording, so every guarantee of a single
        # batch holds for each (attempt row committed and the lease re-checked before each send,
        # owner-checked result writes, per-alert recording).
        self.sending = []
        self.pending_write = None
        try:
            last_error = await self._rounds()
            # The budget or max_batches ended the loop with batches still sending: their sends end
            # (or are released past the budget) and their results are recorded, never dropped.
            last_error = await self._drain(last_error)
        finally:
            for b in self.sending:
                # Only on an escaping error (cancellation, the process being killed): stop like a crash,
                # as a single batch did. Sends not yet started never start (no attempt row, not charged);
                # started ones have their attempt row and are recovered after the lease as unknown.
                b.cancel()
            await self._close()
        if last_error is not None:
            failed = SweepFailed(f"delivery sweep gave up after {self.out.batch_failures} failed batch(es): "
                                 f"{type(last_error).__name__}: {last_error}")
            failed.outcome = self.out  # what was done before it gave up, for the caller's report
            raise failed from last_error
        return self.out

    def _may_claim(self) -> bool:
        """Whether another round may start: time budget left and ``max_batches`` not reached."""
        return time.monotonic() < self.deadline and (self.max_batches is None or self.out.batches < self.max_batches)

    async def _rounds(self) -> BaseException | None:
        """Claim, send and record rounds while :meth:`_may_claim` allows, until nothing is claimable and
        nothing is in flight. A failed round is counted and logged, and the next one starts after a
        pause (:func:`_failure_pause`). Returns the error of the last round, ``None`` if it succeeded
        (or if the first round found nothing at all to do)."""
        last_error: BaseException | None = None
        pause = 1.0
        while self._may_claim():
            try:
                claimed, recorded = await self._round()
                if not claimed and not self.sending:
                    break  # nothing claimable and nothing in flight
                _batch_failures.success("delivery sweep")
                last_error = None
                if recorded or not self.sending:
                    # Only a recorded batch ends the backoff: a claim succeeds even while every
                    # batch's recording fails (attempt rows refused), which must keep backing off.
                    pause = 1.0
            except Exception as exc:  # database down, a bookkeeping bug: the next batch may succeed
                last_error = exc
                self.out.batch_failures += 1
                _batch_failures.failure("delivery sweep", f"delivery batch failed: {type(exc).__name__}: {exc}",
                                        exc)
                wait, pause = _failure_pause(pause, self.deadline - time.monotonic())
                await asyncio.sleep(wait)
        return last_error

    async def _round(self) -> tuple[bool, bool]:
        """One round: claim a batch and queue its sends, wait for the previous batch's recording, and
        start recording a batch whose sends have ended when two are in flight (or no new one came).
        Returns ``(claimed, recorded)``: whether this round claimed alerts, and whether it saw an
        earlier batch's recording through. Raises what failed; state stays in ``self.sending`` and
        ``self.pending_write`` for the next round."""
        sending = self.sending
        if len(sending) >= 2:
            # A round that failed after its claim left two batches sending: finish one
            # before claiming again, so that never more than two are claimed at once.
            await self._await_pending_write()
            await self._finish_first()
        t = self.clock()
        claimed_at = time.monotonic()
        # A lease owner per claim, unique even across runs that share an owner (a
        # retried Dagster run keeps its run id): if a sweep meets an alert it claimed
        # before (its lease expired while recording failed, or the same run crashed and
        # restarted), the old claim's open attempts are not its own and are closed and
        # judged like a dead sender's.
        self.claims += 1
        owner = f"{self.owner}#c{self.claims}.{uuid.uuid4().hex[:6]}"
        # In a thread, while the previous batch's sends go on on this loop.
        rows, results = await asyncio.to_thread(self._claim, t, owner)
        if rows:
            self.out.batches += 1
            self.out.claimed += len(rows)
            # Sends start now (queued behind the older batch's on the lane), before
            # anything below can fail: a claimed batch is never left without its sends.
            sending.append(self._launch(results, owner, claimed_at))
        # The earlier batch's bookkeeping overlapped this claim; its failure is this
        # round's failure too (same database).
        recorded = await self._await_pending_write()
        if len(sending) == 2 or (not rows and sending):
            # Wait for whichever batch ends first, the other keeps sending meanwhile: one
            # send hanging until its timeout must not hold back recording the other
            # batch's finished sends (sent but unrecorded alerts are resent after a crash).
            await self._finish_first()
        return bool(rows), recorded

    async def _drain(self, last_error: BaseException | None) -> BaseException | None:
        """Finish every batch still sending and see every recording through; a recording that fails is
        counted and logged, and the rest are still recorded. Returns the last such failure, else
        ``last_error``."""
        while self.sending or self.pending_write is not None:
            if self.pending_write is not None:
                try:
                    await self._await_pending_write()
                except Exception as exc:  # the sent alerts stay claimed; lease expiry recovers them
                    last_error = exc
                    self.out.batch_failures += 1
                    _batch_failures.failure("delivery sweep", f"recording a delivery batch failed: "
                                            f"{type(exc).__name__}: {exc}", exc)
            if self.sending:
                await self._finish_first()
        return last_error

    async def _await_pending_write(self) -> bool:
        """Wait for the last finished batch's recording, if one is running (its failure raises here);
        whether there was one."""
        task, self.pending_write = self.pending_write, None
        if task is None:
            return False
        await task
        return True

    async def _finish_first(self) -> None:
        """Wait for the first batch of ``self.sending`` to end its sends and start its recording
        (``self.pending_write``)."""
        self.pending_write = await self._finish(await self._first_done(self.sending))

    def _launch(self, results: list[AlertSend], owner: str, claimed_at: float) -> Batch:
        """Queue the sends of one claimed batch on their channels' lanes (escalations are only
        recorded), behind any earlier batch's."""
        batch = Batch(owner, results, asyncio.get_running_loop().create_future())
        for r in results:
            if r.escalate_reason is None:
                batch.pending += 1
                self.lane(r.row["channel"]).put(r, claimed_at, batch)
        if batch.pending == 0:
            batch.sends.set_result(None)
        return batch

    @staticmethod
    async def _first_done(sending: list[Batch]) -> Batch:
        """Wait until one batch of ``sending`` has ended all its sends; remove it and return it."""
        await asyncio.wait([b.sends for b in sending], return_when=asyncio.FIRST_COMPLETED)
        batch = next(b for b in sending if b.sends.done())
        sending.remove(batch)
        return batch

    async def _finish(self, batch: Batch) -> asyncio.Task:
        """Wait for ``batch``'s sends (``_send`` never raises for one alert) and start recording its
        results in a thread; returns the recording task."""
        await batch.sends
        return asyncio.create_task(asyncio.to_thread(self._record, batch.results, batch.owner))

    async def _close(self) -> None:
        for ch in self.built.values():
            try:
                if hasattr(ch, "aclose"):
                    await ch.aclose()
                ch.close()
            except Exception:  # closing must not hide the sweep's own result
                log.warning("closing channel %s failed", ch.name, exc_info=True)
        self.pool.shutdown(wait=False, cancel_futures=True)
        # Closed in its own thread, after any group commit still running there.
        self.gate_pool.submit(self._drop_gate_conn)
        self.gate_pool.shutdown(wait=True, cancel_futures=False)

    # ------------------------------------------------------------------ 1. claim

    def _claim(self, t: datetime, owner: str) -> tuple[list[dict], list[AlertSend]]:
        with self.engine.begin() as conn:
            rows, stale = sql.claim_and_load(conn, owner=owner, now=t, lease_seconds=self.d.lease_seconds,
                                             limit=self.d.batch_size)
            results = []
            for row in rows:
                n_stale = stale.get(row["id"], 0)  # already counted in row["attempts"]
                r = AlertSend(row=row, attempt_no=row["attempts"] + 1, owner=owner)
                if n_stale:
                    self.out.recovered_unknown += 1
                    r.escalate_reason = self._recovery_decision(row, n_stale)
                    r.resolve_first = (r.escalate_reason is None
                                       and self.idempotency_class(row["channel"]) == IDEMPOTENCY_BOOKING)
                if r.escalate_reason is None and row["attempts"] >= self.d.max_attempts:
                    r.escalate_reason = (f"attempts exhausted: {row['attempts']} attempt(s) used, "
                                         f"{n_stale} of them with no recorded outcome")
                if r.escalate_reason is None and row["kind"] == "reminder" and \
                        row["due_at"] < t - DEADLINE_PASSED_GRACE:
                    # A reminder after its deadline tells the subscriber nothing and hides the miss;
                    # the miss is escalated instead, loudly, for a human to act on.
                    r.escalate_reason = (f"missed: the deadline {instant_text(row['due_at'])} passed before this "
                                         f"reminder (due {instant_text(row['send_at'])}) could be sent")
                    if row.get("previous_due_at") is not None:
                        # A deadline a revision moved into the past (plan.notices.missed_row): the
                        # on-call must know the subscriber still expects the old date.
                        r.escalate_reason += (f"; a revision moved it there from "
                                              f"{instant_text(row['previous_due_at'])}")
                    elif PASSED_UNWATCHED in (row.get("status_reason") or ""):
                        # A deadline that passed while its source was not fetched
                        # (plan.escalations.missed_while_unwatched): the on-call must see the gap.
                        r.escalate_reason += "; " + row["status_reason"].split("; escalated as missed")[0]
                results.append(r)
        return rows, results

    def _recovery_decision(self, row: dict, n_stale: int) -> str | None:
        """After an unfinished attempt of a previous holder (a dead sender, or this sweep's own
        earlier claim whose lease expired): ``None`` = resend with the same key, else the escalation
        reason."""
        cls = self.idempotency_class(row["channel"])
        if cls == IDEMPOTENCY_BOOKING and hasattr(self.channel(row["channel"]), "resolve_unknown"):
            log.warning("alert %s: a previous sender's attempt has no recorded outcome; asking booking channel %r "
                        "whether %s was booked before deciding", row["id"], row["channel"], row["dedup_key"])
            return None
        if cls == IDEMPOTENCY_BOOKING:
            return (f"unknown outcome on booking channel {row['channel']!r}: a previous holder's lease expired "
                    f"after it started {n_stale} attempt(s) without recording the result; not resent because "
                    "a second send could repeat a permanent effect - check with the provider")
        log.warning("alert %s: a previous holder's attempt has no recorded outcome; resending on notification "
                    "channel %r with the same idempotency key %s", row["id"], row["channel"], row["dedup_key"])
        return None

    # ------------------------------------------------------------------ 3. send

    def start_attempts(self, owner: str, items: list[tuple[int, int]]) -> dict[int, int]:
        """In ``gate_pool``'s one thread: commit the attempt rows of ``items`` on the kept connection."""
        if self._gate_conn is None:
            conn = self.engine.connect()
            if conn.dialect.name == "postgresql":
                # There the rows are one INSERT ... RETURNING (lease check included), committed by
                # the server before it answers: the same guarantee without a BEGIN and a COMMIT
                # round trip per group. Elsewhere start_attempts is several statements and needs
                # the transaction below.
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            self._gate_conn = conn
        conn = self._gate_conn
        try:
            with conn.begin():
                # held_only: the ownership check right before the send, on the database clock.
                return sql.start_attempts(conn, items, owner=owner, now=self.clock(), held_only=True)
        except Exception:
            self._drop_gate_conn()
            raise

    def _drop_gate_conn(self) -> None:
        conn, self._gate_conn = self._gate_conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already broken: closing it is only tidying up
                log.debug("closing the attempt-row connection failed", exc_info=True)

    async def send(self, r: AlertSend, claimed_at: float) -> None:
        row = r.row
        try:
            # The channel's own window: a slow SMTP server's timeout must not stop maildir sends.
            send_until = min(self.deadline, claimed_at + self.d.lease_seconds - self.send_window(row["channel"]))
            ch = self.channel(row["channel"])
            if self.halted or time.monotonic() >= send_until:
                r.released = True  # going down, or its lease or the budget would run out mid-send
                return
            try:
                r.attempt_id = await self.gate.start(r)
            except Exception as exc:  # the attempt could not be recorded: no send, no attempt charged
                r.released = True
                r.start_error = exc
                _alert_failures.failure("attempt start", f"alert {row['id']}: not sent, its attempt could "
                                        f"not be recorded: {type(exc).__name__}: {exc}", exc)
                return
            if r.attempt_id is None:
                r.lease_lost_before_send = True  # another holder has it now; never send on a lost lease
                return
            if self.halted:
                return  # going down: its attempt row stays, charged as possibly started (safe side)
            if time.monotonic() >= send_until:
                # The shared commit took the rest of the window: give it back (release removes the
                # unstarted attempt row, so nothing is charged).
                r.released = True
                return
            n = notification_from_row(row, self.clock(), self.cfg)
            if r.resolve_first:
                found = await asyncio.get_running_loop().run_in_executor(self.pool, _resolve_unknown, ch, n)
                if found is not None:  # booked by the dead sender: record it, never book twice
                    self.out.unknown_found += 1
                    r.provider_id, r.sent_at = found.provider_message_id, self.clock()
                    return
                self.out.unknown_absent += 1  # proved absent: booking again is the only way not to miss it
            if hasattr(ch, "send_async"):
                res = await ch.send_async(n)
            else:
                res = await asyncio.get_running_loop().run_in_executor(self.pool, ch.send, n)
            r.provider_id = res.provider_message_id
            r.sent_at = self.clock()
        except DeliveryError as exc:
            r.error = exc
        except Exception as exc:  # a template or data bug in one alert must not stop the sweep
            _alert_failures.failure(f"unexpected {type(exc).__name__}",
                                    f"alert {row['id']}: unexpected error while sending: {exc}", exc)
            r.error = DeliveryError(f"{exc.__class__.__name__}: {exc}", permanent=False, outcome="failed")
        except BaseException:
            # The process is going down (KeyboardInterrupt, SystemExit): the sends queued behind
            # this one must not start in the moment before the batch is cancelled, or a crash
            # would charge (and, on a booking channel, escalate) alerts that were never sent.
            self.halted = True
            raise

    # ------------------------------------------------------------------ 4. record

    def _retry_plan(self, r: AlertSend, t: datetime) -> tuple[float, str | None]:
        """``(delay seconds, escalation reason or None)`` for a failed attempt.

        The receiver's ``Retry-After`` lengthens the backoff but is capped at
        ``delivery.retry_after_cap_seconds`` (an absurd value, ``300000000000`` or a date in 9999,
        would overflow the date or park the alert forever). A retry that would come after a
        reminder's deadline (plus the grace) is a miss now: escalated at once instead of waiting to
        be found missed.
        """
        err = r.error
        delay = backoff_seconds(r.attempt_no, base=self.d.backoff_base_seconds, cap=self.d.backoff_cap_seconds)
        if err.retry_after is not None:
            asked = err.retry_after
            cap = self.d.retry_after_cap
            if not math.isfinite(asked) or asked > cap:
                self.out.retry_after_capped += 1
                log.warning("alert %s: Retry-After of %s s capped at %s s (delivery.retry_after_cap_seconds)",
                            r.row["id"], asked, cap)
                asked = cap
            delay = max(delay, asked)
        if r.row["kind"] == "reminder":
            retry_at = t + timedelta(seconds=delay)
            if retry_at > r.row["due_at"] + DEADLINE_PASSED_GRACE:
                return delay, (f"missed: the next attempt could come only at {instant_text(retry_at)} "
                               f"(wait {delay:.0f} s), after the deadline {instant_text(r.row['due_at'])}: {err}")
        return delay, None

    def _write(self, conn, results: list[AlertSend], owner: str, t: datetime) -> dict:
        """Every result of ``results`` in one transaction (``conn``); returns what to report."""
        eff: dict = {"escalations": [], "failures": [], "sent": [], "done": set(), "released": 0,
                     "lost_before_send": [r for r in results if r.lease_lost_before_send]}
        sent = [r for r in results if r.sent_at is not None]
        eff["sent"] = sent
        eff["done"] = sql.record_sent(conn, [(r.row["id"], r.attempt_id, r.provider_id, r.sent_at) for r in sent],
                                      owner=owner, now=t)
        eff["released"] = sql.release(conn, [r.row["id"] for r in results if r.released], owner=owner, now=t)
        for r in results:
            if r.escalate_reason is not None:
                if sql.escalate_unsent(conn, r.row["id"], owner=owner, now=t, reason=r.escalate_reason,
                                       attempts_consumed=0):
                    eff["escalations"].append((r, r.escalate_reason))
                    self.out.errors.append(f"alert {r.row['id']}: escalated without sending: {r.escalate_reason}")
                continue
            err = r.error
            if err is None or (err.recorded and err.recorded_attempt == r.attempt_id):
                # Already counted on this very attempt (recorded by a handler nearer the send):
                # counting it again would escalate the alert early. `recorded` first: an error met
                # before any attempt row (a channel no longer configured) has no attempt id, and
                # None == None skipped it, leaving the alert claimed, re-claimed by every sweep and
                # never escalated until its deadline had passed.
                continue
            if r.attempt_id is not None:
                sql.finish_attempt(conn, r.attempt_id, now=t, outcome=err.outcome, error=str(err))
            delay, missed = self._retry_plan(r, t)
            escalate = err.permanent or r.attempt_no >= self.d.max_attempts or missed is not None
            next_at = None if escalate else t + timedelta(seconds=delay)
            ok = sql.mark_failed(conn, r.row["id"], owner=owner, now=t, error=missed or str(err),
                                 next_attempt_at=next_at, escalate=escalate)
            eff["failures"].append((r, ok, delay, escalate))
            if ok and escalate:
                why = (missed if missed else "permanent error" if err.permanent
                       else f"attempts exhausted ({r.attempt_no})")
                eff["escalations"].append((r, why if missed else f"{why}: {err}"))
        return eff

    def _write_alone(self, r: AlertSend, owner: str, t: datetime, batch_error: BaseException) -> dict | None:
        """Record one alert's result in a transaction of its own; if even that fails, record it as this
        alert's own failure (a sent alert as delivered without the unstorable provider id). Returns
        what to report, or ``None`` when nothing could be written (the database is down)."""
        try:
            with self.engine.begin() as conn:
                return self._write(conn, [r], owner, t)
        except Exception as exc:
            first = exc
        self.out.results_unstorable += 1
        why = f"the result could not be stored ({type(first).__name__}: {str(first)[:300]})"
        log.error("alert %s: %s; recording it without the offending value", r.row["id"], why)
        try:
            with self.engine.begin() as conn:
                if r.sent_at is not None:
                    # It was sent: delivered stands; only the receiver's id is dropped.
                    r.provider_id = f"unstorable provider id: {why}"[:1000]
                    return self._write(conn, [r], owner, t)
                if r.error is not None:
                    # Its own failure, without the offending details (e.g. an absurd header value).
                    r.error = DeliveryError(f"{why}; the channel reported: {str(r.error)[:500]!r}",
                                            permanent=r.error.permanent, outcome=r.error.outcome)
                    return self._write(conn, [r], owner, t)
        except Exception:  # nothing writable: the lease expires and the alert is taken up again
            log.error("alert %s: recording failed again (batch error: %s)", r.row["id"], batch_error,
                      exc_info=True)
            return None
        return None

    def _record(self, results: list[AlertSend], owner: str) -> None:
        t = self.clock()
        try:
            with self.engine.begin() as conn:
                effects = [self._write(conn, results, owner, t)]
        except Exception as exc:
            if len(results) <= 1:
                raise
            # One alert's result can make the batch's transaction fail (a value the database refuses):
            # record each alert alone so that the others are not left claimed and resent.
            log.warning("recording a batch of %d alerts failed (%s: %s); recording each alert alone",
                        len(results), type(exc).__name__, exc)
            effects = [self._write_alone(r, owner, t, exc) for r in results]
            if all(e is None for e in effects):
                raise  # nothing could be written at all: the database itself is the problem
            effects = [e for e in effects if e is not None]
        self._report(effects)
        unstarted = [r for r in results if r.start_error is not None]
        if unstarted:
            # Recorded (released, nothing charged), but the batch failed: without this a database
            # that refuses attempt rows (a missing INSERT grant, a full disk) made the sweep claim
            # and release the same alerts thousands of times a minute and end "ok", sending nothing.
            # As a failed batch it backs off, is counted, and ends the sweep in SweepFailed.
            err = unstarted[0].start_error
            raise AttemptRowsFailed(f"{len(unstarted)} of {len(results)} alert(s) not sent: their attempt rows "
                                    f"could not be written: {type(err).__name__}: {err}") from err

    def _report(self, effects: list[dict]) -> None:
        out = self.out
        escalations = []
        for eff in effects:
            # Committed: only now is each failure's attempt consumed.
            for r, _ok, _delay, _esc in eff["failures"]:
                r.error.recorded_attempt = r.attempt_id
            out.released += eff["released"]
            for r in eff["sent"]:
                if r.row["id"] in eff["done"]:
                    out.delivered += 1
                    out.lateness_seconds.append((r.sent_at - r.row["send_at"]).total_seconds())
                else:
                    out.lease_lost += 1
                    log.warning("alert %s: sent, but the lease was taken over; the new owner's state stands",
                                r.row["id"])
            for r, ok, delay, escalated in eff["failures"]:
                if not ok:
                    out.lease_lost += 1
                    continue
                out.failed += 1
                out.errors.append(f"alert {r.row['id']}: {r.error}")
                if not escalated:
                    _alert_failures.failure(f"channel {r.row['channel']} {r.error.outcome}",
                                            f"alert {r.row['id']}: attempt {r.attempt_no} failed "
                                            f"({r.error.outcome}), retry in {delay:.0f}s: {r.error}")
            escalations += eff["escalations"]
            # Not sent: the ownership check right before the send found the lease taken over.
            out.lease_lost += len(eff["lost_before_send"])
        for r, reason in escalations:
            self._escalate(r, reason)

    # ------------------------------------------------------------------ 5. escalate

    def _escalate(self, r: AlertSend, reason: str) -> None:
        row = r.row
        self.out.escalated += 1
        log.error("alert %s escalated (channel %s, subscriber %s, %r due %s): %s", row["id"], row["channel"],
                  row["subscriber"], row["title"], instant_text(row["due_at"]), reason)
        esc = self.cfg.escalation
        if not esc.channels:
            return
        notice = incident_notification(
            escalation_incident(row, reason, self.clock(), esc.dagster_ui_url), esc,
            # Its own stable key: a repeated notice for the same alert is recognisable as one.
            hashlib.sha256(f"escalation:{row['dedup_key']}".encode()).hexdigest()[:32])
        for name in esc.channels:
            in_row = self.notice_failures_in_row.get(name, 0)
            if in_row >= ESCALATION_NOTICE_BREAKER:
                self.out.escalation_notice_failures += 1
                log.error("alert %s: no escalation notice on channel %r: notices there are suspended for the "
                          "rest of this sweep after %d failures in a row", row["id"], name, in_row)
                continue
            try:
                # Sent synchronously (this runs in the bookkeeping thread): a blocking send ends
                # within its channel's timeout_seconds however the receiver answers, so each notice
                # delays the recording of later batches by at most that, and the breaker above
                # bounds how many such delays one sweep takes per channel.
                self.channel(name).send(notice)
                self.out.escalation_notices += 1
                self.notice_failures_in_row[name] = 0
            except Exception as exc:  # the alert stays escalated and logged; the notice is best effort
                self.out.escalation_notice_failures += 1
                self.notice_failures_in_row[name] = in_row + 1
                log.error("alert %s: escalation notice on channel %r failed: %s", row["id"], name, notice_error(exc))
                if in_row + 1 == ESCALATION_NOTICE_BREAKER:
                    log.error("escalation notices on channel %r suspended for the rest of this sweep after %d "
                              "failures in a row: each could hold the recording of every batch for up to the "
                              "channel's timeout. The alerts are still escalated in the store (the "
                              "escalations_acknowledged check, `deadline-pipeline watchdog`); the next sweep "
                              "tries again",
                              name, in_row + 1)


def escalation_incident(row: dict, reason: str, now: datetime, ui_url: str | None = None) -> Incident:
    """The page announcing that the claimed alert ``row`` was escalated for ``reason``: an incident
    of check ``alert_delivered`` on target ``alert-<id>`` (key
    ``deadline-pipeline/delivery/alert_delivered/alert-<id>``), severity ``error``, triggered at
    ``now`` (aware). Nothing resolves it automatically: the on-call resolves it in their tool once
    they have handled the alert (``deadline-pipeline alerts acknowledge``), and Alertmanager lets it
    end after its ``resolve_timeout`` (it is not repeated)."""
    detail = (f"alert {row['id']} (key {row['dedup_key']}) to subscriber {row['subscriber']} over channel "
              f"{row['channel']}, {row['title']!r} due {row['due_at'].isoformat()} (offset "
              f"{row['offset_seconds']} s, source {row['source']}, rule {row['rule_id']}): {reason}")
    return Incident(component="delivery", check="alert_delivered", target=f"alert-{row['id']}", status="triggered",
                    severity=severity_for("alert_delivered"), summary=f"NOT DELIVERED: {row['title']}",
                    detail=detail, started_at=now, at=now, client_url=ui_url)


def _resolve_unknown(ch: Channel, n: Notification) -> SendResult | None:
    """Ask a booking channel whether an attempt of a dead sender landed (``ch.resolve_unknown(n)``,
    see :mod:`deadline_pipeline.deliver.channels.base`): a :class:`SendResult` = it did; ``None`` = it
    provably did not. Anything else - a :class:`DeliveryError` or any other exception - means the
    lookup was impossible and is turned into a permanent ``"unknown"`` failure, so the alert is
    escalated: a transient retry would find no unfinished attempt next time and book blindly."""
    try:
        return ch.resolve_unknown(n)
    except Exception as exc:
        raise DeliveryError(f"unknown outcome on booking channel {ch.name!r} and the lookup failed, not booked "
                            f"again - check with the provider: {type(exc).__name__}: {exc}", permanent=True,
                            outcome="unknown") from exc


def utcnow() -> datetime:
    return datetime.now(UTC)
