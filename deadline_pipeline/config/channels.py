"""The ``channels:`` section: one model per channel type, told apart by ``type``."""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlparse

from pydantic import Field, field_validator, model_validator

from deadline_pipeline.config.base import Section
from deadline_pipeline.config.quantities import (
    LeaseMarginSeconds,
    MaxConcurrency,
    Port,
    RatePerSecond,
    Switch,
    TimeoutSeconds,
)
from deadline_pipeline.config.text import SenderAddress


class _ChannelLimits(Section):
    # Per sweep process: at most ``max_concurrency`` sends in flight and ``rate_per_second`` sends
    # started per second (None = unlimited), so a backlog after downtime cannot flood a provider.
    max_concurrency: MaxConcurrency = 8
    rate_per_second: RatePerSecond | None = None
    # Seconds of lease kept free after a send's timeout: a send starts only while timeout_seconds +
    # lease_margin_seconds of the batch's lease remain, so no second sweep can claim the alert while
    # its send may still be in flight. Per channel: a slow provider may need more slack.
    lease_margin_seconds: LeaseMarginSeconds = 5.0


class _MailHeaders(Section):
    """Headers of the e-mail channels (smtp, maildir).

    ``message_id_domain``: the domain of each Message-ID (default: the sender's domain, RFC 5322
    §3.6.4). ``unsubscribe_url`` (https; adds RFC 8058 one-click) and/or ``unsubscribe_mailto``: the
    ``List-Unsubscribe`` header (RFC 2369); absent = no header.
    """

    message_id_domain: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]*[A-Za-z0-9]$",
                                            max_length=253)] | None = None
    unsubscribe_url: Annotated[str, Field(pattern=r"^https?://[^\s<>]+$")] | None = None
    unsubscribe_mailto: Annotated[str, Field(pattern=r"^(mailto:)?[^\s<>@]+@[^\s<>@]+$")] | None = None


class MaildirChannel(_ChannelLimits, _MailHeaders):
    type: Literal["maildir"]
    path: str
    sender: SenderAddress = "deadline-pipeline@localhost"
    # One local folder: parallel writers gain nothing.
    max_concurrency: MaxConcurrency = 1


class SmtpChannel(_ChannelLimits, _MailHeaders):
    type: Literal["smtp"]
    host: str = "127.0.0.1"
    port: Port = 25
    sender: SenderAddress = "deadline-pipeline@localhost"
    starttls: Switch = False
    ssl: Switch = False
    # Names of environment variables holding credentials; the secrets never live in this file.
    username_env: str | None = None
    password_env: str | None = None
    timeout_seconds: TimeoutSeconds = 30.0
    # The server offers SMTPUTF8 (RFC 6531), so recipients with a non-ASCII local part are accepted
    # at load; every session still checks the EHLO reply before sending to one.
    smtputf8: Switch = False


class WebhookChannel(_ChannelLimits):
    type: Literal["webhook"]
    timeout_seconds: TimeoutSeconds = 10.0
    # The JSON body: the Standard Webhooks envelope {type, timestamp, data}, or "legacy" — the flat
    # body of earlier releases, for receivers written against it. "pagerduty" (a PagerDuty Events
    # API v2 event) and "alertmanager" (Alertmanager's POST /api/v2/alerts body) carry pages only: a
    # channel with them serves escalation.channels, never a subscription (docs/paging.md).
    body: Literal["standard-webhooks", "legacy", "pagerduty", "alertmanager"] = "standard-webhooks"
    # Standard Webhooks signing secret (``whsec_<base64>`` or raw text), read from this variable.
    secret_env: str | None = None
    # body: pagerduty: the variable holding the Events API v2 routing (integration) key.
    routing_key_env: str | None = None
    max_concurrency: MaxConcurrency = 64

    @model_validator(mode="after")
    def _routing_key(self) -> WebhookChannel:
        # PagerDuty refuses an event without its routing key (HTTP 400): every page would fail.
        if self.body == "pagerduty" and self.routing_key_env is None:
            raise ValueError("body 'pagerduty' needs routing_key_env (the variable holding the Events API v2 "
                             "integration key)")
        if self.routing_key_env is not None and self.body != "pagerduty":
            raise ValueError(f"routing_key_env is used by body 'pagerduty' only, not {self.body!r}")
        return self


class SlackChannel(_ChannelLimits):
    """A Slack-compatible incoming webhook; the URL is a secret, so only its variable is named here."""

    type: Literal["slack"]
    url_env: str
    timeout_seconds: TimeoutSeconds = 10.0
    # Slack documents about one message per second per incoming webhook.
    max_concurrency: MaxConcurrency = 1
    rate_per_second: RatePerSecond | None = 1.0


class CaldavChannel(_ChannelLimits):
    """Books alerts as events in a CalDAV calendar (idempotency class ``booking``).

    ``url_template``: the calendar collection URL for subscribers without their own ``caldav_url``;
    ``{subscriber}`` is replaced by the subscriber id (URL-quoted); without it every subscriber shares
    one calendar. ``username_env`` / ``password_env``: variables holding HTTP Basic credentials.
    ``book``: ``reminder`` = one event per reminder, ``obligation`` = one event per deadline (the
    first reminder books it, later ones find it booked). ``cancel``: ``status`` = keep the event with
    ``STATUS:CANCELLED``, ``delete`` = remove it.
    """

    type: Literal["caldav"]
    url_template: str | None = None
    username_env: str | None = None
    password_env: str | None = None
    book: Literal["reminder", "obligation"] = "reminder"
    cancel: Literal["status", "delete"] = "status"
    timeout_seconds: TimeoutSeconds = 10.0
    max_concurrency: MaxConcurrency = 4

    @field_validator("url_template")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None and urlparse(v.replace("{subscriber}", "x")).scheme not in ("http", "https"):
            raise ValueError(f"{v!r} is not an http(s) URL template")
        return v


class AppriseChannel(_ChannelLimits):
    """Sends through the Apprise library to any of its services (chat, push, SMS, paging).

    ``url_env``: the variable holding the Apprise service URL (``tgram://TOKEN/{target}``,
    ``ntfys://ntfy.sh/{target}``, ``json://host/path``); it usually embeds a token, so it never lives
    in this file. ``{target}`` in it is replaced by the subscriber's ``apprise_target``.
    ``timeout_seconds``: Apprise's connect and read timeouts (``cto`` / ``rto``) unless the URL sets them.
    """

    type: Literal["apprise"]
    url_env: str
    timeout_seconds: TimeoutSeconds = 10.0
    max_concurrency: MaxConcurrency = 4


ChannelConfig = Annotated[MaildirChannel | SmtpChannel | WebhookChannel | SlackChannel | CaldavChannel | AppriseChannel,
                          Field(discriminator="type")]
