"""Deliver alerts as JSON POSTs to each subscriber's ``webhook_url`` (httpx).

Request: ``POST`` with ``Content-Type: application/json``, ``Idempotency-Key: <dedup_key>`` and the
body ``{"id", "kind", "subscriber", "source", "rule_id", "title", "due_at", "previous_due_at",
"url", "note"}`` (times as ISO 8601 UTC with ``Z``, ``null`` when absent). When the configuration
names ``secret_env``, the body is signed: ``X-Deadline-Signature: sha256=<hex HMAC-SHA256 of the
body bytes>``, so the receiver can refuse alerts that did not come from us.

Answers and failures:

* 2xx: sent; ``provider_message_id`` = the response JSON's ``"id"`` when present, else ``"HTTP <status>"``.
* 408, 429, 503: not processed, retryable ``"failed"``; ``Retry-After`` (seconds or HTTP date) is
  passed on as ``retry_after`` seconds.
* other 5xx: retryable ``"unknown"`` (the receiver may have acted before failing, e.g. 500, or a
  gateway timed out waiting for it, 504).
* 3xx and other 4xx: permanent ``"failed"`` (redirects are not followed: the configured URL is wrong).
* connect errors and timeouts before a connection: retryable ``"failed"``; a timeout or dropped
  connection after the request was (partly) sent: retryable ``"unknown"``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

from deadline_pipeline.config import WebhookChannel
from deadline_pipeline.deliver.channels.base import IDEMPOTENCY_NOTIFICATION
from deadline_pipeline.deliver.notification import DeliveryError, Notification, SendResult

NOT_PROCESSED_STATUSES = (408, 429, 503)
SIGNATURE_HEADER = "X-Deadline-Signature"


def iso_z(when: datetime | None) -> str | None:
    """An aware datetime as ISO 8601 UTC with a ``Z`` suffix (``2024-06-15T21:59:00Z``), ``None`` as ``None``."""
    if when is None:
        return None
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def payload(n: Notification) -> dict:
    """The JSON body for ``n`` (see the module docstring)."""
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


class WebhookSender:
    """Channel POSTing to ``n.webhook_url`` with one :class:`httpx.Client` per instance.

    ``cfg.timeout_seconds`` bounds connect, write, read and pool waits, each in seconds.
    ``send`` raises :class:`DeliveryError` as described in the module docstring; a missing
    ``webhook_url`` or an unset ``secret_env`` variable is permanent.
    """

    idempotency_class = IDEMPOTENCY_NOTIFICATION

    def __init__(self, name: str, cfg: WebhookChannel) -> None:
        self.name = name
        self.cfg = cfg
        # follow_redirects=False: a redirected POST could land the alert (and its signature) elsewhere.
        self._client = httpx.Client(timeout=httpx.Timeout(cfg.timeout_seconds), follow_redirects=False)

    def _error(self, url: str, what: str, *, permanent: bool, outcome: str = "failed",
               retry_after: float | None = None) -> DeliveryError:
        return DeliveryError(f"channel {self.name!r} (webhook {url}): {what}", permanent=permanent,
                             outcome=outcome, retry_after=retry_after)

    def _headers(self, n: Notification, body: bytes, url: str) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Idempotency-Key": n.dedup_key}
        if self.cfg.secret_env is not None:
            secret = os.environ.get(self.cfg.secret_env)
            if secret is None:
                # Sending unsigned would be refused by a receiver that checks, or accepted by one
                # that should not trust it.
                raise self._error(url, f"environment variable {self.cfg.secret_env} (named in the "
                                  "configuration as secret_env) is not set", permanent=True)
            digest = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
            headers[SIGNATURE_HEADER] = f"sha256={digest}"
        return headers

    def send(self, n: Notification) -> SendResult:
        """POST ``n`` to ``n.webhook_url``. Returns the receiver's id; raises :class:`DeliveryError`."""
        url = n.webhook_url or ""
        if not url:
            raise self._error("(none)", f"subscriber {n.subscriber_id!r} has no webhook_url", permanent=True)
        body = json.dumps(payload(n), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        headers = self._headers(n, body, url)
        try:
            response = self._client.post(url, content=body, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ProxyError) as exc:
            # No request reached the receiver.
            raise self._error(url, f"{type(exc).__name__}: {exc}", permanent=False) from exc
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise self._error(url, f"unusable URL: {exc}", permanent=True) from exc
        except httpx.TransportError as exc:
            # ReadTimeout, WriteTimeout, RemoteProtocolError, ReadError: the request (or part of it)
            # left, so the receiver may have acted on it.
            raise self._error(
                url, f"no answer after sending, the alert may have been delivered: {type(exc).__name__}: {exc}",
                permanent=False, outcome="unknown",
            ) from exc
        return self._result(url, response)

    def _result(self, url: str, response: httpx.Response) -> SendResult:
        status = response.status_code
        if 200 <= status < 300:
            return SendResult(provider_message_id=_response_id(response) or f"HTTP {status}")
        detail = f"HTTP {status} {response.reason_phrase}: {response.text[:200]!r}"
        if status in NOT_PROCESSED_STATUSES:
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            raise self._error(url, detail, permanent=False, retry_after=retry_after)
        if 500 <= status < 600:
            raise self._error(url, detail, permanent=False, outcome="unknown",
                              retry_after=parse_retry_after(response.headers.get("Retry-After")))
        return_hint = " (redirects are not followed; configure the final URL)" if 300 <= status < 400 else ""
        raise self._error(url, detail + return_hint, permanent=True)

    def close(self) -> None:
        """Close the HTTP client and its pooled connections."""
        self._client.close()


def _response_id(response: httpx.Response) -> str | None:
    try:
        data = response.json()
    except ValueError:  # not JSON (json.JSONDecodeError and UnicodeDecodeError are ValueErrors)
        return None
    value = data.get("id") if isinstance(data, dict) else None
    if value is None or isinstance(value, dict | list):
        return None
    return str(value)
