"""Deliver alerts to a Slack-compatible incoming webhook (Slack, Mattermost, Rocket.Chat …).

One URL per channel configuration, read from the environment variable ``cfg.url_env`` at send time
(the URL is the credential: whoever knows it can post). Request: ``POST`` JSON ``{"text": …}`` with
the rendered subject as the first line and the plain-text body after it.

Untrusted text: ``&``, ``<`` and ``>`` are escaped as Slack's message formatting requires, so a title
from a feed can neither mention ``<!channel>`` nor turn into a link of its own.

Idempotency class ``"notification"``: incoming webhooks take no idempotency key, so a resend after an
unknown outcome can post a visible duplicate message; it carries the same reference (the dedup key)
so a reader can tell it is the same alert. Answers are classified like the webhook channel's
(2xx sent; 408/429/503 retryable with ``Retry-After``; other 5xx unknown; other 4xx permanent, e.g.
Slack's 403 ``invalid_token`` or 404 ``no_service``). A 2xx is sent only when its body does not
refuse the post (:func:`refusal_in_body`): the Slack Web API (a ``chat.postMessage`` URL configured
in place of an incoming webhook) and Rocket.Chat answer a refusal with HTTP 200 and
``{"ok": false, "error": …}`` / ``{"success": false, …}``; recorded as delivered, that reminder
was never posted and no check could tell. Such a refusal is permanent ``"failed"`` (escalated at
once: the same post would be refused again), retryable for a rate limit. A send ends within ``timeout_seconds`` in all
(plus a few milliseconds), however slowly the answer arrives; a timeout after the request left is
retryable ``"unknown"``, one while connecting retryable ``"failed"``. The URL is registered as a
secret when read, so no log line or error can print it, and every connection passes the outbound
guard (``network``); a refused target is permanent.
"""

from __future__ import annotations

import json

import httpx

from deadline_pipeline.config import SlackChannel
from deadline_pipeline.deliver.channels.base import IDEMPOTENCY_NOTIFICATION
from deadline_pipeline.deliver.channels.webhook import classify
from deadline_pipeline.deliver.notification import DeliveryError, Notification, SendResult
from deadline_pipeline.deliver.render import RenderError, render
from deadline_pipeline.security.outbound import (
    DEFAULT_POLICY,
    NetworkPolicy,
    OutboundRefused,
    guarded_httpx_client,
    request_deadline,
)
from deadline_pipeline.security.redact import secret_from_env

# Errors in a 2xx refusal body that a later attempt can get past (Slack Web API error names).
RETRYABLE_BODY_ERRORS = frozenset({"ratelimited", "rate_limited", "internal_error", "fatal_error",
                                   "service_unavailable", "request_timeout"})


def refusal_in_body(text: str) -> str | None:
    """The receiver's error when a 2xx answer's body ``text`` is a JSON object saying the post was
    refused (``"ok": false`` or ``"success": false``, compared as JSON ``false`` only): its
    ``error`` (or ``"no error given"``), else ``None`` (a bare ``ok``, an empty body, any other
    JSON). Pure; never raises."""
    try:
        data = json.loads(text) if text and text.lstrip().startswith("{") else None
    except ValueError:  # not JSON: a bare "ok" or a page of text, which refuses nothing
        return None
    if not isinstance(data, dict) or not (data.get("ok") is False or data.get("success") is False):
        return None
    error = data.get("error")
    return str(error)[:200] if error not in (None, "") else "no error given"


def slack_escape(text: str) -> str:
    """Escape the three characters Slack's message formatting gives meaning to."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_text(n: Notification) -> str:
    """The message text for ``n``: subject, blank line, plain body, escaped. Raises :class:`RenderError`."""
    rendered = render(n)
    return slack_escape(f"{rendered.subject}\n\n{rendered.text.strip()}")


class SlackSender:
    """Channel posting to the incoming-webhook URL held in ``$cfg.url_env``.

    ``send`` returns ``"HTTP <status>"`` as ``provider_message_id`` (incoming webhooks answer a bare
    ``ok``). Raises :class:`DeliveryError`: permanent for an unset variable, a non-http(s) URL or an
    unrenderable alert; otherwise as described in the module docstring.
    """

    idempotency_class = IDEMPOTENCY_NOTIFICATION

    def __init__(self, name: str, cfg: SlackChannel, network: NetworkPolicy | None = None) -> None:
        self.name = name
        self.cfg = cfg
        self.network = network or DEFAULT_POLICY
        self._client: httpx.Client | None = None

    def _url(self) -> str:
        url = secret_from_env(self.cfg.url_env)
        if not url:
            raise DeliveryError(f"channel {self.name!r}: environment variable {self.cfg.url_env} (named in the "
                                "configuration as url_env) is not set", permanent=True)
        if not url.startswith(("https://", "http://")):
            raise DeliveryError(f"channel {self.name!r}: {self.cfg.url_env} is not an http(s) URL", permanent=True)
        return url

    def send(self, n: Notification) -> SendResult:
        """Post ``n`` to the configured incoming webhook. Raises :class:`DeliveryError`."""
        url = self._url()
        try:
            text = slack_text(n)
        except RenderError as exc:
            raise DeliveryError(str(exc), permanent=True) from exc
        body = json.dumps({"text": text}, ensure_ascii=False).encode("utf-8")
        if self._client is None:
            self._client = guarded_httpx_client(self.network, timeout=httpx.Timeout(self.cfg.timeout_seconds),
                                                follow_redirects=False)
        # The URL itself is a secret: errors name the variable, never the URL.
        shown = f"${self.cfg.url_env}"
        try:
            # One deadline for the whole request: the client's read timeout restarts with every chunk,
            # so an answer dripped a byte at a time would hold the send (and its lease) indefinitely.
            with request_deadline(self.cfg.timeout_seconds):
                response = self._client.post(url, content=body, headers={"Content-Type": "application/json"})
        except OutboundRefused as exc:
            raise DeliveryError(f"channel {self.name!r} (slack {shown}): {exc}", permanent=True) from None
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ProxyError) as exc:
            raise DeliveryError(f"channel {self.name!r} (slack {shown}): {type(exc).__name__}",
                                permanent=False) from exc
        except httpx.TransportError as exc:
            raise DeliveryError(f"channel {self.name!r} (slack {shown}): no answer after sending, the message may "
                                f"have been posted: {type(exc).__name__}", permanent=False, outcome="unknown") from exc
        result = classify(self.name, shown, response.status_code, response.reason_phrase, response.headers,
                          response.text, None)
        refused = refusal_in_body(response.text)
        if refused is not None:
            # A 200 that posted nothing: marked delivered, the reminder would be a silent miss.
            raise DeliveryError(f"channel {self.name!r} (slack {shown}): HTTP {response.status_code} but the "
                                f"receiver refused the post: {refused!r} (is the URL an incoming webhook?)",
                                permanent=refused not in RETRYABLE_BODY_ERRORS)
        return result

    def close(self) -> None:
        """Close the HTTP client."""
        if self._client is not None:
            self._client.close()
            self._client = None
