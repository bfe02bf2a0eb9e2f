"""How a sweep process runs its event loop: the loop's kind (``delivery.event_loop``) and the
garbage collector's settings while it runs.

Both exist for CPU per alert, measured with ``benchmarks/deliver.py --phases`` and a
``gc.callbacks`` timer on a one-process sweep of 20,000 alerts (``benchmarks/README.md``):

* on uvloop the event-loop and aiohttp work per alert (the ``send`` phase) is about 140
  microseconds against about 250 on the standard library's loop;
* the cyclic garbage collector cost about 50 microseconds per alert at Python's default thresholds:
  about 1,400 young-generation collections and a dozen full ones, each full collection rescanning
  every object of the process's imports (SQLAlchemy, Dagster, pydantic models: about 90,000
  objects, some 60 ms a time). With those objects frozen (:func:`gc.freeze`) and the young
  generation's threshold at 10,000 it costs about 5, and the process as a whole about a sixth less.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# Young-generation threshold while a sweep runs (Python's default: 700). A sweep allocates a few
# dozen container objects per alert that die within the same send; at 700 they cross the threshold
# about 70 times a second per 1,000 alerts/s and promote survivors into older generations, which
# are then rescanned as well. 10,000 pending objects are a few MiB at most.
SWEEP_GC_THRESHOLD0 = 10_000

_gc_lock = threading.Lock()
_gc_users = 0
_gc_saved: tuple[int, int, int] | None = None


@contextmanager
def sweep_gc() -> Iterator[None]:
    """Tune the cyclic garbage collector for the duration of a sweep, then put it back.

    On entry: one full collection, then :func:`gc.freeze` (objects alive before the sweep - the
    imported modules, the configuration - are no longer rescanned by every full collection) and the
    young generation's threshold raised to :data:`SWEEP_GC_THRESHOLD0`. On exit: :func:`gc.unfreeze`
    (those objects are collectable again) and the thresholds as they were. Nested or concurrent
    sweeps in one process share the tuning: the first to enter applies it, the last to leave undoes
    it. Collection is never disabled, so reference cycles made during the sweep are still freed.
    """
    global _gc_users, _gc_saved
    with _gc_lock:
        _gc_users += 1
        if _gc_users == 1:
            _gc_saved = gc.get_threshold()
            gc.collect()
            gc.freeze()
            gc.set_threshold(max(SWEEP_GC_THRESHOLD0, _gc_saved[0]), *_gc_saved[1:])
    try:
        yield
    finally:
        with _gc_lock:
            _gc_users -= 1
            if _gc_users == 0 and _gc_saved is not None:
                gc.unfreeze()
                gc.set_threshold(*_gc_saved)
                _gc_saved = None


def event_loop_factory(preferred: str) -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    """``(loop factory for asyncio.Runner, its name)`` for ``delivery.event_loop`` = ``preferred``
    (``"uvloop"`` or ``"asyncio"``); the factory is ``None`` for the standard library's loop.

    A configured uvloop that cannot be imported (a platform it does not support) falls back to
    asyncio's loop with a warning; the sweep's ``event_loop`` (the run's metadata) then says
    ``asyncio``. Never raises.
    """
    if preferred == "uvloop":
        try:
            import uvloop
        except ImportError as exc:
            log.warning("delivery.event_loop is uvloop, but it cannot be imported (%s): sweeping on asyncio's "
                        "event loop, which costs more CPU per alert", exc)
        else:
            return uvloop.new_event_loop, "uvloop"
    return None, "asyncio"


def run_on_loop(main: Callable[[], Coroutine[Any, Any, T]], preferred: str) -> tuple[T, str]:
    """``(result of main(), the loop's name)``: ``main()`` run to the end on a new event loop of
    kind ``preferred`` (see :func:`event_loop_factory`) in the calling thread, which must not be
    running a loop, with the garbage collector tuned by :func:`sweep_gc`. Raises what ``main``
    raises."""
    factory, name = event_loop_factory(preferred)
    with sweep_gc(), _interruptible(), asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main()), name


@contextmanager
def _interruptible() -> Iterator[None]:
    """Within: Ctrl-C (SIGINT), and SIGTERM where Dagster maps it to the same handler, cancels the
    loop's main task and then raises ``KeyboardInterrupt``, as :class:`asyncio.Runner` does under
    Python's own handler; the previous handlers are put back after.

    Inside a Dagster step the SIGINT handler is Dagster's, which raises its own interrupt error from
    wherever the main thread is: during a sweep, from the event loop's signal callback, where both
    uvloop and asyncio log an exception that is not ``KeyboardInterrupt`` ("Exception in callback")
    and carry on, so ``deadline-pipeline run`` printed tracebacks and went on sending after Ctrl-C.
    Under Python's handler the runner installs its own, which cancels the sweep: the sends not yet
    started never start, the running ones end like a crash (their attempt rows stay, and they are
    sent again once their lease expires: a duplicate is possible, a loss is not). Only the main
    thread has signal handlers; elsewhere nothing changes."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:  # a process told to ignore Ctrl-C (nohup, a background job) still does
        yield
        return
    # Dagster maps SIGTERM to its SIGINT handler (dagster._utils.interrupts: how Kubernetes and a
    # run's termination stop a process): left so, a SIGTERM met the same callback and was swallowed.
    previous_term = signal.getsignal(signal.SIGTERM)
    mapped = previous_term is previous
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if mapped:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
        if mapped:
            signal.signal(signal.SIGTERM, previous_term)
