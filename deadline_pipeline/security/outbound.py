"""The outbound guard: which network addresses a request of the product may reach.

Every URL the product contacts comes from configuration or from data (a source's redirect, a
subscriber's ``webhook_url``), so a hostile or mistaken value could make the pipeline POST to the
cloud metadata service (``169.254.169.254``), a database port on the same host (``127.0.0.1:5432``)
or an internal service (server-side request forgery, OWASP SSRF Prevention Cheat Sheet). The guard:

* **decides on addresses, not names**: the host is resolved and *every* address it resolves to must
  pass; numeric spellings that resolvers accept (``0x7f000001``, ``2130706433``, ``127.1``,
  ``[::ffff:127.0.0.1]``) are parsed as the address they denote, never looked up;
* **refuses by default** loopback, private (RFC 1918, RFC 4193), link-local (RFC 3927, incl. the
  metadata address), multicast, unspecified and every other not globally routable address, and the
  IPv4-mapped / 6to4 / Teredo IPv6 forms of them;
* **admits** an address inside ``network.allow`` (CIDR list), and with ``network.allow_private``
  any private or shared (RFC 6598) unicast address - never loopback, link-local, multicast or
  unspecified, which only ``allow`` can admit;
* **pins the checked address** (no DNS rebinding): the httpx transport
  (:func:`guarded_httpx_client`) and the aiohttp connector (:func:`guarded_aiohttp_connector`)
  connect to the very address that was checked, and check the address of every socket again right
  before it connects; each redirect target is a new connection and is checked the same way.

A refusal raises :class:`OutboundRefused`, a permanent error naming the address and the rule: a
channel records it as permanent (never retried), a source fetch as not retryable.

The httpx transport also carries the blocking channels' time limit: inside :func:`request_deadline`,
every connect, TLS handshake, write and read of a guarded httpx request gets only the time left
until the deadline, so a peer dripping its answer cannot hold the request past it (httpx's own
timeouts are per phase, and the read timeout restarts with every chunk). Without a deadline the
transport behaves as before.

Reusable API for any channel: :func:`check_url` (a decision, resolving the host),
:func:`check_address` (a decision on one IP), :func:`guarded_httpx_client`,
:func:`request_deadline`, :func:`guarded_aiohttp_connector`.
"""

from __future__ import annotations

import http.cookiejar
import ipaddress
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
#: ``resolver(host, port)`` → the IP addresses (text) ``host`` resolves to; raises ``OSError``.
Resolver = Callable[[str, int], Sequence[str]]


def system_resolver(host: str, port: int) -> list[str]:
    """The addresses of ``host`` from the system resolver (``getaddrinfo``), without duplicates."""
    seen: list[str] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        addr = str(sockaddr[0]).split("%", 1)[0]  # an IPv6 zone id is not part of the address
        if addr not in seen:
            seen.append(addr)
    return seen


class OutboundRefused(Exception):
    """A request the guard refused. Permanent: the same target will be refused again.

    ``host``: the host as written in the URL; ``address``: the refused address (text) or ``None``
    when the host itself is unusable; ``rule``: why, e.g. ``"loopback"``, ``"IPv4-mapped loopback"``,
    ``"link-local"``, ``"private"``. The message names all three and how to allow the address.
    """

    def __init__(self, host: str, address: str | None, rule: str) -> None:
        where = f"{address} (host {host!r})" if address and address != host.strip("[]") else repr(host)
        hint = ("; to allow it, add it to network.allow in the configuration"
                if address else "")
        super().__init__(f"outbound request refused: {where} is {rule}{hint}")
        self.host = host
        self.address = address
        self.rule = rule


@dataclass(frozen=True)
class NetworkPolicy:
    """Which addresses outbound requests may reach (see the module docstring).

    ``allow``: networks always admitted (e.g. ``127.0.0.1/32`` for a local receiver).
    ``allow_private``: admit private and shared unicast ranges (RFC 1918, RFC 4193, RFC 6598).
    ``resolver``: how host names are resolved (default: the system's); tests inject one.
    """

    allow: tuple[IPNetwork, ...] = ()
    allow_private: bool = False
    resolver: Resolver | None = field(default=None, compare=False)

    @classmethod
    def from_strings(cls, allow: Iterable[str] = (), allow_private: bool = False,
                     resolver: Resolver | None = None) -> NetworkPolicy:
        """A policy from CIDR texts (``"10.0.0.0/8"``, ``"::1/128"``, a bare address = one host).

        Raises ``ValueError`` naming the entry that is not a network.
        """
        nets = []
        for entry in allow:
            try:
                nets.append(ipaddress.ip_network(str(entry).strip(), strict=False))
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP network such as '10.0.0.0/8' or '127.0.0.1/32'") from None
        return cls(tuple(nets), allow_private, resolver)

    def with_resolver(self, resolver: Resolver) -> NetworkPolicy:
        """This policy resolving names with ``resolver``."""
        return NetworkPolicy(self.allow, self.allow_private, resolver)


#: The default: only globally routable addresses.
DEFAULT_POLICY = NetworkPolicy()


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    if ip.ipv4_mapped is not None:
        return "IPv4-mapped", ip.ipv4_mapped
    if ip.sixtofour is not None:
        return "6to4", ip.sixtofour
    if ip.teredo is not None:
        return "Teredo", ip.teredo[1]
    if ip in _NAT64:
        return "NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # RFC 6598 carrier-grade NAT


def _category(ip: IPAddress) -> str | None:
    """The refusal category of one plain address, or ``None`` for a globally routable one."""
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_private or ip in _SHARED:
        # is_private includes reserved documentation/benchmark ranges; only true private use and
        # shared address space may be admitted by allow_private (see refusal_rule).
        if ip.version == 4 and any(ip in n for n in _PRIVATE_USE):
            return "private"
        if ip.version == 6 and ip in _ULA:
            return "private"
        if ip in _SHARED:
            return "private"
        return "reserved"
    if ip.is_reserved or not ip.is_global:
        return "reserved"
    return None


_PRIVATE_USE = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
_ULA = ipaddress.ip_network("fc00::/7")


def refusal_rule(address: str | IPAddress, policy: NetworkPolicy = DEFAULT_POLICY) -> str | None:
    """Why ``policy`` refuses ``address`` (e.g. ``"loopback"``, ``"IPv4-mapped link-local"``), or
    ``None`` when it may be contacted. Raises ``ValueError`` for text that is not an IP address."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if any(ip.version == n.version and ip in n for n in policy.allow):
        return None
    prefix = ""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            # ::ffff:127.0.0.1 reaches 127.0.0.1: judge (and allow) the IPv4 address it carries.
            prefix, ip = embedded[0] + " ", embedded[1]
            if any(ip.version == n.version and ip in n for n in policy.allow):
                return None
    category = _category(ip)
    if category is None or (category == "private" and policy.allow_private):
        return None
    return prefix + category


def check_address(address: str, policy: NetworkPolicy = DEFAULT_POLICY, host: str | None = None) -> None:
    """Raise :class:`OutboundRefused` when ``policy`` refuses ``address`` (text IP)."""
    try:
        rule = refusal_rule(address, policy)
    except ValueError:
        raise OutboundRefused(host or address, None, f"not an IP address ({address!r})") from None
    if rule is not None:
        raise OutboundRefused(host or address, address, rule)


def literal_address(host: str) -> str | None:
    """The IP address ``host`` spells, or ``None`` for a name.

    Accepts what resolvers accept without a lookup: ``[::1]``, ``127.0.0.1``, and the legacy
    ``inet_aton`` forms ``0x7f000001``, ``2130706433``, ``0177.0.0.1``, ``127.1``.
    """
    text = host.strip().strip("[]").split("%", 1)[0]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    try:
        return socket.inet_ntoa(socket.inet_aton(text))
    except (OSError, UnicodeError, ValueError):
        return None


def resolve_checked(host: str, port: int, policy: NetworkPolicy = DEFAULT_POLICY) -> list[str]:
    """The addresses of ``host`` that a connection may use, every one checked against ``policy``.

    A host any of whose addresses is refused is refused as a whole (a name answering one public and
    one internal address would otherwise reach inside on a retry). Raises :class:`OutboundRefused`,
    or ``OSError`` (``socket.gaierror``) when the name does not resolve.
    """
    literal = literal_address(host)
    if literal is not None:
        check_address(literal, policy, host)
        return [literal]
    name = host.strip().rstrip(".").lower()
    if not name:
        raise OutboundRefused(host, None, "an empty host name")
    addresses = list((policy.resolver or system_resolver)(name, port))
    if not addresses:
        raise socket.gaierror(f"{host!r} resolved to no address")
    for addr in addresses:
        check_address(addr, policy, host)
    return addresses


def check_url(url: str, policy: NetworkPolicy = DEFAULT_POLICY) -> list[str]:
    """Resolve and check the host of an http(s) ``url``; returns the admitted addresses.

    A decision only (no connection). Raises :class:`OutboundRefused` (refused address, or no host),
    ``OSError`` when the name does not resolve, ``ValueError`` for an unparseable URL.
    """
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        raise OutboundRefused(url, None, "a URL without a host")
    port = parts.port or {"https": 443, "http": 80}.get(parts.scheme.lower(), 0)
    return resolve_checked(host, port, policy)


# --- httpx (sources, slack, the blocking webhook send) ----------------------------------------------


# --- a deadline for a whole blocking request (httpx) -----------------------------------------------

# The monotonic instant by which the guarded httpx requests of the current thread (context) must end;
# None: only the client's per-phase timeouts apply. Set with request_deadline().
_REQUEST_DEADLINE: ContextVar[float | None] = ContextVar("outbound_request_deadline", default=None)


@contextmanager
def request_deadline(seconds: float) -> Iterator[None]:
    """Within the block, every request of a :func:`guarded_httpx_client` made in this thread ends
    within ``seconds`` (counted from entering the block), however slowly the peer answers.

    Why: httpx's timeouts are per phase and its read timeout restarts with every chunk, so a peer
    that drips its answer a byte at a time, each byte within the read timeout, holds the request for
    as long as it likes - headers or body alike. httpx has no total timeout and its per-request
    ``timeout`` is fixed when the request starts; what does see every wait is httpcore's network
    stream, which takes a timeout on each connect, TLS handshake, write and read. The guarded
    backend's streams therefore give each of those calls the time left until this deadline (or the
    client's own per-phase timeout when shorter), and raise the phase's timeout error once it has
    passed: ``httpx.ConnectTimeout`` before anything was sent (connect, TLS handshake, or a name
    lookup that took the whole time), ``httpx.WriteTimeout`` / ``httpx.ReadTimeout`` after.

    Bound: ``seconds`` plus the overshoot of one blocking socket call past its timeout (scheduling,
    milliseconds). Not shortened: the name lookup itself (bounded by the system resolver's own
    timeout; the deadline is checked when it returns), the wait for a free pooled connection (the
    client's ``pool`` timeout; the rest of the request gets only the time left), and a ``send()``
    that a peer holding a zero receive window keeps blocked (each write call gets the time left, but
    httpcore loops over partial sends; a request body smaller than the socket's send buffer, as
    every channel's is, goes out in one call without waiting on the peer).

    Sync httpx runs the whole request in the calling thread, so a context variable reaches the
    streams without threading the deadline through httpx; nested blocks restore the outer deadline.
    """
    token = _REQUEST_DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _REQUEST_DEADLINE.reset(token)


def _time_left(timeout: float | None, expired: type[Exception]) -> float | None:
    """``timeout`` shortened to the time left until the current :func:`request_deadline` (unchanged
    without one); raises ``expired`` (an httpcore timeout class) when the deadline has passed."""
    deadline = _REQUEST_DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise expired("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


def _deadline_stream(inner):
    """``inner`` (an httpcore network stream) with every blocking call bounded by :func:`_time_left`."""
    import httpcore

    class DeadlineStream(httpcore.NetworkStream):
        def __init__(self, stream) -> None:
            self._inner = stream

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self._inner.read(max_bytes, _time_left(timeout, httpcore.ReadTimeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            if buffer:
                self._inner.write(buffer, _time_left(timeout, httpcore.WriteTimeout))

        def close(self) -> None:
            self._inner.close()

        def start_tls(self, ssl_context, server_hostname=None, timeout=None):
            # Nothing of the request has left during the handshake: a timeout here is a connect timeout.
            return DeadlineStream(self._inner.start_tls(ssl_context, server_hostname,
                                                        _time_left(timeout, httpcore.ConnectTimeout)))

        def get_extra_info(self, info: str):
            return self._inner.get_extra_info(info)

    return DeadlineStream(inner)


def _guarded_backend(policy: NetworkPolicy):
    import httpcore

    class GuardedBackend(httpcore.NetworkBackend):
        """httpcore network backend that connects only to checked addresses, and checks the peer."""

        def __init__(self) -> None:
            self._inner = httpcore.SyncBackend()

        def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
            last: Exception | None = None
            try:
                addresses = resolve_checked(host, port, policy)
            except OSError as exc:
                raise httpcore.ConnectError(f"cannot resolve {host!r}: {exc}") from None
            for addr in addresses:
                try:
                    # The checked address itself, not the name: a second lookup could answer differently.
                    stream = self._inner.connect_tcp(addr, port, timeout=_time_left(timeout, httpcore.ConnectTimeout),
                                                     local_address=local_address, socket_options=socket_options)
                except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                    last = exc
                    continue
                peer = stream.get_extra_info("socket").getpeername()[0]
                try:
                    check_address(str(peer).split("%", 1)[0], policy, host)
                except OutboundRefused:
                    stream.close()
                    raise
                return _deadline_stream(stream)
            assert last is not None
            raise last

        def connect_unix_socket(self, path, timeout=None, socket_options=None):
            raise OutboundRefused(path, None, "a Unix socket")

        def sleep(self, seconds: float) -> None:
            self._inner.sleep(seconds)

    return GuardedBackend()


def guarded_httpx_client(policy: NetworkPolicy = DEFAULT_POLICY, **kwargs):
    """An ``httpx.Client`` whose every connection passes the guard (``kwargs`` go to the client), and
    whose requests end by the :func:`request_deadline` they are made in, if any.

    Proxies from the environment are not used (``trust_env=False``): through a proxy the guard would
    check the proxy, and the proxy would reach the internal target. A refusal surfaces from the
    client's calls as :class:`OutboundRefused` before any byte is sent.

    Cookies are refused (:func:`refusing_cookie_jar`): one client serves every subscriber of a
    channel, so a cookie one receiver set would be sent with the next alerts to the same host,
    whoever they are for.
    """
    import httpx

    transport = httpx.HTTPTransport(trust_env=False, verify=kwargs.pop("verify", True))
    # httpx has no public hook for the network backend; the pool's is replaced. If httpx renamed it,
    # the guard's loopback-refusal tests fail (they connect through this client).
    transport._pool._network_backend = _guarded_backend(policy)
    return httpx.Client(transport=transport, trust_env=False, cookies=refusing_cookie_jar(), **kwargs)


def refusing_cookie_jar() -> http.cookiejar.CookieJar:
    """A stdlib cookie jar that keeps no cookie (its policy admits no domain), for an HTTP client
    shared by alerts to many subscribers: state one receiver sets must never travel with another
    subscriber's alert. Webhooks, Slack, CalDAV and source fetches need no cookie: every request
    carries its own credentials."""
    return http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


# --- aiohttp (the webhook sweep path) ---------------------------------------------------------------


def guarded_aiohttp_connector(policy: NetworkPolicy = DEFAULT_POLICY, **kwargs):
    """An ``aiohttp.TCPConnector`` (``kwargs`` go to it) that resolves names through the guard and
    checks the address of every socket right before it connects (literal IPs, which aiohttp does not
    resolve, included). Must be created on the running event loop. Refusals raise
    :class:`OutboundRefused`.
    """
    import asyncio

    import aiohttp
    from aiohttp.abc import AbstractResolver

    class GuardedResolver(AbstractResolver):
        async def resolve(self, host, port=0, family=socket.AF_INET):
            loop = asyncio.get_running_loop()
            addresses = await loop.run_in_executor(None, resolve_checked, host, port, policy)
            out = []
            for addr in addresses:
                fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
                if family not in (socket.AF_UNSPEC, 0) and fam != family:
                    continue
                out.append({"hostname": host, "host": addr, "port": port, "family": fam, "proto": 0,
                            "flags": socket.AI_NUMERICHOST})
            if not out:
                raise OSError(f"{host!r} has no address of the requested family")
            return out

        async def close(self) -> None:
            return None

    def socket_factory(addr_info):
        family, type_, proto, _canon, sockaddr = addr_info
        # The peer check: the exact address this socket is about to connect to.
        check_address(str(sockaddr[0]).split("%", 1)[0], policy)
        return socket.socket(family, type_, proto)

    return aiohttp.TCPConnector(resolver=GuardedResolver(), socket_factory=socket_factory, **kwargs)
