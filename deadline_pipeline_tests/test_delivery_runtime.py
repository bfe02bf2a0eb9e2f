"""How a sweep process runs (``deadline_pipeline.deliver.runtime``).

* The event loop (``delivery.event_loop``): uvloop by default, the standard library's loop when
  configured, and a loud fallback to it when uvloop cannot be imported; every sweep process
  (``delivery.processes``) runs on the configured loop and the outcome names it.
* The garbage collector: while a sweep runs, the objects alive before it are frozen and the young
  generation's threshold is raised; afterwards both are as they were, also when the sweep fails,
  and overlapping sweeps in one process undo the tuning only when the last one ends.

Both are observed from inside the sweep: a channel whose ``send_async`` records the class of the
running loop and the collector's state.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from deadline_pipeline.config import DeadlinesConfig, WebhookChannel
from deadline_pipeline.deliver.notification import SendResult
from deadline_pipeline.deliver.runtime import SWEEP_GC_THRESHOLD0, sweep_gc
from deadline_pipeline.deliver.sweep import sweep
from deadline_pipeline_tests.factories import LOOPBACK_NETWORK
from deadline_pipeline_tests.test_delivery_sweep import T0, receiver, seed, states  # noqa: F401 (fixture)

OWNER = "test#1#loop"


class LoopRecordingChannel:
    """A channel that sends nothing and records the module of the event loop each send ran on."""

    name = "fake"
    idempotency_class = None

    def __init__(self, fail: bool = False) -> None:
        self.loops: set[str] = set()
        self.gc_states: set[tuple[int, bool]] = set()  # (young threshold, anything frozen)
        self.fail = fail

    async def send_async(self, n) -> SendResult:
        self.loops.add(type(asyncio.get_running_loop()).__module__.split(".")[0])
        self.gc_states.add((gc.get_threshold()[0], gc.get_freeze_count() > 0))
        if self.fail:
            raise KeyboardInterrupt  # the process going down: escapes the sweep
        return SendResult(provider_message_id="ok")

    def send(self, n) -> SendResult:  # pragma: no cover - the sweep prefers send_async
        raise AssertionError("the sweep must use send_async")

    def close(self) -> None:
        pass


def _config(**delivery) -> DeadlinesConfig:
    return DeadlinesConfig(network=LOOPBACK_NETWORK, delivery={"batch_size": 10, **delivery})


def test_the_sweep_runs_on_uvloop_by_default(engine):
    seed(engine, 25, channel="fake")
    ch = LoopRecordingChannel()
    out = sweep(engine, _config(), T0, owner=OWNER, channels={"fake": ch})
    assert ch.loops == {"uvloop"}
    assert out.event_loop == "uvloop" and out.delivered == 25


def test_the_standard_loop_when_configured(engine):
    seed(engine, 5, channel="fake")
    ch = LoopRecordingChannel()
    out = sweep(engine, _config(event_loop="asyncio"), T0, owner=OWNER, channels={"fake": ch})
    assert ch.loops == {"asyncio"}
    assert out.event_loop == "asyncio" and out.delivered == 5


def test_uvloop_missing_falls_back_to_the_standard_loop_loudly(engine, monkeypatch, caplog):
    # A None entry makes `import uvloop` raise ImportError, as on a platform without it.
    monkeypatch.setitem(sys.modules, "uvloop", None)
    caplog.set_level(logging.WARNING, logger="deadline_pipeline.deliver.sweep")
    seed(engine, 5, channel="fake")
    ch = LoopRecordingChannel()
    out = sweep(engine, _config(), T0, owner=OWNER, channels={"fake": ch})
    assert ch.loops == {"asyncio"} and out.event_loop == "asyncio" and out.delivered == 5
    assert any("delivery.event_loop is uvloop, but it cannot be imported" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)


def test_an_unknown_event_loop_is_refused_by_the_configuration():
    with pytest.raises(ValueError, match="event_loop"):
        _config(event_loop="trio")


def test_every_worker_process_runs_on_the_configured_loop(pg_url, receiver):  # noqa: F811 (fixture)
    """Two processes on PostgreSQL, real webhook sends: the merged outcome names the one loop all used."""
    from deadline_pipeline.store.db import make_engine, upgrade

    server, base = receiver
    engine = make_engine(pg_url)
    upgrade(engine)
    try:
        for loop in ("uvloop", "asyncio"):
            seed(engine, 40, webhook_url=f"{base}/ok")
            cfg = DeadlinesConfig(network=LOOPBACK_NETWORK,
                                  channels={"hook": WebhookChannel(type="webhook", timeout_seconds=30)},
                                  delivery={"processes": 2, "batch_size": 5, "event_loop": loop})
            out = sweep(engine, cfg, T0, owner=OWNER)
            assert out.processes == 2 and out.event_loop == loop, out
        assert states(engine) == {"delivered": 80}
    finally:
        engine.dispose()


def test_an_interrupted_sweep_stops_its_worker_processes(pg_url):
    """Ctrl-C while both processes of a sweep wait on a receiver that drips its answer: the interrupt
    leaves the sweep only once the worker process has ended. It was left to the interpreter's exit,
    so the worker went on sending beside a process that carried on (a long-lived Dagster process),
    or for ever after ``run`` ended by ``os._exit`` (a send still blocking a thread)."""
    import os
    import time

    from deadline_pipeline.config import SmtpChannel
    from deadline_pipeline.store.db import make_engine, upgrade
    from deadline_pipeline_tests.smtp_drip_server import SmtpDripServer

    engine = make_engine(pg_url)
    upgrade(engine)
    workers: set[int] = set()
    try:
        with SmtpDripServer("data", every=1.0) as stalled:
            seed(engine, 12, channel="mail")
            cfg = DeadlinesConfig(network=LOOPBACK_NETWORK, channels={"mail": SmtpChannel(
                type="smtp", host="127.0.0.1", port=stalled.port, timeout_seconds=8)},
                delivery={"processes": 2, "batch_size": 2, "lease_seconds": 15, "time_budget_seconds": 10})

            def interrupt() -> None:
                give_up = time.monotonic() + 60
                # Both processes sending: the worker (forked by the forkserver, a grandchild of this
                # process) is up, and more messages arrived than worker 0's batch holds.
                while not (workers and stalled.messages > 2) and time.monotonic() < give_up:
                    workers.update(p for p, parent in _descendants(os.getpid()).items() if parent != os.getpid())
                    time.sleep(0.05)
                os.kill(os.getpid(), signal.SIGINT)

            threading.Thread(target=interrupt, daemon=True).start()
            with pytest.raises(KeyboardInterrupt):
                sweep(engine, cfg, T0, owner=OWNER)
            assert workers and stalled.messages > 2
            assert not _alive(workers), f"worker processes still running after the interrupt: {_alive(workers)}"
    finally:
        for pid in _alive(workers):
            os.kill(pid, signal.SIGKILL)
        engine.dispose()


def _marking_worker(engine, cfg, now, owner, clock, max_batches) -> None:
    """A worker function that only leaves a file (``$WORKER_RAN_MARKER``) saying it ran."""
    import os
    from pathlib import Path

    Path(os.environ["WORKER_RAN_MARKER"]).write_text(owner)


_INTERRUPTED_WHILE_STARTING = """
import os, sys, time
from datetime import UTC, datetime
from pathlib import Path
from deadline_pipeline.config import DeadlinesConfig
from deadline_pipeline.deliver.workers import run_in_processes
from deadline_pipeline.store.db import make_engine
from deadline_pipeline_tests.test_delivery_runtime import _marking_worker

def interrupted():
    time.sleep(0.2)  # the forkserver is still importing the worker's module
    raise KeyboardInterrupt

try:
    run_in_processes(make_engine(sys.argv[1]), DeadlinesConfig(delivery={"processes": 2}), datetime.now(UTC),
                     owner="t", clock=None, max_batches=None, run_here=interrupted, run_worker=_marking_worker)
except KeyboardInterrupt:
    os._exit(130)  # as `run` ends while a send blocks a thread
"""


def test_a_worker_started_after_its_caller_was_interrupted_does_not_sweep(tmp_path, pg_url):
    """The caller is interrupted and ends while the forkserver is still importing the sweep, its
    request for a worker already sent: the forkserver forked the worker afterwards, which swept with
    no caller to stop it. Now a worker whose caller is gone ends before it does anything."""
    import os
    import subprocess
    import time

    marker = tmp_path / "worker-ran"
    # The script and the forkserver import this module by name: the repository must be on their path
    # (an installed package does not bring its tests).
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "WORKER_RAN_MARKER": str(marker),
           "PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run([sys.executable, "-c", _INTERRUPTED_WHILE_STARTING, pg_url], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 130, res.stderr
    give_up = time.monotonic() + 15  # the forkserver's import, then its fork of the worker
    while not marker.exists() and time.monotonic() < give_up:
        time.sleep(0.2)
    assert not marker.exists(), "a worker swept after its caller had ended"


# --------------------------------------------------------------------------- garbage collector


@pytest.fixture
def default_gc():
    """Python's default collector state around a test (another test may have left it tuned)."""
    saved = gc.get_threshold()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


def test_the_collector_is_tuned_during_a_sweep_and_restored_after(engine, default_gc):
    seed(engine, 5, channel="fake")
    ch = LoopRecordingChannel()
    out = sweep(engine, _config(), T0, owner=OWNER, channels={"fake": ch})
    assert out.delivered == 5
    assert ch.gc_states == {(SWEEP_GC_THRESHOLD0, True)}, "frozen and a raised threshold while sending"
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0, "as it was afterwards"


def test_the_collector_is_restored_when_the_sweep_escapes(engine, default_gc):
    seed(engine, 1, channel="fake")
    ch = LoopRecordingChannel(fail=True)
    with pytest.raises(KeyboardInterrupt):
        sweep(engine, _config(), T0, owner=OWNER, channels={"fake": ch})
    assert ch.gc_states == {(SWEEP_GC_THRESHOLD0, True)}
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0


def test_overlapping_sweeps_keep_the_tuning_until_the_last_ends(default_gc):
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with sweep_gc():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    with sweep_gc():
        pass  # this one ends first: the other is still running
    assert gc.get_threshold()[0] == SWEEP_GC_THRESHOLD0 and gc.get_freeze_count() > 0
    release.set()
    t.join(10)
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0
    cycle: list = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1, "the collector still frees cycles after the sweep"


# --------------------------------------------------------------------------- going down mid-batch


class InterruptingChannel:
    """Sends take 50 ms; the ``at``-th send to start raises KeyboardInterrupt (the process going down)."""

    name = "fake"
    idempotency_class = None

    def __init__(self, at: int) -> None:
        self.at = at
        self.started = 0

    async def send_async(self, n) -> SendResult:
        self.started += 1
        if self.started == self.at:
            raise KeyboardInterrupt
        await asyncio.sleep(0.05)
        return SendResult(provider_message_id="ok")

    def close(self) -> None:
        pass


def test_a_sweep_going_down_starts_no_queued_send_and_charges_only_sends_past_their_gate(engine):
    """The channel's lane runs 8 sends at a time (its default concurrency) out of batches of 10; when
    the third send raises KeyboardInterrupt, no other send starts, the alerts still queued get no
    attempt row (never started, never charged), and the sweep escapes with the interrupt."""
    from sqlalchemy import func, select

    from deadline_pipeline.store.schema import delivery_attempts

    seed(engine, 30, channel="fake")
    ch = InterruptingChannel(at=3)
    with pytest.raises(KeyboardInterrupt):
        sweep(engine, _config(), T0, owner=OWNER, channels={"fake": ch})
    assert ch.started == 3, "no send started after the interrupt"
    with engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(delivery_attempts)).scalar_one()
    # Rows only for the sends that passed the start gate (at most the lane's 8 at once), kept as
    # possibly started; the other 22 or more alerts have none.
    assert ch.started <= rows <= 8


def test_an_alert_queued_as_the_last_lane_worker_leaves_is_still_sent():
    """A lane of one worker: its last send returns and, in the same loop step, another batch's alert
    is queued (a claim finishing at that moment). Counted by a done callback, the leaving worker
    still looked busy then: no worker was started, the alert stayed queued and the sweep hung."""
    from deadline_pipeline.deliver.lanes import AlertSend, Batch, Lane

    class FakeSweep:
        def __init__(self) -> None:
            self.sent: list[int] = []
            self.after_first = None

        async def send(self, r, claimed_at) -> None:
            self.sent.append(r.row["id"])
            if r.row["id"] == 1:
                # Runs right after this worker's last step, before its done callbacks.
                asyncio.get_running_loop().call_soon(self.after_first)

    fake = FakeSweep()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        lane = Lane(fake, concurrency=1, rate=None)
        first = Batch("o#c1", [], loop.create_future(), pending=1)
        second = Batch("o#c2", [], loop.create_future(), pending=1)
        fake.after_first = lambda: lane.put(AlertSend(row={"id": 2}), 0.0, second)
        lane.put(AlertSend(row={"id": 1}), 0.0, first)
        await asyncio.wait_for(first.sends, 1)
        await asyncio.wait_for(second.sends, 1)

    asyncio.run(main())
    assert fake.sent == [1, 2]


def test_a_cancelled_batch_starts_no_send_waiting_for_its_rate_slot():
    """A lane spacing sends at 5 per second: when the batch is cancelled (the sweep going down), the
    worker waiting for its next slot is cancelled with it; woken, it started one more send."""
    from deadline_pipeline.deliver.lanes import AlertSend, Batch, Lane

    class FakeSweep:
        def __init__(self) -> None:
            self.sent: list[int] = []

        async def send(self, r, claimed_at) -> None:
            self.sent.append(r.row["id"])

    fake = FakeSweep()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        lane = Lane(fake, concurrency=1, rate=5)
        batch = Batch("o#c1", [], loop.create_future(), pending=3)
        for i in range(3):
            lane.put(AlertSend(row={"id": i}), 0.0, batch)
        await asyncio.sleep(0.05)  # the first sent, the worker waits 0.2 s for the second's slot
        batch.cancel()
        await asyncio.sleep(0.5)

    asyncio.run(main())
    assert fake.sent == [0]


# --------------------------------------------------------------------------- Ctrl-C during `run`


def _interrupt_config(folder, port: int, subscribers: int, processes: int = 1):
    from deadline_pipeline_tests.factories import ai_deadlines, write_config

    (folder / "conf.yml").write_text(ai_deadlines({"title": "CONF", "year": 2027, "id": "conf27", "deadlines": [
        {"type": "paper", "label": "Paper", "date": "2027-03-01 23:59:59", "timezone": "UTC"}]}))
    return write_config(
        folder, sources=[{"name": "conf", "format": "ai-deadlines", "location": "conf.yml", "tenant": "t"}],
        subscribers=[{"id": f"s{i}", "tenant": "t", "email": f"s{i}@example.org", "timezone": "UTC"}
                     for i in range(subscribers)],
        subscriptions=[{"name": "papers", "sources": ["conf"], "offsets": ["-P7D"], "channels": ["mail"]}],
        channels={"mail": {"type": "smtp", "host": "127.0.0.1", "port": port, "timeout_seconds": 8}},
        network=LOOPBACK_NETWORK,
        delivery={"lease_seconds": 15, "time_budget_seconds": 10, "processes": processes})


def _descendants(pid: int) -> dict[int, int]:
    """Every living process below ``pid`` (children, theirs, ...), read from /proc: pid → its parent's pid."""
    import os

    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:  # ended meanwhile
            continue
        fields_ = stat[stat.rindex(")") + 2:].split()
        if fields_[0] != "Z":  # a zombie has ended; only its parent's wait is missing
            parents[int(entry)] = int(fields_[1])
    found: dict[int, int] = {}
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - set(found)
        found |= {child: parents[child] for child in frontier}
    return found


def _alive(pids: set[int]) -> dict[int, str]:
    """Those of ``pids`` still running (not ended, not a zombie), with their command lines."""
    alive = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                stat = fh.read()
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] != "Z":
            alive[pid] = cmdline
    return alive


def _interrupt_run(tmp_path, stop: int, *, processes: int = 1, db_url: str | None = None,
                   whole_group: bool = False) -> None:
    """Start ``deadline-pipeline run`` on a receiver that has each message but drips its answer (the
    send's outcome unknown), send ``stop`` once a message arrived (to the run's whole process group
    when ``whole_group``, as a terminal's Ctrl-C does, else to the run's process alone), and check:
    exit 130 within 5 s with one line on stderr, no process the run started still running, nothing
    escalated or marked sent; after the lease, one sweep delivers every alert, again only those whose
    send's outcome was unknown."""
    import os
    import subprocess
    import time

    from sqlalchemy import select

    from deadline_pipeline.config import load_config
    from deadline_pipeline.store.db import make_engine
    from deadline_pipeline.store.schema import alerts, delivery_attempts
    from deadline_pipeline_tests.smtp_drip_server import SmtpDripServer

    home = tmp_path / "home"
    env = {**os.environ, "DEADLINE_HOME": str(home)}
    env.pop("DEADLINE_DB_URL", None)
    env.pop("DAGSTER_HOME", None)
    store = ["--db-url", db_url] if db_url else []  # else the home's SQLite store, which `run` creates
    db_url = db_url or f"sqlite:///{home / 'store.sqlite3'}"
    with SmtpDripServer("data", every=1.0) as stalled:
        path = _interrupt_config(tmp_path, stalled.port, subscribers=12, processes=processes)
        proc = subprocess.Popen([sys.executable, "-m", "deadline_pipeline.cli", "run", "--config", str(path), *store,
                                 "--as-of", "2027-02-25T00:00:00Z"], cwd=tmp_path, env=env,
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        started: set[int] = set()
        try:
            give_up = time.monotonic() + 120
            # Every worker has its messages on the receiver: each is mid-send when the signal comes.
            while stalled.messages < processes and proc.poll() is None and time.monotonic() < give_up:
                started |= set(_descendants(proc.pid))
                time.sleep(0.05)
            if stalled.messages < processes:
                proc.kill()
                raise AssertionError(f"no send reached the receiver: {proc.communicate(timeout=30)}")
            started |= set(_descendants(proc.pid))
            if whole_group:
                os.killpg(proc.pid, stop)
            else:
                proc.send_signal(stop)
            interrupted_at = time.monotonic()
            out, err = proc.communicate(timeout=30)
            took = time.monotonic() - interrupted_at
            at_exit = stalled.messages
            # The run's helpers end by themselves once it has: the forkserver (which may still be
            # importing the sweep) and multiprocessing's resource tracker. Nothing sends meanwhile.
            settle = time.monotonic() + 15
            while (left := _alive(started)) and time.monotonic() < settle:
                time.sleep(0.05)
        finally:
            proc.kill()
            for pid in _alive(started):
                os.kill(pid, signal.SIGKILL)
        received = stalled.messages
    assert received == at_exit, f"{received - at_exit} message(s) sent after the run had exited"
    assert proc.returncode == 130, (out, err)
    assert took < 5, f"the run went on for {took:.1f} s after the signal"
    assert err.strip().splitlines() == [err.strip()] and err.startswith("interrupted during deliver_job: "), err
    assert "Traceback" not in err and "checks:" not in out, (out, err)
    assert "sent again once its lease expires (delivery.lease_seconds, 15 s)" in err
    assert not left, f"processes of the run still running after it exited: {left}"

    engine = make_engine(db_url)
    with engine.connect() as conn:
        states = dict(conn.execute(select(alerts.c.id, alerts.c.status)).all())
        open_attempts = conn.execute(select(delivery_attempts.c.alert_id).where(
            delivery_attempts.c.outcome.is_(None))).scalars().all()
    assert len(states) == 12
    # Nothing given up or marked sent: every alert is still owed (claimed ones return after the lease).
    assert set(states.values()) <= {"claimed", "pending"}, states
    # Each send the receiver got has its attempt row, open: an unknown outcome, to be sent again.
    assert len(open_attempts) >= received and {states[a] for a in open_attempts} == {"claimed"}

    time.sleep(16)  # the lease (15 s, on the database clock) expires
    with SmtpDripServer("data", every=0.0) as prompt:
        cfg = load_config(_interrupt_config(tmp_path, prompt.port, subscribers=12))[0]
        out = sweep(engine, cfg, datetime(2027, 2, 25, tzinfo=UTC), owner="test#after")
        assert prompt.messages == 12
    assert out.delivered == 12 and out.recovered_unknown == len(set(open_attempts))
    with engine.connect() as conn:
        assert set(conn.execute(select(alerts.c.status)).scalars()) == {"delivered"}
    engine.dispose()


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_run_mid_send_with_one_line_and_loses_no_alert(tmp_path, stop):
    """Ctrl-C while the sweep waits on a receiver that has the message but drips its answer (the
    send's outcome unknown). Inside Dagster's step the interrupt was raised from the event loop's
    signal callback, which logged it ("Exception in callback") and went on: tracebacks, and the run
    kept sending and ran its checks. Now the run stops at once with one line and exit 130; no alert
    is escalated or marked sent, the sends cut off keep their attempt rows, and once the lease
    expires the next sweep sends every alert: the unknown ones again (a duplicate), none lost.
    SIGTERM alike: Dagster maps it to its interrupt handler (how Kubernetes and a run's termination
    stop a process), so it met the same callback and was swallowed the same way."""
    _interrupt_run(tmp_path, stop)


@pytest.mark.parametrize(("stop", "whole_group"), [(signal.SIGINT, True), (signal.SIGTERM, False)],
                         ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_a_run_of_two_sweep_processes(tmp_path, pg_url, stop, whole_group):
    """The same with ``delivery.processes: 2`` (PostgreSQL), both workers mid-send: Ctrl-C reaches
    every process of the terminal's group, SIGTERM only the run's own. Either way the run stops at
    once with one line and exit 130, no worker process is left sending, and none of the 12 alerts
    is lost."""
    _interrupt_run(tmp_path, stop, processes=2, db_url=pg_url, whole_group=whole_group)
