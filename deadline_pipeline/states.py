"""The states of an alert and of an obligation, and the named sets of them the stages ask about.

A leaf module (it imports nothing of the package), so the store, every stage and the commands can
all import it without a cycle. The members are :class:`enum.StrEnum`: each *is* its stored string
(``AlertState.PENDING == "pending"``, ``str()``, f-strings and ``json.dumps`` give ``pending``), so
SQL comparisons, stored values and printed output are exactly those of the plain strings the
migrations wrote; no stored value changes.

Every set that means something to a stage is defined here, once, and named for what it means: two
copies of "open" that had drifted apart meant two different things (see :data:`OPEN` and
:data:`REVISABLE`). The sets are tuples, not frozensets, because they are rendered into SQL: a
tuple keeps ``status IN (...)`` the same text on every run (a frozenset's order follows the string
hash, which varies per process), and :data:`CLAIMABLE` must read like the claim index's predicate.
"""

from __future__ import annotations

import enum


class AlertState(enum.StrEnum):
    """Where an alert (a row of ``alerts``: a reminder, correction or cancellation notice on one
    channel) is on its way to the subscriber (DESIGN.md, "Alert lifecycle")::

        pending ──claim──▶ claimed ──sent──▶ delivered
                             │  ▲
                  failed,    │  │ next_attempt_at reached
                  retries    ▼  │
                  left     retry_wait
                             │
        claimed ──attempts exhausted, terminal failure or missed──▶ escalated
        pending ──obligation withdrawn──▶ cancelled
        pending ──due instant moved away──▶ superseded
        (planning) ──late at planning──▶ skipped

    Every state has a way out: ``claimed`` ends when its lease expires (it is claimable again), a
    sender that gives back an unsent claim returns it to ``pending`` (no attempt yet) or
    ``retry_wait``; planning revives a ``cancelled`` (withdrawn) or ``superseded`` (moved) reminder
    when the obligation or its instant comes back; an operator can queue an ``escalated``,
    ``cancelled`` or ``skipped`` alert again (``alerts retry``). A ``delivered`` alert is never
    rewritten: a later change of its deadline sends a correction alert instead.
    """

    #: Planned and waiting for its ``send_at``; no send attempt has been made.
    PENDING = "pending"
    #: Held by a sender under a lease (``lease_owner``, ``lease_expires_at``): being sent right now,
    #: or abandoned by a sender that died, in which case it is claimable again once the lease expires.
    CLAIMED = "claimed"
    #: At least one attempt failed and attempts are left: waits for ``next_attempt_at``.
    RETRY_WAIT = "retry_wait"
    #: Sent; the ``delivery_attempts`` row with outcome ``sent`` is its receipt. History, never rewritten.
    DELIVERED = "delivered"
    #: Given up loudly: attempts exhausted, a permanent failure, an unknown outcome on a booking
    #: channel, or a deadline already passed. Stays red until a human acknowledges it.
    ESCALATED = "escalated"
    #: Not to be sent: its obligation was withdrawn (reason prefixed ``withdrawn: ``) or an operator
    #: cancelled it (``alerts cancel``).
    CANCELLED = "cancelled"
    #: Not to be sent: planned for a due instant the obligation has since moved away from (reason
    #: prefixed ``deadline moved: ``).
    SUPERSEDED = "superseded"
    #: Not to be sent: its reminder time had already passed when it was planned, and the
    #: subscription's late policy (or a later reminder of the same deadline) says not to send it.
    SKIPPED = "skipped"


class ObligationState(enum.StrEnum):
    """Whether an obligation (one subscriber's deadline instance, a row of ``obligations``) is still
    asked for."""

    #: Planned from a rule in force that the subscriber's subscriptions select.
    ACTIVE = "active"
    #: The rule, subscription or subscriber no longer asks for it; kept (never deleted) with its
    #: alerts' history, and made active again if it comes back.
    WITHDRAWN = "withdrawn"


#: Still owed a send: the outbox has not finished with the alert. Exactly the states that are not
#: :data:`HANDLED`. What ``preview`` lists as a backlog, what the reconciliation calls in flight,
#: and the unexpected reminders the planning check reports (an open one would still be sent).
OPEN: tuple[AlertState, ...] = (AlertState.PENDING, AlertState.RETRY_WAIT, AlertState.CLAIMED)

#: The states the claim may take an alert in; the claim adds the lease (free or expired) and the due
#: instants (``send_at``, ``next_attempt_at``), see ``store.delivery.claimable``. The same members as
#: :data:`OPEN` (an open alert is the claim's to send, a ``claimed`` one once its lease has expired),
#: named apart because it is a different question: which rows the claim index holds. In the order of
#: that index's predicate (migration 0012), so the model and the migration render the same SQL.
CLAIMABLE: tuple[AlertState, ...] = OPEN

#: Nothing more is owed: the outbox is done with the alert (sent, given up loudly, or decided not to
#: send). A handled alert past its ``send_at`` is not overdue. Not all of them are for ever: see
#: :data:`RETRYABLE` and the revivals in :class:`AlertState`.
HANDLED: tuple[AlertState, ...] = (AlertState.DELIVERED, AlertState.ESCALATED, AlertState.CANCELLED,
                                   AlertState.SUPERSEDED, AlertState.SKIPPED)

#: May still be revised by planning or cancelled by an operator: nothing was delivered and no sender
#: holds it. A re-plan moves such a reminder's ``send_at``, supersedes it when the deadline moved to
#: another instant, and cancels it when its obligation is withdrawn; ``alerts cancel`` cancels it.
#: Not :data:`OPEN`: a ``claimed`` alert is a sender's (it finishes, then a correction or
#: cancellation notice follows), and a ``skipped`` one is included because a re-plan can still move
#: it, or cancel it with its obligation.
REVISABLE: tuple[AlertState, ...] = (AlertState.PENDING, AlertState.RETRY_WAIT, AlertState.SKIPPED)

#: The states planning gives a reminder it writes (``plan.planner.fold_late``): ``pending``, or
#: ``skipped`` when its time had already passed.
PLANNED: tuple[AlertState, ...] = (AlertState.PENDING, AlertState.SKIPPED)

#: What an operator can queue again with a fresh attempt budget (``alerts retry``): the alerts the
#: outbox stopped on without sending. Not ``delivered`` (never resent) nor ``superseded`` (planned for
#: an instant the deadline no longer has).
RETRYABLE: tuple[AlertState, ...] = (AlertState.ESCALATED, AlertState.CANCELLED, AlertState.SKIPPED)

#: Open and held by no sender: no send has begun, so planning can still take it back (a cancellation
#: notice of a deadline its source restored before the notice went out).
UNSENT: tuple[AlertState, ...] = (AlertState.PENDING, AlertState.RETRY_WAIT)

#: Reached the subscriber, or is being sent to them right now (a sender holds it): a cancellation
#: notice in one of them is followed by a correction when its deadline is restored.
SENT_OR_SENDING: tuple[AlertState, ...] = (AlertState.DELIVERED, AlertState.CLAIMED)

__all__ = ["AlertState", "ObligationState", "OPEN", "CLAIMABLE", "HANDLED", "REVISABLE", "PLANNED", "RETRYABLE",
           "UNSENT", "SENT_OR_SENDING"]
