"""``deadline-pipeline preview``: what would fire when, for one subscriber, without writing anything."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta

import click

from deadline_pipeline.commands.common import config_option, require_config
from deadline_pipeline.config import ConfigError, load_config


def _instant(text: str, option: str) -> datetime:
    from deadline_pipeline.orchestration.resources import parse_instant

    try:
        return parse_instant(text)
    except ValueError as exc:
        click.echo(f"error: {option}: {exc}", err=True)
        sys.exit(2)


def preview_rows(cfg, engine, subscriber_id: str, start: datetime, end: datetime) -> list[dict]:
    """Reminders of ``subscriber_id`` whose send instant falls in ``[start, end)`` (aware UTC), planned
    as of ``start`` from the rule versions in the store. Reads only. Raises ``KeyError`` for an
    unknown subscriber."""
    from sqlalchemy import select

    from deadline_pipeline.plan.planner import plan_target
    from deadline_pipeline.plan.service import (
        PlanOutcome,
        business_calendars,
        fold_overrides,
        offsets_seconds,
        subscribes,
        targets_from_rows,
    )
    from deadline_pipeline.store.planning import active_rules
    from deadline_pipeline.store.schema import sources

    sub = next((s for s in cfg.subscribers if s.id == subscriber_id), None)
    if sub is None:
        raise KeyError(subscriber_id)
    horizon = end - start
    rows: list[dict] = []
    with engine.connect() as conn:
        source_ids = dict(conn.execute(select(sources.c.name, sources.c.id)).all())
        calendars = business_calendars(conn, cfg, PlanOutcome())
        for subscription in cfg.subscriptions:
            for src_name in subscription.sources:
                src = cfg.source(src_name)
                if not subscribes(subscription, sub, src):
                    continue
                if src_name not in source_ids:
                    rows.append({"source": src_name, "problem": "never ingested: run `deadline-pipeline run` first"})
                    continue
                # The same target-building as planning (usable channels, zones, calendars), from the
                # configuration instead of the store's mirror of it.
                plan_out = PlanOutcome()
                (target,) = targets_from_rows(cfg, [dict(
                    subscriber_id=0, external_id=sub.id, tenant=sub.tenant, timezone=sub.timezone,
                    email=sub.email, webhook_url=sub.webhook_url, quiet_hours=sub.quiet_hours,
                    source_id=source_ids[src_name], source=src_name, rule_patterns=list(subscription.rules),
                    offsets=offsets_seconds(subscription), channels=list(subscription.channels),
                    late_policy=subscription.late_policy)], plan_out, calendars)
                rules, _ = active_rules(conn, source_ids[src_name])
                rules = fold_overrides(rules, src_name, plan_out)
                for p in plan_out.problems:
                    rows.append({"source": src_name, "rule": p.rule_id, "problem": p.message})
                versions = {r.rule_id: v for v, r in rules}
                # Reminders up to the largest offset ahead of a deadline can fire inside the window.
                lead = max((-o for o in target.offsets_seconds), default=0)
                obligations, problems = plan_target(target, rules, start, horizon + timedelta(seconds=lead))
                for p in problems:
                    rows.append({"source": src_name, "rule": p.rule_id, "problem": p.message})
                for ob in obligations:
                    for a in ob.alerts:
                        if start <= a.send_at < end or (a.send_at < start and a.status == "pending"):
                            rows.append({
                                "send_at": max(a.send_at, start).isoformat(), "channel": a.channel,
                                "status": a.status, "title": ob.title, "due_at": ob.due_at.isoformat(),
                                "source": src_name, "rule": ob.rule_id, "version": versions.get(ob.rule_id),
                                "offset": a.offset_seconds, "subscription": subscription.name,
                                "why": (a.status_reason or f"{a.offset_seconds // 3600:+d} h before the due instant")
                                + (f"; due dates rolled by {src.business_days.calendar} "
                                   f"({src.business_days.convention})" if target.business_days else ""),
                            })
    return sorted(rows, key=lambda r: (r.get("send_at", ""), r.get("channel", "")))


def register(main: click.Group) -> None:
    @main.command()
    @click.option("--subscriber", required=True, help="Subscriber id from the configuration.")
    @click.option("--from", "start", required=True, help="Window start, ISO 8601 instant (e.g. 2027-01-01T00:00Z).")
    @click.option("--to", "end", required=True, help="Window end, ISO 8601 instant.")
    @config_option
    @click.option("--db-url", envvar="DEADLINE_DB_URL", help="Store URL (default: the embedded SQLite file).")
    @click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
    def preview(subscriber, start, end, config, db_url, as_json):
        """Print which reminders would fire for SUBSCRIBER between --from and --to, through which
        channel, and why (rule, version, offset, quiet-hours deferral, late folding). Writes nothing."""
        from deadline_pipeline.store.db import get_engine

        t0, t1 = _instant(start, "--from"), _instant(end, "--to")
        if t1 <= t0:
            click.echo("error: --to must be after --from", err=True)
            sys.exit(2)
        try:
            cfg, _ = load_config(require_config(config))
        except ConfigError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        try:
            rows = preview_rows(cfg, get_engine(db_url), subscriber, t0, t1)
        except KeyError:
            known = ", ".join(s.id for s in cfg.subscribers[:20])
            click.echo(f"error: --subscriber: no subscriber {subscriber!r} in the configuration (known: {known})",
                       err=True)
            sys.exit(2)
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        if not rows:
            click.echo(f"nothing fires for {subscriber} between {t0.isoformat()} and {t1.isoformat()}")
            return
        for r in rows:
            if "problem" in r:
                click.echo(f"PROBLEM  {r['source']} {r.get('rule', '')}: {r['problem']}")
                continue
            click.echo(f"{r['send_at']}  {r['channel']:<10} {r['status']:<8} {r['title']} (due {r['due_at']}; "
                       f"{r['source']}/{r['rule']} v{r['version']}, offset {r['offset']} s) — {r['why']}")
