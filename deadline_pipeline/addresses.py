"""Internationalised e-mail addresses: IDNA domains and UTF-8 local parts.

* A domain goes on the wire in IDNA form (RFC 5890/5891, UTS #46 mapping): ``ana@bücher.example`` is
  sent as ``ana@xn--bcher-kva.example``, which every SMTP server and mail header accepts. Without the
  conversion the email package wrote the domain as an RFC 2047 encoded word, which is not an address.
* A non-ASCII *local part* (``jörg@example.org``) has no ASCII form: it needs SMTPUTF8 (RFC 6531) on
  the SMTP session and UTF-8 headers (RFC 6532). A channel that cannot carry it must refuse the
  address when the configuration is loaded, naming the line, instead of escalating every reminder to
  that subscriber at send time.
"""

from __future__ import annotations

from dataclasses import dataclass

import idna


class AddressError(ValueError):
    """An address that cannot be sent anywhere (no ``@``, a domain IDNA refuses); the message names it."""


@dataclass(frozen=True)
class WireAddress:
    """``address``: local part and IDNA (A-label) domain, joined by ``@``; ``needs_smtputf8``: the
    local part is not ASCII, so only an SMTPUTF8 session (and UTF-8 headers) can carry it."""

    address: str
    needs_smtputf8: bool


def wire_address(address: str) -> WireAddress:
    """The form of ``address`` to put on the wire. Raises :class:`AddressError` naming the address
    when it has no ``@`` or its domain is not a valid internationalised domain name."""
    local, at, domain = (address or "").rpartition("@")
    if not at or not local or not domain:
        raise AddressError(f"{address!r} is not an e-mail address (local@domain)")
    if domain.isascii():
        ascii_domain = domain
    else:
        try:
            # UTS #46 maps what users type (capitals, full-width dots) before IDNA2008 encoding.
            ascii_domain = idna.encode(domain, uts46=True).decode("ascii")
        except idna.IDNAError as exc:
            raise AddressError(f"{address!r}: domain {domain!r} is not a valid internationalised domain "
                               f"name: {exc}") from None
    return WireAddress(f"{local}@{ascii_domain}", needs_smtputf8=not local.isascii())


def channel_carries_utf8_local_part(channel_cfg) -> bool:
    """Whether a channel configuration can deliver to a non-ASCII local part: ``maildir`` writes UTF-8
    headers into a file (RFC 6532); ``smtp`` only when its ``smtputf8`` setting says the server offers
    SMTPUTF8 (checked again on every session); channels without e-mail are not concerned (True)."""
    kind = getattr(channel_cfg, "type", None)
    if kind == "smtp":
        return bool(getattr(channel_cfg, "smtputf8", False))
    return True


def address_problems(cfg, origins: dict[str, str]) -> list[str]:
    """Every subscriber (and escalation) e-mail address of ``cfg`` (a validated ``DeadlinesConfig``)
    that cannot be delivered by a channel it is routed to: a domain IDNA refuses, or a non-ASCII local
    part on an ``smtp`` channel without ``smtputf8: true``. ``origins`` maps a subscriber id to where it
    was written (``FILE: line N`` for a CSV row, ``FILE: subscribers[i]`` for the YAML list). Returns
    one line per problem, subscribers first in their order, then the escalation address; never raises."""
    problems = [p for sub in cfg.subscribers if sub.email
                for p in subscriber_address_problems(cfg, sub, origins.get(sub.id, f"subscribers ({sub.id})"))]
    return problems + escalation_address_problems(cfg)


def routed_channels(cfg, sub) -> list[tuple[str, str]]:
    """``(subscription name, channel name)`` for every channel that carries reminders to subscriber
    ``sub``: the subscriptions naming its id, and those for ``"*"`` with a source of its tenant."""
    tenants_of = {s.name: s.tenant for s in cfg.sources}
    out = []
    for subscription in cfg.subscriptions:
        routed = sub.id in subscription.subscribers or (
            "*" in subscription.subscribers and any(tenants_of.get(s) == sub.tenant for s in subscription.sources))
        if routed:
            out += [(subscription.name, name) for name in subscription.channels]
    return out


def subscriber_address_problems(cfg, sub, where: str) -> list[str]:
    """The problems of subscriber ``sub``'s e-mail address (see :func:`address_problems`), each line
    starting with ``where`` (the place the subscriber was written)."""
    try:
        wire = wire_address(sub.email)
    except AddressError as exc:
        return [f"{where}: email: {exc}"]
    if not wire.needs_smtputf8:
        return []
    return [f"{where}: email {sub.email!r} has a non-ASCII local part, which channel {name!r} "
            f"(smtp, subscription {subscription!r}) cannot carry: set smtputf8: true on the "
            "channel if its server offers SMTPUTF8 (RFC 6531), or use an ASCII address"
            for subscription, name in routed_channels(cfg, sub)
            if not channel_carries_utf8_local_part(cfg.channels[name])]


def escalation_address_problems(cfg) -> list[str]:
    """The problems of ``escalation.email`` (see :func:`address_problems`); empty without one."""
    esc = cfg.escalation
    if not esc.email:
        return []
    try:
        wire = wire_address(esc.email)
    except AddressError as exc:
        return [f"escalation.email: {exc}"]
    return [f"escalation.email: {esc.email!r} has a non-ASCII local part, which channel {name!r} "
            "(smtp without smtputf8: true) cannot carry"
            for name in (esc.channels if wire.needs_smtputf8 else [])
            if not channel_carries_utf8_local_part(cfg.channels[name])]
