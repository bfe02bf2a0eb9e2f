"""Start-up resolution of the configuration's ``*_env`` variables, and the watchdog's refusal of time
travel (heartbeats and receipts after now; ``--as-of`` replays into a live store)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import func, select

from deadline_pipeline.cli import main
from deadline_pipeline.config import load_config
from deadline_pipeline.deliver.channels.environment import unresolved_env
from deadline_pipeline.store import health
from deadline_pipeline.store.db import make_engine, upgrade
from deadline_pipeline.store.schema import alerts, delivery_attempts
from deadline_pipeline.watch.watchdog import evaluate
from deadline_pipeline_tests.factories import ics, write_config
from deadline_pipeline_tests.test_watch_checks import EVENT_A, T0, cycle, setup_config

SECRET_VAR = "DP_T_STARTUP_HOOK_SECRET"


def _hook_config(tmp_path):
    (tmp_path / "cal.ics").write_text(ics(EVENT_A), newline="")
    return write_config(
        tmp_path,
        sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t1"}],
        subscribers=[{"id": "ann", "tenant": "t1", "webhook_url": "http://127.0.0.1:9/hook",
                      "timezone": "Europe/Berlin"}],
        subscriptions=[{"name": "all", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["hook"]}],
        channels={"hook": {"type": "webhook", "secret_env": SECRET_VAR},
                  "chat": {"type": "slack", "url_env": "DP_T_STARTUP_SLACK_URL"}},
    )


def _cli(args, tmp_path, **env):
    base = {"DEADLINE_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    return CliRunner().invoke(main, args, env={**base, **env}, catch_exceptions=False)


def _states(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return health.alerts_by_state(conn)


# --------------------------------------------------------------------------- start-up validation


def test_every_named_variable_is_resolved_and_listed(tmp_path):
    cfg = load_config(_hook_config(tmp_path))[0]
    problems = unresolved_env(cfg, environ={})
    assert [(p.channel, p.key, p.variable) for p in problems] == [
        ("chat", "url_env", "DP_T_STARTUP_SLACK_URL"), ("hook", "secret_env", SECRET_VAR)]
    assert unresolved_env(cfg, environ={SECRET_VAR: "s", "DP_T_STARTUP_SLACK_URL": "https://x"}) == []
    # An empty variable is as unusable as a missing one.
    assert [p.variable for p in unresolved_env(cfg, environ={SECRET_VAR: "", "DP_T_STARTUP_SLACK_URL": "u"})] \
        == [SECRET_VAR]


def test_missing_secret_stops_the_run_with_exit_2_and_escalates_nothing(tmp_path, monkeypatch):
    """Planned at T0 with the secret set; at the due instant with the secret unset the run stops
    before sending: exit 2 naming the variable and the channel, the alert still pending."""
    path = _hook_config(tmp_path)
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    env = {SECRET_VAR: "whsec_" + "QUJD" * 8, "DP_T_STARTUP_SLACK_URL": "https://hooks.example.invalid/x"}
    first = _cli(["run", "--config", str(path), "--db-url", url, "--as-of", "2027-01-10T00:00:00Z"], tmp_path, **env)
    assert first.exit_code == 0, first.output
    engine = make_engine(url)
    assert _states(engine) == {"pending": 1}
    monkeypatch.delenv(SECRET_VAR, raising=False)
    res = _cli(["run", "--config", str(path), "--db-url", url, "--as-of", "2027-01-14T12:00:00Z"], tmp_path,
               **{SECRET_VAR: None, "DP_T_STARTUP_SLACK_URL": env["DP_T_STARTUP_SLACK_URL"]})
    assert res.exit_code == 2, res.output
    assert SECRET_VAR in res.output and "channels.hook.secret_env" in res.output and "Traceback" not in res.output
    assert _states(engine) == {"pending": 1}
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(delivery_attempts)).scalar_one() == 0
    engine.dispose()


def test_missing_secret_fails_the_dagster_sweep_run_without_escalating(tmp_path, monkeypatch, db_url):
    """The daemon's path (the sweep job in Dagster): the run fails naming the variable; nothing is
    claimed or escalated."""
    import dagster as dg

    from deadline_pipeline.orchestration.runner import run_chain

    path = _hook_config(tmp_path)
    monkeypatch.setenv("DP_T_STARTUP_SLACK_URL", "https://hooks.example.invalid/x")
    monkeypatch.setenv(SECRET_VAR, "whsec_" + "QUJD" * 8)
    with dg.instance_for_test() as instance:
        assert run_chain(path, instance=instance, db_url=db_url, as_of="2027-01-10T00:00:00Z").success
        monkeypatch.delenv(SECRET_VAR)
        summary = run_chain(path, instance=instance, db_url=db_url, as_of="2027-01-14T12:00:00Z")
    assert not summary.success
    assert any("deliver_job" in f and SECRET_VAR in f and "hook" in f for f in summary.failures), summary.failures
    engine = make_engine(db_url)
    assert _states(engine) == {"pending": 1}
    engine.dispose()


# --------------------------------------------------------------------------- time travel


def test_watchdog_reports_heartbeats_and_receipts_in_the_future(engine, tmp_path):
    cfg, _ = setup_config(tmp_path)
    cycle(engine, cfg, T0)
    now = T0 + timedelta(minutes=5)
    assert evaluate(engine, now, cfg).healthy
    tomorrow = T0 + timedelta(days=1)
    # A replay at tomorrow wrote a sweep heartbeat and a receipt: both ahead of the watchdog's now.
    with engine.begin() as conn:
        health.beat(conn, "deliver", started_at=tomorrow, completed_at=tomorrow, outcome="ok", replay=True)
        alert_id = conn.execute(select(func.min(alerts.c.id))).scalar_one()
        conn.execute(delivery_attempts.insert().values(alert_id=alert_id, attempt=99, started_at=tomorrow,
                                                       lease_owner="replay", finished_at=tomorrow, outcome="failed"))
    report = evaluate(engine, now, cfg)
    failing = {r.check: r.detail for r in report.failing}
    assert set(failing) == {"time_travel", "sweep_alive"}, report.table()
    assert "heartbeat deliver" in failing["time_travel"] and "delivery receipt" in failing["time_travel"]
    assert "replay" in failing["time_travel"]
    assert "in the future" in failing["sweep_alive"]
    # Within the skew allowance it is clock drift, not time travel.
    assert "time_travel" in {r.check for r in evaluate(engine, tomorrow - timedelta(minutes=1), cfg).rows}
    assert all(r.ok for r in evaluate(engine, tomorrow - timedelta(minutes=1), cfg).rows
               if r.check == "time_travel")
    status = _cli(["status", "--db-url", engine.url.render_as_string(hide_password=False),
                   "--as-of", now.isoformat()], tmp_path)
    assert "IN THE FUTURE" in status.output and "-1 day" not in status.output, status.output


def test_replay_into_a_live_store_is_refused_unless_forced(tmp_path):
    _, path = setup_config(tmp_path)
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    engine = make_engine(url)
    upgrade(engine)
    # A replay's own heartbeats do not make a store live: replays may follow one another.
    replay = _cli(["run", "--config", str(path), "--db-url", url, "--as-of", "2027-01-10T00:00:00Z"], tmp_path)
    assert replay.exit_code == 0, replay.output
    real_now = datetime.now(UTC)
    with engine.begin() as conn:
        health.beat(conn, "deliver:idle", started_at=real_now, completed_at=real_now, outcome="idle")
    refused = _cli(["run", "--config", str(path), "--db-url", url, "--as-of", "2027-01-11T00:00:00Z"], tmp_path)
    assert refused.exit_code == 2, refused.output
    assert "is live" in refused.output and "deliver:idle" in refused.output and "--force-replay" in refused.output
    with engine.connect() as conn:
        assert health.read_heartbeats(conn)["deliver"]["last_completed_at"] == T0  # untouched
    forced = _cli(["run", "--config", str(path), "--db-url", url, "--as-of", "2027-01-11T00:00:00Z",
                   "--force-replay"], tmp_path)
    assert forced.exit_code in (0, 1), forced.output
    with engine.connect() as conn:
        beat = health.read_heartbeats(conn)["deliver"]
    assert beat["last_completed_at"] == T0 + timedelta(days=1) and beat["clock"] == "replay"
    engine.dispose()
