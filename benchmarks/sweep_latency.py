"""Delivery lateness with the real Dagster daemon: sensor → queued run → sweep, on PostgreSQL.

    python benchmarks/sweep_latency.py [--pg URL] [--n 10000] [--window 300] [--quick]

Two throwaway PostgreSQL databases (``--pg`` defaults to ``$DEADLINE_TEST_PG_URL`` or
``postgresql://postgres@127.0.0.1:5432/postgres``): one for the Dagster instance (the repository's
``dagster.yaml`` copied into a temporary ``DAGSTER_HOME``), one for the store. ``N`` reminders are
written straight into the outbox with ``send_at`` spread evenly over a window starting a few
seconds after the daemon starts; they go to a maildir channel. ``dagster-daemon run -w
workspace.yaml`` then does what it does in production: the deliver sensor (30 s interval) asks
whether anything is claimable and launches ``deliver_job`` runs through the queued run coordinator.

Figures, read from the store and the instance once every reminder is delivered (or the timeout hits):

* lateness = ``alerts.delivered_at − alerts.send_at``: p50, p99, max;
* Dagster overhead per delivery run: from the run's creation by the sensor (``create_timestamp``)
  to its first claim (the first ``delivery_attempts.started_at`` whose ``lease_owner`` names the run
  id), split into queue → start (``start_time`` of the run) and start → first claim.

Goal: p99 lateness under the sensor interval (30 s) + 30 s. ``--quick``: 500 reminders over 40 s
(under a minute of waiting; the same figures). The full size is 10,000 over 5 minutes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from sqlalchemy import create_engine, func, insert, select

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BIN, WORKSPACE, instance_env, make_dagster_home, process_group, throwaway_database  # noqa: E402

from deadline_pipeline.store.db import make_engine, upgrade  # noqa: E402
from deadline_pipeline.store.schema import alerts, delivery_attempts, obligations, sources, subscribers  # noqa: E402

SENSOR_INTERVAL = 30
GOAL = SENSOR_INTERVAL + 30
# Seconds between starting the daemon and the first reminder falling due: the daemon's first
# sensor tick comes only after its code server is up, and that is part of production too.
LEAD = 15
BENCH_ICS = ("BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//deadline-pipeline benchmark//EN\r\n"
             "BEGIN:VEVENT\r\nUID:x@bench\r\nDTSTAMP:20260101T000000Z\r\nDTSTART;TZID=UTC:20300101T000000\r\n"
             "SUMMARY:unused\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def seed(store_url: str, n: int, start: datetime, window: float) -> None:
    """``n`` pending reminders of one obligation, ``send_at`` evenly over ``[start, start + window]``."""
    engine = make_engine(store_url)
    upgrade(engine)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        src = conn.execute(insert(sources).values(name="bench", tenant="t", format="ics", location="bench.ics",
                                                  freshness_seconds=86400)).inserted_primary_key[0]
        sub = conn.execute(insert(subscribers).values(external_id="s", tenant="t", email="s@example.org",
                                                      timezone="UTC")).inserted_primary_key[0]
        due = start + timedelta(days=1)
        obl = conn.execute(insert(obligations).values(
            obligation_key=uuid.uuid4().hex, tenant="t", subscriber_id=sub, source_id=src, rule_id="r",
            rule_version=1, period="p", title="A deadline", due_at=due, status="active", planned_at=now,
        )).inserted_primary_key[0]
        step = window / max(n - 1, 1)
        rows = [{"obligation_id": obl, "offset_seconds": -(i + 1), "channel": "box", "kind": "reminder",
                 "dedup_key": uuid.uuid4().hex, "send_at": start + timedelta(seconds=i * step), "status": "pending",
                 "attempts": 0, "created_at": now, "updated_at": now} for i in range(n)]
        for i in range(0, n, 2000):
            conn.execute(insert(alerts), rows[i:i + 2000])
    engine.dispose()


def delivered_count(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(alerts).where(alerts.c.delivered_at.is_not(None))).scalar()


def measure(args) -> int:
    import dagster as dg
    from dagster import DagsterInstance

    tmp = Path(tempfile.mkdtemp(prefix="sweep_latency_"))
    work = tmp / "work"
    work.mkdir()
    # The configuration only has to load: ingest and planning are stopped below, the outbox is seeded.
    (work / "bench.ics").write_text(BENCH_ICS, newline="")
    config = work / "deadlines.yaml"
    config.write_text(yaml.safe_dump({
        "sources": [{"name": "bench", "format": "ics", "location": "bench.ics", "tenant": "t"}],
        "subscribers": [{"id": "s", "tenant": "t", "email": "s@example.org", "timezone": "UTC"}],
        "subscriptions": [{"name": "all", "sources": ["bench"], "offsets": ["-P1D"], "channels": ["box"]}],
        "channels": {"box": {"type": "maildir", "path": str(work / "maildir")}},
    }, sort_keys=False))
    print(f"{args.n} reminders due over {args.window:.0f} s; work folder {tmp}", flush=True)
    with throwaway_database(args.pg, "dp_bench_dagster") as dagster_db, \
            throwaway_database(args.pg, "dp_bench_store") as store_url:
        home = make_dagster_home(tmp / "dagster_home")
        inst_env = instance_env(dagster_db)
        env = {**os.environ, **inst_env, "DAGSTER_HOME": str(home), "DEADLINE_CONFIG": str(config),
               "DEADLINE_DB_URL": store_url, "DEADLINE_HOME": str(work)}
        os.environ.update({**inst_env, "DAGSTER_HOME": str(home)})
        # Only delivery is measured: planning and ingest would rewrite the seeded outbox.
        # Create the instance's tables once, before three processes race to create them.
        DagsterInstance.from_config(str(home)).dispose()
        # (In parallel: each command loads the code location, ~10 s apiece.)
        stops = [subprocess.Popen([str(BIN / "dagster"), kind, "stop", name, "-w", str(WORKSPACE)], cwd=REPO_ROOT,
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for kind, name in (("sensor", "replan_on_revision"), ("schedule", "plan_horizon_hourly"),
                                    ("schedule", "ingest_hourly"))]
        for proc in stops:
            if proc.wait(timeout=180) != 0:
                raise SystemExit(f"{' '.join(map(str, proc.args))} failed: {proc.stderr.read().decode()}")
        start = datetime.now(UTC) + timedelta(seconds=LEAD)
        seed(store_url, args.n, start, args.window)
        store = create_engine(store_url)
        log_path = tmp / "daemon.log"
        with DagsterInstance.from_config(str(home)) as instance, \
                process_group(["dagster-daemon", "run", "-w", str(WORKSPACE)], env, log_path):
            deadline = time.monotonic() + LEAD + args.window + args.timeout
            last = -1
            while time.monotonic() < deadline:
                done = delivered_count(store)
                if done != last:
                    print(f"  {datetime.now(UTC):%H:%M:%S} delivered {done}/{args.n}", flush=True)
                    last = done
                if done >= args.n:
                    break
                time.sleep(2)
            runs = list(instance.get_runs(filters=dg.RunsFilter(job_name="deliver_job")))
            records = {r.dagster_run.run_id: r for r in instance.get_run_records(
                filters=dg.RunsFilter(job_name="deliver_job"))}
        with store.connect() as conn:
            rows = conn.execute(select(alerts.c.send_at, alerts.c.delivered_at)).all()
            firsts = conn.execute(select(delivery_attempts.c.lease_owner, func.min(delivery_attempts.c.started_at))
                                  .group_by(delivery_attempts.c.lease_owner)).all()
        store.dispose()

    late = [(r.delivered_at - r.send_at).total_seconds() for r in rows if r.delivered_at is not None]
    undelivered = len(rows) - len(late)
    # A lease owner is ``host#pid#run_id#c<claim>.<hex>`` (deliver.sweep.lease_owner plus one suffix per
    # claim): a run's first claim is the earliest over its owners.
    first_claim: dict[str, float] = {}
    for owner, first in firsts:
        parts = owner.split("#")
        if len(parts) >= 3:
            first_claim[parts[2]] = min(first_claim.get(parts[2], float("inf")), first.timestamp())
    queue_wait, start_to_claim, overhead = [], [], []
    for run_id, first in first_claim.items():
        rec = records.get(run_id)
        if rec is None or rec.start_time is None:
            continue
        created = rec.create_timestamp.timestamp()
        queue_wait.append(rec.start_time - created)
        start_to_claim.append(first - rec.start_time)
        overhead.append(first - created)
    statuses: dict[str, int] = {}
    for run in runs:
        statuses[run.status.value] = statuses.get(run.status.value, 0) + 1

    print()
    print(f"reminders: {args.n}, delivered {len(late)}, undelivered {undelivered}")
    print(f"deliver_job runs: {len(runs)} {statuses}")
    print(f"lateness (delivered_at - send_at): p50 {pct(late, 0.5):.1f} s, p99 {pct(late, 0.99):.1f} s, "
          f"max {max(late, default=float('nan')):.1f} s")
    print(f"Dagster overhead per delivery run (created by the sensor -> first claim, {len(overhead)} runs): "
          f"p50 {pct(overhead, 0.5):.1f} s, p99 {pct(overhead, 0.99):.1f} s")
    print(f"  of which queued -> started: p50 {pct(queue_wait, 0.5):.1f} s, p99 {pct(queue_wait, 0.99):.1f} s; "
          f"started -> first claim: p50 {pct(start_to_claim, 0.5):.1f} s, p99 {pct(start_to_claim, 0.99):.1f} s")
    ok = undelivered == 0 and pct(late, 0.99) < GOAL
    print(f"goal p99 lateness < {GOAL} s (sensor interval {SENSOR_INTERVAL} s + 30 s): {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", default=os.environ.get("DEADLINE_TEST_PG_URL",
                                                       "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--n", type=int, default=None, help="reminders (10,000; --quick: 500)")
    parser.add_argument("--window", type=float, default=None, help="seconds over which they fall due (300; quick 40)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds to wait after the window for the last delivery (120; quick: 45)")
    parser.add_argument("--quick", action="store_true", help="500 reminders over 40 s, under a minute of waiting")
    args = parser.parse_args()
    args.n = args.n or (500 if args.quick else 10_000)
    args.window = args.window if args.window is not None else (40.0 if args.quick else 300.0)
    args.timeout = args.timeout if args.timeout is not None else (45.0 if args.quick else 120.0)
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
