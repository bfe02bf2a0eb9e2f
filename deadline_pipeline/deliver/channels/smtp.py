"""Deliver alerts through an SMTP server (stdlib :mod:`smtplib`).

One connection per alert: a broken connection then costs one alert, and the phase the failure
happened in is known exactly, which decides the outcome:

* before ``DATA`` (connect, greeting, STARTTLS, AUTH, ``MAIL FROM``, ``RCPT TO``): the server has not
  taken the message, so the outcome is ``"failed"``; a 5xx reply is permanent, a 4xx reply or a
  refused/broken connection is retryable;
* after ``DATA`` was issued: a disconnect or timeout leaves the outcome ``"unknown"`` (the server may
  have queued the message before the reply was lost); an explicit 4xx/5xx reply to the data is
  ``"failed"``.

The ``Message-ID`` is derived from the dedup key, so a resend after ``"unknown"`` is recognisable as
the same mail; it is also the ``provider_message_id``.
"""

from __future__ import annotations

import os
import smtplib
import ssl

from deadline_pipeline.config import SmtpChannel
from deadline_pipeline.deliver.channels.base import IDEMPOTENCY_NOTIFICATION
from deadline_pipeline.deliver.notification import DeliveryError, Notification, SendResult
from deadline_pipeline.deliver.render import RenderError, build_email, mail_options


def _is_permanent(code: int) -> bool:
    return 500 <= code <= 599


class SmtpSender:
    """Channel sending through ``cfg.host:cfg.port`` (SMTP, SMTP over TLS with ``ssl``, or STARTTLS).

    Credentials: ``cfg.username_env`` / ``cfg.password_env`` name environment variables read at each
    send; a named variable that is unset is a permanent :class:`DeliveryError`. ``cfg.timeout_seconds``
    bounds connect and each reply, in seconds.
    """

    idempotency_class = IDEMPOTENCY_NOTIFICATION

    def __init__(self, name: str, cfg: SmtpChannel) -> None:
        self.name = name
        self.cfg = cfg

    def _error(self, what: str, *, permanent: bool, outcome: str = "failed") -> DeliveryError:
        return DeliveryError(
            f"channel {self.name!r} (smtp {self.cfg.host}:{self.cfg.port}): {what}",
            permanent=permanent,
            outcome=outcome,
        )

    def _credentials(self) -> tuple[str, str] | None:
        cfg = self.cfg
        if cfg.username_env is None and cfg.password_env is None:
            return None
        if cfg.username_env is None or cfg.password_env is None:
            raise self._error(
                "configuration names only one of username_env / password_env; login needs both",
                permanent=True,
            )
        values = []
        for var in (cfg.username_env, cfg.password_env):
            value = os.environ.get(var)
            if value is None:
                # Sending without the login would be refused (or worse, relayed unauthenticated).
                raise self._error(f"environment variable {var} (named in the configuration) is not set",
                                  permanent=True)
            values.append(value)
        return values[0], values[1]

    def _connect(self) -> smtplib.SMTP:
        cfg = self.cfg
        if cfg.ssl and cfg.starttls:
            raise self._error("configuration sets both ssl and starttls; choose one", permanent=True)
        context = ssl.create_default_context()
        if cfg.ssl:
            smtp = smtplib.SMTP_SSL(cfg.host, cfg.port, timeout=cfg.timeout_seconds, context=context)
        else:
            smtp = smtplib.SMTP(cfg.host, cfg.port, timeout=cfg.timeout_seconds)
        try:
            if cfg.starttls:
                smtp.ehlo()
                smtp.starttls(context=context)
                smtp.ehlo()
        except BaseException:
            smtp.close()
            raise
        return smtp

    def send(self, n: Notification) -> SendResult:
        """Send ``n`` to ``n.email``. Returns the Message-ID; raises :class:`DeliveryError` (see module)."""
        try:
            msg = build_email(n, self.cfg.sender, **mail_options(self.cfg))
        except RenderError as exc:
            raise DeliveryError(str(exc), permanent=True) from exc
        mid = str(msg["Message-ID"])
        credentials = self._credentials()
        data = msg.as_bytes()
        recipient = n.email or ""

        smtp: smtplib.SMTP | None = None
        data_sent = False
        try:
            smtp = self._connect()
            # mail() does not greet by itself (sendmail() would); without EHLO servers answer 503.
            smtp.ehlo_or_helo_if_needed()
            if credentials is not None:
                smtp.login(*credentials)
            code, reply = smtp.mail(self.cfg.sender)
            if code != 250:
                raise smtplib.SMTPSenderRefused(code, reply, self.cfg.sender)
            code, reply = smtp.rcpt(recipient)
            if code not in (250, 251):
                raise smtplib.SMTPRecipientsRefused({recipient: (code, reply)})
            # From here on the server may hold the whole message even if we never see its reply.
            data_sent = True
            code, reply = smtp.data(data)
            if code != 250:
                raise smtplib.SMTPDataError(code, reply)
        except DeliveryError:
            raise
        except smtplib.SMTPRecipientsRefused as exc:
            code, reply = next(iter(exc.recipients.values()))
            raise self._error(
                f"recipient {recipient} refused: {code} {_text(reply)}", permanent=_is_permanent(code)
            ) from exc
        except smtplib.SMTPAuthenticationError as exc:
            # Wrong credentials do not fix themselves between retries.
            raise self._error(f"login refused: {exc.smtp_code} {_text(exc.smtp_error)}", permanent=True) from exc
        except smtplib.SMTPNotSupportedError as exc:
            raise self._error(f"server does not support a configured feature: {exc}", permanent=True) from exc
        except smtplib.SMTPResponseException as exc:
            # SMTPSenderRefused, SMTPDataError, SMTPConnectError, SMTPHeloError: an explicit reply
            # refusing the message, so it was not taken even when it came after DATA.
            raise self._error(
                f"{type(exc).__name__}: {exc.smtp_code} {_text(exc.smtp_error)}",
                permanent=_is_permanent(exc.smtp_code),
            ) from exc
        except ssl.SSLCertVerificationError as exc:
            raise self._error(f"TLS certificate rejected: {exc}", permanent=True) from exc
        except UnicodeEncodeError as exc:
            raise self._error(f"address {recipient!r} is not ASCII: {exc}", permanent=True) from exc
        except (smtplib.SMTPException, OSError) as exc:
            # OSError covers refused connections and timeouts (TimeoutError); smtplib turns a lost
            # connection while reading a reply into SMTPServerDisconnected.
            if data_sent:
                raise self._error(
                    f"connection lost after DATA, the message may have been delivered: {type(exc).__name__}: {exc}",
                    permanent=False,
                    outcome="unknown",
                ) from exc
            raise self._error(f"{type(exc).__name__}: {exc}", permanent=False) from exc
        finally:
            if smtp is not None:
                _quit(smtp)
        return SendResult(provider_message_id=mid)

    def close(self) -> None:
        """Nothing to release: every send uses its own connection."""


def _quit(smtp: smtplib.SMTP) -> None:
    # The message is settled by the DATA reply; a failing QUIT must not turn success into an error.
    try:
        smtp.quit()
    except (smtplib.SMTPException, OSError):
        smtp.close()


def _text(reply: bytes | str) -> str:
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
