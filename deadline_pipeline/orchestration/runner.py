"""Run the whole chain once, in-process, through the Dagster definitions: ingest → plan → deliver → checks.

Used by ``deadline-pipeline run`` and ``demo``; the runs land in the Dagster instance given (a
persistent ``DAGSTER_HOME``), so ``dagster dev`` shows them afterwards.
"""

from __future__ import annotations

import json
import logging
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


class RunInterrupted(Exception):
    """The chain stopped at an interrupt (Ctrl-C, SIGINT) during the job ``job`` (a Dagster job
    name; None: before the first job started); ``summary``: what the jobs run so far did (the
    interrupted one included). The jobs after it were not started."""

    def __init__(self, job: str | None, summary: RunSummary) -> None:
        super().__init__(f"interrupted during {job}" if job else "interrupted before the first job")
        self.job = job
        self.summary = summary


def _is_interrupt(ev: dg.DagsterEvent | None) -> bool:
    """Whether ``ev`` records an interrupt: a step failed as interrupted, or the run failed as
    terminated unexpectedly (what Dagster records for an interrupt between steps)."""
    if ev is None:
        return False
    data = ev.event_specific_data
    if ev.is_step_failure:
        return getattr(getattr(data, "error_source", None), "value", None) == "INTERRUPT"
    return (ev.event_type == dg.DagsterEventType.RUN_FAILURE
            and getattr(getattr(data, "failure_reason", None), "value", None) == "UNEXPECTED_TERMINATION")


def _interrupted(result: dg.ExecuteInProcessResult) -> bool:
    """Whether the in-process run ``result`` ended at an interrupt. Dagster records it and returns
    normally (``raise_on_error=False``), so the chain went on to the next job after Ctrl-C."""
    return any(_is_interrupt(ev) for ev in result.all_events)


def _not_an_interrupt(record: logging.LogRecord) -> bool:
    """A console log filter: drops the records of interrupt events (:func:`_is_interrupt`). Each
    printed the stack of wherever Ctrl-C landed; the command says it was interrupted in one line."""
    meta = getattr(record, "dagster_meta", None) or {}
    return not _is_interrupt(meta.get("dagster_event"))


@dg.logger({"log_level": dg.Field(str, is_required=False, default_value="WARNING"),
            "name": dg.Field(str, is_required=False, default_value="dagster")},
           description="Dagster's colored console logger, without the records of an interrupt.")
def chain_console_logger(init_context: dg.InitLoggerContext) -> logging.Logger:
    """The console logger of :func:`run_chain`'s runs: Dagster's own (``colored_console_logger``),
    filtered by :func:`_not_an_interrupt`."""
    log = dg.colored_console_logger.logger_fn(init_context)
    log.addFilter(_not_an_interrupt)
    return log


# What earlier versions wrote as the embedded instance's dagster.yaml: replaced by today's.
_EMBEDDED_BEFORE = "# Embedded Dagster instance (SQLite under this folder).\ntelemetry:\n  enabled: false\n"


def _embedded_config(home: Path) -> str:
    """The embedded instance's ``dagster.yaml``: SQLite storage in ``home``; telemetry off, because the
    demo promises to work with no network; step output captured by
    :class:`~deadline_pipeline.orchestration.compute_logs.InterruptibleComputeLogManager` (Dagster's
    local one, whose helper processes printed tracebacks at Ctrl-C) in Dagster's default folder."""
    from deadline_pipeline.orchestration import compute_logs

    return (f"{_EMBEDDED_BEFORE}compute_logs:\n  module: {compute_logs.CONFIG_MODULE}\n"
            f"  class: {compute_logs.CONFIG_CLASS}\n  config:\n    base_dir: {json.dumps(str(home / 'storage'))}\n")


def dagster_instance(home: Path) -> dg.DagsterInstance:
    """A persistent Dagster instance in ``home`` (created if missing), also exported as DAGSTER_HOME so
    that child processes and ``dagster dev`` see the same runs. A ``dagster.yaml`` there is kept as
    it is, unless it is the embedded default of an earlier version (:func:`_embedded_config`)."""
    home = home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists() or config.read_text() == _EMBEDDED_BEFORE:
        config.write_text(_embedded_config(home))
    os.environ["DAGSTER_HOME"] = str(home)
    return dg.DagsterInstance.get()


def run_chain(config_path: str | os.PathLike, *, instance: dg.DagsterInstance, db_url: str | None = None,
              as_of: str | None = None, log_level: str = "WARNING") -> RunSummary:
    """Execute the pipeline job, one delivery sweep and the checks job in-process.

    A failing step does not hide the others' results: every step runs and each failure is listed.
    An interrupt (Ctrl-C) stops the chain instead: raises :class:`RunInterrupted` naming the job it
    interrupted (None: before the first), and the later jobs never start.
    """
    summary = RunSummary(success=True)
    current: list[str | None] = [None]  # the job running, for the interrupt's report
    try:
        _run_jobs(config_path, instance, db_url, as_of, log_level, summary, current)
    except KeyboardInterrupt:
        # Ctrl-C outside a step (loading the definitions, between two jobs): Python's own handler.
        summary.success = False
        raise RunInterrupted(current[0], summary) from None
    return summary


def _run_jobs(config_path, instance: dg.DagsterInstance, db_url: str | None, as_of: str | None, log_level: str,
              summary: RunSummary, current: list[str | None]) -> None:
    """:func:`run_chain`'s work, filling ``summary`` and keeping ``current[0]`` at the job running."""
    defs = build_definitions(config_path, db_url=db_url, as_of=as_of)
    now = ClockResource(as_of=as_of).now()
    horizon = load_config(config_path)[0].plan.horizon_days
    first, last = horizon_range(now, horizon, defs.resolve_job_def(PLAN_JOB).partitions_def)
    for job_name in (INGEST_JOB, PLAN_JOB, DELIVER_JOB, CHECKS_JOB):
        current[0] = job_name
        job = defs.resolve_job_def(job_name).with_logger_defs({"console": chain_console_logger})
        # The console logger repeats every Dagster event at DEBUG; the events stay in the instance.
        result = job.execute_in_process(
            instance=instance, raise_on_error=False,
            run_config={"loggers": {"console": {"config": {"log_level": log_level}}}},
            tags=range_tags(first, last) if job_name == PLAN_JOB else None,
        )
        summary.run_ids[job_name] = result.run_id
        if _interrupted(result):
            summary.success = False
            raise RunInterrupted(job_name, summary)
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


def sweep_counts(instance: dg.DagsterInstance, run_id: str) -> dict[str, int] | None:
    """The integer counts of the last ``alerts`` observation the run ``run_id`` recorded in
    ``instance`` (what its delivery sweep did), or None when it recorded none."""
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION).records
    for record in reversed(records):
        observation = record.event_log_entry.dagster_event.event_specific_data.asset_observation
        if observation.asset_key == dg.AssetKey("alerts"):
            return {k: v.value for k, v in observation.metadata.items() if isinstance(v.value, int)}
    return None
