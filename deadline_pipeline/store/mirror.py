"""SQL of the configuration mirror: the subscribers and subscriptions of the configuration written
into the store, a page at a time, and the reads that judge a subscriber list before it is applied
(who is active, who is still owed a reminder).

Separate from the rest of planning's statements because it runs before planning, in its own
transaction, and touches only ``subscribers`` and ``subscriptions`` (plus one read of open alerts):
nothing here knows about staging, chunks or the obligations' merge. Re-running it with the same
configuration changes no row.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from sqlalchemy import (
    Connection,
    select,
    update,
)

from deadline_pipeline.states import OPEN, ObligationState
from deadline_pipeline.store.schema import (
    alerts,
    obligations,
    subscribers,
    subscriptions,
)
from deadline_pipeline.store.upsert import pages, upsert

SUBSCRIBER_FIELDS = ["tenant", "email", "webhook_url", "timezone", "quiet_hours", "active", "caldav_url",
                     "apprise_target"]
SUBSCRIPTION_FIELDS = ["rule_patterns", "offsets", "channels", "late_policy", "active", "kinds", "exclude_kinds"]


def _differing(rows: list[dict], stored: dict, key, fields: list[str]) -> list[dict]:
    """The rows that are not stored yet or differ from the stored row in one of ``fields``
    (``stored``: key → row): an unchanged configuration is a read, not even a locking upsert."""
    out = []
    for r in rows:
        have = stored.get(key(r))
        if have is None or any(have[f] != r.get(f) for f in fields):
            out.append(r)
    return out


# Rows compared and written per page by the mirror: the configuration's rows are built, compared
# with their stored rows and upserted a page at a time, so syncing 20,000 subscribers does not hold
# every row three times over (as built, as stored, as differing); held whole, they lifted a plan's
# memory by 28 MiB, 16 of which it kept for the rest of the run.
MIRROR_PAGE = 2_000


def sync_subscribers(conn: Connection, rows: Iterable[dict], keep: Collection[str] = ()) -> dict[str, int]:
    """Upsert subscribers (``external_id, tenant, email, webhook_url, timezone, quiet_hours`` and
    optionally ``caldav_url, apprise_target``), read from ``rows`` a page of :data:`MIRROR_PAGE` at
    a time; subscribers absent from ``rows`` become inactive (never deleted), except those whose
    external id is in ``keep`` (held by the planning guard: they stay as stored). Returns
    external_id → id of the subscribers in ``rows``."""
    wanted: set[str] = set()
    for page in pages(rows, MIRROR_PAGE):
        for r in page:
            r.setdefault("active", True)
            r.setdefault("caldav_url", None)
            r.setdefault("apprise_target", None)
        ids = [r["external_id"] for r in page]
        wanted.update(ids)
        stored = {r.external_id: r._mapping
                  for r in conn.execute(select(subscribers).where(subscribers.c.external_id.in_(ids)))}
        upsert(conn, subscribers, _differing(page, stored, lambda r: r["external_id"], SUBSCRIBER_FIELDS),
               conflict=["external_id"], update=SUBSCRIBER_FIELDS, count=False)
    out: dict[str, int] = {}
    gone = []
    for i, ext, active in conn.execute(select(subscribers.c.id, subscribers.c.external_id, subscribers.c.active)):
        if ext in wanted:
            out[ext] = i
        elif active and ext not in keep:
            gone.append(i)
    for part in pages(gone, 500):
        conn.execute(update(subscribers).where(subscribers.c.id.in_(part)).values(active=False))
    return out


def sync_subscriptions(conn: Connection, rows: Iterable[dict], keep_subscribers: Collection[int] = ()) -> None:
    """Upsert subscription rows (``name, subscriber_id, source_id, rule_patterns, offsets, channels,
    late_policy``, optional ``kinds`` / ``exclude_kinds``), read from ``rows`` a page of
    :data:`MIRROR_PAGE` at a time; rows absent from ``rows`` become inactive, except those of the
    subscriber ids in ``keep_subscribers`` (held subscribers keep what they were planned with)."""
    keep_subscribers = set(keep_subscribers)

    def key(r):
        return r["name"], r["subscriber_id"], r["source_id"]

    wanted: set[tuple[str, int, int]] = set()
    for page in pages(rows, MIRROR_PAGE):
        for r in page:
            r.setdefault("active", True)
            r.setdefault("kinds", None)
            r.setdefault("exclude_kinds", None)
        wanted.update(key(r) for r in page)
        # A subscriber's other subscriptions may be on another page: they are read there too, and
        # only the keys of this page's rows are looked up.
        who = sorted({r["subscriber_id"] for r in page})
        stored = {key(r._mapping): r._mapping
                  for r in conn.execute(select(subscriptions).where(subscriptions.c.subscriber_id.in_(who)))}
        upsert(conn, subscriptions, _differing(page, stored, key, SUBSCRIPTION_FIELDS),
               conflict=["name", "subscriber_id", "source_id"], update=SUBSCRIPTION_FIELDS, count=False)
    active = conn.execute(select(subscriptions.c.id, subscriptions.c.name, subscriptions.c.subscriber_id,
                                 subscriptions.c.source_id).where(subscriptions.c.active.is_(True)))
    gone = [i for i, name, subscriber_id, source_id in active
            if (name, subscriber_id, source_id) not in wanted and subscriber_id not in keep_subscribers]
    for part in pages(gone, 500):
        conn.execute(update(subscriptions).where(subscriptions.c.id.in_(part)).values(active=False))


def active_subscriber_ids(conn: Connection) -> dict[str, int]:
    """external_id → id of every active subscriber."""
    return {ext: i for i, ext in conn.execute(select(subscribers.c.id, subscribers.c.external_id)
                                              .where(subscribers.c.active.is_(True)))}


def subscribers_owed_reminders(conn: Connection) -> set[str]:
    """external_id of every active subscriber with an active obligation that has a reminder still
    to send (an alert in :data:`~deadline_pipeline.states.OPEN`): who would lose a reminder if
    withdrawn now."""
    o = obligations
    query = (select(subscribers.c.external_id).distinct()
             .join(o, o.c.subscriber_id == subscribers.c.id)
             .join(alerts, alerts.c.obligation_id == o.c.id)
             .where(subscribers.c.active.is_(True), o.c.status == ObligationState.ACTIVE,
                    alerts.c.status.in_(OPEN)))
    return set(conn.execute(query).scalars())
