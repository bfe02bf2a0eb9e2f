"""CPU cost of a benchmark's contender, read from Linux's ``/proc``: pure pieces and two meters.

What a contender costs is the CPU of its own processes plus that of the PostgreSQL backends serving
its database, per delivered alert:

* **its processes** (:func:`tree_seconds`): this process and every process below it (the forkserver
  of ``delivery.processes`` and the sweep workers it forks), excluding given subtrees (the webhook
  receiver). Each live process counts ``utime + stime`` (its threads included) plus ``cutime +
  cstime``: the CPU of its children that have ended and that it has waited for. So a worker that has
  ended between two readings is still counted, in its parent's ``cutime``, as long as the parent is
  in the tree (the forkserver reaps its workers; this process reaps its own children). A process
  whose parent never waits for it, or which is re-parented to init, is lost; none of the contenders
  here leaves one.
* **PostgreSQL's backends** (:class:`BackendCpu`): the pids of ``pg_stat_activity WHERE datname =
  <the database>``, sampled every ``interval`` seconds in a thread, each read from
  ``/proc/<pid>/stat``; a backend counts from its value at the first reading (0 when it was first
  seen after the start: a forked process starts at 0). A backend that exits loses what it used
  after its last sample (at most ``interval`` of its CPU); the postmaster reaps backends, and its
  ``cutime`` mixes every database's, so it cannot be used. The sampler's own CPU (its thread in
  this process) is reported so that the caller can take it out.

Times are in clock ticks (``os.sysconf("SC_CLK_TCK")``, 100 per second on Linux): a figure under a
few ticks per process is noise, so runs should last at least a second.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Stat:
    """The fields of ``/proc/<pid>/stat`` this module uses; times in clock ticks."""

    pid: int
    comm: str
    state: str
    ppid: int
    utime: int
    stime: int
    cutime: int
    cstime: int

    @property
    def own(self) -> int:
        """This process's CPU ticks (all its threads)."""
        return self.utime + self.stime

    @property
    def with_children(self) -> int:
        """Its own ticks plus those of the children it has waited for."""
        return self.utime + self.stime + self.cutime + self.cstime


def parse_stat(line: str) -> Stat:
    """One ``/proc/<pid>/stat`` line. ``comm`` (field 2) is in parentheses and may itself contain
    spaces and parentheses, so it ends at the *last* ``)``; the fields after it are counted from
    there (state is field 3, ppid 4, utime 14, stime 15, cutime 16, cstime 17; see proc(5))."""
    head, sep, tail = line.rpartition(")")
    pid, paren, comm = head.partition(" (")
    if not sep or not paren:
        raise ValueError(f"not a /proc/<pid>/stat line: {line[:80]!r}")
    f = tail.split()
    return Stat(pid=int(pid), comm=comm, state=f[0], ppid=int(f[1]), utime=int(f[11]), stime=int(f[12]),
                cutime=int(f[13]), cstime=int(f[14]))


def clock_ticks() -> int:
    """Clock ticks per second of the times in ``/proc/<pid>/stat``."""
    return os.sysconf("SC_CLK_TCK")


def read_stat(pid: int | str) -> Stat | None:
    """``/proc/<pid>/stat`` parsed, or ``None`` when that process is gone."""
    try:
        return parse_stat((PROC / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def all_stats() -> dict[int, Stat]:
    """Every process's stat, by pid (processes that end while being read are left out)."""
    out = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            st = read_stat(entry.name)
            if st is not None:
                out[st.pid] = st
    return out


def subtree(stats: dict[int, Stat], root: int, exclude: Iterable[int] = ()) -> set[int]:
    """``root`` and its descendants in ``stats``, without the subtrees of the pids in ``exclude``."""
    children: dict[int, list[int]] = {}
    for st in stats.values():
        children.setdefault(st.ppid, []).append(st.pid)
    skip = set(exclude)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in skip or pid in found or pid not in stats:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return found


def tree_seconds(root: int | None = None, exclude: Iterable[int] = ()) -> float:
    """CPU seconds so far of ``root`` (default: this process) and its descendants, ended children
    their parents have waited for included, without the ``exclude`` subtrees."""
    stats = all_stats()
    pids = subtree(stats, os.getpid() if root is None else root, exclude)
    return sum(stats[p].with_children for p in pids) / clock_ticks()


def process_seconds(pid: int) -> float:
    """CPU seconds so far of one process (its threads; not its children); ``nan`` when it is gone."""
    st = read_stat(pid)
    return st.own / clock_ticks() if st is not None else float("nan")


def sum_deltas(first: dict[int, int], last: dict[int, int]) -> int:
    """Sum over every pid of ``last`` of ``last[pid] - first.get(pid, 0)``: the growth of a set of
    processes, those seen only later counting from 0 (pids in ``first`` alone have no later reading
    and add nothing)."""
    return sum(v - first.get(pid, 0) for pid, v in last.items())


def machine_busy() -> tuple[int, int]:
    """``(busy, total)`` ticks of all cores since boot, from the first line of ``/proc/stat``
    (idle and iowait are not busy)."""
    fields = [int(x) for x in (PROC / "stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # guest time is already inside user time
    return total - fields[3] - fields[4], total


class BackendCpu:
    """CPU ticks of the PostgreSQL backends serving one database, sampled in a thread.

    ``list_backends()`` returns the current ``[(pid, active, waiting_on_a_lock)]`` of the database
    (from ``pg_stat_activity``; it runs in the sampling thread, on a connection of its own). Call
    :meth:`stop` once; then :attr:`seconds` is the backends' CPU, :attr:`own_cpu` the sampling
    thread's (to take out of this process's), :attr:`ended` how many backends ended during the
    window, :attr:`lock_share` the share of samples of an active
    backend that waited on a lock (``wait_event_type`` Lock or LWLock)."""

    def __init__(self, list_backends: Callable[[], list[tuple[int, bool, bool]]], interval: float = 0.025) -> None:
        self.list_backends = list_backends
        self.interval = interval
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.samples = self.waiting = 0
        self.current: set[int] = set()  # the pids of the latest sample
        self.own_cpu = 0.0
        self._stop = threading.Event()
        t0 = time.thread_time()
        self._sample(first=True)
        self.own_cpu = time.thread_time() - t0
        self._thread = threading.Thread(target=self._run, name="backend-cpu", daemon=True)
        self._thread.start()

    def _sample(self, first: bool = False) -> None:
        self.current = set()
        for pid, active, waiting in self.list_backends():
            st = read_stat(pid)
            if st is None:
                continue
            self.current.add(pid)
            if first:
                self.first[pid] = st.own
            self.last[pid] = st.own
            self.samples += bool(active)
            self.waiting += bool(active and waiting)

    def _run(self) -> None:
        t0 = time.thread_time()
        while not self._stop.wait(self.interval):
            self._sample()
        self._sample()
        self.own_cpu += time.thread_time() - t0

    def stop(self) -> BackendCpu:
        self._stop.set()
        self._thread.join()
        return self

    @property
    def seconds(self) -> float:
        return sum_deltas(self.first, self.last) / clock_ticks()

    @property
    def ended(self) -> int:
        """Backends seen during the window but gone at its end: each may have lost up to one
        ``interval`` of its CPU (what it used after its last sample)."""
        return len(set(self.last) - self.current)

    @property
    def lock_share(self) -> float:
        return self.waiting / self.samples if self.samples else float("nan")
