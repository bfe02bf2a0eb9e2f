"""Deliver alerts through the Apprise library to any of its services: Telegram, Discord, Microsoft
Teams, Matrix, Mattermost, ntfy, Pushover, PagerDuty, Opsgenie, SMS gateways, generic JSON/form/XML
webhooks and about a hundred more (https://github.com/caronc/apprise/wiki).

Configuration: the service URL lives in the environment variable ``url_env`` (Apprise URLs carry the
bot token or webhook secret in them); ``{target}`` in it is replaced by the subscriber's
``apprise_target`` (URL-quoted), e.g. ``tgram://123:ABC/{target}`` with a chat id per subscriber, or
``ntfys://ntfy.sh/{target}`` with a topic. A URL without ``{target}`` posts every alert to one place.
``cto`` / ``rto`` (Apprise's connect and read timeouts) are set to ``timeout_seconds`` unless the URL
gives them. The message is the rendered subject as title and the plain-text body (which names the
alert's reference, its dedup key) as body.

Idempotency class ``"notification"``: a resend posts a second message carrying the same reference.

Honest classification. Apprise reports per service only success or failure (plus a whole-call
timeout); it does not say whether a failed request reached the service. So:

* success → sent (``provider_message_id`` = ``"apprise <service name>"``);
* an invalid or unsupported URL, a ``{target}`` with no subscriber target, an unset variable →
  permanent ``"failed"`` (escalated at once: the same send would fail again);
* any other failure → retryable ``"unknown"``, retried with the sweep's backoff. It is ``unknown``,
  not ``failed``, because for every HTTP-based service (json/form/xml, Discord, Slack, Mattermost,
  Teams, Telegram, ntfy, Pushover, PagerDuty, Opsgenie, Matrix …) a read timeout or a 5xx after the
  request was sent is reported the same way as a refused connection, and for ``mailto://`` a
  dropped connection after DATA likewise: the message may have been posted, and a retry may post it
  twice. Apprise's log lines for the call are kept in the error message for the operator.
"""

from __future__ import annotations

import logging
import os
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from deadline_pipeline.config import AppriseChannel
from deadline_pipeline.deliver.channels.base import IDEMPOTENCY_NOTIFICATION
from deadline_pipeline.deliver.notification import DeliveryError, Notification, SendResult
from deadline_pipeline.deliver.render import RenderError, render

TARGET = "{target}"
LOG_CHARS = 1000


def with_timeouts(url: str, seconds: float) -> str:
    """``url`` with Apprise's ``cto`` and ``rto`` query parameters set to ``seconds`` where absent."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    for key in ("cto", "rto"):
        query.setdefault(key, f"{seconds:g}")
    return urlunsplit(parts._replace(query=urlencode(query)))


class AppriseSender:
    """Channel sending through Apprise (see the module docstring). ``send`` raises :class:`DeliveryError`."""

    idempotency_class = IDEMPOTENCY_NOTIFICATION

    def __init__(self, name: str, cfg: AppriseChannel) -> None:
        self.name = name
        self.cfg = cfg

    def service_url(self, n: Notification) -> str:
        """The Apprise URL for ``n``'s subscriber. Raises :class:`DeliveryError` (permanent) for an unset
        variable or a ``{target}`` the subscriber has no value for. The URL is a secret: messages name
        the variable only."""
        url = os.environ.get(self.cfg.url_env)
        if not url:
            raise DeliveryError(f"channel {self.name!r}: environment variable {self.cfg.url_env} (named in the "
                                "configuration as url_env) is not set", permanent=True)
        if TARGET in url:
            if not n.apprise_target:
                raise DeliveryError(f"channel {self.name!r}: ${self.cfg.url_env} needs {TARGET} and subscriber "
                                    f"{n.subscriber_id} has no apprise_target", permanent=True)
            url = url.replace(TARGET, quote(n.apprise_target, safe="@+-_.~"))
        return with_timeouts(url, self.cfg.timeout_seconds)

    def send(self, n: Notification) -> SendResult:
        """Send ``n`` to the subscriber's Apprise service. Raises :class:`DeliveryError`."""
        try:
            import apprise
        except ImportError as exc:  # an optional extra: say how to get it
            raise DeliveryError(f"channel {self.name!r}: the apprise library is not installed "
                                "(pip install 'deadline_pipeline[apprise]')", permanent=True) from exc
        url = self.service_url(n)
        try:
            message = render(n)
        except RenderError as exc:
            raise DeliveryError(str(exc), permanent=True) from exc
        shown = f"${self.cfg.url_env}"
        # In memory: Apprise's default persistent store would write cache files under $HOME.
        app = apprise.Apprise(asset=apprise.AppriseAsset(storage_mode="memory"))
        if not app.add(url):
            raise DeliveryError(f"channel {self.name!r}: {shown} is not a URL Apprise supports", permanent=True)
        service = next(iter(app)).service_name
        with apprise.LogCapture(level=logging.WARNING, fmt="%(levelname)s %(message)s") as logs:
            result = app.notify(title=message.subject, body=message.text.strip(),
                                body_format=apprise.NotifyFormat.TEXT)
            detail = " ".join(logs.getvalue().split())[-LOG_CHARS:]
        if result:
            return SendResult(f"apprise {service}")
        raise DeliveryError(f"channel {self.name!r} (apprise {service} {shown}): the service reported a failure; "
                            f"it may have been posted (Apprise does not tell): {detail or 'no detail logged'}",
                            permanent=False, outcome="unknown")

    def close(self) -> None:
        """Nothing to release: each send builds its own Apprise object."""
