"""The alert rows planning writes to tell a subscriber about a change rather than to remind them:
corrections (a deadline moved; one restored after its cancellation), reminders left for the delivery
sweep to escalate as missed (a deadline moved into the past, or one that passed while its source was
not fetched), cancellation notices, and the reasons these rows carry. Pure: rows are dicts in the
``alerts`` table's columns, written by the caller (``store.notice_rows.insert_notices``)."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from deadline_pipeline.instants import instant_text
from deadline_pipeline.plan.first_seen import FirstSeenPassed
from deadline_pipeline.plan.keys import alert_dedup_key, reminder_dedup_keys
from deadline_pipeline.plan.planner import PlannedObligation
from deadline_pipeline.states import AlertState
from deadline_pipeline.wording import MOVE_CAUSE

# The status reason of a cancellation notice not sent because its deadline came back first.
RESTORED_BEFORE_NOTICE = "withdrawn: the source published the deadline again before this notice went out"


def restored_row(obligation_id: int, key: str, channel: str, revision: int, due: datetime, now: datetime) -> dict:
    """The alert row of a correction saying a deadline (due ``due``, aware UTC) stands again after a
    cancellation notice of its withdrawal went out on ``channel``; one per revision and channel, as
    the cancellation notices are, so a re-plan never writes a second one."""
    row = correction_row(obligation_id, key, channel, revision, due, due, now)
    row.update(dedup_key=alert_dedup_key(key, 0, channel, "restored", revision), previous_due_at=None,
               status_reason=f"deadline restored at {instant_text(due)} after a cancellation notice was delivered"
                             f"{MOVE_CAUSE}its source withdrew it and published it again: it is due as before")
    return row


def moved_reason(reason: str | None, old_due: datetime | None) -> str | None:
    """A moved deadline's late reminders say why they are late (the move, not the planning run)."""
    if old_due is not None and reason and reason.startswith("late at planning"):
        return f"deadline moved from {instant_text(old_due)}" + reason[len("late at planning"):]
    return reason


def time_data_cause(stored: dict, ob: PlannedObligation) -> str | None:
    """Why obligation ``ob`` moved although its rule did not: ``stored`` is the obligation as it was
    (``rule_version``, ``zone_data``, ``calendar_data``, ``recurrence_engine``:
    :class:`~deadline_pipeline.store.merge.StagedDiff` ``moved``). Returns e.g. "the time-zone rules of
    America/Vancouver changed (IANA 2025b → 2026f)", the working-day calendar's upgrade, the
    recurrence engine's upgrade ("the recurrence engine changed (python-dateutil 2.8.2 →
    python-dateutil 2.9.0.post0)"), those that differ joined by "; ", or ``None`` (the rule changed,
    or no recorded version did: a NULL is "planned before versions were recorded" or "not decided by
    that input", not a version)."""
    if stored.get("rule_version") != ob.rule_version:
        return None
    causes = []
    old_zone, old_cal = stored.get("zone_data"), stored.get("calendar_data")
    # Only an IANA zone has rules that change; a fixed offset (AoE, UTC-12) means the same everywhere.
    if old_zone and ob.zone_data and old_zone != ob.zone_data and isinstance(ob.tz, ZoneInfo):
        causes.append(f"the time-zone rules of {ob.zone} changed (IANA {old_zone} → {ob.zone_data})")
    if old_cal and ob.calendar_data and old_cal != ob.calendar_data:
        causes.append(f"the working-day calendar changed ({old_cal} → {ob.calendar_data})")
    old_engine = stored.get("recurrence_engine")
    if old_engine and ob.recurrence_engine and old_engine != ob.recurrence_engine:
        causes.append(f"the recurrence engine changed ({old_engine} → {ob.recurrence_engine})")
    return "; ".join(causes) or None


def cancellation_row(obligation_id: int, key: str, channel: str, revision: int, due: datetime, now: datetime) -> dict:
    """The alert row of one cancellation notice ("no further reminders") for an obligation due ``due``
    (aware UTC) that its source withdrew or moved after a reminder was delivered on ``channel``;
    keyed on the obligation's revision, so a re-plan never sends a second one."""
    return dict(
        obligation_id=obligation_id, offset_seconds=0, channel=channel, kind="cancellation", revision=revision,
        due_at=due, dedup_key=alert_dedup_key(key, 0, channel, "cancellation", revision), send_at=now,
        status=AlertState.PENDING, attempts=0, created_at=now, updated_at=now,
        status_reason="the source withdrew or moved this occurrence after a reminder was delivered",
    )


def correction_row(obligation_id: int, key: str, channel: str, revision: int, old_due: datetime,
                   new_due: datetime, now: datetime, *, cause: str | None = None) -> dict:
    """The alert row of one correction ("moved from ``old_due`` to ``new_due``", both aware UTC),
    keyed on the obligation's revision so a re-plan never sends a second one for the same move. A
    move into the past says so: the new instant has passed, so no reminder for it will follow.
    ``cause``: why it moved when its rule did not (:func:`time_data_cause`), after
    :data:`~deadline_pipeline.wording.MOVE_CAUSE`, which the message shows as "Why: …"."""
    passed = "; the new instant has already passed" if new_due <= now else ""
    passed += f"{MOVE_CAUSE}{cause}" if cause else ""
    return dict(
        obligation_id=obligation_id, offset_seconds=0, channel=channel, kind="correction", revision=revision,
        dedup_key=alert_dedup_key(key, 0, channel, "correction", revision), send_at=now, due_at=new_due,
        status=AlertState.PENDING, previous_due_at=old_due, attempts=0, created_at=now, updated_at=now,
        status_reason=f"deadline moved from {instant_text(old_due)} to {instant_text(new_due)} after a reminder "
                      f"was delivered{passed}",
    )


# Why a deadline moved into the past leaves a pending reminder rather than an escalated one: the
# delivery sweep escalates a reminder whose deadline passed more than DEADLINE_PASSED_GRACE before it
# could be sent ("missed: …"), with the ERROR log, the notice to the escalation channels, the
# `escalations` heartbeat and a red escalations_acknowledged that every other miss gets. Marking the
# alert escalated here would skip the notice (nobody would be told), and a state of its own would be
# one no check or watchdog row knows. Before, the old instant's reminders were superseded and, with
# none delivered, nothing else was written: the subscriber never heard of the move, and every check
# stayed green.
MOVED_INTO_PAST = "the deadline moved to an instant already past before any reminder was delivered on this channel"


def missed_row(obligation_id: int, key: str, channel: str, offset_seconds: int, old_due: datetime | None,
               new_due: datetime, now: datetime, why: str | None = None) -> dict:
    """The alert row of a reminder for ``new_due`` (aware UTC, already past at ``now``), due at once,
    that the delivery sweep escalates as missed: one per channel of an obligation moved into the past
    from ``old_due`` with no reminder delivered there (:data:`MOVED_INTO_PAST`), or, with ``old_due``
    None, of a deadline that passed while its source was not fetched (``why``: the gap,
    :data:`PASSED_UNWATCHED`). ``offset_seconds``: the latest offset the channel has (the reminder
    nearest the deadline); keyed like the reminder planning would have written for that offset and
    instant, so a re-plan never writes a second one."""
    (dedup,) = reminder_dedup_keys(key, new_due, [(offset_seconds, channel)])
    if why is None:
        why = f"deadline moved from {instant_text(old_due)} to {instant_text(new_due)}: {MOVED_INTO_PAST}"
    return dict(
        obligation_id=obligation_id, offset_seconds=offset_seconds, channel=channel, kind="reminder", revision=0,
        dedup_key=dedup, send_at=now, due_at=new_due, status=AlertState.PENDING, previous_due_at=old_due,
        attempts=0, created_at=now, updated_at=now, status_reason=f"{why}; escalated as missed by the delivery sweep",
    )


# The reason of a reminder left for the sweep to escalate because its deadline passed while the
# source was not fetched (plan.first_seen: MISSED_UNWATCHED). Before, such a rule was stored as a
# version and nothing else: no obligation, no alert, every check green. The sweep keeps the reason.
PASSED_UNWATCHED = "first seen after it had passed, while its source was not fetched"


def passed_unwatched_reason(judged: FirstSeenPassed) -> str:
    """The alert reason naming the gap: ``"first seen after ...: no successful fetch of source X
    between A and B; deadline D at T passed in that gap"``."""
    return f"{PASSED_UNWATCHED}: {judged.describe()}"
