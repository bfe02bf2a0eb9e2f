"""Small builders for test configurations and sources (files written into a test's tmp_path)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import yaml
from sqlalchemy import select

from deadline_pipeline.config import load_config
from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.plan.service import plan_all
from deadline_pipeline.store.schema import obligations
from deadline_pipeline.watch.sources import rules_complete

ICS_TEMPLATE = """BEGIN:VCALENDAR\r
VERSION:2.0\r
PRODID:-//deadline-pipeline tests//EN\r
{events}END:VCALENDAR\r
"""

EVENT_TEMPLATE = """BEGIN:VEVENT\r
UID:{uid}\r
DTSTAMP:20260101T000000Z\r
DTSTART;TZID={tzid}:{dtstart}\r
SUMMARY:{summary}\r
{extra}END:VEVENT\r
"""


def ics(*events: dict) -> str:
    """An ICS calendar of VEVENTs given as dicts with uid, tzid, dtstart, summary and optional rrule,
    recurrence_id (local, in ``tzid``: an override of that occurrence) and status (``CANCELLED``)."""
    body = ""
    for e in events:
        extra = f"RRULE:{e['rrule']}\r\n" if e.get("rrule") else ""
        extra += f"RECURRENCE-ID;TZID={e['tzid']}:{e['recurrence_id']}\r\n" if e.get("recurrence_id") else ""
        extra += f"STATUS:{e['status']}\r\n" if e.get("status") else ""
        body += EVENT_TEMPLATE.format(uid=e["uid"], tzid=e["tzid"], dtstart=e["dtstart"], summary=e["summary"],
                                      extra=extra)
    return ICS_TEMPLATE.format(events=body)


def ai_deadlines(*editions: dict) -> str:
    return yaml.safe_dump(list(editions), sort_keys=False)


def write_config(folder: Path, *, sources: list[dict], subscribers: list[dict], subscriptions: list[dict],
                 channels: dict, **extra) -> Path:
    """Write ``deadlines.yaml`` into ``folder`` and return its path."""
    cfg = {"sources": sources, "subscribers": subscribers, "subscriptions": subscriptions, "channels": channels,
           **extra}
    path = folder / "deadlines.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def ingest_and_plan_feed(engine, folder: Path, fmt: str, payload: str, now: datetime):
    """Write ``payload`` as source ``feed`` (format ``fmt``) of a configuration in ``folder`` (one subscriber,
    one ``-P7D`` subscription to a maildir), then fetch, apply and plan it at ``now``. Returns ``(the
    apply's result, the set of rule ids with obligations, the rules_complete check of feed)``."""
    (folder / "feed.dat").write_text(payload, newline="")
    path = write_config(
        folder, sources=[{"name": "feed", "format": fmt, "location": "feed.dat", "tenant": "t1", "freshness": "P1D"}],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "America/New_York"}],
        subscriptions=[{"name": "all", "sources": ["feed"], "offsets": ["-P7D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(folder / "maildir")}})
    cfg = load_config(path)[0]
    fetch_snapshot(engine, cfg.sources[0], now)
    applied = apply_latest_snapshot(engine, cfg.sources[0], now)
    plan_all(engine, cfg, now)
    with engine.connect() as conn:
        planned = set(conn.execute(select(obligations.c.rule_id).distinct()).scalars())
    return applied, planned, rules_complete(engine, "feed")


def rolled_filings_config(folder: Path, holidays: list[str], filings: list[tuple[str, str, str]]) -> Path:
    """Write a configuration into ``folder`` whose source ``filings`` (CSV rows ``(id, title, due)``, due in
    Europe/London wall time) rolls 'following' over the holidays of source ``hols`` (one CSV row per day
    of ``holidays``, ``YYYY-MM-DD``), which nobody subscribes to; subscriber ann gets ``-P1D`` by maildir.
    Returns the configuration's path. Holidays and filings are rewritten at each call: a revision."""
    rows = "".join(f"h{i},Holiday {i},{day},Europe/London\n" for i, day in enumerate(holidays))
    (folder / "hols.csv").write_text("id,title,due,timezone\n" + rows)
    (folder / "filings.csv").write_text("id,title,due,timezone\n" + "".join(
        f"{rule_id},{title},{due},Europe/London\n" for rule_id, title, due in filings))
    return write_config(
        folder,
        sources=[{"name": "hols", "format": "csv", "location": "hols.csv"},
                 {"name": "filings", "format": "csv", "location": "filings.csv",
                  "business_days": {"calendar": "source:hols", "convention": "following"}}],
        subscribers=[{"id": "ann", "email": "ann@example.org", "timezone": "Europe/London"}],
        subscriptions=[{"name": "s", "sources": ["filings"], "offsets": ["-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(folder / "maildir")}},
    )


def ingest_and_plan(engine, cfg, now):
    """Fetch and apply every source of ``cfg`` at ``now``, then plan: the real ingest and plan path
    without Dagster. Returns the :class:`~deadline_pipeline.plan.outcome.PlanOutcome`."""
    from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
    from deadline_pipeline.plan.service import plan_all

    for s in cfg.sources:
        fetch_snapshot(engine, s, now)
        apply_latest_snapshot(engine, s, now)
    return plan_all(engine, cfg, now)


def cal_ics_config(folder: Path):
    """The loaded configuration (:class:`~deadline_pipeline.config.DeadlinesConfig`) of one ICS source
    ``cal`` read from ``folder / "cal.ics"`` (tenant t), subscriber ann (UTC) reminded ``-P1D`` by
    maildir; the calendar file is the caller's to write."""
    from deadline_pipeline.config import load_config

    return load_config(write_config(
        folder, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(folder / "maildir")}}))[0]


def free_port() -> int:
    """A loopback TCP port that nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loopback_policy():
    """The outbound policy admitting this machine's IPv4 loopback receivers the tests start."""
    from deadline_pipeline.security.outbound import NetworkPolicy

    return NetworkPolicy.from_strings(["127.0.0.1/32"])


#: The ``network`` section of a test configuration whose receivers listen on 127.0.0.1.
LOOPBACK_NETWORK = {"allow": ["127.0.0.1/32"]}
