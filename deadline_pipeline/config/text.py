"""Checks of the text values of a configuration: one line of printable text, a known time zone,
quiet hours, a URL host in the dotted-quad form. Each raises ``ValueError`` with the message the
loader shows after the key path; pydantic validators call them."""

from __future__ import annotations

import re
import unicodedata
from datetime import time
from typing import Annotated
from urllib.parse import urlparse

from pydantic import AfterValidator

from deadline_pipeline.timezones import UnknownTimeZone, resolve_zone


def parse_quiet_hours(text: str) -> tuple[time, time]:
    """``"22:00-07:00"`` → ``(time(22, 0), time(7, 0))``; local wall times, start ≠ end.
    Raises ``ValueError`` naming the text."""
    m = re.fullmatch(r"\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*", text or "")
    try:
        if not m:
            raise ValueError
        start, end = time(int(m[1]), int(m[2])), time(int(m[3]), int(m[4]))
    except ValueError:
        raise ValueError(f"quiet hours {text!r}: expected 'HH:MM-HH:MM', e.g. '22:00-07:00'") from None
    if start == end:
        raise ValueError(f"quiet hours {text!r}: start and end are equal")
    return start, end


def check_zone(value: str) -> str:
    """``value`` unchanged when it names a time zone :func:`~deadline_pipeline.timezones.resolve_zone`
    knows (IANA names, ``UTC±N``, ``AoE``…); raises ``ValueError`` with that function's message."""
    try:
        resolve_zone(value)
    except UnknownTimeZone as exc:
        raise ValueError(str(exc)) from None
    return value


# Characters that show as nothing, so that "ann" and "\ufeffann" look the same and are different ids,
# tenants or addresses: U+FEFF (a byte order mark; two CSV files saved with one and concatenated put
# it at the start of a row, inside that subscriber's id), the zero-width space, non-joiner and joiner
# (U+200B-U+200D) and the word joiner (U+2060). Every field checked here is matched as exact text
# (a subscription names subscribers and channels by it, planning compares tenants), none is prose,
# so even the joiners some scripts and emoji sequences use are refused rather than let two names
# that look alike differ.
_INVISIBLE = {"\ufeff": "a byte order mark", "\u200b": "a zero-width space", "\u200c": "a zero-width non-joiner",
              "\u200d": "a zero-width joiner", "\u2060": "a word joiner"}


def one_line_of_text(value: str, what: str = "a value") -> str:
    """``value`` unchanged when it holds no control character (Unicode category ``Cc``: NUL, ESC, CR,
    LF, DEL, C1), no line or paragraph separator and no invisible character (:data:`_INVISIBLE`).
    Raises ``ValueError`` naming the first one as ``U+XXXX`` (an invisible one with its position in
    ``value``, counted from 1).
    A subscriber's fields end up in mail headers, request URLs, SQL text and report lines:
    PostgreSQL refuses NUL, so one subscriber's ``"t1\\0"`` once failed planning for every
    subscriber there, and an address with a BEL in it passed loading only to be escalated at every send."""
    for at, c in enumerate(value, start=1):
        if unicodedata.category(c) in ("Cc", "Zl", "Zp"):
            found = f"the control character U+{ord(c):04X}"
        elif c in _INVISIBLE:  # its place said too: the value looks the same with it or without it
            found = f"the invisible character U+{ord(c):04X} ({_INVISIBLE[c]}) at character {at}"
        else:
            continue
        raise ValueError(f"{value!r} contains {found}; {what} is one line of printable text")
    return value


# A name or address that ends up in a mail header, a log line or a report: one line of printable text.
# A sender with a CR/LF in it loaded and then failed every send of its channel (the e-mail library
# refuses a header with a line break), a subscription or channel name with an escape sequence printed
# it into every report line.
ONE_LINE_NAME = AfterValidator(lambda v: one_line_of_text(v, "a name"))
SenderAddress = Annotated[str, AfterValidator(lambda v: one_line_of_text(v, "a sender address"))]


def refuse_legacy_ipv4(url: str) -> None:
    """Raise ``ValueError`` when ``url``'s host is an IPv4 address in a legacy ``inet_aton`` spelling
    (``2130706433``, ``127.1``, ``0x7f.1``, ``0177.0.0.1``).

    Such a host passed loading and was refused at send time, escalating every reminder to that
    subscriber; HTTP clients and the outbound guard read these spellings differently, so the only
    safe reading is none: the dotted-quad form is required, and the error gives it.
    """
    import ipaddress

    from deadline_pipeline.security.outbound import literal_address

    try:
        host = urlparse(url).hostname
    except ValueError:
        return  # an unparseable URL: refused with its own message at send time
    if not host or host.startswith("["):
        return
    try:
        ipaddress.ip_address(host)
        return  # canonical
    except ValueError:
        pass
    meant = literal_address(host)
    if meant is not None:
        raise ValueError(f"host {host!r} is a legacy spelling of the IPv4 address {meant}; write the address "
                         f"as {meant}")
