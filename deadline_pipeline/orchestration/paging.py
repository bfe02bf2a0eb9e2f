"""The paging sensor: failed checks and failed runs of this code location, announced on the
escalation channels once per incident, with a reminder while it stays open and a resolved notice
when it clears.

Incident identity (so the same trouble never pages every tick):

* ``check <asset>/<name>`` — open while the latest *completed* evaluation of that check failed with
  severity ERROR (WARN checks such as ``escalations_acknowledged`` are shown in the UI, not paged;
  the escalations themselves were already announced by delivery). A draining backlog keeps it the
  same incident until the check passes.
* ``run <job>`` — open while the latest finished run of that job failed; a later successful run of
  the job resolves it. For a partitioned job (``plan_job``, by due month) each partition is judged
  on its own: open while any partition's latest finished run failed and no later run covering it
  (that partition, a range holding it such as the hourly horizon run, or a run of no partition)
  succeeded, naming those partitions and runs. One incident per job, under the same key as an
  unpartitioned job's: a failed range run of thirteen months is one page, not thirteen.

State lives in the sensor cursor as JSON (``{"incidents": {...}, "settled": {job: instant}}``;
``settled``: before that instant every failed run of the job is known covered, so its history is not
read again); a notice that could not be sent stays due and is retried on the next tick. Reminder
interval: ``escalation.reminder_minutes``.

Each notice is a page (``incident.triggered`` / ``incident.resolved``) whose incident key is
``deadline-pipeline/dagster/<check name>/<asset key>`` or ``deadline-pipeline/dagster/run/<job>``,
linked to the check or run in the Dagster UI (absolute when ``escalation.dagster_ui_url`` is set).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta

import dagster as dg
from dagster._core.storage.asset_check_execution_record import COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES

from deadline_pipeline.deliver.incident import asset_checks_path, run_path
from deadline_pipeline.orchestration.partitions import run_scope
from deadline_pipeline.orchestration.resources import ClockResource, SettingsResource
from deadline_pipeline.watch.partition_runs import WHOLE_JOB, FinishedRun, failed_partitions
from deadline_pipeline.watch.watchdog import Problem, incident_notices, record_notice, send_notice

FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
_DECIDED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE]
UNFINISHED = [s for s in dg.DagsterRunStatus if s not in FINISHED]
COMPONENT = "dagster"
# Run records read per query when walking a job's history.
_PAGE = 100


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


def failing_runs(instance: dg.DagsterInstance, job_names,
                 partitions: Mapping[str, dg.PartitionsDefinition] | None = None,
                 settled: dict[str, str] | None = None) -> dict[str, Problem]:
    """State key (``run <job>``) → :class:`Problem` for each failing job: check ``run`` on target
    ``<job>`` (one incident per job, whichever run failed), linked to the failed run(s).

    A job without partitions fails while its latest finished run failed. A job in ``partitions``
    (job name → its partitions definition) fails while any partition's latest finished run failed
    and no later run covering that partition (the partition itself, a range holding it, or a run of
    no partition) succeeded; the summary names those partitions and runs (see
    :func:`partition_problem`). ``settled``: job → ISO instant (UTC) before which every failed run of
    the job is known covered, read to skip that history and moved forward in place."""
    partitions = partitions or {}
    settled = {} if settled is None else settled
    out = {}
    for job in sorted(job_names):
        if job in partitions:
            problem = partition_problem(instance, job, partitions[job], settled)
            if problem is not None:
                out[f"run {job}"] = problem
            continue
        runs = instance.get_runs(filters=dg.RunsFilter(job_name=job, statuses=FINISHED), limit=1)
        if runs and runs[0].status == dg.DagsterRunStatus.FAILURE:
            run_id = runs[0].run_id
            out[f"run {job}"] = Problem("run", job, f"run {run_id} of {job} failed", COMPONENT,
                                        links=((f"run {run_id} in the Dagster UI", run_path(run_id)),))
    return out


def _scope_keys(instance: dg.DagsterInstance, partitions_def: dg.PartitionsDefinition):
    """The keys of a ``(first, last)`` scope: the definition's keys between them, in the
    definition's time order, and both ends even when the definition no longer holds them (a replay's
    later months, a start moved by ``plan.first_month``): a run of such a month still counts."""
    fmt = getattr(partitions_def, "fmt", None)

    def order(key: str):
        try:
            return (0, datetime.strptime(key, fmt).isoformat()) if fmt else (1, key)
        except ValueError:
            return (1, key)

    known = [(order(k), k) for k in partitions_def.get_partition_keys(dynamic_partitions_store=instance)]

    def keys_of(scope: tuple[str, str]) -> list[str]:
        first, last = order(scope[0]), order(scope[1])
        return sorted({scope[0], scope[1], *(k for rank, k in known if first <= rank <= last)}, key=order)

    return keys_of


def _run_records(instance: dg.DagsterInstance, filters: dg.RunsFilter):
    """Every run record matching ``filters``, newest first, read a page at a time."""
    cursor = None
    while True:
        page = instance.get_run_records(filters=filters, limit=_PAGE, cursor=cursor)
        yield from page
        if len(page) < _PAGE:
            return
        cursor = page[-1].dagster_run.run_id


def _finished(record) -> FinishedRun:
    run = record.dagster_run
    return FinishedRun(run.run_id, run.status == dg.DagsterRunStatus.FAILURE, run_scope(run.tags))


def _settle(instance: dg.DagsterInstance, job: str, failures: list, open_ids: set[str],
            settled: dict[str, str]) -> None:
    """Move ``settled[job]`` to the creation of the newest failed run (record in ``failures``,
    newest first) that is covered along with every older one, but never to or past the creation of
    the job's oldest unfinished run: that run may still fail, and a failure created before the
    instant would never be read."""
    mark = None
    for record in reversed(failures):
        if record.dagster_run.run_id in open_ids:
            break
        mark = record.create_timestamp
    if mark is None:
        return
    unfinished = instance.get_run_records(filters=dg.RunsFilter(job_name=job, statuses=UNFINISHED), limit=1,
                                          ascending=True)
    if unfinished and unfinished[0].create_timestamp <= mark:
        mark = unfinished[0].create_timestamp - timedelta(microseconds=1)
    if job not in settled or mark > datetime.fromisoformat(settled[job]):
        settled[job] = mark.isoformat()


def partition_problem(instance: dg.DagsterInstance, job: str, partitions_def: dg.PartitionsDefinition,
                      settled: dict[str, str]) -> Problem | None:
    """The :class:`Problem` of partitioned ``job`` (see :func:`failing_runs`), or ``None`` when no
    partition is failing. Summary: ``partition(s) K1, K2 of <job> failed in run <id> (…); …`` (newest
    run first; ``run <id> of <job> failed`` for a run of no partition), linked to each of those runs.
    ``settled[job]`` is moved past the failed runs now covered."""
    since = datetime.fromisoformat(settled[job]) if job in settled else None
    failures = list(_run_records(instance, dg.RunsFilter(job_name=job, statuses=[dg.DagsterRunStatus.FAILURE],
                                                         created_after=since)))
    if not failures:
        return None
    # Without cancelled runs: a cancelled run planned nothing, so it covers no failed month.
    later = (_finished(r) for r in _run_records(instance, dg.RunsFilter(job_name=job, statuses=_DECIDED,
                                                                        created_after=since)))
    failing = failed_partitions([_finished(r) for r in failures], later, _scope_keys(instance, partitions_def))
    _settle(instance, job, failures, set(failing.values()), settled)
    if not failing:
        return None
    by_run: dict[str, list[str]] = {}
    for key, run_id in failing.items():
        by_run.setdefault(run_id, []).append(key)
    order = [r.dagster_run.run_id for r in failures if r.dagster_run.run_id in by_run]
    # A run that named no partition reads as an unpartitioned job's run did (the implicit asset job
    # also runs unpartitioned assets).
    summary = "; ".join(f"run {r} of {job} failed" if by_run[r] == [WHOLE_JOB] else
                        f"partition{'s' if len(by_run[r]) > 1 else ''} {', '.join(by_run[r])} of {job} failed in "
                        f"run {r} (no later run of {'them' if len(by_run[r]) > 1 else 'it'} succeeded)"
                        for r in order)
    return Problem("run", job, summary, COMPONENT,
                   links=tuple((f"run {r} in the Dagster UI", run_path(r)) for r in order))


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
    cursor = json.loads(context.cursor) if context.cursor else {}
    state, settled = cursor.get("incidents", {}), cursor.get("settled", {})
    partitioned = {name: job.partitions_def for name in repo.job_names
                   if (job := repo.get_job(name)).partitions_def is not None}
    failing = {**failing_checks(context.instance, repo.asset_checks_defs_by_key.keys()),
               **failing_runs(context.instance, repo.job_names, partitioned, settled)}
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
    context.update_cursor(json.dumps({"incidents": state, "settled": settled}, sort_keys=True))
    if errors:
        return dg.SkipReason(f"{len(errors)} page(s) failed and will be retried: {errors[0]}")
    return dg.SkipReason(f"{len(state)} open incident(s); {sent} notice(s) sent" if notices or state
                         else "no open incident")
