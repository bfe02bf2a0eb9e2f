"""The channel interface every sender implements.

Which class serves which configuration entry is :func:`~deadline_pipeline.deliver.channels.registry.build_channel`;
this module imports no concrete channel, so each of them can import it without a cycle.

A channel sends one :class:`~deadline_pipeline.deliver.notification.Notification` at a time and
either returns a :class:`~deadline_pipeline.deliver.notification.SendResult` or raises
:class:`~deadline_pipeline.deliver.notification.DeliveryError`; it touches no database. Retrying,
leases and escalation belong to the sweep. A channel may also offer ``async send_async(n)`` and
``async aclose()`` (the webhook channel does); the sweep then sends on its event loop instead of a
worker thread.

Idempotency classes: what the sweep may do when it does not know whether a send landed (a timeout
after the request left, or a crash between the send and recording its result, found later as an
attempt row with a start and no outcome whose lease has expired):

``"notification"``
    Receiving the same alert twice is harmless and recognisable: every copy carries the alert's
    dedup key (SMTP ``Message-ID``, webhook ``Idempotency-Key`` and ``webhook-id``, the reference
    line of a chat message). After an unknown outcome the sweep resends with the same key; the
    receiver can drop the duplicate. Maildir, SMTP, webhook, slack and apprise are this class.

``"booking"``
    A send has a permanent effect (it books, pays, files, creates a calendar event) and a duplicate
    is a real harm. After an unknown outcome the sweep never resends blindly. A booking channel that
    can ask its provider offers ``resolve_unknown(n) -> SendResult | None``, called by the sweep
    before anything else on an alert whose previous attempt has no recorded outcome:

    * a :class:`SendResult`: the provider holds the effect; the alert is recorded ``delivered`` with
      that result (e.g. the calendar event's ETag) and nothing is sent;
    * ``None``: the provider proves the effect absent; the alert is sent again with the same key;
    * an exception: the lookup was impossible; the alert is ``escalated``.

    A booking channel without ``resolve_unknown`` gets the conservative rule: the alert becomes
    ``escalated`` with the reason, is logged at ERROR and announced on the escalation channels
    (terminal and loud; a human decides). The caldav channel is of this class and resolves.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from deadline_pipeline.deliver.notification import Notification, SendResult

IDEMPOTENCY_NOTIFICATION = "notification"
IDEMPOTENCY_BOOKING = "booking"
IDEMPOTENCY_CLASSES = (IDEMPOTENCY_NOTIFICATION, IDEMPOTENCY_BOOKING)


@runtime_checkable
class Channel(Protocol):
    """A delivery channel.

    ``name``: the channel's key in the configuration's ``channels`` mapping.
    ``idempotency_class``: ``"notification"`` or ``"booking"`` (see the module docstring).
    ``send(n)``: deliver one alert; returns :class:`SendResult`, raises :class:`DeliveryError`.
    ``close()``: release connections; the channel is not used afterwards.
    """

    name: str
    idempotency_class: str

    def send(self, n: Notification) -> SendResult: ...

    def close(self) -> None: ...
