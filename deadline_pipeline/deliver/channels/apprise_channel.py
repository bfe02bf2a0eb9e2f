"""Deliver alerts through the Apprise library to any of its services: Telegram, Discord, Microsoft
Teams, Matrix, Mattermost, ntfy, Pushover, PagerDuty, Opsgenie, SMS gateways, generic JSON/form/XML
webhooks and about a hundred more (https://github.com/caronc/apprise/wiki).

Configuration: the service URL lives in the environment variable ``url_env`` (Apprise URLs carry the
bot token or webhook secret in them); ``{target}`` in it is replaced by the subscriber's
``apprise_target`` (URL-quoted), e.g. ``tgram://123:ABC/{target}`` with a chat id per subscriber, or
``ntfys://ntfy.sh/{target}`` with a topic. A URL without ``{target}`` posts every alert to one place.
``cto`` / ``rto`` (Apprise's connect and read timeouts) are set to ``timeout_seconds`` unless the URL
gives them. They bound each connect and each read, not the send as a whole: Apprise's services call
``requests``, which has no total timeout and cannot be given one from outside, so a service answering
a byte at a time, each within ``rto``, holds the send past ``timeout_seconds`` (and the lease sized
for it) for as long as it drips - unlike the smtp, webhook, slack and caldav channels. The message is the
rendered subject as title and the plain-text body (which names the alert's reference, its dedup
key) as body.

A page to the on-call (an incident: the watchdog's, the paging sensor's, the sweep's notice of an
escalated alert) is told apart from a reminder by its title (``[incident triggered] <incident key>:
…`` / ``[incident resolved] …``), its body (the incident's key, severity, check, target, links) and
its notify type (``FAILURE`` triggered, ``SUCCESS`` resolved; reminders stay ``INFO``). For
``pagerduty://`` and ``opsgenie://`` URLs the incident key is put into the URL per page
(:func:`incident_service_url`), so a resolve finds what its trigger opened (``docs/paging.md``).

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

Outbound guard, as far as a library that opens its own connections allows. Apprise sends with
``requests``, which cannot be given the guarded transport, so before each send:

* the host(s) the service URL names are resolved and every address is checked against ``network``
  (:func:`connect_hosts`: the ``{host}`` of self-hosted services - ``json``/``form``/``xml``,
  ntfy on an own server, Gotify, Mattermost, Rocket.Chat, Matrix, Home Assistant, Signal, the
  Apprise API … - and the SMTP server of ``mailto``). A refused address is a permanent ``"failed"``
  naming the rule, and Apprise is not called; a host that does not resolve is a retryable
  ``"failed"`` (nothing was sent). Services whose host Apprise fixes (Telegram, Discord, Slack,
  Pushover, ntfy.sh …) connect to that public API host, which the URL cannot change: nothing to check;
* redirects are never followed: ``redirect=no`` is forced into the URL (Apprise 2.x follows 3xx by
  default, per URL or through ``AppriseAsset.http_redirects``), so the checked host is the only one.

What this does **not** give, unlike the other HTTP channels: the connection is not pinned to the
checked address. ``requests`` resolves the name again when it connects, so a name whose DNS answer
changes between the check and the connection (DNS rebinding) can still reach an address the guard
would refuse, and ``requests`` honours ``HTTP(S)_PROXY`` from the environment (the proxy is then
what connects). Where that matters, give Apprise literal IP addresses or use the webhook channel.

Secrets: the URL read from ``url_env`` is registered as a secret, and so are the parts of it that
hold the bot token or webhook key in the forms log lines print (:func:`register_url_secrets`), so no
log line or error can show them; messages name the variable, never the URL.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from deadline_pipeline.config import AppriseChannel
from deadline_pipeline.deliver.channels.base import IDEMPOTENCY_NOTIFICATION
from deadline_pipeline.deliver.notification import DeliveryError, Notification, SendResult
from deadline_pipeline.deliver.render import RenderError, render
from deadline_pipeline.security.outbound import DEFAULT_POLICY, NetworkPolicy, OutboundRefused, resolve_checked
from deadline_pipeline.security.redact import register_secret, secret_from_env

TARGET = "{target}"
LOG_CHARS = 1000


def with_send_options(url: str, seconds: float) -> str:
    """``url`` with Apprise's ``cto`` and ``rto`` query parameters set to ``seconds`` where absent,
    and ``redirect=no`` always (a redirect would reach a host the outbound guard never checked)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    for key in ("cto", "rto"):
        query.setdefault(key, f"{seconds:g}")
    query["redirect"] = "no"
    return urlunsplit(parts._replace(query=urlencode(query)))


def register_url_secrets(template: str) -> None:
    """Register as secrets the parts of an Apprise URL ``template`` (``{target}`` unfilled) that
    survive into what gets printed. Apprise's and requests' log lines show
    ``https://host/path/TOKEN/<target>``, not ``json://host/path/TOKEN/{target}``, and the token of
    ``tgram://TOKEN/{target}`` appears as ``…/botTOKEN/…``. So, for each literal part around
    ``{target}``: the part itself, its ``host/path`` when it has a path (the path holds the key),
    and its host field when that is no host name (a token in the host's place).

    Bounded by the template, not by the subscribers (every registered value is searched in every
    log line); a bare ``host:port/`` is not registered (a server's address is no secret, and
    masking it everywhere would garble unrelated messages). Never raises.
    """
    for literal in template.split(TARGET):
        # The remainder after {target} ("/x", "?format=text") holds no token in any Apprise URL form,
        # and masking such a fragment everywhere would garble unrelated messages.
        netloc, _, path = literal.partition("://")[2].partition("/")
        if not netloc:
            continue
        register_secret(literal)
        if path:
            register_secret(f"{netloc}/{path}")
        if not _is_host(netloc.rpartition("@")[2]):
            register_secret(netloc.rpartition("@")[2])


def _is_host(netloc: str) -> bool:
    """Whether ``netloc`` (no user info) reads as ``host[:port]`` with a numeric port."""
    try:
        parts = urlsplit("//" + netloc)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number (a token)
    except ValueError:
        return False
    return bool(parts.hostname) and re.fullmatch(r"[a-z0-9.\-:\[\]]+", parts.hostname) is not None


def connect_hosts(service) -> list[tuple[str, int]]:
    """``(host, port)`` of every server an Apprise service object (an entry of ``apprise.Apprise``)
    connects to that its URL names; ``[]`` when Apprise fixes the host itself (Telegram's
    api.telegram.org, Discord, Slack, Pushover, ntfy.sh in cloud mode, Matrix through t2bot).

    A service names its server when its URL templates have a ``{host}`` token; for e-mail the
    server is the SMTP host (``smtp=`` or the provider's, which Apprise fills in), not the address
    domain. ``port`` is the URL's, else 443/80 by ``secure`` (only used to resolve the name).
    """
    host = getattr(service, "smtp_host", None) or getattr(service, "host", None)
    if not host or "host" not in getattr(service, "template_tokens", {}):
        return []
    if getattr(service, "mode", None) == "t2bot":  # Matrix via webhooks.t2bot.io: the "host" is a token
        return []
    port = getattr(service, "port", None) or (443 if getattr(service, "secure", False) else 80)
    return [(str(host), int(port))]


def notify_type(n: Notification):
    """Apprise's notify type for ``n``: ``FAILURE`` for a triggered incident, ``SUCCESS`` for a
    resolved one (services show them as such, and Apprise's PagerDuty and Opsgenie services map them
    to trigger / resolve), ``INFO`` for everything else (a subscriber's reminder, as always)."""
    import apprise

    if n.incident is None:
        return apprise.NotifyType.INFO
    return apprise.NotifyType.SUCCESS if n.incident.status == "resolved" else apprise.NotifyType.FAILURE


def incident_service_url(url: str, incident) -> str:
    """``url`` with the parameters that make a paging service group a page by its incident key:

    * ``pagerduty://``: ``dedup=<incident key>`` and ``action=trigger|resolve`` (set, whatever the
      URL said: otherwise Apprise keys an incident by the first line of the message, which differs
      between trigger and resolve), and ``severity`` unless the URL gives one;
    * ``opsgenie://``: ``alias=<incident key>`` (Opsgenie de-duplicates open alerts by alias);
    * any other service: unchanged.

    ``incident``: a :class:`~deadline_pipeline.deliver.incident.Incident`.
    """
    scheme = url.partition("://")[0].lower()
    if scheme not in ("pagerduty", "opsgenie"):
        return url
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    if scheme == "pagerduty":
        query["dedup"] = incident.key
        query["action"] = "resolve" if incident.status == "resolved" else "trigger"
        query.setdefault("severity", incident.severity)
    else:
        query["alias"] = incident.key
    return urlunsplit(parts._replace(query=urlencode(query)))


class AppriseSender:
    """Channel sending through Apprise (see the module docstring). ``send`` raises :class:`DeliveryError`."""

    idempotency_class = IDEMPOTENCY_NOTIFICATION

    def __init__(self, name: str, cfg: AppriseChannel, network: NetworkPolicy | None = None) -> None:
        self.name = name
        self.cfg = cfg
        # Checked before each send (see the module docstring: not pinned during Apprise's own connection).
        self.network = network or DEFAULT_POLICY

    def service_url(self, n: Notification) -> str:
        """The Apprise URL for ``n``'s subscriber. Raises :class:`DeliveryError` (permanent) for an unset
        variable or a ``{target}`` the subscriber has no value for. The URL is a secret: messages name
        the variable only."""
        url = secret_from_env(self.cfg.url_env)
        if not url:
            raise DeliveryError(f"channel {self.name!r}: environment variable {self.cfg.url_env} (named in the "
                                "configuration as url_env) is not set", permanent=True)
        register_url_secrets(url)
        shared = TARGET not in url
        if not shared:
            if not n.apprise_target:
                raise DeliveryError(f"channel {self.name!r}: ${self.cfg.url_env} needs {TARGET} and subscriber "
                                    f"{n.subscriber_id} has no apprise_target", permanent=True)
            url = url.replace(TARGET, quote(n.apprise_target, safe="@+-_.~"))
        if n.incident is not None:
            url = incident_service_url(url, n.incident)
        url = with_send_options(url, self.cfg.timeout_seconds)
        if shared:
            # One URL for every alert (one per incident for a page): registering the filled-in form
            # stays bounded (not per subscriber).
            register_secret(url)
        return url

    def _check_network(self, service, shown: str) -> None:
        """Resolve and check every host ``service`` names (:func:`connect_hosts`) against the
        outbound policy. Raises :class:`DeliveryError`: permanent when an address is refused,
        retryable ``"failed"`` when a name does not resolve (nothing was sent either way)."""
        for host, port in connect_hosts(service):
            try:
                resolve_checked(host, port, self.network)
            except OutboundRefused as exc:
                raise DeliveryError(f"channel {self.name!r} (apprise {service.service_name} {shown}): not sent: {exc}",
                                    permanent=True) from None
            except OSError as exc:
                raise DeliveryError(f"channel {self.name!r} (apprise {service.service_name} {shown}): not sent: "
                                    f"cannot resolve {host!r}: {exc}", permanent=False) from None

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
        # In memory: Apprise's default persistent store would write cache files under $HOME. No
        # redirects (also forced per URL): a 3xx would lead to a host the guard never checked.
        app = apprise.Apprise(asset=apprise.AppriseAsset(storage_mode="memory", http_redirects=False))
        if not app.add(url):
            raise DeliveryError(f"channel {self.name!r}: {shown} is not a URL Apprise supports", permanent=True)
        for entry in app:
            self._check_network(entry, shown)
        service = next(iter(app)).service_name
        with apprise.LogCapture(level=logging.WARNING, fmt="%(levelname)s %(message)s") as logs:
            result = app.notify(title=message.subject, body=message.text.strip(),
                                body_format=apprise.NotifyFormat.TEXT, notify_type=notify_type(n))
            detail = " ".join(logs.getvalue().split())[-LOG_CHARS:]
        if result:
            return SendResult(f"apprise {service}")
        raise DeliveryError(f"channel {self.name!r} (apprise {service} {shown}): the service reported a failure; "
                            f"it may have been posted (Apprise does not tell): {detail or 'no detail logged'}",
                            permanent=False, outcome="unknown")

    def close(self) -> None:
        """Nothing to release: each send builds its own Apprise object."""
