"""Deliver alerts as JSON POSTs to each subscriber's ``webhook_url``.

Two transports behind one classification: :meth:`WebhookSender.send` (httpx, blocking, one alert at
a time) and :meth:`WebhookSender.send_async` (aiohttp, what the sweep uses). Measured on the 2-core
benchmark machine against one loopback receiver at concurrency 64, httpx's client saturated its
process at ~250 requests/s and aiohttp at ~2,600/s, so the sweep's hot path uses aiohttp
(``benchmarks/deliver.py`` reports the ceiling of each run).

Request: ``POST`` with ``Content-Type: application/json``, ``Idempotency-Key: <dedup_key>`` and the
Standard Webhooks envelope ``{"type", "timestamp", "data"}`` (:func:`payload`): ``type`` is
``reminder.due``, ``reminder.corrected``, ``reminder.cancelled`` or ``reminder.escalated``; ``data``
holds the alert with its offset (ISO 8601 and words), the subscriber's zone and local due time, and
the deadline's own zone. The channel option ``body: legacy`` sends the earlier flat body ``{"id",
"kind", "subscriber", "source", "rule_id", "title", "due_at", "previous_due_at", "url", "note"}``
instead (times as ISO 8601 UTC with ``Z``, ``null`` when absent).

Pages to the on-call (``kind="incident"``) are not reminders: their ``type`` is
``incident.triggered`` or ``incident.resolved`` and ``data`` holds the incident (its stable
``incident_key``, severity, source, summary, check, target, links, and ``pagerduty`` /
``alertmanager`` renderings; :mod:`deadline_pipeline.deliver.incident`, ``docs/paging.md``). Two
more ``body`` options carry pages only, in an on-call tool's own format: ``pagerduty`` (a PagerDuty
Events API v2 event, ``routing_key`` from the variable named by ``routing_key_env``) and
``alertmanager`` (the body of Alertmanager's ``POST /api/v2/alerts``); a subscriber's reminder on
such a channel is a permanent error. Standard Webhooks headers
(https://www.standardwebhooks.com) are always sent: ``webhook-id`` (the dedup key, equal on every
retry of the same alert), ``webhook-timestamp`` (Unix seconds of this attempt) and, when the
configuration names ``secret_env``, ``webhook-signature: v1,<base64 HMAC-SHA256 of
"{id}.{timestamp}.{body}">``. The secret in that variable is base64, optionally prefixed
``whsec_`` (the spec's format); anything else is a permanent configuration error.

Answers and failures:

* 2xx: sent; ``provider_message_id`` = the response JSON's ``"id"`` when present, else ``"HTTP <status>"``.
  The status line is the receiver's acknowledgement: a 2xx whose body does not arrive within the
  timeout, or breaks off, is sent too (``"HTTP <status> (answer body unread: …)"``, logged), not an
  unknown outcome resent until escalated. At most :data:`ANSWER_LIMIT` bytes of any answer are read.
* 408, 429, 503: not processed, retryable ``"failed"``; ``Retry-After`` (seconds or HTTP date) is
  passed on as ``retry_after`` seconds.
* other 5xx: retryable ``"unknown"`` (the receiver may have acted before failing, e.g. 500, or a
  gateway timed out waiting for it, 504).
* 3xx and other 4xx: permanent ``"failed"`` (redirects are not followed: the configured URL is wrong).
* a target the outbound guard refuses (loopback, private, link-local … not in ``network.allow``,
  see :mod:`deadline_pipeline.security.outbound`): permanent ``"failed"``, never retried; no
  connection is made.
* connect errors: retryable ``"failed"``; a dropped connection after the request was (partly) sent:
  retryable ``"unknown"``. A timeout is retryable ``"unknown"`` (the blocking ``send``: ``"failed"``
  when it struck while connecting, before anything was sent). Both transports end a send within
  ``timeout_seconds`` in all, however the answer arrives (``send`` plus a few milliseconds, see
  :func:`~deadline_pipeline.security.outbound.request_deadline`), so a receiver dripping its answer
  cannot hold a send past the lease it was started under, nor the sweep's bookkeeping thread that
  sends escalation notices, nor a watchdog page.

Secrets in the URL: ``webhook_url`` may carry ``${VAR}`` references (``https://h/hook?token=${HOOK_TOKEN}``),
expanded from the environment at send time, so the token lives neither in the configuration nor in
the store; an unset variable is a permanent error naming it. Every error names the URL redacted
(user info, query values and fragment masked; see :mod:`deadline_pipeline.security.redact`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime, tzinfo
from email.utils import parsedate_to_datetime
from functools import lru_cache
from urllib.parse import urlsplit

import httpx
import orjson

from deadline_pipeline import zone_data
from deadline_pipeline.config import WebhookChannel
from deadline_pipeline.deliver import incident as inc_mod
from deadline_pipeline.deliver.channels.base import IDEMPOTENCY_NOTIFICATION
from deadline_pipeline.deliver.notification import DeliveryError, Notification, SendResult
from deadline_pipeline.deliver.render import LATE_AFTER
from deadline_pipeline.security.outbound import (
    DEFAULT_POLICY,
    NetworkPolicy,
    OutboundRefused,
    guarded_aiohttp_connector,
    guarded_httpx_client,
    request_deadline,
)
from deadline_pipeline.security.redact import expand_secret_refs, redact_url, register_secret, secret_from_env
from deadline_pipeline.timezones import UnknownTimeZone, resolve_zone
from deadline_pipeline.wording import iso_duration, offset_words

log = logging.getLogger(__name__)

NOT_PROCESSED_STATUSES = (408, 429, 503)
SECRET_PREFIX = "whsec_"

# The most of a receiver's answer that is read, in bytes: ample for its id and an error's text. A
# receiver streaming gigabytes in answer (or announcing them) would otherwise fill the sweep's memory
# within the send's timeout.
ANSWER_LIMIT = 64 * 1024


def _encode_body(doc: dict) -> bytes:
    """``doc`` as compact UTF-8 JSON: the bytes of ``json.dumps(doc, ensure_ascii=False,
    separators=(",", ":")).encode()`` for the str/int/bool/None trees :func:`payload` builds.

    orjson: 2.1 µs per alert's body against 10.9 µs for the stdlib's C encoder (CPU time, 20,000
    bodies), on the sweep's event loop. Raises ``TypeError`` (orjson.JSONEncodeError) for text
    that is not valid Unicode (a lone surrogate), as the stdlib's ``.encode()`` raised
    ``UnicodeEncodeError``: the send fails alone.
    """
    return orjson.dumps(doc)


def iso_z(when: datetime | None) -> str | None:
    """An aware datetime as ISO 8601 UTC with a ``Z`` suffix (``2024-06-15T21:59:00Z``), ``None`` as ``None``."""
    if when is None:
        return None
    if when.tzinfo is not UTC:  # a Notification's times are already UTC (normalised on construction)
        when = when.astimezone(UTC)
    return when.isoformat().replace("+00:00", "Z")


# The planned send instant is shared by every subscriber of a deadline at one offset (and the old
# due instant of a correction by all its alerts), so they are formatted once per instant: payload()
# went from 8.3 to 6.8 µs per alert (CPU time, median of 30 runs over 2,000 alerts). typed=True, as
# for _due_texts: the text depends on the instant only.
_iso_z_shared = lru_cache(maxsize=4096, typed=True)(iso_z)


# Standard Webhooks event types, "<group>.<event>" (https://www.standardwebhooks.com, "Payload structure").
# A page (kind "incident") has its own: incident.triggered / incident.resolved (deliver/incident.py).
EVENT_TYPES = {"reminder": "reminder.due", "correction": "reminder.corrected",
               "cancellation": "reminder.cancelled", "escalation": "reminder.escalated"}
# Bodies that only a page can fill (an on-call tool's own format); a reminder on them is refused.
INCIDENT_BODIES = ("pagerduty", "alertmanager")


@lru_cache(maxsize=1024)
def _zone_or_none(tz_name: str) -> tzinfo | None:
    # Cached with the unknown answer too: raising and catching UnknownTimeZone for a subscriber with
    # an unknown zone on every alert costs more than the rest of the conversion.
    try:
        return resolve_zone(tz_name)
    except UnknownTimeZone:
        return None


def _local_iso(when: datetime | None, tz_name: str | None) -> str | None:
    """``when`` as ISO 8601 with the offset of ``tz_name`` (``2026-05-06T23:59:59-12:00``); None when
    either is missing or the zone is unknown (the UTC instant is always in the body)."""
    if when is None or not tz_name:
        return None
    zone = _zone_or_none(tz_name)
    return None if zone is None else when.astimezone(zone).isoformat()


# typed=True: only a datetime equal in instant *and* type shares an entry (the texts depend on the instant only).
@lru_cache(maxsize=4096, typed=True)
def _due_texts(due_at: datetime, subscriber_tz: str | None, rule_tz: str | None) -> tuple[str | None, ...]:
    """``(due_at as UTC "Z", in the subscriber's zone, in the deadline's zone)``; cached because a
    sweep sends the same deadline to many subscribers and at several offsets."""
    return iso_z(due_at), _local_iso(due_at, subscriber_tz), _local_iso(due_at, rule_tz)


# Both caches are keyed by zone *names*: kept across a switch of the zone data in force, they went on
# showing the old rules' local times ("due_local": 01:00-08:00 in Vancouver) beside a due_at planned
# with the new ones (02:00-07:00), while the e-mail of the same alert said 02:00.
zone_data.on_change(_zone_or_none.cache_clear)
zone_data.on_change(_due_texts.cache_clear)


def payload(n: Notification, body: str = "standard-webhooks", routing_key: str | None = None) -> dict | list:
    """The JSON body for ``n``: the Standard Webhooks envelope (``body="standard-webhooks"``) or the
    earlier flat body (``body="legacy"``); see the module docstring. ``timestamp`` is the send
    attempt (``n.sent_at``, else now), ISO 8601 UTC. A page (``n.incident`` set) gets
    :func:`incident_payload`, which also knows ``body="pagerduty"`` (with ``routing_key``) and
    ``body="alertmanager"``."""
    if n.incident is not None:
        return incident_payload(n, body, routing_key)
    if body == "legacy":
        return legacy_payload(n)
    late = (n.kind == "reminder" and n.sent_at is not None and n.planned_at is not None
            and n.sent_at - n.planned_at > LATE_AFTER)
    due_at, due_local, due_in_deadline_timezone = _due_texts(n.due_at, n.subscriber_tz, n.rule_tz)
    return {
        "type": EVENT_TYPES[n.kind],
        "timestamp": iso_z(n.sent_at or datetime.now(UTC)),
        "data": {
            "id": n.dedup_key,
            "subscriber": n.subscriber_id,
            "source": n.source,
            "rule_id": n.rule_id,
            "title": n.title,
            "due_at": due_at,
            "previous_due_at": _iso_z_shared(n.previous_due_at),
            "offset": iso_duration(n.offset_seconds),
            "offset_seconds": n.offset_seconds,
            "offset_words": offset_words(n.offset_seconds),
            "subscriber_timezone": n.subscriber_tz,
            "due_local": due_local,
            "deadline_timezone": n.rule_tz,
            "due_in_deadline_timezone": due_in_deadline_timezone,
            "business_day_note": n.roll_note,
            "planned_send_at": _iso_z_shared(n.planned_at),
            "late": late,
            "late_reason": n.planned_reason if late else None,
            "url": n.url,
            "note": n.note,
        },
    }


def incident_payload(n: Notification, body: str = "standard-webhooks", routing_key: str | None = None) -> dict | list:
    """The JSON body of a page (``n.incident`` set), by the channel's ``body`` option:

    * ``standard-webhooks``: ``{"type": "incident.triggered" | "incident.resolved", "timestamp",
      "data"}``, ``data`` = :func:`~deadline_pipeline.deliver.incident.envelope_data`;
    * ``legacy``: the flat body with ``kind`` ``"incident"`` and the same ``data`` under ``"incident"``;
    * ``pagerduty``: the PagerDuty Events API v2 event itself (``routing_key`` set when given), for
      ``https://events.pagerduty.com/v2/enqueue``;
    * ``alertmanager``: the list of postable alerts of Alertmanager's ``POST /api/v2/alerts``.

    Raises ``ValueError`` for another ``body``.
    """
    inc = n.incident
    if body == "standard-webhooks":
        return {"type": inc.event_type, "timestamp": iso_z(n.sent_at or datetime.now(UTC)),
                "data": inc_mod.envelope_data(inc, n.dedup_key)}
    if body == "legacy":
        return legacy_payload(n) | {"incident": inc_mod.envelope_data(inc, n.dedup_key)}
    if body == "pagerduty":
        return inc_mod.pagerduty_event(inc, routing_key)
    if body == "alertmanager":
        return inc_mod.alertmanager_postable(inc)
    raise ValueError(f"unknown webhook body {body!r}")


def legacy_payload(n: Notification) -> dict:
    """The flat body of earlier releases (``body: legacy``)."""
    return {
        "id": n.dedup_key,
        "kind": n.kind,
        "subscriber": n.subscriber_id,
        "source": n.source,
        "rule_id": n.rule_id,
        "title": n.title,
        "due_at": iso_z(n.due_at),
        "previous_due_at": iso_z(n.previous_due_at),
        "url": n.url,
        "note": n.note,
    }


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """``Retry-After`` as seconds to wait (``"7"`` → ``7.0``; an HTTP date → seconds from ``now``,
    at least 0), or ``None`` when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(int(value)))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def decode_secret(text: str) -> bytes:
    """The signing key bytes of a Standard Webhooks secret (``whsec_<base64>`` or bare base64).

    Raises ``ValueError`` when the text is not base64 or decodes to nothing.
    """
    raw = text.strip().removeprefix(SECRET_PREFIX)
    try:
        # The spec allows unpadded base64; validate=True refuses stray characters instead of
        # silently dropping them (which would sign with a different key than the receiver's).
        key = base64.b64decode(raw + "=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not base64: {exc}") from None
    if not key or not raw:
        raise ValueError("empty secret")
    return key


def sign(key: bytes | hmac.HMAC, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256(key, "{msg_id}.{timestamp}.{body}")>`` (Standard Webhooks, version 1).

    ``key``: the key bytes, or :func:`keyed_hmac` of them (the same signature, cheaper per message).
    """
    if isinstance(key, hmac.HMAC):
        # A copy of the keyed state: hmac.digest() sets the key up again (and OpenSSL 3 looks the
        # digest up again) for every message; 4.3 → 3.2 µs per alert (CPU time, median of 40 runs).
        mac = key.copy()
        mac.update(f"{msg_id}.{timestamp}.".encode())
        mac.update(body)
        return "v1," + base64.b64encode(mac.digest()).decode("ascii")
    to_sign = f"{msg_id}.{timestamp}.".encode() + body
    # hmac.digest: the one-shot C implementation of hmac.new(...).digest(), same bytes.
    return "v1," + base64.b64encode(hmac.digest(key, to_sign, hashlib.sha256)).decode("ascii")


def keyed_hmac(key: bytes) -> hmac.HMAC:
    """An HMAC-SHA256 keyed with ``key`` and fed nothing, for :func:`sign` to copy per message."""
    return hmac.new(key, digestmod=hashlib.sha256)


def classify(channel: str, url: str, status: int, reason: str, headers: Mapping[str, str], text: str,
             response_id: str | None) -> SendResult:
    """The :class:`SendResult` of a 2xx answer; raises :class:`DeliveryError` for any other status
    (see the module docstring for which statuses are permanent, ``"failed"`` or ``"unknown"``)."""
    if 200 <= status < 300:
        return SendResult(provider_message_id=response_id or f"HTTP {status}")
    detail = f"HTTP {status} {reason}: {text[:200]!r}"
    where = f"channel {channel!r} (webhook {redact_url(url)}): "
    retry_after = parse_retry_after(headers.get("Retry-After"))
    if status in NOT_PROCESSED_STATUSES:
        raise DeliveryError(where + detail, permanent=False, retry_after=retry_after)
    if 500 <= status < 600:
        raise DeliveryError(where + detail, permanent=False, outcome="unknown", retry_after=retry_after)
    hint = " (redirects are not followed; configure the final URL)" if 300 <= status < 400 else ""
    raise DeliveryError(where + detail + hint, permanent=True)


def response_id_of(text: str) -> str | None:
    """The ``"id"`` of a JSON object answer, else ``None`` (not JSON, not an object, no scalar id).

    Read by orjson (0.03 µs for the usual ``{}`` against 0.75 µs for the stdlib's, once per send on
    the sweep's event loop). What orjson reads otherwise than the stdlib is read by the stdlib, so
    the answer is the same either way: it refuses ``NaN``, and it reads an integer beyond 64 bits as
    a float (``1.2345678901234568e+29``, where the stdlib keeps every digit)."""
    if not text:
        return None
    try:
        data = orjson.loads(text)
        if isinstance(data, dict) and isinstance(data.get("id"), float):
            data = json.loads(text)
    except ValueError:  # orjson.JSONDecodeError is a ValueError: refused by orjson, maybe not by the stdlib
        try:
            data = json.loads(text)
        except ValueError:  # not JSON (json.JSONDecodeError and UnicodeDecodeError are ValueErrors)
            return None
    value = data.get("id") if isinstance(data, dict) else None
    if value is None or isinstance(value, dict | list):
        return None
    return str(value)


class WebhookSender:
    """Channel POSTing to ``n.webhook_url``.

    ``cfg.timeout_seconds``: ``send`` and ``send_async`` (the sweep's transport) end within that
    many seconds from start to answer, however slowly the answer arrives.
    ``send``/``send_async`` raise :class:`DeliveryError` as described in the module docstring; a
    missing ``webhook_url``, an unset ``secret_env`` or ``${VAR}`` variable, a secret that is not base64
    or a target refused by ``network`` (the outbound policy) is permanent. ``send_async`` must always
    be awaited on the same event loop until :meth:`aclose`.
    """

    idempotency_class = IDEMPOTENCY_NOTIFICATION

    def __init__(self, name: str, cfg: WebhookChannel, network: NetworkPolicy | None = None) -> None:
        self.name = name
        self.cfg = cfg
        self.network = network or DEFAULT_POLICY
        # follow_redirects=False: a redirected POST could land the alert (and its signature) elsewhere.
        self._client: httpx.Client | None = None
        self._session = None  # aiohttp.ClientSession, created on the loop that uses it
        # (secret text, the HMAC keyed with its decoded key): the variable is read on every send, so
        # a rotated secret signs the next alert, but decoded and keyed only when its text changes.
        self._signing_key: tuple[str, hmac.HMAC] | None = None

    def _error(self, url: str, what: str, *, permanent: bool, outcome: str = "failed",
               retry_after: float | None = None) -> DeliveryError:
        return DeliveryError(f"channel {self.name!r} (webhook {redact_url(url)}): {what}", permanent=permanent,
                             outcome=outcome, retry_after=retry_after)

    def _prepare(self, n: Notification) -> tuple[str, bytes, dict[str, str]]:
        template = n.webhook_url or ""
        if not template:
            raise self._error("(none)", f"subscriber {n.subscriber_id!r} has no webhook_url", permanent=True)
        try:
            url = expand_secret_refs(template)
        except KeyError as exc:
            raise self._error(template, f"environment variable {exc.args[0]} (referenced in webhook_url) is not "
                              "set", permanent=True) from None
        # ${VAR} values are registered by the expansion; a password written into the URL itself is
        # registered here, so it is masked even where a library prints it outside the URL.
        try:
            register_secret(urlsplit(url).password if "@" in url else None)
        except ValueError:  # unparseable: the HTTP client refuses it below as an unusable URL
            pass
        body = _encode_body(self._document(n, url))
        timestamp = int(time.time())
        headers = {"Content-Type": "application/json", "Idempotency-Key": n.dedup_key,
                   "webhook-id": n.dedup_key, "webhook-timestamp": str(timestamp)}
        if self.cfg.secret_env is not None:
            secret = secret_from_env(self.cfg.secret_env)
            if secret is None:
                # Sending unsigned would be refused by a receiver that checks, or accepted by one
                # that should not trust it.
                raise self._error(url, f"environment variable {self.cfg.secret_env} (named in the "
                                  "configuration as secret_env) is not set", permanent=True)
            cached = self._signing_key
            if cached is not None and cached[0] == secret:
                key = cached[1]
            else:
                try:
                    key = decode_secret(secret)
                except ValueError as exc:
                    raise self._error(url, f"environment variable {self.cfg.secret_env} does not hold a Standard "
                                      f"Webhooks secret ('whsec_<base64>'): {exc}", permanent=True) from None
                key = keyed_hmac(key)
                self._signing_key = (secret, key)
            headers["webhook-signature"] = sign(key, n.dedup_key, timestamp, body)
        return url, body, headers

    def _document(self, n: Notification, url: str) -> dict | list:
        """The body document for ``n`` (:func:`payload`). Raises :class:`DeliveryError` (permanent)
        for a subscriber's reminder on a channel whose ``body`` carries pages only (``pagerduty``,
        ``alertmanager``), and for an unset ``routing_key_env`` variable."""
        if n.incident is None:
            if self.cfg.body in INCIDENT_BODIES:
                raise self._error(url, f"body {self.cfg.body!r} carries pages only, not a {n.kind} for subscriber "
                                  f"{n.subscriber_id!r} (use body standard-webhooks or legacy)", permanent=True)
            return payload(n, self.cfg.body)
        routing_key = None
        if self.cfg.body == "pagerduty" and self.cfg.routing_key_env is not None:
            routing_key = secret_from_env(self.cfg.routing_key_env)
            if not routing_key:
                raise self._error(url, f"environment variable {self.cfg.routing_key_env} (named in the "
                                  "configuration as routing_key_env) is not set", permanent=True)
        return payload(n, self.cfg.body, routing_key)

    # ------------------------------------------------------------------ blocking (httpx)

    def send(self, n: Notification) -> SendResult:
        """POST ``n`` to ``n.webhook_url``. Returns the receiver's id; raises :class:`DeliveryError`."""
        url, body, headers = self._prepare(n)
        if self._client is None:
            self._client = guarded_httpx_client(self.network, timeout=httpx.Timeout(self.cfg.timeout_seconds),
                                                follow_redirects=False)
        try:
            # The client's timeouts are per phase, and its read timeout restarts with every chunk: a
            # receiver dripping its headers or body a byte at a time held this send (and with it the
            # sweep's bookkeeping thread, which sends escalation notices, or a watchdog page) for as
            # long as it liked. The deadline bounds the whole request, headers and body.
            with request_deadline(self.cfg.timeout_seconds), \
                    self._client.stream("POST", url, content=body, headers=headers) as response:
                status, reason, answer_headers = response.status_code, response.reason_phrase, response.headers
                try:
                    length = response.headers.get("Content-Length", "")
                    if length.isdigit() and int(length) <= ANSWER_LIMIT:
                        raw = response.read()
                    else:
                        raw = b""
                        for chunk in response.iter_bytes():
                            raw += chunk
                            if len(raw) >= ANSWER_LIMIT:
                                break
                except httpx.TransportError as exc:
                    if 200 <= status < 300:
                        return self._accepted(url, status, exc)
                    raise
        except OutboundRefused as exc:
            # Before any connection: permanent, a retry would be refused the same way.
            raise self._error(url, str(exc), permanent=True) from None
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ProxyError) as exc:
            # No request reached the receiver.
            raise self._error(url, f"{type(exc).__name__}: {exc}", permanent=False) from exc
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise self._error(url, f"unusable URL: {exc}", permanent=True) from exc
        except httpx.TransportError as exc:
            # ReadTimeout (also the deadline passing mid-answer), WriteTimeout, RemoteProtocolError,
            # ReadError: the request (or part of it) left, so the receiver may have acted on it.
            raise self._error(
                url, f"no answer after sending, the alert may have been delivered: {type(exc).__name__}: {exc}",
                permanent=False, outcome="unknown",
            ) from exc
        text = raw[:ANSWER_LIMIT].decode("utf-8", "replace")
        return classify(self.name, url, status, reason, answer_headers, text, response_id_of(text))

    def _accepted(self, url: str, status: int, exc: BaseException) -> SendResult:
        """A 2xx status line whose body did not arrive in time (or broke off): the receiver accepted
        the alert (Standard Webhooks: a 2xx answer is the acknowledgement), so it is delivered, without
        the receiver's id. Resending it would only duplicate it, attempt after attempt, until escalated
        as failed."""
        log.warning("channel %r (webhook %s): answered HTTP %d, but its body did not arrive (%s: %s); "
                    "recorded as delivered without the receiver's id", self.name, redact_url(url), status,
                    type(exc).__name__, exc)
        return SendResult(provider_message_id=f"HTTP {status} (answer body unread: {type(exc).__name__})")

    # ------------------------------------------------------------------ asyncio (aiohttp)

    async def send_async(self, n: Notification) -> SendResult:
        """The same POST as :meth:`send` on the running event loop (aiohttp)."""
        import aiohttp

        url, body, headers = self._prepare(n)
        if self._session is None:
            # total: the whole send ends within the channel's timeout, the time its lease is sized
            # for (config.agreement.channel_send_window). A read timeout alone restarts with every
            # chunk, so a receiver dripping its answer a byte at a time held the send - and the
            # sweep waiting for its batch - for as long as it liked. A timeout while connecting is
            # then "unknown" like any other, never "failed": retried either way.
            # DummyCookieJar: the session serves every subscriber of the channel, so a cookie one
            # receiver set would go out with the next alerts to that host, whoever they are for.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.cfg.timeout_seconds),
                connector=guarded_aiohttp_connector(self.network, limit=self.cfg.max_concurrency),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        try:
            async with self._session.post(url, data=body, headers=headers, allow_redirects=False) as response:
                try:
                    length = response.content_length
                    if length is not None and length <= ANSWER_LIMIT:
                        raw = await response.read()  # the usual answer: one read, as fast as before
                    else:
                        raw = b""
                        while len(raw) < ANSWER_LIMIT:
                            chunk = await response.content.read(ANSWER_LIMIT - len(raw))
                            if not chunk:
                                break
                            raw += chunk
                except (TimeoutError, aiohttp.ClientError) as exc:
                    if 200 <= response.status < 300:
                        return self._accepted(url, response.status, exc)
                    raise
                text = raw.decode("utf-8", "replace")
                return classify(self.name, url, response.status, response.reason or "", response.headers, text,
                                response_id_of(text))
        except DeliveryError:
            raise
        except OutboundRefused as exc:
            raise self._error(url, str(exc), permanent=True) from None
        except aiohttp.InvalidURL as exc:
            raise self._error(url, f"unusable URL: {exc}", permanent=True) from exc
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            # No connection, so no request reached the receiver.
            raise self._error(url, f"{type(exc).__name__}: {exc}", permanent=False) from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            # SocketTimeoutError, ServerDisconnectedError, ClientPayloadError, ClientOSError after the
            # connection was made: the request (or part of it) left.
            raise self._error(
                url, f"no answer after sending, the alert may have been delivered: {type(exc).__name__}: {exc}",
                permanent=False, outcome="unknown",
            ) from exc

    async def aclose(self) -> None:
        """Close the aiohttp session (on the loop that created it)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def close(self) -> None:
        """Close the httpx client and its pooled connections (see :meth:`aclose` for the async side)."""
        if self._client is not None:
            self._client.close()
            self._client = None
