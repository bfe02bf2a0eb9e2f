"""Dagster assets of the pipeline: observed sources → confirmed snapshots → rule versions →
obligations and alerts.

Freshness: Dagster's freshness daemon (1.13, ``dagster._daemon.freshness`` with the evaluators of
``dagster._core.definitions.freshness_evaluator``) judges an asset only by the timestamp of its last
*materialization*; observations never count, so a policy on an observed source asset stays "Not
evaluated" forever. Each source therefore has a materialized ``snapshot/<name>`` asset, carrying the
source's freshness policy, that is materialized exactly when a fresh snapshot was confirmed (fetched
and parsed, or the same bytes served again); a failed fetch or parse materializes nothing, so the
policy turns red once the window passes. Versioned raw snapshots (the observation's data version is
the payload's sha256, and so is the snapshot's) stay upstream of the versioned rules.

The stages' logic lives in ``ingest``, ``plan`` and ``store``; this module only wires it to Dagster,
reports metadata the UI plots, and records heartbeats.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg

from deadline_pipeline.config import DeadlinesConfig, SourceConfig, asset_name
from deadline_pipeline.deliver.throttle import log_first
from deadline_pipeline.ingest.service import ApplyOutcome, apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.instants import instant_text
from deadline_pipeline.orchestration.partitions import horizon_range, revision_range
from deadline_pipeline.orchestration.resources import ClockResource, SettingsResource, StoreResource
from deadline_pipeline.plan.service import (
    affected_partitions,
    changed_rules,
    max_version_id,
    plan_all,
    record_plan_run,
)
from deadline_pipeline.security.redact import redact
from deadline_pipeline.store import health
from deadline_pipeline.store.sources import get_source, latest_snapshot, snapshot_meta

RULE_VERSIONS = dg.AssetKey("rule_versions")

OBLIGATIONS = dg.AssetKey("obligations")
ALERTS = dg.AssetKey("alerts")


def source_key(name: str) -> dg.AssetKey:
    """The asset key of a configured source: ``source/<name>`` with characters Dagster refuses replaced."""
    return dg.AssetKey(["source", asset_name(name)])


def snapshot_key(name: str) -> dg.AssetKey:
    """The asset key of a source's confirmed snapshot: ``snapshot/<name>`` (same replacement)."""
    return dg.AssetKey(["snapshot", source_key(name).path[-1]])


def snapshot_confirmed(last_fresh_at: datetime | None, status: str | None,
                       previous: datetime | None) -> bool:
    """Whether the source's state confirms a fresh snapshot not confirmed before: its ``status`` is
    ``fresh`` (not ``stale`` after a failed fetch or parse, not ``suspect`` while quarantined) at
    ``last_fresh_at`` (aware UTC), later than the ``previous`` confirmation. The same judgment as
    the ``source_fresh`` check: judged on ``last_error`` instead, a snapshot with a skipped record
    was never confirmed, so the UI showed the source failed while ``source_fresh`` passed (the
    skipped record is ``rules_complete``'s to report). A repeated confirmation of the same fetch
    (materializing the asset by hand, a second run at the same ``--as-of``) would restart Dagster's
    freshness window without any new data."""
    if last_fresh_at is None or status != "fresh":
        return False
    return previous is None or last_fresh_at > previous


def _observer(src: SourceConfig, network) -> dg.AssetsDefinition:
    spec = dg.AssetSpec(
        source_key(src.name),
        description=f"External source '{src.name}' ({src.format}) at {redact(src.location)}",
        group_name="ingest",
        kinds={src.format.replace("-", "_")},
        tags={"stage": "ingest", "tenant": src.tenant},
        # No freshness policy here: Dagster evaluates policies on materializations only, never on
        # observations; the policy lives on snapshot/<name>.
    )

    @dg.multi_observable_source_asset(specs=[spec], name=f"observe_{source_key(src.name).path[-1]}")
    def observe(context, store: StoreResource, clock: ClockResource):
        now = clock.now()
        engine = store.engine()
        started = now
        outcome = fetch_snapshot(engine, src, now, network=network)
        with engine.begin() as conn:
            health.beat(conn, f"ingest:{src.name}", started_at=started, completed_at=clock.now(),
                        outcome="ok" if outcome.error is None else "failed", detail=outcome.error,
                        replay=clock.frozen, host_clock=clock.now)
        meta = {"status": outcome.status, "size_bytes": outcome.size}
        if outcome.snapshot_id is not None:
            meta["snapshot_id"] = outcome.snapshot_id
        if outcome.error:
            meta["error"] = outcome.error
            context.log.error(f"source {src.name}: {outcome.error}")
        # A failed fetch reports the data version of the snapshot still in force, so nothing downstream
        # looks changed; the error is in the metadata and the freshness policy turns red.
        version = outcome.sha256 or "none"
        if outcome.error:
            with engine.connect() as conn:
                snap = latest_snapshot(conn, get_source(conn, src.name).id)
            version = snap.sha256 if snap else "none"
        return dg.ObserveResult(asset_key=spec.key, data_version=dg.DataVersion(version), metadata=meta)

    return observe


def _confirm_snapshot(context, engine, src: SourceConfig, key: dg.AssetKey) -> dg.MaterializeResult | None:
    """The materialization of ``snapshot/<name>`` when the store confirms a fresh snapshot not
    confirmed before (see :func:`snapshot_confirmed`), else ``None`` with the reason logged: a
    source that is not fresh must leave Dagster's freshness clock running."""
    with engine.connect() as conn:
        row = get_source(conn, src.name)
        current = (snapshot_meta(conn, row.current_snapshot_id) if row.current_snapshot_id is not None
                   else latest_snapshot(conn, row.id))
    previous_event = context.instance.get_latest_materialization_event(key)
    previous_meta = previous_event.asset_materialization.metadata if previous_event and \
        previous_event.asset_materialization else {}
    previous = previous_meta.get("last_fresh_at")
    previous_at = datetime.fromtimestamp(previous.value, UTC) if previous is not None else None
    if not snapshot_confirmed(row.last_fresh_at, row.status, previous_at):
        why = (f"not fresh ({row.status}): {row.last_error}" if row.status != "fresh" else
               "never fresh" if row.last_fresh_at is None else
               f"no fresh snapshot since {instant_text(row.last_fresh_at)} (already confirmed)")
        context.log.warning(f"source {src.name}: no snapshot confirmed ({why})")
        return None
    sha = current.sha256 if current is not None else "none"
    return dg.MaterializeResult(
        asset_key=key, data_version=dg.DataVersion(sha),
        metadata={"last_fresh_at": dg.MetadataValue.timestamp(row.last_fresh_at), "sha256": sha,
                  "snapshot_id": current.id if current is not None else -1, "status": row.status})


_FAILED_STATUSES = ("parse_failed", "quarantined", "no_snapshot")


def _apply_sources(context, engine, sources: list[SourceConfig], now: datetime) -> tuple[dict, list[str]]:
    """Apply the latest snapshot of each source at ``now`` (aware UTC), logging first-seen notes,
    snapshots parsed again because their source's settings changed, and failures to ``context.log``.
    Returns (totals for the rule_versions metadata, ``reparsed`` among them: one line per snapshot
    parsed again; the lines of its Markdown "changes" table, header included)."""
    totals = dict(rules=0, added=0, changed=0, withdrawn=0, unchanged=0, problems=0, failed_sources=0,
                  first_seen_late=0, first_seen_missed=0, first_seen_history=0)
    reparsed: list[str] = []
    lines = ["| source | status | rules | added | changed | withdrawn | note |", "|---|---|---|---|---|---|---|"]
    for src in sources:
        out = apply_latest_snapshot(engine, src, now)
        _add_to_totals(totals, out)
        if out.reparsed:
            # Said where the rule versions are shown: new versions from bytes that did not change
            # would otherwise look like a revision the source never published.
            line = f"source {src.name}: snapshot {out.snapshot_id} re-parsed: {out.reparsed}"
            context.log.warning(line)
            reparsed.append(line)
        for line in out.first_seen_notes:
            context.log.warning(f"source {src.name}: first seen after its deadline: {line}")
        if out.status in _FAILED_STATUSES:
            context.log.error(f"source {src.name}: {out.status}: {out.error}")
        lines.append(change_row(src.name, out))
    totals["reparsed"] = dg.MetadataValue.json(reparsed)
    return totals, lines


def _add_to_totals(totals: dict[str, int], out: ApplyOutcome) -> None:
    """Add one source's outcome to ``totals`` (the keys :func:`_apply_sources` starts with)."""
    totals["rules"] += out.rules
    totals["added"] += out.added
    totals["changed"] += out.changed
    totals["withdrawn"] += out.withdrawn
    totals["unchanged"] += out.unchanged
    totals["problems"] += len(out.problems)
    # Rules first seen already past (plan.first_seen): late publications are notes here,
    # possible misses are escalated by planning.
    for k in ("first_seen_late", "first_seen_missed", "first_seen_history"):
        totals[k] += getattr(out, k)
    if out.status in _FAILED_STATUSES:
        totals["failed_sources"] += 1


def change_row(source: str, out: ApplyOutcome) -> str:
    """One row of the "changes" Markdown table for one source's outcome: its note is the error, else
    why the snapshot was parsed again, else the first problem, with ``|`` escaped and cut at 200
    characters."""
    note = (out.error or (f"re-parsed: {out.reparsed}" if out.reparsed else "")
            or (out.problems[0] if out.problems else "")).replace("|", "\\|")[:200]
    return (f"| {source} | {out.status} | {out.rules} | {out.added} | {out.changed} | "
            f"{out.withdrawn} | {note} |")


def build_assets(cfg: DeadlinesConfig, partitions_def: dg.PartitionsDefinition | None = None) -> list:
    """The pipeline's assets for a configuration (one observed source asset per source), the plan
    assets partitioned by ``partitions_def`` (default: from ``plan.first_month`` or the current month)."""
    if partitions_def is None:
        from deadline_pipeline.orchestration.partitions import month_key, plan_partitions

        first = f"{cfg.plan.first_month}-01" if cfg.plan.first_month else month_key(datetime.now(UTC))
        partitions_def = plan_partitions(first, cfg.plan.horizon_days)
    network = cfg.network.policy()
    observers = [_observer(s, network) for s in cfg.sources]

    snapshot_specs = [
        dg.AssetSpec(
            snapshot_key(src.name), deps=[source_key(src.name)], group_name="ingest", kinds={"sql"},
            tags={"stage": "ingest", "tenant": src.tenant},
            description=f"The snapshot of '{src.name}' in force, materialized each time a fresh one is confirmed "
                        f"(fetched and parsed, or the same bytes served again); expected within {src.freshness}.",
            # Red in the UI when no fresh snapshot was confirmed within the source's window, even if
            # nothing errored. (Dagster refuses a fail window under one minute.)
            freshness_policy=dg.FreshnessPolicy.time_window(
                fail_window=max(src.freshness_window, timedelta(minutes=1))),
            # A failed fetch or parse materializes nothing: that is what lets the policy turn red.
            skippable=True,
        )
        for src in cfg.sources
    ]

    @dg.multi_asset(
        specs=[
            *snapshot_specs,
            dg.AssetSpec(RULE_VERSIONS, deps=[spec.key for spec in snapshot_specs], group_name="rules",
                         code_version="1", kinds={"sql"}, tags={"stage": "ingest"},
                         description="Parsed rules, one version per change; withdrawals are versions, never deletes."),
        ],
        name="apply_snapshots",
        # rule_versions alone (UI "Materialize") applies without confirming a snapshot; snapshot/<name>
        # alone confirms what the store already shows, never twice.
        can_subset=True,
    )
    def apply_snapshots(context, store: StoreResource, settings: SettingsResource, clock: ClockResource):
        cfg_now = settings.load()
        now = clock.now()
        engine = store.engine()
        since = max_version_id(engine)
        # Applying creates rule versions, which the UI should show as a rule_versions materialization
        # (what changed, which months): a subset without it (snapshot/<name> alone) confirms and
        # applies nothing new.
        applying = RULE_VERSIONS in context.selected_asset_keys
        totals, lines = _apply_sources(context, engine, cfg_now.sources if applying else [], now)
        # After applying: a new snapshot is fresh only once it parsed.
        for src in cfg.sources:
            key = snapshot_key(src.name)
            if key not in context.selected_asset_keys:
                continue
            result = _confirm_snapshot(context, engine, src, key)
            if result is not None:
                yield result
        if applying:
            # The months whose obligations these new versions touch, for the UI. The replan sensor
            # computes them from the store itself, not from this metadata: a run that fails before
            # this point has written its versions all the same.
            affected = affected_partitions(engine, cfg_now, since, now)
            yield dg.MaterializeResult(asset_key=RULE_VERSIONS,
                                       metadata={**totals, "dagster/row_count": totals["rules"],
                                                 "changes": dg.MetadataValue.md("\n".join(lines)),
                                                 "affected_partitions": dg.MetadataValue.json(affected)})

    @dg.multi_asset(
        specs=[
            dg.AssetSpec(OBLIGATIONS, deps=[RULE_VERSIONS], group_name="plan", code_version="2", kinds={"sql"},
                         tags={"stage": "plan"},
                         description="One row per (subscriber, rule, period) with its concrete due instant (UTC), "
                                     "partitioned by due month."),
            dg.AssetSpec(ALERTS, deps=[OBLIGATIONS], group_name="plan", code_version="2", kinds={"sql"},
                         tags={"stage": "plan"},
                         description="The outbox: one reminder per (obligation, offset, channel), plus corrections "
                                     "and cancellation notices."),
        ],
        name="plan_obligations",
        partitions_def=partitions_def,
        # A range of months is planned in one run: one staging pass instead of one per month.
        backfill_policy=dg.BackfillPolicy.single_run(),
    )
    def plan_obligations(context, store: StoreResource, settings: SettingsResource, clock: ClockResource):
        now = clock.now()
        engine = store.engine()
        window_ = context.partition_time_window
        # One configuration for the whole step (the resource reads the file once per run).
        cfg_now = settings.load()
        # A run the revision sensor requested plans only the rules its rule versions changed.
        versions = revision_range(context.run.tags)
        scope = changed_rules(engine, versions[0] - 1, versions[1]) if versions else None
        if versions and scope is None:
            context.log.warning(f"rule versions {versions[0]}..{versions[1]} are not in the store (replaced or "
                                "restored?): every rule is planned")
        out = plan_all(engine, cfg_now, now, after=window_.start, before=window_.end, scope=scope)
        keys = context.partition_key_range
        try:
            h_first, h_last = horizon_range(now, cfg_now.plan.horizon_days)
            covers = keys.start <= h_first and keys.end >= h_last
        except ValueError:
            covers = False
        component = _plan_component(covers, scope is not None, bool(out.problems))
        record_plan_run(engine, component, started_at=now, completed_at=clock.now(),
                        label=f"{context.partition_key_range.start}..{context.partition_key_range.end}",
                        problems=out.problems, replay=clock.frozen, counts=out.heartbeat_counts(),
                        host_clock=clock.now)
        with engine.connect() as conn:
            states = health.alerts_by_state(conn)
        log_first(context.log.error, [f"source {p.source} rule {p.rule_id}: {p.message}" for p in out.problems],
                  what="planning problem(s)")
        yield dg.MaterializeResult(asset_key=OBLIGATIONS, metadata={
            "planned": out.obligations_planned, "inserted": out.obligations_inserted,
            "moved": out.obligations_moved, "updated": out.obligations_updated,
            "unchanged": out.obligations_unchanged, "withdrawn": out.obligations_withdrawn,
            # Not only skipped rules: a subscriber without a channel's contact, a subscriber or a
            # subscription that reaches no one (plan_complete lists them).
            "planning_problems": len(out.problems), "dagster/row_count": out.obligations_planned,
            "direct_write_fallbacks": out.direct_write_fallbacks, "gap_rule_fallbacks": out.gap_rule_fallbacks,
            "scope": out.scope or "every rule",
            # Which time rules computed these instants, and how many moved only because they changed.
            "zone_data": f"IANA {out.zone_data}", "calendar_data": out.calendar_data,
            "recurrence_engine": out.recurrence_engine,
            "moved_by_time_data": out.moved_by_time_data,
            # Override obligations stored under their own id, re-keyed as the occurrence they replace.
            "rekeyed": out.obligations_rekeyed,
            # Subscribers kept although the subscriber list leaves them out (too many at once;
            # plan_complete names the file and `subscribers accept`).
            "subscribers_held": out.subscribers_held,
        })
        yield dg.MaterializeResult(asset_key=ALERTS, metadata={
            "planned": out.alerts_planned, "inserted": out.alerts_inserted, "moved": out.alerts_moved,
            "cancelled": out.alerts_cancelled, "corrections": out.corrections,
            "cancellation_notices": out.cancellation_notices,
            # Late reminders of moved deadlines sent at once despite late_policy skip.
            "moved_sent_despite_skip": out.moved_sent_despite_skip,
            # Reminders of deadlines moved into the past with none delivered, left for the sweep to
            # escalate as missed.
            "moved_into_past_missed": out.moved_into_past_missed,
            # Reminders of deadlines that passed while their source was not fetched (plan.first_seen),
            # left for the sweep to escalate as missed.
            "missed_while_unwatched": out.missed_while_unwatched,
            **{f"state_{k}": v for k, v in sorted(states.items())},
        })

    return [*observers, apply_snapshots, plan_obligations]


def _plan_component(covers_horizon: bool, scoped: bool, problems: bool) -> str:
    """The heartbeat component a planning run records. Only a run of every rule covering the whole
    horizon proves the planner alive (``plan``); a one-month backfill must not hide a stopped hourly
    planner from horizon_planned (``plan:backfill``). A revision re-plan (``scoped``) saw only the
    changed rules' problems: without any it records ``plan:revision``, which plan_complete does not
    read, so it cannot turn a full run's reported problems green; with some, ``plan:backfill``, which
    plan_complete does read."""
    if scoped:
        return "plan:backfill" if problems else "plan:revision"
    return "plan" if covers_horizon else "plan:backfill"
