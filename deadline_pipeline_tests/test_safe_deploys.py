"""Deploys with real processes on a real store.

* Two processes opening a fresh store at the same instant both migrate it without error (the
  migration lock).
* A rolling deploy: sweepers of the previous release (the code at :data:`PREVIOUS_RELEASE`, taken
  from this repository's history with ``git archive``) deliver from a PostgreSQL store while the
  store is migrated to this release and this release's sweepers start; one old sweeper is SIGKILLed
  mid-run. Nothing is lost, and an alert is sent twice only if it was in the killed sweeper's batch.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sqlalchemy import select

from deadline_pipeline.store.db import make_engine, upgrade
from deadline_pipeline.store.schema import alerts
from deadline_pipeline_tests.conftest import REPO_ROOT
from deadline_pipeline_tests.test_delivery_sweep import seed

# The release before leases on the database clock, per-claim lease owners and migration 0007.
PREVIOUS_RELEASE = "6a72c9e"


def _env(code_root: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(code_root)}


# --------------------------------------------------------------------------- concurrent first use

OPEN_STORE = textwrap.dedent("""
    import sys
    import alembic.command, alembic.config, alembic.runtime.migration, psycopg  # imports done before "go"
    from deadline_pipeline.store.db import get_engine
    print("ready", flush=True)
    sys.stdin.readline()  # both processes begin at the same instant
    get_engine(sys.argv[1])
""")


@pytest.mark.parametrize("engine_kind", ["postgresql", "sqlite"])
def test_two_processes_opening_a_fresh_store_at_once_both_succeed(request, tmp_path, engine_kind):
    """Without the lock one of the two exited 2 with a duplicate-key error from the catalog."""
    for round_ in range(3):
        if engine_kind == "postgresql":
            url = _fresh_pg(request)
        else:
            url = f"sqlite:///{tmp_path / f'store{round_}.sqlite3'}"
        procs = [subprocess.Popen([sys.executable, "-c", OPEN_STORE, url], env=_env(REPO_ROOT), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        assert [p.stdout.readline().strip() for p in procs] == ["ready", "ready"]
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [(p.wait(120), p.stderr.read()) for p in procs]
        assert [code for code, _ in results] == [0, 0], results
        eng = make_engine(url)
        with eng.connect() as conn:
            assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all() == [_head()]
        eng.dispose()


def _fresh_pg(request) -> str:
    # A new empty database per round (pg_url is one per test).
    import uuid

    from sqlalchemy.engine import make_url

    from deadline_pipeline.store.db import normalise_url
    from deadline_pipeline_tests.conftest import _pg_admin_engine

    name = f"dp_test_{uuid.uuid4().hex[:12]}"
    admin = _pg_admin_engine()
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')

    def drop():
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

    request.addfinalizer(drop)
    return make_url(normalise_url(request.getfixturevalue("pg_server"))).set(database=name) \
        .render_as_string(hide_password=False)


# --------------------------------------------------------------------------- rolling deploy

SWEEPER = textwrap.dedent("""
    # One delivery worker, written against the API both releases share: sweep until no alert is
    # left open (or a stop file appears), one short sweep after another, like the sensor does.
    import sys, time
    from datetime import UTC, datetime
    from sqlalchemy import func, select
    from deadline_pipeline.config import DeadlinesConfig, WebhookChannel
    from deadline_pipeline.deliver.sweep import SweepFailed, sweep
    from deadline_pipeline.store.db import make_engine
    from deadline_pipeline.store.schema import alerts

    url, stop_file = sys.argv[1], sys.argv[2]
    # The newer release refuses loopback targets unless the configuration admits them; the older
    # one has no such key (and refuses unknown keys).
    extra = {"network": {"allow": ["127.0.0.1/32"]}} if "network" in DeadlinesConfig.model_fields else {}
    cfg = DeadlinesConfig(channels={"hook": WebhookChannel(type="webhook", timeout_seconds=2, max_concurrency=4)},
                          delivery={"batch_size": 10, "lease_seconds": 10, "time_budget_seconds": 2}, **extra)
    engine = make_engine(url)
    print("ready", flush=True)
    while True:
        import os
        if os.path.exists(stop_file):
            break
        with engine.connect() as conn:
            left = conn.execute(select(func.count()).select_from(alerts)
                                .where(alerts.c.status != "delivered")).scalar_one()
        if not left:
            break
        now = lambda: datetime.now(UTC)
        try:
            sweep(engine, cfg, now(), clock=now)
        except SweepFailed as exc:  # e.g. a batch blocked behind the migration's lock: next sweep
            print("sweep failed:", exc, flush=True)
        time.sleep(0.05)
""")


class Receiver(BaseHTTPRequestHandler):
    """Counts each Idempotency-Key and answers 200 after 50 ms (so the work spans the deploy)."""

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        time.sleep(0.05)
        with self.server.lock:
            self.server.keys.append(self.headers["Idempotency-Key"])
        body = json.dumps({"id": "ok"}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the killed sweeper's connections
            pass


def _previous_release(tmp_path: Path) -> Path:
    """The package of :data:`PREVIOUS_RELEASE`, extracted with ``git archive`` (skip if unavailable)."""
    try:
        data = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "--format=tar", PREVIOUS_RELEASE,
                               "deadline_pipeline"], check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the previous release {PREVIOUS_RELEASE} is not in this checkout's history: {exc}")
    root = tmp_path / "previous"
    root.mkdir()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(root, filter="data")
    return root


def test_rolling_deploy_old_and_new_sweepers_share_a_migrating_store(pg_url, tmp_path):
    old_code = _previous_release(tmp_path)
    engine = make_engine(pg_url)
    upgrade(engine, "0005")  # the previous release's schema
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    server.daemon_threads = True
    server.keys, server.lock = [], threading.Lock()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{server.server_address[1]}/hook"
    n = 1200
    now = datetime.now(UTC)
    for _ in range(12):
        seed(engine, n // 12, webhook_url=hook, send_at=now - timedelta(minutes=1))
    script = tmp_path / "sweeper.py"
    script.write_text(SWEEPER)
    stop = tmp_path / "stop"

    def start(code_root: Path) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, str(script), pg_url, str(stop)], env=_env(code_root),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert p.stdout.readline().strip() == "ready", "the sweeper started"
        return p

    procs: list[subprocess.Popen] = []
    try:
        old = [start(old_code), start(old_code)]
        procs += old
        while len(server.keys) < 60:  # the old release is delivering
            time.sleep(0.05)
        migrate = subprocess.run([sys.executable, "-c", "import sys; from deadline_pipeline.store.db import upgrade; "
                                  "upgrade(sys.argv[1])", pg_url], env=_env(REPO_ROOT), capture_output=True,
                                 text=True, timeout=120)
        assert migrate.returncode == 0, migrate.stderr
        procs += [start(REPO_ROOT), start(REPO_ROOT)]
        # Kill one old sweeper mid-batch (while it holds a claim); remember what it held.
        held = alerts.c.lease_owner.like(f"%#{old[0].pid}#%") & (alerts.c.status == "claimed")
        for _ in range(400):
            with engine.connect() as conn:
                if conn.execute(select(alerts.c.id).where(held).limit(1)).first():
                    break
            time.sleep(0.005)
        os.kill(old[0].pid, signal.SIGKILL)
        old[0].wait(10)
        with engine.connect() as conn:
            killed_batch = set(conn.execute(select(alerts.c.dedup_key).where(held)).scalars())
        assert killed_batch, "the old sweeper was killed holding a batch"
        assert len(server.keys) < n, "the old release was still delivering when the new one started"
        deadline = time.time() + 120
        while time.time() < deadline:
            with engine.connect() as conn:
                left = conn.execute(select(alerts.c.id).where(alerts.c.status != "delivered")).all()
            if not left:
                break
            time.sleep(0.5)
        stop.touch()
        for p in procs[1:]:
            p.wait(60)
        outputs = {p.pid: p.stdout.read() for p in procs[1:]}
    finally:
        stop.touch()
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.shutdown()
        server.server_close()
    with engine.connect() as conn:
        statuses = Counter(conn.execute(select(alerts.c.status)).scalars())
        version = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar_one()
    engine.dispose()
    counts = Counter(server.keys)
    duplicated = {k for k, c in counts.items() if c > 1}
    assert version == _head()
    assert statuses == {"delivered": n}, (statuses, outputs)
    assert len(counts) == n, "0 lost"
    assert duplicated <= killed_batch, f"duplicates outside the killed batch: {duplicated - killed_batch}"
    assert all(p.returncode == 0 for p in procs[1:]), outputs


def _head() -> str:
    """The newest migration revision of this checkout (the one a fresh store ends at)."""
    from alembic.script import ScriptDirectory

    from deadline_pipeline.store.db import alembic_config

    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
