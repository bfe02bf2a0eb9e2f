"""Deterministic keys: the idempotency of planning and delivery (pure).

``obligation_key`` hashes (tenant, subscriber, source, rule_id, period). DESIGN.md names
(tenant, rule_id, period); the subscriber is added because an obligation belongs to one subscriber —
without it, two subscribers of one tenant would share one obligation and one alert row, and one of
them would never be told. The source is added because rule ids are unique per source only.
``period`` is the occurrence's original local start, so a revised time does not change the key; a
RECURRENCE-ID override is keyed on its master's rule id and the start of the occurrence it replaces
(``planner.occurrence_identity``), so an override moves that occurrence.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

_SEP = "\x1f"  # unit separator: cannot occur in ids, so ("a", "bc") and ("ab", "c") never collide


def _digest(*parts: object) -> str:
    # Hot path: planning hashes one key per alert (about a million on a large plan).
    return hashlib.sha256(_SEP.join(map(str, parts)).encode("utf-8")).hexdigest()


def obligation_key(tenant: str, subscriber: str, source: str, rule_id: str, period: str) -> str:
    """64 hex chars identifying one obligation across re-plans."""
    return _digest("obligation", tenant, subscriber, source, rule_id, period)


def retired_key(key: str, obligation_id: int) -> str:
    """64 hex chars no planning run computes: the key a withdrawn obligation (``obligation_id``) is
    given when the obligation re-keyed to its ``key`` takes it (``override_keys.rekey_legacy_overrides``),
    so the key stays unique and the withdrawn one keeps its history."""
    return _digest("retired", key, obligation_id)


def alert_dedup_key(obligation_key: str, offset_seconds: int, channel: str, kind: str, seq: int = 0,
                    due_at: datetime | None = None) -> str:
    """64 hex chars: the idempotency key of one alert (SMTP Message-ID, webhook Idempotency-Key).

    ``due_at`` (aware UTC): the due instant a reminder is planned for. A reminder is owed per due
    instant, so the reminder for a moved deadline's new instant is a different alert (and message)
    from the one delivered for its old instant; moving back to the old instant finds the old key.
    """
    if due_at is None:
        return _digest("alert", obligation_key, offset_seconds, channel, kind, seq)
    return _digest("alert", obligation_key, offset_seconds, channel, kind, seq,
                   due_at.astimezone(UTC).isoformat())


def reminder_dedup_keys(obligation_key: str, due_at: datetime, slots: list[tuple]) -> list[str]:
    """:func:`alert_dedup_key` of the reminders ``slots`` (tuples starting ``offset_seconds, channel``) of one
    obligation due at ``due_at`` (aware), in order: the same keys, with the shared prefix and the
    instant formatted once per obligation instead of once per alert (the hot path of a large plan)."""
    head = _SEP.join(("alert", obligation_key))
    tail = _SEP.join(("reminder", "0", due_at.astimezone(UTC).isoformat()))
    sha = hashlib.sha256
    return [sha(f"{head}{_SEP}{seconds}{_SEP}{channel}{_SEP}{tail}".encode()).hexdigest()
            for seconds, channel, *_ in slots]
