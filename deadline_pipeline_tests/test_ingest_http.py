"""Ingest from a real HTTP server on loopback: conditional requests, and every way a server fails.

Each failure must leave the last good rule versions in force, name the source, and turn the
``source_fresh`` check red — while planning still sees the old rules.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import func, select

from deadline_pipeline.config import load_config
from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.store.plan_inputs import active_rules
from deadline_pipeline.store.schema import rule_versions, snapshots
from deadline_pipeline.store.sources import get_source
from deadline_pipeline.watch.sources import read_source_state, source_fresh, source_not_quarantined
from deadline_pipeline_tests.factories import LOOPBACK_NETWORK, ai_deadlines, loopback_policy, write_config

T0 = datetime(2027, 1, 10, tzinfo=UTC)
GOOD = ai_deadlines(*[
    {"title": f"C{i}", "year": 2027, "id": f"c{i}27", "deadline": f"2027-03-0{i} 23:59", "timezone": "AoE"}
    for i in range(1, 5)
]).encode()
ETAG = '"v1"'
MAX_BYTES = 4000
TIMEOUT = 0.5


class _Server:
    """A loopback HTTP server whose answer is chosen by ``mode``; records the requests' headers."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args) -> None:  # keep pytest output readable
                pass

            def do_GET(self) -> None:  # noqa: N802 — the http.server API
                server.requests.append(dict(self.headers))
                mode = server.mode
                if mode == "ok" and self.headers.get("If-None-Match") == ETAG:
                    self.send_response(304)
                    self.send_header("ETag", ETAG)
                    self.end_headers()
                    return
                if mode == "500":
                    body, status, ctype = b"internal error", 500, "text/plain"
                elif mode == "html":
                    body, status, ctype = b"<!DOCTYPE html><html><body>Maintenance</body></html>", 200, "text/html"
                elif mode == "huge":
                    body, status, ctype = GOOD + b"#" * (MAX_BYTES * 3), 200, "application/yaml"
                elif mode == "slow":
                    time.sleep(TIMEOUT * 6)
                    body, status, ctype = GOOD, 200, "application/yaml"
                else:
                    body, status, ctype = GOOD, 200, "application/yaml"
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    if mode == "ok":
                        self.send_header("ETag", ETAG)
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout, size limit): that is the point of the test

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/conferences.yml"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


def _source(tmp_path, url):
    cfg, _ = load_config(write_config(
        tmp_path, sources=[{"name": "remote", "format": "ai-deadlines", "location": url, "freshness": "PT6H"}],
        subscribers=[], subscriptions=[], channels={}, network=LOOPBACK_NETWORK))
    return cfg.sources[0]


def _ingest(engine, src, now):
    fetched = fetch_snapshot(engine, src, now, timeout_seconds=TIMEOUT, max_bytes=MAX_BYTES,
                             network=loopback_policy())
    return fetched, apply_latest_snapshot(engine, src, now)


def _counts(engine):
    with engine.connect() as conn:
        return (conn.execute(select(func.count()).select_from(snapshots)).scalar_one(),
                conn.execute(select(func.count()).select_from(rule_versions)).scalar_one())


def test_etag_304_counts_as_fresh_without_a_new_snapshot(engine, tmp_path, server):
    src = _source(tmp_path, server.url)
    fetched, applied = _ingest(engine, src, T0)
    assert fetched.status == "new_snapshot" and applied.status == "applied" and applied.rules == 4
    assert "If-None-Match" not in server.requests[0]
    later = T0 + timedelta(hours=2)
    fetched, applied = _ingest(engine, src, later)
    assert server.requests[-1].get("If-None-Match") == ETAG, "the request was conditional"
    assert fetched.status == "not_modified" and applied.status == "unchanged"
    assert _counts(engine) == (1, 4)
    state = read_source_state(engine, "remote")
    assert state.last_fresh_at == later and state.status == "fresh"
    assert source_fresh(engine, "remote", later + timedelta(hours=5)).passed


@pytest.mark.parametrize(("mode", "expected_status", "message"), [
    ("500", "fetch_failed", "answered HTTP 500"),
    ("slow", "fetch_failed", f"did not answer within {TIMEOUT} s"),
    ("huge", "fetch_failed", f"over the limit of {MAX_BYTES} bytes"),
    ("html", "parse_failed", "line 1: payload looks like an HTML page"),
])
def test_server_failure_keeps_last_good_versions(engine, tmp_path, server, mode, expected_status, message):
    src = _source(tmp_path, server.url)
    _ingest(engine, src, T0)
    with engine.connect() as conn:
        rules_before, _ = active_rules(conn, get_source(conn, "remote").id)
    counts = _counts(engine)

    server.mode = mode
    now = T0 + timedelta(hours=1)
    started = time.monotonic()
    fetched, applied = _ingest(engine, src, now)
    assert time.monotonic() - started < TIMEOUT * 5, "a failing server must not hold the pipeline"
    outcome = fetched if expected_status == "fetch_failed" else applied
    assert outcome.status == expected_status
    assert "'remote'" in outcome.error and message in outcome.error, outcome.error
    if mode == "html":
        # The error page is stored (bytes before parsing) and named by its snapshot id.
        assert outcome.error.startswith(f"snapshot {applied.snapshot_id}: source 'remote': ")
        assert _counts(engine) == (counts[0] + 1, counts[1])
    else:
        assert _counts(engine) == counts, "a failed fetch stores nothing"

    with engine.connect() as conn:
        rules_after, _ = active_rules(conn, get_source(conn, "remote").id)
    assert rules_after == rules_before, "the last good versions stay in force"
    state = read_source_state(engine, "remote")
    assert state.status == "stale" and message in state.last_error
    assert state.last_fresh_at == T0
    check = source_fresh(engine, "remote", now)
    assert not check.passed and message in check.summary and check.metadata["last_error"] == state.last_error
    assert source_not_quarantined(engine, "remote").passed

    # The server recovers: the same good bytes make the source fresh again, with no new version.
    server.mode = "ok"
    fetched, applied = _ingest(engine, src, now + timedelta(hours=1))
    assert read_source_state(engine, "remote").status == "fresh"
    assert source_fresh(engine, "remote", now + timedelta(hours=1)).passed
    assert _counts(engine)[1] == counts[1]
