"""The channel interface every sender implements, and :func:`build_channel` from the configuration.

A channel sends one :class:`~deadline_pipeline.deliver.notification.Notification` at a time and
either returns a :class:`~deadline_pipeline.deliver.notification.SendResult` or raises
:class:`~deadline_pipeline.deliver.notification.DeliveryError`; it touches no database. Retrying,
leases and escalation belong to the sweep, which decides from ``idempotency_class``:

``"notification"``
    Receiving the same alert twice is harmless and recognisable: every copy carries the alert's
    dedup key (SMTP ``Message-ID``, webhook ``Idempotency-Key``). After an ``"unknown"`` outcome the
    sweep may resend; the receiver can drop the duplicate. Maildir, SMTP and webhook are this class.

``"booking"``
    A send has a permanent effect (it books, pays, files something) and a duplicate is a real harm.
    After an ``"unknown"`` outcome it must never be resent blindly; the sweep escalates to a human
    (or first asks the provider whether the key was seen). No built-in channel is of this class.
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


def build_channel(name: str, cfg) -> Channel:
    """The channel for one configuration entry.

    ``cfg``: a :class:`~deadline_pipeline.config.MaildirChannel`, :class:`~deadline_pipeline.config.SmtpChannel`
    or :class:`~deadline_pipeline.config.WebhookChannel`. Raises ``TypeError`` for anything else.
    Building opens no connection; credentials named in ``cfg`` are read at send time.
    """
    from deadline_pipeline.config import MaildirChannel, SmtpChannel, WebhookChannel

    if isinstance(cfg, MaildirChannel):
        from deadline_pipeline.deliver.channels.maildir import MaildirSender

        return MaildirSender(name, cfg)
    if isinstance(cfg, SmtpChannel):
        from deadline_pipeline.deliver.channels.smtp import SmtpSender

        return SmtpSender(name, cfg)
    if isinstance(cfg, WebhookChannel):
        from deadline_pipeline.deliver.channels.webhook import WebhookSender

        return WebhookSender(name, cfg)
    raise TypeError(f"channel {name!r}: unsupported configuration {type(cfg).__name__}")
