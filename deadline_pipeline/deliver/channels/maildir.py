"""Deliver alerts as e-mail files into a local Maildir folder (stdlib :mod:`mailbox`).

Useful for a single-user setup read by a local mail client, and for tests. Semantics are
at-least-once: a resend adds another file, with the same ``Message-ID`` (derived from the dedup key),
so a mail client can fold the copies.
"""

from __future__ import annotations

import dataclasses
import mailbox
import os
from pathlib import Path

from deadline_pipeline.addresses import AddressError, wire_address
from deadline_pipeline.config import MaildirChannel
from deadline_pipeline.deliver.channels.base import IDEMPOTENCY_NOTIFICATION
from deadline_pipeline.deliver.notification import DeliveryError, Notification, SendResult
from deadline_pipeline.deliver.render import RenderError, build_email, mail_options


class MaildirSender:
    """Channel writing to the Maildir at ``cfg.path`` (created with its parents when missing).

    ``send`` returns the maildir key as ``provider_message_id``. Raises :class:`DeliveryError`:
    permanent for an unrenderable alert or a path that cannot be a Maildir (permission denied, a
    file in the way); retryable ``"failed"`` for other OS errors (disk full).
    """

    idempotency_class = IDEMPOTENCY_NOTIFICATION

    def __init__(self, name: str, cfg: MaildirChannel) -> None:
        self.name = name
        self.path = Path(cfg.path)
        self.sender = cfg.sender
        self.cfg = cfg

    def send(self, n: Notification) -> SendResult:
        try:
            # IDNA domain in the To header: an encoded word there is not an address. (No address at
            # all is reported by build_email, naming the alert's dedup key.)
            wire = wire_address(n.email) if n.email else None
            msg = build_email(dataclasses.replace(n, email=wire.address) if wire else n, self.sender,
                              **mail_options(self.cfg))
        except AddressError as exc:
            raise DeliveryError(f"channel {self.name!r}: {exc}", permanent=True) from exc
        except RenderError as exc:
            raise DeliveryError(str(exc), permanent=True) from exc
        # Maildir files use the local line ending; the SMTP policy's CRLF would leave stray CRs
        # in every line a mail client reads from the file. A non-ASCII local part is written as
        # UTF-8 (RFC 6532): a file needs no SMTPUTF8 session.
        data = msg.as_bytes(policy=msg.policy.clone(linesep="\n", utf8=bool(wire and wire.needs_smtputf8)))
        try:
            os.makedirs(self.path.parent, exist_ok=True)
            box = mailbox.Maildir(self.path, create=True)
            key = box.add(data)
        except (PermissionError, NotADirectoryError, FileExistsError) as exc:
            raise DeliveryError(
                f"channel {self.name!r}: maildir {self.path} is not writable: {exc}", permanent=True
            ) from exc
        except OSError as exc:
            # Maildir writes into tmp/ and renames into new/, so a failure leaves no visible message.
            raise DeliveryError(
                f"channel {self.name!r}: cannot write to maildir {self.path}: {exc}", permanent=False
            ) from exc
        return SendResult(provider_message_id=key)

    def close(self) -> None:
        """Nothing to release: every send opens the folder afresh."""
