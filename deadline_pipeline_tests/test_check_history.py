"""The asset check history Dagster shows: one row per real evaluation (no "Skipped" rows planned by
partitioned planning runs), each carrying the instant it judged."""

from __future__ import annotations

from datetime import datetime

import dagster as dg
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from deadline_pipeline.orchestration.build import build_definitions
from deadline_pipeline.orchestration.runner import run_chain
from deadline_pipeline_tests.test_watch_checks import setup_config

AS_OF = ["2027-01-10T00:00:00Z", "2027-01-10T01:00:00Z"]


def test_check_history_has_one_evaluated_row_per_run_and_the_instant_judged(tmp_path):
    _, path = setup_config(tmp_path)
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    with dg.instance_for_test() as instance:
        for as_of in AS_OF:
            assert run_chain(path, instance=instance, db_url=url, as_of=as_of).success
        repo = build_definitions(path, db_url=url).get_repository_def()
        for key in repo.asset_checks_defs_by_key:
            history = instance.event_log_storage.get_asset_check_execution_history(key, limit=50)
            statuses = [h.status for h in history]
            # A planned-but-never-run row (the UI's "Skipped") came from the partitioned plan runs.
            assert AssetCheckExecutionRecordStatus.PLANNED not in statuses, (key, statuses)
            assert len(history) == len(AS_OF), (key, statuses)
            judged = sorted(h.event.asset_check_evaluation.metadata["evaluated_at"].value for h in history)
            assert judged == [datetime.fromisoformat(a.replace("Z", "+00:00")).timestamp() for a in AS_OF]
        plan_runs = instance.get_runs(filters=dg.RunsFilter(job_name="plan_job"))
        assert plan_runs and all(r.status == dg.DagsterRunStatus.SUCCESS for r in plan_runs)
