"""Operations commands: ``watchdog`` (cron / Kubernetes CronJob beside Dagster), ``status`` (a human
summary); a human takes over escalated alerts with ``alerts acknowledge`` (alert_cmds).

``watchdog`` imports neither dagster nor the orchestration package: it must still work, and say
what is wrong, when the Dagster daemon or the pipeline's code is what broke. It reads the store
without applying migrations (a watcher does not write schema).
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click

from deadline_pipeline.commands.common import EXIT_OK, EXIT_RED, config_option, open_store_read_only, option_instant
from deadline_pipeline.commands.common import fail_input as _fail_input
from deadline_pipeline.instants import instant_text
from deadline_pipeline.wording import human_duration


def _now(as_of: str | None) -> datetime:
    """``--as-of`` as aware UTC (an instant without an offset is refused), else the real clock."""
    return datetime.now(UTC) if as_of is None else option_instant(as_of)


def _config(path: str | None, required: bool):
    """The configuration at ``path`` (or ``./deadlines.yaml`` when present); None when there is none
    and it is optional. A broken file is always bad input."""
    from deadline_pipeline.commands.common import find_config
    from deadline_pipeline.config import ConfigError, load_config

    path = find_config(path)
    if path is None:
        if required:
            _fail_input("--notify needs the configuration (--config or DEADLINE_CONFIG) for escalation.channels")
        click.echo("note: no configuration given; default intervals, every source in the store", err=True)
        return None
    try:
        return load_config(path)[0]
    except ConfigError as exc:
        _fail_input(str(exc))


def _ping(url: str, ok: bool, cfg=None) -> str | None:
    """A healthchecks-style GET: ``url`` on success, ``url/fail`` on failure. Returns the error or None.

    The request passes the outbound guard with the configuration's ``network`` policy (the default
    policy without a configuration); the URL (its path is the check's secret) is shown redacted.
    """
    import httpx

    from deadline_pipeline.security.outbound import DEFAULT_POLICY, OutboundRefused, guarded_httpx_client
    from deadline_pipeline.security.redact import redact, redact_url

    target = url if ok else url.rstrip("/") + "/fail"
    shown = redact_url(target)
    policy = cfg.network.policy() if cfg is not None else DEFAULT_POLICY
    try:
        with guarded_httpx_client(policy, timeout=10.0) as client:
            resp = client.get(target)
        if resp.status_code >= 400:
            return f"ping {shown}: HTTP {resp.status_code}"
    except OutboundRefused as exc:
        return f"ping {shown}: {exc}"
    except httpx.HTTPError as exc:
        return redact(f"ping {shown}: {exc.__class__.__name__}: {exc}")
    return None


def _watchdog_argument_problems(ping_url: str | None, state_path: str | None) -> list[str]:
    """What is wrong with the watchdog's ``--ping-url`` and ``--state`` before any check runs (``[]``
    when nothing). ``--ping-url not-a-url`` printed "healthy", then a warning naming httpx's
    ``UnsupportedProtocol``, and exited 1 as if the pipeline were red; a ``--state`` file in a
    missing folder ran every check and then failed with ``FileNotFoundError``. The URL is not
    echoed: its path is the check's secret."""
    from urllib.parse import urlsplit

    problems = []
    if ping_url is not None:
        parts = urlsplit(ping_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append("--ping-url: not an http(s) URL with a host (e.g. https://hc-ping.com/<uuid>)")
    if state_path is not None:
        folder = Path(state_path).resolve().parent
        if not folder.is_dir():
            problems.append(f"--state {state_path}: the folder {folder} does not exist")
    return problems


def _notify(cfg, report, now: datetime, state_path: str | None) -> list[str]:
    """Page the escalation channels about the report's red rows, each an incident keyed
    ``deadline-pipeline/watchdog/<check>/<target>``. With ``state_path`` (a JSON file) once per
    incident, reminders and a resolved notice; without it, one page per red run."""
    from deadline_pipeline.watch.watchdog import Problem, incident_notices, record_notice, send_notice

    state: dict = {}
    if state_path and Path(state_path).exists():
        try:
            state = json.loads(Path(state_path).read_text())["incidents"]
        except (ValueError, KeyError) as exc:
            click.echo(f"warning: state file {state_path} unreadable ({exc}); starting afresh", err=True)
    # The state key stays as earlier releases wrote it (an upgrade neither re-pages nor resolves
    # what is open); the incident key comes from the check and target.
    failing = {f"watchdog {r.key}": Problem(r.check, r.target, r.detail, component="watchdog") for r in report.failing}
    if not state_path:
        state = {}
    notices = incident_notices(state, failing, now, timedelta(minutes=cfg.escalation.reminder_minutes))
    errors = []
    for notice in notices:
        problems = send_notice(cfg, notice, now)
        if problems:
            errors.extend(problems)
        else:
            record_notice(state, notice, now)
    if state_path:
        Path(state_path).write_text(json.dumps({"incidents": state}, sort_keys=True, indent=1))
    return errors


def register(main: click.Group) -> None:
    @main.command()
    @config_option
    @click.option("--db-url", envvar="DEADLINE_DB_URL", help="Store URL (default: the embedded SQLite file).")
    @click.option("--as-of", help="Evaluate as if now were this ISO 8601 instant (e.g. 2026-05-01T12:00:00Z).")
    @click.option("--notify", is_flag=True, help="Page the escalation channels when something is red.")
    @click.option("--state", "state_path", type=click.Path(dir_okay=False),
                  help="JSON file remembering open incidents, so --notify pages once per incident.")
    @click.option("--ping-url", help="Dead man's switch: GET this URL when healthy, URL/fail when not.")
    def watchdog(config, db_url, as_of, notify, state_path, ping_url) -> None:
        """Check the pipeline's invariants straight from the store; exit 0 healthy, 1 with reasons.

        Shares nothing with the Dagster daemon: run it from cron or a Kubernetes CronJob. Without a
        configuration it uses the default intervals and every source in the store (--notify needs one).
        """
        from deadline_pipeline.watch.watchdog import evaluate

        for problem in _watchdog_argument_problems(ping_url, state_path):
            _fail_input(problem)
        now = _now(as_of)
        cfg = _config(config, required=notify)
        engine, no_schema = open_store_read_only(db_url)
        if no_schema:
            from deadline_pipeline.watch.watchdog import WatchReport, WatchRow

            # A monitor pointed at an empty store has found something: one red row, no SQL dump.
            report = WatchReport(now, [WatchRow("store", "schema", False, no_schema)])
        else:
            report = evaluate(engine, now, cfg)
        click.echo(f"watchdog as of {instant_text(now)}")
        click.echo(report.table())
        problems = []
        if notify:
            problems += _notify(cfg, report, now, state_path)
        if ping_url:
            err = _ping(ping_url, report.healthy, cfg)
            if err:
                problems.append(err)
        for p in problems:
            click.echo(f"warning: {p}", err=True)
        if report.healthy:
            click.echo("healthy")
            sys.exit(EXIT_OK)
        click.echo(f"\nNOT HEALTHY: {len(report.failing)} problem(s):", err=True)
        for r in report.failing:
            click.echo(f"  {r.check} {r.target}: {r.detail}", err=True)
        sys.exit(EXIT_RED)

    @main.command()
    @config_option
    @click.option("--db-url", envvar="DEADLINE_DB_URL", help="Store URL (default: the embedded SQLite file).")
    @click.option("--as-of", help="Summarise as if now were this ISO 8601 instant.")
    def status(config, db_url, as_of) -> None:
        """A human summary: sources, rule versions, obligations in the horizon, alerts, heartbeats.
        Without a configuration it uses the default horizon and grace window."""
        now = _now(as_of)
        cfg = _config(config, required=False)
        engine, no_schema = open_store_read_only(db_url)
        if no_schema:
            _fail_input(no_schema)
        click.echo(status_text(engine, now, cfg))


def _planned_with_other_time_data(planned_with: dict[tuple[str | None, str | None], int]) -> str | None:
    """The ``status`` line for obligations still ahead that were planned with other zone data or
    another holiday release than this process reads (``planned_with``: (zone data, calendar data) →
    count, NULL = not recorded or not decided by that input), else ``None``.

    ``status`` printed both versions a line apart with nothing to say they disagree: a store planned
    with IANA 2026f read by a process on 2025b looked as healthy as any other (only the watchdog's
    ``time_data_agrees`` said it)."""
    from deadline_pipeline.watch.checks import time_data_change, time_data_in_force

    in_force = time_data_in_force()
    zone, calendar, _engine = in_force
    # Obligations are grouped by zone and calendar data only: the engine is left out of the comparison.
    other = sum(n for (z, c), n in planned_with.items() if time_data_change((z, c, None), in_force))
    if not other:
        return None
    return (f"  DIFFERENT TIME DATA: {other} of them were planned with other zone data or another holiday release "
            f"than this process reads (IANA {zone} / {calendar}); their instants may be off until the horizon is "
            "re-planned with the data the planners use (the replan_on_time_data sensor does it; the "
            "time_data_agrees check names each process's data)")


def status_text(engine, now: datetime, cfg=None) -> str:
    """The ``status`` summary at ``now`` (aware UTC) as text."""
    from deadline_pipeline.store import health
    from deadline_pipeline.store.operations import count_active_obligations_due, rule_version_counts
    from deadline_pipeline.store.sources import all_sources

    horizon = timedelta(days=cfg.plan.horizon_days if cfg else 366)
    grace = timedelta(minutes=cfg.watch.grace_minutes if cfg else 30)
    with engine.connect() as conn:
        srcs = all_sources(conn)
        versions = rule_version_counts(conn)
        rules = health.active_rule_payloads(conn)
        in_horizon = count_active_obligations_due(conn, now, now + horizon)
        states = health.alerts_by_state(conn)
        overdue, oldest = health.overdue_alerts(conn, now - grace, 1)
        beats = health.read_heartbeats(conn)
        planned_with = health.time_data_of_obligations(conn, now)
    from deadline_pipeline.zone_data import time_data_text

    lines = [f"status as of {instant_text(now)}", f"time data in force: {time_data_text()}", "sources:"]
    for s in srcs:
        age = ("never" if not s.last_fresh_at else f"{human_duration(now - s.last_fresh_at)} ago"
               if s.last_fresh_at <= now else f"{human_duration(s.last_fresh_at - now)} IN THE FUTURE")
        err = f"  last error: {s.last_error}" if s.last_error else ""
        lines.append(f"  {s.name:<24} {s.status:<8} last fresh {age}{err}")
    lines.append("rule versions (active rules / versions / withdrawals):")
    names = {s.id: s.name for s in srcs}
    for sid, name in sorted(names.items(), key=lambda kv: kv[1]):
        lines.append(f"  {name:<24} {len(rules.get(sid, {}))} / {versions.get((sid, False), 0)} / "
                     f"{versions.get((sid, True), 0)}")
    lines.append(f"obligations due in the horizon ({horizon.days} days): {in_horizon}")
    if planned_with:
        lines.append("  planned with (obligations due from now, by zone data / calendar data): " + ", ".join(
            f"IANA {z or 'unrecorded'} / {c or '-'}: {n}" for (z, c), n in sorted(planned_with.items(), key=str)))
        other = _planned_with_other_time_data(planned_with)
        if other:
            lines.append(other)
    lines.append("alerts: " + (", ".join(f"{k} {v}" for k, v in sorted(states.items())) or "none"))
    if overdue:
        o = oldest[0]
        lines.append(f"overdue (past {human_duration(grace)} grace): {overdue}; oldest alert {o['id']} "
                     f"due {instant_text(o['send_at'])} "
                     f"({o['status']}, {o['channel']}, {o['subscriber']}: {o['title']})")
    else:
        lines.append("overdue: none")
    lines.append("heartbeats:")
    for comp, b in sorted(beats.items()):
        done = b["last_completed_at"]
        # A heartbeat after now (a replay ahead of the clock) printed as "-1 day, 14:32:24 ago" and
        # read as healthy; say what it is.
        when = ("never" if not done else f"{human_duration(now - done)} ago" if done <= now else
                f"{human_duration(done - now)} IN THE FUTURE (a replay wrote into this store, or clocks disagree)")
        lines.append(f"  {comp:<28} {b['last_outcome'] or '-':<11} completed {when}"
                     f"{'  [replay]' if b.get('clock') == 'replay' else ''}"
                     f"{'  [IANA ' + b['zone_data'] + ']' if b.get('zone_data') else ''}"
                     f"{'  ' + b['detail'] if b['detail'] else ''}")
    return "\n".join(lines)
