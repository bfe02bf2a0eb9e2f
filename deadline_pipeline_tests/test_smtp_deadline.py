"""The SMTP channel's send ends within ``timeout_seconds`` as a whole, however slowly the server
answers, and keeps the module's classification: the deadline passing before DATA is a retryable
"failed", after DATA an "unknown" (the server may hold the message).

smtplib's timeout bounds each socket call; a server dripping its answer a byte every 0.2 s (each byte
well within the 1 s timeout, smtp_drip_server.py) or answering every command a little slowly (a real
aiosmtpd server) held a send for as long as it liked, past the lease it was started under.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import threading
import time

import pytest
from aiosmtpd.controller import Controller

from deadline_pipeline.deliver.notification import DeliveryError
from deadline_pipeline_tests.factories import free_port
from deadline_pipeline_tests.smtp_drip_server import SmtpDripServer
from deadline_pipeline_tests.test_channels import (
    DRIP_SLACK,
    DRIP_TIMEOUT,
    KEY,
    RecordingHandler,
    make_notification,
    parse,
    smtp_channel,
)


def _fails_in_time(ch) -> DeliveryError:
    """Send one alert on ``ch``; assert it raised within the timeout plus the slack. Returns the error."""
    started = time.monotonic()
    with pytest.raises(DeliveryError) as info:
        ch.send(make_notification())
    elapsed = time.monotonic() - started
    assert elapsed < DRIP_TIMEOUT + DRIP_SLACK, f"the send took {elapsed:.1f} s with a {DRIP_TIMEOUT:g} s timeout"
    return info.value


def _names_the_deadline(err: DeliveryError, port: int) -> None:
    assert f"channel 'mail' (smtp 127.0.0.1:{port}): the send's deadline ({DRIP_TIMEOUT:g} s) passed" in str(err)


@pytest.mark.parametrize("where, messages, outcome, phase", [
    ("greeting", 0, "failed", "before DATA, the message was not sent"),
    ("data", 1, "unknown", "after DATA, the message may have been delivered"),
], ids=["greeting", "data"])
def test_smtp_send_ends_within_its_timeout_however_the_server_drips(where, messages, outcome, phase):
    """A dripping greeting: nothing of the message was sent, retryable "failed". A dripping reply to
    the data: the server has the message, "unknown" (resent with the same Message-ID) - not "failed"
    nor "delivered" because the deadline's cut left a reply truncated to "25" or "250 2". On time."""
    with SmtpDripServer(where) as server:
        err = _fails_in_time(smtp_channel(server.port, timeout_seconds=DRIP_TIMEOUT))
        assert server.messages == messages
    assert (err.permanent, err.outcome) == (False, outcome)
    _names_the_deadline(err, server.port)
    assert phase in str(err)


def test_smtps_send_ends_within_its_timeout_when_the_tls_handshake_drips():
    """``ssl: true``: the server drips its answer to the client's TLS hello. Retryable "failed", named as
    the deadline. (CPython already bounds a handshake by the socket's timeout as a whole; this keeps the
    implicit-TLS path, which the channel now wraps itself, under the send's deadline.)"""
    with SmtpDripServer("handshake") as server:
        err = _fails_in_time(smtp_channel(server.port, ssl=True, timeout_seconds=DRIP_TIMEOUT))
    assert (err.permanent, err.outcome) == (False, "failed")
    _names_the_deadline(err, server.port)


def test_smtp_data_reply_cut_off_mid_line_is_unknown_not_a_refusal():
    """A server that goes away after ``25`` of its reply to the data gave no reply: "unknown". smtplib
    read it as reply code 25, which the channel reported as a refusal ("failed")."""
    with SmtpDripServer("cut") as server:
        with pytest.raises(DeliveryError) as info:
            smtp_channel(server.port, timeout_seconds=5).send(make_notification())
        assert server.messages == 1
    assert (info.value.permanent, info.value.outcome) == (False, "unknown")
    assert "connection lost after DATA" in str(info.value)


class SlowHandler(RecordingHandler):
    """Takes ``delay`` seconds to answer each MAIL and RCPT: every reply within the channel's timeout."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def handle_MAIL(self, server, session, envelope, address, mail_options):
        await asyncio.sleep(self.delay)
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        await asyncio.sleep(self.delay)
        return await super().handle_RCPT(server, session, envelope, address, rcpt_options)


@pytest.fixture
def slow_smtp_server(request):
    handler = SlowHandler(request.param)
    controller = Controller(handler, hostname="127.0.0.1", port=free_port())
    controller.start()
    yield handler, controller.port
    controller.stop()


@pytest.mark.parametrize("slow_smtp_server", [0.6], indirect=True)
def test_smtp_session_slow_in_every_phase_ends_within_its_timeout(slow_smtp_server):
    """A real server answering MAIL and RCPT 0.6 s each (each within the 1 s timeout, 1.2 s together):
    the deadline passes while RCPT waits, before DATA: retryable "failed", nothing delivered, and the
    timer that cut the connection is gone with the send."""
    handler, port = slow_smtp_server
    threads = threading.active_count()
    err = _fails_in_time(smtp_channel(port, timeout_seconds=DRIP_TIMEOUT))
    assert (err.permanent, err.outcome) == (False, "failed")
    _names_the_deadline(err, port)
    assert handler.envelopes == []
    assert threading.active_count() == threads


@pytest.mark.parametrize("slow_smtp_server", [0.0, 0.25], indirect=True)
def test_smtp_send_in_time_is_delivered_and_leaves_no_thread(slow_smtp_server):
    """A session that ends before its deadline (at once, or using half of it) is delivered as before,
    and no deadline timer outlives its send."""
    handler, port = slow_smtp_server
    ch = smtp_channel(port, timeout_seconds=DRIP_TIMEOUT)
    threads = threading.active_count()
    results = [ch.send(make_notification()) for _ in range(3)]
    assert threading.active_count() == threads
    assert [r.provider_message_id for r in results] == [f"<{KEY}@example.org>"] * 3
    assert [parse(e["data"])["Message-ID"] for e in handler.envelopes] == [f"<{KEY}@example.org>"] * 3


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1: ``(cert.pem, key.pem)``."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("making a test certificate needs the openssl command")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


@pytest.mark.parametrize("mode", ["ssl", "starttls"])
def test_smtp_over_tls_still_delivers(mode, certificate, monkeypatch):
    """The TLS paths under the deadline (``ssl: true`` wraps the watched connection itself; STARTTLS
    has smtplib wrap it) against aiosmtpd, the client verifying the server's certificate."""
    cert, key = certificate
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # read by the channel's ssl.create_default_context()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    handler = RecordingHandler()
    tls = {"ssl_context": context} if mode == "ssl" else {"tls_context": context, "require_starttls": True}
    controller = Controller(handler, hostname="127.0.0.1", port=free_port(), **tls)
    controller.start()
    try:
        ch = smtp_channel(controller.port, timeout_seconds=5, **{mode: True})
        assert ch.send(make_notification()).provider_message_id == f"<{KEY}@example.org>"
    finally:
        controller.stop()
    assert [e["to"] for e in handler.envelopes] == [["ana@example.org"]]


@pytest.mark.parametrize("slow_smtp_server", [0.0], indirect=True)
def test_this_hosts_name_is_looked_up_once_not_in_every_send(slow_smtp_server, monkeypatch):
    """smtplib looked this host's name up (``socket.getfqdn``, a reverse DNS query) in every connection,
    after connecting. Where that lookup hangs (here 1.2 s, past the 1 s deadline), every send was cut
    by its deadline while the lookup ran and failed, one after another. Now it is made once, before
    the first send's deadline starts, and every send is delivered."""
    import socket

    from deadline_pipeline.deliver.channels.smtp import ehlo_name

    handler, port = slow_smtp_server
    real, calls, sender = socket.getfqdn, [], threading.current_thread()

    def slow_getfqdn(name: str = "") -> str:
        if threading.current_thread() is sender:  # the server's own lookups (its thread) stay fast
            calls.append(name)
            time.sleep(DRIP_TIMEOUT + 0.2)
        return real(name)

    ehlo_name.cache_clear()
    monkeypatch.setattr(socket, "getfqdn", slow_getfqdn)
    try:
        ch = smtp_channel(port, timeout_seconds=DRIP_TIMEOUT)
        results = [ch.send(make_notification()) for _ in range(3)]
    finally:
        ehlo_name.cache_clear()
    assert [r.provider_message_id for r in results] == [f"<{KEY}@example.org>"] * 3
    assert len(handler.envelopes) == 3
    assert len(calls) == 1, calls
