"""Source freshness that Dagster itself evaluates: each source's ``snapshot/<name>`` asset is
materialized exactly when a fresh snapshot is confirmed, and Dagster's own freshness daemon code
(``dagster._daemon.freshness.FreshnessDaemon``, which judges only materializations) turns it from
PASS to FAIL once no confirmation came within the source's window."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg

from deadline_pipeline.orchestration.assets import RULE_VERSIONS, snapshot_confirmed
from deadline_pipeline.orchestration.build import build_definitions
from deadline_pipeline.orchestration.runner import run_chain
from deadline_pipeline_tests.test_watch_checks import setup_config

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT = dg.AssetKey(["snapshot", "cal"])
SOURCE = dg.AssetKey(["source", "cal"])


def write_defs_file(folder: Path, config: Path, db_url: str) -> Path:
    """A code location file for ``config`` on ``db_url``, as the webserver and daemon would load it."""
    path = folder / "defs_under_test.py"
    path.write_text("from deadline_pipeline.orchestration.build import build_definitions\n"
                    f"defs = build_definitions({str(config)!r}, db_url={db_url!r})\n")
    return path


def evaluate_freshness(instance: dg.DagsterInstance, defs_file: Path, keys) -> dict:
    """One iteration of Dagster's freshness daemon over the code location in ``defs_file``, recorded in
    ``instance`` exactly as ``dagster-daemon`` records it; returns asset key → ``FreshnessState``."""
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
    from dagster._daemon.freshness import FreshnessDaemon

    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(python_file=str(defs_file), attribute="defs", working_directory=str(REPO)),
        location_name="deadline_pipeline")
    with WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin)) as context:
        asyncio.run(FreshnessDaemon()._evaluate_assets(context))  # noqa: SLF001 - the daemon's own iteration
    records = instance.get_freshness_state_records(list(keys))
    return {k: records[k].freshness_state.value if k in records else None for k in keys}


def test_the_freshness_policy_sits_on_a_materialized_snapshot_upstream_of_the_rules(tmp_path):
    _, path = setup_config(tmp_path)
    defs = build_definitions(path, db_url=f"sqlite:///{tmp_path / 's.db'}")
    graph = defs.resolve_asset_graph()
    snapshot, source = graph.get(SNAPSHOT), graph.get(SOURCE)
    assert snapshot.is_materializable and snapshot.freshness_policy is not None
    assert snapshot.freshness_policy.fail_window.to_timedelta() == timedelta(days=1)  # freshness: P1D
    assert source.is_observable and source.freshness_policy is None
    assert SOURCE in snapshot.parent_keys and SNAPSHOT in graph.get(RULE_VERSIONS).parent_keys
    check_targets = {k.asset_key for k in defs.resolve_asset_graph().asset_check_keys if k.name.startswith("source_")}
    assert check_targets == {SNAPSHOT}


def test_confirmation_rule():
    t = datetime(2027, 1, 10, tzinfo=UTC)
    assert snapshot_confirmed(t, "fresh", None) and snapshot_confirmed(t, "fresh", t - timedelta(hours=1))
    assert not snapshot_confirmed(t, "fresh", t)  # the same fetch twice restarts no window
    assert not snapshot_confirmed(t, "stale", None) and not snapshot_confirmed(None, "fresh", None)
    assert not snapshot_confirmed(t, "suspect", None)  # quarantined


def test_snapshot_materializes_only_on_confirmation_and_dagster_judges_it(tmp_path):
    from dagster._core.test_utils import freeze_time

    _, path = setup_config(tmp_path)
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    defs_file = write_defs_file(tmp_path, path, url)
    with dg.instance_for_test() as instance:
        assert run_chain(path, instance=instance, db_url=url, as_of="2027-01-10T00:00:00Z").success
        first = instance.get_latest_materialization_event(SNAPSHOT)
        assert first is not None
        observed = instance.fetch_observations(SOURCE, limit=1).records[0]
        # Versioned raw snapshot: the same data version as the observation (the payload's sha256).
        assert first.asset_materialization.tags["dagster/data_version"] == \
            observed.asset_observation.tags["dagster/data_version"]
        assert evaluate_freshness(instance, defs_file, [SNAPSHOT, SOURCE]) == {SNAPSHOT: "PASS",
                                                                                SOURCE: "NOT_APPLICABLE"}

        # The same instant again confirms nothing new: the freshness clock keeps running.
        run_chain(path, instance=instance, db_url=url, as_of="2027-01-10T00:00:00Z")
        assert instance.get_latest_materialization_event(SNAPSHOT).run_id == first.run_id

        # The source breaks; two days later (past its P1D window) nothing was confirmed: the
        # pipeline's own check is red at that instant, and Dagster's policy is red once its window passed.
        (tmp_path / "cal.ics").write_text("BEGIN:VCALENDAR\r\nthis is not a calendar")
        summary = run_chain(path, instance=instance, db_url=url, as_of="2027-01-12T00:00:00Z")
        assert summary.checks["source_fresh[cal]"][0] is False
        assert instance.get_latest_materialization_event(SNAPSHOT).run_id == first.run_id
        with freeze_time(datetime.now(UTC) + timedelta(days=1, minutes=1)):
            assert evaluate_freshness(instance, defs_file, [SNAPSHOT])[SNAPSHOT] == "FAIL"

        # Repaired: confirmed again, fresh again.
        setup_config(tmp_path)
        summary = run_chain(path, instance=instance, db_url=url, as_of="2027-01-12T01:00:00Z")
        assert summary.checks["source_fresh[cal]"][0] is True
        assert instance.get_latest_materialization_event(SNAPSHOT).run_id != first.run_id
        assert evaluate_freshness(instance, defs_file, [SNAPSHOT])[SNAPSHOT] == "PASS"
