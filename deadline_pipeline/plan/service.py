"""The planning stage without Dagster: configuration + active rules → obligations and alerts."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Engine

from deadline_pipeline.config import DeadlinesConfig, parse_duration
from deadline_pipeline.plan.occurrences import window
from deadline_pipeline.plan.planner import PlanProblem, Target, plan_target
from deadline_pipeline.store import planning as sql
from deadline_pipeline.store.sources import sync_source

log = logging.getLogger(__name__)


@dataclass
class PlanOutcome:
    """Counts of one planning run (every number is a row count)."""

    targets: int = 0
    obligations_planned: int = 0
    obligations_inserted: int = 0
    obligations_updated: int = 0
    obligations_withdrawn: int = 0
    alerts_planned: int = 0
    alerts_written: int = 0
    alerts_cancelled: int = 0
    problems: list[PlanProblem] = field(default_factory=list)


def sync_configuration(engine: Engine, cfg: DeadlinesConfig) -> None:
    """Mirror the configuration's sources, subscribers and subscriptions into the store."""
    with engine.begin() as conn:
        src_ids = {}
        for s in cfg.sources:
            row = sync_source(conn, name=s.name, tenant=s.tenant, fmt=s.format, location=s.location,
                              freshness_seconds=int(s.freshness_window.total_seconds()))
            src_ids[s.name] = row.id
        sub_ids = sql.sync_subscribers(conn, [
            dict(external_id=s.id, tenant=s.tenant, email=s.email, webhook_url=s.webhook_url, timezone=s.timezone)
            for s in cfg.subscribers
        ])
        rows = []
        for sub in cfg.subscriptions:
            for src_name in sub.sources:
                src = cfg.source(src_name)
                members = [s for s in cfg.subscribers
                           if ("*" in sub.subscribers and s.tenant == src.tenant) or s.id in sub.subscribers]
                for member in members:
                    rows.append(dict(
                        name=sub.name, subscriber_id=sub_ids[member.id], source_id=src_ids[src_name],
                        rule_patterns=list(sub.rules),
                        offsets=sorted(int(parse_duration(o).total_seconds()) for o in sub.offsets),
                        channels=list(sub.channels),
                    ))
        sql.sync_subscriptions(conn, rows)


def plan_all(engine: Engine, cfg: DeadlinesConfig, now: datetime) -> PlanOutcome:
    """Plan every active subscription through ``now + horizon``; ``now`` is aware UTC.

    Idempotent: a second run with the same rules writes nothing. Obligations that are no longer
    wanted (rule withdrawn, subscriber or subscription removed) are withdrawn and their open alerts
    cancelled; a rule that merely failed to expand keeps its obligations (it is reported instead,
    because cancelling them would turn a parse problem into a silent miss).
    """
    sync_configuration(engine, cfg)
    horizon = timedelta(days=cfg.plan.horizon_days)
    lo, _ = window(now, horizon)
    out = PlanOutcome()
    tz_of_source = {s.name: s.timezone for s in cfg.sources}
    with engine.begin() as conn:
        rows = sql.active_targets(conn)
        rules_cache: dict[int, tuple] = {}
        planned = []
        failed_rules: set[tuple[int, str]] = set()
        for r in rows:
            usable = []
            for ch in r["channels"]:
                missing = _missing_contact(cfg, ch, r)
                if missing:
                    # Loud, not silent: the subscription asks for a channel this subscriber cannot get.
                    problems_msg = f"subscriber {r['external_id']} has no {missing} for channel {ch!r}"
                    log.error("planning: %s; no alerts planned on that channel", problems_msg)
                    out.problems.append(PlanProblem(r["source"], "*", problems_msg))
                else:
                    usable.append(ch)
            target = Target(r["subscriber_id"], r["external_id"], r["tenant"], r["timezone"], r["source_id"],
                            r["source"], tz_of_source.get(r["source"]), tuple(r["rule_patterns"]),
                            tuple(r["offsets"]), tuple(usable))
            if target.source_id not in rules_cache:
                rules_cache[target.source_id] = sql.active_rules(conn, target.source_id)
            rules, _withdrawn = rules_cache[target.source_id]
            obs, problems = plan_target(target, rules, now, horizon)
            for p in problems:
                log.error("planning: source %s rule %s skipped: %s", p.source, p.rule_id, p.message)
                failed_rules.add((target.source_id, p.rule_id))
            out.problems.extend(problems)
            planned.extend(obs)
            out.targets += 1

        ob_rows = [dict(obligation_key=o.key, tenant=o.tenant, subscriber_id=o.subscriber_id,
                        source_id=o.source_id, rule_id=o.rule_id, rule_version=o.rule_version, period=o.period,
                        title=o.title, due_at=o.due_at, status="active", planned_at=now) for o in planned]
        ins, upd, ids = sql.upsert_obligations(conn, ob_rows)
        out.obligations_planned, out.obligations_inserted, out.obligations_updated = len(ob_rows), ins, upd
        alert_rows = [
            dict(obligation_id=ids[o.key], offset_seconds=a.offset_seconds, channel=a.channel, kind=a.kind,
                 dedup_key=a.dedup_key, send_at=a.send_at, status=a.status, status_reason=a.status_reason,
                 attempts=0, created_at=now, updated_at=now)
            for o in planned for a in o.alerts
        ]
        out.alerts_planned = len(alert_rows)
        out.alerts_written = sql.upsert_alerts(conn, alert_rows)

        wanted = {o.key for o in planned}
        stale = [
            ob_id for ob_id, key, rule_id, source_id in sql.open_obligations(conn, list(rules_cache) or
                                                                             _all_source_ids(conn), lo)
            if key not in wanted and (source_id, rule_id) not in failed_rules
        ]
        out.obligations_withdrawn = len(stale)
        out.alerts_cancelled = sql.withdraw_obligations(
            conn, stale, "the rule, subscription or subscriber no longer asks for this obligation", now)
    return out


def _missing_contact(cfg: DeadlinesConfig, channel: str, row) -> str | None:
    """Which contact a subscriber lacks for a channel ("email", "webhook_url"), or None."""
    ch = cfg.channels.get(channel)
    if ch is None:
        return "configured channel"
    if ch.type in ("smtp", "maildir") and not row["email"]:
        return "email"
    if ch.type == "webhook" and not row["webhook_url"]:
        return "webhook_url"
    return None


def _all_source_ids(conn) -> list[int]:
    from sqlalchemy import select

    from deadline_pipeline.store.schema import sources

    return [r[0] for r in conn.execute(select(sources.c.id)).all()]
