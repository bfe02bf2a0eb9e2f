"""Book alerts as events in each subscriber's CalDAV calendar (RFC 4791), at most once.

Idempotency class ``"booking"``: a calendar event is a permanent effect and a second copy is a real
harm (two entries for one deadline). Three rules keep it to one:

1. **Deterministic UID.** ``book: reminder`` (default): one event per reminder, UID
   ``<alert dedup key>@deadline-pipeline``; ``book: obligation``: one event per deadline, UID
   ``obligation-<obligation key>@deadline-pipeline`` (its first reminder books it, later reminders
   find it booked). The event's resource name is the UID's local part plus ``.ics`` in the calendar
   collection, so the UID alone says where to look.
2. **Conditional create.** Every booking is ``PUT`` with ``If-None-Match: *`` (RFC 7232 §3.2): the
   server creates the resource only if nothing is there. ``412 Precondition Failed`` therefore means
   "already booked" and is recorded as delivered, never as a duplicate.
3. **An unknown outcome is resolved by asking the server.** After a timeout or a dropped connection
   once the request left (here), or after a crash between the ``PUT`` and recording it (the sweep
   calls :meth:`CaldavSender.resolve_unknown` on the next claim), the event's resource is fetched
   (``GET``): found → delivered with the server's ETag; absent (404/410) → booked again with the
   same UID (and still ``If-None-Match: *``); lookup impossible (error, timeout, other status) →
   a permanent ``"unknown"`` failure, which the sweep escalates.

Corrections (``kind="correction"``, the deadline moved) rewrite every event of the obligation with
the new ``DTSTART`` and ``SEQUENCE`` + 1 (RFC 5545 §3.8.7.4); cancellations set ``STATUS:CANCELLED``
with ``SEQUENCE`` + 1, or ``DELETE`` the event (``cancel: delete``). Both are conditional on the
ETag just read (``If-Match``), so a concurrent change yields 412 and a retry, not a lost update; an
event already in the target state is left alone, so repeating either is harmless. The events of an
obligation are found by the ``X-DEADLINE-OBLIGATION`` property (a ``calendar-query`` REPORT with a
``prop-filter``, RFC 4791 §7.8; the answer is checked again here), or by the obligation UID's
resource in ``book: obligation`` mode.

Each event: ``DTSTART`` = the due instant (UTC, no ``DTEND``: a deadline is an instant),
``SUMMARY`` = the title, ``DESCRIPTION`` = note and link, ``URL`` when http(s), and a ``VALARM``
(``ACTION:DISPLAY``) whose ``TRIGGER`` is the reminder's offset relative to the start (``-P1D``
for a one-day reminder; in ``book: obligation`` mode the offset of the reminder that booked it).
The body is built with ``icalendar``; no iCalendar text is written by hand.

Answers: 2xx done; 408/429/503 retryable ``"failed"`` (``Retry-After`` honoured); other 5xx and
transport errors after sending are unknown and resolved as above; 401/403 and other 4xx permanent
(bad credentials, no such calendar: the same request would fail again); redirects (3xx) are not
followed and are permanent (the configured calendar URL is wrong). Credentials: HTTP Basic from
``username_env`` / ``password_env`` (the password is registered as a secret when read).

Time: each request ends within ``timeout_seconds`` in all (plus a few milliseconds), however slowly
the server answers; a timeout once the request left counts as no answer (unknown, resolved as
above). A send may be several requests (a booking whose ``PUT`` gets no answer: ``PUT``, ``GET``,
``PUT``, ``GET`` at most; a correction or cancellation: one read, then one write per event), and
can take as many timeouts.

Outbound guard: every connection passes ``network`` (the
:class:`~deadline_pipeline.security.outbound.NetworkPolicy` of the configuration): the calendar's
host is resolved, every address checked and the checked address connected to. A refused target
(a calendar on loopback, a private or link-local address not in ``network.allow``) is a permanent
``"failed"`` naming the rule, never retried, and no connection is made. Every error names the URL
redacted. All HTTP goes through :meth:`CaldavSender._request`.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, urljoin, urlparse

import httpx
import icalendar

from deadline_pipeline.config import CaldavChannel
from deadline_pipeline.deliver.channels.base import IDEMPOTENCY_BOOKING
from deadline_pipeline.deliver.channels.webhook import NOT_PROCESSED_STATUSES, parse_retry_after
from deadline_pipeline.deliver.notification import DeliveryError, Notification, SendResult
from deadline_pipeline.deliver.render import multi_line, one_line
from deadline_pipeline.instants import instant_text
from deadline_pipeline.security.outbound import (
    DEFAULT_POLICY,
    NetworkPolicy,
    OutboundRefused,
    guarded_httpx_client,
    request_deadline,
)
from deadline_pipeline.security.redact import redact_url, secret_from_env

PRODID = "-//deadline-pipeline//caldav channel//EN"
UID_DOMAIN = "deadline-pipeline"
PROP_OBLIGATION = "X-DEADLINE-OBLIGATION"
PROP_ALERT = "X-DEADLINE-ALERT"
SUMMARY_MAX_CHARS = 250
_DAV = "{DAV:}"
_CALDAV = "{urn:ietf:params:xml:ns:caldav}"
_ICS = "text/calendar; charset=utf-8"


class _MaybeSent(Exception):
    """The request left and no usable answer came back: the server may have acted on it."""


def event_uid(n: Notification, book: str) -> str:
    """The event UID of ``n``'s booking: ``<dedup key>@deadline-pipeline`` for ``book="reminder"``,
    ``obligation-<obligation key>@deadline-pipeline`` for ``book="obligation"``. Raises
    :class:`DeliveryError` (permanent) when the obligation key it needs is missing."""
    if book == "obligation":
        if not n.obligation_key:
            raise DeliveryError(f"alert {n.dedup_key}: no obligation key to book the deadline by", permanent=True)
        return f"obligation-{n.obligation_key}@{UID_DOMAIN}"
    return f"{n.dedup_key}@{UID_DOMAIN}"


def resource_name(uid: str) -> str:
    """The event's resource name in its collection: the UID's local part plus ``.ics``."""
    return quote(uid.partition("@")[0], safe="") + ".ics"


def build_event(n: Notification, uid: str, *, now: datetime) -> icalendar.Calendar:
    """The VCALENDAR with one VEVENT booking ``n`` (see the module docstring), ``SEQUENCE:0``."""
    cal = icalendar.Calendar()
    cal.add("prodid", PRODID)
    cal.add("version", "2.0")
    ev = icalendar.Event()
    ev.add("uid", uid)
    ev.add("dtstamp", now)
    ev.add("sequence", 0)
    ev.add("status", "CONFIRMED")
    _describe(ev, n)
    if n.obligation_key:
        ev.add(PROP_OBLIGATION, n.obligation_key)
    ev.add(PROP_ALERT, n.dedup_key)
    alarm = icalendar.Alarm()
    alarm.add("action", "DISPLAY")
    alarm.add("description", _summary(n))
    # Relative to DTSTART (RFC 5545 §3.8.6.3), so the alarm follows a corrected start.
    alarm.add("trigger", timedelta(seconds=n.offset_seconds))
    ev.add_component(alarm)
    cal.add_component(ev)
    return cal


def _summary(n: Notification) -> str:
    # One line: a CR/LF from a feed must not reach a client as a second line of the title.
    text = one_line(n.title)
    return text if len(text) <= SUMMARY_MAX_CHARS else text[: SUMMARY_MAX_CHARS - 1] + "…"


def _describe(ev: icalendar.Event, n: Notification) -> None:
    """Set DTSTART, SUMMARY, DESCRIPTION and URL from ``n`` (replacing any present)."""
    for prop in ("DTSTART", "SUMMARY", "DESCRIPTION", "URL"):
        ev.pop(prop, None)
    ev.add("dtstart", n.due_at.astimezone(UTC))
    ev.add("summary", _summary(n))
    lines = [f"Deadline from {one_line(n.source)} ({one_line(n.rule_id)})."]
    if n.previous_due_at is not None:
        lines.append(f"Moved from {instant_text(n.previous_due_at)}.")
    if n.note:
        lines.append(multi_line(n.note))
    if n.url:
        lines.append(one_line(n.url))
    ev.add("description", "\n".join(lines))
    if n.url and urlparse(n.url).scheme in ("http", "https"):
        ev.add("url", n.url)


def _event(cal: icalendar.Calendar) -> icalendar.Event | None:
    return next(iter(cal.walk("VEVENT")), None)


def _etag(response: httpx.Response) -> str | None:
    return response.headers.get("ETag")


def _query(obligation_key: str) -> bytes:
    """A calendar-query REPORT body for the VEVENTs whose X-DEADLINE-OBLIGATION is ``obligation_key``."""
    d, c = "DAV:", "urn:ietf:params:xml:ns:caldav"
    root = ET.Element(f"{{{c}}}calendar-query")
    prop = ET.SubElement(root, f"{{{d}}}prop")
    ET.SubElement(prop, f"{{{d}}}getetag")
    ET.SubElement(prop, f"{{{c}}}calendar-data")
    comp = ET.SubElement(ET.SubElement(ET.SubElement(root, f"{{{c}}}filter"), f"{{{c}}}comp-filter",
                                       name="VCALENDAR"), f"{{{c}}}comp-filter", name="VEVENT")
    match = ET.SubElement(ET.SubElement(comp, f"{{{c}}}prop-filter", name=PROP_OBLIGATION),
                          f"{{{c}}}text-match", collation="i;octet")
    match.text = obligation_key
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


class CaldavSender:
    """Channel booking alerts in CalDAV calendars (see the module docstring).

    ``send(n)``: book (reminder), correct (correction) or cancel (cancellation); returns a
    :class:`SendResult` whose ``provider_message_id`` names what happened and the server's ETag
    (``booked, ETag "…"``, ``already booked (412)``, ``found by lookup, ETag "…"``, ``corrected 1
    event(s)``…). ``resolve_unknown(n)``: the lookup the sweep calls after a crash. Both raise
    :class:`DeliveryError`. Escalation notices are refused (permanent): an operator's notice is no
    event to book. ``network``: the outbound policy every request must pass (``None``: only
    globally routable addresses).
    """

    idempotency_class = IDEMPOTENCY_BOOKING

    def __init__(self, name: str, cfg: CaldavChannel, network: NetworkPolicy | None = None) -> None:
        self.name = name
        self.cfg = cfg
        self.network = network or DEFAULT_POLICY
        self._client: httpx.Client | None = None

    # ------------------------------------------------------------------ HTTP, in one place

    def _auth(self) -> tuple[str, str] | None:
        if not self.cfg.username_env and not self.cfg.password_env:
            return None
        values = []
        for var, read in ((self.cfg.username_env, os.environ.get), (self.cfg.password_env, secret_from_env)):
            # The password is registered as a secret: no later log line or error can show it.
            value = read(var) if var else None
            if value is None:
                missing = var or "username_env/password_env (only one is named)"
                raise DeliveryError(f"channel {self.name!r}: credential variable {missing} is not set", permanent=True)
            values.append(value)
        return values[0], values[1]

    def _request(self, method: str, url: str, *, headers: dict[str, str] | None = None,
                 content: bytes | None = None) -> httpx.Response:
        """One HTTP request to the CalDAV server, through the outbound guard. Raises
        :class:`DeliveryError`: permanent ``"failed"`` when the guard refuses the target (naming the
        rule) or the URL is unusable, retryable ``"failed"`` when nothing was sent; raises
        :class:`_MaybeSent` when the request left and no answer came back within
        ``cfg.timeout_seconds`` of its start."""
        if self._client is None:
            # Redirects are not followed: a booking PUT must land where the configuration says, and
            # each hop would be another target to trust.
            self._client = guarded_httpx_client(self.network, timeout=httpx.Timeout(self.cfg.timeout_seconds),
                                                follow_redirects=False, auth=self._auth())
        try:
            # One deadline per request: the client's read timeout restarts with every chunk, so a
            # server dripping its answer a byte at a time would hold the send (and its lease) for as
            # long as it liked.
            with request_deadline(self.cfg.timeout_seconds):
                return self._client.request(method, url, headers=headers, content=content)
        except OutboundRefused as exc:
            # Decided before any connection; the same target would be refused again: never retried.
            raise DeliveryError(f"channel {self.name!r} (caldav {_shown(url)}): {method} not sent: {exc}",
                                permanent=True) from None
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise DeliveryError(f"channel {self.name!r} (caldav {_shown(url)}): unusable URL: {exc}",
                                permanent=True) from exc
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ProxyError) as exc:
            raise DeliveryError(f"channel {self.name!r} (caldav {_shown(url)}): {method} not sent: "
                                f"{type(exc).__name__}: {exc}", permanent=False) from exc
        except httpx.TransportError as exc:
            raise _MaybeSent(f"{method} {_shown(url)}: {type(exc).__name__}: {exc}") from exc

    def _fail(self, what: str, response: httpx.Response) -> DeliveryError:
        """The :class:`DeliveryError` for a non-success answer that was not an unknown outcome."""
        status = response.status_code
        msg = (f"channel {self.name!r} (caldav {_shown(str(response.url))}): {what}: "
               f"HTTP {status} {response.reason_phrase}")
        if status in NOT_PROCESSED_STATUSES:
            return DeliveryError(msg, permanent=False,
                                 retry_after=parse_retry_after(response.headers.get("Retry-After")))
        return DeliveryError(msg, permanent=status < 500 or status == 501)

    def calendar_url(self, n: Notification) -> str:
        """The subscriber's calendar collection URL (``caldav_url``, else the channel's template),
        with a trailing ``/``. Raises :class:`DeliveryError` (permanent) when there is none."""
        url = n.caldav_url or (self.cfg.url_template or "").replace("{subscriber}", quote(n.subscriber_id, safe=""))
        if not url:
            raise DeliveryError(f"channel {self.name!r}: subscriber {n.subscriber_id} has no caldav_url and the "
                                "channel has no url_template", permanent=True)
        return url if url.endswith("/") else url + "/"

    # ------------------------------------------------------------------ the channel

    def send(self, n: Notification) -> SendResult:
        """Book, correct or cancel ``n``'s event (see the module docstring). Raises :class:`DeliveryError`."""
        if n.kind == "reminder":
            return self._book(n)
        if n.kind == "correction":
            return self._correct(n)
        if n.kind == "cancellation":
            return self._cancel(n)
        raise DeliveryError(f"channel {self.name!r}: a caldav channel books deadlines; it cannot carry a "
                            f"{n.kind} notice", permanent=True)

    def resolve_unknown(self, n: Notification) -> SendResult | None:
        """Whether an earlier attempt of ``n`` with an unknown outcome took effect on the server.

        Reminders: ``GET`` of the event's resource → :class:`SendResult` with the server's ETag when
        found, ``None`` when absent (404/410: booking again is safe and needed). Corrections and
        cancellations return ``None``: they set a state conditionally and leave an event already in
        that state alone, so applying them again cannot double anything. Raises
        :class:`DeliveryError` (permanent, ``"unknown"``) when the server cannot be asked.
        """
        if n.kind != "reminder":
            return None
        url = self.calendar_url(n) + resource_name(event_uid(n, self.cfg.book))
        try:
            response = self._request("GET", url)
        except (DeliveryError, _MaybeSent) as exc:
            raise DeliveryError(f"channel {self.name!r}: unknown booking outcome and the lookup of "
                                f"{event_uid(n, self.cfg.book)} failed: {exc}", permanent=True,
                                outcome="unknown") from exc
        if response.status_code == 200:
            return SendResult(f"found by lookup, ETag {_etag(response) or '(none)'}")
        if response.status_code in (404, 410):
            return None
        raise DeliveryError(f"channel {self.name!r}: unknown booking outcome and the lookup of "
                            f"{event_uid(n, self.cfg.book)} answered HTTP {response.status_code}", permanent=True,
                            outcome="unknown")

    def _book(self, n: Notification) -> SendResult:
        uid = event_uid(n, self.cfg.book)
        url = self.calendar_url(n) + resource_name(uid)
        body = build_event(n, uid, now=datetime.now(UTC)).to_ical()
        headers = {"If-None-Match": "*", "Content-Type": _ICS}
        for attempt in (1, 2):
            try:
                response = self._request("PUT", url, headers=headers, content=body)
            except _MaybeSent as exc:
                response, why = None, str(exc)
            else:
                why = f"HTTP {response.status_code}"
                if response.status_code in (200, 201, 204):
                    return SendResult(f"booked, ETag {_etag(response) or '(none)'}")
                if response.status_code == 412:
                    # The resource exists: this alert (or this deadline) is already booked.
                    return SendResult("already booked (412)")
                if response.status_code < 500 or response.status_code in NOT_PROCESSED_STATUSES:
                    raise self._fail(f"booking {uid}", response)
            # No answer, or a 5xx that may have come after the write: ask the server.
            found = self.resolve_unknown(n)
            if found is not None:
                return found
            if attempt == 2:
                break
        raise DeliveryError(f"channel {self.name!r}: booking {uid} had no usable answer twice ({why}); the "
                            "server holds no event, booking again on the next attempt", permanent=False)

    def _events_of(self, n: Notification) -> list[tuple[str, str | None, icalendar.Calendar]]:
        """``(url, etag, calendar)`` of every event booked for ``n``'s obligation."""
        base = self.calendar_url(n)
        if not n.obligation_key:
            raise DeliveryError(f"alert {n.dedup_key}: no obligation key to find the booked events by", permanent=True)
        try:
            if self.cfg.book == "obligation":
                url = base + resource_name(event_uid(n, "obligation"))
                response = self._request("GET", url)
                if response.status_code in (404, 410):
                    return []
                if response.status_code != 200:
                    raise self._fail("reading the booked event", response)
                return [(url, _etag(response), icalendar.Calendar.from_ical(response.content))]
            response = self._request("REPORT", base, headers={"Depth": "1", "Content-Type": "application/xml"},
                                     content=_query(n.obligation_key))
        except _MaybeSent as exc:  # a read: nothing changed; try again later
            raise DeliveryError(f"channel {self.name!r}: finding the booked events failed: {exc}",
                                permanent=False) from exc
        if response.status_code != 207:
            raise self._fail("finding the booked events", response)
        out = []
        try:
            root = ET.fromstring(response.content)
        except ET.ParseError as exc:
            raise DeliveryError(f"channel {self.name!r}: the server's REPORT answer is not XML: {exc}",
                                permanent=False) from exc
        for resp in root.iter(f"{_DAV}response"):
            href = resp.findtext(f"{_DAV}href")
            data = resp.findtext(f".//{_CALDAV}calendar-data")
            if not href or not data:
                continue
            cal = icalendar.Calendar.from_ical(data)
            ev = _event(cal)
            # The server's filter is trusted only as far as this check: a server that ignores
            # prop-filters must not make us rewrite someone else's event.
            if ev is None or str(ev.get(PROP_OBLIGATION, "")) != n.obligation_key:
                continue
            out.append((urljoin(base, href), resp.findtext(f".//{_DAV}getetag"), cal))
        return out

    def _put_update(self, url: str, etag: str | None, cal: icalendar.Calendar, what: str) -> httpx.Response:
        headers = {"Content-Type": _ICS}
        if etag:
            headers["If-Match"] = etag  # a concurrent change answers 412 instead of being overwritten
        try:
            response = self._request("PUT", url, headers=headers, content=cal.to_ical())
        except _MaybeSent as exc:  # an update: applying it again on the next attempt is harmless
            raise DeliveryError(f"channel {self.name!r}: {what}: {exc}", permanent=False, outcome="unknown") from exc
        if response.status_code == 412:
            raise DeliveryError(f"channel {self.name!r}: {what}: the event changed meanwhile (412); retrying",
                                permanent=False)
        if response.status_code not in (200, 201, 204):
            raise self._fail(what, response)
        return response

    def _correct(self, n: Notification) -> SendResult:
        events = self._events_of(n)
        if not events:
            raise DeliveryError(f"channel {self.name!r}: no booked event of obligation {n.obligation_key} to correct "
                                "(deleted in the calendar?)", permanent=True)
        changed = 0
        for url, etag, cal in events:
            ev = _event(cal)
            if ev.decoded("DTSTART") == n.due_at and str(ev.get("STATUS", "")) != "CANCELLED":
                continue  # this correction is already applied
            _describe(ev, n)
            _bump(ev)
            ev.pop("STATUS", None)
            ev.add("status", "CONFIRMED")
            self._put_update(url, etag, cal, f"correcting {ev.get('UID')}")
            changed += 1
        return SendResult(f"corrected {changed} of {len(events)} event(s)")

    def _cancel(self, n: Notification) -> SendResult:
        events = self._events_of(n)
        changed = 0
        for url, etag, cal in events:
            ev = _event(cal)
            if self.cfg.cancel == "delete":
                try:
                    response = self._request("DELETE", url, headers={"If-Match": etag} if etag else None)
                except _MaybeSent as exc:
                    raise DeliveryError(f"channel {self.name!r}: deleting {ev.get('UID')}: {exc}", permanent=False,
                                        outcome="unknown") from exc
                if response.status_code in (404, 410):
                    continue
                if response.status_code == 412:
                    raise DeliveryError(f"channel {self.name!r}: deleting {ev.get('UID')}: the event changed "
                                        "meanwhile (412); retrying", permanent=False)
                if response.status_code not in (200, 204):
                    raise self._fail(f"deleting {ev.get('UID')}", response)
                changed += 1
                continue
            if str(ev.get("STATUS", "")) == "CANCELLED":
                continue
            ev.pop("STATUS", None)
            ev.add("status", "CANCELLED")
            _bump(ev)
            self._put_update(url, etag, cal, f"cancelling {ev.get('UID')}")
            changed += 1
        verb = "deleted" if self.cfg.cancel == "delete" else "cancelled"
        return SendResult(f"{verb} {changed} of {len(events)} event(s)")

    def close(self) -> None:
        """Close the HTTP client."""
        if self._client is not None:
            self._client.close()
            self._client = None


def _bump(ev: icalendar.Event) -> None:
    """``SEQUENCE`` + 1 and a fresh ``DTSTAMP``: clients take the higher sequence as the newer event."""
    seq = int(ev.get("SEQUENCE", 0)) + 1
    for prop in ("SEQUENCE", "DTSTAMP", "LAST-MODIFIED"):
        ev.pop(prop, None)
    now = datetime.now(UTC)
    ev.add("sequence", seq)
    ev.add("dtstamp", now)
    ev.add("last-modified", now)


def _shown(url: str) -> str:
    """A URL for messages: user info (a password), query values and fragment masked."""
    return redact_url(url)
