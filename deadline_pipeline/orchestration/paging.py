"""The paging sensor: failed checks and failed runs of this code location, announced on the
escalation channels once per incident, with a reminder while it stays open and a resolved notice
when it clears.

Incident identity (so the same trouble never pages every tick):

* ``check <asset>/<name>`` — open while the latest *completed* evaluation of that check failed with
  severity ERROR (WARN checks such as ``escalations_acknowledged`` are shown in the UI, not paged;
  the escalations themselves were already announced by delivery). A draining backlog keeps it the
  same incident until the check passes.
* ``run <job>`` — open while the latest finished run of that job failed; a later successful run of
  the job resolves it.

State lives in the sensor cursor as JSON (``{"incidents": {...}}``); a notice that could not be sent
stays due and is retried on the next tick. Reminder interval: ``escalation.reminder_minutes``.

Each notice is a page (``incident.triggered`` / ``incident.resolved``) whose incident key is
``deadline-pipeline/dagster/<check name>/<asset key>`` or ``deadline-pipeline/dagster/run/<job>``,
linked to the check or run in the Dagster UI (absolute when ``escalation.dagster_ui_url`` is set).
"""

from __future__ import annotations

import json
from datetime import timedelta

import dagster as dg
from dagster._core.storage.asset_check_execution_record import COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES

from deadline_pipeline.deliver.incident import asset_checks_path, run_path
from deadline_pipeline.orchestration.resources import ClockResource, SettingsResource
from deadline_pipeline.watch.watchdog import Problem, incident_notices, record_notice, send_notice

FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
COMPONENT = "dagster"


def failing_checks(instance: dg.DagsterInstance, check_keys) -> dict[str, Problem]:
    """State key (``check <asset>/<name>``) → :class:`Problem` for each check whose latest completed
    evaluation failed at ERROR: check ``<name>`` on target ``<asset>``, linked to the asset's checks
    in the Dagster UI; its incident key is ``deadline-pipeline/dagster/<name>/<asset, encoded>``."""
    out = {}
    storage = instance.event_log_storage
    for key in sorted(check_keys, key=lambda k: (k.asset_key.to_user_string(), k.name)):
        history = storage.get_asset_check_execution_history(
            key, limit=1, status=set(COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES))
        evaluation = history[0].evaluation if history else None
        if evaluation is None or evaluation.passed or evaluation.severity != dg.AssetCheckSeverity.ERROR:
            continue
        asset = key.asset_key.to_user_string()
        link = (f"check {key.name} of asset {asset} in the Dagster UI", asset_checks_path(key.asset_key.path))
        out[f"check {asset}/{key.name}"] = Problem(key.name, asset, evaluation.description or "failed",
                                                   COMPONENT, links=(link,))
    return out


def failing_runs(instance: dg.DagsterInstance, job_names) -> dict[str, Problem]:
    """State key (``run <job>``) → :class:`Problem` for each job whose latest finished run failed:
    check ``run`` on target ``<job>`` (one incident per job, whichever run failed), linked to that run."""
    out = {}
    for job in sorted(job_names):
        runs = instance.get_runs(filters=dg.RunsFilter(job_name=job, statuses=FINISHED), limit=1)
        if runs and runs[0].status == dg.DagsterRunStatus.FAILURE:
            run_id = runs[0].run_id
            out[f"run {job}"] = Problem("run", job, f"run {run_id} of {job} failed", COMPONENT,
                                        links=((f"run {run_id} in the Dagster UI", run_path(run_id)),))
    return out


@dg.sensor(minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Pages the escalation channels once per failed-check or failed-run incident, reminds "
                       "while it stays open, and says when it is resolved.")
def paging_sensor(context: dg.SensorEvaluationContext, settings: SettingsResource, clock: ClockResource):
    repo = context.repository_def
    if repo is None:
        # Without its repository the sensor cannot know which checks and jobs are its own.
        context.log.error("paging sensor: no repository definition in the context; cannot evaluate")
        return dg.SkipReason("no repository definition: cannot tell which checks and jobs to watch")
    cfg = settings.load()
    now = clock.now()
    state = json.loads(context.cursor)["incidents"] if context.cursor else {}
    failing = {**failing_checks(context.instance, repo.asset_checks_defs_by_key.keys()),
               **failing_runs(context.instance, repo.job_names)}
    notices = incident_notices(state, failing, now, timedelta(minutes=cfg.escalation.reminder_minutes))
    sent, errors = 0, []
    for notice in notices:
        problems = send_notice(cfg, notice, now)
        if problems:
            errors.extend(problems)
            context.log.error(f"paging: could not announce {notice.phase} of {notice.key}: {'; '.join(problems)}")
            continue
        record_notice(state, notice, now)
        sent += 1
    context.update_cursor(json.dumps({"incidents": state}, sort_keys=True))
    if errors:
        return dg.SkipReason(f"{len(errors)} page(s) failed and will be retried: {errors[0]}")
    return dg.SkipReason(f"{len(state)} open incident(s); {sent} notice(s) sent" if notices or state
                         else "no open incident")
