"""Render a :class:`~deadline_pipeline.deliver.notification.Notification` into a subject, a plain-text
body and an HTML body, and build the e-mail that carries them.

Templates live in ``deliver/templates/`` (``subject.txt``, ``body.txt``, ``body.html``); only
``.html`` templates are autoescaped. Source values are passed to the templates as *data*, never
compiled as templates, so a title such as ``{{ 7*7 }}`` prints literally.

Untrusted text is made safe here:

* the subject is one line: control characters (CR, LF, NUL, U+0085, U+2028/2029 …) become spaces,
  and RFC 2047 encoded-words are decoded before that and broken up after it (:func:`header_text`),
  so a title can never end the Subject header and start another one;
* the HTML body is autoescaped, and ``url`` becomes a link only for ``http``/``https`` (a
  ``javascript:`` URL from a feed is shown as text, not made clickable).

Header fields are written by :data:`~deadline_pipeline.deliver.headers.MAIL_POLICY`: valid RFC 2047
encoded words whatever the title, and a Subject that decodes to exactly the rendered subject.

Times are shown in the subscriber's zone and in UTC, truncated to the minute (a reader then errs
early, never late, for a 23:59:59 deadline), and in the deadline's own zone when that differs (a
conference deadline "23:59 AoE" is recognisable as the published one). A reminder says which one it
is ("7 days before"), says when it goes out late and why, and says when a business-day rule moved
the due date away from the published one.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.utils import format_datetime, parseaddr
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

import jinja2

from deadline_pipeline.deliver.headers import MAIL_POLICY, header_problems
from deadline_pipeline.deliver.notification import Notification
from deadline_pipeline.deliver.throttle import ThrottledLogger
from deadline_pipeline.timezones import UnknownTimeZone, resolve_zone
from deadline_pipeline.wording import MOVE_CAUSE, iso_duration, offset_words, shorten

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
# The Message-ID domain when the sender has none usable (RFC 5322 §3.6.4 wants a domain the
# sender controls; a bare label is what old builds used and what mail scorers penalise).
MESSAGE_ID_DOMAIN = "deadline-pipeline.invalid"
# A send this long after its planned instant is called late in the message (the planning grace).
LATE_AFTER = timedelta(minutes=15)
SUBJECT_MAX_CHARS = 250
SUBJECT_TITLE_MAX_CHARS = 150
_HEX = re.compile(r"^[0-9a-fA-F]+$")
_SPACES = re.compile(r"\s+")
# Header fields the mail library wrote against RFC 2047 / RFC 5322 (see build_email), once per 100.
_header_faults = ThrottledLogger(logging.getLogger(__name__), every=100, level=logging.WARNING)


class RenderError(Exception):
    """An alert that cannot be rendered; the message names the dedup key. ``dedup_key``: that key."""

    def __init__(self, dedup_key: str, problem: str) -> None:
        super().__init__(f"alert {dedup_key}: cannot render message: {problem}")
        self.dedup_key = dedup_key


@dataclass(frozen=True)
class RenderedMessage:
    """``subject``: one line without control characters; ``text``: plain-text body; ``html``: HTML body."""

    subject: str
    text: str
    html: str


def one_line(value: object) -> str:
    """``value`` as a single line: every control/separator character becomes a space, runs of
    whitespace collapse. Used for anything that ends up in a header."""
    text = "" if value is None else str(value)
    text = "".join(" " if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c for c in text)
    return _SPACES.sub(" ", text).strip()


def header_text(value: object) -> str:
    """``value`` safe as the value of an unstructured mail header such as Subject.

    Python's ``email`` package parses a header value it is given for RFC 2047 encoded-words and
    folds the *decoded* text back out: a title ``Pay rent =?UTF-8?Q?=0A?=Bcc: x@example.org`` became
    a real ``Bcc:`` header (case C28 of the shared cases). So encoded-words are decoded here first
    (repeatedly, for nested ones; at most 5 rounds), control characters become spaces, and any
    ``=?`` left is broken up so that nothing can be decoded later.
    """
    from email.header import decode_header, make_header

    text = one_line(value)
    for _ in range(5):
        if "=?" not in text:
            break
        try:
            decoded = one_line(str(make_header(decode_header(text))))
        except (UnicodeError, ValueError, LookupError):  # a malformed or unknown charset: keep as text
            break
        if decoded == text:
            break
        text = decoded
    return text.replace("=?", "= ?")


def multi_line(value: object) -> str:
    """``value`` with line breaks kept (normalised to ``\\n``) and other control characters removed
    (a NUL or an escape sequence in a note would garble terminals and mail clients)."""
    text = "" if value is None else str(value)
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\u2028", "\n").replace("\u2029", "\n")
    return "".join(c for c in text if c in "\n\t" or unicodedata.category(c) not in ("Cc", "Cf"))


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DOMAIN = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*$")


def sender_domain(sender: str | None) -> str | None:
    """The domain of a sender address (``"Reminders <r@example.org>"`` → ``"example.org"``), lower
    case, or ``None`` when there is no usable ASCII domain."""
    _name, addr = parseaddr(sender or "")
    domain = addr.rpartition("@")[2].strip().lower() if "@" in addr else ""
    return domain if domain and _DOMAIN.match(domain) else None


def message_id(dedup_key: str, domain: str | None = None) -> str:
    """The SMTP Message-ID for an alert: ``"<{dedup_key}@{domain}>"``; ``domain`` defaults to
    :data:`MESSAGE_ID_DOMAIN` (callers pass the sender's domain, see :func:`build_email`).

    Derived from the dedup key and the configured domain only, so a retry after an unknown outcome
    carries the same id and a mail client or server shows a duplicate as one message. Raises
    ``ValueError`` when the key is not hex or the domain is not a host name (anything else could
    break out of the angle brackets).
    """
    if not isinstance(dedup_key, str) or not _HEX.match(dedup_key):
        raise ValueError(f"dedup key {dedup_key!r} is not a hex string")
    domain = domain or MESSAGE_ID_DOMAIN
    if not _DOMAIN.match(domain):
        raise ValueError(f"Message-ID domain {domain!r} is not a host name")
    return f"<{dedup_key}@{domain}>"


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html",), default_for_string=False),
        # A misspelt variable in a template must fail the alert, not print an empty due date.
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _plural(n: int, unit: str) -> str:
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s"


def time_left(offset_seconds: int) -> str:
    """The lead time of a reminder in words: ``-604800`` → ``"7 days"``, ``-5400`` → ``"1 hour 30 minutes"``,
    ``0`` → ``""`` (due now). The caller passes the offset, or the send time minus the due time
    when it is known (see ``Notification.sent_at``)."""
    left = max(0, -int(offset_seconds))
    days, rest = divmod(left, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    parts = [_plural(v, u) for v, u in ((days, "day"), (hours, "hour"), (minutes, "minute")) if v]
    if not parts and left:
        return _plural(left, "second")
    return " ".join(parts[:2])


def _local(when: datetime, zone) -> str:
    local = when.astimezone(zone)
    abbrev = local.tzname() or ""
    return f"{local:%Y-%m-%d %H:%M} {abbrev}".strip()


def _offset(when: datetime, zone) -> str:
    delta = when.astimezone(zone).utcoffset()
    total = int(delta.total_seconds()) if delta is not None else 0
    sign = "-" if total < 0 else "+"
    hours, minutes = divmod(abs(total) // 60, 60)
    return f"UTC{sign}{hours:02d}:{minutes:02d}"


def _utc_text(when: datetime) -> str:
    return f"{when.astimezone(UTC):%Y-%m-%d %H:%M} UTC"


def _rule_local(n: Notification) -> str | None:
    """The due time in the deadline's own zone ("2026-05-06 23:59 AoE (UTC-12:00)") when it is known
    and differs from the subscriber's wall clock, else ``None``."""
    if not n.rule_tz:
        return None
    try:
        rule_zone = resolve_zone(n.rule_tz)
    except UnknownTimeZone:
        return None
    sub_zone = resolve_zone(n.subscriber_tz)
    local = n.due_at.astimezone(rule_zone)
    if local.replace(tzinfo=None) == n.due_at.astimezone(sub_zone).replace(tzinfo=None):
        return None  # the same wall clock: one line says it all
    name = one_line(n.rule_tz)
    abbrev = local.tzname() or ""
    shown = f"{name}, {abbrev}" if abbrev and abbrev != name and abbrev.isalpha() else name
    return f"{local:%Y-%m-%d %H:%M} {shown} ({_offset(n.due_at, rule_zone)})"


def _late(n: Notification, zone) -> str | None:
    """"Sent late: planned for 2026-05-01 09:00 CEST (07:00 UTC), <reason>" for a reminder sent more
    than :data:`LATE_AFTER` after its planned instant, else ``None``. Without it a reader of a
    reminder sent after an outage takes "2 hours left" for a plan, not for a slip."""
    if n.kind != "reminder" or n.sent_at is None or n.planned_at is None or n.sent_at - n.planned_at <= LATE_AFTER:
        return None
    reasons = []
    if n.planned_reason and n.planned_reason.startswith("late at planning"):
        # The planner's own wording names instants and policies; the reader needs the cause.
        reasons.append("its time had already passed when it was planned (a new subscription, a new deadline, "
                       "or a deadline moved closer); the latest reminder missed is sent at once instead")
    elif n.planned_reason:
        reasons.append(one_line(n.planned_reason))
    if n.earlier_attempts:
        reasons.append(f"{n.earlier_attempts} earlier delivery attempt{'s' if n.earlier_attempts != 1 else ''} "
                       "failed")
    if not reasons:
        reasons.append("delivery did not run at the planned time (the scheduler was stopped or behind)")
    return (f"Sent late: planned for {_local(n.planned_at, zone)} ({_utc_text(n.planned_at)}), "
            + "; ".join(reasons))


# A reminder sent this long after its deadline says how long ago it passed, not "due now": delivery
# still sends within its grace after a deadline (a deadline published late, a sweep behind), and
# "It is due now" ten minutes after the deadline read as if there were still time.
PASSED_AFTER = timedelta(minutes=1)


def _passed_ago(n: Notification) -> str | None:
    """``"10 minutes"`` for a reminder sent at least :data:`PASSED_AFTER` after its deadline
    (``sent_at - due_at``), else ``None``."""
    if n.kind != "reminder" or n.sent_at is None or n.sent_at - n.due_at < PASSED_AFTER:
        return None
    return time_left(-int((n.sent_at - n.due_at).total_seconds()))


def _move_cause(n: Notification) -> str | None:
    """The cause a correction's planner recorded after :data:`~deadline_pipeline.wording.MOVE_CAUSE`
    ("the time-zone rules of America/Vancouver changed (IANA 2025b → 2026f)"), else ``None``."""
    if n.kind != "correction" or not n.planned_reason or MOVE_CAUSE not in n.planned_reason:
        return None
    return one_line(n.planned_reason.split(MOVE_CAUSE, 1)[1]) or None


def _context(n: Notification) -> dict:
    zone = resolve_zone(n.subscriber_tz)
    title = one_line(n.title) or "(untitled)"
    url = one_line(n.url) if n.url else None
    previous = n.previous_due_at
    return {
        "kind": n.kind,
        "dedup_key": n.dedup_key,
        "subscriber_id": one_line(n.subscriber_id),
        "title": title,
        # Shortened for the subject only, so a very long title cannot push the due time out of it.
        "subject_title": shorten(title, SUBJECT_TITLE_MAX_CHARS),
        "source": one_line(n.source),
        "rule_id": one_line(n.rule_id),
        "zone_name": one_line(n.subscriber_tz),
        "due_local": _local(n.due_at, zone),
        "due_offset": _offset(n.due_at, zone),
        "due_utc": _utc_text(n.due_at),
        "previous_local": _local(previous, zone) if previous else None,
        "previous_utc": _utc_text(previous) if previous else None,
        # A deadline moved into the past: the correction says the new instant has already passed.
        "passed": n.kind == "correction" and n.sent_at is not None and n.due_at <= n.sent_at,
        # Why a deadline moved when its source did not change it (a zone-data or calendar upgrade).
        "why": _move_cause(n),
        "left": time_left(n.offset_seconds if n.sent_at is None
                          else int((n.sent_at - n.due_at).total_seconds())),
        "passed_ago": _passed_ago(n),
        # Which reminder this is ("7 days before", ISO "-P7D"), the deadline in its own zone, the
        # business-day note and the late notice (each None when there is nothing to say).
        "which": offset_words(n.offset_seconds),
        "which_iso": iso_duration(n.offset_seconds),
        "rule_local": _rule_local(n),
        "roll_note": one_line(n.roll_note) or None,
        "late": _late(n, zone),
        "url": url,
        "url_is_link": bool(url) and urlparse(url).scheme in ("http", "https"),
        "note": multi_line(n.note).strip() or None,
    }


def _incident_context(n: Notification) -> dict:
    """The template context of a page (``n.incident`` set): the incident's key, state, check and
    target, its times in UTC, its links (absolute ones clickable, Dagster UI routes shown as text)."""
    inc = n.incident
    return {
        "status": inc.status,
        "key": one_line(inc.key),
        "summary": one_line(inc.one_line_summary),
        "subject_summary": shorten(one_line(inc.one_line_summary), SUBJECT_TITLE_MAX_CHARS),
        "severity": inc.severity,
        "check": one_line(inc.check),
        "target": one_line(inc.target),
        "component": inc.component,
        "source": one_line(inc.source),
        "started_utc": _utc_text(inc.started_at),
        "ended_utc": _utc_text(inc.ended_at) if inc.ended_at else None,
        "notice": inc.notice,
        "repeat": inc.repeat,
        "links": [{"text": one_line(link.text), "url": one_line(link.href or link.path or ""),
                   "is_link": bool(link.href) and urlparse(link.href).scheme in ("http", "https")}
                  for link in inc.links],
        "detail": multi_line(inc.detail).strip() or None,
        "dedup_key": n.dedup_key,
    }


def _templates(n: Notification) -> tuple[dict, tuple[str, str, str]]:
    """The context and the (subject, text, html) template names for ``n``: a page has its own
    templates, so no part of it reads like a subscriber's reminder."""
    if n.incident is not None:
        return _incident_context(n), ("incident_subject.txt", "incident_body.txt", "incident_body.html")
    return _context(n), ("subject.txt", "body.txt", "body.html")


def render(n: Notification) -> RenderedMessage:
    """Render ``n`` with the templates; a page (kind ``incident``) with the incident templates, whose
    subject is ``[incident triggered] <incident key>: <summary>`` (or ``[incident resolved] …``).

    Returns a :class:`RenderedMessage` whose ``subject`` is one line of at most
    ``SUBJECT_MAX_CHARS`` characters. Raises :class:`RenderError` naming ``n.dedup_key`` for an
    unknown time zone or any template error.
    """
    try:
        ctx, (subject_t, text_t, html_t) = _templates(n)
        env = _environment()
        subject = env.get_template(subject_t).render(ctx)
        text = env.get_template(text_t).render(ctx)
        html = env.get_template(html_t).render(ctx)
    except UnknownTimeZone as exc:
        raise RenderError(n.dedup_key, f"subscriber {n.subscriber_id!r}: {exc}") from exc
    except jinja2.TemplateError as exc:
        raise RenderError(n.dedup_key, f"{n.kind} template: {exc.__class__.__name__}: {exc}") from exc
    # Sanitised again after rendering: whatever a template does, the subject stays one header line.
    subject = shorten(header_text(subject), SUBJECT_MAX_CHARS)
    return RenderedMessage(subject=subject, text=text, html=html)


def list_unsubscribe(url: str | None, mailto: str | None) -> tuple[str | None, bool]:
    """The ``List-Unsubscribe`` value (RFC 2369) for an https URL and/or a mailto address, and
    whether ``List-Unsubscribe-Post: List-Unsubscribe=One-Click`` (RFC 8058) may be added (only with
    an https URL). ``(None, False)`` when neither is configured. Raises ``ValueError`` for a URL that
    is not http(s), or a value with characters that would end the header."""
    parts = []
    if url:
        unsafe = one_line(url) != url or any(c in url for c in " <>")
        if unsafe or urlparse(url).scheme not in ("http", "https"):
            raise ValueError(f"unsubscribe URL {url!r} is not an http(s) URL")
        parts.append(f"<{url}>")
    if mailto:
        addr = mailto.removeprefix("mailto:")
        if one_line(addr) != addr or " " in addr or "@" not in addr or "<" in addr or ">" in addr:
            raise ValueError(f"unsubscribe address {mailto!r} is not an e-mail address")
        parts.append(f"<mailto:{addr}>")
    if not parts:
        return None, False
    return ", ".join(parts), bool(url) and urlparse(url).scheme == "https"


def mail_options(cfg) -> dict:
    """The :func:`build_email` keyword arguments an smtp/maildir channel configuration sets
    (``message_id_domain``, ``unsubscribe_url``, ``unsubscribe_mailto``; absent ones are ``None``)."""
    return {k: getattr(cfg, k, None) for k in ("message_id_domain", "unsubscribe_url", "unsubscribe_mailto")}


def build_email(n: Notification, sender: str, *, now: datetime | None = None, message_id_domain: str | None = None,
                unsubscribe_url: str | None = None, unsubscribe_mailto: str | None = None) -> EmailMessage:
    """The e-mail for ``n``: ``multipart/alternative`` (text, HTML), ``policy``
    :data:`~deadline_pipeline.deliver.headers.MAIL_POLICY` (``email.policy.SMTP`` whose header fields
    never carry an empty or malformed RFC 2047 encoded word, and whose Subject decodes to exactly the
    rendered subject).

    Headers: From ``sender``, To ``n.email``, Subject, Date (``now``, default ``n.sent_at``, else the
    current time; aware),
    Message-ID :func:`message_id` at ``message_id_domain`` (default: the sender's domain, so the id
    is one the sender's domain vouches for), ``X-Deadline-Dedup-Key``, ``Auto-Submitted:
    auto-generated`` (RFC 3834, so auto-responders do not answer a reminder and loop), and, when an
    ``unsubscribe_url`` (https) or ``unsubscribe_mailto`` is given, ``List-Unsubscribe`` (RFC 2369)
    plus ``List-Unsubscribe-Post`` (RFC 8058 one-click; https only). ``MIME-Version`` appears once, on
    the top level (RFC 2045 §4; the ``email`` package also stamps it on the added HTML part).

    Raises :class:`RenderError` naming the dedup key when ``n`` has no usable e-mail address, the
    dedup key is not hex, the unsubscribe settings are unusable, or rendering fails. A header field
    that would be written against RFC 2047 or RFC 5322 (:func:`~deadline_pipeline.deliver.headers.header_problems`)
    is logged as a warning naming the dedup key, and the message is returned all the same.
    """
    email = n.email or ""
    # The address comes from subscriber data; a CR/LF or space in it would add headers or recipients.
    if not email or one_line(email) != email or " " in email or "@" not in email:
        raise RenderError(n.dedup_key, f"subscriber {n.subscriber_id!r} has no usable e-mail address ({email!r})")
    try:
        mid = message_id(n.dedup_key, message_id_domain or sender_domain(sender))
        unsubscribe, one_click = list_unsubscribe(unsubscribe_url, unsubscribe_mailto)
    except ValueError as exc:
        raise RenderError(n.dedup_key, str(exc)) from exc
    rendered = render(n)
    msg = EmailMessage(policy=MAIL_POLICY)
    try:
        msg["From"] = sender
        msg["To"] = email
        msg["Subject"] = rendered.subject
        # The attempt's instant (a replay's --as-of too), as the body's "due in …" is worded from it:
        # the clock's time beside a replayed body dated every test mail today.
        msg["Date"] = format_datetime(now or n.sent_at or datetime.now(UTC))
        msg["Message-ID"] = mid
        msg["X-Deadline-Dedup-Key"] = n.dedup_key
        msg["Auto-Submitted"] = "auto-generated"
        if unsubscribe:
            msg["List-Unsubscribe"] = unsubscribe
            if one_click:
                msg["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
        msg.set_content(rendered.text)
        msg.add_alternative(rendered.html, subtype="html")
        for part in msg.iter_parts():
            del part["MIME-Version"]
    except (ValueError, TypeError) as exc:  # the email package refuses malformed header values
        raise RenderError(n.dedup_key, f"cannot build e-mail: {exc}") from exc
    problems = header_problems(msg)
    if problems:
        # Sent all the same: a reminder whose subject some client shows garbled still beats none.
        # Logged, because empty encoded words went out in many long non-ASCII subjects and nothing
        # looked at the fields as written.
        _header_faults.failure("invalid header", f"alert {n.dedup_key}: sent with a header against the mail "
                               "standards: " + "; ".join(problems))
    return msg
