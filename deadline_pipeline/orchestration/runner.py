"""Run the whole chain once, in-process, through the Dagster definitions: ingest → plan → deliver → checks.

Used by ``deadline-pipeline run`` and ``demo``; the runs land in the Dagster instance given (a
persistent ``DAGSTER_HOME``), so ``dagster dev`` shows them afterwards.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from deadline_pipeline.config import load_config
from deadline_pipeline.orchestration.build import CHECKS_JOB, INGEST_JOB, build_definitions
from deadline_pipeline.orchestration.deliver import DELIVER_JOB
from deadline_pipeline.orchestration.planning import PLAN_JOB, horizon_range, range_tags
from deadline_pipeline.orchestration.resources import ClockResource


@dataclass
class RunSummary:
    """What one chain run did; ``checks`` maps check name → (passed, description).

    ``delivery``: the counts this chain's own delivery sweep recorded (the ``alerts`` observation of
    its ``deliver_job`` run, read back from the Dagster instance: ``sent``, ``failed``, ``escalated``,
    ``escalation_notices``, ``escalation_notice_failures``, …, integers), or None when that run
    recorded none (it failed before sweeping). Exact for this run, whatever else writes to the store.
    """

    success: bool
    run_ids: dict[str, str] = field(default_factory=dict)
    checks: dict[str, tuple[bool, str]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    delivery: dict[str, int] | None = None


def dagster_instance(home: Path) -> dg.DagsterInstance:
    """A persistent Dagster instance in ``home`` (created if missing), also exported as DAGSTER_HOME so
    that child processes and ``dagster dev`` see the same runs."""
    home = home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        # The embedded default: SQLite storage in this folder. Telemetry off, because the demo
        # promises to work with no network.
        config.write_text("# Embedded Dagster instance (SQLite under this folder).\ntelemetry:\n  enabled: false\n")
    os.environ["DAGSTER_HOME"] = str(home)
    return dg.DagsterInstance.get()


def run_chain(config_path: str | os.PathLike, *, instance: dg.DagsterInstance, db_url: str | None = None,
              as_of: str | None = None, log_level: str = "WARNING") -> RunSummary:
    """Execute the pipeline job, one delivery sweep and the checks job in-process.

    A failing step does not hide the others' results: every step runs and each failure is listed.
    """
    defs = build_definitions(config_path, db_url=db_url, as_of=as_of)
    summary = RunSummary(success=True)
    now = ClockResource(as_of=as_of).now()
    horizon = load_config(config_path)[0].plan.horizon_days
    first, last = horizon_range(now, horizon, defs.resolve_job_def(PLAN_JOB).partitions_def)
    for job_name in (INGEST_JOB, PLAN_JOB, DELIVER_JOB, CHECKS_JOB):
        job = defs.resolve_job_def(job_name)
        # The console logger repeats every Dagster event at DEBUG; the events stay in the instance.
        result = job.execute_in_process(
            instance=instance, raise_on_error=False,
            run_config={"loggers": {"console": {"config": {"log_level": log_level}}}},
            tags=range_tags(first, last) if job_name == PLAN_JOB else None,
        )
        summary.run_ids[job_name] = result.run_id
        if not result.success:
            summary.success = False
            for ev in result.all_events:
                if ev.is_step_failure:
                    summary.failures.append(f"{job_name}/{ev.step_key}: {ev.event_specific_data.error.message}")
        for ev in result.all_events:
            if ev.event_type_value == "ASSET_CHECK_EVALUATION":
                data = ev.event_specific_data
                key = data.check_name
                if data.asset_key.path[0] in ("source", "snapshot"):  # one check per source: name it
                    key = f"{key}[{data.asset_key.path[-1]}]"
                summary.checks[key] = (data.passed, data.description or "")
    summary.delivery = sweep_counts(instance, summary.run_ids[DELIVER_JOB])
    return summary


def sweep_counts(instance: dg.DagsterInstance, run_id: str) -> dict[str, int] | None:
    """The integer counts of the last ``alerts`` observation the run ``run_id`` recorded in
    ``instance`` (what its delivery sweep did), or None when it recorded none."""
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION).records
    for record in reversed(records):
        observation = record.event_log_entry.dagster_event.event_specific_data.asset_observation
        if observation.asset_key == dg.AssetKey("alerts"):
            return {k: v.value for k, v in observation.metadata.items() if isinstance(v.value, int)}
    return None
