"""Incidents: what a page to the on-call is, and the bodies on-call tools expect for it.

A page (the watchdog's and the paging sensor's notices, the delivery sweep's notice of an escalated
alert) is an :class:`Incident`, never a reminder: channels send it under its own event types
(``incident.triggered`` / ``incident.resolved``), with a stable :func:`incident_key` that an on-call
tool groups and resolves by.

Incident key: ``deadline-pipeline/<component>/<check>/<target>``, each part percent-encoded
(RFC 3986, nothing left unencoded but unreserved characters), e.g.
``deadline-pipeline/dagster/alerts_reconciled/alerts`` or ``deadline-pipeline/watchdog/source_fresh/
us-federal-tax``. It depends on those three texts only, so it is the same in every process, on every
run, for the trigger and for the resolve. ``component`` says who watches (``watchdog``: the
``deadline-pipeline watchdog`` command; ``dagster``: the paging sensor; ``delivery``: the sweep): the
watchdog and Dagster evaluate some invariants of the same name independently, and each must resolve
only what it triggered. A key longer than PagerDuty's 255 characters keeps its first 190 and ends in
``~`` and the SHA-256 of the whole key (64 hex digits), still stable and distinct.

Bodies built here (pure functions, JSON-safe dicts):

* :func:`envelope_data` — the ``data`` of the Standard Webhooks envelope the webhook channel sends;
* :func:`pagerduty_event` — a PagerDuty Events API v2 event
  (https://developer.pagerduty.com/docs/events-api-v2/trigger-events/): ``event_action`` ``trigger``
  or ``resolve``, ``dedup_key`` = the incident key, and for a trigger ``payload`` {summary ≤ 1024
  characters, source, severity, timestamp, component, group, class, custom_details} and ``links``;
  :func:`pagerduty_problems` checks an event against those rules;
* :func:`alertmanager_alert` — the incident as one alert of Alertmanager's webhook body (version 4:
  ``status`` firing|resolved, ``labels``, ``annotations``, ``startsAt``, ``endsAt``,
  ``generatorURL``, ``fingerprint``), and :func:`alertmanager_postable` — the body of Alertmanager's
  ``POST /api/v2/alerts``.
"""

from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from urllib.parse import quote

PRODUCT = "deadline-pipeline"
STATUSES = ("triggered", "resolved")
# Standard Webhooks event types, "<group>.<event>" (https://www.standardwebhooks.com, "Payload structure").
EVENT_TYPES = {"triggered": "incident.triggered", "resolved": "incident.resolved"}
# PagerDuty Events API v2: payload.severity and event_action values, dedup_key and summary limits.
SEVERITIES = ("critical", "error", "warning", "info")
PAGERDUTY_ACTIONS = ("trigger", "acknowledge", "resolve")
KEY_MAX_CHARS = 255
SUMMARY_MAX_CHARS = 1024
# What Alertmanager's webhook shows as endsAt of an alert that is still firing (Go's zero time).
ALERTMANAGER_ZERO_TIME = "0001-01-01T00:00:00Z"
COMPONENTS = ("watchdog", "dagster", "delivery")

# Severity by check name. Critical: reminders are being missed now, or nothing would see it (no sweep,
# overdue or owed reminders, an unreadable store). Warning: the pipeline works and a human's step is
# pending (escalated alerts not yet acknowledged: each was paged on its own already). Error: the rest
# (broken, and reminders will be missed if it stays so).
CRITICAL_CHECKS = frozenset({"sweep_alive", "alerts_reconciled", "reminders_owed", "store"})
WARNING_CHECKS = frozenset({"escalations_acknowledged"})


def severity_for(check: str) -> str:
    """The PagerDuty severity (one of :data:`SEVERITIES`) of an incident of ``check``."""
    if check in CRITICAL_CHECKS:
        return "critical"
    return "warning" if check in WARNING_CHECKS else "error"


def incident_key(component: str, check: str, target: str) -> str:
    """``deadline-pipeline/<component>/<check>/<target>``, each part percent-encoded (``/`` and
    spaces too, so the parts cannot run into each other), at most :data:`KEY_MAX_CHARS` characters
    (see the module docstring). Pure: the same texts give the same key in every process."""
    key = "/".join([PRODUCT] + [quote(part, safe="") for part in (component, check, target)])
    if len(key) <= KEY_MAX_CHARS:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"{key[:KEY_MAX_CHARS - len(digest) - 1]}~{digest}"


def asset_checks_path(asset_path: list[str] | tuple[str, ...]) -> str:
    """The Dagster UI's route to an asset's checks (``dg dev`` / ``dagster-webserver``):
    ``/assets/<key parts joined by />?view=checks``, each part percent-encoded."""
    return "/assets/" + "/".join(quote(p, safe="") for p in asset_path) + "?view=checks"


def run_path(run_id: str) -> str:
    """The Dagster UI's route to one run: ``/runs/<run id>``."""
    return "/runs/" + quote(run_id, safe="")


@dataclass(frozen=True)
class Link:
    """A place to look. ``text``: what it shows; ``path``: a route in the Dagster UI (``/runs/…``),
    ``None`` when the link is not one; ``href``: the absolute URL, ``None`` when unknown (no
    ``escalation.dagster_ui_url`` configured)."""

    text: str
    path: str | None = None
    href: str | None = None

    def under(self, base_url: str | None) -> Link:
        """This link with ``href`` = ``base_url`` + ``path`` when both are known, else unchanged."""
        if self.href or not self.path or not base_url:
            return self
        return Link(self.text, self.path, base_url.rstrip("/") + self.path)


@dataclass(frozen=True)
class Incident:
    """One page about one incident.

    ``key``: :func:`incident_key` of ``component``/``check``/``target``. ``status``: ``triggered`` (a
    first page or a repeat while it stays open) or ``resolved``. ``severity``: one of
    :data:`SEVERITIES`. ``summary``: one line saying what is wrong; ``detail``: the longer text.
    ``started_at``: when the incident opened; ``at``: when this page is sent; ``ended_at``: when it was
    seen resolved (``None`` while triggered); all aware datetimes. ``notice``: ``opened`` |
    ``reminder`` | ``resolved``; ``repeat``: the reminder's number (0 for the first page).
    ``expires_at``: until when a receiver that expires firing alerts (Alertmanager) should hold it
    without a repeat, ``None`` when no repeat will come. ``source``: the host that sent it.
    ``client_url``: the Dagster UI's base URL when configured. Raises ``ValueError`` for an unknown
    status or severity, a key that is not this incident's, or naive datetimes.
    """

    component: str
    check: str
    target: str
    status: str
    severity: str
    summary: str
    detail: str
    started_at: datetime
    at: datetime
    ended_at: datetime | None = None
    links: tuple[Link, ...] = ()
    notice: str = "opened"
    repeat: int = 0
    expires_at: datetime | None = None
    source: str = field(default_factory=lambda: source_host())
    client_url: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"incident status {self.status!r} is not one of {STATUSES}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"incident severity {self.severity!r} is not one of {SEVERITIES}")
        for name in ("started_at", "at", "ended_at", "expires_at"):
            value = getattr(self, name)
            if value is not None and value.utcoffset() is None:
                raise ValueError(f"Incident.{name} must be an aware datetime, got {value!r}")

    @property
    def key(self) -> str:
        return incident_key(self.component, self.check, self.target)

    @property
    def event_type(self) -> str:
        """``incident.triggered`` or ``incident.resolved``."""
        return EVENT_TYPES[self.status]

    @property
    def fingerprint(self) -> str:
        """16 hex digits identifying the incident, Alertmanager's fingerprint format (derived from
        the incident key, not from Alertmanager's own hash of the labels)."""
        return hashlib.sha256(self.key.encode()).hexdigest()[:16]

    @property
    def one_line_summary(self) -> str:
        """``summary`` as one line of at most :data:`SUMMARY_MAX_CHARS` characters (PagerDuty's limit)."""
        text = " ".join(self.summary.split()) or f"{self.check} {self.target}"
        return text if len(text) <= SUMMARY_MAX_CHARS else text[:SUMMARY_MAX_CHARS - 1] + "…"


@lru_cache(maxsize=1)
def source_host() -> str:
    """This machine's host name (PagerDuty's ``payload.source``: "preferably a hostname or FQDN")."""
    return socket.gethostname() or "unknown-host"


def iso_z(when: datetime | None) -> str | None:
    """An aware datetime as ISO 8601 UTC with ``Z`` (RFC 3339), ``None`` as ``None``."""
    return None if when is None else when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _links(inc: Incident) -> list[dict]:
    return [{"text": link.text, "href": link.href, "path": link.path} for link in inc.links]


def _absolute_links(inc: Incident) -> list[dict]:
    """PagerDuty ``links``: ``href`` is required there, so only links with an absolute URL."""
    return [{"href": link.href, "text": link.text} for link in inc.links if link.href]


def envelope_data(inc: Incident, message_id: str) -> dict:
    """The ``data`` of the Standard Webhooks envelope for ``inc`` (see ``docs/paging.md``): the
    incident's fields, ``pagerduty`` (:func:`pagerduty_event` without ``routing_key``, which a relay
    or the ``body: pagerduty`` option adds) and ``alertmanager`` (:func:`alertmanager_alert`).
    ``message_id``: this page's own id (the ``webhook-id`` header), distinct per page."""
    return {
        "id": message_id,
        "incident_key": inc.key,
        "status": inc.status,
        "severity": inc.severity,
        "source": inc.source,
        "component": inc.component,
        "check": inc.check,
        "target": inc.target,
        "summary": inc.one_line_summary,
        "detail": inc.detail,
        "notice": inc.notice,
        "repeat": inc.repeat,
        "started_at": iso_z(inc.started_at),
        "ended_at": iso_z(inc.ended_at),
        "links": _links(inc),
        "pagerduty": pagerduty_event(inc),
        "alertmanager": alertmanager_alert(inc),
    }


def pagerduty_event(inc: Incident, routing_key: str | None = None) -> dict:
    """A PagerDuty Events API v2 event for ``inc``: ``trigger`` with the full ``payload`` while
    triggered, ``resolve`` naming only the ``dedup_key`` once resolved (PagerDuty ignores a resolve's
    payload; its own example sends none). ``routing_key`` is left out when ``None``."""
    event: dict = {} if routing_key is None else {"routing_key": routing_key}
    if inc.status == "resolved":
        return event | {"event_action": "resolve", "dedup_key": inc.key}
    event |= {
        "event_action": "trigger",
        "dedup_key": inc.key,
        "payload": {
            "summary": inc.one_line_summary,
            "source": inc.source,
            "severity": inc.severity,
            "timestamp": iso_z(inc.at),
            "component": inc.component,
            "group": PRODUCT,
            "class": inc.check,
            "custom_details": {"target": inc.target, "detail": inc.detail, "notice": inc.notice,
                               "repeat": inc.repeat, "started_at": iso_z(inc.started_at)},
        },
        "client": PRODUCT,
        "links": _absolute_links(inc),
    }
    if inc.client_url:
        event["client_url"] = inc.client_url
    return event


def pagerduty_problems(event: dict) -> list[str]:
    """What in ``event`` breaks the PagerDuty Events API v2 rules for an alert event (empty = none):
    ``event_action`` one of :data:`PAGERDUTY_ACTIONS`; ``dedup_key`` a string of at most 255
    characters, required for acknowledge and resolve; for a trigger ``payload.summary`` of 1 to 1024
    characters, a non-empty ``payload.source``, ``payload.severity`` one of :data:`SEVERITIES`;
    every link with an ``href``; ``routing_key``, when present, a non-empty string."""
    problems = []
    action = event.get("event_action")
    if action not in PAGERDUTY_ACTIONS:
        problems.append(f"event_action {action!r} is not one of {PAGERDUTY_ACTIONS}")
    key = event.get("dedup_key")
    if key is None and action != "trigger":
        problems.append(f"dedup_key is required for {action!r}")
    elif key is not None and (not isinstance(key, str) or not 0 < len(key) <= KEY_MAX_CHARS):
        problems.append(f"dedup_key must be a string of 1 to {KEY_MAX_CHARS} characters")
    if "routing_key" in event and not (isinstance(event["routing_key"], str) and event["routing_key"]):
        problems.append("routing_key must be a non-empty string")
    if action == "trigger":
        problems += _payload_problems(event.get("payload"))
    problems += [f"links[{i}] has no href" for i, link in enumerate(event.get("links", [])) if not link.get("href")]
    return problems


def _payload_problems(payload) -> list[str]:
    if not isinstance(payload, dict):
        return ["payload is required for a trigger"]
    problems = []
    summary = payload.get("summary")
    if not isinstance(summary, str) or not 0 < len(summary) <= SUMMARY_MAX_CHARS:
        problems.append(f"payload.summary must be a string of 1 to {SUMMARY_MAX_CHARS} characters")
    if not isinstance(payload.get("source"), str) or not payload["source"]:
        problems.append("payload.source must be a non-empty string")
    if payload.get("severity") not in SEVERITIES:
        problems.append(f"payload.severity {payload.get('severity')!r} is not one of {SEVERITIES}")
    return problems


def _labels(inc: Incident) -> dict[str, str]:
    """Alertmanager labels: the incident's identity (stable while it is open, so Alertmanager sees one
    alert), names matching ``[a-zA-Z_][a-zA-Z0-9_]*``."""
    return {"alertname": inc.check, "component": inc.component, "target": inc.target, "severity": inc.severity,
            "service": PRODUCT, "incident_key": inc.key}


def _annotations(inc: Incident) -> dict[str, str]:
    return {"summary": inc.one_line_summary, "description": inc.detail, "source": inc.source}


def _generator_url(inc: Incident) -> str:
    return next((link.href for link in inc.links if link.href), "")


def alertmanager_alert(inc: Incident) -> dict:
    """``inc`` as one alert of Alertmanager's webhook body (version 4): ``endsAt`` is
    :data:`ALERTMANAGER_ZERO_TIME` while firing, the resolve instant once resolved."""
    return {
        "status": "resolved" if inc.status == "resolved" else "firing",
        "labels": _labels(inc),
        "annotations": _annotations(inc),
        "startsAt": iso_z(inc.started_at),
        "endsAt": iso_z(inc.ended_at) if inc.status == "resolved" else ALERTMANAGER_ZERO_TIME,
        "generatorURL": _generator_url(inc),
        "fingerprint": inc.fingerprint,
    }


def alertmanager_postable(inc: Incident) -> list[dict]:
    """The body of Alertmanager's ``POST /api/v2/alerts`` (a list of postable alerts) for ``inc``.

    Alertmanager resolves an alert by its ``endsAt``: a resolve sends the resolve instant; a firing
    alert sends ``expires_at`` (twice the repeat interval), so it stays firing between repeats and
    ends by itself if the repeats stop; without ``expires_at`` (a page that is not repeated)
    ``endsAt`` is left out and Alertmanager applies its ``resolve_timeout``. ``generatorURL`` is
    left out when no absolute link is known (the API wants a URI there)."""
    alert: dict = {"labels": _labels(inc), "annotations": _annotations(inc), "startsAt": iso_z(inc.started_at)}
    ends = inc.ended_at if inc.status == "resolved" else inc.expires_at
    if ends is not None:
        alert["endsAt"] = iso_z(ends)
    if _generator_url(inc):
        alert["generatorURL"] = _generator_url(inc)
    return [alert]
