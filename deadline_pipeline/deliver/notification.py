"""What a channel sends and what it reports back: :class:`Notification`, :class:`SendResult`, :class:`DeliveryError`.

A :class:`Notification` is one alert for one subscriber, already decided by planning; channels only
render and transmit it. Every text field that came from a source (``title``, ``note``, ``url``,
``source``, ``rule_id``) is untrusted and is sanitised or escaped where it is rendered
(:mod:`deadline_pipeline.deliver.render`), never here.

Outcomes of a failed send (:class:`DeliveryError`):

* ``outcome="failed"``: the message is known *not* to have been delivered (connection refused, the
  server answered with a rejection before accepting the message).
* ``outcome="unknown"``: the message may have been delivered (a timeout after the request or the SMTP
  DATA left, a connection dropped before the answer). Resending is safe only for channels whose
  ``idempotency_class`` is ``"notification"`` (see :mod:`deadline_pipeline.deliver.channels.base`).
* ``permanent=True``: the same send would fail again (550 recipient unknown, HTTP 400, a missing
  credential variable); the sweep escalates at once instead of retrying.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import UTC, date, datetime
from functools import lru_cache
from typing import TYPE_CHECKING

from deadline_pipeline.deliver.incident import PRODUCT, Incident
from deadline_pipeline.plan.business_days import describe_roll
from deadline_pipeline.timezones import UnknownTimeZone, resolve_zone

if TYPE_CHECKING:
    from deadline_pipeline.config import EscalationConfig

# "incident": a page to the on-call (the watchdog's, the paging sensor's, the sweep's notice of an
# escalated alert), carrying its Incident. "escalation": the reminder-shaped notice of an escalated
# alert that earlier releases sent; channels still render it, the pipeline sends incidents instead.
KINDS = ("reminder", "correction", "cancellation", "escalation", "incident")
OUTCOMES = ("failed", "unknown")


def _utc(value: datetime, field: str) -> datetime:
    if value.tzinfo is UTC:  # already normalised (what the store returns): astimezone(UTC) would return it as is
        return value
    # A naive datetime here would be read as host-local time by astimezone() and shift the
    # reminder by the host's UTC offset without any error.
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"Notification.{field} must be an aware datetime, got naive {value.isoformat()}")
    return value.astimezone(UTC)


@dataclass(frozen=True)
class Notification:
    """One alert to deliver to one subscriber over one channel.

    ``dedup_key``: hex string, the alert's idempotency key; it becomes the SMTP Message-ID and the
    webhook ``Idempotency-Key``, so a resend is recognisable as the same alert.
    ``kind``: ``"reminder"`` | ``"correction"`` | ``"cancellation"`` | ``"escalation"`` | ``"incident"``.
    ``subscriber_tz``: IANA zone name the times are shown in (besides UTC).
    ``due_at`` / ``previous_due_at``: aware datetimes, normalised to UTC on construction;
    ``previous_due_at`` is the old due time of a correction, else ``None``.
    ``offset_seconds``: when the reminder fires relative to ``due_at``, in seconds; negative = before
    (``-86400`` = one day before).
    ``obligation_key``: the 64-hex key of the obligation the alert belongs to (a booking channel finds
    the events of one deadline by it); ``caldav_url`` / ``apprise_target``: the subscriber's contacts
    for those channels, ``None`` when unset.
    ``incident``: the :class:`~deadline_pipeline.deliver.incident.Incident` of a page, set exactly
    when ``kind`` is ``"incident"``.

    Raises ``ValueError`` for an unknown ``kind``, an incident without its ``incident`` (or an
    ``incident`` on another kind) or a naive datetime.
    """

    dedup_key: str
    kind: str
    subscriber_id: str
    email: str | None
    webhook_url: str | None
    subscriber_tz: str
    source: str
    rule_id: str
    title: str
    due_at: datetime
    offset_seconds: int
    url: str | None = None
    note: str | None = None
    previous_due_at: datetime | None = None
    # When the send is attempted; "time left" is measured from it, because a reminder sent late
    # (after downtime, or folded at planning) must not claim more time than is left.
    sent_at: datetime | None = None
    obligation_key: str | None = None
    caldav_url: str | None = None
    apprise_target: str | None = None
    # The zone the deadline is defined in (as its source spelled it: "AoE", "America/New_York"), so
    # the message can show "23:59 AoE" beside the reader's own clock; None = floating or unknown.
    rule_tz: str | None = None
    # When the alert was planned to go out (aware), and the planner's note about it (late folding,
    # quiet hours); a send well after planned_at says "sent late: planned for …, reason".
    planned_at: datetime | None = None
    planned_reason: str | None = None
    # Failed attempts before this one (a retry explains its own lateness).
    earlier_attempts: int = 0
    # Why the due date is not the one the source published (business-day roll), in words.
    roll_note: str | None = None
    # A page's incident (kind "incident" only): what tells an on-call tool it is no reminder.
    incident: Incident | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Notification {self.dedup_key}: kind {self.kind!r} is not one of {KINDS}")
        if (self.kind == "incident") != (self.incident is not None):
            raise ValueError(f"Notification {self.dedup_key}: kind {self.kind!r} and incident "
                             f"{'set' if self.incident is not None else 'missing'} disagree")
        for field in ("due_at", "previous_due_at", "sent_at", "planned_at"):
            value = getattr(self, field)
            if value is None and field != "due_at":
                continue
            utc = _utc(value, field)
            if utc is not value:
                object.__setattr__(self, field, utc)


def _nominal_date(period: str | None, payload: dict):
    """The local date the source published for an occurrence: the period (its original local start)
    for a series, the rule's ``start`` for a one-off; ``None`` when unknown (a UTC-instant period)."""
    text = period if period and period != "once" and not period.endswith("Z") else payload.get("start")
    try:
        return date.fromisoformat(str(text)[:10]) if text else None
    except ValueError:
        return None


def roll_note_for(row: dict, cfg) -> str | None:
    """"Sunday 31 Jan falls on a weekend; due Monday 1 Feb (IRC §7503 following)" when the source of
    ``row`` rolls due dates (``cfg.sources[..].business_days``) and this one moved, else ``None``.

    ``row``: a claimed alert as :func:`deadline_pipeline.store.delivery.load_claimed` returns it
    (``source``, ``period``, ``payload``, ``due_at``, ``timezone``). Never raises for bad data: a note
    that cannot be worked out is left out (the due instant itself is always shown).
    """
    if cfg is None:
        return None
    try:
        bd = cfg.source(row["source"]).business_days
    except KeyError:
        return None
    if bd is None or bd.convention == "none":
        return None
    payload = row.get("payload") or {}
    nominal = _nominal_date(row.get("period"), payload)
    try:
        zone = resolve_zone(payload.get("tz") or row["timezone"])
    except UnknownTimeZone:
        return None
    if nominal is None:
        return None
    return _describe_roll(nominal, row["due_at"].astimezone(zone).date(), bd.calendar, bd.convention)


# Cached: every subscriber and every offset of a rolled deadline gets the same note, and wording it
# (holiday lookup, two strftime calls) cost ~10 µs per alert of a rolled deadline (~0.2 µs cached).
# The note is a pure function of its arguments (the calendar is named by its spec; holiday names
# are static).
_describe_roll = lru_cache(maxsize=1024)(describe_roll)

# Notification's fields in declaration order: notification_from_row fills exactly these.
_FIELD_NAMES = tuple(f.name for f in fields(Notification))
_new = object.__new__


def notification_from_row(row: dict, sent_at: datetime, cfg=None) -> Notification:
    """The :class:`Notification` for a claimed alert row (see :func:`roll_note_for` for ``row``);
    ``sent_at``: aware, the instant of this attempt; ``cfg``: the configuration, for business-day
    notes (``None`` = no note). Raises ``ValueError`` like :class:`Notification`."""
    payload = row.get("payload") or {}
    # The instance's attributes set as one dict, then validated by __post_init__ exactly as
    # __init__ would: the generated __init__ of a frozen dataclass calls object.__setattr__ once per
    # field, and with 23 keyword arguments it cost ~6.8 µs per alert against ~1.8 µs this way (CPU
    # time, median of 40 runs over 2,000 rows), on the sweep's event loop.
    values = {
        "dedup_key": row["dedup_key"], "kind": row["kind"], "subscriber_id": row["subscriber"],
        "email": row["email"], "webhook_url": row["webhook_url"], "subscriber_tz": row["timezone"],
        "source": row["source"], "rule_id": row["rule_id"], "title": row["title"], "due_at": row["due_at"],
        "offset_seconds": row["offset_seconds"], "url": payload.get("url"), "note": payload.get("note"),
        "previous_due_at": row.get("previous_due_at"), "sent_at": sent_at, "obligation_key": row.get("obligation_key"),
        "caldav_url": row.get("caldav_url"), "apprise_target": row.get("apprise_target"), "rule_tz": payload.get("tz"),
        "planned_at": row.get("send_at"), "planned_reason": row.get("status_reason"),
        "earlier_attempts": int(row.get("attempts") or 0), "roll_note": roll_note_for(row, cfg),
        "incident": None,  # alerts in the store are subscribers' reminders, never pages
    }
    if len(values) != len(_FIELD_NAMES):  # a field added to Notification but not here must not go missing
        missing = sorted(set(_FIELD_NAMES) - values.keys())
        raise TypeError(f"notification_from_row does not fill Notification field(s) {missing}")
    n = _new(Notification)
    object.__setattr__(n, "__dict__", values)
    n.__post_init__()
    return n


@dataclass(frozen=True)
class SendResult:
    """A successful send. ``provider_message_id``: the id the channel can be asked about later
    (SMTP Message-ID, maildir key, the webhook receiver's ``id`` or ``"HTTP <status>"``)."""

    provider_message_id: str


class DeliveryError(Exception):
    """A send that did not succeed.

    ``permanent``: ``True`` = retrying cannot help; escalate at once.
    ``outcome``: ``"failed"`` (known not delivered) or ``"unknown"`` (may have been delivered).
    ``retry_after``: seconds the receiver asked us to wait (HTTP 429/503 ``Retry-After``), else ``None``.
    ``recorded_attempt``: the id of the attempt row this failure was counted on, set by the sweep
    once it has consumed its attempt, so that a handler further out that catches the same exception
    does not count it a second time (``recorded`` is ``True`` from then on).
    """

    def __init__(
        self, message: str, *, permanent: bool, outcome: str = "failed", retry_after: float | None = None
    ) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"DeliveryError outcome {outcome!r} is not one of {OUTCOMES}")
        from deadline_pipeline.security.redact import redact

        # Redacted once, here, for every channel: the message becomes alerts.last_error, a log line
        # and Dagster event text, and a webhook URL in it may carry a token.
        super().__init__(redact(message))
        self.permanent = permanent
        self.outcome = outcome
        self.retry_after = retry_after
        self.recorded_attempt: int | None = None

    @property
    def recorded(self) -> bool:
        """Whether this failure has already consumed an attempt."""
        return self.recorded_attempt is not None

    def __repr__(self) -> str:
        return (
            f"DeliveryError({str(self)!r}, permanent={self.permanent}, outcome={self.outcome!r}, "
            f"retry_after={self.retry_after!r})"
        )


def notice_error(exc: BaseException) -> str:
    """``"<exception class>: <message>"`` for the failed send ``exc`` of an escalation notice (a
    message to an on-call channel about an escalated alert or an incident), as its log line and
    record show it.

    A channel words its errors for the alert it carries: a notice whose webhook timed out said "the
    alert may have been delivered", read as news of the escalated alert, which was not delivered.
    Here the wording is the notice's, and an unknown outcome says that the notice may have arrived
    (a second page may follow it) whatever the channel's own words."""
    text = str(exc).replace("the alert may have been delivered", "the notice may have been delivered")
    if isinstance(exc, DeliveryError) and exc.outcome == "unknown" and "may have been" not in text:
        text += "; the notice may have been delivered"
    return f"{type(exc).__name__}: {text}"


def incident_notification(inc: Incident, esc: EscalationConfig, message_id: str) -> Notification:
    """The :class:`Notification` carrying ``inc`` to the
    escalation channels (kind ``incident``; recipients from ``esc``: ``email``, ``webhook_url``,
    ``apprise_target``). ``message_id``: hex, the page's own idempotency key (Message-ID,
    ``webhook-id``), distinct per page and equal on a resend of the same page."""
    return Notification(
        dedup_key=message_id, kind="incident", subscriber_id="on-call", email=esc.email,
        webhook_url=esc.webhook_url, apprise_target=esc.apprise_target, subscriber_tz="UTC", source=PRODUCT,
        rule_id=inc.key, title=inc.one_line_summary, due_at=inc.started_at, offset_seconds=0, note=inc.detail,
        sent_at=inc.at, incident=inc,
    )
