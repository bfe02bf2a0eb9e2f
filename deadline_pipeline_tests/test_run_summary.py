"""What ``run`` and the watchers say about one run's delivery, with real runs (CLI, Dagster, SQLite and
PostgreSQL, loopback receivers): escalation notices that could not be sent are named by the run's
summary, the ``deliver`` heartbeat (``status``) and the watchdog; the run's sent / failed /
escalated figures are its own sweep's, not the store's growth while another sweep delivered.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from deadline_pipeline.cli import main, this_run_text
from deadline_pipeline.config import load_config
from deadline_pipeline.deliver.sweep import sweep
from deadline_pipeline.store.db import make_engine
from deadline_pipeline.store.schema import alerts, obligations, subscribers
from deadline_pipeline_tests.factories import LOOPBACK_NETWORK, free_port, ics, write_config

# Due 2027-01-15 11:00 UTC.
EVENT = dict(uid="report@test", tzid="Europe/Berlin", dtstart="20270115T120000", summary="Quarterly report")


def _cli(args, tmp_path):
    env = {"DEADLINE_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    return CliRunner().invoke(main, args, env=env)


def test_unsent_escalation_notices_are_named_by_run_status_and_watchdog(tmp_path):
    """A reminder whose deadline passed is escalated; the on-call's SMTP server does not answer, so
    its notice fails. Before, only the Dagster observation counted it: ``run``, ``status`` and the
    watchdog read as if the on-call had been told."""
    (tmp_path / "cal.ics").write_text(ics(EVENT), newline="")
    path = write_config(
        tmp_path,
        sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t1"}],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "Europe/Berlin"}],
        subscriptions=[{"name": "all", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")},
                  "oncall": {"type": "smtp", "host": "127.0.0.1", "port": free_port(), "timeout_seconds": 2,
                             "sender": "pipeline@example.org"}},
        escalation={"channels": ["oncall"], "email": "oncall@example.org"},
    )
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    planned = _cli(["run", "--config", str(path), "--db-url", url, "--as-of", "2027-01-10T00:00:00Z"], tmp_path)
    assert planned.exit_code == 0, planned.output
    assert "escalation notice" not in planned.output
    # The reminder (due 2027-01-14 11:00) was never sent, and the deadline has passed: escalated.
    late = "2027-01-15T12:00:00Z"
    res = _cli(["run", "--config", str(path), "--db-url", url, "--as-of", late], tmp_path)
    assert res.exit_code == 1, res.output  # escalations_acknowledged is red
    assert "this run: sent 0, failed attempts 0, escalated 1" in res.output
    assert ("WARNING: 1 escalation notice(s) could not be sent this run: the on-call was not told of those "
            "escalated alerts") in res.output
    assert "`deadline-pipeline alerts acknowledge ID`" in res.output

    status = _cli(["status", "--db-url", url, "--as-of", late], tmp_path)
    assert status.exit_code == 0, status.output
    beat = next(ln for ln in status.output.splitlines() if ln.strip().startswith("deliver "))
    assert "notices_failed" in beat and "escalated 1," in beat, beat
    assert "escalation notices not sent 1 of 1" in beat, beat

    watchdog = _cli(["watchdog", "--config", str(path), "--db-url", url, "--as-of", late], tmp_path)
    row = next(ln for ln in watchdog.output.splitlines() if "escalations_acknowledged" in ln)
    assert row.startswith("FAIL") and "1 escalated alert(s) not acknowledged" in row, row
    assert "could not send every escalation notice, so the on-call may not know" in row, row
    assert "escalation notices not sent 1 of 1" in row, row


class _Receiver(BaseHTTPRequestHandler):
    """``/hold``: says it arrived (``server.arrived``), answers 200 only once ``server.release`` is
    set; ``/ok``: 200; ``/gone``: 410 (a permanent failure: escalated)."""

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == "/hold":
            self.server.arrived.set()
            self.server.release.wait(60)
        status = 410 if self.path == "/gone" else 200
        body = b'{"id": "evt"}' if status == 200 else b"gone"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def receiver():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.daemon_threads = True
    server.arrived, server.release = threading.Event(), threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def test_run_counts_its_own_sweep_not_another_sweep_meanwhile(tmp_path, pg_url, receiver):
    """``run`` at T1 sends ann's reminder, which its receiver holds; meanwhile another sweep on the
    same store (at T2, where bob's and carol's reminders are due) sends bob's and escalates carol's
    after a 410. The run's line says 1 sent, 0 failed, 0 escalated: its own sweep's counts, read
    from its Dagster run. Before, store differences said 2 sent, 1 failed, 1 escalated."""
    (tmp_path / "cal.ics").write_text(ics(EVENT), newline="")
    base = f"http://127.0.0.1:{receiver.server_address[1]}"
    path = write_config(
        tmp_path,
        sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t1"}],
        subscribers=[{"id": i, "tenant": "t1", "webhook_url": f"{base}/{p}", "timezone": "Europe/Berlin"}
                     for i, p in (("ann", "hold"), ("bob", "ok"), ("carol", "gone"))],
        # ann's reminder is due at 2027-01-13 11:00, bob's and carol's at 2027-01-14 11:00.
        subscriptions=[{"name": "early", "subscribers": ["ann"], "sources": ["cal"], "offsets": ["-P2D"],
                        "channels": ["hook"]},
                       {"name": "late", "subscribers": ["bob", "carol"], "sources": ["cal"], "offsets": ["-P1D"],
                        "channels": ["hook"]}],
        channels={"hook": {"type": "webhook", "timeout_seconds": 90}},
        network=LOOPBACK_NETWORK,
    )
    planned = _cli(["run", "--config", str(path), "--db-url", pg_url, "--as-of", "2027-01-10T00:00:00Z"], tmp_path)
    assert planned.exit_code == 0, planned.output
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"} | {
        "DEADLINE_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    run = subprocess.Popen([sys.executable, "-m", "deadline_pipeline.cli", "run", "--config", str(path),
                            "--db-url", pg_url, "--as-of", "2027-01-13T12:00:00Z"],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert receiver.arrived.wait(240), "the run's sweep never sent ann's reminder"
        # The run is between its before and after snapshots, holding ann's lease: another sweep.
        engine = make_engine(pg_url)
        other = sweep(engine, load_config(path)[0], datetime(2027, 1, 14, 12, tzinfo=UTC))
        assert (other.delivered, other.failed, other.escalated) == (1, 1, 1)
        receiver.release.set()
        out, err = run.communicate(timeout=300)
    finally:
        receiver.release.set()
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode in (0, 1), err + out  # 1: carol's escalation is not acknowledged
    assert "this run: sent 1, failed attempts 0, escalated 0" in out, out
    # The planning figures are labelled as what they are.
    assert "store grew by (every writer during the run, this one included): rule versions 0, obligations 0, " \
           "alerts 0" in out, out
    with engine.connect() as conn:
        states = dict(conn.execute(select(subscribers.c.external_id, alerts.c.status)
                                   .join(obligations, obligations.c.id == alerts.c.obligation_id)
                                   .join(subscribers, subscribers.c.id == obligations.c.subscriber_id)).all())
    engine.dispose()
    assert states == {"ann": "delivered", "bob": "delivered", "carol": "escalated"}


def test_a_delivery_step_that_recorded_nothing_is_said():
    """No ``alerts`` observation in the deliver run (it failed before recording): the line says so
    instead of printing zeros, and the store's growth is still given, labelled as such."""
    text = this_run_text(None, {"rule_versions": 1, "obligations": 2, "alerts": 3},
                         {"rule_versions": 4, "obligations": 2, "alerts": 5})
    assert text.splitlines() == [
        "this run: its delivery sweep recorded no counts (the delivery step failed without recording them; "
        "see the failed step below)",
        "store grew by (every writer during the run, this one included): rule versions 3, obligations 0, alerts 2"]
