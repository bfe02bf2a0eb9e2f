"""The project's own store: one schema, SQLAlchemy 2 Core tables.

Every instant is stored as an aware UTC datetime (``DateTime(timezone=True)``); on SQLite the
``UtcDateTime`` type below restores the UTC zone that SQLite drops, so the same code compares
instants on both engines.

The tables follow DESIGN.md. The unique constraints are the product's idempotency: a re-run of any
stage hits them instead of creating a second row.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.naming import conv

from deadline_pipeline.rules import RULE_ID_MAX
from deadline_pipeline.states import CLAIMABLE, AlertState, ObligationState

# Stable constraint names so Alembic migrations can refer to them on both engines.
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
    }
)

# PostgreSQL's plain JSON has no equality operator, which the upsert's IS DISTINCT FROM needs.
Json = JSON().with_variant(JSONB(), "postgresql")

# SQLite has no 64-bit autoincrement for BIGINT primary keys; INTEGER is its rowid alias.
Id = BigInteger().with_variant(Integer(), "sqlite")


class UtcDateTime(TypeDecorator):
    """An aware UTC datetime on every engine.

    Naive values are refused on the way in (a naive datetime is the classic silent off-by-hours
    bug); values read back are always aware UTC, including from SQLite, which stores text.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r} given to the store; instants must be aware UTC")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            # Stored naive-but-UTC so that SQLite's text comparison orders instants correctly.
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect):
        return _utc_result(value)

    def result_processor(self, dialect, coltype):
        # The function itself, not TypeDecorator's wrapper around process_result_value: the sweep's
        # claim reads three instants per alert, and the wrapper's extra calls were half their cost
        # (a claim of 500: 17.6 ms of CPU, 4.7 ms of it in these conversions; cProfile).
        impl = self.impl_instance.result_processor(dialect, coltype)
        if impl is None:
            return _utc_result
        return lambda value: _utc_result(impl(value))


def _utc_result(value: datetime | None) -> datetime | None:
    """A stored instant as aware UTC: naive values (SQLite's text) are UTC already."""
    if value is None:
        return None
    tz = value.tzinfo
    if tz is UTC:
        return value
    if tz is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


sources = Table(
    "sources",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("tenant", String(200), nullable=False),
    Column("format", String(50), nullable=False),
    Column("location", Text, nullable=False),
    Column("freshness_seconds", Integer, nullable=False),
    Column("status", String(20), nullable=False, default="new"),  # new | fresh | stale | suspect
    Column("last_attempt_at", UtcDateTime),
    Column("last_fresh_at", UtcDateTime),
    Column("last_error", Text),
    Column("current_snapshot_id", BigInteger),
)

snapshots = Table(
    "snapshots",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("source_id", ForeignKey("sources.id"), nullable=False),
    Column("fetched_at", UtcDateTime, nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("size", Integer, nullable=False),
    Column("content", LargeBinary, nullable=False),
    Column("http_status", Integer),
    Column("etag", Text),
    Column("last_modified", Text),
    # parsed | failed | quarantined: a failed parse keeps the bytes for a human to read.
    Column("parse_status", String(20)),
    Column("parse_error", Text),
    # What parsing made of the bytes: {"rules": n, "skipped": [{record_id, position, message}…],
    # "skipped_count": n, "held": [rule ids kept in force because their record failed to parse],
    # "accepted": bool}. The rules_complete check reads it.
    Column("parse_report", Json),
    # The source settings of the last parse ({"format": ..., "timezone": ...}; ingest.service.
    # parse_settings): a parse depends on them as on the bytes, so a change of either parses the
    # latest snapshot again. Without it, a source's new ``timezone:`` did nothing until its bytes
    # changed (migration 0017; NULL: parsed before it, settings not recorded).
    Column("parse_settings", Json),
    UniqueConstraint("source_id", "sha256"),
)

# One row per fetch of a source, successful or not: snapshots record only content that changed, so
# without this log "was the source looked at between A and B?" had no answer, and a deadline that
# came and went while nothing was fetched could not be told from one the source published after it
# had passed (the PWC ismir20 abstract deadline: due 2020-04-11, published 2020-04-17). Pruned with
# the snapshots (``snapshots prune``), keeping each source's latest row.
fetch_log = Table(
    "fetch_log",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("source_id", ForeignKey("sources.id"), nullable=False),
    Column("fetched_at", UtcDateTime, nullable=False),
    # new_snapshot | unchanged | not_modified (HTTP 304) | failed
    Column("outcome", String(20), nullable=False),
    # None for a local file (and for a failed fetch that got no answer).
    Column("http_status", Integer),
    Column("sha256", String(64)),
    # The snapshot these bytes are stored in: the new one, or the existing one with the same sha256
    # (for a 304, the latest one). SET NULL: a log row never blocks pruning a snapshot.
    Column("snapshot_id", ForeignKey("snapshots.id", ondelete="SET NULL")),
    Column("error", Text),
    Index(None, "source_id", "fetched_at"),
)

rule_versions = Table(
    "rule_versions",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("source_id", ForeignKey("sources.id"), nullable=False),
    Column("rule_id", String(RULE_ID_MAX), nullable=False),
    Column("version", Integer, nullable=False),
    Column("snapshot_id", ForeignKey("snapshots.id"), nullable=False),
    Column("valid_from", UtcDateTime, nullable=False),
    Column("withdrawn", Boolean, nullable=False, default=False),
    Column("content_hash", String(64), nullable=False),
    Column("payload", Json, nullable=False),
    # The id this rule had when it first appeared, when it was renamed since (NULL: its own id).
    # Planning keys obligations on it, so a renamed rule keeps its obligations and delivered reminders.
    Column("lineage", String(RULE_ID_MAX)),
    # The rule id is unique per source, so two sources may use the same id without colliding.
    UniqueConstraint("source_id", "rule_id", "version"),
)

subscribers = Table(
    "subscribers",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("external_id", String(200), nullable=False, unique=True),
    Column("tenant", String(200), nullable=False),
    Column("email", Text),
    Column("webhook_url", Text),
    Column("timezone", String(100), nullable=False),
    Column("quiet_hours", String(20)),  # "HH:MM-HH:MM" in the subscriber's zone, or NULL
    Column("caldav_url", Text),  # the subscriber's CalDAV calendar collection (caldav channel)
    Column("apprise_target", Text),  # fills "{target}" in an apprise channel's service URL
    Column("active", Boolean, nullable=False, default=True),
)

subscriptions = Table(
    "subscriptions",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False),
    Column("subscriber_id", ForeignKey("subscribers.id"), nullable=False),
    Column("source_id", ForeignKey("sources.id"), nullable=False),
    Column("rule_patterns", Json, nullable=False),  # list of fnmatch patterns on rule_id
    # Each offset's nominal length in seconds (-P7D → -604800), sorted: what identifies a reminder.
    # The offsets as written (calendar days vs exact hours) come from the configuration's subscription.
    Column("offsets", Json, nullable=False),
    Column("channels", Json, nullable=False),  # list of channel names from the configuration
    Column("late_policy", String(20), nullable=False, default="send_latest"),  # send_latest | skip
    Column("active", Boolean, nullable=False, default=True),
    # Rule kinds (see rules.rule_kinds) to include / exclude; NULL = no filter.
    Column("kinds", Json),
    Column("exclude_kinds", Json),
    UniqueConstraint("name", "subscriber_id", "source_id"),
)

obligations = Table(
    "obligations",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("obligation_key", String(64), nullable=False, unique=True),
    Column("tenant", String(200), nullable=False),
    Column("subscriber_id", ForeignKey("subscribers.id"), nullable=False),
    Column("source_id", ForeignKey("sources.id"), nullable=False),
    Column("rule_id", String(RULE_ID_MAX), nullable=False),
    Column("rule_version", Integer, nullable=False),
    Column("period", String(64), nullable=False),
    Column("title", Text, nullable=False),
    Column("due_at", UtcDateTime, nullable=False),
    Column("status", String(20), nullable=False, default=ObligationState.ACTIVE),  # active | withdrawn
    Column("planned_at", UtcDateTime, nullable=False),
    # Incremented each time due_at really changes; corrections are keyed on it, so a re-plan never
    # sends a second correction for the same move.
    Column("revision", Integer, nullable=False, default=0),
    Column("previous_due_at", UtcDateTime),
    # Hash of everything the alert rows derive from (due, offsets, channels, zone, quiet hours): an
    # unchanged fingerprint lets a re-plan skip the obligation's alerts entirely.
    Column("fingerprint", String(64)),
    # The IANA zone-data version (``2026f``) and, for a rule rolled by a business-day calendar, the
    # calendar library (``holidays 0.109``) that planned ``due_at``: a change of either that moves
    # the instant is a revision whose correction names it (migration 0014). Likewise the recurrence
    # expansion engine (``python-dateutil 2.9.0.post0``) of an instant an RRULE or RDATE decided
    # (recurrence_engine.recurrence_engine_version; NULL for a one-off date; migration 0021).
    Column("zone_data", String(20)),
    Column("calendar_data", String(40)),
    Column("recurrence_engine", String(40)),
    Index(None, "due_at"),
    # A scoped re-plan's withdrawal reads the obligations of the changed rules only (migration 0016).
    Index(None, "source_id", "rule_id"),
)

alerts = Table(
    "alerts",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("obligation_id", ForeignKey("obligations.id"), nullable=False),
    Column("offset_seconds", Integer, nullable=False),  # negative: before the due instant
    Column("channel", String(100), nullable=False),
    Column("kind", String(20), nullable=False),  # reminder | correction | cancellation
    Column("dedup_key", String(64), nullable=False, unique=True),
    Column("send_at", UtcDateTime, nullable=False),
    # pending | claimed | retry_wait | delivered | escalated | cancelled | superseded | skipped
    # (AlertState, which documents each state and the lifecycle between them)
    Column("status", String(20), nullable=False, default=AlertState.PENDING),
    Column("status_reason", Text),
    Column("attempts", Integer, nullable=False, default=0),
    Column("next_attempt_at", UtcDateTime),
    Column("lease_owner", String(300)),
    Column("lease_expires_at", UtcDateTime),
    Column("provider_message_id", Text),
    Column("last_error", Text),
    Column("delivered_at", UtcDateTime),
    # A human's acknowledgement of an escalated alert (``deadline-pipeline acknowledge``); until then
    # the escalations_acknowledged check stays red.
    Column("acknowledged_at", UtcDateTime),
    Column("acknowledged_by", String(200)),
    # The last human who gave the alert a fresh attempt budget (``alerts retry``), and when.
    Column("retried_at", UtcDateTime),
    Column("retried_by", String(200)),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("revision", Integer, nullable=False, default=0),  # the obligation revision a correction reports
    Column("previous_due_at", UtcDateTime),  # corrections: the due instant before the move
    # The due instant this alert was planned for (a correction: the new instant). Part of the
    # identity: a reminder delivered for a deadline's old instant must not stand in for the one owed
    # for its new instant. NULL only in rows written by code that predates the column.
    Column("due_at", UtcDateTime),
    UniqueConstraint("obligation_id", "offset_seconds", "channel", "kind", "revision", "due_at",
                     name=conv("uq_alerts_identity")),  # the generated name exceeds PostgreSQL's 63 chars
    # No index leads with ``status``: every alert changes it twice on its way to delivered, and an
    # entry per change cost PostgreSQL ~100 µs per alert in a backlog sharing a send_at (migration
    # 0013, which has the measurement). The claim and the sensor read the partial claim index below.
)

# The claim's pick (delivery.claim_batch): the oldest claimable alerts by (send_at, id). This index
# gives them in that order across the three states, so a claim of n reads about n entries however
# many alerts are claimable; with only (status, send_at) PostgreSQL read and sorted every claimable
# row on every claim. Partial: delivered history, the bulk of the table, is not in it.
Index("ix_alerts_claimable_send_at_id", alerts.c.send_at, alerts.c.id,
      postgresql_where=alerts.c.status.in_(CLAIMABLE), sqlite_where=alerts.c.status.in_(CLAIMABLE))

# The watchdog's and the escalations_acknowledged check's question, oldest first: escalated alerts
# are few, and normal deliveries never write to this index.
Index("ix_alerts_escalated_updated_at_id", alerts.c.updated_at, alerts.c.id,
      postgresql_where=alerts.c.status == AlertState.ESCALATED, sqlite_where=alerts.c.status == AlertState.ESCALATED)

delivery_attempts = Table(
    "delivery_attempts",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("alert_id", ForeignKey("alerts.id"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("lease_owner", String(300), nullable=False),
    Column("started_at", UtcDateTime, nullable=False),
    Column("finished_at", UtcDateTime),
    Column("outcome", String(20)),  # sent | failed | unknown
    Column("provider_message_id", Text),
    Column("error", Text),
    Index(None, "alert_id"),
    # 60% of each page left free for the one update every row gets (its outcome), so that update is
    # heap-only (no new index entries): migration 0011, which has the measurement.
    postgresql_with={"fillfactor": 40},
)

heartbeats = Table(
    "heartbeats",
    metadata,
    Column("component", String(200), primary_key=True),
    Column("last_started_at", UtcDateTime),
    Column("last_completed_at", UtcDateTime),
    Column("last_outcome", String(20)),
    Column("detail", Text),
    # "live" (the real clock) or "replay" (a run with --as-of): only live heartbeats prove a running
    # pipeline, and a replay into a store that has them is refused unless forced.
    Column("clock", String(10), nullable=False, server_default="live"),
    # Set by the first completed run, never updated: where the plan partitions start by default.
    Column("first_completed_at", UtcDateTime),
    # The IANA zone-data version the component's process computed with (see zone_data): two
    # processes on different versions plan and check different instants.
    Column("zone_data", String(20)),
    # The holiday-calendar release it rolled business days with (holiday_calendars.calendar_data_version),
    # for the same reason.
    Column("calendar_data", String(40)),
    # The recurrence expansion engine it imports (recurrence_engine.recurrence_engine_version), for the
    # same reason: two python-dateutil releases may expand one RRULE to different dates (migration 0021).
    Column("recurrence_engine", String(40)),
    # name -> count of what the last completed run did that a check reads back (planning's gap-rule
    # fallbacks and override folds, plan_complete); NULL: none recorded (migration 0019).
    Column("counts", Json),
    # The store's clock minus the writing process's clock, in seconds, measured in the transaction
    # that wrote the heartbeat (health.beat); NULL for a replay (its clock is made up) or a heartbeat
    # of a release before it. A sweeper whose host clock runs hours behind claims nothing due, and
    # the checks judging by that clock stay green; clock_agrees reads this to see every host.
    Column("clock_offset_seconds", Float),
)
