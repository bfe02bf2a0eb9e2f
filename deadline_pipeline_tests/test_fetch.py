"""Fetching against a real HTTP server on loopback and real local files; nothing is mocked.

Each test starts a stdlib ``ThreadingHTTPServer`` on port 0 in a background thread. Routes are small
functions registered by the test; the server records every request's path and headers, and the
oversize routes record how many body bytes they managed to push before the client hung up.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from deadline_pipeline.ingest.fetch import USER_AGENT, FetchError, FetchResult
from deadline_pipeline.ingest.fetch import fetch as guarded_fetch
from deadline_pipeline_tests.factories import loopback_policy

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
LIMIT = 256 * 1024
# What an oversize route offers: far more than the limit, so a client that buffered everything
# would be caught by the byte count.
FLOOD = 64 * 1024 * 1024
TOKEN = "tok-7f3e9c1d2b"


def fetch(*args, **kwargs) -> FetchResult:
    """The fetch under test, with the loopback receivers of these tests admitted by the outbound guard."""
    kwargs.setdefault("network", loopback_policy())
    return guarded_fetch(*args, **kwargs)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # keep pytest output quiet
        pass

    def do_GET(self):
        server: Server = self.server.owner
        server.requests.append((self.path, dict(self.headers.items())))
        route = server.routes.get(self.path.split("?")[0])
        if route is None:
            self.reply(404, b"no such route")
            return
        route(self)

    def reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class QuietHTTPServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # Hanging up mid-answer is what the size and time limits are for; only report real errors.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclass
class Server:
    base: str = ""
    routes: dict[str, Callable[[Handler], None]] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    # Set at teardown so a route that waits on it lets its thread finish.
    release: threading.Event = field(default_factory=threading.Event)
    # Bytes of body an oversize route wrote before the client hung up, and when it stopped.
    sent: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    def route(self, path: str):
        def register(fn: Callable[[Handler], None]) -> Callable[[Handler], None]:
            self.routes[path] = fn
            return fn

        return register


@pytest.fixture
def make_server() -> Iterator[Callable[[], Server]]:
    started: list[tuple[QuietHTTPServer, Server]] = []

    def start() -> Server:
        httpd = QuietHTTPServer(("127.0.0.1", 0), Handler)
        server = Server(base=f"http://127.0.0.1:{httpd.server_address[1]}")
        httpd.owner = server
        threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
        started.append((httpd, server))
        return server

    yield start
    for httpd, server in started:
        server.release.set()
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def server(make_server) -> Server:
    return make_server()


def flood(handler: Handler, server: Server, *, chunked: bool) -> None:
    """Offer FLOOD bytes and count how many the socket accepted before the client hung up."""
    handler.send_response(200)
    if chunked:
        handler.send_header("Transfer-Encoding", "chunked")
    else:
        handler.send_header("Content-Length", str(FLOOD))
    handler.end_headers()
    block = b"x" * 65536
    try:
        while server.sent < FLOOD:
            if chunked:
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
            else:
                handler.wfile.write(block)
            server.sent += len(block)
        if chunked:
            handler.wfile.write(b"0\r\n\r\n")
    except OSError:  # the client closed the connection: exactly what we hope for
        pass
    finally:
        handler.close_connection = True
        server.done.set()


# --- conditional requests ----------------------------------------------------------------------------


def test_etag_then_conditional_request_answered_304(server):
    body = b"name,deadline\nICML,2025-01-30\n"

    @server.route("/deadlines.csv")
    def _(h):
        if h.headers.get("If-None-Match") == '"v1"':
            h.reply(304, headers={"ETag": '"v1"'})
        else:
            h.reply(200, body, {"ETag": '"v1"', "Content-Type": "text/csv"})

    first = fetch("conf", f"{server.base}/deadlines.csv", now=NOW)
    assert first == FetchResult(
        content=body, not_modified=False, fetched_at=NOW, http_status=200, etag='"v1"', last_modified=None,
        sha256=hashlib.sha256(body).hexdigest(), size=len(body), final_url=f"{server.base}/deadlines.csv",
    )
    second = fetch("conf", f"{server.base}/deadlines.csv", now=NOW, etag=first.etag)
    assert second.not_modified and second.content is None and second.http_status == 304
    assert second.etag == '"v1"' and second.sha256 is None and second.size == 0
    assert server.requests[1][1]["If-None-Match"] == '"v1"'
    assert server.requests[0][1]["User-Agent"] == USER_AGENT
    assert USER_AGENT.startswith("deadline-pipeline/")


def test_last_modified_then_if_modified_since(server):
    stamp = "Wed, 21 Oct 2024 07:28:00 GMT"

    @server.route("/cal.ics")
    def _(h):
        if h.headers.get("If-Modified-Since") == stamp:
            h.reply(304)
        else:
            h.reply(200, b"BEGIN:VCALENDAR\r\nEND:VCALENDAR\r\n", {"Last-Modified": stamp})

    first = fetch("cal", f"{server.base}/cal.ics", now=NOW)
    assert first.last_modified == stamp and first.etag is None and first.content.startswith(b"BEGIN")
    second = fetch("cal", f"{server.base}/cal.ics", now=NOW, last_modified=first.last_modified)
    assert second.not_modified and second.content is None
    # The server sent no validators with its 304; the caller's are kept so the next request is
    # conditional too.
    assert second.last_modified == stamp
    assert "If-None-Match" not in server.requests[1][1]


def test_now_is_normalised_to_utc_and_must_be_aware(server):
    server.routes["/a"] = lambda h: h.reply(200, b"a")
    from datetime import timedelta, timezone

    local = NOW.astimezone(timezone(timedelta(hours=2)))
    result = fetch("s", f"{server.base}/a", now=local)
    assert result.fetched_at == NOW and result.fetched_at.utcoffset() == timedelta(0)
    with pytest.raises(ValueError):
        fetch("s", f"{server.base}/a", now=datetime(2025, 3, 1, 12, 0))


# --- redirects ---------------------------------------------------------------------------------------


def hop_routes(server: Server, hops: int) -> None:
    """/hop/N redirects to /hop/N-1 (alternating relative and absolute Locations); /hop/0 answers."""
    for n in range(1, hops + 1):
        target = f"/hop/{n - 1}" if n % 2 else f"{server.base}/hop/{n - 1}"
        server.routes[f"/hop/{n}"] = lambda h, t=target: h.reply(302, headers={"Location": t})
    server.routes["/hop/0"] = lambda h: h.reply(200, b"arrived")


def test_redirect_chain_within_the_limit(server):
    hop_routes(server, 3)
    result = fetch("s", f"{server.base}/hop/3", now=NOW, max_redirects=3)
    assert result.content == b"arrived" and result.final_url == f"{server.base}/hop/0"


def test_redirect_chain_beyond_the_limit(server):
    hop_routes(server, 3)
    with pytest.raises(FetchError) as err:
        fetch("s", f"{server.base}/hop/3", now=NOW, max_redirects=2)
    assert "more than 2 redirects" in str(err.value) and "'s'" in str(err.value)
    assert not err.value.retryable
    assert len(server.requests) == 3  # the third redirect was not followed


def test_redirect_loop_ends(server):
    server.routes["/loop"] = lambda h: h.reply(301, headers={"Location": "/loop"})
    with pytest.raises(FetchError, match="more than 5 redirects"):
        fetch("s", f"{server.base}/loop", now=NOW)


def test_redirect_to_a_disallowed_scheme_is_not_followed(server):
    server.routes["/away"] = lambda h: h.reply(302, headers={"Location": "file:///etc/passwd"})
    with pytest.raises(FetchError, match="redirected to scheme 'file'") as err:
        fetch("s", f"{server.base}/away", now=NOW)
    assert not err.value.retryable


def test_credentials_are_not_forwarded_to_another_origin(make_server, monkeypatch):
    home, other = make_server(), make_server()
    monkeypatch.setenv("DP_TEST_TOKEN", TOKEN)
    monkeypatch.setenv("DP_TEST_KEY", "key-55aa")
    home.routes["/start"] = lambda h: h.reply(302, headers={"Location": f"{other.base}/landing"})
    other.routes["/landing"] = lambda h: h.reply(200, b"landed")
    result = fetch("s", f"{home.base}/start", now=NOW, auth_env="DP_TEST_TOKEN",
                   headers_env={"X-Api-Key": "DP_TEST_KEY"})
    assert result.content == b"landed"
    assert home.requests[0][1]["Authorization"] == f"Bearer {TOKEN}"
    assert home.requests[0][1]["X-Api-Key"] == "key-55aa"
    landing_headers = other.requests[0][1]
    assert "Authorization" not in landing_headers and "X-Api-Key" not in landing_headers


# --- statuses and bodies -----------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "retryable"), [(500, True), (503, True), (429, True), (408, True),
                                                   (404, False), (403, False)])
def test_error_status(server, status, retryable):
    server.routes["/x"] = lambda h: h.reply(status, b"<html>oops</html>")
    with pytest.raises(FetchError) as err:
        fetch("src", f"{server.base}/x", now=NOW)
    assert f"HTTP {status}" in str(err.value) and "'src'" in str(err.value)
    assert err.value.retryable is retryable and err.value.source == "src"


def test_html_error_page_with_200_is_returned_as_bytes(server):
    page = b"<!DOCTYPE html><html><body>Service temporarily unavailable</body></html>"
    server.routes["/data.csv"] = lambda h: h.reply(200, page, {"Content-Type": "text/html"})
    result = fetch("s", f"{server.base}/data.csv", now=NOW)
    assert result.content == page and result.http_status == 200
    assert result.size == len(page) and result.sha256 == hashlib.sha256(page).hexdigest()


def test_empty_body(server):
    server.routes["/empty"] = lambda h: h.reply(200, b"")
    result = fetch("s", f"{server.base}/empty", now=NOW)
    assert result.content == b"" and result.size == 0
    assert result.sha256 == hashlib.sha256(b"").hexdigest()


# --- size limits -------------------------------------------------------------------------------------


def test_oversize_declared_content_length_refused_before_reading(server):
    server.routes["/big"] = lambda h: flood(h, server, chunked=False)
    started = time.monotonic()
    with pytest.raises(FetchError) as err:
        fetch("big", f"{server.base}/big", now=NOW, max_bytes=LIMIT)
    assert time.monotonic() - started < 5
    assert str(LIMIT) in str(err.value) and "'big'" in str(err.value) and str(FLOOD) in str(err.value)
    assert not err.value.retryable
    assert server.done.wait(10)
    # Socket buffers on both ends absorb some data; a client that kept reading would take all 64 MiB.
    assert server.sent < FLOOD // 4


def test_oversize_chunked_body_without_length_refused_while_streaming(server):
    server.routes["/big"] = lambda h: flood(h, server, chunked=True)
    with pytest.raises(FetchError) as err:
        fetch("big", f"{server.base}/big", now=NOW, max_bytes=LIMIT)
    assert f"more than the limit of {LIMIT} bytes" in str(err.value) and "'big'" in str(err.value)
    assert server.done.wait(10)
    assert server.sent < FLOOD // 4
    assert "Content-Length" not in str(server.requests)  # sanity: the request had no body


def test_body_of_exactly_the_limit_is_accepted(server):
    server.routes["/edge"] = lambda h: h.reply(200, b"y" * LIMIT)
    assert fetch("s", f"{server.base}/edge", now=NOW, max_bytes=LIMIT).size == LIMIT


def test_gzip_body_sent_anyway_is_decoded_and_counted_after_decoding(server):
    text = b"name,deadline\n" * 100
    server.routes["/small.gz"] = lambda h: h.reply(200, gzip.compress(text), {"Content-Encoding": "gzip"})
    # 64 MiB of zeros compresses to about 64 KiB: under the limit on the wire, far over it decoded.
    bomb = gzip.compress(bytes(FLOOD))
    server.routes["/bomb.gz"] = lambda h: h.reply(200, bomb, {"Content-Encoding": "gzip"})

    result = fetch("s", f"{server.base}/small.gz", now=NOW)
    assert result.content == text and result.sha256 == hashlib.sha256(text).hexdigest()
    assert server.requests[0][1]["Accept-Encoding"] == "identity"
    limit = len(bomb) + LIMIT
    with pytest.raises(FetchError, match=f"more than the limit of {limit} bytes"):
        fetch("s", f"{server.base}/bomb.gz", now=NOW, max_bytes=limit)


# --- time limits -------------------------------------------------------------------------------------


def test_server_slower_than_read_timeout(server):
    def stall(h):
        server.release.wait(10)
        try:
            h.reply(200, b"too late")
        except OSError:  # the client gave up long ago
            pass

    server.routes["/slow"] = stall
    started = time.monotonic()
    with pytest.raises(FetchError) as err:
        fetch("slow", f"{server.base}/slow", now=NOW, timeout_seconds=0.5)
    assert time.monotonic() - started < 3
    assert "did not answer within 0.5 s" in str(err.value) and err.value.retryable
    # Not chained: the library's exception holds the request, credential headers included.
    assert err.value.__context__ is None and err.value.__cause__ is None


def test_trickling_server_is_cut_off_by_the_total_deadline(server):
    # Each byte arrives well within the read timeout, so only the total cap (4 x 0.5 s) ends this.
    def trickle(h):
        h.send_response(200)
        h.send_header("Content-Length", "1000")
        h.end_headers()
        try:
            for _ in range(1000):
                if server.release.wait(0.1):
                    return
                h.wfile.write(b"z")
                h.wfile.flush()
        except OSError:
            pass

    server.routes["/trickle"] = trickle
    started = time.monotonic()
    with pytest.raises(FetchError, match="in total") as err:
        fetch("s", f"{server.base}/trickle", now=NOW, timeout_seconds=0.5)
    assert time.monotonic() - started < 4 and err.value.retryable


def test_a_server_dripping_its_headers_is_cut_off_by_the_total_deadline():
    """Status line and headers a byte every 0.2 s: every read is within the 0.5 s timeout and no
    body chunk ever arrives for the between-chunks check, so only the whole fetch's deadline
    (4 x 0.5 s), given to the connection itself, ends it."""
    from deadline_pipeline_tests.drip_server import DripServer

    with DripServer("headers") as drip:
        started = time.monotonic()
        with pytest.raises(FetchError, match="in total") as err:
            fetch("s", f"{drip.url}/feed.ics", now=NOW, timeout_seconds=0.5)
        elapsed = time.monotonic() - started
    assert elapsed < 3.5, f"the fetch took {elapsed:.1f} s with a 2 s total"
    assert err.value.retryable


def test_connection_refused_is_retryable(make_server):
    import socket

    with socket.socket() as sock:  # a port that was free a moment ago and has no listener now
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(FetchError) as err:
        fetch("s", f"http://127.0.0.1:{port}/x", now=NOW, timeout_seconds=2)
    assert err.value.retryable


# --- credentials -------------------------------------------------------------------------------------


def test_bearer_token_sent_but_never_shown(server, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    def private(h):
        if h.headers.get("Authorization") == f"Bearer {TOKEN}":
            h.reply(200, b"secret deadlines")
        else:
            h.reply(401, b"denied", {"WWW-Authenticate": "Bearer"})

    server.routes["/private"] = private
    monkeypatch.setenv("DP_TEST_TOKEN", TOKEN)
    result = fetch("p", f"{server.base}/private", now=NOW, auth_env="DP_TEST_TOKEN")
    assert result.content == b"secret deadlines"
    assert server.requests[-1][1]["Authorization"] == f"Bearer {TOKEN}"
    assert TOKEN not in result.final_url

    # A token the server rejects, in a URL that also carries a user name and password.
    monkeypatch.setenv("DP_TEST_TOKEN", TOKEN + "-revoked")
    location = server.base.replace("http://", "http://reader:pw-91c4@") + "/private"
    with pytest.raises(FetchError) as err:
        fetch("p", location, now=NOW, auth_env="DP_TEST_TOKEN")
    message = str(err.value)
    assert "HTTP 401" in message and not err.value.retryable
    assert TOKEN not in message and "pw-91c4" not in message and "reader" not in message
    assert f"{server.base}/private" in message
    assert server.requests[-1][1]["Authorization"] == f"Bearer {TOKEN}-revoked"
    assert err.value.__cause__ is None and err.value.__context__ is None
    # Neither this module's log lines nor the HTTP library's, at any level, show a credential.
    assert "/private" in caplog.text
    for secret in (TOKEN, "pw-91c4", "reader:", "cmVhZGVy"):
        assert secret not in caplog.text


def test_url_password_absent_from_final_url(server):
    server.routes["/p"] = lambda h: h.reply(200, b"ok")
    location = server.base.replace("http://", "http://reader:pw-91c4@") + "/p"
    result = fetch("p", location, now=NOW)
    assert result.final_url == f"{server.base}/p"
    assert server.requests[0][1]["Authorization"] == "Basic " + base64.b64encode(b"reader:pw-91c4").decode()


def test_unset_auth_variable_is_named(server, monkeypatch):
    monkeypatch.delenv("DP_TEST_UNSET_TOKEN", raising=False)
    with pytest.raises(FetchError, match="DP_TEST_UNSET_TOKEN.* is not set") as err:
        fetch("p", f"{server.base}/private", now=NOW, auth_env="DP_TEST_UNSET_TOKEN")
    assert not err.value.retryable
    assert server.requests == []


def test_unset_or_malformed_header_variable_is_named_not_shown(server, monkeypatch):
    monkeypatch.delenv("DP_TEST_UNSET_KEY", raising=False)
    with pytest.raises(FetchError, match="DP_TEST_UNSET_KEY .for header X-Api-Key. is not set"):
        fetch("p", f"{server.base}/x", now=NOW, headers_env={"X-Api-Key": "DP_TEST_UNSET_KEY"})
    monkeypatch.setenv("DP_TEST_BAD_KEY", "key-77\r\nX-Injected: 1")
    with pytest.raises(FetchError, match="DP_TEST_BAD_KEY") as err:
        fetch("p", f"{server.base}/x", now=NOW, headers_env={"X-Api-Key": "DP_TEST_BAD_KEY"})
    assert "key-77" not in str(err.value)
    assert server.requests == []


def test_credentials_refused_over_plain_http_to_another_machine(monkeypatch):
    monkeypatch.setenv("DP_TEST_TOKEN", TOKEN)
    # Refused before any I/O, so the unresolvable host is never looked up.
    with pytest.raises(FetchError, match="refusing to send credentials over plain http") as err:
        fetch("p", "http://deadlines.invalid/feed", now=NOW, auth_env="DP_TEST_TOKEN")
    assert TOKEN not in str(err.value)


# --- schemes -----------------------------------------------------------------------------------------


def test_ftp_is_refused_before_any_io(server):
    with pytest.raises(FetchError, match="scheme 'ftp'") as err:
        fetch("f", f"ftp://user:pw-3a@{server.base.removeprefix('http://')}/x", now=NOW)
    assert "pw-3a" not in str(err.value) and not err.value.retryable
    assert server.requests == []


def test_file_refused_when_not_allowed(tmp_path):
    doc = tmp_path / "d.csv"
    doc.write_bytes(b"a")
    for location in (str(doc), doc.as_uri()):
        with pytest.raises(FetchError, match="scheme 'file'"):
            fetch("f", location, now=NOW, allowed_schemes=frozenset({"https"}))


def test_http_refused_when_only_https_allowed(server):
    with pytest.raises(FetchError, match="scheme 'http'"):
        fetch("f", f"{server.base}/x", now=NOW, allowed_schemes=frozenset({"https"}))
    assert server.requests == []


# --- local files -------------------------------------------------------------------------------------


def test_local_path_and_file_url(tmp_path):
    body = b"name,deadline\nNeurIPS,2025-05-15\n"
    doc = tmp_path / "deadlines with space.csv"
    doc.write_bytes(body)
    for location in (str(doc), doc.as_uri()):
        result = fetch("local", location, now=NOW, etag='"ignored"')
        assert result == FetchResult(
            content=body, not_modified=False, fetched_at=NOW, http_status=None, etag=None,
            last_modified=None, sha256=hashlib.sha256(body).hexdigest(), size=len(body),
            final_url=doc.as_uri(),
        )


def test_missing_local_file_is_named(tmp_path):
    missing = tmp_path / "nope.csv"
    for location in (str(missing), missing.as_uri()):
        with pytest.raises(FetchError) as err:
            fetch("local", location, now=NOW)
        assert str(missing) in str(err.value) and "does not exist" in str(err.value)
        assert "'local'" in str(err.value) and not err.value.retryable


def test_local_file_over_the_limit(tmp_path):
    doc = tmp_path / "big.csv"
    doc.write_bytes(b"x" * (LIMIT + 1))
    with pytest.raises(FetchError, match=f"limit of {LIMIT} bytes"):
        fetch("local", str(doc), now=NOW, max_bytes=LIMIT)
    doc.write_bytes(b"x" * LIMIT)
    assert fetch("local", str(doc), now=NOW, max_bytes=LIMIT).size == LIMIT


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need POSIX")
def test_named_pipe_is_refused_without_blocking(tmp_path):
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(FetchError, match="not a regular file"):
        fetch("local", str(pipe), now=NOW)


def test_file_url_naming_another_host_is_refused():
    with pytest.raises(FetchError, match="names host 'fileserver'"):
        fetch("local", "file://fileserver/share/d.csv", now=NOW)


def test_directory_is_refused(tmp_path: Path):
    with pytest.raises(FetchError) as err:
        fetch("local", str(tmp_path), now=NOW)
    assert str(tmp_path) in str(err.value) and not err.value.retryable
