"""Redaction and the outbound guard.

Network rule of these tests: no packet ever leaves for a non-loopback address, even if the guard
were broken. Decisions about non-loopback targets (metadata addresses, private ranges, names) are
tested on the guard's decision functions with an injected resolver; requests that really go out
only target loopback receivers, which the allow-list admits or refuses.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from deadline_pipeline.config import ConfigError, SlackChannel, WebhookChannel, load_config
from deadline_pipeline.deliver.channels.slack import SlackSender
from deadline_pipeline.deliver.channels.webhook import WebhookSender
from deadline_pipeline.deliver.notification import DeliveryError
from deadline_pipeline.ingest.fetch import FetchError, fetch
from deadline_pipeline.security import redact as rd
from deadline_pipeline.security.outbound import (
    DEFAULT_POLICY,
    NetworkPolicy,
    OutboundRefused,
    check_url,
    literal_address,
    refusal_rule,
)
from deadline_pipeline_tests.factories import free_port, write_config
from deadline_pipeline_tests.test_channels import make_notification

NOW = datetime(2027, 3, 1, 9, 0, tzinfo=UTC)


# --------------------------------------------------------------------------- redaction


def test_redact_url_masks_userinfo_query_fragment_and_credential_paths():
    assert rd.redact_url("https://bob:pw-5512@h.example/x?token=abc123&b=2#frag") == \
        "https://***@h.example/x?token=***&b=***#***"
    assert rd.redact_url("https://hooks.slack.com/services/T0/B0/XXXXSECRET") == "https://hooks.slack.com/***"
    assert rd.redact_url("https://mm.example.org/hooks/abcdefghijk") == "https://mm.example.org/***"
    assert rd.redact_url("/srv/data/cal.ics") == "/srv/data/cal.ics"
    assert rd.redact_url("https://h.example/plain/path") == "https://h.example/plain/path"


def test_redact_free_text_masks_urls_registered_secrets_and_authorization_values():
    rd.register_secret("sekret-value-8812")
    text = ("POST http://u:p4ss@127.0.0.1:9/hook?token=t0k3n failed; header Authorization: Bearer abcdef123456 "
            "and the value sekret-value-8812, encoded sekret-value-8812 too")
    out = rd.redact(text)
    for leaked in ("p4ss", "t0k3n", "abcdef123456", "sekret-value-8812"):
        assert leaked not in out
    assert "http://***@127.0.0.1:9/hook?token=***" in out and "Bearer ***" in out


def test_a_secret_that_is_not_utf8_is_registered_and_masked_percent_encoded_too():
    # A variable set in Latin-1 reaches Python with a lone surrogate for the byte 0xF1 (PEP 383).
    value = "contraseña-21".encode("latin-1").decode("utf-8", "surrogateescape")
    rd.register_secret(value)
    assert rd.redact(f"login {value} refused; percent-encoded contrase%F1a-21") == \
        "login *** refused; percent-encoded ***"


def test_short_values_are_not_registered_so_messages_stay_readable():
    rd.register_secret("yes")
    assert rd.redact("yes, done") == "yes, done"


def test_expand_secret_refs_registers_the_value_and_names_an_unset_variable(monkeypatch):
    monkeypatch.setenv("DP_TEST_REF_TOKEN", "ref-token-77aa")
    assert rd.expand_secret_refs("https://h/x?token=${DP_TEST_REF_TOKEN}") == "https://h/x?token=ref-token-77aa"
    assert "ref-token-77aa" not in rd.redact("the value is ref-token-77aa")
    monkeypatch.delenv("DP_TEST_MISSING_REF", raising=False)
    with pytest.raises(KeyError, match="DP_TEST_MISSING_REF"):
        rd.expand_secret_refs("https://h/?t=${DP_TEST_MISSING_REF}")


def test_installed_logging_redacts_every_record_and_quiets_url_printing_loggers(caplog):
    rd.install()
    rd.register_secret("logged-secret-4471")
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("deadline_pipeline.test").warning("sending to %s with %s",
                                                            "https://x.example/h?token=tt-9", "logged-secret-4471")
        try:
            raise ValueError("boom https://a:pw-in-trace@x.example/")
        except ValueError:
            logging.getLogger("deadline_pipeline.test").exception("failed")
    assert "tt-9" not in caplog.text and "logged-secret-4471" not in caplog.text
    assert "pw-in-trace" not in caplog.text and "https://***@x.example/" in caplog.text
    for name in ("httpx", "httpcore", "aiohttp", "urllib3"):
        assert logging.getLogger(name).getEffectiveLevel() >= logging.WARNING


# --------------------------------------------------------------------------- the guard's decisions

FAKE_DNS = {
    "metadata.google.internal": ["169.254.169.254"],
    "loopback.test": ["127.0.0.1"],
    "mixed.test": ["93.184.216.34", "10.1.2.3"],  # one public, one private answer
    "public.test": ["93.184.216.34"],
    "mapped.test": ["::ffff:169.254.169.254"],
}


def fake_resolver(host: str, port: int) -> list[str]:
    return FAKE_DNS[host]


POLICY = DEFAULT_POLICY.with_resolver(fake_resolver)

# (target URL, rule named in the refusal)
HOSTILE = [
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://metadata.google.internal/computeMetadata/v1/", "link-local"),
    ("http://0x7f000001/", "loopback"),
    ("http://2130706433/", "loopback"),
    ("http://127.1:8080/", "loopback"),
    ("http://[::ffff:127.0.0.1]/", "IPv4-mapped loopback"),
    ("http://[::1]/", "loopback"),
    ("http://loopback.test/", "loopback"),
    ("http://127.0.0.1:5432/", "loopback"),
    ("http://10.0.0.5/", "private"),
    ("http://192.168.1.1/", "private"),
    ("http://[fd00::1]/", "private"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://[::]/", "unspecified"),
    ("http://224.0.0.251/", "multicast"),
    ("http://mixed.test/", "private"),
    ("http://mapped.test/", "IPv4-mapped link-local"),
    ("http://[2002:a9fe:a9fe::]/", "6to4 link-local"),
    ("http://100.64.0.1/", "private"),
]


@pytest.mark.parametrize(("url", "rule"), HOSTILE)
def test_hostile_targets_are_refused_naming_the_rule(url, rule):
    with pytest.raises(OutboundRefused) as err:
        check_url(url, POLICY)
    assert err.value.rule == rule
    assert rule in str(err.value) and "network.allow" in str(err.value)


def test_public_addresses_pass_and_the_allow_list_admits_named_networks():
    assert check_url("https://public.test/feed", POLICY) == ["93.184.216.34"]
    allowed = NetworkPolicy.from_strings(["127.0.0.1/32", "10.0.0.0/8"], resolver=fake_resolver)
    assert check_url("http://127.0.0.1:5432/", allowed) == ["127.0.0.1"]
    assert check_url("http://10.9.8.7/", allowed) == ["10.9.8.7"]
    # An IPv4-mapped spelling of an allowed address is the allowed address.
    assert check_url("http://[::ffff:127.0.0.1]/", allowed) == ["::ffff:7f00:1"]
    # Allowing one address does not open its neighbours, nor other kinds.
    with pytest.raises(OutboundRefused, match="loopback"):
        check_url("http://127.0.0.2/", allowed)
    with pytest.raises(OutboundRefused, match="link-local"):
        check_url("http://metadata.google.internal/", allowed)


def test_allow_private_admits_private_ranges_but_never_loopback_or_link_local():
    policy = NetworkPolicy.from_strings([], allow_private=True, resolver=fake_resolver)
    assert refusal_rule("10.1.2.3", policy) is None and refusal_rule("fd00::1", policy) is None
    assert refusal_rule("127.0.0.1", policy) == "loopback"
    assert refusal_rule("169.254.169.254", policy) == "link-local"


def test_numeric_host_spellings_are_parsed_not_looked_up():
    assert literal_address("0x7f000001") == "127.0.0.1"
    assert literal_address("017700000001") == "127.0.0.1"
    assert literal_address("[::1]") == "::1"
    assert literal_address("example.org") is None


def test_network_section_in_the_configuration(tmp_path):
    (tmp_path / "c.csv").write_text("id,title,due\n")
    base = dict(sources=[{"name": "s", "format": "csv", "location": "c.csv"}], subscribers=[], subscriptions=[],
                channels={})
    cfg, _ = load_config(write_config(tmp_path, **base, network={"allow": ["127.0.0.1/32", "10.0.0.0/8"]}))
    assert refusal_rule("10.2.3.4", cfg.network.policy()) is None
    assert refusal_rule("10.2.3.4", load_config(write_config(tmp_path, **base))[0].network.policy()) == "private"
    with pytest.raises(ConfigError, match=r"network.allow.*'10.0.0.0/33' is not an IP network"):
        load_config(write_config(tmp_path, **base, network={"allow": ["10.0.0.0/33"]}))


def test_source_location_with_a_password_is_refused_by_the_configuration(tmp_path):
    path = write_config(tmp_path, sources=[{"name": "s", "format": "csv",
                                            "location": "https://reader:pw-cfg-31@feeds.example/x.csv"}],
                        subscribers=[], subscriptions=[], channels={})
    with pytest.raises(ConfigError, match="password_env") as err:
        load_config(path)
    assert "pw-cfg-31" not in str(err.value)


# --------------------------------------------------------------------------- loopback receivers


class _Receiver:
    """A loopback HTTP server recording every request; routes by path."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.requests: list[str] = []
        self.cookies: list[str | None] = []  # the Cookie header of each request (None: none sent)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self):
                owner.requests.append(self.path)
                owner.cookies.append(self.headers.get("Cookie"))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                if self.path.startswith("/redirect"):
                    self.send_response(302)
                    self.send_header("Location", self.path.split("to=", 1)[1])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.dumps({"id": "ok"}).encode()
                self.send_response(200)
                if self.path.startswith("/set-cookie"):
                    self.send_header("Set-Cookie", f"session=for{self.path.replace('/', '-')}; Path=/")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _any

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.base = f"http://{host}:{self.server.server_address[1]}"
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = _Receiver()
    yield r
    r.close()


ALLOW_LOOPBACK = NetworkPolicy.from_strings(["127.0.0.1/32"])


def test_fetch_refuses_a_loopback_source_unless_allowed(receiver):
    with pytest.raises(FetchError, match="loopback") as err:
        fetch("s", f"{receiver.base}/feed", now=NOW)
    assert not err.value.retryable and receiver.requests == []
    assert fetch("s", f"{receiver.base}/feed", now=NOW, network=ALLOW_LOOPBACK).http_status == 200
    assert receiver.requests == ["/feed"]


def test_fetch_rechecks_every_redirect_target():
    # The second receiver listens on 127.0.0.2: loopback too, but outside the allow-list.
    inner = _Receiver("127.0.0.2")
    outer = _Receiver()
    try:
        with pytest.raises(FetchError, match=r"127\.0\.0\.2.*loopback") as err:
            fetch("s", f"{outer.base}/redirect?to={inner.base}/secret", now=NOW, network=ALLOW_LOOPBACK)
        assert not err.value.retryable and "1 redirect" in str(err.value)
        assert len(outer.requests) == 1 and inner.requests == []
    finally:
        inner.close()
        outer.close()


def test_fetch_redirect_to_a_private_address_is_refused_before_any_connection(receiver):
    # The redirect names a host the injected resolver answers with a private address. The caller's
    # own client (no guarded transport) makes fetch decide on each hop before sending; were that
    # broken, the plain client would look the reserved .test name up itself and fail: no packet
    # leaves this machine either way.
    import httpx

    policy = ALLOW_LOOPBACK.with_resolver(lambda host, port: ["10.20.30.40"])
    with httpx.Client() as client, pytest.raises(FetchError, match=r"10\.20\.30\.40 \(host 'private.test'\).* private"):
        fetch("s", f"{receiver.base}/redirect?to=http://private.test:{free_port()}/x", now=NOW,
              network=policy, client=client)
    assert len(receiver.requests) == 1


def test_a_name_resolving_to_loopback_is_refused_and_the_checked_address_is_pinned(receiver):
    calls: list[str] = []

    def resolver(host, port):
        calls.append(host)
        return ["127.0.0.1"]

    with pytest.raises(FetchError, match="'innocent.test'.* loopback"):
        fetch("s", f"http://innocent.test:{receiver.port}/x", now=NOW, network=DEFAULT_POLICY.with_resolver(resolver))
    assert receiver.requests == []
    # Allowed, the request goes to the address the guard checked (the name is never looked up again:
    # the system resolver cannot resolve the reserved .test domain, so success proves the pin).
    allowed = ALLOW_LOOPBACK.with_resolver(resolver)
    assert fetch("s", f"http://innocent.test:{receiver.port}/x", now=NOW, network=allowed).http_status == 200
    assert receiver.requests == ["/x"] and calls == ["innocent.test", "innocent.test"]


def test_dns_rebinding_cannot_swap_the_checked_address(receiver):
    # First answer: 127.0.0.2 (allowed, nothing listens there); any later answer: 127.0.0.1, where the
    # receiver listens but which the policy refuses. A client that looked the name up again to
    # connect would reach the receiver.
    answers = iter([["127.0.0.2"]])

    def rebinding(host, port):
        return next(answers, ["127.0.0.1"])

    policy = NetworkPolicy.from_strings(["127.0.0.2/32"], resolver=rebinding)
    with pytest.raises(FetchError, match="cannot fetch") as err:
        fetch("s", f"http://rebind.test:{receiver.port}/x", now=NOW, network=policy)
    assert "127.0.0.2" in str(err.value) or "ConnectError" in str(err.value)
    assert receiver.requests == []


LOOPBACK_TARGETS = ["http://0x7f000001:{port}/h", "http://[::ffff:127.0.0.1]:{port}/h", "http://127.0.0.1:{port}/h",
                    "http://loopback.test:{port}/h"]


@pytest.mark.parametrize("template", LOOPBACK_TARGETS)
def test_webhook_to_loopback_is_a_permanent_error_on_both_transports(receiver, template):
    url = template.format(port=receiver.port)
    ch = WebhookSender("hook", WebhookChannel(type="webhook", timeout_seconds=2),
                       network=DEFAULT_POLICY.with_resolver(fake_resolver))
    with pytest.raises(DeliveryError, match="loopback") as blocking:
        ch.send(make_notification(webhook_url=url))
    assert blocking.value.permanent

    async def go():
        try:
            await ch.send_async(make_notification(webhook_url=url))
        finally:
            await ch.aclose()

    with pytest.raises(DeliveryError, match="loopback") as on_loop:
        asyncio.run(go())
    assert on_loop.value.permanent and on_loop.value.outcome == "failed"
    ch.close()
    assert receiver.requests == []


def test_webhook_to_ipv6_loopback_and_postgres_port_refused_without_a_packet():
    ch = WebhookSender("hook", WebhookChannel(type="webhook", timeout_seconds=2))
    for url in ("http://[::1]:9/h", "http://127.0.0.1:5432/"):
        with pytest.raises(DeliveryError, match="loopback") as err:
            ch.send(make_notification(webhook_url=url))
        assert err.value.permanent
    ch.close()


def test_allow_listed_loopback_receiver_is_accepted_on_both_transports(receiver):
    ch = WebhookSender("hook", WebhookChannel(type="webhook", timeout_seconds=2), network=ALLOW_LOOPBACK)
    assert ch.send(make_notification(webhook_url=f"{receiver.base}/h")).provider_message_id == "ok"

    async def go():
        try:
            return await ch.send_async(make_notification(webhook_url=f"{receiver.base}/h"))
        finally:
            await ch.aclose()

    assert asyncio.run(go()).provider_message_id == "ok"
    ch.close()
    assert receiver.requests == ["/h", "/h"]


def test_a_cookie_one_receiver_sets_never_goes_out_with_another_alert(receiver, monkeypatch):
    """Every channel shares one HTTP client among all its subscribers: a receiver's Set-Cookie must
    not be kept and sent with the next alert to the same host (another subscriber's receiver behind
    the same host would get the first one's session). Checked on the webhook's two transports, the
    Slack channel, through a host name (aiohttp keeps no cookie for a bare IP)."""
    resolver = ALLOW_LOOPBACK.with_resolver(lambda host, port: ["127.0.0.1"])
    base = f"http://hooks.test:{receiver.port}"
    ch = WebhookSender("hook", WebhookChannel(type="webhook", timeout_seconds=2), network=resolver)
    ch.send(make_notification(webhook_url=f"{base}/set-cookie/ana"))
    ch.send(make_notification(webhook_url=f"{base}/bob", subscriber_id="bob"))

    async def go():
        try:
            await ch.send_async(make_notification(webhook_url=f"{base}/set-cookie/ana"))
            await ch.send_async(make_notification(webhook_url=f"{base}/bob", subscriber_id="bob"))
        finally:
            await ch.aclose()

    asyncio.run(go())
    ch.close()
    monkeypatch.setenv("DP_TEST_SLACK_COOKIE", f"{base}/set-cookie/slack")
    slack = SlackSender("slack", SlackChannel(type="slack", url_env="DP_TEST_SLACK_COOKIE",
                                              timeout_seconds=2), network=resolver)
    slack.send(make_notification())
    slack.send(make_notification())
    slack.close()
    assert receiver.requests == ["/set-cookie/ana", "/bob"] * 2 + ["/set-cookie/slack"] * 2
    assert receiver.cookies == [None] * 6


def test_webhook_url_token_from_the_environment_is_sent_and_never_shown(receiver, monkeypatch):
    monkeypatch.setenv("DP_TEST_HOOK_TOKEN", "hook-token-5e5e")
    ch = WebhookSender("hook", WebhookChannel(type="webhook", timeout_seconds=2), network=ALLOW_LOOPBACK)
    ch.send(make_notification(webhook_url=f"{receiver.base}/h?token=${{DP_TEST_HOOK_TOKEN}}"))
    assert receiver.requests == ["/h?token=hook-token-5e5e"]
    monkeypatch.delenv("DP_TEST_HOOK_TOKEN")
    with pytest.raises(DeliveryError, match="DP_TEST_HOOK_TOKEN.*not set") as err:
        ch.send(make_notification(webhook_url=f"{receiver.base}/h?token=${{DP_TEST_HOOK_TOKEN}}"))
    assert err.value.permanent
    ch.close()


def test_slack_to_a_refused_address_is_permanent_and_does_not_show_the_url(receiver, monkeypatch):
    monkeypatch.setenv("DP_TEST_SLACK_GUARD", f"{receiver.base}/services/T1/B1/slack-secret-path-9")
    ch = SlackSender("chat", SlackChannel(type="slack", url_env="DP_TEST_SLACK_GUARD"))
    with pytest.raises(DeliveryError, match="loopback") as err:
        ch.send(make_notification())
    assert err.value.permanent and "slack-secret-path-9" not in str(err.value)
    ch.close()
    assert receiver.requests == []


def test_watchdog_ping_passes_the_guard_and_hides_the_url(receiver, tmp_path):
    from deadline_pipeline.commands.ops_cmds import _ping

    err = _ping(f"{receiver.base}/ping/check-uuid-1234?key=k-5531", ok=True)
    assert err is not None and "loopback" in err and "k-5531" not in err
    assert receiver.requests == []
    (tmp_path / "c.csv").write_text("id,title,due\n")
    cfg, _ = load_config(write_config(tmp_path, sources=[{"name": "s", "format": "csv", "location": "c.csv"}],
                                      subscribers=[], subscriptions=[], channels={},
                                      network={"allow": ["127.0.0.1/32"]}))
    assert _ping(f"{receiver.base}/ping/check-uuid-1234", ok=False, cfg=cfg) is None
    assert receiver.requests == ["/ping/check-uuid-1234/fail"]


def test_prose_punctuation_after_a_url_survives_redaction():
    assert rd.redact("failed (see https://h.example/x?t=abc123).") == "failed (see https://h.example/x?t=***)."


def test_error_texts_are_redacted_when_built():
    err = DeliveryError("channel 'hook' (webhook http://u:pw-de-1@h.example/x?token=tk-de-2): HTTP 500",
                        permanent=False)
    assert "pw-de-1" not in str(err) and "tk-de-2" not in str(err)
    fe = FetchError("s", "https://h.example/cal.ics?key=tk-fe-3 answered HTTP 500", retryable=True)
    assert "tk-fe-3" not in str(fe) and "key=***" in str(fe)


def test_stored_source_location_keeps_no_token(engine, tmp_path, monkeypatch):
    from sqlalchemy import select, update

    from deadline_pipeline.ingest.service import ensure_source
    from deadline_pipeline.store.schema import sources

    monkeypatch.setenv("DP_TEST_FEED_KEY", "feed-key-8d8d")
    cfg, _ = load_config(write_config(
        tmp_path, sources=[{"name": "private", "format": "ics",
                            "location": "https://feeds.example/team.ics?key=${DP_TEST_FEED_KEY}"}],
        subscribers=[], subscriptions=[], channels={}))
    src = cfg.sources[0]
    assert src.location.endswith("key=feed-key-8d8d"), "the fetch needs the real URL"
    row = ensure_source(engine, src)
    assert row.location == "https://feeds.example/team.ics?key=***"
    # A row written before redaction existed is cleaned on the next run; an unchanged one is not rewritten.
    with engine.begin() as conn:
        conn.execute(update(sources).where(sources.c.id == row.id).values(location=src.location))
    assert ensure_source(engine, src).location == "https://feeds.example/team.ics?key=***"
    with engine.connect() as conn:
        assert "feed-key-8d8d" not in conn.execute(select(sources.c.location)).scalar_one()


def test_sweep_escalates_a_refused_webhook_at_once_and_stores_the_rule_not_the_token(engine, receiver, monkeypatch):
    from sqlalchemy import select

    from deadline_pipeline.config import DeadlinesConfig
    from deadline_pipeline.deliver.sweep import sweep
    from deadline_pipeline.store.schema import alerts, delivery_attempts
    from deadline_pipeline_tests.test_delivery_sweep import T0, seed

    monkeypatch.setenv("DP_TEST_SWEEP_TOKEN", "sweep-token-6b6b")
    [a] = seed(engine, 1, webhook_url=f"{receiver.base}/h?token=${{DP_TEST_SWEEP_TOKEN}}")
    out = sweep(engine, DeadlinesConfig(channels={"hook": WebhookChannel(type="webhook")}), T0)
    assert (out.escalated, out.failed) == (1, 1)
    with engine.connect() as conn:
        row = conn.execute(select(alerts.c.status, alerts.c.attempts, alerts.c.last_error)
                           .where(alerts.c.id == a)).one()
        attempt_errors = conn.execute(select(delivery_attempts.c.error)).scalars().all()
    assert (row.status, row.attempts) == ("escalated", 1), "a refused target is permanent, never retried"
    assert "loopback" in row.last_error and "network.allow" in row.last_error
    assert "sweep-token-6b6b" not in row.last_error + "".join(e or "" for e in attempt_errors)
    assert receiver.requests == []
