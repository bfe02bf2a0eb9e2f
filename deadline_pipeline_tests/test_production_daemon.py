"""Production on Dagster, end to end: ``dagster-daemon run`` against a PostgreSQL-backed instance
configured by the repository's own ``dagster.yaml``.

What it proves, with nothing run in-process:

1. the ingest job launched through the queued run coordinator is dequeued and run by the daemon;
2. ``dagster job backfill`` of a range of plan partitions completes (the backfill daemon submits the
   runs, the queue starts them) and plans those months;
3. the deliver sensor notices the claimable reminder on its own and launches a delivery run that
   writes the mail;
4. the revision workflow of docs/operating.md ("Backfills after a rule revision"): a source is
   revised, the ``rule_versions`` materialization names the stale months (``affected_partitions``),
   a backfill of exactly those re-plans them;
5. the daemon and every process it started are gone afterwards.

The helpers (throwaway databases, a Dagster home, process groups from ``benchmarks/_common.py``;
polling and the production configuration here) are shared with the celery and UI tests.
"""

from __future__ import annotations

import mailbox
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from deadline_pipeline_tests.factories import ics, write_config

REPO_ROOT = Path(__file__).resolve().parents[1]
# The process helpers live with the benchmarks, which drive the same Dagster processes and may not
# import the test suite; re-exported here for the celery and UI tests.
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
from _common import (  # noqa: E402
    BIN,
    WORKSPACE,
    group_alive,
    instance_env,
    make_dagster_home,
    process_group,
    stop_process_group,
    throwaway_database,
)

__all__ = ["BIN", "WORKSPACE", "group_alive", "instance_env", "make_dagster_home", "process_group",
           "stop_process_group", "throwaway_database"]


# --------------------------------------------------------------------------- shared helpers


def cli(args: list[str], env: dict[str, str], *, timeout: float = 180, check: bool = True) -> str:
    """Run a Dagster console script from this virtualenv in the repository root; return its output."""
    proc = subprocess.run([str(BIN / args[0]), *args[1:]], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr


def wait_for(predicate: Callable[[], object], timeout: float, what: str, *, interval: float = 1.0,
             log_path: Path | None = None):
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` (and the log tail)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = ""
            if log_path is not None and log_path.exists():
                tail = "\n--- log tail ---\n" + log_path.read_text(errors="replace")[-4000:]
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{tail}")
        time.sleep(interval)


def runs_of(instance, job_name: str, statuses=None, tags: dict | None = None) -> list:
    import dagster as dg

    return list(instance.get_runs(filters=dg.RunsFilter(job_name=job_name, statuses=statuses, tags=tags or {})))


def failed_runs(instance) -> list:
    import dagster as dg

    return list(instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE])))


def run_errors(instance, run_id: str) -> list[str]:
    """The error messages a run logged (step failures and run failure), for assertion messages."""
    out = []
    for record in instance.all_logs(run_id):
        dagster_event = record.dagster_event
        if dagster_event is not None and dagster_event.is_failure:
            data = dagster_event.event_specific_data
            err = getattr(data, "error", None)
            out.append(f"{dagster_event.event_type_value}: {err.to_string() if err else dagster_event.message}")
    return out


def require_pg(pg_server: str) -> str:
    """Also needs dagster-postgres importable (the instance storage); same skip rule as the server."""
    try:
        import dagster_postgres  # noqa: F401
    except ImportError as exc:
        msg = f"dagster-postgres is not installed: {exc}"
        if os.environ.get("DEADLINE_REQUIRE_PG", "") not in ("", "0", "false"):
            pytest.fail(msg)
        pytest.skip(msg)
    return pg_server


# --------------------------------------------------------------------------- the test

# Two deadlines in months the backfill covers. The reminder offset is computed from the real clock
# so that the January deadline has exactly one reminder already due when the test runs.
FILING = dict(uid="filing@prod-test", tzid="Europe/Berlin", dtstart="20270115T120000", summary="Annual filing")
RENEWAL = dict(uid="renewal@prod-test", tzid="Europe/Berlin", dtstart="20270212T090000", summary="Licence renewal")
FILING_DUE = datetime(2027, 1, 15, 11, 0, tzinfo=UTC)


def production_config(folder: Path, events: list[dict], *, now: datetime | None = None) -> Path:
    now = now or datetime.now(UTC)
    # The reminder of the filing deadline fell due a few hours ago; it must go out at once.
    days = (FILING_DUE - now).days + 1
    (folder / "cal.ics").write_text(ics(*events), newline="")
    return write_config(
        folder,
        sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t1"}],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "Europe/Berlin"}],
        subscriptions=[{"name": "everything", "sources": ["cal"], "offsets": [f"-P{days}D"], "channels": ["box"]}],
        channels={"box": {"type": "maildir", "path": str(folder / "maildir")}},
    )


def _latest_materialization_metadata(instance, key: str) -> dict:
    import dagster as dg

    event = instance.get_latest_materialization_event(dg.AssetKey(key))
    assert event is not None, f"{key} was never materialized"
    return event.asset_materialization.metadata


def _wait_backfill(instance, backfill_id: str, log_path: Path, timeout: float = 240):
    from dagster._core.execution.backfill import BulkActionStatus

    def done():
        backfill = instance.get_backfill(backfill_id)
        if backfill.status in (BulkActionStatus.FAILED, BulkActionStatus.CANCELED):
            raise AssertionError(f"backfill {backfill_id} ended {backfill.status}: {backfill.error}")
        return backfill.status == BulkActionStatus.COMPLETED_SUCCESS or backfill.status == BulkActionStatus.COMPLETED

    wait_for(done, timeout, f"backfill {backfill_id} to complete", log_path=log_path)


def _backfill(env: dict[str, str], instance, partitions: list[str], log_path: Path) -> list:
    """``dagster job backfill`` of ``partitions`` of plan_job; waits until it and its runs succeeded."""
    import dagster as dg

    before = {b.backfill_id for b in instance.get_backfills()}
    cli(["dagster", "job", "backfill", "-w", str(WORKSPACE), "-j", "plan_job",
         "--partitions", ",".join(partitions), "--noprompt"], env)
    new = [b for b in instance.get_backfills() if b.backfill_id not in before]
    assert len(new) == 1, f"expected one new backfill, found {[b.backfill_id for b in new]}"
    backfill_id = new[0].backfill_id
    _wait_backfill(instance, backfill_id, log_path)
    runs = runs_of(instance, "plan_job", tags={"dagster/backfill": backfill_id})

    def all_finished():
        statuses = {r.status for r in runs_of(instance, "plan_job", tags={"dagster/backfill": backfill_id})}
        return statuses and statuses <= {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE,
                                         dg.DagsterRunStatus.CANCELED}

    wait_for(all_finished, 180, f"the runs of backfill {backfill_id}", log_path=log_path)
    runs = runs_of(instance, "plan_job", tags={"dagster/backfill": backfill_id})
    assert runs and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs), \
        [(r.run_id, r.status, run_errors(instance, r.run_id)) for r in runs]
    # The queue's `stage: plan` limit in dagster.yaml only holds backfill runs back if they carry the tag.
    assert all(r.tags.get("stage") == "plan" for r in runs), [r.tags for r in runs]
    return runs


def _due_by_rule(store_url: str) -> dict[str, datetime]:
    from deadline_pipeline.store.schema import obligations

    eng = create_engine(store_url)
    try:
        with eng.connect() as conn:
            rows = conn.execute(select(obligations.c.rule_id, obligations.c.due_at, obligations.c.status)).all()
    finally:
        eng.dispose()
    return {r.rule_id: r.due_at for r in rows if r.status == "active"}


def test_daemon_sensor_delivers_and_backfill_replans(pg_server, tmp_path, monkeypatch):
    import dagster as dg
    from dagster import DagsterInstance

    admin_url = require_pg(pg_server)
    work = tmp_path / "work"
    work.mkdir()
    config = production_config(work, [FILING, RENEWAL])
    log_path = tmp_path / "daemon.log"

    with throwaway_database(admin_url, "dp_dagster") as dagster_db, \
            throwaway_database(admin_url, "dp_store") as store_url:
        home = make_dagster_home(tmp_path / "dagster_home")
        env = {**os.environ, **instance_env(dagster_db), "DAGSTER_HOME": str(home), "DEADLINE_CONFIG": str(config),
               "DEADLINE_DB_URL": store_url, "DEADLINE_HOME": str(work), "PYTHONUNBUFFERED": "1"}
        for key in ("DAGSTER_HOME", *instance_env(dagster_db)):
            monkeypatch.setenv(key, env[key])

        # Planning in this test must come from the backfills alone, so that they are what is proved:
        # the revision sensor and the hourly horizon schedule would otherwise plan the same months.
        cli(["dagster", "sensor", "stop", "replan_on_revision", "-w", str(WORKSPACE)], env)
        cli(["dagster", "schedule", "stop", "plan_horizon_hourly", "-w", str(WORKSPACE)], env)

        with DagsterInstance.from_config(str(home)) as instance, \
                process_group(["dagster-daemon", "run", "-w", str(WORKSPACE)], env, log_path) as daemon:
            assert "Postgres" in type(instance.run_storage).__name__, type(instance.run_storage)

            t0 = time.monotonic()

            def step(what: str) -> None:  # timings, printed with -s: where the minutes of this test go
                print(f"[{time.monotonic() - t0:6.1f} s] {what}", flush=True)

            # 1. Ingest, through the queue: only the daemon can start it.
            cli(["dagster", "job", "launch", "-w", str(WORKSPACE), "-j", "ingest_job"], env)
            ingest = wait_for(lambda: runs_of(instance, "ingest_job", [dg.DagsterRunStatus.SUCCESS]), 180,
                              "ingest_job to succeed", log_path=log_path)
            assert ingest and not failed_runs(instance), [run_errors(instance, r.run_id) for r in failed_runs(instance)]
            assert _due_by_rule(store_url) == {}, "something planned before the backfill"

            step("ingested")
            # 2. Backfill January..February 2027.
            _backfill(env, instance, ["2027-01-01", "2027-02-01"], log_path)
            planned = _due_by_rule(store_url)
            assert len(planned) == 2, planned
            assert min(planned.values()) == FILING_DUE

            step("backfill completed")
            # 3. The deliver sensor launches a sweep on its own; the mail lands.
            wait_for(lambda: runs_of(instance, "deliver_job", [dg.DagsterRunStatus.SUCCESS]), 180,
                     "the deliver sensor's run to succeed", log_path=log_path)
            box = mailbox.Maildir(work / "maildir")
            messages = wait_for(lambda: list(box), 30, "mail in the maildir", log_path=log_path)
            assert len(messages) == 1 and "Annual filing" in str(messages[0]["Subject"]), \
                [m["Subject"] for m in messages]
            sweep_run = runs_of(instance, "deliver_job", [dg.DagsterRunStatus.SUCCESS])[-1]
            assert sweep_run.tags.get("stage") == "deliver"
            assert sweep_run.tags.get("dagster/sensor_name") == "deliver_sensor", sweep_run.tags

            step("sweep delivered")
            # 4. The source is revised: the renewal moves by a week. Ingest names the stale month,
            # and a backfill of exactly that month re-plans it.
            moved = {**RENEWAL, "dtstart": "20270219T090000"}
            (work / "cal.ics").write_text(ics(FILING, moved), newline="")
            cli(["dagster", "job", "launch", "-w", str(WORKSPACE), "-j", "ingest_job"], env)
            wait_for(lambda: len(runs_of(instance, "ingest_job", [dg.DagsterRunStatus.SUCCESS])) == 2, 180,
                     "the second ingest_job run to succeed", log_path=log_path)
            meta = _latest_materialization_metadata(instance, "rule_versions")
            stale = list(meta["affected_partitions"].value)
            assert stale == ["2027-02-01"], stale
            assert meta["changed"].value == 1, {k: v.value for k, v in meta.items()}
            _backfill(env, instance, stale, log_path)
            renewal_due = _due_by_rule(store_url)["renewal@prod-test"]
            assert renewal_due == datetime(2027, 2, 19, 8, 0, tzinfo=UTC), renewal_due
            assert not failed_runs(instance), [(r.job_name, r.run_id) for r in failed_runs(instance)]

            step("revision re-planned")
            pgid = daemon.pid
        # process_group stopped the daemon and all its children.
        assert not group_alive(pgid)
    print(f"daemon log: {log_path}")
