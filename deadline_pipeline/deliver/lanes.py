"""The sweep's sends in flight: one claimed alert's send and result (:class:`AlertSend`), a claimed
batch whose sends run (:class:`Batch`), a channel's queue of sends with its concurrency and rate
(:class:`Lane`), and the group commit of the attempt rows written right before sends start
(:class:`StartGate`). The :class:`~deadline_pipeline.deliver.sweep.Sweep` they serve claims, sends
and records; these only order and start its sends."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from deadline_pipeline.deliver.notification import DeliveryError


@dataclass
class AlertSend:
    """One claimed alert in a sweep: its row as claimed (``row``), the attempt its send is charged as
    (``attempt_no``, 1-based; ``attempt_id`` once its attempt row is committed), and what became of
    it, which the record step writes: the provider's id and the send's instant (aware UTC), or the
    error, an escalation decided without sending, or released unsent."""

    row: dict
    attempt_id: int | None = None
    attempt_no: int = 0
    provider_id: str | None = None
    sent_at: datetime | None = None
    error: DeliveryError | None = None
    escalate_reason: str | None = None  # escalate without sending
    resolve_first: bool = False  # ask the booking provider whether a dead sender's attempt landed
    released: bool = False
    start_error: BaseException | None = None  # its attempt row could not be written: released unsent
    lease_lost_before_send: bool = False  # the ownership check before the send failed: not sent
    owner: str = ""  # the lease owner of the claim this alert came in (one per claim)


class Sweeper(Protocol):
    """What lanes and the start gate need of the sweep they serve
    (:class:`~deadline_pipeline.deliver.sweep.Sweep`; a protocol, so this module does not import it)."""

    #: The one thread the attempt rows' group commits run in (one connection kept for the sweep).
    gate_pool: Executor

    async def send(self, r: AlertSend, claimed_at: float) -> None:
        """Send ``r`` (its attempt row committed first, through :class:`StartGate`) and keep its result."""

    def start_attempts(self, owner: str, items: list[tuple[int, int]]) -> dict[int, int]:
        """Commit the attempt rows of ``items`` ((alert id, attempt number)) under lease ``owner``:
        alert id → attempt id of those whose lease is still held."""


class Lane:
    """One channel's sends: a FIFO queue served by at most ``concurrency`` worker coroutines, which
    start at most ``rate`` sends per second between them.

    Why workers instead of a task per alert waiting on a semaphore: a claimed batch of 500 made 500
    tasks, and each alert then waited for, and woke, a semaphore future - about 10 us of the event
    loop's CPU per alert, profiled in a sweep without HTTP (``benchmarks/README.md``). The order is
    the same (first claimed, first sent, the next batch queued behind the current one), and so is the
    bound on sends in flight: each worker runs one send at a time.
    """

    def __init__(self, sweep: Sweeper, concurrency: int, rate: float | None) -> None:
        self.sweep = sweep
        self.concurrency = concurrency
        self.queue: deque[tuple[AlertSend, float, Batch]] = deque()
        self.workers: set[asyncio.Task] = set()  # strong references: the loop keeps only weak ones
        self.active = 0  # workers that have not decided to leave
        self._interval = 1.0 / rate if rate else 0.0
        self._next = 0.0

    def put(self, r: AlertSend, claimed_at: float, batch: Batch) -> None:
        self.queue.append((r, claimed_at, batch))
        if self.active < self.concurrency:
            self.active += 1
            task = asyncio.get_running_loop().create_task(self._work())
            self.workers.add(task)
            task.add_done_callback(self.workers.discard)

    async def _work(self) -> None:
        try:
            await self._serve()
        finally:
            # Counted down in the step that found the queue empty, not by a done callback: that runs
            # a step later, and a put() in between saw this worker still counted, started none, and
            # left its alert queued with no worker - the batch never ended and the sweep hung.
            self.active -= 1

    async def _serve(self) -> None:
        queue = self.queue
        # Looked up once per worker, not per send: asyncio.current_task is Python code on 3.11 (a
        # running-loop lookup and a dict read), about 2% of a sweep process's CPU in py-spy when
        # called for every alert.
        task = asyncio.current_task()
        while queue:
            r, claimed_at, batch = queue.popleft()
            if batch.sends.done():
                continue  # its batch was cancelled (the sweep is going down): never started, not charged
            try:
                # Counted as running from here: a worker waiting out the rate spacing is cancelled
                # with its batch too, or it would wake and start a send while the sweep goes down.
                batch.running.add(task)
                try:
                    if self._interval:
                        now = time.monotonic()
                        slot = max(now, self._next)
                        self._next = slot + self._interval
                        if slot > now:
                            await asyncio.sleep(slot - now)
                    await self.sweep.send(r, claimed_at)
                finally:
                    batch.running.discard(task)
            except BaseException as exc:
                # _send raises only what stops the process (KeyboardInterrupt, SystemExit) or this
                # worker's cancellation: the batch ends with it, as its gather did, never hangs.
                if batch.sends.done():
                    pass
                elif isinstance(exc, asyncio.CancelledError):
                    batch.sends.cancel()
                else:
                    batch.sends.set_exception(exc)
                raise
            batch.pending -= 1
            if batch.pending == 0 and not batch.sends.done():
                batch.sends.set_result(None)


@dataclass
class Batch:
    """One claim whose sends are running: its lease owner, its results, the future that ends when
    all its sends have ended (cancelled: the sends not yet started never start), how many are left,
    and the lane workers running one of its sends right now (cancelled with it)."""

    owner: str
    results: list[AlertSend]
    sends: asyncio.Future
    pending: int = 0
    running: set = field(default_factory=set)

    def cancel(self) -> None:
        """Stop like a crash: sends not yet started never start (no attempt row, not charged); the
        running ones are cancelled mid-send (their attempt rows stay: unknown outcomes)."""
        self.sends.cancel()
        for task in list(self.running):
            task.cancel()


class StartGate:
    """Commits the attempt rows of sends about to start, grouped: every send that reaches its start in
    the same moment waits for one shared transaction (group commit), then starts only if its row was
    written and its lease is still held on the database clock.

    Why a row per *started* send (not per claimed alert): after a crash, the open rows are exactly the
    sends that may have happened, so only they are charged an attempt (a killed batch's never-started
    alerts are not), and a booking alert is escalated only when its send may really have left.
    """

    def __init__(self, sweep: Sweeper) -> None:
        self.sweep = sweep
        self.waiting: list[tuple[AlertSend, asyncio.Future]] = []
        self.flushing = False

    async def start(self, r: AlertSend) -> int | None:
        """The committed attempt id for ``r``, or ``None`` when its lease is no longer held."""
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append((r, fut))
        if not self.flushing:
            self.flushing = True
            asyncio.get_running_loop().create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        try:
            while self.waiting:
                await asyncio.sleep(0)  # let the sends admitted in the same tick join this commit
                group, self.waiting = self.waiting, []
                by_owner: dict[str, list[tuple[AlertSend, asyncio.Future]]] = {}
                for r, fut in group:
                    by_owner.setdefault(r.owner, []).append((r, fut))
                for owner, items in by_owner.items():
                    try:
                        started = await asyncio.get_running_loop().run_in_executor(
                            self.sweep.gate_pool, self.sweep.start_attempts, owner,
                            [(r.row["id"], r.attempt_no) for r, _ in items])
                    except Exception as exc:  # database down: these sends do not start (not charged)
                        for _, fut in items:
                            if not fut.done():
                                fut.set_exception(exc)
                        continue
                    for r, fut in items:
                        if not fut.done():
                            fut.set_result(started.get(r.row["id"]))
        finally:
            self.flushing = False
