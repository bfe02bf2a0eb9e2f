"""The watch checks, the watchdog and the status command against the real store (SQLite and
PostgreSQL), with the stages run through their services and heartbeats recorded as the wiring does."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import delete, func, insert, select, update

from deadline_pipeline.cli import main
from deadline_pipeline.config import load_config
from deadline_pipeline.deliver.sweep import sweep
from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.plan.service import plan_all
from deadline_pipeline.store import health
from deadline_pipeline.store.schema import alerts, delivery_attempts, obligations, subscribers
from deadline_pipeline.watch import checks as w
from deadline_pipeline.watch.watchdog import Notice, evaluate, incident_notices, record_notice
from deadline_pipeline_tests.factories import ics, write_config

T0 = datetime(2027, 1, 10, tzinfo=UTC)
EVENT_A = dict(uid="a@test", tzid="Europe/Berlin", dtstart="20270115T120000", summary="File report A")
EVENT_B = dict(uid="b@test", tzid="America/New_York", dtstart="20270201T090000", summary="File report B",
               rrule="FREQ=MONTHLY")
TYPES = {"mail": "maildir"}


def setup_config(tmp_path, events=(EVENT_A, EVENT_B), location="cal.ics", **extra):
    """A one-source configuration (ann and bob, offsets -P7D/-P1D/PT0S, a maildir channel)."""
    if location == "cal.ics":
        (tmp_path / "cal.ics").write_text(ics(*events), newline="")
    path = write_config(
        tmp_path,
        sources=[{"name": "cal", "format": "ics", "location": location, "tenant": "t1", "freshness": "P1D"}],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "Europe/Berlin"},
                     {"id": "bob", "tenant": "t1", "email": "bob@example.org", "timezone": "Asia/Tokyo"}],
        subscriptions=[{"name": "all", "sources": ["cal"], "offsets": ["-P7D", "-P1D", "PT0S"],
                        "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}}, **extra,
    )
    return load_config(path)[0], path


def ingest(engine, cfg, now):
    """Observe + apply every source, recording the ``ingest:<name>`` heartbeat like the observer asset."""
    for s in cfg.sources:
        with health.recorded_run(engine, f"ingest:{s.name}", lambda: now) as beat:
            out = fetch_snapshot(engine, s, now, network=cfg.network.policy())
            if out.error:
                beat.update(outcome="failed", detail=out.error)
        apply_latest_snapshot(engine, s, now)


def plan(engine, cfg, now):
    with health.recorded_run(engine, "plan", lambda: now):
        return plan_all(engine, cfg, now)


def deliver(engine, cfg, now, **kw):
    with health.recorded_run(engine, "deliver", lambda: now):
        return sweep(engine, cfg, now, **kw)


def cycle(engine, cfg, now):
    ingest(engine, cfg, now)
    plan(engine, cfg, now)
    return deliver(engine, cfg, now)


def all_checks(engine, cfg, now) -> dict[str, w.CheckOutcome]:
    types = {n: c.type for n, c in cfg.channels.items()}
    outs = [w.alerts_reconciled(engine, now, timedelta(minutes=cfg.watch.grace_minutes)),
            w.sweep_alive(engine, now, timedelta(minutes=cfg.watch.sweep_interval_minutes),
                          timedelta(minutes=cfg.watch.heartbeat_grace_minutes)),
            w.horizon_planned(engine, cfg, now, timedelta(minutes=cfg.watch.plan_interval_minutes),
                              timedelta(days=cfg.plan.horizon_days)),
            w.fanout_complete(engine, now, timedelta(days=cfg.plan.horizon_days), types),
            w.escalations_acknowledged(engine, now)]
    return {o.name: o for o in outs}


def test_a_clean_cycle_is_all_green(engine, tmp_path):
    cfg, _ = setup_config(tmp_path)
    cycle(engine, cfg, T0)
    outs = all_checks(engine, cfg, T0)
    assert {n: o.passed for n, o in outs.items()} == dict.fromkeys(outs, True), {n: o.summary for n, o in outs.items()}
    assert evaluate(engine, T0, cfg).healthy


def every_check_text(engine, cfg, now) -> dict[str, str]:
    """What each check (the functions behind the Dagster asset checks) and each watchdog row says at
    ``now``: its summary and its offenders or metadata as JSON, by check name."""
    from deadline_pipeline.watch.reconcile import reminders_owed
    from deadline_pipeline.watch.sources import rules_complete, source_fresh, source_not_quarantined

    outs = [*all_checks(engine, cfg, now).values(), w.plan_complete(engine, now), w.time_data_agrees(engine, now),
            reminders_owed(engine, cfg, now, timedelta(minutes=cfg.watch.grace_minutes))]
    texts = {o.name: f"{o.summary} {json.dumps(o.offenders)}" for o in outs}
    for s in cfg.sources:
        for o in (source_fresh(engine, s.name, now), source_not_quarantined(engine, s.name),
                  rules_complete(engine, s.name)):
            texts[f"{o.name}[{s.name}]"] = f"{o.summary} {json.dumps(o.metadata)}"
    texts.update({f"watchdog {r.check} {r.target}": r.detail for r in evaluate(engine, now, cfg).rows})
    return texts


def test_every_check_prints_instants_to_the_second(engine, tmp_path):
    """Green after a cycle at a clock with microseconds, and red five silent days later (stale source,
    stopped sweep and planning, overdue reminders): no summary, offender or watchdog row shows a
    fraction of a second. Before, each check formatted its own instant and printed the clock's
    microseconds (``every alert due before 2027-01-09T23:30:00.551555+00:00``)."""
    cfg, _ = setup_config(tmp_path)
    now = T0 + timedelta(microseconds=551555)
    cycle(engine, cfg, now)
    green = every_check_text(engine, cfg, now)
    red = every_check_text(engine, cfg, now + timedelta(days=5, microseconds=212183))
    assert "every alert due before 2027-01-09T23:30:00+00:00" in green["alerts_reconciled"], green
    assert "last completed 2027-01-10T00:00:00+00:00" in red["sweep_alive"], red
    assert "last fresh 2027-01-10T00:00:00+00:00" in red["source_fresh[cal]"], red
    for name, text in {**green, **{f"{k} (red)": v for k, v in red.items()}}.items():
        assert not re.search(r"\.\d{6}", text), f"{name}: {text}"


def test_delivered_without_receipt_is_not_reconciled(engine, tmp_path):
    cfg, _ = setup_config(tmp_path)
    cycle(engine, cfg, T0)
    with engine.begin() as conn:
        forged = conn.execute(select(alerts.c.id).where(alerts.c.status == "pending").limit(1)).scalar_one()
        conn.execute(update(alerts).where(alerts.c.id == forged).values(status="delivered", delivered_at=T0))
    out = w.alerts_reconciled(engine, T0)
    assert not out.passed and out.count == 1
    assert out.offenders[0]["alert_id"] == forged and out.offenders[0]["reason"] == "delivered_without_receipt"
    assert "without a 'sent' delivery attempt" in out.summary
    row = {r.target: r for r in evaluate(engine, T0, cfg).rows if r.check == "alerts_reconciled"}
    assert not row["receipts"].ok and row["overdue"].ok


def test_sweep_alive_measures_the_newest_sweep_or_idle_tick(engine):
    assert not w.sweep_alive(engine, T0).passed
    with engine.begin() as conn:
        health.beat(conn, "deliver", started_at=T0, completed_at=T0, outcome="ok")
    assert w.sweep_alive(engine, T0 + timedelta(minutes=15)).passed
    late = w.sweep_alive(engine, T0 + timedelta(minutes=16))
    assert not late.passed and "16 min 0 s ago; expected within 15 min 0 s" in late.summary
    with engine.begin() as conn:
        health.beat(conn, "deliver:idle", started_at=T0 + timedelta(minutes=16),
                    completed_at=T0 + timedelta(minutes=16), outcome="idle")
    assert w.sweep_alive(engine, T0 + timedelta(minutes=20)).passed


def test_a_crashed_run_keeps_its_last_completion(engine, tmp_path):
    cfg, _ = setup_config(tmp_path)
    with engine.begin() as conn:
        health.beat(conn, "plan", started_at=T0, completed_at=T0, outcome="ok")
    try:
        with health.recorded_run(engine, "plan", lambda: T0 + timedelta(hours=1)):
            raise RuntimeError("planner exploded")
    except RuntimeError:
        pass
    with engine.connect() as conn:
        beat = health.read_heartbeats(conn)["plan"]
    assert beat["last_completed_at"] == T0 and beat["last_outcome"] == "crashed"
    assert beat["last_started_at"] == T0 + timedelta(hours=1) and "planner exploded" in beat["detail"]
    out = w.horizon_planned(engine, cfg, T0 + timedelta(hours=1))
    assert not out.passed and "crashed" in out.summary


def test_horizon_planned_names_stale_planning_and_uncovered_targets(engine, tmp_path):
    cfg, _ = setup_config(tmp_path)
    assert not w.horizon_planned(engine, cfg, T0).passed, "never planned"
    ingest(engine, cfg, T0)
    plan(engine, cfg, T0)
    assert w.horizon_planned(engine, cfg, T0 + timedelta(minutes=90)).passed
    stale = w.horizon_planned(engine, cfg, T0 + timedelta(minutes=91))
    assert not stale.passed and "planning last completed" in stale.summary
    # bob's obligations vanish (a planner that silently skips a target): red, naming bob.
    with engine.begin() as conn:
        bob = conn.execute(select(subscribers.c.id).where(subscribers.c.external_id == "bob")).scalar_one()
        conn.execute(update(obligations).where(obligations.c.subscriber_id == bob).values(status="withdrawn"))
    out = w.horizon_planned(engine, cfg, T0)
    assert not out.passed and out.offenders[0]["subscriber"] == "bob" and out.offenders[0]["source"] == "cal"


def test_fanout_complete_finds_missing_and_unwanted_reminders(engine, tmp_path):
    cfg, _ = setup_config(tmp_path)
    ingest(engine, cfg, T0)
    plan(engine, cfg, T0)
    assert w.fanout_complete(engine, T0, timedelta(days=366), TYPES).passed
    with engine.begin() as conn:
        victim = conn.execute(select(alerts.c.id, alerts.c.obligation_id, alerts.c.offset_seconds)
                              .where(alerts.c.send_at > T0).order_by(alerts.c.id).limit(1)).one()
        conn.execute(delete(alerts).where(alerts.c.id == victim.id))
    out = w.fanout_complete(engine, T0, timedelta(days=366), TYPES)
    assert not out.passed and out.count == 1
    assert out.offenders[0]["obligation_id"] == victim.obligation_id
    assert out.offenders[0]["missing"] == [[victim.offset_seconds, "mail"]]
    with engine.begin() as conn:
        ob = conn.execute(select(obligations.c.id).where(obligations.c.due_at > T0,
                                                         obligations.c.id != victim.obligation_id)
                          .limit(1)).scalar_one()
        conn.execute(insert(alerts).values(obligation_id=ob, offset_seconds=-3600, channel="mail", kind="reminder",
                                           dedup_key="x" * 64, send_at=T0 + timedelta(days=1), status="pending",
                                           attempts=0, created_at=T0, updated_at=T0))
    out = w.fanout_complete(engine, T0, timedelta(days=366), TYPES)
    assert not out.passed and out.count == 2
    assert [[-3600, "mail"]] in [o["unexpected"] for o in out.offenders]


def test_escalations_stay_red_until_acknowledged(engine, tmp_path, db_url):
    cfg, _ = setup_config(tmp_path)
    ingest(engine, cfg, T0)
    plan(engine, cfg, T0)
    assert w.escalations_acknowledged(engine, T0).passed
    with engine.begin() as conn:
        ids = conn.execute(select(alerts.c.id).order_by(alerts.c.id).limit(2)).scalars().all()
        conn.execute(update(alerts).where(alerts.c.id.in_(ids)).values(status="escalated", updated_at=T0))
    out = w.escalations_acknowledged(engine, T0 + timedelta(hours=1))
    assert not out.passed and out.count == 2 and out.offenders[0]["waiting_seconds"] == 3600
    res = CliRunner().invoke(main, ["alerts", "acknowledge", str(ids[0]), "--by", "oncall", "--db-url", db_url,
                                    "--as-of", "2027-01-10T01:00:00Z"])
    assert res.exit_code == 0 and "acknowledged 1 of 1" in res.output
    assert w.escalations_acknowledged(engine, T0).count == 1
    with engine.connect() as conn:
        row = conn.execute(select(alerts.c.acknowledged_by, alerts.c.acknowledged_at)
                           .where(alerts.c.id == ids[0])).one()
    assert row == ("oncall", T0 + timedelta(hours=1))
    # Retry puts the escalated one back in the queue, due now; cancel refuses it (no longer open).
    res = CliRunner().invoke(main, ["alerts", "retry", str(ids[1]), "--by", "oncall", "--db-url", db_url,
                                    "--as-of", "2027-01-10T02:00:00Z"])
    assert res.exit_code == 0 and "queued 1 of 1" in res.output
    with engine.connect() as conn:
        row = conn.execute(select(alerts.c.status, alerts.c.send_at, alerts.c.status_reason)
                           .where(alerts.c.id == ids[1])).one()
    assert row[:2] == ("pending", T0 + timedelta(hours=2))
    assert row[2].startswith("retried by oncall at 2027-01-10T02:00:00+00:00 after 0 attempt(s)")
    res = CliRunner().invoke(main, ["alerts", "cancel", str(ids[1]), str(ids[0]), "--by", "oncall",
                                    "--db-url", db_url, "--as-of", "2027-01-10T02:00:00Z"])
    assert res.exit_code == 1 and "cancelled 1 of 2" in res.output


def test_incidents_page_once_remind_and_resolve():
    state: dict = {}
    reminder = timedelta(minutes=60)
    first = incident_notices(state, {"check alerts": "12 overdue"}, T0, reminder)
    assert [n.phase for n in first] == ["opened"] and "12 overdue" in first[0].title
    # Not sent (channel down): still due on the next tick, same incident, same opening time.
    again = incident_notices(state, {"check alerts": "12 overdue"}, T0 + timedelta(minutes=1), reminder)
    assert [n.phase for n in again] == ["opened"] and again[0].dedup_key == first[0].dedup_key
    record_notice(state, again[0], T0 + timedelta(minutes=1))
    # A draining backlog changes the summary, never re-opens the incident.
    for minutes, left in ((2, 9), (10, 5), (30, 1)):
        assert incident_notices(state, {"check alerts": f"{left} overdue"}, T0 + timedelta(minutes=minutes),
                                reminder) == []
    rem = incident_notices(state, {"check alerts": "1 overdue"}, T0 + timedelta(minutes=61), reminder)
    assert [n.phase for n in rem] == ["reminder"] and rem[0].number == 1
    record_notice(state, rem[0], T0 + timedelta(minutes=61))
    done = incident_notices(state, {}, T0 + timedelta(minutes=70), reminder)
    assert [n.phase for n in done] == ["resolved"] and "was: 1 overdue" in done[0].detail
    record_notice(state, done[0], T0 + timedelta(minutes=70))
    assert state == {}
    # Healed before anyone was told: forgotten without a resolved notice.
    incident_notices(state, {"run x": "failed"}, T0, reminder)
    assert incident_notices(state, {}, T0, reminder) == [] and state == {}
    assert isinstance(first[0], Notice)


def _run_cli(args, tmp_path):
    env = {"DEADLINE_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    return CliRunner().invoke(main, args, env=env, catch_exceptions=False)


def test_watchdog_after_a_run_and_two_silent_days(tmp_path):
    """`run` at T, then `watchdog --as-of` T + 2 days with nothing in between: exit 1 naming the
    stopped sweep and the stale source; at T itself: exit 0."""
    _, path = setup_config(tmp_path)
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    res = _run_cli(["run", "--config", str(path), "--db-url", url, "--as-of", "2027-01-10T00:00:00Z"], tmp_path)
    assert res.exit_code == 0, res.output
    ok = _run_cli(["watchdog", "--config", str(path), "--db-url", url, "--as-of", "2027-01-10T00:05:00Z"], tmp_path)
    assert ok.exit_code == 0, ok.output
    assert "healthy" in ok.output
    red = _run_cli(["watchdog", "--config", str(path), "--db-url", url, "--as-of", "2027-01-12T00:00:00Z"], tmp_path)
    assert red.exit_code == 1, red.output
    failing = [line for line in red.output.splitlines() if line.startswith("FAIL")]
    assert any("sweep_alive" in line and "stopped" in line for line in failing), red.output
    assert any("source_fresh" in line and "cal" in line for line in failing), red.output
    assert any("plan_alive" in line for line in failing) and any("ingest_alive" in line for line in failing)
    status = _run_cli(["status", "--config", str(path), "--db-url", url, "--as-of", "2027-01-12T00:00:00Z"],
                      tmp_path)
    assert status.exit_code == 0, status.output
    for needle in ("sources:", "cal", "rule versions", "obligations due in the horizon", "alerts:", "overdue",
                   "heartbeats:", "deliver"):
        assert needle in status.output, status.output


def test_watchdog_reports_an_unreachable_store(tmp_path):
    res = _run_cli(["watchdog", "--db-url", "postgresql://nobody@127.0.0.1:1/none", "--as-of",
                    "2027-01-10T00:00:00Z"], tmp_path)
    assert res.exit_code == 1 and "cannot read the store" in res.output
    bad = _run_cli(["watchdog", "--as-of", "2027-01-10T00:00:00"], tmp_path)
    assert bad.exit_code == 2 and "no offset" in bad.output


def test_a_page_to_a_dripping_receiver_ends_within_the_channel_timeout():
    """The watchdog pages synchronously: an on-call webhook dripping its header block a byte every
    0.2 s (each read within the 1 s timeout) must not hold the page for the whole 6 s drip. The page
    is returned as failed, naming the timeout, so the caller logs it and pages again."""
    from deadline_pipeline.config import DeadlinesConfig, EscalationConfig, WebhookChannel
    from deadline_pipeline.watch.watchdog import send_notice
    from deadline_pipeline_tests.drip_server import DripServer
    from deadline_pipeline_tests.factories import LOOPBACK_NETWORK

    now = datetime(2027, 1, 10, tzinfo=UTC)
    notice = Notice(key="check sweep_alive", phase="opened", title="sweep stopped", detail="no heartbeat",
                    opened_at=now)
    with DripServer("headers") as oncall:
        cfg = DeadlinesConfig(channels={"pager": WebhookChannel(type="webhook", timeout_seconds=1)},
                              escalation=EscalationConfig(channels=["pager"], webhook_url=f"{oncall.url}/page"),
                              network=LOOPBACK_NETWORK)
        started = time.monotonic()
        errors = send_notice(cfg, notice, now)
        elapsed = time.monotonic() - started
        assert oncall.requests == 1
    assert elapsed < 2.0, f"the page took {elapsed:.1f} s with a 1 s timeout"
    [error] = errors
    assert "escalation channel 'pager'" in error and "ReadTimeout" in error
    # The page is what may have arrived; "the alert may have been delivered" (the webhook channel's
    # words for an alert) read as news of an alert that was escalated because it was not.
    assert "the notice may have been delivered" in error and "alert" not in error, error


def test_reminders_owed_owes_an_added_offset_only_where_planning_could_still_write_it(engine, tmp_path):
    """Offsets -P7D/-P1D/PT0S become -P1D/-PT2H/PT0S after report A's deadline has passed: planning
    never re-plans a deadline before its window, so A's -PT2H reminder was never owed; the check paged
    "never planned" for the week of its lookback. Report B, still ahead, is re-planned with the new
    offset: its -PT2H row missing is a real miss and stays red."""
    from deadline_pipeline.watch.reconcile import reminders_owed

    cfg, path = setup_config(tmp_path)
    due_a = datetime(2027, 1, 15, 11, 0, tzinfo=UTC)  # 12:00 Berlin
    cycle(engine, cfg, due_a - timedelta(days=8))
    cycle(engine, cfg, due_a + timedelta(hours=1))
    path.write_text(path.read_text().replace("- -P7D\n", "- -PT2H\n"))
    cfg = load_config(path)[0]
    later = due_a + timedelta(hours=3)
    cycle(engine, cfg, later)
    out = reminders_owed(engine, cfg, later)
    assert out.passed, out.summary

    due_b = datetime(2027, 2, 1, 14, 0, tzinfo=UTC)  # 09:00 New York
    with engine.begin() as conn:
        victims = conn.execute(select(alerts.c.id).join(obligations, obligations.c.id == alerts.c.obligation_id)
                               .where(obligations.c.due_at == due_b, alerts.c.offset_seconds == -7200)).scalars().all()
        assert len(victims) == 2, victims  # ann and bob
        conn.execute(delete(alerts).where(alerts.c.id == victims[0]))
    out = reminders_owed(engine, cfg, due_b - timedelta(hours=1))
    assert not out.passed and out.count == 1, out.summary
    (offender,) = out.offenders
    assert offender["offset_seconds"] == -7200 and offender["reason"].startswith("never planned"), offender


def test_reminders_owed_excuses_no_missing_row_of_a_deadline_two_subscriptions_share(engine, tmp_path):
    """Two subscriptions of one subscriber to one source plan one obligation whose fingerprint
    combines both (:func:`~deadline_pipeline.plan.planner.merged_fingerprint`). Recomputed from the
    last subscription alone, it never matched the stored one, so once such a deadline had passed a
    missing reminder row was taken for an offset added after planning and excused: green, with the
    configuration unchanged. Recomputed as planning combines it, the row missing is red."""
    from deadline_pipeline.watch.reconcile import reminders_owed

    _, path = setup_config(tmp_path, events=(EVENT_A,))
    close = "- {name: close, sources: [cal], offsets: [-PT2H], channels: [mail]}\n"
    path.write_text(path.read_text().replace("subscriptions:\n", "subscriptions:\n" + close, 1))
    cfg = load_config(path)[0]
    assert [s.name for s in cfg.subscriptions] == ["close", "all"]
    due_a = datetime(2027, 1, 15, 11, 0, tzinfo=UTC)
    cycle(engine, cfg, due_a - timedelta(days=8))
    cycle(engine, cfg, due_a - timedelta(hours=3))  # -P1D sent; -PT2H still pending, no attempt yet
    later = due_a + timedelta(hours=3)
    with engine.begin() as conn:
        (victim,) = conn.execute(select(alerts.c.id).join(obligations, obligations.c.id == alerts.c.obligation_id)
                                 .where(obligations.c.due_at == due_a, alerts.c.offset_seconds == -7200,
                                        obligations.c.subscriber_id == select(subscribers.c.id).where(
                                            subscribers.c.external_id == "ann").scalar_subquery())).scalars().all()
        conn.execute(delete(alerts).where(alerts.c.id == victim))
    out = reminders_owed(engine, cfg, later)
    assert not out.passed and out.count == 1, out.summary
    (offender,) = out.offenders
    assert (offender["subscriber"], offender["offset_seconds"]) == ("ann", -7200), offender
    assert offender["reason"].startswith("never planned"), offender


def test_run_exits_0_after_an_offset_is_added_to_a_passed_deadline(tmp_path, pg_url):
    """The sequence seen: `run`s around report A's deadline with -P7D/-P1D/PT0S, then the offsets
    become -P1D/-PT2H/PT0S; every `run` of the next week said `reminders_owed FAIL ... offset -7200s
    ... never planned` and exited 1 for a reminder no planning run could write."""
    _, path = setup_config(tmp_path, events=(EVENT_A,))
    for at in ("2027-01-07T11:00:00Z", "2027-01-14T11:00:00Z", "2027-01-15T11:00:00Z"):
        res = _run_cli(["run", "--config", str(path), "--db-url", pg_url, "--as-of", at], tmp_path)
        assert res.exit_code == 0, res.output
    path.write_text(path.read_text().replace("- -P7D\n", "- -PT2H\n"))
    res = _run_cli(["run", "--config", str(path), "--db-url", pg_url, "--as-of", "2027-01-15T14:00:00Z"], tmp_path)
    line = next(s for s in res.output.splitlines() if "reminders_owed" in s)
    assert res.exit_code == 0 and " PASS " in line, res.output


EVENT_C = dict(uid="c@test", tzid="Europe/Berlin", dtstart="20270301T100000", summary="File report C",
               rrule="FREQ=MONTHLY")


def _bob(engine):
    with engine.connect() as conn:
        return conn.execute(select(subscribers.c.id).where(subscribers.c.external_id == "bob")).scalar_one()


def test_horizon_planned_names_a_rule_left_without_obligations_beside_covered_ones(engine, tmp_path):
    """A partition run withdrew one rule's obligations while the other rules of the source kept theirs:
    judged per (subscriber, source) the check stayed green until a reminder's send time had passed.
    Judged per rule, it is red at once and names the rule and its next occurrence."""
    cfg, _ = setup_config(tmp_path, events=(EVENT_A, EVENT_B, EVENT_C))
    cycle(engine, cfg, T0)
    assert all_checks(engine, cfg, T0)["horizon_planned"].passed
    with engine.begin() as conn:
        conn.execute(update(obligations).where(obligations.c.subscriber_id == _bob(engine),
                                               obligations.c.rule_id == "c@test").values(status="withdrawn"))
    out = all_checks(engine, cfg, T0)["horizon_planned"]
    # C is monthly from 1 March: March 2027 to January 2028 lie in the judged window, each missing.
    assert not out.passed and out.count == 11, out.summary
    assert out.offenders[0] == {"subscriber": "bob", "source": "cal", "rule_id": "c@test",
                                "due_at": "2027-03-01T09:00:00+00:00"}
    assert len(out.offenders) == 10 and {o["rule_id"] for o in out.offenders} == {"c@test"}
    assert "11 occurrence(s) of 1 rule(s) for 1 subscriber(s)" in out.summary, out.summary
    assert "bob × cal rule c@test due 2027-03-01T09:00:00+00:00" in out.summary


EVENT_W = dict(uid="w@test", tzid="Europe/Berlin", dtstart="20270201T100000", summary="Weekly check-in",
               rrule="FREQ=WEEKLY;COUNT=8")


def test_horizon_planned_names_one_missing_occurrence_of_a_rule_whose_others_are_planned(engine, tmp_path):
    """A weekly rule with eight occurrences ahead, one obligation of which is gone from the store
    (deleted, not withdrawn: a planner that skipped one occurrence). Judged per rule the other seven
    kept the check green, and only reminders_owed turned red once the missing reminder's send time
    had passed. Judged per occurrence, it is red at once and names that occurrence's due instant."""
    cfg, _ = setup_config(tmp_path, events=(EVENT_A, EVENT_W))
    cycle(engine, cfg, T0)
    assert all_checks(engine, cfg, T0)["horizon_planned"].passed
    third = datetime(2027, 2, 15, 9, tzinfo=UTC)  # Monday 15 February, 10:00 in Berlin
    with engine.begin() as conn:
        ids = conn.execute(select(obligations.c.id).where(obligations.c.subscriber_id == _bob(engine),
                                                          obligations.c.rule_id == "w@test",
                                                          obligations.c.due_at == third)).scalars().all()
        assert len(ids) == 1, ids
        conn.execute(delete(alerts).where(alerts.c.obligation_id == ids[0]))
        conn.execute(delete(obligations).where(obligations.c.id == ids[0]))
        left = conn.execute(select(func.count()).select_from(obligations)
                            .where(obligations.c.rule_id == "w@test", obligations.c.subscriber_id == _bob(engine),
                                   obligations.c.status == "active")).scalar_one()
    assert left == 7
    out = all_checks(engine, cfg, T0)["horizon_planned"]
    assert not out.passed and out.count == 1, out.summary
    assert out.offenders == [{"subscriber": "bob", "source": "cal", "rule_id": "w@test",
                              "due_at": "2027-02-15T09:00:00+00:00"}]
    assert "bob × cal rule w@test due 2027-02-15T09:00:00+00:00" in out.summary, out.summary


def test_horizon_planned_names_a_missing_obligation_due_within_the_week(engine, tmp_path):
    """A deadline five days ahead (A, 15 January) whose obligation is gone: judged only from a week
    ahead on, the check stayed green, and nothing was red until a reminder's send time had passed
    (reminders_owed) — for a -P1D reminder, the day before the deadline. It is judged from the grace on."""
    cfg, _ = setup_config(tmp_path, events=(EVENT_A, EVENT_W))
    cycle(engine, cfg, T0)
    with engine.begin() as conn:
        ids = conn.execute(select(obligations.c.id).where(obligations.c.subscriber_id == _bob(engine),
                                                          obligations.c.rule_id == "a@test")).scalars().all()
        assert len(ids) == 1, ids
        its_alerts = select(alerts.c.id).where(alerts.c.obligation_id == ids[0])
        conn.execute(delete(delivery_attempts).where(delivery_attempts.c.alert_id.in_(its_alerts)))
        conn.execute(delete(alerts).where(alerts.c.obligation_id == ids[0]))
        conn.execute(delete(obligations).where(obligations.c.id == ids[0]))
    out = all_checks(engine, cfg, T0)["horizon_planned"]
    assert not out.passed and out.count == 1, out.summary
    assert out.offenders == [{"subscriber": "bob", "source": "cal", "rule_id": "a@test",
                              "due_at": "2027-01-15T11:00:00+00:00"}]


def test_horizon_planned_is_green_for_a_master_whose_occurrence_an_override_moved(engine, tmp_path):
    """A RECURRENCE-ID override moves C's March occurrence; planning folds it into the master (the
    master plans April on, the override March). The master is judged as planned: its first occurrence
    ahead is April, which it has, and the override's own obligation is its own."""
    moved = dict(uid="c@test", tzid="Europe/Berlin", dtstart="20270305T100000", summary="File report C (moved)",
                 recurrence_id="20270301T100000")
    cfg, _ = setup_config(tmp_path, events=(EVENT_A, EVENT_B, EVENT_C, moved))
    cycle(engine, cfg, T0)
    out = all_checks(engine, cfg, T0)["horizon_planned"]
    assert out.passed, out.summary
    # The override's obligation withdrawn: red, naming the override, not the master.
    with engine.begin() as conn:
        conn.execute(update(obligations).where(obligations.c.rule_id.like("c@test#%")).values(status="withdrawn"))
    out = all_checks(engine, cfg, T0)["horizon_planned"]
    assert not out.passed and all(o["rule_id"].startswith("c@test#") for o in out.offenders), out.offenders


def test_horizon_planned_does_not_judge_a_rule_ingested_after_the_last_planning_run(engine, tmp_path):
    """A rule ingested after the last planning run started has no obligation until the next run: not
    an alarm in those minutes; the next run plans it, and only a run that then leaves it out is red."""
    cfg, _ = setup_config(tmp_path)
    cycle(engine, cfg, T0)
    (tmp_path / "cal.ics").write_text(ics(EVENT_A, EVENT_B, EVENT_C), newline="")
    later = T0 + timedelta(minutes=10)
    ingest(engine, cfg, later)
    assert all_checks(engine, cfg, later)["horizon_planned"].passed
    plan(engine, cfg, later + timedelta(minutes=20))
    with engine.begin() as conn:
        conn.execute(update(obligations).where(obligations.c.rule_id == "c@test").values(status="withdrawn"))
    out = all_checks(engine, cfg, later + timedelta(minutes=30))["horizon_planned"]
    assert not out.passed and {o["rule_id"] for o in out.offenders} == {"c@test"}, out.offenders


def test_horizon_planned_matches_a_renamed_rule_through_its_lineage(engine, tmp_path):
    """An ai-deadlines edition renamed (c127 → conf1-2027) keeps its obligations, keyed on its first
    id: green after the re-plan, and green while an obligation still carries the first id (matched
    through the lineage, as planning keys it), not a false alarm naming the new id."""
    from deadline_pipeline_tests.factories import ai_deadlines

    def edition(i, **over):
        return {"title": f"C{i}", "year": 2027, "id": f"c{i}27", "deadline": f"2027-03-0{i} 23:59",
                "timezone": "UTC-12", **over}

    (tmp_path / "conf.yml").write_text(ai_deadlines(*[edition(i) for i in range(1, 5)]))
    cfg = load_config(write_config(
        tmp_path, sources=[{"name": "conf", "format": "ai-deadlines", "location": "conf.yml", "tenant": "t1"}],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "Europe/Berlin"}],
        subscriptions=[{"name": "all", "sources": ["conf"], "offsets": ["PT0S"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}}))[0]
    cycle(engine, cfg, T0)
    (tmp_path / "conf.yml").write_text(ai_deadlines(edition(1, id="conf1-2027"),
                                                    *[edition(i) for i in range(2, 5)]))
    later = T0 + timedelta(minutes=1)
    cycle(engine, cfg, later)
    out = all_checks(engine, cfg, later)["horizon_planned"]
    assert out.passed, out.summary
    with engine.begin() as conn:
        moved = conn.execute(update(obligations).where(obligations.c.rule_id == "conf1-2027/submission/deadline")
                             .values(rule_id="c127/submission/deadline")).rowcount
    assert moved == 1
    out = all_checks(engine, cfg, later)["horizon_planned"]
    assert out.passed, out.summary


def _rolled_config(tmp_path, event: dict, convention: str):
    """One source of ``event`` whose due dates roll to US business days by ``convention``; ann
    subscribes with one offset on a maildir channel."""
    (tmp_path / "cal.ics").write_text(ics(event), newline="")
    return load_config(write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t1",
                            "business_days": {"calendar": "US", "convention": convention}}],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "Europe/Berlin"}],
        subscriptions=[{"name": "all", "sources": ["cal"], "offsets": ["PT0S"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}}))[0]


def test_horizon_planned_is_green_for_a_due_date_rolled_to_an_earlier_business_day(engine, tmp_path):
    """Due Monday 18 January 2027 (Martin Luther King Jr. Day, a US holiday) with the 'preceding'
    convention: planned for Friday the 15th, five days ahead. The check reads the due date rolled, as
    planning does: before the judged window (seven days on), not expected, where the unrolled Monday,
    eight days ahead, would be."""
    cfg = _rolled_config(tmp_path, dict(uid="mlk@test", tzid="America/New_York", dtstart="20270118T120000",
                                        summary="Filing"), "preceding")
    cycle(engine, cfg, T0)
    with engine.connect() as conn:
        due = conn.execute(select(obligations.c.due_at)).scalar_one()
    assert due.date().isoformat() == "2027-01-15", due
    out = all_checks(engine, cfg, T0)["horizon_planned"]
    assert out.passed, out.summary


def test_horizon_planned_names_a_missing_occurrence_by_its_due_date_rolled_to_a_later_business_day(
        engine, tmp_path):
    """Saturdays at noon in New York rolled 'following' over the US calendar: Saturday 13 February
    2027 rolls past Presidents' Day (Monday the 15th) to Tuesday the 16th. That obligation gone from
    the store, the check is red naming Tuesday's instant, the one planning plans and reminds of."""
    cfg = _rolled_config(tmp_path, dict(uid="sat@test", tzid="America/New_York", dtstart="20270130T120000",
                                        summary="Weekend filing", rrule="FREQ=WEEKLY;COUNT=4"), "following")
    cycle(engine, cfg, T0)
    with engine.connect() as conn:
        planned = dict(conn.execute(select(obligations.c.due_at, obligations.c.id)).all())
    assert sorted(d.date().isoformat() for d in planned) == ["2027-02-01", "2027-02-08", "2027-02-16", "2027-02-22"]
    assert all_checks(engine, cfg, T0)["horizon_planned"].passed
    tuesday = datetime(2027, 2, 16, 17, tzinfo=UTC)
    with engine.begin() as conn:
        conn.execute(delete(alerts).where(alerts.c.obligation_id == planned[tuesday]))
        conn.execute(delete(obligations).where(obligations.c.id == planned[tuesday]))
    out = all_checks(engine, cfg, T0)["horizon_planned"]
    assert not out.passed and out.offenders == [{"subscriber": "ann", "source": "cal", "rule_id": "sat@test",
                                                 "due_at": "2027-02-16T17:00:00+00:00"}], out.summary


def test_horizon_planned_does_not_expect_a_master_whose_occurrences_ahead_overrides_took(engine, tmp_path):
    """A two-occurrence series (1 February, 1 March) whose February occurrence is cancelled and whose
    March one an override moved to the 5th: planning folds the overrides in (the master has no
    occurrence left; the moved one is planned under the override's id). Read unfolded, the master's
    1 February looked owed and the check was red for a rule planning rightly left without obligations."""
    master = dict(uid="d@test", tzid="Europe/Berlin", dtstart="20270201T100000", summary="File report D",
                  rrule="FREQ=MONTHLY;COUNT=2")
    cancelled = dict(uid="d@test", tzid="Europe/Berlin", dtstart="20270201T100000", summary="File report D",
                     recurrence_id="20270201T100000", status="CANCELLED")
    moved = dict(uid="d@test", tzid="Europe/Berlin", dtstart="20270305T100000", summary="File report D (moved)",
                 recurrence_id="20270301T100000")
    cfg, _ = setup_config(tmp_path, events=(EVENT_A, EVENT_B, master, cancelled, moved))
    cycle(engine, cfg, T0)
    with engine.connect() as conn:
        planned = set(conn.execute(select(obligations.c.rule_id, obligations.c.due_at)
                                   .where(obligations.c.rule_id.like("d@test%"),
                                          obligations.c.status == "active")).all())
    assert {due.date().isoformat() for _rid, due in planned} == {"2027-03-05"}, planned
    assert all(rid.startswith("d@test#") for rid, _due in planned), planned
    out = all_checks(engine, cfg, T0)["horizon_planned"]
    assert out.passed, out.summary
