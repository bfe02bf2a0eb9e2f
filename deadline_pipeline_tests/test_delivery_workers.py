"""One sweep in several processes (``delivery.processes``) against a real PostgreSQL store and a
loopback receiver: the second process really sweeps (its own lease owner), every alert is sent once,
the workers see the caller's environment as at the call and log through the caller's loggers, a
worker killed mid-sweep is reported lost and its alerts are swept after their lease expires, SQLite
falls back to one process loudly, and the Dagster op reports the processes.

Which process sent what is read from the attempts table: worker ``i`` > 0 claims under
``<owner>#w<i>.<pid>#c<n>.<random>``, worker 0 (the caller) under ``<owner>#w0#c<n>.<random>``.
The receiver holds every request until worker 1 has committed an attempt row, so worker 0 cannot
sweep everything before the forkserver has started worker 1.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import signal
import threading
import time
from collections import Counter

import pytest
import yaml
from sqlalchemy import select

from deadline_pipeline.config import DeadlinesConfig, WebhookChannel
from deadline_pipeline.deliver.sweep import SweepFailed, sweep
from deadline_pipeline.store.db import make_engine, upgrade
from deadline_pipeline.store.schema import alerts, delivery_attempts
from deadline_pipeline_tests.factories import LOOPBACK_NETWORK
from deadline_pipeline_tests.test_delivery_sweep import (  # noqa: F401 (receiver: a fixture)
    T0,
    FakeChannel,
    Recorder,
    expire_leases,
    receiver,
    seed,
    states,
)

OWNER = "test#1#run"
SECRET_VAR = "DP_TEST_WORKERS_WH_SECRET"


class GatedRecorder(Recorder):
    """The sweep tests' recorder (``/ok`` 200, ``/error`` 500, ...), holding each request until the
    server's ``gate`` is set."""

    def do_POST(self) -> None:
        self.server.gate.wait(30)
        super().do_POST()


@pytest.fixture
def gated(receiver):  # noqa: F811 (the imported fixture)
    """The sweep tests' ``receiver`` with a ``gate`` (open unless a test closes it)."""
    server, base = receiver
    server.RequestHandlerClass = GatedRecorder
    server.gate = threading.Event()
    server.gate.set()
    yield server, base
    server.gate.set()


@pytest.fixture
def pg(pg_url):
    engine = make_engine(pg_url)
    upgrade(engine)
    yield engine
    engine.dispose()


def _config(processes: int = 2, secret_env: str | None = None, **delivery) -> DeadlinesConfig:
    hook = WebhookChannel(type="webhook", timeout_seconds=30, max_concurrency=16, secret_env=secret_env)
    return DeadlinesConfig(network=LOOPBACK_NETWORK, channels={"hook": hook},
                           delivery={"processes": processes, "batch_size": 50, **delivery})


def _owners(engine) -> dict[int, set[str]]:
    """Lease owners of the attempt rows, by alert id."""
    with engine.connect() as conn:
        rows = conn.execute(select(delivery_attempts.c.alert_id, delivery_attempts.c.lease_owner)).all()
    by_alert: dict[int, set[str]] = {}
    for alert_id, owner in rows:
        by_alert.setdefault(alert_id, set()).add(owner)
    return by_alert


class WorkerWatch(threading.Thread):
    """Closes the receiver's gate, waits until worker 1 has committed an attempt row (so it is
    sending), runs ``then(pid)`` with that worker's pid, and opens the gate."""

    def __init__(self, engine, server, then=None) -> None:
        super().__init__(daemon=True)
        self.engine, self.server, self.then = engine, server, then
        self.pid: int | None = None
        server.gate.clear()

    def run(self) -> None:
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                with self.engine.connect() as conn:
                    owner = conn.execute(select(delivery_attempts.c.lease_owner)
                                         .where(delivery_attempts.c.lease_owner.like("%#w1.%")).limit(1)).scalar()
                if owner:
                    self.pid = int(re.search(r"#w1\.(\d+)#", owner).group(1))
                    if self.then:
                        self.then(self.pid)
                    return
                time.sleep(0.05)
        finally:
            self.server.gate.set()


def test_two_processes_share_the_sweep_and_send_each_alert_once(pg, gated):
    server, base = gated
    n = 600
    ids = seed(pg, n, webhook_url=f"{base}/ok")
    cfg = _config()
    watch = WorkerWatch(pg, server)
    watch.start()
    out = sweep(pg, cfg, T0, owner=OWNER)
    watch.join(5)
    assert watch.pid is not None and watch.pid != os.getpid(), "worker 1 is a process of its own"
    counts = Counter(r["headers"]["Idempotency-Key"] for r in server.requests)
    assert len(counts) == n and max(counts.values()) == 1, "every alert sent exactly once"
    assert out.processes == 2 and out.delivered == out.claimed == n and out.batch_failures == 0, out
    assert states(pg) == {"delivered": n}
    owners = _owners(pg)
    assert set(owners) == set(ids) and all(len(o) == 1 for o in owners.values())
    flat = {o for os_ in owners.values() for o in os_}
    assert any(o.startswith(f"{OWNER}#w0#") for o in flat), "the caller swept as worker 0"
    assert any(o.startswith(f"{OWNER}#w1.{watch.pid}#") for o in flat), "worker 1 swept under its own owner"
    assert all(re.match(rf"{re.escape(OWNER)}#w(0|1\.\d+)#c\d+\.", o) for o in flat), flat


def test_workers_use_the_environment_as_at_the_call(pg, gated, monkeypatch):
    from standardwebhooks.webhooks import Webhook

    server, base = gated
    monkeypatch.delenv(SECRET_VAR, raising=False)
    # A first multi-process sweep starts the forkserver (if no earlier test did) without the secret.
    first = sweep(pg, _config(), T0, owner=OWNER)
    assert first.processes == 2 and first.claimed == 0 and not first.errors, first
    secret = "whsec_" + base64.b64encode(b"rotated after the forkserver started").decode()
    monkeypatch.setenv(SECRET_VAR, secret)
    n = 200
    seed(pg, n, webhook_url=f"{base}/ok")
    cfg = _config(secret_env=SECRET_VAR)
    watch = WorkerWatch(pg, server)
    watch.start()
    out = sweep(pg, cfg, T0, owner=OWNER)
    watch.join(5)
    assert out.delivered == n and out.escalated == 0, out.errors[:3]
    with pg.connect() as conn:
        key_of = dict(conn.execute(select(alerts.c.id, alerts.c.dedup_key)).all())
    by_worker1 = {key_of[a] for a, o in _owners(pg).items() if any("#w1." in x for x in o)}
    assert by_worker1, "worker 1 sent some of the alerts"
    signed = {r["headers"]["Idempotency-Key"]: r for r in server.requests}
    assert by_worker1 <= set(signed)
    for req in server.requests:  # verify raises on a wrong or missing key
        Webhook(secret).verify(req["body"].decode(), {k.lower(): v for k, v in req["headers"].items()})


def test_workers_compute_with_the_callers_zone_data(pg, gated, monkeypatch, tmp_path):
    """Every process of a sweep shows due times with the zone database the caller computes with and
    records, even when the forkserver chose another from its environment when it started."""
    from deadline_pipeline import zone_data
    from deadline_pipeline_tests.test_zone_data import old_zone_folder

    server, base = gated
    # A first multi-process sweep starts the forkserver (if no earlier test did) on the package's data.
    first = sweep(pg, _config(), T0, owner=OWNER)
    assert first.processes == 2 and first.claimed == 0 and not first.errors, first
    monkeypatch.setenv("PYTHONTZPATH", str(old_zone_folder(tmp_path / "zoneinfo-2025b")))
    monkeypatch.setenv("DEADLINE_ZONE_DATA", "system")
    zone_data.activate()
    try:
        assert zone_data.version() == "2025b"
        n = 200
        seed(pg, n, webhook_url=f"{base}/ok", tz="America/Vancouver")  # due 2027-03-02T09:00Z
        watch = WorkerWatch(pg, server)
        watch.start()
        out = sweep(pg, _config(), T0, owner=OWNER)
        watch.join(5)
    finally:
        monkeypatch.delenv("PYTHONTZPATH")
        monkeypatch.delenv("DEADLINE_ZONE_DATA")
        zone_data.activate()
    assert out.delivered == n, out.errors[:3]
    with pg.connect() as conn:
        key_of = dict(conn.execute(select(alerts.c.id, alerts.c.dedup_key)).all())
    by_worker1 = {key_of[a] for a, o in _owners(pg).items() if any("#w1." in x for x in o)}
    assert by_worker1, "worker 1 sent some of the alerts"
    # 2025b: Vancouver on PST until 14 March 2027 (2026f: UTC-7 all year, 02:00-07:00).
    shown = Counter(json.loads(r["body"])["data"]["due_local"] for r in server.requests)
    assert shown == {"2027-03-02T01:00:00-08:00": n}, shown


def test_a_worker_log_record_reaches_the_callers_logger(pg, gated, caplog):
    server, base = gated
    caplog.set_level(logging.WARNING, logger="deadline_pipeline.deliver.sweep")
    n = 200
    seed(pg, n, webhook_url=f"{base}/error")
    cfg = _config()
    watch = WorkerWatch(pg, server)
    watch.start()
    out = sweep(pg, cfg, T0, owner=OWNER)
    watch.join(5)
    assert out.failed == n and out.processes == 2
    worker1_alerts = {a for a, o in _owners(pg).items() if any("#w1." in x for x in o)}
    forwarded = [r for r in caplog.records if r.process == watch.pid]
    assert forwarded, [(r.process, r.getMessage()) for r in caplog.records]
    failure = [r for r in forwarded if r.levelno == logging.WARNING and "attempt 1 failed" in r.getMessage()]
    assert failure and failure[0].name == "deadline_pipeline.deliver.sweep"
    named = int(re.match(r"alert (\d+):", failure[0].getMessage()).group(1))
    assert named in worker1_alerts, "the record is the worker's own, about an alert it sent"


def test_a_killed_worker_is_reported_lost_and_its_alerts_swept_after_the_lease(pg, gated, caplog):
    server, base = gated
    caplog.set_level(logging.ERROR, logger="deadline_pipeline.deliver.sweep")
    n = 300
    ids = seed(pg, n, webhook_url=f"{base}/ok")
    killed: list[int] = []

    def kill(pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    cfg = _config(lease_seconds=120, time_budget_seconds=60)
    watch = WorkerWatch(pg, server, then=kill)
    watch.start()
    t = time.monotonic()
    with pytest.raises(SweepFailed, match="deliver-worker-1") as failed:
        sweep(pg, cfg, T0, owner=OWNER)
    out = failed.value.outcome  # the run fails, and still says what the other worker did
    elapsed = time.monotonic() - t
    watch.join(5)
    assert killed, "worker 1 was killed mid-sweep"
    assert elapsed < 20, "a dead worker is noticed at once, not after the time budget"
    assert out.batch_failures >= 1 and out.processes == 2
    lost = [e for e in out.errors if "deliver-worker-1" in e and "without a result" in e]
    assert lost, out.errors
    assert any("deliver-worker-1" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    left = states(pg)
    assert left.get("claimed", 0) >= 1 and left.get("claimed", 0) + left.get("delivered", 0) == n, left
    assert out.delivered == left["delivered"]
    # The worker's claims are taken up again after their lease expires: nothing is lost.
    expire_leases(pg)
    again = sweep(pg, _config(), T0, owner=OWNER + "2")
    assert again.delivered == left["claimed"] and again.batch_failures == 0, again.errors
    assert states(pg) == {"delivered": n}
    with pg.connect() as conn:
        key_of = dict(conn.execute(select(alerts.c.id, alerts.c.dedup_key)).all())
    assert {r["headers"]["Idempotency-Key"] for r in server.requests} == {key_of[a] for a in ids}


def test_sqlite_sweeps_in_one_process_and_says_so(tmp_path, gated, caplog):
    server, base = gated
    engine = make_engine(f"sqlite:///{tmp_path / 'store.sqlite3'}")
    upgrade(engine)
    caplog.set_level(logging.WARNING, logger="deadline_pipeline.deliver.sweep")
    seed(engine, 30, webhook_url=f"{base}/ok")
    out = sweep(engine, _config(), T0, owner=OWNER)
    assert out.processes == 1 and out.delivered == 30
    assert any(r.levelno == logging.WARNING and "delivery.processes is 2, but the store is sqlite" in r.getMessage()
               for r in caplog.records)
    assert not any("#w" in o for os_ in _owners(engine).values() for o in os_)
    assert {r.process for r in caplog.records} == {os.getpid()}
    engine.dispose()


def test_channels_or_an_unpicklable_clock_are_refused_before_anything_is_claimed(pg):
    ids = seed(pg, 5, channel="fake")
    with pytest.raises(ValueError, match="channels"):
        sweep(pg, _config(), T0, owner=OWNER, channels={"fake": FakeChannel()})
    with pytest.raises(ValueError, match="clock"):
        sweep(pg, _config(), T0, owner=OWNER, clock=lambda: T0)
    assert states(pg) == {"pending": len(ids)}
    with pg.connect() as conn:
        assert conn.execute(select(alerts.c.lease_owner).where(alerts.c.lease_owner.is_not(None))).all() == []
        assert conn.execute(select(delivery_attempts.c.id)).all() == []


def _run_deliver_job(pg_url, base, tmp_path, *, timeout_seconds, instance=None, **delivery):
    """``deliver_job`` in process against the PostgreSQL store, a configuration file with a loopback
    webhook channel and ``delivery`` settings, at the frozen instant T0; returns the Dagster result."""
    import dagster as dg

    from deadline_pipeline.orchestration.deliver import deliver_job
    from deadline_pipeline.orchestration.resources import ClockResource, SettingsResource, StoreResource

    path = tmp_path / "deadlines.yaml"
    path.write_text(yaml.safe_dump({
        "sources": [{"name": "cal", "format": "ics", "location": "cal.ics"}],
        "subscribers": [{"id": "s1", "webhook_url": f"{base}/ok"}],
        "subscriptions": [{"name": "all", "sources": ["cal"], "channels": ["hook"]}],
        "network": LOOPBACK_NETWORK,
        "channels": {"hook": {"type": "webhook", "timeout_seconds": timeout_seconds}},
        "delivery": delivery,
    }))
    return deliver_job.execute_in_process(
        instance=instance or dg.DagsterInstance.ephemeral(), raise_on_error=False,
        resources={"store": StoreResource(db_url=pg_url), "settings": SettingsResource(config_path=str(path)),
                   "clock": ClockResource(as_of=T0.isoformat())})


def test_deliver_job_with_two_processes_reports_them(pg, pg_url, gated, tmp_path):
    server, base = gated
    n = 100
    seed(pg, n, webhook_url=f"{base}/ok")
    result = _run_deliver_job(pg_url, base, tmp_path, timeout_seconds=30, processes=2, batch_size=20)
    assert result.success
    [obs] = result.asset_observations_for_node("deliver_sweep")
    meta = {k: v.value for k, v in obs.metadata.items()}
    assert meta["processes"] == 2 and meta["sent"] == n and meta["batch_failures"] == 0, meta
    assert meta["retry_after_capped"] == 0 and meta["results_unstorable"] == 0
    assert states(pg) == {"delivered": n}
    assert Counter(r["headers"]["Idempotency-Key"] for r in server.requests).most_common(1)[0][1] == 1
    assert json.loads(server.requests[0]["body"])["data"]["id"] == server.requests[0]["headers"]["Idempotency-Key"]


def test_deliver_job_fails_when_the_sweep_fails_and_still_reports_its_counts(pg, pg_url, gated, tmp_path):
    """A sweep that gave up (here: every attempt row refused by the database) fails the Dagster run
    - red in the UI, no "ok" heartbeat - and the run still carries what the sweep did."""
    from deadline_pipeline.store.schema import heartbeats
    from deadline_pipeline_tests.test_delivery_sweep import _refuse_attempt_rows

    server, base = gated
    seed(pg, 40, webhook_url=f"{base}/ok")
    _refuse_attempt_rows(pg)
    result = _run_deliver_job(pg_url, base, tmp_path, timeout_seconds=5, processes=2, batch_size=10,
                              time_budget_seconds=3, lease_seconds=60)
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "attempt rows could not be written" in failure.event_specific_data.error.message
    [obs] = result.asset_observations_for_node("deliver_sweep")
    meta = {k: v.value for k, v in obs.metadata.items()}
    assert meta["processes"] == 2 and meta["sent"] == 0 and meta["batch_failures"] >= 2, meta
    assert server.requests == [], "nothing sent without its attempt row"
    assert states(pg) == {"pending": 40}, "released, nothing charged or lost"
    with pg.connect() as conn:
        assert conn.execute(select(heartbeats).where(heartbeats.c.component == "deliver")).all() == []


@pytest.mark.parametrize("value", [True, "2", 2.0, 0, 33])
def test_processes_must_be_a_plain_count(value):
    """YAML's `true` must not quietly become one process; the range names the key."""
    with pytest.raises(ValueError, match="delivery.processes"):
        DeadlinesConfig(delivery={"processes": value})


def test_a_run_log_listing_the_first_errors_says_how_many_more_there_are(pg, pg_url, gated, tmp_path):
    """25 alerts refused for good (HTTP 400) are escalated; the run's log lists 20 of them and says
    that 5 more are not listed. Before, the log stopped at 20 and read as if there were 20."""
    import dagster as dg

    server, base = gated
    seed(pg, 25, webhook_url=f"{base}/bad")
    instance = dg.DagsterInstance.ephemeral()
    result = _run_deliver_job(pg_url, base, tmp_path, timeout_seconds=5, instance=instance, processes=1,
                              batch_size=50)
    assert result.success
    [obs] = result.asset_observations_for_node("deliver_sweep")
    assert obs.metadata["escalated"].value == 25
    messages = [e.user_message for e in instance.all_logs(result.run_id) if e.user_message]
    listed = [m for m in messages if m.startswith("alert ") and "HTTP 400" in m]
    assert len(listed) == 20, listed
    assert any(m.startswith("… and 5 more error(s)") for m in messages), messages[-5:]


def test_the_forkserver_preloads_the_sweep_and_the_database_driver(pg_url):
    """A worker forked before psycopg was imported imported it itself, in every sweep: about 70 ms of
    CPU, half of a worker's start (benchmarks/README.md)."""
    from deadline_pipeline.deliver.sweep import _sweep_in_worker
    from deadline_pipeline.deliver.workers import forkserver_preload

    engine = make_engine(pg_url)
    try:
        modules = forkserver_preload(_sweep_in_worker, engine)
    finally:
        engine.dispose()
    assert modules[0] == "deadline_pipeline.deliver.sweep"
    assert "psycopg" in modules and "sqlalchemy.dialects.postgresql.psycopg" in modules
