"""The channel registry: which sender class serves which configuration entry.

It lives apart from :mod:`~deadline_pipeline.deliver.channels.base` because it names every concrete
channel while every concrete channel imports ``base`` for the idempotency classes; kept in ``base``
that made a circle through all of them.
"""

from __future__ import annotations

from deadline_pipeline.config import (
    AppriseChannel,
    CaldavChannel,
    MaildirChannel,
    SlackChannel,
    SmtpChannel,
    WebhookChannel,
)
from deadline_pipeline.deliver.channels.base import Channel


def build_channel(name: str, cfg, network=None) -> Channel:
    """The channel for one configuration entry.

    ``network``: the :class:`~deadline_pipeline.security.outbound.NetworkPolicy` every request of a
    network channel must pass (``None``: the default, globally routable addresses only).

    ``cfg``: a :class:`~deadline_pipeline.config.MaildirChannel`, :class:`~deadline_pipeline.config.SmtpChannel`,
    :class:`~deadline_pipeline.config.WebhookChannel`, :class:`~deadline_pipeline.config.SlackChannel`,
    :class:`~deadline_pipeline.config.CaldavChannel` or :class:`~deadline_pipeline.config.AppriseChannel`.
    Raises ``TypeError`` for anything else.
    Building opens no connection; credentials named in ``cfg`` are read at send time.
    """
    # Each sender is imported only when a channel of its kind is configured: a deployment loads the
    # third-party libraries of the channels it uses, not those of every channel.
    if isinstance(cfg, MaildirChannel):
        from deadline_pipeline.deliver.channels.maildir import MaildirSender

        return MaildirSender(name, cfg)
    if isinstance(cfg, SmtpChannel):
        from deadline_pipeline.deliver.channels.smtp import SmtpSender

        return SmtpSender(name, cfg)
    if isinstance(cfg, WebhookChannel):
        from deadline_pipeline.deliver.channels.webhook import WebhookSender

        return WebhookSender(name, cfg, network=network)
    if isinstance(cfg, SlackChannel):
        from deadline_pipeline.deliver.channels.slack import SlackSender

        return SlackSender(name, cfg, network=network)
    if isinstance(cfg, CaldavChannel):
        from deadline_pipeline.deliver.channels.caldav import CaldavSender

        return CaldavSender(name, cfg, network=network)
    if isinstance(cfg, AppriseChannel):
        from deadline_pipeline.deliver.channels.apprise_channel import AppriseSender

        return AppriseSender(name, cfg, network=network)
    raise TypeError(f"channel {name!r}: unsupported configuration {type(cfg).__name__}")
