"""The named steps of :mod:`deadline_pipeline.ingest.fetch`, one decision at a time.

Pure steps (which headers a hop sends, where a redirect leads, what a status means, what a declared
length or content coding allows) are called directly. Steps that read an answer get a real one: a
loopback TCP server in a background thread writes canned raw HTTP bytes, so lengths, chunking and
codings are exactly what a misbehaving server would send; nothing is mocked.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest

from deadline_pipeline.ingest import fetch as f
from deadline_pipeline.ingest.fetch import FetchError, FetchResult

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def job(**overrides) -> f._HttpFetch:
    """One fetch's fixed settings, for https://example.org unless overridden."""
    values = dict(
        source="src", origin=("https", "example.org", 443), fetched_at=NOW, etag=None, last_modified=None,
        timeout_seconds=5.0, deadline=time.monotonic() + 60, max_bytes=1000, max_redirects=3,
        allowed=frozenset({"http", "https", "file"}), credential_headers={}, secrets=[], precheck=None,
    )
    values.update(overrides)
    return f._HttpFetch(**values)


# --- the request a hop sends -------------------------------------------------------------------------


def test_validators_make_the_request_conditional():
    headers = f._request_headers(job(etag='"v1"', last_modified="Sat, 01 Mar 2025 10:00:00 GMT"),
                                 httpx.URL("https://example.org/a"), [])
    assert headers["If-None-Match"] == '"v1"'
    assert headers["If-Modified-Since"] == "Sat, 01 Mar 2025 10:00:00 GMT"
    assert headers["Accept-Encoding"] == "identity"
    assert headers["User-Agent"] == f.USER_AGENT


def test_an_unconditional_request_carries_no_validators():
    headers = f._request_headers(job(), httpx.URL("https://example.org/a"), [])
    assert "If-None-Match" not in headers and "If-Modified-Since" not in headers
    assert not job().conditional
    assert job(last_modified="x").conditional


def test_credentials_go_to_the_configured_origin_only():
    j = job(credential_headers={"Authorization": "Bearer t0k"})
    assert f._request_headers(j, httpx.URL("https://example.org/next"), [])["Authorization"] == "Bearer t0k"
    # Another host, another port, or the same host over plain http: none.
    for other in ("https://elsewhere.example/a", "https://example.org:8443/a", "http://example.org/a"):
        assert "Authorization" not in f._request_headers(j, httpx.URL(other), [])


def test_a_configured_token_wins_over_a_password_in_the_url():
    secrets: list[str] = []
    url = httpx.URL("https://ann:pw@example.org/a")
    j = job(credential_headers={"Authorization": "Bearer t0k"})
    assert f._request_headers(j, url, secrets)["Authorization"] == "Bearer t0k"
    # Without a token the URL's user name and password are sent as Basic, and recorded as secret.
    basic = f._request_headers(job(), url, secrets)["Authorization"]
    assert basic.startswith("Basic ") and basic in secrets


def test_plain_http_to_loopback_may_carry_credentials():
    origin = ("http", "127.0.0.1", 8080)
    assert f._may_carry_credentials(httpx.URL("http://127.0.0.1:8080/x"), origin)
    assert f._may_carry_credentials(httpx.URL("http://localhost:81/x"), ("http", "localhost", 81))
    assert not f._may_carry_credentials(httpx.URL("http://10.0.0.1/x"), ("http", "10.0.0.1", 80))


# --- redirects ---------------------------------------------------------------------------------------


def test_a_relative_redirect_resolves_against_the_current_url():
    target = f._redirect_target(job(), httpx.URL("https://example.org/a/b"), 302, "../c?x=1", 0)
    assert str(target) == "https://example.org/c?x=1"


def test_a_redirect_to_another_origin_drops_the_user_name_and_password():
    url = httpx.URL("https://ann:pw@example.org/a")
    same = f._redirect_target(job(), url, 301, "/b", 0)
    assert same.userinfo == b"ann:pw"
    away = f._redirect_target(job(), url, 301, "https://ann:pw@elsewhere.example/b", 0)
    assert away.userinfo == b"" and away.host == "elsewhere.example"


def test_a_redirect_without_location_is_permanent():
    with pytest.raises(FetchError, match="without a Location header") as exc:
        f._redirect_target(job(), httpx.URL("https://example.org/a"), 307, "", 0)
    assert not exc.value.retryable


def test_the_redirect_limit_counts_redirects_already_followed():
    url = httpx.URL("https://example.org/a")
    assert f._redirect_target(job(max_redirects=3), url, 302, "/b", 2).path == "/b"
    with pytest.raises(FetchError, match="more than 3 redirects") as exc:
        f._redirect_target(job(max_redirects=3), url, 302, "/b", 3)
    assert not exc.value.retryable
    with pytest.raises(FetchError, match="more than 0 redirects"):
        f._redirect_target(job(max_redirects=0), url, 302, "/b", 0)


@pytest.mark.parametrize("target, allowed", [
    ("ftp://example.org/x", {"http", "https", "ftp"}),  # allowed but not fetchable over HTTP
    ("file:///etc/passwd", {"http", "https", "file"}),  # a redirect never reaches local files
    ("http://example.org/x", {"https"}),  # a downgrade the configuration did not allow
])
def test_a_redirect_to_a_scheme_not_allowed_is_refused(target, allowed):
    with pytest.raises(FetchError, match="redirected to scheme") as exc:
        f._redirect_target(job(allowed=frozenset(allowed)), httpx.URL("https://example.org/a"), 302, target, 0)
    assert not exc.value.retryable


# --- status and scheme decisions ---------------------------------------------------------------------


@pytest.mark.parametrize("status, retryable", [(500, True), (503, True), (408, True), (429, True),
                                               (404, False), (403, False), (410, False), (199, False)])
def test_non_2xx_statuses(status, retryable):
    failure = f._status_failure("src", httpx.URL("https://example.org/a"), status, "Nope", [])
    assert failure is not None and failure.retryable is retryable
    assert f"HTTP {status} Nope" in str(failure)


def test_2xx_statuses_are_no_failure():
    for status in (200, 203, 206, 299):
        assert f._status_failure("src", httpx.URL("https://example.org/a"), status, "OK", []) is None


def test_the_reason_phrase_is_masked_and_cut():
    failure = f._status_failure("src", httpx.URL("https://example.org/a"), 401,
                                "bad token s3cr3t " + "x" * 300, ["s3cr3t"])
    assert "s3cr3t" not in str(failure) and "***" in str(failure)
    assert "x" * 100 not in str(failure) and "x" * 80 in str(failure)


@pytest.mark.parametrize("location, scheme", [
    ("/srv/cal.ics", "file"), ("C:\\data\\x.csv", "file"), ("file:///srv/x", "file"),
    ("HTTPS://example.org/x", "https"), ("http://example.org/x", "http"),
])
def test_allowed_schemes(location, scheme):
    assert f._allowed_scheme("src", location, frozenset({"http", "https", "file"})) == scheme


def test_a_scheme_not_allowed_or_not_supported_is_refused_before_any_io():
    with pytest.raises(FetchError, match="is not allowed"):
        f._allowed_scheme("src", "ftp://example.org/x", frozenset({"http", "https", "file"}))
    with pytest.raises(FetchError, match="is not allowed"):
        f._allowed_scheme("src", "/srv/x", frozenset({"https"}))
    with pytest.raises(FetchError, match="not supported"):
        f._allowed_scheme("src", "ftp://example.org/x", frozenset({"ftp"}))


def test_arguments():
    f._check_arguments(NOW, 1.0, 0, 0)
    for args in ((NOW.replace(tzinfo=None), 1.0, 0, 0), (NOW, 0.0, 0, 0), (NOW, 1.0, -1, 0), (NOW, 1.0, 0, -1)):
        with pytest.raises(ValueError):
            f._check_arguments(*args)


def test_the_http_target_refuses_an_unset_variable_and_registers_url_secrets(monkeypatch):
    monkeypatch.delenv("FETCH_STEPS_UNSET", raising=False)
    with pytest.raises(FetchError, match="FETCH_STEPS_UNSET .* is not set"):
        f._http_target("src", "https://example.org/a", "FETCH_STEPS_UNSET", None, None, None)
    monkeypatch.setenv("FETCH_STEPS_TOKEN", " t0k ")
    url, headers, secrets = f._http_target("src", "https://ann:pw@example.org/a", "FETCH_STEPS_TOKEN",
                                           None, None, None)
    assert headers == {"Authorization": "Bearer t0k"}
    assert {"t0k", "Bearer t0k", "ann", "pw"} <= set(secrets)
    assert url.host == "example.org"


# --- declared length and coding ----------------------------------------------------------------------


def test_declared_length():
    url = httpx.URL("https://example.org/a")
    f._check_declared_length("src", url, None, 10)
    f._check_declared_length("src", url, "10", 10)
    with pytest.raises(FetchError, match="declares 11 bytes, over the limit of 10") as exc:
        f._check_declared_length("src", url, "11", 10)
    assert not exc.value.retryable
    with pytest.raises(FetchError, match="invalid Content-Length"):
        f._check_declared_length("src", url, "ten", 10)


def test_codings():
    url = httpx.URL("https://example.org/a")
    assert f._decoder("src", url, "identity") is None
    assert f._decoder("src", url, "") is None
    for coding in ("gzip", "x-gzip", "deflate"):
        assert f._decoder("src", url, coding) is not None
    with pytest.raises(FetchError, match="content coding 'br', which is not supported"):
        f._decoder("src", url, "br")


# --- steps that read a real answer -------------------------------------------------------------------


class RawServer:
    """A loopback server answering every connection with the next canned raw response."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.answers: list[bytes] = []
        self.requests: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    part = conn.recv(65536)
                    if not part:
                        break
                    data += part
                self.requests.append(data)
                try:
                    conn.sendall(self.answers.pop(0) if self.answers else b"HTTP/1.1 500 Empty\r\n\r\n")
                    conn.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw() -> Iterator[RawServer]:
    server = RawServer()
    yield server
    server.close()


def answer(status: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    head = f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode() + b"Connection: close\r\n\r\n" + body


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def read(raw: RawServer, max_bytes: int, *, deadline: float | None = None) -> bytes:
    """``_read_body`` on the server's next answer, through a plain client on loopback."""
    url = httpx.URL(raw.base + "/doc")
    with httpx.Client() as client:
        response = client.send(client.build_request("GET", url), stream=True)
        try:
            return f._read_body("src", url, response, max_bytes,
                                deadline if deadline is not None else time.monotonic() + 30, 5.0)
        finally:
            response.close()


def test_a_chunked_body_is_cut_off_past_the_limit(raw):
    raw.answers.append(answer("200 OK", {"Transfer-Encoding": "chunked"}, chunked(b"a" * 600, b"b" * 600)))
    with pytest.raises(FetchError, match="sent more than the limit of 1000 bytes"):
        read(raw, 1000)


def test_a_chunked_body_of_exactly_the_limit_is_read(raw):
    raw.answers.append(answer("200 OK", {"Transfer-Encoding": "chunked"}, chunked(b"a" * 600, b"b" * 400)))
    assert read(raw, 1000) == b"a" * 600 + b"b" * 400


def test_a_declared_length_over_the_limit_is_refused_before_reading(raw):
    raw.answers.append(answer("200 OK", {"Content-Length": "5000"}, b"x" * 5000))
    with pytest.raises(FetchError, match="declares 5000 bytes"):
        read(raw, 1000)


def test_a_gzip_body_is_counted_after_decoding(raw):
    bomb = gzip.compress(b"\0" * 100_000)
    assert len(bomb) < 1000
    raw.answers.append(answer("200 OK", {"Content-Encoding": "gzip", "Content-Length": str(len(bomb))}, bomb))
    with pytest.raises(FetchError, match="sent more than the limit of 1000 bytes"):
        read(raw, 1000)


def test_a_small_deflate_body_is_decoded(raw):
    body = zlib.compress(b"BEGIN:VCALENDAR\r\n" * 10)
    raw.answers.append(answer("200 OK", {"Content-Encoding": "Deflate ", "Content-Length": str(len(body))}, body))
    assert read(raw, 1000) == b"BEGIN:VCALENDAR\r\n" * 10


def test_a_corrupt_gzip_body_is_permanent(raw):
    body = b"\x1f\x8b\x08\x00garbage-not-deflate"
    raw.answers.append(answer("200 OK", {"Content-Encoding": "gzip", "Content-Length": str(len(body))}, body))
    with pytest.raises(FetchError, match="corrupt gzip body") as exc:
        read(raw, 1000)
    assert not exc.value.retryable


def test_reading_past_the_deadline_is_retryable(raw):
    raw.answers.append(answer("200 OK", {"Content-Length": "3"}, b"abc"))
    with pytest.raises(FetchError, match="took longer than 20.0 s in total") as exc:
        read(raw, 1000, deadline=time.monotonic() - 1)
    assert exc.value.retryable


def hop(raw: RawServer, j: f._HttpFetch, path: str = "/doc", redirects: int = 0) -> FetchResult | httpx.URL:
    with httpx.Client() as client:
        return f._fetch_hop(j, client, httpx.URL(raw.base + path), redirects)


def loopback_job(raw: RawServer, **overrides) -> f._HttpFetch:
    return job(origin=("http", "127.0.0.1", raw.port), **overrides)


def test_a_hop_answered_with_a_redirect_returns_the_next_url(raw):
    raw.answers.append(answer("308 Permanent Redirect", {"Location": "/moved", "Content-Length": "0"}))
    assert hop(raw, loopback_job(raw)) == httpx.URL(raw.base + "/moved")


def test_a_redirect_answered_after_the_deadline_is_too_slow(raw):
    raw.answers.append(answer("302 Found", {"Location": "/moved", "Content-Length": "0"}))
    with pytest.raises(FetchError, match="took longer than") as exc:
        hop(raw, loopback_job(raw, deadline=time.monotonic() - 1))
    assert exc.value.retryable and "/moved" in str(exc.value)


def test_304_to_a_conditional_request_keeps_the_validators_not_repeated(raw):
    raw.answers.append(answer("304 Not Modified", {"ETag": '"v2"'}))
    result = hop(raw, loopback_job(raw, etag='"v1"', last_modified="Sat, 01 Mar 2025 10:00:00 GMT"))
    assert isinstance(result, FetchResult) and result.not_modified and result.content is None
    assert (result.etag, result.last_modified) == ('"v2"', "Sat, 01 Mar 2025 10:00:00 GMT")
    assert b'If-None-Match: "v1"' in raw.requests[0]


def test_304_to_an_unconditional_request_is_an_error(raw):
    raw.answers.append(answer("304 Not Modified", {}))
    with pytest.raises(FetchError, match="unconditional request") as exc:
        hop(raw, loopback_job(raw))
    assert not exc.value.retryable


def test_a_200_hop_returns_the_body_its_digest_and_validators(raw):
    raw.answers.append(answer("200 OK", {"Content-Length": "5", "ETag": '"e"'}, b"hello"))
    result = hop(raw, loopback_job(raw))
    assert isinstance(result, FetchResult)
    assert (result.content, result.size, result.http_status, result.etag) == (b"hello", 5, 200, '"e"')
    assert result.sha256 == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"


def test_a_refused_connection_is_retryable():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    j = job(origin=("http", "127.0.0.1", port))
    with httpx.Client() as client, pytest.raises(FetchError, match="cannot fetch") as exc:
        f._fetch_hop(j, client, httpx.URL(f"http://127.0.0.1:{port}/doc"), 0)
    assert exc.value.retryable
    assert exc.value.__context__ is None  # the httpx exception (and its request headers) is not chained


def test_a_single_wait_timing_out_is_retryable_and_past_the_deadline_is_too_slow():
    url = httpx.URL("http://127.0.0.1:9/doc")
    one_wait = f._transport_failure(job(), url, 0, httpx.ReadTimeout("slow"))
    assert one_wait.retryable and "did not answer within 5.0 s (ReadTimeout)" in str(one_wait)
    total = f._transport_failure(job(deadline=time.monotonic() - 1), url, 0, httpx.ReadTimeout("slow"))
    assert total.retryable and "took longer than 20.0 s in total" in str(total)


def test_transport_failures_name_redirects_and_mask_secrets():
    from deadline_pipeline.security.outbound import OutboundRefused

    url = httpx.URL("http://127.0.0.1:9/doc")
    refused = f._transport_failure(job(), url, 2, OutboundRefused("10.0.0.1", "10.0.0.1", "private address"))
    assert not refused.retryable and "reached through 2 redirect(s)" in str(refused)
    bad = f._transport_failure(job(secrets=["s3cr3t"]), url, 0, httpx.LocalProtocolError("header s3cr3t"))
    assert not bad.retryable and "s3cr3t" not in str(bad)
    unresolved = f._transport_failure(job(), url, 0, OSError("no such host"))
    assert unresolved.retryable and "cannot resolve the host" in str(unresolved)
