"""The configuration file's sections as pydantic models: what each key means and holds.

:class:`DeadlinesConfig` is the whole file. Each number's unit and range is its type
(:mod:`~deadline_pipeline.config.quantities`), each text check a function of
:mod:`~deadline_pipeline.config.text`; the validators here check what needs the section (a
subscription's offsets together, references between sections). A validator raises ``ValueError``
(or, for the settings that must agree, :mod:`~deadline_pipeline.config.agreement`'s
``ValidationError``), which :func:`~deadline_pipeline.config.load_config` reports with the key path.
"""

from __future__ import annotations

import re
import sys
from datetime import timedelta
from typing import Annotated, Literal
from urllib.parse import urlparse

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from deadline_pipeline.config.agreement import disagreements, problem_at, raise_problems
from deadline_pipeline.config.base import Section
from deadline_pipeline.config.channels import (
    ChannelConfig,
)
from deadline_pipeline.config.quantities import (
    MAX_WITHDRAW_SHARE,
    BackoffBaseSeconds,
    BackoffCapSeconds,
    BatchSize,
    BoundedDuration,
    GraceMinutes,
    HeartbeatGraceMinutes,
    HorizonDays,
    LeaseSeconds,
    MaxAttempts,
    PlanIntervalMinutes,
    Processes,
    ReminderMinutes,
    RetryAfterCapSeconds,
    SweepIntervalMinutes,
    Switch,
    TimeBudgetSeconds,
    WithdrawShare,
)
from deadline_pipeline.config.text import (
    ONE_LINE_NAME,
    check_zone,
    one_line_of_text,
    parse_quiet_hours,
    refuse_legacy_ipv4,
)
from deadline_pipeline.durations import parse_duration
from deadline_pipeline.holiday_calendars import holiday_source_of, library_calendar

SOURCE_FORMATS = ("ai-deadlines", "ics", "csv", "govuk-bank-holidays")


class BusinessDaysConfig(Section):
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
        if holiday_source_of(v) is None:
            try:
                library_calendar(v)
            except ValueError as exc:
                raise ValueError(str(exc)) from None
        return v


def asset_name(source: str) -> str:
    """The part of a source's Dagster asset keys (``source/<it>``, ``snapshot/<it>``) its name gives:
    every character other than a letter, digit or ``_`` replaced by ``_`` (Dagster refuses them)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", source)


class SourceConfig(Section):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", max_length=100)]
    format: Literal["ai-deadlines", "ics", "csv", "govuk-bank-holidays"]
    location: str
    # A Dagster tag value (the source's assets carry it): any other text passed loading and then
    # stopped every command with DagsterInvalidDefinitionError, naming neither file nor key.
    tenant: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=63)] = "default"
    freshness: BoundedDuration = "P1D"
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
        return None if v is None else check_zone(v)

    @property
    def freshness_window(self) -> timedelta:
        return parse_duration(self.freshness)

    @property
    def is_url(self) -> bool:
        return urlparse(self.location).scheme in ("http", "https")


class SubscriberConfig(Section):
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
        return None if v is None else one_line_of_text(v, what)

    @field_validator("quiet_hours")
    @classmethod
    def _quiet(cls, v: str | None) -> str | None:
        if v is not None:
            parse_quiet_hours(v)
        return v

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        return check_zone(v)

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
            refuse_legacy_ipv4(v)
        return v

    def model_post_init(self, context: object, /) -> None:
        """Share what thousands of subscribers hold alike: the set of keys each was given (pydantic
        keeps a fresh set per model, 728 bytes of a subscriber's 1,330 when five keys are given) and
        the zone and tenant names (one string each per subscriber, as the file's parser made them).
        20,000 subscribers held 25 MiB, which planning carried for its whole run."""
        given = frozenset(self.__pydantic_fields_set__)
        shared = _GIVEN_KEYS.get(given)
        if shared is None:
            shared = _GIVEN_KEYS[given] = _SharedKeys(given)
        object.__setattr__(self, "__pydantic_fields_set__", shared)
        for key in ("timezone", "tenant"):
            self.__dict__[key] = sys.intern(self.__dict__[key])

    def __copy__(self) -> SubscriberConfig:
        # model_copy(update=...) adds the updated keys to the copy's set of given keys: the copy
        # gets a set of its own, or the update would be refused by the shared one.
        copied = super().__copy__()
        object.__setattr__(copied, "__pydantic_fields_set__", set(self.__pydantic_fields_set__))
        return copied

    def __deepcopy__(self, memo: dict | None = None) -> SubscriberConfig:
        copied = super().__deepcopy__(memo)
        object.__setattr__(copied, "__pydantic_fields_set__", set(self.__pydantic_fields_set__))
        return copied


class _SharedKeys(set):
    """A set of given keys that many subscribers share: read only, because a change would change
    every subscriber's. (A ``set``, not a ``frozenset``: pydantic's ``model_dump(exclude_unset=True)``
    accepts only a set.)"""

    def _refuse(self, *args: object) -> None:
        raise TypeError("a subscriber's set of given keys is shared by others; change a copy of the model")

    add = discard = remove = pop = clear = update = _refuse
    difference_update = intersection_update = symmetric_difference_update = _refuse
    __ior__ = __iand__ = __isub__ = __ixor__ = _refuse


# The distinct sets of keys subscribers were given: a handful, each shared by every subscriber given it.
_GIVEN_KEYS: dict[frozenset[str], _SharedKeys] = {}


class SubscriptionConfig(Section):
    # At most the store's column (200); longer failed the transaction storing every subscription.
    name: Annotated[str, Field(max_length=200), ONE_LINE_NAME]
    subscribers: list[str] = ["*"]  # subscriber ids, or "*" for every subscriber of the source's tenant
    sources: list[str]
    rules: list[str] = ["*"]  # fnmatch patterns on rule ids
    offsets: Annotated[list[BoundedDuration], Field(min_length=1)] = ["-P1D"]
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


class EscalationConfig(Section):
    """Where an escalated alert is announced: ``channels`` by name, with the recipient the channel
    needs (``email`` for smtp/maildir, ``webhook_url`` for webhook, ``apprise_target`` for an apprise
    URL with ``{target}``; slack needs none)."""

    channels: list[str] = []
    email: str | None = None
    webhook_url: str | None = None
    apprise_target: str | None = None
    # The paging sensor and the watchdog remind about an incident still open after this long.
    reminder_minutes: ReminderMinutes = 60
    # The Dagster UI's base URL (http://dagster.internal:3000): pages link to the failed check or
    # run there. Unset: they carry the UI's route (/assets/alerts?view=checks) without a host.
    dagster_ui_url: str | None = None

    @field_validator("email", "webhook_url", "apprise_target")
    @classmethod
    def _one_line(cls, v: str | None, info: ValidationInfo) -> str | None:
        # As a subscriber's: a control character in the operator's address would fail the very
        # notice that reports a reminder as not delivered.
        return None if v is None else one_line_of_text(v, f"escalation.{info.field_name}")

    @field_validator("dagster_ui_url")
    @classmethod
    def _ui_url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        one_line_of_text(v, "escalation.dagster_ui_url")
        parts = urlparse(v)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
            raise ValueError(f"{v!r} is not an http(s) base URL (e.g. http://dagster.internal:3000)")
        return v.rstrip("/")


class DeliveryConfig(Section):
    batch_size: BatchSize = 500
    lease_seconds: LeaseSeconds = 300
    max_attempts: MaxAttempts = 5
    backoff_base_seconds: BackoffBaseSeconds = 30.0
    backoff_cap_seconds: BackoffCapSeconds = 3600.0
    time_budget_seconds: TimeBudgetSeconds = 240.0
    # Longest wait a receiver's Retry-After may impose, in seconds (default: backoff_cap_seconds); a
    # "Retry-After: <a date in 9999>" would otherwise park an alert until then, never escalated.
    retry_after_cap_seconds: RetryAfterCapSeconds | None = None
    # Processes one sweep runs in (PostgreSQL; see deliver/workers.py): the sweep is CPU-bound in one
    # interpreter, so on an n-core host up to n processes add throughput. Each claims its own batches.
    # Strict: `true` or the string "2" is refused, not read as a number of processes.
    processes: Processes = 1
    # The sweep's event loop. uvloop runs the same sweep with about a third less CPU per alert
    # (benchmarks/deliver.py): the sweep wakes futures, tasks and thread callbacks for every alert.
    # "asyncio" is the standard library's loop, for a platform without uvloop or to rule it out.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"

    @property
    def retry_after_cap(self) -> float:
        """The effective Retry-After cap in seconds."""
        return self.retry_after_cap_seconds if self.retry_after_cap_seconds is not None else self.backoff_cap_seconds


class WatchConfig(Section):
    grace_minutes: GraceMinutes = 30
    # How often the delivery sensor ticks / the sweep runs, and how often ingest + plan run; a
    # heartbeat older than interval + heartbeat_grace_minutes is a stopped stage.
    sweep_interval_minutes: SweepIntervalMinutes = 5
    plan_interval_minutes: PlanIntervalMinutes = 90
    heartbeat_grace_minutes: HeartbeatGraceMinutes = 10


class NetworkConfig(Section):
    """Where outbound requests may go (see deadline_pipeline.security.outbound).

    By default only globally routable addresses; ``allow`` lists networks admitted anyway
    (``127.0.0.1/32`` for a local receiver, ``10.0.0.0/8``); ``allow_private`` admits private and
    shared unicast ranges (never loopback, link-local, multicast: those only through ``allow``).
    """

    allow: list[str] = []
    allow_private: Switch = False

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


class PlanConfig(Section):
    horizon_days: HorizonDays = 366
    # A planning run whose subscriber list would withdraw more than this share of the subscribers
    # owed reminders (two or more of them) keeps them instead, red in plan_complete, until
    # `deadline-pipeline subscribers accept`: a subscriber file cut short at a line withdrew the
    # missing subscribers and cancelled their reminders without a word.
    max_subscriber_withdraw_share: WithdrawShare = MAX_WITHDRAW_SHARE
    # First due month (UTC, "YYYY-MM") of the plan partitions; default: the month of the first
    # planning run recorded in the store. Replays (--as-of) before it are refused.
    first_month: str | None = None

    @field_validator("first_month")
    @classmethod
    def _first_month(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", str(v)):
            raise ValueError(f"first_month {v!r}: expected a month 'YYYY-MM', e.g. '2026-01'")
        return v


class DeadlinesConfig(Section):
    sources: list[SourceConfig] = []
    subscribers: list[SubscriberConfig] = []
    subscribers_csv: str | None = None
    subscriptions: list[SubscriptionConfig] = []
    # A channel's name is stored with each alert (a column of 100 characters): a longer name failed
    # the transaction planning every alert on PostgreSQL.
    channels: dict[Annotated[str, Field(max_length=100), ONE_LINE_NAME], ChannelConfig] = {}
    delivery: DeliveryConfig = DeliveryConfig()
    escalation: EscalationConfig = EscalationConfig()
    watch: WatchConfig = WatchConfig()
    plan: PlanConfig = PlanConfig()
    network: NetworkConfig = NetworkConfig()

    @model_validator(mode="after")
    def _references(self) -> DeadlinesConfig:
        # Each problem is raised at the key that names what does not exist, all of them at once:
        # raised by the model as a whole, an error had no key path, and the loader named the top of
        # the file ("[line 1]") for a typo in a subscription 300 lines down.
        ids = frozenset(s.id for s in self.subscribers)  # once: 20,000 subscribers made a set per subscription
        per_subscription = [p for i, sub in enumerate(self.subscriptions)
                            for p in self._subscription_problems(i, sub, ids)]
        raise_problems(self._source_problems() + per_subscription + self._escalation_problems())
        return self

    def _source_problems(self) -> list:
        """A source name written again (at the repeat's ``name``), and a ``business_days.calendar``
        of ``source:NAME`` naming no source (at the calendar)."""
        names = [s.name for s in self.sources]
        first: dict[str, int] = {}
        out = []
        for k, s in enumerate(self.sources):
            if s.name in first:
                out.append(problem_at(("sources", k, "name"), s.name,
                                      f"source name {s.name!r} repeats sources[{first[s.name]}].name; subscriptions "
                                      "name a source by it, so it must be unique"))
            first.setdefault(s.name, k)
            ref = holiday_source_of(s.business_days.calendar) if s.business_days else None
            if ref is not None and ref.name not in names:
                out.append(problem_at(("sources", k, "business_days", "calendar"), s.business_days.calendar,
                                      f"source {s.name!r}: refers to unknown source {ref.name!r}; known: "
                                      f"{sorted(set(names))}"))
        return out + self._asset_key_problems()

    def _asset_key_problems(self) -> list:
        """Two different source names with one Dagster asset key (``a-b`` and ``a_b`` are both
        ``source/a_b``: :func:`asset_name`), at the later one's ``name``. Dagster cannot hold two
        assets under one key; refused when the definitions were built, the message printed the two
        identical keys and named neither source nor line."""
        first: dict[str, int] = {}
        out = []
        for k, s in enumerate(self.sources):
            key = asset_name(s.name)
            seen = first.setdefault(key, k)
            other = self.sources[seen].name
            if seen != k and other != s.name:  # the same name twice is reported as a repeat
                out.append(problem_at(("sources", k, "name"), s.name,
                                      f"source names {other!r} (sources[{seen}].name) and {s.name!r} give the same "
                                      f"Dagster asset key source/{key} (each character other than a letter, digit "
                                      "or '_' becomes '_'); rename one of them"))
        return out

    def _subscription_problems(self, i: int, sub: SubscriptionConfig, known: frozenset[str]) -> list:
        """Subscription ``i``'s sources, subscribers (``known``: every subscriber id, the file's and
        the subscriber file's) and channels that name nothing in the configuration,
        each at its place in the list (``subscriptions[i].sources[j]``), and a webhook channel whose
        body carries pages only (every reminder on it would be refused at send time)."""
        names = {s.name for s in self.sources}
        where = f"subscription {sub.name!r}: "
        out = [problem_at(("subscriptions", i, "sources", j), src,
                          f"{where}unknown source {src!r}; known: {sorted(names)}")
               for j, src in enumerate(sub.sources) if src not in names]
        # A typo here would silently leave someone without reminders.
        out += [problem_at(("subscriptions", i, "subscribers", j), x, f"{where}unknown subscriber {x!r}")
                for j, x in enumerate(sub.subscribers) if x != "*" and x not in known]
        for j, ch in enumerate(sub.channels):
            at = ("subscriptions", i, "channels", j)
            if ch not in self.channels:
                out.append(problem_at(at, ch, f"{where}unknown channel {ch!r}; known: {sorted(self.channels)}"))
            elif getattr(self.channels[ch], "body", None) in ("pagerduty", "alertmanager"):
                out.append(problem_at(at, ch, f"{where}channel {ch!r} sends body {self.channels[ch].body!r}, which "
                                              "carries pages only; use it in escalation.channels"))
        return out

    # The escalation setting each channel type sends an operator's notice to.
    _ESCALATION_RECIPIENT = {"smtp": "email", "maildir": "email", "webhook": "webhook_url"}

    def _escalation_problems(self) -> list:
        """Each of ``escalation.channels`` (at ``escalation.channels[j]``) that names no channel, a
        caldav (booking) channel, or a channel whose recipient the escalation settings do not give:
        accepted at load, the first page failed ("has no usable e-mail address"), so the on-call
        learnt of nothing while every check was green."""
        out = []
        for j, ch in enumerate(self.escalation.channels):
            at = ("escalation", "channels", j)
            if ch not in self.channels:
                out.append(problem_at(at, ch, f"unknown channel {ch!r}; known: {sorted(self.channels)}"))
                continue
            kind = self.channels[ch].type
            needed = self._ESCALATION_RECIPIENT.get(kind)
            if kind == "caldav":
                # An escalation notice is a message to an operator, not an event to book.
                out.append(problem_at(at, ch, f"channel {ch!r} is a caldav (booking) channel; use a message channel"))
            elif needed and not getattr(self.escalation, needed):
                out.append(problem_at(at, ch, f"channel {ch!r} ({kind}) needs escalation.{needed}: its pages have no "
                                              "recipient otherwise"))
        return out

    @model_validator(mode="after")
    def _agreement(self) -> DeadlinesConfig:
        # The lease agreeing with the time budget and each channel's timeout, the offsets with the
        # planning horizon (deadline_pipeline.config.agreement); errors carry their key paths.
        disagreements(self)
        return self

    def source(self, name: str) -> SourceConfig:
        for s in self.sources:
            if s.name == name:
                return s
        raise KeyError(name)
