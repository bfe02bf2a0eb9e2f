"""One sweep spread over several processes (``delivery.processes``), to use every core.

Why processes, not threads or a bigger event loop: a sweep is CPU-bound in one interpreter - the
HTTP client, rendering and signing, and the database driver share one core through the GIL
(``benchmarks/README.md``: the event loop is busy more than 90% of the time). Each worker process
runs the whole sweep of :mod:`deadline_pipeline.deliver.sweep` on its own event loop and its own
database connections, and claims its own batches under a lease owner of its own
(``<owner>#w<i>.<pid>``); ``FOR UPDATE SKIP LOCKED`` gives the workers disjoint batches. So every
guarantee of one sweep holds in each worker unchanged (attempt row committed and the lease re-checked
before each send, owner-checked writes, per-alert recording), and a worker that dies is exactly a
crashed sweeper: its claimed alerts are taken up again after their lease expires.

This module does not import the sweep: the caller passes the function each worker runs (a
module-level function, sent to the worker by reference), so the sweep can import this module at the
top and the two do not form a cycle.

The calling process is worker 0 and starts sending at once; workers 1..n-1 are started from a
``forkserver`` (a clean single-threaded process, so no lock held by a thread of the caller - a Dagster
run worker has several - is inherited locked) that has this package imported already. Each worker
gets the caller's environment as it is at the call (secrets named by ``secret_env`` and ``${VAR}``
references are read at send time), and its log records are passed to the caller's loggers, so they
reach Dagster's log capture like the caller's own.

PostgreSQL only: SQLite admits one writer at a time, so extra workers would only wait on each
other's locks; there the sweep runs in one process and says so in the log and in
``SweepOutcome.processes``.
"""

from __future__ import annotations

import gc
import logging
import logging.handlers
import multiprocessing
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import datetime

from sqlalchemy import Engine

from deadline_pipeline import zone_data
from deadline_pipeline.config import DeadlinesConfig

log = logging.getLogger(__name__)

# Seconds a worker may take beyond the time budget before it is judged hung: the budget only stops
# new sends, so the last sends may run up to their channel's timeout, then the results are recorded.
_JOIN_SLACK_SECONDS = 60.0


# What a worker process runs: (engine, cfg, now, lease owner, clock, max_batches) -> outcome. A
# module-level function, so that it can be sent to the worker process by reference.
WorkerFunction = Callable[[Engine, DeadlinesConfig, datetime, str, Callable[[], datetime], int | None], object]


@dataclass
class _WorkerSpec:
    """Everything a worker process needs, picklable (no engine, no channel instances)."""

    run: WorkerFunction
    url: str
    cfg: DeadlinesConfig
    now: datetime
    owner: str
    clock: Callable[[], datetime] | None
    max_batches: int | None
    env: dict[str, str]
    log_level: int
    # The zone database the caller computes with and records in its heartbeat (zone_data.in_force()).
    zone_data: zone_data.ZoneData


def forkserver_preload(run_worker: WorkerFunction, engine: Engine) -> list[str]:
    """The modules the forkserver imports once, before it forks any worker: the module of
    ``run_worker`` (the sweep) and ``engine``'s SQLAlchemy dialect and database driver.

    The driver is imported by SQLAlchemy only when an engine is first made: left to the worker, each
    worker of each sweep imported psycopg again (about 70 ms of CPU, half of a worker's start; a
    2-process sweep with nothing to send cost 0.20-0.22 s of CPU against 0.05-0.06 s for one
    process, ``benchmarks/README.md``)."""
    modules = [run_worker.__module__, type(engine.dialect).__module__]
    dbapi = getattr(engine.dialect, "loaded_dbapi", None)
    if dbapi is not None:
        modules.append(dbapi.__name__)
    return modules


def check_picklable_clock(clock: Callable[[], datetime] | None) -> None:
    """Raise ``ValueError`` when ``clock`` cannot be sent to a worker process (a lambda, a bound
    method of an unpicklable object); ``None`` (the fixed ``now``) and module-level functions such
    as :func:`deadline_pipeline.deliver.sweep.utcnow` can."""
    if clock is None:
        return
    try:
        pickle.dumps(clock)
    except Exception as exc:
        raise ValueError(f"delivery.processes > 1 needs a clock that can be sent to a worker process (a "
                         f"module-level function such as deliver.sweep.utcnow), not {clock!r}: {exc}") from None


def run_in_processes(engine: Engine, cfg: DeadlinesConfig, now: datetime, *, owner: str,
                     clock: Callable[[], datetime] | None, max_batches: int | None,
                     run_here: Callable[[], object], run_worker: WorkerFunction) -> list[tuple[str, object]]:
    """Run ``cfg.delivery.processes - 1`` worker processes beside ``run_here()`` (worker 0, in this
    process) and wait for all of them. Each worker process calls ``run_worker(engine, cfg, now,
    owner, clock, max_batches)`` with an engine of its own and a lease owner of its own.

    Returns one ``(status, value)`` per worker, worker 0 first: ``("ok", SweepOutcome)``,
    ``("failed", (message, SweepOutcome or None))`` for a sweep that raised ``SweepFailed`` (with what
    it did before) or anything else, or
    ``("lost", message)`` for a worker that died or hung without a result (it was killed; its claimed
    alerts are taken up again after their lease expires). Never raises for a worker's failure;
    raises ``ValueError`` for a clock that cannot be sent to a worker. An interrupt here
    (``KeyboardInterrupt``: Ctrl-C, or SIGTERM where Dagster maps it) stops every worker process
    before it is raised on (:func:`_stop_workers`).
    """
    check_picklable_clock(clock)
    n = cfg.delivery.processes
    spec = _WorkerSpec(run=run_worker, url=engine.url.render_as_string(hide_password=False), cfg=cfg, now=now,
                       owner=owner, clock=clock, max_batches=max_batches, env=dict(os.environ),
                       # The level our own loggers run at here (a caller may set it on the package only).
                       log_level=logging.getLogger("deadline_pipeline").getEffectiveLevel(),
                       zone_data=zone_data.in_force())
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        # Workers fork from a server that has the sweep imported (the module of the function each
        # worker runs): a fork costs milliseconds, an import of the sweep's dependencies about a
        # second of CPU that the sending workers would lose.
        ctx.set_forkserver_preload(forkserver_preload(run_worker, engine))
    else:  # Windows: each worker starts a fresh interpreter (slower to start, same sweep)
        ctx = multiprocessing.get_context("spawn")
    workers: list[_Worker] = []
    start_errors: list[str] = []
    stopping = _Stopping()

    def start_workers() -> None:
        # In a thread: the first start waits for the forkserver to import the sweep, while worker 0
        # is already sending.
        if hasattr(signal, "pthread_sigmask"):
            # Started from this thread, the forkserver and the workers inherit SIGINT blocked: a Ctrl-C
            # reaches the whole process group, and met the forkserver still importing the sweep (a
            # traceback under `run`'s one line) or a worker mid-send. The workers are this
            # process's to stop (_stop_workers); the signal is handled in the main thread only.
            # The resource tracker first: starting it unblocks SIGINT in the starting thread.
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        for i in range(1, n):
            if stopping.event.is_set():
                return
            # A pipe of its own per worker, for its log records and then its result: a worker killed
            # mid-write (the OOM killer) can break only its own stream, never hold a lock that the
            # other workers or this process would wait on for ever, as a shared queue's would.
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker_main, args=(spec, i, send), name=f"deliver-worker-{i}", daemon=True)
            try:
                p.start()
            except Exception as exc:  # no process for this worker: the others still sweep everything
                start_errors.append(f"worker {i} could not start: {type(exc).__name__}: {exc}")
                recv.close()
                continue
            finally:
                send.close()
            w = _Worker(p, recv)
            w.reader.start()
            stopping.add(w, workers)

    starter = threading.Thread(target=start_workers, name="deliver-worker-start", daemon=True)
    starter.start()
    results: list[tuple[str, object]] = []
    try:
        results.append(("ok", run_here()))
    except Exception as exc:
        results.append(("failed", (f"worker 0: {type(exc).__name__}: {exc}", getattr(exc, "outcome", None))))
    except BaseException:
        # An interrupt: left to the interpreter's exit (which terminates daemon processes), the
        # workers went on sending in a process that outlived the sweep, or for ever after an exit by
        # os._exit (`run` ends so while a send blocks a thread), which skips that step.
        _stop_workers(stopping, workers)
        raise
    starter.join()
    give_up = time.monotonic() + cfg.delivery.time_budget_seconds + _JOIN_SLACK_SECONDS
    results += [w.collect(give_up) for w in workers]
    results += [("lost", e) for e in start_errors]
    return results


class _Stopping:
    """Whether the workers are being stopped, and the lock that makes a worker started meanwhile
    either seen by :func:`_stop_workers` or stopped by its starter."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.lock = threading.Lock()

    def add(self, w: _Worker, workers: list[_Worker]) -> None:
        """Append the started worker ``w`` to ``workers``, or terminate it when the workers are being stopped."""
        with self.lock:
            workers.append(w)
            if self.event.is_set():
                w.process.terminate()


def _stop_workers(stopping: _Stopping, workers: list[_Worker], grace: float = 1.0) -> None:
    """Terminate (SIGTERM) every worker process started, and kill those still running ``grace``
    seconds later: each ends like a crashed sweeper, the sends it cut off keep their attempt rows and
    its claimed alerts are taken up again when their lease expires. A worker started after this
    call is terminated by its starter (:meth:`_Stopping.add`)."""
    with stopping.lock:
        stopping.event.set()
        started = list(workers)
    for w in started:
        w.process.terminate()
    give_up = time.monotonic() + grace
    for w in started:
        w.process.join(max(0.0, give_up - time.monotonic()))
        if w.process.is_alive():
            w.process.kill()
            w.process.join(1)
    log.info("sweep interrupted: %d worker process(es) stopped; their claimed alerts are taken up again "
             "when their lease expires", len(started))


class _Worker:
    """A started worker process and the thread that reads its pipe: log records are handed to this
    process's loggers (the logging cookbook's listener: ``logger.handle(record)``) as they come, the
    result is kept."""

    def __init__(self, process, recv) -> None:
        self.process = process
        self.recv = recv
        self.result: tuple[str, object] | None = None
        self.reader = threading.Thread(target=self._read, name=f"{process.name}-pipe", daemon=True)

    def _read(self) -> None:
        try:
            while True:
                kind, *rest = self.recv.recv()
                if kind == "started":
                    continue
                if kind == "log":
                    logging.getLogger(rest[0].name).handle(rest[0])
                else:
                    self.result = (rest[0], rest[1])
        except (EOFError, OSError):  # the worker ended (or died): nothing more will come
            pass
        except Exception:  # a broken message: this worker's stream is unusable, the others are not
            log.error("reading %s's pipe failed", self.process.name, exc_info=True)
        finally:
            self.recv.close()

    def collect(self, give_up: float) -> tuple[str, object]:
        self.reader.join(max(0.0, give_up - time.monotonic()))
        hung = self.reader.is_alive()
        if hung:
            self.process.kill()  # hung past its budget: stop it like a crashed sweeper (leases recover)
            self.reader.join(10)
        self.process.join(10)
        if self.result is not None:
            return self.result
        how = (f"was still running {_JOIN_SLACK_SECONDS:.0f} s after the time budget and was killed" if hung
               else f"ended without a result (exit code {self.process.exitcode})")
        return "lost", (f"{self.process.name} (pid {self.process.pid}) {how}; the alerts it had claimed are "
                        "taken up again when their lease expires")


class _PipeQueue:
    """The ``put_nowait`` a :class:`logging.handlers.QueueHandler` needs, sending on the worker's pipe
    (one lock: the sweep's threads log too)."""

    def __init__(self, send) -> None:
        self.send = send
        self.lock = threading.Lock()

    def put_nowait(self, record) -> None:
        self.put("log", record)

    def put(self, *message) -> None:
        with self.lock:
            self.send.send(message)


def _worker_main(spec: _WorkerSpec, index: int, send) -> None:
    from deadline_pipeline.store.db import make_engine

    # Everything this process holds yet came from the forkserver: imported modules, never garbage.
    # Frozen here, the full collection that starts a sweep (deliver.runtime.sweep_gc) no longer walks
    # them - 35 ms of a worker's start, which also wrote to (and so copied) every page it visited.
    gc.freeze()

    # The caller's environment at the call, not the forkserver's from when it started: a secret
    # rotated (or set by a test) since then must be the one used.
    os.environ.clear()
    os.environ.update(spec.env)
    pipe = _PipeQueue(send)
    try:
        # Whether the caller still waits for this worker: interrupted while starting it (the forkserver
        # still importing the sweep), it ended, and the worker went on sweeping with no one to stop
        # it. Its end of the pipe closed, the write fails.
        pipe.put("started")
    except OSError:
        return
    root = logging.getLogger()
    root.handlers[:] = [logging.handlers.QueueHandler(pipe)]
    root.setLevel(spec.log_level)
    _use_callers_zone_data(spec.zone_data, index)
    engine = make_engine(spec.url)
    now = spec.now
    try:
        outcome = spec.run(engine, spec.cfg, now, f"{spec.owner}#w{index}.{os.getpid()}",
                           spec.clock or (lambda: now), spec.max_batches)
        pipe.put("result", "ok", outcome)
    except Exception as exc:
        pipe.put("result", "failed", (f"worker {index}: {type(exc).__name__}: {exc}", getattr(exc, "outcome", None)))
    finally:
        engine.dispose()


def _use_callers_zone_data(callers: zone_data.ZoneData, index: int) -> None:
    """Compute with the caller's zone database ``callers`` in this worker, activating it (logged) when
    the worker's own differs.

    A worker forked from the forkserver has the database the forkserver chose from *its* environment
    when it started (``DEADLINE_ZONE_DATA``, ``PYTHONTZPATH``, the installed ``tzdata``), not the
    caller's: with a forkserver started before ``DEADLINE_ZONE_DATA=system`` was set, the caller
    planned and recorded 2025b while worker 1 rendered America/Vancouver's due times with 2026f, an hour
    off in every message it sent ("due_local" 02:00-07:00 for a 01:00-08:00 deadline), every check green."""
    own = zone_data.in_force()
    if (own.source, own.version, own.folder) == (callers.source, callers.version, callers.folder):
        return
    zone_data.activate(callers)
    log.info("deliver-worker-%d: computing with the caller's zone data %s, not %s (chosen when the forkserver "
             "started)", index, callers.describe(), own.describe())


def merge_outcomes(outcomes: list, into) -> None:
    """Add each field of every outcome in ``outcomes`` to ``into`` (counts summed, lists joined)."""
    for out in outcomes:
        for f in fields(into):
            if f.name in ("processes", "event_loop"):
                continue
            value = getattr(out, f.name)
            if isinstance(value, list):
                getattr(into, f.name).extend(value)
            else:
                setattr(into, f.name, getattr(into, f.name) + value)
