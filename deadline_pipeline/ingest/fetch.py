"""Fetch the raw bytes of one source, distrusting the system that serves them.

Sources are external systems the project does not control, so :func:`fetch` assumes any of them may
be slow, huge, redirect in circles, answer with an error page, or be misconfigured. The policy:

* **Bounded in time.** ``timeout_seconds`` limits connecting and every single wait for data, and the
  whole fetch (redirects included) may take at most :data:`TOTAL_TIME_FACTOR` times that, so a server
  that trickles one byte at a time - body or headers - cannot hold the pipeline forever either.
* **Bounded in size.** A declared ``Content-Length`` above ``max_bytes`` is refused before the body is
  read, and the streamed body is counted as it arrives, so an undeclared (chunked) or lying body is cut
  off one network read past the limit; at most ``max_bytes`` are ever kept in memory. Compressed
  bodies are counted after decompression, with decompression itself capped at the limit.
* **Bounded in hops.** Redirects are followed by hand, at most ``max_redirects`` of them, and every
  target is checked against ``allowed_schemes`` before it is contacted.
* **Schemes refused before any I/O.** A location whose scheme is not allowed (``ftp://``, or local
  files when ``file`` is not allowed) is refused without touching the network or disk.
* **Only reachable targets.** Every connection, the first and each redirect's, passes the outbound
  guard (:mod:`deadline_pipeline.security.outbound`): the host is resolved, its addresses checked
  against ``network`` (loopback, private, link-local … refused unless allowed) and the connection
  made to the checked address. A refusal is a :class:`FetchError` that is not retryable.
* **Credentials stay secret and stay home.** Tokens, user names and passwords come from environment
  variables named in the configuration, never from the configuration itself. They are sent only to
  the origin (scheme, host, port) of the configured location, only over https or to a loopback
  address, and never appear in :class:`FetchError` messages, :attr:`FetchResult.final_url` or log
  lines; user names and passwords in URLs are stripped wherever a URL is shown.
* **Exactly what happened.** A success returns the bytes as served (an HTML error page answered with
  200 is returned like any other body: recognising it is the parser's job) with their SHA-256, size
  and validators, so the caller can store a snapshot before parsing. A ``304 Not Modified`` answer to
  a conditional request returns no content and ``not_modified=True``. Everything else raises
  :class:`FetchError`, which says whether trying again later may help.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import logging
import os
import stat
import time
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

import httpx

from deadline_pipeline.security.outbound import (
    DEFAULT_POLICY,
    NetworkPolicy,
    OutboundRefused,
    check_url,
    request_deadline,
)
from deadline_pipeline.security.redact import redact, register_secret, secret_from_env

log = logging.getLogger(__name__)

try:
    _VERSION = version("deadline_pipeline")
except PackageNotFoundError:  # running from a source tree that was never installed
    _VERSION = "0+unknown"

USER_AGENT = f"deadline-pipeline/{_VERSION}"

#: The whole fetch, redirects included, may last at most this many times ``timeout_seconds``.
TOTAL_TIME_FACTOR = 4

_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
# Retrying helps when the server is overloaded or failing, or asked us to slow down.
_RETRYABLE_CLIENT_STATUSES = frozenset({408, 429})
# zlib window settings for the content codings we can decode with a bounded output size.
_ZLIB_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


@dataclass(frozen=True)
class FetchResult:
    """What one fetch produced.

    ``content`` is ``None`` exactly when ``not_modified`` is true (the server answered 304); then
    ``sha256`` is ``None`` and ``size`` is 0. ``fetched_at`` is the aware UTC time the caller passed as
    ``now``. ``http_status``, ``etag`` and ``last_modified`` are ``None`` for local files. ``size`` is in
    bytes and ``sha256`` is the lowercase hex digest of ``content``. ``final_url`` is the URL the bytes
    came from after redirects (a ``file://`` URL for local files), without any user name or password.
    """

    content: bytes | None
    not_modified: bool
    fetched_at: datetime
    http_status: int | None
    etag: str | None
    last_modified: str | None
    sha256: str | None
    size: int
    final_url: str


class FetchError(Exception):
    """A fetch that produced no usable answer.

    The message names the source and what went wrong and never contains credentials. ``retryable``
    is true when the same fetch may succeed later without anyone changing the configuration (a
    timeout, a refused connection, a 5xx, 408 or 429 answer).
    """

    def __init__(self, source: str, message: str, *, retryable: bool) -> None:
        # Redacted once, here: the message is logged, stored as the source's last_error and shown in
        # Dagster metadata, and a URL in it may carry a token in its query.
        super().__init__(redact(f"source {source!r}: {message}"))
        self.source = source
        self.retryable = retryable


def fetch(
    source: str,
    location: str,
    *,
    now: datetime,
    etag: str | None = None,
    last_modified: str | None = None,
    timeout_seconds: float = 30.0,
    max_bytes: int = 20 * 1024 * 1024,
    max_redirects: int = 5,
    allowed_schemes: frozenset[str] = frozenset({"http", "https", "file"}),
    auth_env: str | None = None,
    headers_env: dict[str, str] | None = None,
    username_env: str | None = None,
    password_env: str | None = None,
    network: NetworkPolicy = DEFAULT_POLICY,
    client: httpx.Client | None = None,
) -> FetchResult:
    """Fetch the bytes of ``source`` from ``location`` (an http(s) URL, a ``file://`` URL or a path).

    ``now`` is an aware datetime (stored as UTC in the result). ``etag`` and ``last_modified`` are the
    validators of the previous snapshot; when given, the request is conditional and a 304 answer
    returns ``not_modified=True`` without content (local files are always read in full).
    ``timeout_seconds`` (seconds) limits connecting and each wait for data; the whole fetch is capped
    at :data:`TOTAL_TIME_FACTOR` times it. ``max_bytes`` (bytes) is the largest body accepted.
    ``max_redirects`` is the number of redirects followed. ``auth_env`` names an environment variable
    holding a bearer token; ``headers_env`` maps header names to environment variable names holding
    their values. ``username_env`` and ``password_env`` name the variables of an HTTP Basic user
    name and password. All are used for http(s) only and their values are registered as secrets
    (:func:`~deadline_pipeline.security.redact.register_secret`). ``network`` is the outbound policy
    every connection must pass. ``client`` lets the caller share connections; its own default headers
    and authentication are not sent, so credentials follow this module's rules, and since its
    transport is the caller's, each hop's host is checked (resolved) before the request instead of
    at connect time; without ``client`` a guarded client pins the checked address.

    Raises :class:`FetchError` for every failure of the source or of its configuration (scheme not
    allowed, unset credential variable, network error, timeout, non-2xx status, too many redirects,
    body too large, missing file, a target the outbound guard refuses), and :class:`ValueError` for a
    naive ``now``, a timeout <= 0 or a negative limit.
    """
    _check_arguments(now, timeout_seconds, max_bytes, max_redirects)
    fetched_at = now.astimezone(UTC)
    allowed = frozenset(s.lower() for s in allowed_schemes)

    scheme = _allowed_scheme(source, location, allowed)
    if scheme == "file":
        return _fetch_file(source, location, fetched_at, max_bytes)
    url, headers, secrets = _http_target(source, location, auth_env, headers_env, username_env, password_env)

    owns_client = client is None
    if client is None:
        client = guarded_client = _guarded_client(network)
    else:
        guarded_client = None
    try:
        # The deadline checks between body chunks cannot see a server dripping its status line and
        # headers a byte at a time (each within the read timeout): within this block the guarded
        # client's connections get only the time left of the whole fetch (a caller's client: not).
        with request_deadline(TOTAL_TIME_FACTOR * timeout_seconds):
            return _fetch_http(
                source, url, client, fetched_at=fetched_at, etag=etag, last_modified=last_modified,
                timeout_seconds=timeout_seconds, max_bytes=max_bytes, max_redirects=max_redirects,
                allowed=allowed, credential_headers=headers, secrets=secrets,
                precheck=None if guarded_client is not None else network,
            )
    finally:
        if owns_client:
            client.close()


def _check_arguments(now: datetime, timeout_seconds: float, max_bytes: int, max_redirects: int) -> None:
    """Raise :class:`ValueError` for a naive ``now``, ``timeout_seconds`` <= 0 or a negative limit."""
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("fetch: `now` must be an aware datetime")
    if timeout_seconds <= 0 or max_bytes < 0 or max_redirects < 0:
        raise ValueError("fetch: timeout_seconds must be > 0, max_bytes and max_redirects >= 0")


def _allowed_scheme(source: str, location: str, allowed: frozenset[str]) -> str:
    """The lowercase scheme of ``location`` (``file`` for a plain path): ``file``, ``http`` or
    ``https``. Raises a non-retryable :class:`FetchError` for a scheme not in ``allowed`` (lowercase)
    or one this module cannot fetch. No I/O."""
    scheme = _scheme_of(location)
    # Refused before any I/O: a configuration must not be able to reach a system it was not meant to.
    if scheme not in allowed:
        raise FetchError(
            source,
            f"scheme {scheme!r} of {_safe_location(location)} is not allowed (allowed: {sorted(allowed)})",
            retryable=False,
        )
    if scheme not in ("file", "http", "https"):
        raise FetchError(source, f"scheme {scheme!r} is not supported", retryable=False)
    return scheme


def _http_target(
    source: str, location: str, auth_env: str | None, headers_env: dict[str, str] | None,
    username_env: str | None, password_env: str | None,
) -> tuple[httpx.URL, dict[str, str], list[str]]:
    """(parsed URL, credential headers, secret values) of an http(s) ``location``: the headers come
    from the environment variables named (:func:`fetch`), and every secret value - theirs and the
    URL's user name and password - is registered for redaction. Raises a non-retryable
    :class:`FetchError` for an unset or unusable variable or an invalid URL."""
    secrets: list[str] = []
    headers = _credential_headers(source, auth_env, headers_env, secrets)
    if username_env or password_env:
        headers["Authorization"] = _basic_auth_from_env(source, username_env, password_env, secrets)
    try:
        url = httpx.URL(location)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        failure = FetchError(
            source, f"invalid URL {_safe_location(location)}: {_redact(str(exc), location, secrets)}",
            retryable=False,
        )
    else:
        failure = None
    if failure is not None:
        # Raised outside the `except` so the original exception (which may quote the raw URL with
        # its password) is not attached as context and printed in a traceback.
        raise failure
    if url.userinfo:
        secrets.extend(s for s in (url.username, url.password) if s)
    for value in secrets:
        register_secret(value)
    return url, headers, secrets


# --- local files -------------------------------------------------------------------------------------


def _fetch_file(source: str, location: str, fetched_at: datetime, max_bytes: int) -> FetchResult:
    path = _local_path(source, location)
    failure: FetchError | None = None
    try:
        # O_NONBLOCK: opening a FIFO with no writer would otherwise block forever.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        failure = FetchError(source, f"local file {path} does not exist", retryable=False)
    except (PermissionError, IsADirectoryError) as exc:
        failure = FetchError(source, f"cannot read local file {path}: {exc.strerror}", retryable=False)
    except OSError as exc:
        failure = FetchError(source, f"cannot open local file {path}: {exc.strerror}", retryable=True)
    if failure is not None:
        raise failure
    info = os.fstat(fd)
    # Devices, pipes and directories are not documents: /dev/zero would never end.
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise FetchError(source, f"local path {path} is not a regular file", retryable=False)
    with os.fdopen(fd, "rb") as fh:
        if info.st_size > max_bytes:
            raise FetchError(
                source, f"local file {path} is {info.st_size} bytes, over the limit of {max_bytes} bytes",
                retryable=False,
            )
        try:
            # Read one byte past the limit: a file that grew after fstat must not slip through.
            content = fh.read(max_bytes + 1)
        except OSError as exc:
            failure = FetchError(source, f"cannot read local file {path}: {exc.strerror}", retryable=True)
    if failure is not None:
        raise failure
    if len(content) > max_bytes:
        raise FetchError(
            source, f"local file {path} grew past the limit of {max_bytes} bytes while being read",
            retryable=False,
        )
    log.info("fetched source %r from local file %s: %d bytes", source, path, len(content))
    return FetchResult(
        content=content, not_modified=False, fetched_at=fetched_at, http_status=None, etag=None,
        last_modified=None, sha256=hashlib.sha256(content).hexdigest(), size=len(content),
        final_url=path.as_uri(),
    )


def _local_path(source: str, location: str) -> Path:
    if not location.lower().startswith("file:"):
        return Path(location).expanduser().absolute()
    parts = urlsplit(location)
    # file://server/share would be a network path in disguise; only this machine's files are local.
    if parts.netloc not in ("", "localhost"):
        raise FetchError(
            source, f"file URL {_safe_location(location)} names host {parts.hostname!r}; only local "
            "files (file:///path) are supported", retryable=False,
        )
    return Path(url2pathname(parts.path)).absolute()


# --- http(s) -----------------------------------------------------------------------------------------


def _guarded_client(network: NetworkPolicy) -> httpx.Client:
    from deadline_pipeline.security.outbound import guarded_httpx_client

    return guarded_httpx_client(network, follow_redirects=False)


def _basic_auth_from_env(source: str, username_env: str | None, password_env: str | None,
                         secrets: list[str]) -> str:
    """The Basic ``Authorization`` value from the two variables; a missing one is a FetchError."""
    values = []
    for variable in (username_env, password_env):
        value = secret_from_env(variable) if variable else None
        if not value:
            raise FetchError(source, f"environment variable {variable} (for HTTP Basic authentication) is "
                             f"{'not set' if value is None else 'empty'}", retryable=False)
        values.append(value)
    token = base64.b64encode(f"{values[0]}:{values[1]}".encode()).decode("ascii")
    secrets.extend((values[1], token, f"Basic {token}"))
    register_secret(token)
    return f"Basic {token}"


def _credential_headers(
    source: str, auth_env: str | None, headers_env: dict[str, str] | None, secrets: list[str]
) -> dict[str, str]:
    """Headers holding credentials read from the environment; their values are added to ``secrets``."""
    wanted: list[tuple[str, str]] = []
    if auth_env:
        wanted.append(("Authorization", auth_env))
    wanted.extend((headers_env or {}).items())
    headers: dict[str, str] = {}
    for header, variable in wanted:
        value = os.environ.get(variable)
        if value is None or not value.strip():
            state = "is not set" if value is None else "is empty"
            raise FetchError(
                source, f"environment variable {variable} (for header {header}) {state}", retryable=False
            )
        value = value.strip()
        # A line break in a value would smuggle extra headers, and the HTTP library's complaint
        # about it quotes the value; name the variable instead.
        if any(c in value for c in "\r\n\0"):
            raise FetchError(
                source, f"environment variable {variable} (for header {header}) contains a line break "
                "or NUL", retryable=False,
            )
        secrets.append(value)
        if header == "Authorization" and variable == auth_env:
            value = f"Bearer {value}"
            secrets.append(value)
        headers[header] = value
    return headers


@dataclass(frozen=True)
class _HttpFetch:
    """What stays the same on every hop of one http(s) fetch. ``origin``: (scheme, host, port) of the
    configured location, the only one credentials go to; ``deadline``: ``time.monotonic()`` value the
    whole fetch must finish by; ``timeout_seconds`` in seconds, ``max_bytes`` in bytes; ``allowed``:
    lowercase schemes; ``precheck``: the policy to check each hop's host against before sending (a
    caller's client), or ``None`` (the guarded client checks at connect time)."""

    source: str
    origin: tuple[str, str, int | None]
    fetched_at: datetime
    etag: str | None
    last_modified: str | None
    timeout_seconds: float
    deadline: float
    max_bytes: int
    max_redirects: int
    allowed: frozenset[str]
    credential_headers: dict[str, str]
    secrets: list[str]
    precheck: NetworkPolicy | None

    @property
    def conditional(self) -> bool:
        return self.etag is not None or self.last_modified is not None


def _fetch_http(
    source: str,
    url: httpx.URL,
    client: httpx.Client,
    *,
    fetched_at: datetime,
    etag: str | None,
    last_modified: str | None,
    timeout_seconds: float,
    max_bytes: int,
    max_redirects: int,
    allowed: frozenset[str],
    credential_headers: dict[str, str],
    secrets: list[str],
    precheck: NetworkPolicy | None = None,
) -> FetchResult:
    """Follow ``url`` hop by hop (at most ``max_redirects`` redirects) to a :class:`FetchResult`;
    every failure is a :class:`FetchError` (see :func:`fetch`)."""
    origin = _origin(url)
    if (credential_headers or url.userinfo) and not _may_carry_credentials(url, origin):
        raise FetchError(
            source, f"refusing to send credentials over plain http to {_safe_url(url)}; use https",
            retryable=False,
        )
    job = _HttpFetch(
        source=source, origin=origin, fetched_at=fetched_at, etag=etag, last_modified=last_modified,
        timeout_seconds=timeout_seconds, deadline=time.monotonic() + TOTAL_TIME_FACTOR * timeout_seconds,
        max_bytes=max_bytes, max_redirects=max_redirects, allowed=allowed,
        credential_headers=credential_headers, secrets=secrets, precheck=precheck,
    )
    redirects = 0
    while True:
        outcome = _fetch_hop(job, client, url, redirects)
        if isinstance(outcome, FetchResult):
            return outcome
        url = outcome
        redirects += 1


def _request_headers(job: _HttpFetch, url: httpx.URL, secrets: list[str]) -> dict[str, str]:
    """The headers of the request to ``url``: validators when the fetch is conditional, and
    credentials only when ``url`` may carry them (:func:`_may_carry_credentials`); a Basic value
    built from the URL's user name and password is added to ``secrets``."""
    headers = {
        "User-Agent": USER_AGENT,
        # Asking for no compression keeps the stored snapshot identical to the served document
        # and spares us decompression bombs; codings sent anyway are decoded with a cap below.
        "Accept-Encoding": "identity",
    }
    if job.etag is not None:
        headers["If-None-Match"] = job.etag
    if job.last_modified is not None:
        headers["If-Modified-Since"] = job.last_modified
    if _may_carry_credentials(url, job.origin):
        if url.userinfo:
            headers["Authorization"] = _basic_auth(url, secrets)
        # A configured token wins over a user name and password left in the URL.
        headers.update(job.credential_headers)
    return headers


def _fetch_hop(job: _HttpFetch, client: httpx.Client, url: httpx.URL, redirects: int) -> FetchResult | httpx.URL:
    """One request: the final :class:`FetchResult`, or the URL a redirect points to (``redirects``
    already followed). Transport failures become :class:`FetchError` (:func:`_transport_failure`)."""
    timeout = httpx.Timeout(job.timeout_seconds)
    # The HTTP library logs the request URL verbatim, so it never gets to see the userinfo.
    request = httpx.Request(
        "GET", url.copy_with(userinfo=b"") if url.userinfo else url,
        headers=_request_headers(job, url, job.secrets), extensions={"timeout": timeout.as_dict()},
    )
    try:
        if job.precheck is not None:
            # A caller's client has no guarded transport: decide on this hop's host before sending.
            check_url(str(url), job.precheck)
        # auth=None and a hand-built request: the client's own default headers or auth must not
        # ride along to a redirect target on another host.
        response = client.send(request, stream=True, auth=None, follow_redirects=False)
        try:
            return _answer(job, url, response, redirects)
        finally:
            # Closing an unfinished stream drops the connection instead of draining the rest.
            response.close()
    except (OutboundRefused, OSError, httpx.HTTPError) as exc:
        failure = _transport_failure(job, url, redirects, exc)
    # Raised outside the `except` so the httpx exception, whose request carries the
    # credential headers, is not chained to what callers log.
    raise failure


def _transport_failure(job: _HttpFetch, url: httpx.URL, redirects: int,
                       exc: OutboundRefused | OSError | httpx.HTTPError) -> FetchError:
    """The :class:`FetchError` for an exception raised while sending to ``url`` or reading the
    answer: permanent for a refused target or an unusable request, retryable for name resolution,
    timeouts and network errors; past the fetch's deadline, the whole fetch was too slow."""
    source = job.source
    if isinstance(exc, OutboundRefused):
        # Permanent: the same address is refused again on every run until someone allows it.
        hop = f" (reached through {redirects} redirect(s))" if redirects else ""
        return FetchError(source, f"cannot fetch {_safe_url(url)}{hop}: {exc}", retryable=False)
    if isinstance(exc, OSError):  # the pre-check's name resolution failed: maybe better later
        return FetchError(source, f"cannot resolve the host of {_safe_url(url)}: {exc}", retryable=True)
    if isinstance(exc, httpx.TimeoutException):
        if time.monotonic() >= job.deadline:  # the whole fetch's time ran out, not one wait
            return _too_slow(source, url, job.timeout_seconds)
        return FetchError(
            source, f"{_safe_url(url)} did not answer within {job.timeout_seconds} s "
            f"({type(exc).__name__})", retryable=True,
        )
    detail = f"{type(exc).__name__}: {_redact(str(exc), str(url), job.secrets)}"
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.LocalProtocolError, httpx.InvalidURL)):
        return FetchError(source, f"cannot request {_safe_url(url)}: {detail}", retryable=False)
    # Refused or reset connections, DNS failures, truncated answers: the network or the
    # server may be better later.
    return FetchError(source, f"cannot fetch {_safe_url(url)}: {detail}", retryable=True)


def _answer(job: _HttpFetch, url: httpx.URL, response: httpx.Response, redirects: int) -> FetchResult | httpx.URL:
    """What ``response`` (from ``url``, still open) means: the URL to follow for a redirect, a
    not-modified or full :class:`FetchResult` (the body read within the limits), else a
    :class:`FetchError`."""
    status = response.status_code
    if status in _REDIRECT_STATUSES:
        next_url = _redirect_target(job, url, status, response.headers.get("Location"), redirects)
        log.info("source %r: %s redirected (HTTP %d) to %s", job.source, _safe_url(url), status,
                 _safe_url(next_url))
        if time.monotonic() > job.deadline:
            raise _too_slow(job.source, next_url, job.timeout_seconds)
        return next_url
    if status == 304:
        if not job.conditional:
            raise FetchError(
                job.source, f"{_safe_url(url)} answered 304 Not Modified to an unconditional "
                "request", retryable=False,
            )
        log.info("source %r: %s not modified", job.source, _safe_url(url))
        return FetchResult(
            content=None, not_modified=True, fetched_at=job.fetched_at, http_status=status,
            etag=response.headers.get("ETag", job.etag),
            last_modified=response.headers.get("Last-Modified", job.last_modified),
            sha256=None, size=0, final_url=_safe_url(url),
        )
    failure = _status_failure(job.source, url, status, response.reason_phrase, job.secrets)
    if failure is not None:
        raise failure
    content = _read_body(job.source, url, response, job.max_bytes, job.deadline, job.timeout_seconds)
    digest = hashlib.sha256(content).hexdigest()
    log.info("fetched source %r from %s: HTTP %d, %d bytes", job.source, _safe_url(url), status, len(content))
    return FetchResult(
        content=content, not_modified=False, fetched_at=job.fetched_at, http_status=status,
        etag=response.headers.get("ETag"), last_modified=response.headers.get("Last-Modified"),
        sha256=digest, size=len(content), final_url=_safe_url(url),
    )


def _redirect_target(job: _HttpFetch, url: httpx.URL, status: int, location: str | None,
                     redirects: int) -> httpx.URL:
    """The URL a redirect (HTTP ``status``, ``Location`` header ``location``) from ``url`` leads to,
    resolved against ``url`` and without user name and password when it leaves the configured
    origin. Raises a non-retryable :class:`FetchError` without a Location, past ``max_redirects``
    (``redirects`` already followed) or for a target scheme not allowed or not http(s). No I/O."""
    if not location:
        raise FetchError(
            job.source, f"{_safe_url(url)} answered HTTP {status} without a Location header",
            retryable=False,
        )
    if redirects >= job.max_redirects:
        raise FetchError(
            job.source, f"more than {job.max_redirects} redirects, the last from {_safe_url(url)}",
            retryable=False,
        )
    next_url = url.join(location)
    if _origin(next_url) != job.origin:
        # Another host gets neither the location's password nor our credentials.
        next_url = next_url.copy_with(userinfo=b"")
    if next_url.scheme not in job.allowed or next_url.scheme not in ("http", "https"):
        raise FetchError(
            job.source, f"{_safe_url(url)} redirected to scheme {next_url.scheme!r}, which "
            f"is not allowed", retryable=False,
        )
    return next_url


def _status_failure(source: str, url: httpx.URL, status: int, reason_phrase: str,
                    secrets: list[str]) -> FetchError | None:
    """``None`` for a 2xx ``status``, else the :class:`FetchError` naming it (with the reason phrase,
    secrets masked, at most 100 characters): retryable for 5xx, 408 and 429."""
    if 200 <= status < 300:
        return None
    retryable = status >= 500 or status in _RETRYABLE_CLIENT_STATUSES
    reason = _redact(reason_phrase, "", secrets)[:100]
    return FetchError(source, f"{_safe_url(url)} answered HTTP {status} {reason}".rstrip(), retryable=retryable)


def _read_body(
    source: str, url: httpx.URL, response: httpx.Response, max_bytes: int, deadline: float,
    timeout_seconds: float,
) -> bytes:
    """The body of ``response`` (from ``url``), decoded when it came gzip- or deflate-coded, of at
    most ``max_bytes`` bytes after decoding. ``deadline`` is the ``time.monotonic()`` value the whole
    fetch must finish by. Raises a non-retryable :class:`FetchError` for a declared or actual size
    over the limit, an invalid Content-Length, an unsupported or corrupt coding, and a retryable one
    past the deadline; network errors while reading propagate as httpx exceptions."""
    _check_declared_length(source, url, response.headers.get("Content-Length"), max_bytes)
    coding = response.headers.get("Content-Encoding", "identity").strip().lower()
    decoder = _decoder(source, url, coding)
    too_large = FetchError(
        source, f"{_safe_url(url)} sent more than the limit of {max_bytes} bytes", retryable=False
    )
    body = bytearray()
    try:
        # iter_raw: httpx's own decoding would inflate a whole network read at once, without a cap.
        # No chunk size: re-chunking would hold back small reads, and with them the deadline check.
        for chunk in response.iter_raw():
            if decoder is not None:
                # Ask for at most one byte past the limit; unconsumed input means there is more.
                chunk = decoder.decompress(chunk, max_bytes - len(body) + 1)
                if decoder.unconsumed_tail:
                    raise too_large
            # Counted as it arrives: Content-Length may be absent (chunked) or a lie.
            if len(body) + len(chunk) > max_bytes:
                raise too_large
            body += chunk
            if time.monotonic() > deadline:
                raise _too_slow(source, url, timeout_seconds)
        if decoder is not None:
            body += decoder.flush()
            if len(body) > max_bytes:
                raise too_large
    except zlib.error as exc:
        raise FetchError(
            source, f"{_safe_url(url)} sent a corrupt {coding} body: {exc}", retryable=False
        ) from None
    return bytes(body)


def _check_declared_length(source: str, url: httpx.URL, declared: str | None, max_bytes: int) -> None:
    """Refuse (non-retryable :class:`FetchError`) a ``Content-Length`` header value that is not an
    integer or declares more than ``max_bytes`` bytes; an absent one (``None``) passes."""
    if declared is None:
        return
    try:
        declared_bytes = int(declared)
    except ValueError:
        raise FetchError(
            source, f"{_safe_url(url)} sent an invalid Content-Length {declared[:40]!r}", retryable=False
        ) from None
    # Refuse up front: no point downloading what we will throw away.
    if declared_bytes > max_bytes:
        raise FetchError(
            source, f"{_safe_url(url)} declares {declared_bytes} bytes, over the limit of {max_bytes} "
            "bytes", retryable=False,
        )


def _decoder(source: str, url: httpx.URL, coding: str):
    """A zlib decompressor for the content ``coding`` (lowercase, stripped), or ``None`` for
    ``identity`` or none; raises a non-retryable :class:`FetchError` for any other coding."""
    if coding in ("", "identity"):
        return None
    if coding not in _ZLIB_WBITS:
        raise FetchError(
            source, f"{_safe_url(url)} sent content coding {coding[:40]!r}, which is not supported",
            retryable=False,
        )
    return zlib.decompressobj(_ZLIB_WBITS[coding])


def _too_slow(source: str, url: httpx.URL, timeout_seconds: float) -> FetchError:
    return FetchError(
        source, f"{_safe_url(url)} took longer than {TOTAL_TIME_FACTOR * timeout_seconds} s in total",
        retryable=True,
    )


# --- URLs and secrets --------------------------------------------------------------------------------


def _scheme_of(location: str) -> str:
    scheme = urlsplit(location).scheme.lower()
    # No scheme, or a one-letter "scheme" that is a Windows drive (C:\data\x.csv): a local path.
    return scheme if len(scheme) > 1 else "file"


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    default = {"http": 80, "https": 443}.get(url.scheme)
    return (url.scheme, url.host, url.port or default)


def _may_carry_credentials(url: httpx.URL, origin: tuple[str, str, int | None]) -> bool:
    """Credentials go only to the configured origin, and only encrypted unless it is this machine."""
    if _origin(url) != origin:
        return False
    if url.scheme == "https":
        return True
    host = url.host
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _basic_auth(url: httpx.URL, secrets: list[str]) -> str:
    """The Basic ``Authorization`` value for the URL's user name and password, recorded as secret."""
    token = base64.b64encode(f"{url.username}:{url.password}".encode()).decode("ascii")
    secrets.extend((token, f"Basic {token}"))
    return f"Basic {token}"


def _safe_url(url: httpx.URL) -> str:
    return str(url.copy_with(userinfo=b"")) if url.userinfo else str(url)


def _safe_location(location: str) -> str:
    """``location`` without user name and password, for messages; never fails."""
    try:
        parts = urlsplit(location)
        if parts.username is not None or parts.password is not None:
            netloc = parts.netloc.rpartition("@")[2]
            return parts._replace(netloc=netloc).geturl()
    except ValueError:
        if "@" in location:
            return "<unparseable URL>"
    return location


def _redact(text: str, raw_url: str, secrets: list[str]) -> str:
    """``text`` with the raw URL replaced by its safe form and every secret value masked."""
    if raw_url:
        text = text.replace(raw_url, _safe_location(raw_url))
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***")
    return text
