"""The CPU accounting of the delivery benchmark (benchmarks/cpu_cost.py), on this process's real
``/proc`` entries: the parsing of ``/proc/<pid>/stat``, a process's and a process tree's CPU
growing with work done, ended children counted through their parent, and the sum of deltas."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import cpu_cost  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux /proc only")


def burn(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU."""
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        x += 1


def test_a_stat_line_whose_command_has_spaces_and_parentheses():
    # comm may hold ") " itself: the fields after it start at the last ")".
    line = ("4242 (my (odd) ) prog) S 17 4242 4242 0 -1 4194560 100 0 0 0 "
            "250 75 30 12 20 0 3 0 1000 1000000 200 18446744073709551615")
    st = cpu_cost.parse_stat(line)
    assert (st.pid, st.comm, st.state, st.ppid) == (4242, "my (odd) ) prog", "S", 17)
    assert (st.utime, st.stime, st.cutime, st.cstime) == (250, 75, 30, 12)
    assert st.own == 325 and st.with_children == 367


def test_a_line_that_is_not_a_stat_line_is_refused():
    with pytest.raises(ValueError):
        cpu_cost.parse_stat("no parentheses here")


def test_this_process_reads_as_itself():
    st = cpu_cost.read_stat(os.getpid())
    assert st is not None
    assert st.pid == os.getpid() and st.ppid == os.getppid()
    assert st.state in "RS"  # it is running this test
    assert cpu_cost.clock_ticks() >= 1


def test_burning_cpu_grows_this_process_by_about_that_much():
    before = cpu_cost.process_seconds(os.getpid())
    burn(0.2)
    grown = cpu_cost.process_seconds(os.getpid()) - before
    # Clock ticks are 10 ms: 0.2 s reads as 0.17-0.23 s, plus whatever else the process did.
    assert 0.17 <= grown <= 0.6, grown


def test_the_tree_counts_a_child_that_has_ended_and_excludes_a_given_subtree():
    # Children other tests left running (a receiver, a forkserver) may end or be re-parented while
    # this test reads the tree; their CPU leaving it failed the test under load. Leave them out.
    others = cpu_cost.subtree(cpu_cost.all_stats(), os.getpid()) - {os.getpid()}
    before = cpu_cost.tree_seconds(exclude=others)
    code = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    subprocess.run([sys.executable, "-c", code], check=True)  # waited for: lands in our cutime
    grown = cpu_cost.tree_seconds(exclude=others) - before
    assert grown >= 0.27, grown
    # A live child, left out by pid: its CPU is not in the tree.
    child = subprocess.Popen([sys.executable, "-c", code + "import sys; sys.stdin.read()\n"],
                             stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60  # a loaded machine gives the child little CPU
        while cpu_cost.process_seconds(child.pid) < 0.27 and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = cpu_cost.all_stats()
        assert child.pid in cpu_cost.subtree(stats, os.getpid())
        assert child.pid not in cpu_cost.subtree(stats, os.getpid(), exclude=[child.pid])
        with_child = cpu_cost.tree_seconds(exclude=others)
        without = cpu_cost.tree_seconds(exclude=[*others, child.pid])
        assert with_child - without >= 0.27, (with_child, without)
    finally:
        child.communicate(b"")


def test_sum_of_deltas_counts_new_processes_from_zero_and_drops_vanished_ones():
    assert cpu_cost.sum_deltas({1: 10, 2: 5, 3: 7}, {1: 15, 2: 5, 4: 3}) == 5 + 0 + 3
    assert cpu_cost.sum_deltas({}, {}) == 0


def test_the_backend_meter_sums_its_processes_growth_and_counts_lock_waits():
    """The sampler with a stand-in for pg_stat_activity that names this process: it grows with our
    CPU, its own thread's CPU is reported apart, and the lock-wait share is of active samples."""
    calls = {"n": 0}
    parent = os.getppid()

    def backends():
        calls["n"] += 1
        gone = [(parent, False, False)] if calls["n"] == 1 else []  # listed once, then "ended"
        return [(os.getpid(), True, calls["n"] % 2 == 0), (2 ** 22 + 1, True, True), *gone]  # 2**22+1: no such pid

    meter = cpu_cost.BackendCpu(backends, interval=0.01)
    burn(0.2)
    meter.stop()
    assert 0.17 <= meter.seconds <= 0.6 + meter.own_cpu, meter.seconds
    assert calls["n"] >= 3
    assert 0.2 <= meter.lock_share <= 0.8, meter.lock_share
    assert meter.own_cpu >= 0
    assert meter.ended == 1  # the parent, listed only in the first sample; the missing pid never counted


def test_machine_busy_ticks_grow():
    busy0, all0 = cpu_cost.machine_busy()
    burn(0.1)
    busy1, all1 = cpu_cost.machine_busy()
    assert busy1 > busy0 and all1 > all0 and busy1 - busy0 <= all1 - all0
