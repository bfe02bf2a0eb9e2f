"""The user's configuration: one YAML file validated with pydantic.

The file is ``deadlines.yaml`` in the working directory, or ``--config FILE`` / ``$DEADLINE_CONFIG``.
Relative paths inside it (source locations, ``subscribers_csv``) are read relative to the file's own
folder; ``${DEADLINE_HOME}`` and other environment variables are expanded in paths.

Every problem is reported as :class:`ConfigError` naming the file, the key path and what was
expected, never as a traceback from inside pydantic or YAML.
"""

from __future__ import annotations

import logging
import os
import re
import unicodedata
from datetime import time, timedelta
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlparse

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from deadline_pipeline import config_ranges
from deadline_pipeline.durations import parse_duration
from deadline_pipeline.timezones import UnknownTimeZone, resolve_zone

log = logging.getLogger(__name__)

DEFAULT_CONFIG_NAME = "deadlines.yaml"
SOURCE_FORMATS = ("ai-deadlines", "ics", "csv", "govuk-bank-holidays")

class ConfigError(Exception):
    """A configuration file that cannot be used; the message names file, key path and problem.

    The message is redacted (:func:`~deadline_pipeline.security.redact.redact`): it may echo a
    rejected value, such as a URL with a password or a token.
    """

    def __init__(self, message: str) -> None:
        from deadline_pipeline.security.redact import redact

        super().__init__(redact(message))


def parse_quiet_hours(text: str) -> tuple[time, time]:
    """``"22:00-07:00"`` → ``(time(22, 0), time(7, 0))``; local wall times, start ≠ end.
    Raises ``ValueError`` naming the text."""
    m = re.fullmatch(r"\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*", text or "")
    try:
        if not m:
            raise ValueError
        start, end = time(int(m[1]), int(m[2])), time(int(m[3]), int(m[4]))
    except ValueError:
        raise ValueError(f"quiet hours {text!r}: expected 'HH:MM-HH:MM', e.g. '22:00-07:00'") from None
    if start == end:
        raise ValueError(f"quiet hours {text!r}: start and end are equal")
    return start, end


def _check_zone(value: str) -> str:
    try:
        resolve_zone(value)
    except UnknownTimeZone as exc:
        raise ValueError(str(exc)) from None
    return value


# Characters that show as nothing, so that "ann" and "\ufeffann" look the same and are different ids,
# tenants or addresses: U+FEFF (a byte order mark; two CSV files saved with one and concatenated put
# it at the start of a row, inside that subscriber's id), the zero-width space, non-joiner and joiner
# (U+200B-U+200D) and the word joiner (U+2060). Every field checked here is matched as exact text
# (a subscription names subscribers and channels by it, planning compares tenants), none is prose,
# so even the joiners some scripts and emoji sequences use are refused rather than let two names
# that look alike differ.
_INVISIBLE = {"\ufeff": "a byte order mark", "\u200b": "a zero-width space", "\u200c": "a zero-width non-joiner",
              "\u200d": "a zero-width joiner", "\u2060": "a word joiner"}


def _one_line_of_text(value: str, what: str = "a value") -> str:
    """``value`` unchanged when it holds no control character (Unicode category ``Cc``: NUL, ESC, CR,
    LF, DEL, C1), no line or paragraph separator and no invisible character (:data:`_INVISIBLE`).
    Raises ``ValueError`` naming the first one as ``U+XXXX`` (an invisible one with its position in
    ``value``, counted from 1).
    A subscriber's fields end up in mail headers, request URLs, SQL text and report lines:
    PostgreSQL refuses NUL, so one subscriber's ``"t1\\0"`` once failed planning for every
    subscriber there, and an address with a BEL in it passed loading only to be escalated at every send."""
    for at, c in enumerate(value, start=1):
        if unicodedata.category(c) in ("Cc", "Zl", "Zp"):
            found = f"the control character U+{ord(c):04X}"
        elif c in _INVISIBLE:  # its place said too: the value looks the same with it or without it
            found = f"the invisible character U+{ord(c):04X} ({_INVISIBLE[c]}) at character {at}"
        else:
            continue
        raise ValueError(f"{value!r} contains {found}; {what} is one line of printable text")
    return value


# A name or address that ends up in a mail header, a log line or a report: one line of printable text.
# A sender with a CR/LF in it loaded and then failed every send of its channel (the e-mail library
# refuses a header with a line break), a subscription or channel name with an escape sequence printed
# it into every report line.
_ONE_LINE_NAME = AfterValidator(lambda v: _one_line_of_text(v, "a name"))
SenderAddress = Annotated[str, AfterValidator(lambda v: _one_line_of_text(v, "a sender address"))]


def _refuse_legacy_ipv4(url: str) -> None:
    """Raise ``ValueError`` when ``url``'s host is an IPv4 address in a legacy ``inet_aton`` spelling
    (``2130706433``, ``127.1``, ``0x7f.1``, ``0177.0.0.1``).

    Such a host passed loading and was refused at send time, escalating every reminder to that
    subscriber; HTTP clients and the outbound guard read these spellings differently, so the only
    safe reading is none: the dotted-quad form is required, and the error gives it.
    """
    import ipaddress

    from deadline_pipeline.security.outbound import literal_address

    try:
        host = urlparse(url).hostname
    except ValueError:
        return  # an unparseable URL: refused with its own message at send time
    if not host or host.startswith("["):
        return
    try:
        ipaddress.ip_address(host)
        return  # canonical
    except ValueError:
        pass
    meant = literal_address(host)
    if meant is not None:
        raise ValueError(f"host {host!r} is a legacy spelling of the IPv4 address {meant}; write the address "
                         f"as {meant}")


def _not_a_boolean(value):
    # YAML's `true` is a number to pydantic (1): `batch_size: true` was read as batches of one alert
    # and `timeout_seconds: true` as a one-second timeout, without a word. (Not strict mode: PyYAML
    # reads `1e-3` as a string, which must still be taken as a number.)
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got the boolean {str(value).lower()}")
    return value


NOT_A_BOOLEAN = BeforeValidator(_not_a_boolean)
Number = Annotated[float, NOT_A_BOOLEAN]


class _Model(BaseModel):
    # A misspelt key is an error, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid", frozen=True)


class BusinessDaysConfig(_Model):
    """Roll each due date of a source off non-business days.

    ``calendar``: a holiday calendar spec of the ``holidays`` library (``US``, ``GB-ENG``, ``US-IRS`` =
    US federal holidays plus DC legal holidays, the rule of IRC §7503) or ``source:NAME[/DIVISION]``
    for an ingested holiday source (e.g. ``source:uk-holidays/england-and-wales``).
    ``convention``: following | modified-following | preceding | none.
    """

    calendar: str
    convention: Literal["following", "modified-following", "preceding", "none"] = "following"

    @field_validator("calendar")
    @classmethod
    def _calendar(cls, v: str) -> str:
        # A misspelt calendar would silently leave due dates unrolled: refuse it here.
        if not v.startswith("source:"):
            from deadline_pipeline.holiday_calendars import library_calendar

            try:
                library_calendar(v)
            except ValueError as exc:
                raise ValueError(str(exc)) from None
        return v


class SourceConfig(_Model):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", max_length=100)]
    format: Literal["ai-deadlines", "ics", "csv", "govuk-bank-holidays"]
    location: str
    # A Dagster tag value (the source's assets carry it): any other text passed loading and then
    # stopped every command with DagsterInvalidDefinitionError, naming neither file nor key.
    tenant: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=63)] = "default"
    freshness: str = "P1D"
    timezone: str | None = None  # zone for floating times in the source, when it names none
    business_days: BusinessDaysConfig | None = None
    # Credentials live in the environment, named here; the location itself carries none (it is
    # stored and shown). username_env + password_env: HTTP Basic; token_env: a bearer token;
    # headers_env: header name -> variable holding its value (e.g. X-Api-Key).
    username_env: str | None = None
    password_env: str | None = None
    token_env: str | None = None
    headers_env: dict[str, str] = {}

    @field_validator("location")
    @classmethod
    def _location(cls, v: str) -> str:
        parts = urlparse(v)
        scheme = parts.scheme
        # One letter is a Windows drive ("C:\\…"), not a scheme.
        if len(scheme) > 1 and scheme not in ("http", "https", "file"):
            from deadline_pipeline.security.redact import redact_url

            raise ValueError(f"location {redact_url(v)!r}: scheme {scheme!r} is not supported; use a path, "
                             "file://, http(s)://")
        if len(scheme) > 1 and "@" in parts.netloc:
            # A password in the location would be stored in the sources table and shown in the UI.
            raise ValueError("location: a user name or password in the URL is not accepted; name the "
                             "environment variables holding them in username_env / password_env")
        return v

    @model_validator(mode="after")
    def _credentials(self) -> SourceConfig:
        if (self.username_env is None) != (self.password_env is None):
            raise ValueError("username_env and password_env go together (HTTP Basic needs both)")
        if self.token_env and self.username_env:
            raise ValueError("token_env and username_env/password_env exclude each other")
        return self

    @field_validator("freshness")
    @classmethod
    def _freshness(cls, v: str) -> str:
        if parse_duration(v, examples="'P1D', 'PT6H' or 'P7D'") <= timedelta(0):
            raise ValueError(f"freshness {v!r} must be a positive duration such as 'P1D'")
        return v

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str | None) -> str | None:
        return None if v is None else _check_zone(v)

    @property
    def freshness_window(self) -> timedelta:
        return parse_duration(self.freshness)

    @property
    def is_url(self) -> bool:
        return urlparse(self.location).scheme in ("http", "https")


class SubscriberConfig(_Model):
    id: Annotated[str, Field(min_length=1, max_length=200)]
    # At most the store's column (200): a longer tenant passed loading and then failed the one
    # transaction that stores every subscriber, so PostgreSQL planned nobody.
    tenant: Annotated[str, Field(max_length=200)] = "default"
    email: str | None = None
    webhook_url: str | None = None
    timezone: str = "UTC"
    # "HH:MM-HH:MM" in the subscriber's zone; a window may wrap midnight ("22:00-07:00").
    quiet_hours: str | None = None
    # The subscriber's CalDAV calendar collection (caldav channel); overrides the channel's url_template.
    caldav_url: str | None = None
    # Fills "{target}" in an apprise channel's service URL (a chat id, a topic, a user key); not a secret.
    apprise_target: Annotated[str, Field(min_length=1, max_length=500)] | None = None

    @field_validator("id", "tenant", "email", "webhook_url", "caldav_url", "apprise_target")
    @classmethod
    def _one_line(cls, v: str | None, info: ValidationInfo) -> str | None:
        # A CSV value in quotes may hold a newline: "car\nl" was accepted as an id that no
        # `subscribers: [...]` list can name and that splits every report line it is printed on.
        # (quiet_hours and timezone have their own grammar, which refuses these characters.)
        what = {"id": "an id", "email": "an email address", "apprise_target": "an apprise_target"}.get(
            info.field_name, f"a {info.field_name}")
        return None if v is None else _one_line_of_text(v, what)

    @field_validator("quiet_hours")
    @classmethod
    def _quiet(cls, v: str | None) -> str | None:
        if v is not None:
            parse_quiet_hours(v)
        return v

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        return _check_zone(v)

    @field_validator("email")
    @classmethod
    def _email(cls, v: str | None) -> str | None:
        # A CR/LF in an address would let a data file add mail headers.
        if v is not None and (not re.fullmatch(r"[^@\s]+@[^@\s]+", v)):
            raise ValueError(f"{v!r} is not an email address")
        return v

    @field_validator("webhook_url", "caldav_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and urlparse(v).scheme not in ("http", "https"):
            raise ValueError(f"{v!r} is not an http(s) URL")
        if v is not None:
            _refuse_legacy_ipv4(v)
        return v


class SubscriptionConfig(_Model):
    # At most the store's column (200); longer failed the transaction storing every subscription.
    name: Annotated[str, Field(max_length=200), _ONE_LINE_NAME]
    subscribers: list[str] = ["*"]  # subscriber ids, or "*" for every subscriber of the source's tenant
    sources: list[str]
    rules: list[str] = ["*"]  # fnmatch patterns on rule ids
    offsets: Annotated[list[str], Field(min_length=1)] = ["-P1D"]
    channels: Annotated[list[str], Field(min_length=1)]
    # Reminders already past at planning time: send only the most recent at once, or skip them all.
    late_policy: Literal["send_latest", "skip"] = "send_latest"
    # Rule kinds to include (None = every kind) or exclude: a rule's kind (deadline, event, todo) or
    # its source's deadline type (ai-deadlines: abstract, paper, submission, notification, …). A
    # conference's "notification" date is not a task for its authors.
    kinds: Annotated[list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]], Field(min_length=1)] | None = None
    exclude_kinds: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]] = []

    @field_validator("subscribers", "rules")
    @classmethod
    def _not_empty(cls, v: list[str], info: ValidationInfo) -> list[str]:
        # An empty list subscribes nobody / to no rule: the subscription would plan nothing, silently.
        if not v:
            every = "subscriber of the source's tenant" if info.field_name == "subscribers" else "rule"
            raise ValueError(f"an empty list plans nothing; omit `{info.field_name}` for every {every} "
                             "(['*']), or list what to plan")
        return v

    @field_validator("offsets")
    @classmethod
    def _offsets(cls, v: list[str]) -> list[str]:
        for item in v:
            if parse_duration(item) > timedelta(0):
                raise ValueError(f"offset {item!r} is after the deadline; reminders use '-P…' or 'PT0S'")
        if len(set(v)) != len(v):
            raise ValueError("offsets repeat a value")
        # A reminder is identified by its offset's nominal length (a day = 86,400 s): '-P7D', '-P1W'
        # and '-PT168H' are one reminder to the store, so two of them would collide on one identity.
        seen: dict[int, str] = {}
        for item in v:
            length = int(parse_duration(item).total_seconds())
            if length in seen:
                raise ValueError(f"offsets {seen[length]!r} and {item!r} have the same length; a subscription "
                                 "reminds once per length, give one of them")
            seen[length] = item
        return v


class _ChannelLimits(_Model):
    # Per sweep process: at most ``max_concurrency`` sends in flight and ``rate_per_second`` sends
    # started per second (None = unlimited), so a backlog after downtime cannot flood a provider.
    max_concurrency: Annotated[int, NOT_A_BOOLEAN, Field(gt=0, le=1024)] = 8
    rate_per_second: Annotated[float, NOT_A_BOOLEAN, Field(gt=0)] | None = None
    # Seconds of lease kept free after a send's timeout: a send starts only while timeout_seconds +
    # lease_margin_seconds of the batch's lease remain, so no second sweep can claim the alert while
    # its send may still be in flight. Per channel: a slow provider may need more slack.
    lease_margin_seconds: Number = 5.0


class _MailHeaders(_Model):
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
    max_concurrency: Annotated[int, NOT_A_BOOLEAN, Field(gt=0, le=1024)] = 1


class SmtpChannel(_ChannelLimits, _MailHeaders):
    type: Literal["smtp"]
    host: str = "127.0.0.1"
    port: Annotated[int, NOT_A_BOOLEAN] = 25
    sender: SenderAddress = "deadline-pipeline@localhost"
    starttls: bool = False
    ssl: bool = False
    # Names of environment variables holding credentials; the secrets never live in this file.
    username_env: str | None = None
    password_env: str | None = None
    timeout_seconds: Number = 30.0
    # The server offers SMTPUTF8 (RFC 6531), so recipients with a non-ASCII local part are accepted
    # at load; every session still checks the EHLO reply before sending to one.
    smtputf8: bool = False


class WebhookChannel(_ChannelLimits):
    type: Literal["webhook"]
    timeout_seconds: Number = 10.0
    # The JSON body: the Standard Webhooks envelope {type, timestamp, data}, or "legacy" — the flat
    # body of earlier releases, for receivers written against it. "pagerduty" (a PagerDuty Events
    # API v2 event) and "alertmanager" (Alertmanager's POST /api/v2/alerts body) carry pages only: a
    # channel with them serves escalation.channels, never a subscription (docs/paging.md).
    body: Literal["standard-webhooks", "legacy", "pagerduty", "alertmanager"] = "standard-webhooks"
    # Standard Webhooks signing secret (``whsec_<base64>`` or raw text), read from this variable.
    secret_env: str | None = None
    # body: pagerduty: the variable holding the Events API v2 routing (integration) key.
    routing_key_env: str | None = None
    max_concurrency: Annotated[int, NOT_A_BOOLEAN, Field(gt=0, le=1024)] = 64

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
    timeout_seconds: Number = 10.0
    # Slack documents about one message per second per incoming webhook.
    max_concurrency: Annotated[int, NOT_A_BOOLEAN, Field(gt=0, le=1024)] = 1
    rate_per_second: Annotated[float, NOT_A_BOOLEAN, Field(gt=0)] | None = 1.0


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
    timeout_seconds: Annotated[float, NOT_A_BOOLEAN, Field(gt=0)] = 10.0
    max_concurrency: Annotated[int, NOT_A_BOOLEAN, Field(gt=0, le=1024)] = 4

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
    timeout_seconds: Annotated[float, NOT_A_BOOLEAN, Field(gt=0)] = 10.0
    max_concurrency: Annotated[int, NOT_A_BOOLEAN, Field(gt=0, le=1024)] = 4


ChannelConfig = Annotated[MaildirChannel | SmtpChannel | WebhookChannel | SlackChannel | CaldavChannel | AppriseChannel,
                          Field(discriminator="type")]


class EscalationConfig(_Model):
    """Where an escalated alert is announced: ``channels`` by name, with the recipient the channel
    needs (``email`` for smtp/maildir, ``webhook_url`` for webhook, ``apprise_target`` for an apprise
    URL with ``{target}``; slack needs none)."""

    channels: list[str] = []
    email: str | None = None
    webhook_url: str | None = None
    apprise_target: str | None = None
    # The paging sensor and the watchdog remind about an incident still open after this long.
    reminder_minutes: Annotated[int, NOT_A_BOOLEAN, Field(gt=0)] = 60
    # The Dagster UI's base URL (http://dagster.internal:3000): pages link to the failed check or
    # run there. Unset: they carry the UI's route (/assets/alerts?view=checks) without a host.
    dagster_ui_url: str | None = None

    @field_validator("email", "webhook_url", "apprise_target")
    @classmethod
    def _one_line(cls, v: str | None, info: ValidationInfo) -> str | None:
        # As a subscriber's: a control character in the operator's address would fail the very
        # notice that reports a reminder as not delivered.
        return None if v is None else _one_line_of_text(v, f"escalation.{info.field_name}")

    @field_validator("dagster_ui_url")
    @classmethod
    def _ui_url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        _one_line_of_text(v, "escalation.dagster_ui_url")
        parts = urlparse(v)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
            raise ValueError(f"{v!r} is not an http(s) base URL (e.g. http://dagster.internal:3000)")
        return v.rstrip("/")


class DeliveryConfig(_Model):
    batch_size: Annotated[int, NOT_A_BOOLEAN, Field(gt=0, le=10_000)] = 500
    lease_seconds: Annotated[int, NOT_A_BOOLEAN, Field(gt=0)] = 300
    max_attempts: Annotated[int, NOT_A_BOOLEAN, Field(gt=0)] = 5
    backoff_base_seconds: Annotated[float, NOT_A_BOOLEAN, Field(gt=0)] = 30.0
    backoff_cap_seconds: Annotated[float, NOT_A_BOOLEAN, Field(gt=0)] = 3600.0
    time_budget_seconds: Annotated[float, NOT_A_BOOLEAN, Field(gt=0)] = 240.0
    # Longest wait a receiver's Retry-After may impose, in seconds (default: backoff_cap_seconds); a
    # "Retry-After: <a date in 9999>" would otherwise park an alert until then, never escalated.
    retry_after_cap_seconds: Number | None = None
    # Processes one sweep runs in (PostgreSQL; see deliver/workers.py): the sweep is CPU-bound in one
    # interpreter, so on an n-core host up to n processes add throughput. Each claims its own batches.
    # Strict: `true` or the string "2" is refused, not read as a number of processes.
    processes: Annotated[int, Field(ge=1, le=32, strict=True)] = 1
    # The sweep's event loop. uvloop runs the same sweep with about a third less CPU per alert
    # (benchmarks/deliver.py): the sweep wakes futures, tasks and thread callbacks for every alert.
    # "asyncio" is the standard library's loop, for a platform without uvloop or to rule it out.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"

    @property
    def retry_after_cap(self) -> float:
        """The effective Retry-After cap in seconds."""
        return self.retry_after_cap_seconds if self.retry_after_cap_seconds is not None else self.backoff_cap_seconds


class WatchConfig(_Model):
    grace_minutes: Annotated[int, NOT_A_BOOLEAN, Field(ge=0)] = 30
    # How often the delivery sensor ticks / the sweep runs, and how often ingest + plan run; a
    # heartbeat older than interval + heartbeat_grace_minutes is a stopped stage.
    sweep_interval_minutes: Annotated[int, NOT_A_BOOLEAN, Field(gt=0)] = 5
    plan_interval_minutes: Annotated[int, NOT_A_BOOLEAN, Field(gt=0)] = 90
    heartbeat_grace_minutes: Annotated[int, NOT_A_BOOLEAN, Field(ge=0)] = 10


class NetworkConfig(_Model):
    """Where outbound requests may go (see deadline_pipeline.security.outbound).

    By default only globally routable addresses; ``allow`` lists networks admitted anyway
    (``127.0.0.1/32`` for a local receiver, ``10.0.0.0/8``); ``allow_private`` admits private and
    shared unicast ranges (never loopback, link-local, multicast: those only through ``allow``).
    """

    allow: list[str] = []
    allow_private: bool = False

    @field_validator("allow")
    @classmethod
    def _allow(cls, v: list[str]) -> list[str]:
        from deadline_pipeline.security.outbound import NetworkPolicy

        NetworkPolicy.from_strings(v)  # raises ValueError naming the bad entry
        return v

    def policy(self):
        """The :class:`~deadline_pipeline.security.outbound.NetworkPolicy` of this section."""
        from deadline_pipeline.security.outbound import NetworkPolicy

        return NetworkPolicy.from_strings(self.allow, self.allow_private)


class PlanConfig(_Model):
    horizon_days: Annotated[int, NOT_A_BOOLEAN, Field(gt=0, le=3660)] = 366
    # First due month (UTC, "YYYY-MM") of the plan partitions; default: the month of the first
    # planning run recorded in the store. Replays (--as-of) before it are refused.
    first_month: str | None = None

    @field_validator("first_month")
    @classmethod
    def _first_month(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", str(v)):
            raise ValueError(f"first_month {v!r}: expected a month 'YYYY-MM', e.g. '2026-01'")
        return v


class DeadlinesConfig(_Model):
    sources: list[SourceConfig] = []
    subscribers: list[SubscriberConfig] = []
    subscribers_csv: str | None = None
    subscriptions: list[SubscriptionConfig] = []
    # A channel's name is stored with each alert (a column of 100 characters): a longer name failed
    # the transaction planning every alert on PostgreSQL.
    channels: dict[Annotated[str, Field(max_length=100), _ONE_LINE_NAME], ChannelConfig] = {}
    delivery: DeliveryConfig = DeliveryConfig()
    escalation: EscalationConfig = EscalationConfig()
    watch: WatchConfig = WatchConfig()
    plan: PlanConfig = PlanConfig()
    network: NetworkConfig = NetworkConfig()

    @model_validator(mode="after")
    def _references(self) -> DeadlinesConfig:
        names = [s.name for s in self.sources]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"source names repeat: {sorted(dupes)}")
        for i, sub in enumerate(self.subscriptions):
            for src in sub.sources:
                if src not in names:
                    raise ValueError(f"subscriptions[{i}] ({sub.name}): unknown source {src!r}; known: {names}")
            known = {s.id for s in self.subscribers}
            unknown = [x for x in sub.subscribers if x != "*" and x not in known]
            if unknown:
                # A typo here would silently leave someone without reminders.
                raise ValueError(f"subscriptions[{i}] ({sub.name}): unknown subscriber(s) {unknown}")
            self._subscription_channels(i, sub)
        for s in self.sources:
            if s.business_days and s.business_days.calendar.startswith("source:"):
                ref = s.business_days.calendar[len("source:"):].partition("/")[0]
                if ref not in names:
                    raise ValueError(f"sources ({s.name}): business_days.calendar refers to unknown source {ref!r}")
        for ch in self.escalation.channels:
            if ch not in self.channels:
                raise ValueError(f"escalation: unknown channel {ch!r}; known: {sorted(self.channels)}")
            if self.channels[ch].type == "caldav":
                # An escalation notice is a message to an operator, not an event to book.
                raise ValueError(f"escalation: channel {ch!r} is a caldav (booking) channel; use a message channel")
            self._escalation_recipient(ch)
        return self

    # The escalation setting each channel type sends an operator's notice to.
    _ESCALATION_RECIPIENT = {"smtp": "email", "maildir": "email", "webhook": "webhook_url"}

    def _escalation_recipient(self, ch: str) -> None:
        """Raise ``ValueError`` when escalation channel ``ch`` needs a recipient the escalation
        settings do not give: accepted at load, the first page failed ("has no usable e-mail
        address"), so the on-call learnt of nothing while every check was green."""
        kind = self.channels[ch].type
        needed = self._ESCALATION_RECIPIENT.get(kind)
        if needed and not getattr(self.escalation, needed):
            raise ValueError(f"escalation: channel {ch!r} ({kind}) needs escalation.{needed}: its pages have no "
                             "recipient otherwise")

    def _subscription_channels(self, i: int, sub: SubscriptionConfig) -> None:
        """Raise ``ValueError`` when subscription ``i`` names an unknown channel, or a webhook channel
        whose body carries pages only (every reminder on it would be refused at send time)."""
        for ch in sub.channels:
            if ch not in self.channels:
                raise ValueError(
                    f"subscriptions[{i}] ({sub.name}): unknown channel {ch!r}; known: {sorted(self.channels)}"
                )
            if getattr(self.channels[ch], "body", None) in ("pagerduty", "alertmanager"):
                raise ValueError(f"subscriptions[{i}] ({sub.name}): channel {ch!r} sends body "
                                 f"{self.channels[ch].body!r}, which carries pages only; use it in "
                                 "escalation.channels")

    @model_validator(mode="after")
    def _ranges(self) -> DeadlinesConfig:
        # Every number range-checked, and the lease agreeing with the time budget and each channel's
        # timeout (deadline_pipeline.config_ranges); errors carry their key paths.
        config_ranges.check(self)
        return self

    def source(self, name: str) -> SourceConfig:
        for s in self.sources:
            if s.name == name:
                return s
        raise KeyError(name)


def _models_in(annotation) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Annotated, Optional, list, dict, unions)."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out.extend(_models_in(arg))
    return out


def _keys_at(loc: tuple) -> set[str]:
    """The keys allowed in the mapping that holds the last part of ``loc`` (a pydantic error path),
    e.g. ``("subscriptions", 0, "ofsets")`` → the fields of a subscription. Empty when unknown."""
    models: list[type[BaseModel]] = [DeadlinesConfig]
    for part in loc[:-1]:
        if not isinstance(part, str):
            continue  # a list index: the item's models are already in ``models``
        nested = [m for model in models if part in model.model_fields
                  for m in _models_in(model.model_fields[part].annotation)]
        if nested:
            models = nested
            continue
        # A dict key (a channel's name) or a union tag (the channel's type): narrow by the tag.
        tagged = [m for m in models if "type" in m.model_fields
                  and part in typing_args(m.model_fields["type"].annotation)]
        if tagged:
            models = tagged
    return {name for m in models for name in m.model_fields}


def typing_args(annotation) -> tuple:
    """``Literal["smtp"]`` → ``("smtp",)``; anything else → ``()``."""
    import typing

    return typing.get_args(annotation) if typing.get_origin(annotation) is Literal else ()


def did_you_mean(key: str, loc: tuple) -> str:
    """``" (did you mean `offsets`?)"`` for a misspelt key at ``loc``, else ``""`` (difflib ratio ≥ 0.6,
    the standard library's own "close match"). A misspelt optional key would otherwise leave a
    default in force that the author believes they changed."""
    import difflib

    close = difflib.get_close_matches(str(key), sorted(_keys_at(loc)), n=1)
    return f"; did you mean `{close[0]}`?" if close else ""


# Pydantic puts the channel type it tried into an error's location (channels.hook.webhook.x);
# the file has no such key, so the path names channels.hook.x.
_CHANNEL_TYPES = frozenset({"maildir", "smtp", "webhook", "slack", "caldav", "apprise"})


def _format_loc(loc: tuple) -> str:
    if len(loc) >= 3 and loc[0] == "channels" and loc[2] in _CHANNEL_TYPES:
        loc = loc[:2] + loc[3:]
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _expand(path: str, base: Path) -> str:
    from deadline_pipeline.store.db import deadline_home

    env = dict(os.environ)
    env.setdefault("DEADLINE_HOME", str(deadline_home()))
    used: list[str] = []

    def sub(m: re.Match) -> str:
        value = env.get(m.group(1) or m.group(2), m.group(0))
        used.append(value)
        return value

    expanded = re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, path)
    if len(urlparse(expanded).scheme) > 1:  # a URL (an unsupported scheme is refused by validation)
        from deadline_pipeline.security.redact import register_secret

        # A variable inside a URL is how a private feed's token stays out of the file: never print it.
        for value in used:
            register_secret(value)
        return expanded
    p = Path(expanded).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


#: Largest subscriber file read (bytes); it is read up to this and refused beyond (``/dev/zero``
#: once grew the process to 4 GB before failing). Rows: ``deadline_pipeline.limits.MAX_CSV_ROWS``.
MAX_SUBSCRIBERS_BYTES = 64 * 1024 * 1024


def _csv_layout(data: bytes, path: Path) -> tuple[int, list[str], list[int]]:
    """``(header line, header names as written, first line of each record)`` of a subscriber file,
    lines counted from 1 in the file as a text editor shows it. Blank and whitespace-only lines are
    skipped as pandas skips them; a quoted value may span lines, so a record is numbered by the line
    it starts on. Counting pandas records instead put every message after a blank line or a
    multi-line value on the wrong line.

    Raises :class:`ConfigError` for a row with more fields than the header
    (``line 7: 6 fields, the header has 5``): pandas takes the surplus first field as the row's index
    and shifts every other value one column left, so the error named the wrong column (an id read as
    a tenant, an address as a zone), or none at all. A row with fewer fields leaves the rest empty.
    ``data`` is UTF-8 (:func:`_refuse_undecodable` has refused any other file)."""
    import csv
    import io

    header_line, header, starts, problems = 0, [], [], []
    try:
        reader = csv.reader(io.StringIO(data.decode("utf-8-sig"), newline=""))
        end = 0
        for row in reader:
            start, end = end + 1, reader.line_num
            # pandas skips an empty or whitespace-only line, not a quoted empty value ("").
            if not row or (len(row) == 1 and row[0] != "" and not row[0].strip()):
                continue
            if not header_line:
                header_line, header = start, row
                continue
            starts.append(start)
            if len(row) > len(header):
                problems.append(f"{path}: line {start}: {len(row)} fields, the header has {len(header)}")
    except csv.Error as exc:  # a field over the reader's limit (131,072 characters), which pandas reads
        raise ConfigError(f"{path}: line {reader.line_num}: not a readable CSV row: {exc}") from None
    if problems:
        raise ConfigError("\n".join(problems[:20]) + (f"\n… and {len(problems) - 20} more row(s)" if len(problems) > 20
                                                       else ""))
    return header_line, header, starts


def _utf16_without_bom(data: bytes) -> str | None:
    """``"UTF-16-LE"`` or ``"UTF-16-BE"`` when the first line of ``data`` reads as UTF-16 text of that
    byte order: a NUL byte in (at least three quarters of) every other position, after each byte for
    little-endian, before it for big-endian, and none in the others; else ``None``. ASCII text in
    UTF-16 is valid UTF-8 (a NUL is a character), so a spreadsheet's "Unicode text" export saved
    without a byte order mark passed the UTF-8 check and was refused for "unknown column
    'i\\x00d\\x00'"; a UTF-8 text file holds no NUL."""
    end = data.find(b"\n", 0, 4096)
    line = data[: end if end >= 0 else 4096]
    for name, nul_at in (("UTF-16-LE", 1), ("UTF-16-BE", 0)):
        nuls, others = line[nul_at::2], line[1 - nul_at::2]
        if len(line) >= 2 and b"\0" not in others and nuls.count(0) * 4 >= len(nuls) * 3:
            return name
    return None


def _first_non_utf8(data: bytes, path: Path) -> tuple[UnicodeDecodeError, int, int] | None:
    """``None`` when the file ``data`` is UTF-8 (a byte order mark allowed); else ``(error, line,
    offset of that line's start)`` for its first byte that is not, ``error.start`` being that byte's
    offset in ``data``. Raises :class:`ConfigError` naming ``path`` when the whole file is in another
    encoding, not one bad byte: it starts with a UTF-16 or UTF-32 byte order mark, or its first line
    is UTF-16 without one (:func:`_utf16_without_bom`)."""
    import codecs

    # The marks first: a UTF-16 file with one has the NULs of one without it.
    for name, boms in (("UTF-32", (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)),
                       ("UTF-16", (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))):
        if data.startswith(boms):
            raise ConfigError(f"{path}: the file is {name} (it starts with a {name} byte order mark); save it "
                              "as UTF-8")
    utf16 = _utf16_without_bom(data)
    if utf16 is not None:
        raise ConfigError(f"{path}: line 1: the file looks like {utf16} without a byte order mark (a NUL byte "
                          "beside every character); save it as UTF-8")
    try:
        # "utf-8", not "utf-8-sig": a byte order mark is UTF-8 too, and the -sig codec counts the
        # error's position from after it, one column off on the first line.
        data.decode("utf-8")
        return None
    except UnicodeDecodeError as exc:
        bad = exc
    return bad, data.count(b"\n", 0, bad.start) + 1, data.rfind(b"\n", 0, bad.start) + 1


def _not_utf8(path: Path, data: bytes, bad: UnicodeDecodeError, where: str) -> ConfigError:
    return ConfigError(f"{path}: {where}: byte 0x{data[bad.start]:02x} is not UTF-8 ({bad.reason}); save the "
                       "file as UTF-8")


def _utf8_text(data: bytes, path: Path) -> str:
    """The configuration file ``data`` decoded as UTF-8 (a byte order mark is dropped); raises
    :class:`ConfigError` naming ``path``, the line and column of the first byte that is not UTF-8 and
    the fix (:func:`_first_non_utf8`). Python's own message gave a byte offset from the start of the
    file, which no editor shows."""
    found = _first_non_utf8(data, path)
    if found is None:
        return data.decode("utf-8-sig")
    bad, line, start = found
    column = len(data[start:bad.start].decode("utf-8-sig", "replace")) + 1
    raise _not_utf8(path, data, bad, f"line {line}, column {column}") from None


def _refuse_undecodable(data: bytes, path: Path) -> None:
    """Return when the subscriber file ``data`` is UTF-8 (a byte order mark allowed); else raise
    :class:`ConfigError` naming ``path``, the line, the column (number and header name) and the byte
    that is not UTF-8, e.g. ``subs.csv: line 4, column 2 (tenant): byte 0xff is not UTF-8 (invalid
    start byte); save the file as UTF-8`` (:func:`_first_non_utf8`).

    pandas' own message gave a byte offset from the start of the file ("position 4711"), which no
    editor shows, so the one bad row of a thousand could not be found."""
    import csv
    import io

    found = _first_non_utf8(data, path)
    if found is None:
        return
    bad, line, start = found
    # The fields before the bad byte on its line, read as CSV (the bytes before it decode), give its column.
    before = data[start:bad.start].decode("utf-8-sig", "replace")
    field = len(next(csv.reader(io.StringIO(before)), [""])) if before else 1
    header = next(csv.reader(io.StringIO(data[:data.find(b"\n")].decode("utf-8-sig", "replace"))), [])
    name = f" ({header[field - 1].strip()})" if line > 1 and field <= len(header) else ""
    raise _not_utf8(path, data, bad, f"line {line}, column {field}{name}") from None


def _subscriber_columns(header: list[str], header_line: int, path: Path) -> list[str]:
    """The header's names without surrounding spaces (a removal is logged), one per column.

    Raises :class:`ConfigError` naming the file, line and column for a name that is not a
    subscriber field, a nameless column or a name given twice. An unknown column was once skipped
    without a word: ``tenant `` or ``tenat`` left every subscriber in tenant ``default``, never
    planned for its sources' tenant while every check stayed green."""
    known = list(SubscriberConfig.model_fields)
    names, problems = [], []
    for n, raw in enumerate(header, start=1):
        name = raw.strip()
        if name != raw:
            log.warning("%s: line %d: column name %r: spaces around it removed", path, header_line, raw)
        if not name:
            problems.append(f"column {n} has no name")
        elif name in names:
            problems.append(f"column {n}: {name!r} repeats column {names.index(name) + 1}")
        elif name not in SubscriberConfig.model_fields:
            problems.append(f"column {n}: unknown column {name!r}"
                            + did_you_mean(name, ("subscribers", 0, name)))
        names.append(name)
    if problems:
        raise ConfigError("\n".join(f"{path}: line {header_line}: {p}" for p in problems)
                          + f"\n{path}: the columns a subscriber file may have are {', '.join(known)}")
    return names


def _read_subscribers_csv(path: Path, config_path: Path) -> list[tuple[int, dict]]:
    """``(line, row)`` per subscriber of the CSV file ``path``: the line the record starts on and its
    non-empty values by column, spaces around them removed (logged). Raises :class:`ConfigError`
    naming ``path`` (and the line) for an unreadable or oversized file, a header that is not made of
    subscriber fields, a row with too many fields, or a repeated id."""
    import io

    import pandas as pd

    from deadline_pipeline.limits import MAX_CSV_ROWS

    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_SUBSCRIBERS_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{config_path}: subscribers_csv: file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"{config_path}: subscribers_csv: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_SUBSCRIBERS_BYTES:
        raise ConfigError(f"{config_path}: subscribers_csv: {path} is larger than {MAX_SUBSCRIBERS_BYTES:,} bytes "
                          "(limit of the subscriber file)")
    _refuse_undecodable(data, path)
    header_line, header, lines = _csv_layout(data, path)
    try:
        frame = pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False)
    except Exception as exc:  # pandas raises several parser error types
        raise ConfigError(f"{config_path}: subscribers_csv: {path} is not a readable CSV file: {exc}") from None
    if len(frame) > MAX_CSV_ROWS:
        raise ConfigError(f"{config_path}: subscribers_csv: {path} has more than {MAX_CSV_ROWS:,} rows "
                          "(limit of the subscriber file)")
    if len(lines) != len(frame) or len(header) != len(frame.columns):
        # Never print a line number that may be wrong: refuse what the two readers see differently.
        raise ConfigError(f"{path}: cannot tell which line each record is on ({len(frame)} record(s) read, "
                          f"{len(lines)} counted); a line holding only a quoted blank value (\" \") is one "
                          "cause: remove it")
    frame.columns = _subscriber_columns(header, header_line, path)
    missing = {"id", "timezone"} - set(frame.columns)
    if missing:
        raise ConfigError(f"{path}: line {header_line}: missing column(s) {sorted(missing)}; "
                          f"the columns are {', '.join(SubscriberConfig.model_fields)}")
    rows = []
    first_line: dict[str, int] = {}
    repeats = []
    for line, rec in zip(lines, frame.to_dict("records"), strict=True):
        row = {}
        for k, v in rec.items():
            if v != v.strip():
                # "carl ," stored the id "carl " that `subscribers: [carl]` then did not find; a
                # spreadsheet's padding is never meant as part of an id, zone, address or URL.
                log.warning("%s: line %d: column %s: spaces around %r removed", path, line, k, v)
                v = v.strip()
            if v != "":
                row[k] = v
        ident = row.get("id")
        if ident is not None:
            if ident in first_line:
                repeats.append(f"{path}: line {line}: id {ident!r} repeats line {first_line[ident]}")
            else:
                first_line[ident] = line
        rows.append((line, row))
    if repeats:
        # Named here, with lines: checked after merging, a repeat was reported against the
        # configuration file, which does not hold it.
        raise ConfigError("\n".join(repeats[:20]) + (f"\n… and {len(repeats) - 20} more" if len(repeats) > 20
                                                     else ""))
    return rows


def _parse_yaml(text: str, path: Path):
    """The configuration document, read by the sources' safe YAML reader
    (:func:`deadline_pipeline.limits.load_yaml`): YAML 1.2 scalars (an unquoted
    ``timezone: -12:00`` is the offset as written, not the YAML 1.1 sexagesimal integer -720),
    nesting at most ``MAX_DEPTH`` levels and no alias bomb. Raises :class:`ConfigError` naming the
    file, line and column — a 900-level nested list once ended in ``RecursionError`` without a file."""
    from deadline_pipeline.limits import ParseError, load_yaml

    label = str(path)
    try:
        data, root = load_yaml(text, source=label)
    except ParseError as exc:
        # The reader names a "source"; here the input is the configuration file.
        raise ConfigError(f"{path}: {str(exc).removeprefix(f'source {label!r}: ')}") from None
    except yaml.reader.ReaderError as exc:  # a forbidden character: the reader gives an offset only
        before = text[: exc.position]
        line, column = before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1
        char = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or "\0")
        raise ConfigError(f"{path}: line {line}, column {column}: invalid YAML: character U+{char:04X} "
                          "is not allowed in YAML") from None
    problems = _yaml_problems(root)
    if problems:
        raise ConfigError("\n".join(f"{path}: {p}" for p in problems[:20])
                          + (f"\n… and {len(problems) - 20} more" if len(problems) > 20 else ""))
    return data


def _yaml_problems(root) -> list[str]:
    """``line L, column C: KEY.PATH: …`` for every problem under the YAML ``root`` that the loader
    would pass without a word, in document order. Empty when there is none. Two kinds:

    * a scalar (key or value) that is not storable text (:func:`_text_problems`);
    * a key written twice in one mapping
      (:func:`~deadline_pipeline.limits.repeated_keys`, shared with the YAML sources):
      the loader keeps the last and drops the first, so a second ``subscriptions:`` block, or
      ``offsets`` written twice in one subscription, made every reminder of the first disappear while
      the run and all its checks stayed green. A key set again beside a merge (``<<: *defaults``) is
      YAML's override and accepted.
    """
    from deadline_pipeline.limits import repeated_keys

    found = [(r.index, f"line {r.line}, column {r.column}: {_format_loc(r.path)}: written twice in one mapping "
                       f"(first at line {r.first_line}); YAML would keep only this one and drop the first without "
                       "a word - merge them into one") for r in repeated_keys(root)]
    found += _text_problems(root, (), set())
    return [message for _index, message in sorted(found, key=lambda item: item[0])]


def _text_problems(node, loc: tuple, seen: set[int]) -> list[tuple[int, str]]:
    """``(offset, message)`` for every scalar (key or value) under the YAML ``node`` that is not
    storable text: a NUL character (YAML's escape ``"\\0"``) or an unpaired UTF-16 surrogate
    (``"\\ud800"``, not a character at all). The values reach the store, file paths, headers and
    URLs: PostgreSQL refuses NUL, no UTF-8 encoder takes a surrogate, and one such subscriber tenant,
    subscription name, channel name or rule pattern failed planning for every subscriber (a channel's
    sender or path failed every send). ``loc``: the key path of ``node``; ``seen``: aliased nodes
    already visited, so each is walked once."""
    if node is None or id(node) in seen:
        return []
    seen.add(id(node))
    if isinstance(node, yaml.ScalarNode):
        return [(node.start_mark.index, p) for p in _not_text(node, loc)]
    if isinstance(node, yaml.SequenceNode):
        return [p for i, item in enumerate(node.value) for p in _text_problems(item, (*loc, i), seen)]
    if not isinstance(node, yaml.MappingNode):
        return []
    out = []
    for key, value in node.value:
        name = key.value if isinstance(key, yaml.ScalarNode) else "?"
        out += _text_problems(key, (*loc, name), seen) + _text_problems(value, (*loc, name), seen)
    return out


def _not_text(node: yaml.ScalarNode, loc: tuple) -> list[str]:
    """The problem of the scalar ``node`` at key path ``loc`` when it holds a NUL or an unpaired
    surrogate (see :func:`_text_problems`), as a one-item list; else an empty one."""
    value, why = node.value, None
    if "\0" in value:
        why = "a NUL character (U+0000)"
    else:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:  # the codec finds the surrogate and its position
            why = f"the unpaired UTF-16 surrogate U+{ord(value[exc.start]):04X}"
    if why is None:
        return []
    mark = node.start_mark
    # The key path may hold the bad text itself (a channel's name): shown escaped, as repr shows the value.
    where = (_format_loc(loc) if loc else "(top level)").encode("utf-8", "backslashreplace").decode()
    return [f"line {mark.line + 1}, column {mark.column + 1}: {where.replace(chr(0), chr(92) + 'x00')}: "
            f"{why} is not text; remove it (got {value!r})"]


def tenant_problems(cfg: DeadlinesConfig, origins: dict[str, str]) -> list[str]:
    """One line per subscriber whose tenant is no source's tenant but differs from one only in letter
    case (``Acme`` against a source's ``acme``), naming where the subscriber was written (``origins``:
    subscriber id → ``FILE: line N`` or ``FILE: subscribers[i]``), its tenant and the source tenant(s)
    it nearly matches. Empty when there is none.

    Tenants are compared exactly (a source's reminders are for its own tenant only), so such a
    subscriber was never planned for the source: no reminder, exit 0, and no warning whenever another
    subscriber of the source's exact tenant existed (the "reaches no subscriber" problem needs all of
    them to miss). A tenant that matches a source's exactly, or no source's at all even ignoring case
    (a tenant without sources yet), is not refused here.
    """
    by_folded: dict[str, dict[str, list[str]]] = {}
    for src in cfg.sources:
        by_folded.setdefault(src.tenant.casefold(), {}).setdefault(src.tenant, []).append(src.name)
    exact = {src.tenant for src in cfg.sources}
    problems = []
    for sub in cfg.subscribers:
        near = by_folded.get(sub.tenant.casefold(), {})
        if sub.tenant in exact or not near:
            continue
        where = origins.get(sub.id, f"subscribers ({sub.id})")
        of = "; ".join(f"source(s) {names} have tenant {tenant!r}" for tenant, names in sorted(near.items()))
        meant = " or ".join(repr(t) for t in sorted(near))
        problems.append(f"{where}: subscriber {sub.id!r}: tenant {sub.tenant!r} is no source's tenant, but differs "
                        f"only in letter case from one ({of}); tenants are compared exactly, so this subscriber "
                        f"would get none of their reminders; did you mean {meant}?")
    return problems


def load_config(path: str | os.PathLike | None = None) -> tuple[DeadlinesConfig, Path]:
    """Read and validate a configuration file.

    ``path`` defaults to ``$DEADLINE_CONFIG``, then ``./deadlines.yaml``. Returns the validated
    configuration (with paths resolved) and the file's absolute path.

    Raises :class:`ConfigError` for a missing file, invalid YAML (with line and column), a value
    that fails validation (with the key path, e.g. ``subscriptions[0].offsets``), or a subscriber
    whose tenant differs from a source's only in letter case (:func:`tenant_problems`).
    """
    path = Path(path or os.environ.get("DEADLINE_CONFIG") or DEFAULT_CONFIG_NAME).resolve()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file does not exist") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read configuration: {exc}") from None
    text = _utf8_text(data, path)
    raw = _parse_yaml(text, path)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: (top level): expected a mapping of sections, got {type(raw).__name__}")

    base = path.parent
    # Where each subscriber was written, for errors found after validation (addresses × channels).
    origins = {sub.get("id"): f"{path}: subscribers[{i}]" for i, sub in enumerate(raw.get("subscribers") or [])
               if isinstance(sub, dict)}
    for src in raw.get("sources") or []:
        if isinstance(src, dict) and isinstance(src.get("location"), str):
            src["location"] = _expand(src["location"], base)
    for ch in (raw.get("channels") or {}).values():
        if isinstance(ch, dict) and isinstance(ch.get("path"), str):
            ch["path"] = _expand(ch["path"], base)
    if isinstance(raw.get("subscribers_csv"), str):
        csv_path = Path(_expand(raw["subscribers_csv"], base))
        raw["subscribers_csv"] = str(csv_path)
        from_csv = _read_subscribers_csv(csv_path, path)
        inline = {sub["id"]: i for i, sub in enumerate(raw.get("subscribers") or [])
                  if isinstance(sub, dict) and isinstance(sub.get("id"), str)}
        # Checked here, with the CSV line: after merging, the repeat was reported against the
        # configuration file alone ("subscribers: ids repeat"), which holds only one of the copies.
        problems = [f"{csv_path}: line {line}: id {r['id']!r} is also in the configuration's `subscribers:` "
                    f"list ({path}: subscribers[{inline[r['id']]}])" for line, r in from_csv if r.get("id") in inline]
        if problems:
            raise ConfigError("\n".join(problems))
        extra = []
        for line, r in from_csv:
            try:
                extra.append(SubscriberConfig.model_validate(r))
            except ValidationError as exc:
                for err in exc.errors():
                    col = ".".join(str(x) for x in err["loc"]) or "(row)"
                    msg = err["msg"].removeprefix("Value error, ")
                    problems.append(f"{csv_path}: line {line} (id {r.get('id')!r}), column {col}: {msg}")
        if problems:
            raise ConfigError("\n".join(problems))
        raw["subscribers"] = list(raw.get("subscribers") or []) + [e.model_dump() for e in extra]
        origins.update({r.get("id"): f"{csv_path}: line {line}" for line, r in from_csv})

    try:
        cfg = DeadlinesConfig.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = _format_loc(err["loc"]) if err["loc"] else "configuration"
            msg = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
            if err["type"] == "extra_forbidden" and err["loc"]:
                msg = "unknown key" + did_you_mean(err["loc"][-1], tuple(err["loc"]))
            lines.append(f"{path}: {loc}: {msg}{shown}")
        raise ConfigError("\n".join(lines)) from None
    if not cfg.sources:
        # An empty or truncated file is a mistake, never an intent: refuse it before anything runs.
        raise ConfigError(f"{path}: sources: none configured; a configuration needs at least one source "
                          "(see examples/deadlines.yaml)")
    ids = [s.id for s in cfg.subscribers]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError(f"{path}: subscribers: ids repeat: {dupes}")
    from deadline_pipeline.security.redact import register_config_secrets

    # Every value behind a *_env key is masked in any text this process writes from now on.
    register_config_secrets(cfg)
    from deadline_pipeline.addresses import address_problems

    problems = tenant_problems(cfg, origins) + address_problems(cfg, origins)
    if problems:
        raise ConfigError("\n".join(p if p.startswith(str(path)) or ": line " in p else f"{path}: {p}"
                                     for p in problems))
    return cfg, path
