"""Small builders for test configurations and sources (files written into a test's tmp_path)."""

from __future__ import annotations

from pathlib import Path

import yaml

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
