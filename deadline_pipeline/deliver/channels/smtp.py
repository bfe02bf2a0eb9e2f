"""Deliver alerts through an SMTP server (stdlib :mod:`smtplib`).

One connection per alert: a broken connection then costs one alert, and the phase the failure
happened in is known exactly, which decides the outcome:

* before ``DATA`` (connect, greeting, STARTTLS, AUTH, ``MAIL FROM``, ``RCPT TO``): the server has not
  taken the message, so the outcome is ``"failed"``; a refused/broken connection is retryable;
* after ``DATA`` was issued: a disconnect or timeout leaves the outcome ``"unknown"`` (the server may
  have queued the message before the reply was lost); an explicit 4xx/5xx reply to the data is
  ``"failed"``.

An explicit reply is classified by its code wherever it comes (greeting, AUTH, MAIL, RCPT, DATA), by
:func:`reply_is_permanent`: RFC 5321 §4.2.1 makes every 4yz reply a transient negative completion
(retried with backoff) and every 5yz reply permanent; RFC 3463's enhanced status codes say the same
with their class digit (``4.x.x`` persistent transient, ``5.x.x`` permanent). So ``421`` on connect
(service not available) and ``454 4.7.0 Temporary authentication failure`` at login are retried, and
``535 5.7.8`` (credentials invalid) is escalated. A transient failure that never clears still ends:
the sweep escalates it after its last attempt.

Login: AUTH sends the user name and password as UTF-8 (RFC 4616 §2, RFC 4954 §4), where smtplib
alone encodes them as ASCII and cannot send ``contraseña`` at all (:meth:`_BoundedSMTP.auth`).

Addresses: the recipient's domain goes out in IDNA form; a non-ASCII local part is sent with
SMTPUTF8 (RFC 6531) and UTF-8 headers (RFC 6532) when the server's EHLO offers it, and is a
permanent error when it does not (configuration refuses such an address at load unless the channel
says ``smtputf8: true``).

Time: a whole send (connect, TLS, EHLO, AUTH, ``MAIL``/``RCPT``, ``DATA``, ``QUIT``) ends within
``timeout_seconds`` (plus a few milliseconds), however slowly the server answers (see
:class:`_SendDeadline`). When that deadline passes the outcome follows the phase, as above:
``"failed"`` (retryable) before ``DATA`` was issued, ``"unknown"`` after.

The ``Message-ID`` is derived from the dedup key, so a resend after ``"unknown"`` is recognisable as
the same mail; it is also the ``provider_message_id``.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hmac
import os
import re
import smtplib
import socket
import ssl
import threading
import time

from deadline_pipeline.addresses import AddressError, WireAddress, wire_address
from deadline_pipeline.config import SmtpChannel
from deadline_pipeline.deliver.channels.base import IDEMPOTENCY_NOTIFICATION
from deadline_pipeline.deliver.channels.environment import login_text_problem
from deadline_pipeline.deliver.notification import DeliveryError, Notification, SendResult
from deadline_pipeline.deliver.render import RenderError, build_email, mail_options

_ENHANCED = re.compile(r"^\s*([245])\.\d{1,3}\.\d{1,3}(?:\s|$)")


def reply_is_permanent(code: int, text: bytes | str = b"") -> bool:
    """Whether an SMTP reply refuses for good. ``code``: the three-digit reply code (smtplib uses -1
    for a connection closed without one); ``text``: the reply text, which may start with an RFC 3463
    enhanced status code.

    Permanent only for a 5yz reply whose enhanced code (if any) is not of class 4. Every 4yz reply and
    every enhanced ``4.x.x`` is transient (RFC 5321 §4.2.1, RFC 3463 §3.1); so is anything else (no
    reply, an unexpected 2yz/3yz), because retrying costs a delay and the sweep escalates after its last
    attempt, while calling it permanent would give up on a reminder that might still go out.
    """
    m = _ENHANCED.match(_text(text))
    if m and m.group(1) == "4":
        return False
    return 500 <= code <= 599


class SmtpSender:
    """Channel sending through ``cfg.host:cfg.port`` (SMTP, SMTP over TLS with ``ssl``, or STARTTLS).

    Credentials: ``cfg.username_env`` / ``cfg.password_env`` name environment variables read at each
    send; a named variable that is unset is a permanent :class:`DeliveryError`. They go out as UTF-8
    in every mechanism (PLAIN, LOGIN, CRAM-MD5; see :meth:`_BoundedSMTP.auth`), so any Unicode user
    name or password logs in; a value that is not UTF-8 text is a retryable configuration error
    naming its variable (start-up refuses it before anything is sent, see
    :func:`~deadline_pipeline.deliver.channels.environment.unresolved_env`). ``cfg.timeout_seconds``
    (seconds) bounds each send as a whole, from connecting to ``QUIT``, however slowly the server
    answers; when it passes, :meth:`send` raises a retryable :class:`DeliveryError` saying so.
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
        """``(user name, password)`` from the variables ``username_env`` / ``password_env`` name, or
        ``None`` when the channel logs in with neither. Raises :class:`DeliveryError`: permanent when
        only one is named or a variable is unset; retryable (a configuration error of the channel,
        not the alert's) when a value is not UTF-8 text, which no SMTP AUTH mechanism can carry."""
        cfg = self.cfg
        if cfg.username_env is None and cfg.password_env is None:
            return None
        if cfg.username_env is None or cfg.password_env is None:
            raise self._error(
                "configuration names only one of username_env / password_env; login needs both",
                permanent=True,
            )
        values = []
        for key, var in (("username_env", cfg.username_env), ("password_env", cfg.password_env)):
            value = os.environ.get(var)
            if value is None:
                # Sending without the login would be refused (or worse, relayed unauthenticated).
                raise self._error(f"environment variable {var} (named in the configuration) is not set",
                                  permanent=True)
            problem = login_text_problem(value)
            if problem:
                raise self._error(f"configuration error: environment variable {var} ({key}) {problem}",
                                  permanent=False)
            values.append(value)
        return values[0], values[1]

    def _connect(self, deadline: _SendDeadline) -> smtplib.SMTP:
        cfg = self.cfg
        if cfg.ssl and cfg.starttls:
            raise self._error("configuration sets both ssl and starttls; choose one", permanent=True)
        context = ssl.create_default_context()
        smtp = _BoundedSMTP(cfg.host, cfg.port, deadline, tls_context=context if cfg.ssl else None)
        try:
            if cfg.starttls:
                smtp.ehlo()
                smtp.starttls(context=context)
                smtp.ehlo()
        except BaseException:
            smtp.close()
            raise
        return smtp

    def _wire_message(self, n: Notification) -> tuple[str, WireAddress, bytes, list[str]]:
        """``(Message-ID, recipient as sent, the message's bytes, MAIL FROM parameters)`` for ``n``.
        Raises a permanent :class:`DeliveryError` for an address or an alert that cannot be written."""
        try:
            # The To header carries the IDNA domain too: an encoded word there is not an address.
            # (No address at all is reported by build_email, naming the alert's dedup key.)
            wire = wire_address(n.email) if n.email else WireAddress("", needs_smtputf8=False)
            msg = build_email(dataclasses.replace(n, email=wire.address) if n.email else n,
                              self.cfg.sender, **mail_options(self.cfg))
        except AddressError as exc:
            raise self._error(str(exc), permanent=True) from exc
        except RenderError as exc:
            raise DeliveryError(str(exc), permanent=True) from exc
        if wire.needs_smtputf8:
            # RFC 6532 headers: the local part is written as UTF-8, not as an encoded word.
            data = msg.as_bytes(policy=msg.policy.clone(utf8=True))
            return str(msg["Message-ID"]), wire, data, ["SMTPUTF8", "BODY=8BITMIME"]
        return str(msg["Message-ID"]), wire, msg.as_bytes(), []

    def send(self, n: Notification) -> SendResult:
        """Send ``n`` to ``n.email``. Returns the Message-ID; raises :class:`DeliveryError` (see module)."""
        mid, wire, data, esmtp_options = self._wire_message(n)
        credentials = self._credentials()
        smtp: smtplib.SMTP | None = None
        phase = _Phase()
        ehlo_name()  # the first send of the process looks it up here, before its deadline starts
        # The with block cancels the deadline's timer however the send ends (no thread outlives it).
        with _SendDeadline(self.cfg.timeout_seconds) as deadline:
            try:
                smtp = self._connect(deadline)
                self._transact(smtp, wire, credentials, data, esmtp_options, phase)
            except DeliveryError:
                raise
            except (smtplib.SMTPException, OSError, UnicodeEncodeError) as exc:
                raise self._failure(exc, wire.address, phase.name, deadline) from exc
            finally:
                if smtp is not None:
                    _quit(smtp)
        return SendResult(provider_message_id=mid)

    def _transact(self, smtp: smtplib.SMTP, wire: WireAddress, credentials: tuple[str, str] | None, data: bytes,
                  esmtp_options: list[str], phase: _Phase) -> None:
        """EHLO, AUTH, ``MAIL``, ``RCPT`` and ``DATA`` on ``smtp``, naming each step in ``phase``.
        Raises smtplib's exceptions for refusals (classified by :meth:`_failure`)."""
        # mail() does not greet by itself (sendmail() would); without EHLO servers answer 503.
        smtp.ehlo_or_helo_if_needed()
        recipient = wire.address
        if wire.needs_smtputf8 and not smtp.has_extn("smtputf8"):
            # RFC 6531 §3.4: without the extension the address cannot be sent at all.
            raise self._error(f"recipient {recipient!r} has a non-ASCII local part and the server does not "
                              "offer SMTPUTF8 (RFC 6531)", permanent=True)
        if credentials is not None:
            phase.name = "login"
            smtp.login(*credentials)
        phase.name = "envelope"
        code, reply = smtp.mail(self.cfg.sender, esmtp_options)
        if code != 250:
            raise smtplib.SMTPSenderRefused(code, reply, self.cfg.sender)
        code, reply = smtp.rcpt(recipient)
        if code not in (250, 251):
            raise smtplib.SMTPRecipientsRefused({recipient: (code, reply)})
        # From here on the server may hold the whole message even if we never see its reply.
        phase.name = "data"
        code, reply = smtp.data(data)
        if code != 250:
            raise smtplib.SMTPDataError(code, reply)

    def _failure(self, exc: BaseException, recipient: str, phase: str, deadline: _SendDeadline) -> DeliveryError:
        """The :class:`DeliveryError` for ``exc``, raised by smtplib or the socket during ``phase``
        (a :class:`_Phase` name) of a send to ``recipient`` (see the module for the classification)."""
        if isinstance(exc, smtplib.SMTPRecipientsRefused):
            code, reply = next(iter(exc.recipients.values()))
            return self._error(f"recipient {recipient} refused: {code} {_text(reply)}",
                               permanent=reply_is_permanent(code, reply))
        if isinstance(exc, smtplib.SMTPAuthenticationError):
            # 535 (wrong credentials) does not fix itself between retries; 454 (the server's
            # authentication backend is down) does, and escalating it paged for every alert.
            return self._error(f"login refused: {exc.smtp_code} {_text(exc.smtp_error)}",
                               permanent=reply_is_permanent(exc.smtp_code, exc.smtp_error))
        if isinstance(exc, smtplib.SMTPNotSupportedError):
            return self._error(f"server does not support a configured feature: {exc}", permanent=True)
        if isinstance(exc, smtplib.SMTPResponseException):
            # SMTPSenderRefused, SMTPDataError, SMTPConnectError, SMTPHeloError: an explicit reply
            # refusing the message, so it was not taken even when it came after DATA.
            return self._error(f"{type(exc).__name__}: {exc.smtp_code} {_text(exc.smtp_error)}",
                               permanent=reply_is_permanent(exc.smtp_code, exc.smtp_error))
        if isinstance(exc, ssl.SSLCertVerificationError):
            return self._error(f"TLS certificate rejected: {exc}", permanent=True)
        if isinstance(exc, UnicodeEncodeError):
            return self._unencodable(exc, phase)
        return self._lost(exc, phase, deadline)

    def _unencodable(self, exc: UnicodeEncodeError, phase: str) -> DeliveryError:
        """The error for text smtplib could not encode for the wire, by the ``phase`` it happened in.

        Named by phase, not guessed: every encoding failure was reported as a non-ASCII address,
        permanent, so a UTF-8 password (which smtplib encodes as ASCII) escalated every alert of the
        channel as a bad address while no AUTH command had gone out. A login that cannot be encoded is
        the channel's configuration, not the alert's: retryable, naming the settings. Only the reason
        is quoted: the exception's text holds a character of the secret and its position.
        """
        if phase == "login":
            return self._error(f"configuration error: the login read from username_env {self.cfg.username_env} / "
                               f"password_env {self.cfg.password_env} cannot be sent as {exc.encoding} "
                               f"({exc.reason}); SMTP AUTH carries UTF-8 (RFC 4616 §2, RFC 4954 §4)",
                               permanent=False)
        if phase == "envelope":
            # The recipient is IDNA or goes with SMTPUTF8 (which makes smtplib send UTF-8): the sender is left.
            return self._error(f"the sender {self.cfg.sender!r} is not ASCII and SMTPUTF8 is not in use: {exc}",
                               permanent=True)
        # Before AUTH only this host's EHLO name is sent: nothing of the alert's, so not escalated at once.
        return self._error(f"text sent while connecting is not {exc.encoding}: {exc}", permanent=False)

    def _lost(self, exc: BaseException, phase: str, deadline: _SendDeadline) -> DeliveryError:
        """The error for a connection that failed, broke or timed out during ``phase``: ``"unknown"``
        once ``DATA`` was issued (the server may have the message), else a retryable ``"failed"``."""
        # OSError covers refused connections and timeouts (TimeoutError); smtplib turns a lost
        # connection while reading a reply into SMTPServerDisconnected. The deadline's cut lands
        # here too (a reply it truncates is no reply, see _BoundedSMTP.getreply), and is named as
        # such: a server too slow for timeout_seconds, not a mysterious disconnect.
        what = f"{type(exc).__name__}: {exc}"
        late = f"the send's deadline ({self.cfg.timeout_seconds:g} s) passed" if deadline.passed else None
        if phase == "data":
            return self._error(f"{late or 'connection lost'} after DATA, the message may have been delivered: {what}",
                               permanent=False, outcome="unknown")
        return self._error(f"{late} before DATA, the message was not sent: {what}" if late else what, permanent=False)

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


@dataclasses.dataclass
class _Phase:
    """The step a send is in, which decides how a failure is classified: ``"connect"`` (connecting,
    TLS, the greeting, EHLO), ``"login"`` (AUTH), ``"envelope"`` (``MAIL``, ``RCPT``), ``"data"``
    (``DATA`` issued: the server may hold the message from then on)."""

    name: str = "connect"


# --------------------------------------------------------------------------- SMTP AUTH in UTF-8

# AUTH challenges answered before giving up on a server that keeps sending 334 (smtplib's bound).
_MAX_CHALLENGES = 5


def sasl_response(response: str | bytes) -> str:
    """One SASL response as sent after ``AUTH <mechanism>`` or a ``334`` challenge: the base64 of
    ``response``'s UTF-8 bytes (RFC 4954 §4; RFC 4616 §2 makes PLAIN's user name and password UTF-8).
    ``bytes`` are sent as they are. Raises ``UnicodeEncodeError`` for text that is not Unicode
    (lone surrogates: an environment variable's bytes that were not UTF-8)."""
    raw = response.encode("utf-8") if isinstance(response, str) else response
    return base64.b64encode(raw).decode("ascii")


# --------------------------------------------------------------------------- the send's deadline


class _SendDeadline:
    """The deadline of one SMTP send: ``seconds`` (seconds, > 0) after entering the ``with`` block.

    Why: smtplib's ``timeout`` bounds each socket call only, and a reply line is read one ``recv`` at
    a time, so a server dripping its greeting or its reply to ``DATA`` a byte at a time, each byte
    within the timeout, held a send for as long as it liked: a sweep worker past the lease the send
    was started under (another sweep may then claim and send the alert too), or the bookkeeping
    thread sending an escalation notice. No per-call timeout bounds such a readline; shutting the
    socket down does:

    * :meth:`time_left` gives the TCP connect (no socket to shut down yet) only the time left and
      raises ``TimeoutError`` once the deadline has passed;
    * :meth:`watch` takes the connection; a timer thread shuts it down (``SHUT_RDWR``) when the
      deadline passes. That wakes a blocked read (it sees the end of the stream) or write (EPIPE) in
      any phase - TLS handshake, greeting, any reply, ``QUIT`` - and smtplib raises
      ``SMTPServerDisconnected`` (the TLS layer an ``OSError``), which :attr:`passed` lets the channel
      name as the deadline and classify by phase.

    Bound: ``seconds`` plus the timer thread's wake-up (milliseconds). Not shortened: the host name's
    resolution (bounded by the system resolver; the deadline is checked when it returns), which is no
    socket this could shut down. The EHLO name's lookup is out of the send: :func:`ehlo_name`.

    Cost of a send that ends in time: one timer thread started and cancelled and one ``dup`` of the
    socket, well under a millisecond. Leaving the block cancels and joins the timer, so no thread
    outlives the send, and closes the duplicate.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._at = 0.0
        self._cut = False
        self._watched: socket.socket | None = None
        self._lock = threading.Lock()  # the timer thread against watch() and __exit__
        self._timer = threading.Timer(seconds, self._shut_down)
        self._timer.daemon = True

    def __enter__(self) -> _SendDeadline:
        self._at = time.monotonic() + self.seconds
        self._timer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._timer.cancel()
        self._timer.join()
        with self._lock:
            if self._watched is not None:
                self._watched.close()
                self._watched = None

    @property
    def passed(self) -> bool:
        """Whether the deadline has passed (the connection was cut, or the time is up)."""
        return self._cut or time.monotonic() >= self._at

    def time_left(self, timeout: float | None) -> float:
        """``timeout`` (seconds; ``None``: none) shortened to the time left until the deadline.
        Raises ``TimeoutError`` when it has passed."""
        left = self._at - time.monotonic()
        if left <= 0:
            raise TimeoutError("the send's deadline passed before connecting")
        return left if timeout is None else min(timeout, left)

    def watch(self, sock: socket.socket) -> None:
        """Shut the connection of ``sock`` down when the deadline passes (at once if it has)."""
        with self._lock:
            # A duplicate descriptor of the same connection, owned here until __exit__: smtplib
            # detaches its plain socket when TLS starts and closes its socket on errors, so cutting
            # through smtplib's object could miss the connection or hit a closed descriptor whose
            # number another send has reused meanwhile.
            self._watched = sock.dup()
            if self._cut:
                _shut(self._watched)

    def _shut_down(self) -> None:  # runs in the timer thread
        with self._lock:
            self._cut = True
            if self._watched is not None:
                _shut(self._watched)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already disconnected: nothing is left waiting on it


class _BoundedSMTP(smtplib.SMTP):
    """:class:`smtplib.SMTP` held to ``deadline``: connects with the time left, hands the connection to
    the deadline to cut, and reads whole reply lines only. ``tls_context``: TLS from the first byte
    (``ssl: true``) as :class:`smtplib.SMTP_SSL` does, which connects and shakes hands in one call and
    so leaves no point at which to hand the plain connection to the deadline. Raises as
    :class:`smtplib.SMTP` does (``OSError`` when the connection fails, ``SMTPConnectError`` for a
    greeting other than 220).
    """

    def __init__(self, host: str, port: int, deadline: _SendDeadline, *, tls_context: ssl.SSLContext | None) -> None:
        self._deadline = deadline
        self._tls_context = tls_context
        # Each socket call keeps its own bound as before; the deadline bounds them all together.
        super().__init__(host, port, local_hostname=ehlo_name(), timeout=deadline.seconds)

    def _get_socket(self, host: str, port: int, timeout: float | None) -> socket.socket:
        sock = super()._get_socket(host, port, self._deadline.time_left(timeout))
        self._deadline.watch(sock)
        if self._tls_context is not None:
            sock = self._tls_context.wrap_socket(sock, server_hostname=self._host)
        return sock

    def auth(self, mechanism: str, authobject, *, initial_response_ok: bool = True) -> tuple[int, bytes]:
        """The SASL exchange of ``AUTH mechanism`` (RFC 4954 §4), as :meth:`smtplib.SMTP.auth` runs it
        (``authobject(challenge bytes | None)`` gives each response), but with every response sent
        as the base64 of its UTF-8 bytes (:func:`sasl_response`).

        Why: smtplib encodes each response as ASCII, so a password such as ``contraseña`` raised
        ``UnicodeEncodeError`` before any AUTH command went out, although PLAIN carries UTF-8 (RFC
        4616 §2) and LOGIN's base64 carries whatever bytes the server compares. An ASCII login sends
        exactly the bytes it sent before. Returns ``(code, reply)`` for 235 (accepted) or 503
        (already authenticated); raises :class:`smtplib.SMTPAuthenticationError` for any other
        final reply and :class:`smtplib.SMTPException` after :data:`_MAX_CHALLENGES` challenges.
        """
        mechanism = mechanism.upper()
        initial = authobject() if initial_response_ok else None
        # smtplib's auth_login reads _auth_challenge_count to tell the user name's turn from the password's.
        if initial is None:
            self._auth_challenge_count = 0
            code, reply = self.docmd("AUTH", mechanism)
        else:
            self._auth_challenge_count = 1
            code, reply = self.docmd("AUTH", f"{mechanism} {sasl_response(initial)}")
        while code == 334:
            self._auth_challenge_count += 1
            code, reply = self.docmd(sasl_response(authobject(base64.decodebytes(reply))))
            if self._auth_challenge_count > _MAX_CHALLENGES:
                raise smtplib.SMTPException(f"server AUTH {mechanism} keeps challenging; last reply: {code} "
                                            f"{_text(reply)}")
        if code in (235, 503):
            return code, reply
        raise smtplib.SMTPAuthenticationError(code, reply)

    def auth_cram_md5(self, challenge: bytes | None = None) -> str | None:
        """The CRAM-MD5 response (RFC 2195 §2): ``"<user> <hex HMAC-MD5 of challenge>"``, keyed with
        the password's UTF-8 bytes (smtplib keys it with ASCII and failed on any other password);
        ``None`` before the challenge (the mechanism has no initial response).

        RFC 2195 names no character set for the shared secret: a server computes the HMAC from the
        secret's bytes as it stores them, and UTF-8 is what PLAIN and LOGIN send too. Where a server
        keeps the secret in another encoding it answers 535, and :meth:`smtplib.SMTP.login` goes on
        to the next mechanism both sides offer (PLAIN, LOGIN).
        """
        if challenge is None:
            return None
        digest = hmac.new(self.password.encode("utf-8"), challenge, "md5").hexdigest()
        return f"{self.user} {digest}"

    def getreply(self) -> tuple[int, bytes]:
        # A reply line the connection ended in the middle of (the deadline's cut, or a server going
        # away mid-reply) is no reply: smtplib would read the "25" of a dripping "250 ..." as code 25,
        # and the channel would report a refusal, "failed", for a message the server may have taken
        # after DATA. Read as no line at all, it is SMTPServerDisconnected, classified by phase.
        if self.file is None and self.sock is not None:
            self.file = _WholeLines(self.sock.makefile("rb"))
        return super().getreply()


@functools.cache
def ehlo_name() -> str:
    """The name this host gives in EHLO/HELO: smtplib's own choice (the fully qualified domain name,
    else ``[<address>]``), worked out once per process.

    Why once: smtplib works it out again for every connection with ``socket.getfqdn()``, a reverse
    lookup of this host's name, after connecting. Where that lookup hangs (no reverse DNS, a resolver
    timing out), it took the resolver's timeout out of every SMTP send, inside the send's deadline: a
    lookup longer than the channel's timeout failed every send, one after another, and no socket of
    the send could cut it short. Raises nothing (smtplib falls back itself).
    """
    # SMTP() without a host connects to nothing; its constructor makes exactly smtplib's choice.
    return smtplib.SMTP().local_hostname


class _WholeLines:
    """A reply reader over ``raw`` (the socket's binary file) whose ``readline`` returns ``b""`` for a
    line that ended without its line feed because the connection did."""

    def __init__(self, raw) -> None:
        self._raw = raw

    def readline(self, limit: int = -1) -> bytes:
        line = self._raw.readline(limit)
        if line.endswith(b"\n") or 0 <= limit <= len(line):
            return line  # whole, or over smtplib's limit (which it reports as "Line too long")
        return b""

    def close(self) -> None:
        self._raw.close()
