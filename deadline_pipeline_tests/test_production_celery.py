"""Scale-out of planning on Dagster's own distributed executor: ``celery_executor`` (dagster-celery)
with RabbitMQ as the broker, a ``dagster-celery`` worker on loopback, and a PostgreSQL-backed
instance (workers write their step events to it from another process).

Two plan runs, one per month partition, start at the same time; their steps are executed by the
worker (two worker processes, so the months are planned in parallel) and both months end up
planned in the store.

Skips with a message when the broker (``DEADLINE_TEST_BROKER_URL``, default
``pyamqp://guest:guest@127.0.0.1:5672//``) or dagster-celery is absent, unless
``DEADLINE_REQUIRE_BROKER=1`` (set by ``.ci/run``).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from sqlalchemy import create_engine, func, select

from deadline_pipeline_tests.test_production_daemon import (
    BIN,
    FILING,
    RENEWAL,
    instance_env,
    make_dagster_home,
    process_group,
    production_config,
    require_pg,
    run_errors,
    throwaway_database,
    wait_for,
)

BROKER_URL = os.environ.get("DEADLINE_TEST_BROKER_URL", "pyamqp://guest:guest@127.0.0.1:5672//")

# The code location the worker and the test both import: the project's definitions with the celery
# executor as the default for every asset job. The job is rebuilt from this file in the worker.
CELERY_DEFS = '''
import os

import dagster as dg
from dagster_celery import celery_executor

from deadline_pipeline.orchestration.build import build_definitions

EXECUTOR = celery_executor.configured({
    "broker": os.environ["DEADLINE_CELERY_BROKER"],
    "backend": "rpc://",
})
defs = dg.Definitions.merge(build_definitions(os.environ["DEADLINE_CONFIG"]), dg.Definitions(executor=EXECUTOR))


def plan_job():
    return defs.resolve_job_def("plan_job")
'''


def _require_broker() -> None:
    from urllib.parse import urlsplit

    problems = []
    try:
        import dagster_celery  # noqa: F401
    except ImportError as exc:
        problems.append(f"dagster-celery is not installed ({exc}); pip install -e '.[celery]'")
    parts = urlsplit(BROKER_URL)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), timeout=2).close()
    except OSError as exc:
        problems.append(f"no message broker at {parts.hostname}:{parts.port or 5672}: {exc}")
    if problems:
        msg = "; ".join(problems)
        if os.environ.get("DEADLINE_REQUIRE_BROKER", "") not in ("", "0", "false"):
            pytest.fail(msg)
        pytest.skip(msg)


def test_plan_partitions_in_parallel_on_celery_workers(pg_server, tmp_path, monkeypatch):
    _require_broker()
    admin_url = require_pg(pg_server)
    import dagster as dg
    from dagster import DagsterInstance

    from deadline_pipeline.orchestration.build import INGEST_JOB, build_definitions
    from deadline_pipeline.store.schema import obligations

    work = tmp_path / "work"
    work.mkdir()
    config = production_config(work, [FILING, RENEWAL])
    code = tmp_path / "code"
    code.mkdir()
    (code / "celery_plan_defs.py").write_text(CELERY_DEFS)
    # dagster-celery routes every step to its one queue, "dagster" (bound as "dagster.#"); a queue of
    # another name needs its own binding, so the test uses the default one, as a deployment would.
    worker_config = tmp_path / "celery.yaml"
    worker_config.write_text(yaml.safe_dump({"execution": {"config": {"broker": BROKER_URL, "backend": "rpc://"}}}))

    with throwaway_database(admin_url, "dp_dagster") as dagster_db, \
            throwaway_database(admin_url, "dp_store") as store_url:
        home = make_dagster_home(tmp_path / "dagster_home")
        settings = {**instance_env(dagster_db), "DAGSTER_HOME": str(home), "DEADLINE_CONFIG": str(config),
                    "DEADLINE_DB_URL": store_url, "DEADLINE_HOME": str(work), "DEADLINE_CELERY_BROKER": BROKER_URL}
        for key, value in settings.items():
            monkeypatch.setenv(key, value)
        # dagster-celery execs `celery` from PATH: this virtualenv's, whatever the caller's PATH.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), *sys.path]),
               "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}
        log_path = tmp_path / "worker.log"

        with DagsterInstance.from_config(str(home)) as instance:
            # Rules first (in-process: ingest is not what this test is about).
            defs = build_definitions(config, db_url=store_url)
            assert defs.resolve_job_def(INGEST_JOB).execute_in_process(instance=instance).success

            with process_group(["dagster-celery", "worker", "start", "-A", "dagster_celery.app", "-y",
                                str(worker_config), "-l", "info", "--", "--concurrency", "2"],
                               env, log_path) as worker:
                def ready():
                    if worker.poll() is not None:
                        raise AssertionError(f"the celery worker exited {worker.returncode}:\n"
                                             + log_path.read_text(errors="replace")[-4000:])
                    return "ready" in log_path.read_text(errors="replace")

                wait_for(ready, 120, "the celery worker", log_path=log_path)
                # One process per month (as the daemon would launch them); in-process runs in threads
                # would share Python's logging locks with the run's own log handlers and can deadlock.
                months = ["2027-01-01", "2027-02-01"]
                procs = [subprocess.Popen([str(BIN / "dagster"), "job", "execute", "-f",
                                           str(code / "celery_plan_defs.py"), "-a", "plan_job",
                                           "--tags", json.dumps({"dagster/partition": m})],
                                          cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True) for m in months]
                outputs = [p.communicate(timeout=300)[0] for p in procs]
                runs = {r.tags.get("dagster/partition"): r for r in instance.get_runs(
                    filters=dg.RunsFilter(job_name="plan_job"))}
                assert set(runs) == set(months), (runs, outputs)
                failed = {m: run_errors(instance, r.run_id) for m, r in runs.items()
                          if r.status != dg.DagsterRunStatus.SUCCESS}
                assert not failed, (failed, [o[-3000:] for o in outputs])
                results = {m: (True, r.run_id) for m, r in runs.items()}
                worker_log = log_path.read_text(errors="replace")

            # Every step of both runs went through the broker to the worker.
            for month, (_, run_id) in results.items():
                submitted = [r for r in instance.all_logs(run_id)
                             if r.dagster_event is not None and "Submitting celery task" in (r.message or "")]
                assert submitted, f"run {run_id} ({month}) submitted nothing to celery"
            succeeded = re.findall(r"Task execute_plan\[[0-9a-f-]+\] succeeded", worker_log)
            assert len(succeeded) >= len(results), worker_log[-3000:]

        eng = create_engine(store_url)
        month = func.to_char(obligations.c.due_at, "YYYY-MM")
        with eng.connect() as conn:
            by_month = dict(conn.execute(select(month, func.count()).group_by(month)).all())
        eng.dispose()
        assert by_month == {"2027-01": 1, "2027-02": 1}, by_month
    print(f"celery worker log: {log_path}")
    assert Path(log_path).exists()
