"""The Dagster UI as the console: a real ``dagster-webserver`` on this workspace, driven by headless
Chromium (the distribution's package) through Playwright.

The assets are materialized and the checks evaluated once beforehand (in-process, on the same
SQLite-backed Dagster home and store the webserver reads), so the pages have something to show.
Screenshots are written to a stable folder, ``$DEADLINE_UI_SCREENSHOTS`` or ``.deadline/ui-screenshots``
in the repository (ignored by git), and their paths printed.

Skips with a message when Chromium or Playwright is missing, unless ``DEADLINE_REQUIRE_UI=1``
(``.ci/run`` sets it once it has installed Chromium).
"""

from __future__ import annotations

import os
import re
import shutil
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from deadline_pipeline_tests.factories import free_port
from deadline_pipeline_tests.test_production_daemon import (
    FILING,
    RENEWAL,
    WORKSPACE,
    process_group,
    production_config,
    wait_for,
)

CHROMIUM = os.environ.get("DEADLINE_CHROMIUM", "/usr/bin/chromium")
# No network, no GPU, nothing that phones home or writes a profile the test did not ask for.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
# Every check of the alerts asset (the graph's node shows their tally).
CHECK_NAMES = ["alerts_reconciled", "sweep_alive", "fanout_complete", "escalations_acknowledged", "reminders_owed",
               "clock_agrees"]
SHOTS = Path(os.environ.get("DEADLINE_UI_SCREENSHOTS")
             or Path(__file__).resolve().parents[1] / ".deadline" / "ui-screenshots")


def _shot(page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


def _require_ui():
    problems = []
    if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
        problems.append(f"Chromium not found at {CHROMIUM} (apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        problems.append("the Python package playwright is not installed (pip install playwright)")
    if problems:
        msg = "; ".join(problems)
        if os.environ.get("DEADLINE_REQUIRE_UI", "") not in ("", "0", "false"):
            pytest.fail(msg)
        pytest.skip(msg)
    return CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")


def _materialize_once(config: Path, store_url: str, home: Path) -> dict[str, bool]:
    """Ingest, plan the horizon and evaluate every check, recorded in the webserver's instance.

    No sweep runs: the reminder that fell due days ago stays undelivered, so the console has red
    checks with offenders to show next to green ones.
    """
    from dagster import DagsterInstance

    from deadline_pipeline.orchestration.build import CHECKS_JOB, INGEST_JOB, build_definitions
    from deadline_pipeline.orchestration.planning import PLAN_JOB, horizon_range, range_tags

    defs = build_definitions(config, db_url=store_url)
    with DagsterInstance.from_config(str(home)) as instance:
        assert defs.resolve_job_def(INGEST_JOB).execute_in_process(instance=instance).success
        tags = range_tags(*horizon_range(datetime.now(UTC), 366, defs.resolve_job_def(PLAN_JOB).partitions_def))
        assert defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, tags=tags).success
        checks = defs.resolve_job_def(CHECKS_JOB).execute_in_process(instance=instance, raise_on_error=False)
        return {e.check_name: e.passed for e in checks.get_asset_check_evaluations()}


def _dismiss_welcome(page) -> None:
    """A fresh browser profile gets Dagster's community dialog over the page; skip it."""
    skip = page.get_by_role("button", name="Skip")
    try:
        skip.wait_for(state="visible", timeout=5_000)
    except Exception:  # no dialog this time: nothing to dismiss
        return
    skip.click()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def test_ui_shows_asset_graph_and_checks(tmp_path):
    chromium = _require_ui()
    from playwright.sync_api import expect, sync_playwright

    work = tmp_path / "work"
    work.mkdir()
    # The reminder fell due two to three days ago: far past any grace window, whatever the hour.
    config = production_config(work, [FILING, RENEWAL], now=datetime.now(UTC) - timedelta(days=2))
    store_url = f"sqlite:///{work / 'store.sqlite3'}"
    home = tmp_path / "dagster_home"  # no dagster.yaml: SQLite storage under this folder
    home.mkdir()
    evaluations = _materialize_once(config, store_url, home)
    from deadline_pipeline.orchestration.build import build_definitions

    plan_months = len(build_definitions(config, db_url=store_url).resolve_job_def("plan_job").partitions_def
                      .get_partition_keys())
    assert plan_months <= 15, plan_months  # this month, the horizon, and nothing before the first run
    assert set(CHECK_NAMES) <= set(evaluations), evaluations
    assert not evaluations["alerts_reconciled"] and evaluations["fanout_complete"], evaluations

    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "DEADLINE_CONFIG": str(config), "DEADLINE_DB_URL": store_url,
           "DEADLINE_HOME": str(work)}
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "webserver.log"
    shots = []
    with process_group(["dagster-webserver", "-w", str(WORKSPACE), "-h", "127.0.0.1", "-p", str(port)], env,
                       log_path):
        wait_for(lambda: _answers(f"{base}/server_info"), 120, "the webserver to answer", log_path=log_path)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1600, "height": 1000})
                page.set_default_timeout(60_000)

                # The global asset graph: one collapsed box per stage group.
                page.goto(f"{base}/asset-groups")
                _dismiss_welcome(page)
                graph = page.locator("foreignObject")
                for group in ("ingest", "rules", "plan"):
                    expect(graph.get_by_text(group, exact=True).first).to_be_visible(timeout=60_000)
                shots.append(_shot(page, "asset_graph_groups.png"))

                # Everything upstream of the alerts, expanded: source → rule_versions → obligations → alerts,
                # each node with its latest event and its checks' tally.
                page.goto(f"{base}/assets/alerts?view=lineage&lineageScope=upstream&lineageDepth=5")
                graph = page.locator("foreignObject")
                for label in ("cal", "rule_versions", "obligations", "alerts"):
                    expect(graph.get_by_text(label, exact=True).first).to_be_visible(timeout=60_000)
                expect(graph.get_by_text(re.compile("Loading"))).to_have_count(0, timeout=60_000)
                passed = sum(evaluations[name] for name in CHECK_NAMES)
                expect(graph.get_by_text(f"{passed} / {len(CHECK_NAMES)} Passed")).to_be_visible(timeout=60_000)
                # The plan partitions start at the first planning run (a fixed 2019 start showed 94 of
                # 108 months missing), and reach the months the horizon can reach from any day of this
                # month (partitions.months_ahead): only the one past today's horizon, if any, is unplanned.
                expect(graph.get_by_text(re.compile(r"^(9\d|100)% filled$"))).to_have_count(2)  # obligations, alerts
                expect(graph.get_by_text(f"{plan_months} partitions")).to_have_count(2)
                shots.append(_shot(page, "asset_graph_alerts_upstream.png"))

                # The checks page of the alerts asset: each check by name with the state of its latest
                # evaluation, green or red as evaluated above.
                page.goto(f"{base}/assets/alerts?view=checks")
                for name in CHECK_NAMES:
                    expect(page.get_by_text(name, exact=True).first).to_be_visible(timeout=60_000)
                body = page.inner_text("body")
                shown = {}
                for name in CHECK_NAMES:
                    found = re.search(rf"^{name}\n(?:{name}\n)?(\w+)$", body, re.MULTILINE)
                    shown[name] = found.group(1) if found else None
                expected = {name: "Succeeded" if evaluations[name] else "Failed" for name in CHECK_NAMES}
                assert shown == expected, (shown, expected)
                shots.append(_shot(page, "alerts_checks.png"))

                # The red reconciliation check in detail: its summary and offenders.
                page.get_by_text("alerts_reconciled", exact=True).first.click()
                expect(page.get_by_text("overdue", exact=False).first).to_be_visible(timeout=60_000)
                shots.append(_shot(page, "alerts_reconciled.png"))
            finally:
                browser.close()
    for shot in shots:
        assert shot.stat().st_size > 10_000, shot
        print(f"screenshot: {shot}")


def _freshness_config(folder: Path) -> Path:
    """One calendar source that must be confirmed every minute (Dagster's shortest fail window)."""
    from deadline_pipeline_tests.factories import ics, write_config

    (folder / "cal.ics").write_text(ics(FILING, RENEWAL), newline="")
    return write_config(
        folder,
        sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t1", "freshness": "PT1M"}],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "Europe/Berlin"}],
        subscriptions=[{"name": "everything", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["box"]}],
        channels={"box": {"type": "maildir", "path": str(folder / "maildir")}},
    )


def test_ui_shows_source_freshness_going_from_passing_to_failed(tmp_path):
    """A source confirmed now is "Passing" in the UI (Dagster's freshness daemon evaluates its
    ``snapshot/cal`` asset) with both source checks green on its graph node; the source breaks, a
    replay ``--as-of`` two minutes later (past its one-minute window) confirms nothing, and once the
    window has passed for real the UI shows freshness "Failed" and the node "2 / 3 Passed"."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    chromium = _require_ui()
    from dagster import DagsterInstance
    from playwright.sync_api import expect, sync_playwright

    from deadline_pipeline.orchestration.runner import run_chain
    from deadline_pipeline_tests.test_source_freshness import SNAPSHOT, evaluate_freshness, write_defs_file

    work = tmp_path / "work"
    work.mkdir()
    config = _freshness_config(work)
    store_url = f"sqlite:///{work / 'store.sqlite3'}"
    home = tmp_path / "dagster_home"
    home.mkdir()
    defs_file = write_defs_file(work, config, store_url)
    now = datetime.now(UTC)
    with DagsterInstance.from_config(str(home)) as instance:
        first = run_chain(config, instance=instance, db_url=store_url, as_of=now.isoformat())
        assert first.checks["source_fresh[cal]"][0] and first.checks["source_not_quarantined[cal]"][0], first.checks
        confirmed_at = instance.get_latest_materialization_event(SNAPSHOT).timestamp
        assert evaluate_freshness(instance, defs_file, [SNAPSHOT])[SNAPSHOT] == "PASS"

    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "DEADLINE_CONFIG": str(config), "DEADLINE_DB_URL": store_url,
           "DEADLINE_HOME": str(work)}
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "webserver.log"
    shots = []
    with process_group(["dagster-webserver", "-w", str(WORKSPACE), "-h", "127.0.0.1", "-p", str(port)], env,
                       log_path):
        wait_for(lambda: _answers(f"{base}/server_info"), 120, "the webserver to answer", log_path=log_path)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1600, "height": 1000})
                page.set_default_timeout(60_000)

                # The snapshot asset's page: its freshness policy, evaluated by Dagster: Passing.
                page.goto(f"{base}/assets/snapshot/cal")
                _dismiss_welcome(page)
                expect(page.get_by_text("Freshness policy").first).to_be_visible(timeout=60_000)
                expect(page.get_by_text("Passing", exact=True).first).to_be_visible(timeout=60_000)
                assert "Not evaluated" not in page.inner_text("body")
                shots.append(_shot(page, "source_freshness_passing.png"))

                # Its node in the lineage (source/cal → snapshot/cal → rule_versions): the three source checks passed.
                page.goto(f"{base}/assets/rule_versions?view=lineage&lineageScope=upstream&lineageDepth=3")
                graph = page.locator("foreignObject")
                expect(graph.get_by_text("3 / 3 Passed")).to_be_visible(timeout=60_000)
                shots.append(_shot(page, "source_checks_passed_on_node.png"))

                # The source breaks. A replay two minutes ahead (past the one-minute window by the
                # pipeline's clock) confirms nothing, and its source_fresh check is red at that instant.
                (work / "cal.ics").unlink()  # the fetch fails: nothing to confirm

                def replay_and_evaluate():
                    with DagsterInstance.from_config(str(home)) as instance:
                        later = run_chain(config, instance=instance, db_url=store_url,
                                          as_of=(now + timedelta(minutes=2)).isoformat())
                        assert later.checks["source_fresh[cal]"][0] is False, later.checks
                        assert later.checks["source_not_quarantined[cal]"][0] is True, later.checks
                        assert later.checks["rules_complete[cal]"][0] is True, later.checks
                        assert instance.get_latest_materialization_event(SNAPSHOT).timestamp == confirmed_at
                        # Dagster's clock is the real one: wait until the window has passed for it too.
                        time.sleep(max(0.0, confirmed_at + 62 - time.time()))
                        return evaluate_freshness(instance, defs_file, [SNAPSHOT])[SNAPSHOT]

                # Off Playwright's event loop: Dagster runs its own.
                with ThreadPoolExecutor(1) as pool:
                    assert pool.submit(replay_and_evaluate).result() == "FAIL"

                page.goto(f"{base}/assets/snapshot/cal")
                expect(page.get_by_text("Freshness policy").first).to_be_visible(timeout=60_000)
                expect(page.get_by_text("Failed", exact=True).first).to_be_visible(timeout=60_000)
                shots.append(_shot(page, "source_freshness_failed.png"))

                page.goto(f"{base}/assets/rule_versions?view=lineage&lineageScope=upstream&lineageDepth=3")
                graph = page.locator("foreignObject")
                expect(graph.get_by_text("2 / 3 Passed")).to_be_visible(timeout=60_000)
                shots.append(_shot(page, "source_check_failed_on_node.png"))

                # The check itself, red with the pipeline's reason.
                page.goto(f"{base}/assets/snapshot/cal?view=checks")
                expect(page.get_by_text("source_fresh", exact=True).first).to_be_visible(timeout=60_000)
                page.get_by_text("source_fresh", exact=True).first.click()
                expect(page.get_by_text("longer than its window", exact=False).first).to_be_visible(timeout=60_000)
                shots.append(_shot(page, "source_fresh_check_failed.png"))
            finally:
                browser.close()
    for shot in shots:
        assert shot.stat().st_size > 10_000, shot
        print(f"screenshot: {shot}")
