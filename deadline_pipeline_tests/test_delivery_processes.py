"""Several delivery processes against one PostgreSQL store and one loopback receiver that records
every request: 8 concurrent sweeps never send an alert twice while leases hold; a sweep SIGKILLed
mid-batch loses nothing, and after its lease expires only its killed batch is sent again, with the
same idempotency keys.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
from collections import Counter
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import select

from deadline_pipeline.config import DeadlinesConfig, WebhookChannel
from deadline_pipeline.deliver.sweep import sweep
from deadline_pipeline.store.db import make_engine, upgrade
from deadline_pipeline.store.schema import alerts, delivery_attempts
from deadline_pipeline_tests.factories import LOOPBACK_NETWORK
from deadline_pipeline_tests.test_delivery_sweep import T0, expire_leases, seed


class Recorder(BaseHTTPRequestHandler):
    """Records each request's Idempotency-Key; the request numbered ``block_at`` (1-based) sets
    ``blocked`` and then hangs until the test ends, so the sender can be killed mid-batch."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        srv = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with srv.lock:
            srv.keys.append((self.headers["Idempotency-Key"], json.loads(body)["data"]["id"]))
            number = len(srv.keys)
        if number == srv.block_at:
            srv.blocked.set()
            srv.release.wait(60)
            return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")


@pytest.fixture
def recorder():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.daemon_threads = True
    server.keys, server.lock, server.block_at = [], threading.Lock(), 0
    server.blocked, server.release = threading.Event(), threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.release.set()
    server.shutdown()
    server.server_close()


def _config(**delivery) -> DeadlinesConfig:
    return DeadlinesConfig(network=LOOPBACK_NETWORK,
                           channels={"hook": WebhookChannel(type="webhook", timeout_seconds=30, max_concurrency=16)},
                           delivery=delivery)


def _sweep_process(url: str, now_iso: str, delivery: dict, result_queue) -> None:
    """Child process: one sweep with its own engine; puts the number delivered on the queue."""
    engine = make_engine(url)
    out = sweep(engine, _config(**delivery), datetime.fromisoformat(now_iso))
    result_queue.put((os.getpid(), out.delivered))
    engine.dispose()


def test_eight_processes_never_send_twice_while_leases_hold(pg_url, recorder):
    server, hook = recorder
    engine = make_engine(pg_url)
    upgrade(engine)
    n = 2000
    seed(engine, n, webhook_url=hook)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_sweep_process, args=(pg_url, T0.isoformat(), {"batch_size": 25}, queue))
             for _ in range(8)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert all(p.exitcode == 0 for p in procs)
    counts = Counter(k for k, _ in server.keys)
    assert len(counts) == n and max(counts.values()) == 1, "no alert sent twice"
    assert sum(d for _, d in results) == n
    assert sum(1 for _, d in results if d) >= 2, "several processes shared the work"
    with engine.connect() as conn:
        assert set(conn.execute(select(alerts.c.status)).scalars()) == {"delivered"}
    engine.dispose()


def test_sigkill_mid_batch_loses_nothing_and_repeats_only_the_killed_batch(pg_url, recorder):
    server, hook = recorder
    engine = make_engine(pg_url)
    upgrade(engine)
    n, batch = 300, 50
    seed(engine, n, webhook_url=hook)
    server.block_at = 130  # inside the third batch (requests 101-150)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    victim = ctx.Process(target=_sweep_process,
                         args=(pg_url, T0.isoformat(), {"batch_size": batch, "lease_seconds": 60,
                                                            "time_budget_seconds": 50}, queue))
    victim.start()
    assert server.blocked.wait(60), "the victim reached the blocking request"
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    assert victim.exitcode == -signal.SIGKILL
    server.release.set()
    with engine.connect() as conn:
        claimed = set(conn.execute(select(alerts.c.dedup_key).where(alerts.c.status == "claimed")).scalars())
    # The sweep pipelines two batches (the next is claimed while the current one sends): the killed
    # batch is left claimed, and at most one batch ahead of it, never more.
    assert batch <= len(claimed) <= 2 * batch and len(claimed) % batch == 0, len(claimed)
    before = len(server.keys)
    # Sends of the killed batch that reached the receiver (requests 101-130): they surely started.
    reached = {k for k, _ in server.keys[100:]} & claimed
    with engine.connect() as conn:
        unclaimed = len(conn.execute(select(alerts.c.id).where(alerts.c.status == "pending")).all())
    # Within the lease another run takes only the never-claimed alerts, not the killed batch ...
    within = sweep(engine, _config(batch_size=batch), T0 + timedelta(seconds=59))
    assert within.claimed == unclaimed and within.recovered_unknown == 0
    # ... and after it expires (on the database clock), the killed batch: resent (notification
    # channel), same keys.
    expire_leases(engine)
    out = sweep(engine, _config(batch_size=batch), T0 + timedelta(seconds=61))
    assert out.claimed == out.delivered == len(claimed)
    # Only the sends that started are charged an "unknown" attempt: at least those that reached the
    # receiver (the others of the batch keep sending until the kill lands; test_delivery_isolation
    # shows the never-started ones going uncharged).
    assert len(reached) <= out.recovered_unknown <= len(claimed)
    counts = Counter(k for k, _ in server.keys)
    assert len(counts) == n, "nothing lost"
    duplicated = {k for k, c in counts.items() if c > 1}
    assert duplicated and duplicated <= claimed, "duplicates only for the batches claimed at the kill"
    assert all(k == body_id for k, body_id in server.keys), "every copy carries the same idempotency key"
    assert len(server.keys) - before == unclaimed + len(claimed)
    with engine.connect() as conn:
        assert set(conn.execute(select(alerts.c.status)).scalars()) == {"delivered"}
        unknown = conn.execute(select(delivery_attempts.c.alert_id)
                               .where(delivery_attempts.c.outcome == "unknown")).scalars().all()
    assert len(unknown) == out.recovered_unknown
    engine.dispose()


def test_more_processes_than_cores_are_warned_about(pg_url, recorder, monkeypatch, caplog):
    """delivery.processes: 32 on a 2-core host was accepted in silence and took 2.5x as long as 2."""
    import deadline_pipeline.deliver.sweep as sweep_module

    server, hook = recorder
    engine = make_engine(pg_url)
    upgrade(engine)
    seed(engine, 4, webhook_url=hook)
    monkeypatch.setattr(sweep_module.os, "cpu_count", lambda: 1)
    with caplog.at_level("WARNING", logger="deadline_pipeline.deliver.sweep"):
        out = sweep(engine, _config(processes=2), T0)
    assert out.delivered == 4 and out.processes == 2
    assert any("delivery.processes is 2, but this host has 1 core(s)" in r.getMessage() for r in caplog.records)
    engine.dispose()
