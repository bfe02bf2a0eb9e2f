"""The delivery sweep without Dagster: claim a leased batch, send each alert, record the result.

At-least-once with idempotency keys: an alert whose send outcome is unknown is retried with the same
dedup key (SMTP Message-ID, webhook Idempotency-Key). One bad alert fails alone; the rest go out.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from deadline_pipeline.config import DeadlinesConfig
from deadline_pipeline.deliver.channels.base import build_channel
from deadline_pipeline.deliver.notification import DeliveryError, Notification
from deadline_pipeline.store import delivery as sql

log = logging.getLogger(__name__)


def lease_owner(run_id: str | None = None) -> str:
    """``hostname#pid#run``: who holds a lease, readable by a human in the alerts table."""
    return f"{socket.gethostname()}#{os.getpid()}#{run_id or 'cli'}"


def backoff_seconds(attempt: int, *, base: float, cap: float, rng: Callable[[], float] = random.random) -> float:
    """Delay before retry number ``attempt`` (1-based), in seconds: ``min(cap, base * 2**(attempt-1))``
    scaled by a jitter in [0.5, 1.0) so that alerts failed together do not retry together."""
    return min(cap, base * 2 ** max(0, attempt - 1)) * (0.5 + rng() / 2)


@dataclass
class SweepOutcome:
    """Counts of one sweep run."""

    claimed: int = 0
    delivered: int = 0
    failed: int = 0
    escalated: int = 0
    lease_lost: int = 0
    batches: int = 0
    lateness_seconds: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _notification(row: dict, sent_at: datetime) -> Notification:
    payload = row.get("payload") or {}
    return Notification(
        dedup_key=row["dedup_key"], kind=row["kind"], subscriber_id=row["subscriber"], email=row["email"],
        webhook_url=row["webhook_url"], subscriber_tz=row["timezone"], source=row["source"],
        rule_id=row["rule_id"], title=row["title"], due_at=row["due_at"], offset_seconds=row["offset_seconds"],
        url=payload.get("url"), note=payload.get("note"), previous_due_at=None, sent_at=sent_at,
    )


def sweep(engine: Engine, cfg: DeadlinesConfig, now: datetime, *, owner: str | None = None,
          clock: Callable[[], datetime] | None = None, max_batches: int | None = None) -> SweepOutcome:
    """Deliver every alert claimable at ``now`` (aware UTC), in batches of ``delivery.batch_size``,
    until nothing is claimable or ``delivery.time_budget_seconds`` of wall time is spent.

    ``clock`` gives "now" for each batch (default: ``now`` for a replayed instant, the real clock
    otherwise is the caller's choice). Never raises for one alert's failure.
    """
    d = cfg.delivery
    owner = owner or lease_owner()
    clock = clock or (lambda: now)
    out = SweepOutcome()
    channels: dict = {}
    deadline = time.monotonic() + d.time_budget_seconds
    try:
        while time.monotonic() < deadline and (max_batches is None or out.batches < max_batches):
            t = clock()
            with engine.begin() as conn:
                ids = sql.claim_batch(conn, owner=owner, now=t, lease_seconds=d.lease_seconds, limit=d.batch_size)
                rows = sql.load_claimed(conn, ids)
            if not ids:
                break
            out.batches += 1
            out.claimed += len(ids)
            for row in rows:
                _deliver_one(engine, cfg, row, owner, clock, channels, out)
    finally:
        for ch in channels.values():
            try:
                ch.close()
            except Exception:  # closing must not hide the sweep's own result
                log.warning("closing channel failed", exc_info=True)
    return out


def _deliver_one(engine: Engine, cfg: DeadlinesConfig, row: dict, owner: str,
                 clock: Callable[[], datetime], channels: dict, out: SweepOutcome) -> None:
    d = cfg.delivery
    attempt_no = row["attempts"] + 1
    with engine.begin() as conn:
        attempt_id = sql.start_attempt(conn, alert_id=row["id"], attempt=attempt_no, owner=owner, now=clock())
    error: DeliveryError | None = None
    provider_id = None
    try:
        if row["channel"] not in cfg.channels:
            raise DeliveryError(f"channel {row['channel']!r} is no longer configured", permanent=True,
                                outcome="failed")
        if row["channel"] not in channels:
            channels[row["channel"]] = build_channel(row["channel"], cfg.channels[row["channel"]])
        provider_id = channels[row["channel"]].send(_notification(row, clock())).provider_message_id
    except DeliveryError as exc:
        error = exc
    except Exception as exc:  # a template or data bug in one alert must not stop the sweep
        log.exception("alert %s: unexpected error while sending", row["id"])
        error = DeliveryError(f"{exc.__class__.__name__}: {exc}", permanent=False, outcome="failed")

    t = clock()
    with engine.begin() as conn:
        if error is None:
            sql.finish_attempt(conn, attempt_id, now=t, outcome="sent", provider_message_id=provider_id)
            if sql.mark_delivered(conn, row["id"], owner=owner, now=t, provider_message_id=provider_id):
                out.delivered += 1
                out.lateness_seconds.append((t - row["send_at"]).total_seconds())
            else:
                out.lease_lost += 1
                log.warning("alert %s: sent, but the lease was taken over; the new owner's state stands",
                            row["id"])
            return
        sql.finish_attempt(conn, attempt_id, now=t, outcome=error.outcome, error=str(error))
        escalate = error.permanent or attempt_no >= d.max_attempts
        delay = backoff_seconds(attempt_no, base=d.backoff_base_seconds, cap=d.backoff_cap_seconds)
        if error.retry_after:
            delay = max(delay, error.retry_after)
        ok = sql.mark_failed(conn, row["id"], owner=owner, now=t, error=str(error),
                             next_attempt_at=t + timedelta(seconds=delay), escalate=escalate)
    if not ok:
        out.lease_lost += 1
        return
    out.failed += 1
    out.errors.append(f"alert {row['id']}: {error}")
    if escalate:
        out.escalated += 1
        log.error("alert %s escalated after %d attempt(s) (%s): %s", row["id"], attempt_no,
                  "permanent error" if error.permanent else "attempts exhausted", error)
    else:
        log.warning("alert %s: attempt %d failed (%s), retry in %.0fs: %s", row["id"], attempt_no,
                    error.outcome, delay, error)


def utcnow() -> datetime:
    return datetime.now(UTC)
