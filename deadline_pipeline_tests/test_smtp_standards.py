"""The SMTP channel by the standards, against a real aiosmtpd server on loopback: every reply class
of RFC 5321 / RFC 3463 in every phase, IDNA domains and SMTPUTF8 local parts (RFC 6531/6532), the
configuration refusing addresses a channel cannot carry, and logins in UTF-8 (RFC 4616, RFC 4954)."""

from __future__ import annotations

import email.parser
import email.policy
import hmac
import os
import smtplib

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import MISSING, SMTP, AuthResult

from deadline_pipeline.config import ConfigError, SmtpChannel, load_config
from deadline_pipeline.deliver.addresses import AddressError, wire_address
from deadline_pipeline.deliver.channels.environment import require_env, unresolved_env
from deadline_pipeline.deliver.channels.registry import build_channel
from deadline_pipeline.deliver.channels.smtp import reply_is_permanent
from deadline_pipeline.deliver.notification import DeliveryError
from deadline_pipeline_tests.factories import free_port, write_config
from deadline_pipeline_tests.test_channels import KEY, make_notification


class PhaseHandler:
    """Answers ``replies[phase]`` (phase: greeting, auth, mail, rcpt, data) instead of accepting."""

    def __init__(self, replies: dict[str, str]) -> None:
        self.replies = replies
        self.envelopes: list[dict] = []

    async def handle_MAIL(self, server, session, envelope, address, mail_options):
        if "mail" in self.replies:
            return self.replies["mail"]
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if "rcpt" in self.replies:
            return self.replies["rcpt"]
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        if "data" in self.replies:
            return self.replies["data"]
        self.envelopes.append({"to": list(envelope.rcpt_tos), "options": list(envelope.mail_options),
                               "data": bytes(envelope.original_content)})
        return "250 Message accepted"


class GreetingServer(SMTP):
    """An SMTP server whose greeting is the handler's ``greeting`` reply (e.g. 421 while overloaded)."""

    async def push(self, status: str):
        greeting = self.event_handler.replies.get("greeting")
        if greeting and status.startswith("220 "):
            status = greeting
        return await super().push(status)


class PhaseController(Controller):
    def factory(self):
        return GreetingServer(self.handler, **self.SMTP_kwargs)


def _server(replies: dict[str, str], **kw):
    handler = PhaseHandler(replies)

    def authenticate(server, session, envelope, mechanism, auth_data):
        if "auth" in replies:
            return AuthResult(success=False, handled=False, message=replies["auth"])
        return AuthResult(success=True)

    controller = PhaseController(handler, hostname="127.0.0.1", port=free_port(), authenticator=authenticate,
                                 auth_require_tls=False, **kw)
    controller.start()
    return handler, controller


@pytest.fixture
def serve():
    started = []

    def start(replies: dict[str, str], **kw):
        handler, controller = _server(replies, **kw)
        started.append(controller)
        return handler, controller.port

    yield start
    for controller in started:
        controller.stop()


def _channel(port: int, monkeypatch, **kw):
    monkeypatch.setenv("DP_T_SMTP_USER", "mailer")
    monkeypatch.setenv("DP_T_SMTP_PASSWORD", "s3cret")
    return build_channel("mail", SmtpChannel(type="smtp", host="127.0.0.1", port=port, sender="alerts@example.org",
                                             username_env="DP_T_SMTP_USER", password_env="DP_T_SMTP_PASSWORD",
                                             timeout_seconds=5, **kw))


@pytest.mark.parametrize(("phase", "reply", "permanent"), [
    ("greeting", "421 4.3.2 Service not available, closing transmission channel", False),
    ("auth", "454 4.7.0 Temporary authentication failure", False),
    ("auth", "535 5.7.8 Authentication credentials invalid", True),
    ("mail", "451 4.3.0 Mail server temporarily rejected message", False),
    ("mail", "553 5.1.8 Sender address rejected", True),
    ("rcpt", "452 4.2.2 Mailbox full", False),
    ("rcpt", "550 5.1.1 No such user", True),
    ("data", "451 4.7.1 Greylisted, try again later", False),
    ("data", "554 5.7.1 Message rejected", True),
    # A 5yz basic code with a 4.x.x enhanced code: the enhanced class says "try again" (RFC 3463).
    ("rcpt", "550 4.7.1 Temporarily rate limited", False),
])
def test_each_reply_class_is_classified_by_its_code(serve, monkeypatch, phase, reply, permanent):
    handler, port = serve({phase: reply})
    with pytest.raises(DeliveryError) as info:
        _channel(port, monkeypatch).send(make_notification())
    assert (info.value.permanent, info.value.outcome) == (permanent, "failed"), str(info.value)
    assert reply.split()[0] in str(info.value)
    assert handler.envelopes == []


def test_reply_codes_without_a_server():
    assert not reply_is_permanent(421, b"4.3.2 closing") and not reply_is_permanent(450)
    assert reply_is_permanent(550, b"5.1.1 unknown") and reply_is_permanent(554, "no enhanced code")
    assert not reply_is_permanent(554, b"4.4.7 queue expired soon")
    assert not reply_is_permanent(-1) and not reply_is_permanent(250)


def test_idna_domain_goes_out_as_a_label(serve, monkeypatch):
    handler, port = serve({})
    _channel(port, monkeypatch).send(make_notification(email="ana@Bücher.example"))
    (env,) = handler.envelopes
    assert env["to"] == ["ana@xn--bcher-kva.example"] and "SMTPUTF8" not in env["options"]
    msg = email.parser.BytesParser(policy=email.policy.default).parsebytes(env["data"])
    assert msg["To"] == "ana@xn--bcher-kva.example" and msg["Message-ID"] == f"<{KEY}@example.org>"


def test_utf8_local_part_uses_smtputf8_when_offered(serve, monkeypatch):
    handler, port = serve({}, enable_SMTPUTF8=True)
    _channel(port, monkeypatch, smtputf8=True).send(make_notification(email="jörg@bücher.example"))
    (env,) = handler.envelopes
    assert env["to"] == ["jörg@xn--bcher-kva.example"] and "SMTPUTF8" in env["options"]
    assert "To: jörg@xn--bcher-kva.example".encode() in env["data"]


def test_utf8_local_part_without_smtputf8_is_permanent_and_sends_nothing(serve, monkeypatch):
    handler, port = serve({}, enable_SMTPUTF8=False)
    with pytest.raises(DeliveryError) as info:
        _channel(port, monkeypatch, smtputf8=True).send(make_notification(email="jörg@example.org"))
    assert info.value.permanent and "SMTPUTF8" in str(info.value)
    assert handler.envelopes == []


def test_wire_address_refuses_an_invalid_domain():
    assert wire_address("ana@example.org").address == "ana@example.org"
    assert wire_address("jörg@例え.テスト") == wire_address("jörg@xn--r8jz45g.xn--zckzah")
    with pytest.raises(AddressError, match="not a valid internationalised domain"):
        wire_address("ana@exa mple\u200b.org")


def _config(tmp_path, channel: dict, subscribers_csv: str):
    (tmp_path / "subs.csv").write_text(subscribers_csv, encoding="utf-8")
    (tmp_path / "cal.ics").write_text("")
    return write_config(tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics"}],
                        subscribers=[], subscribers_csv="subs.csv",
                        subscriptions=[{"name": "all", "sources": ["cal"], "channels": ["mail"]}],
                        channels={"mail": channel})


def test_configuration_refuses_addresses_the_channel_cannot_carry_with_the_line(tmp_path):
    rows = "id,email,timezone\nana,ana@bücher.example,UTC\njörg,jörg@example.org,UTC\n"
    smtp = {"type": "smtp", "host": "127.0.0.1"}
    with pytest.raises(ConfigError) as info:
        load_config(_config(tmp_path, smtp, rows))
    text = str(info.value)
    assert "subs.csv: line 3" in text and "jörg@example.org" in text and "SMTPUTF8" in text
    assert "line 2" not in text  # an IDNA domain is fine on any channel
    # Accepted where it can be carried: an smtp relay that offers SMTPUTF8, or a maildir.
    load_config(_config(tmp_path, {**smtp, "smtputf8": True}, rows))
    load_config(_config(tmp_path, {"type": "maildir", "path": str(tmp_path / "box")}, rows))
    bad = "id,email,timezone\nana,ana@bücher..example,UTC\n"
    with pytest.raises(ConfigError, match="line 2.*not a valid internationalised domain"):
        load_config(_config(tmp_path, {"type": "maildir", "path": str(tmp_path / "box")}, bad))
    # An invisible character is refused where the file is read, before any channel looks at it.
    invisible = "id,email,timezone\nana,ana@exa\u200bmple.org,UTC\n"
    with pytest.raises(ConfigError, match="line 2.*invisible character U\\+200B"):
        load_config(_config(tmp_path, {"type": "maildir", "path": str(tmp_path / "box")}, invisible))


def test_maildir_carries_idna_and_utf8_local_parts(tmp_path):
    import mailbox

    from deadline_pipeline.config import MaildirChannel

    ch = build_channel("box", MaildirChannel(type="maildir", path=str(tmp_path / "m")))
    ch.send(make_notification(email="jörg@bücher.example"))
    (raw,) = [bytes(m) for m in mailbox.Maildir(tmp_path / "m").values()]
    assert "To: jörg@xn--bcher-kva.example".encode() in raw and b"=?utf-8?" not in raw.split(b"\n\n")[0]


# --------------------------------------------------------------------------- AUTH in UTF-8 (RFC 4616, RFC 4954)

USER, PASSWORD = "josé", "contraseña"


class LoginHandler(PhaseHandler):
    """Accepts every message; offers CRAM-MD5 (RFC 2195) besides aiosmtpd's own PLAIN and LOGIN, with
    its HMAC keyed by the UTF-8 bytes of :data:`PASSWORD`. ``mechanisms``: the mechanism of each
    successful login."""

    def __init__(self) -> None:
        super().__init__({})
        self.mechanisms: list[str] = []
        self.attempts = 0

    async def auth_CRAM__MD5(self, server, args):  # aiosmtpd offers it as "CRAM-MD5"
        challenge = b"<1896.697170952@postoffice.example>"
        response = await server.challenge_auth(challenge)
        if response is MISSING:
            return AuthResult(success=False, handled=True)
        user, _, digest = response.rpartition(b" ")
        expected = hmac.new(PASSWORD.encode("utf-8"), challenge, "md5").hexdigest().encode()
        return self.check("CRAM-MD5", user == USER.encode("utf-8") and hmac.compare_digest(digest, expected))

    def authenticate(self, server, session, envelope, mechanism, auth_data):
        # aiosmtpd hands over the decoded base64 as bytes: the UTF-8 encoding is compared exactly.
        return self.check(mechanism, auth_data.login == USER.encode("utf-8")
                          and auth_data.password == PASSWORD.encode("utf-8"))

    def check(self, mechanism: str, ok: bool) -> AuthResult:
        self.attempts += 1
        if ok:
            self.mechanisms.append(mechanism)
        # handled=False: aiosmtpd answers 535 5.7.8 itself when the login is wrong.
        return AuthResult(success=ok, handled=False)


@pytest.fixture
def login_server():
    """``start(offered)``: a loopback server offering only the AUTH mechanisms in ``offered``;
    returns ``(handler, port)``."""
    started = []

    def start(offered: set[str]):
        handler = LoginHandler()
        excluded = [m for m in ("PLAIN", "LOGIN", "CRAM-MD5") if m not in offered]
        controller = Controller(handler, hostname="127.0.0.1", port=free_port(), authenticator=handler.authenticate,
                                auth_require_tls=False, auth_exclude_mechanism=excluded)
        controller.start()
        started.append(controller)
        return handler, controller.port

    yield start
    for controller in started:
        controller.stop()


def _login_channel(port: int, monkeypatch, user: str = USER, password: str = PASSWORD):
    monkeypatch.setenv("DP_T_SMTP_USER", user)
    monkeypatch.setenv("DP_T_SMTP_PASSWORD", password)
    return build_channel("mail", SmtpChannel(type="smtp", host="127.0.0.1", port=port, sender="alerts@example.org",
                                             username_env="DP_T_SMTP_USER", password_env="DP_T_SMTP_PASSWORD",
                                             timeout_seconds=5))


@pytest.mark.parametrize("mechanism", ["PLAIN", "LOGIN", "CRAM-MD5"])
def test_a_utf8_login_is_sent_as_utf8_in_every_mechanism(login_server, monkeypatch, mechanism):
    handler, port = login_server({mechanism})
    assert _login_channel(port, monkeypatch).send(make_notification()).provider_message_id == f"<{KEY}@example.org>"
    assert handler.mechanisms == [mechanism]
    assert [e["to"] for e in handler.envelopes] == [["ana@example.org"]]


@pytest.mark.parametrize("mechanism", ["PLAIN", "LOGIN", "CRAM-MD5"])
def test_a_wrong_utf8_password_is_still_a_refused_login(login_server, monkeypatch, mechanism):
    handler, port = login_server({mechanism})
    with pytest.raises(DeliveryError) as info:
        _login_channel(port, monkeypatch, password="contraseño").send(make_notification())
    assert (info.value.permanent, info.value.outcome) == (True, "failed")
    assert "login refused: 535" in str(info.value) and "contrase" not in str(info.value)
    assert handler.attempts == 1 and handler.mechanisms == [] and handler.envelopes == []


def test_an_ascii_login_sends_the_bytes_it_always_sent():
    from deadline_pipeline.deliver.channels.smtp import sasl_response

    assert sasl_response("\0mailer\0s3cret") == "AG1haWxlcgBzM2NyZXQ="  # RFC 4616 §2 message, base64
    assert sasl_response("\0josé\0contraseña") == "AGpvc8OpAGNvbnRyYXNlw7Fh"  # the same in UTF-8


def _not_utf8(monkeypatch, variable: str) -> None:
    """Sets ``variable`` to "contraseña" written in Latin-1, as a shell with a Latin-1 locale would."""
    monkeypatch.setitem(os.environb, variable.encode(), "contraseña".encode("latin-1"))


def test_a_password_that_is_not_utf8_is_a_configuration_error_and_sends_nothing(login_server, monkeypatch):
    handler, port = login_server({"PLAIN"})
    ch = _login_channel(port, monkeypatch)
    _not_utf8(monkeypatch, "DP_T_SMTP_PASSWORD")
    with pytest.raises(DeliveryError) as info:
        ch.send(make_notification())
    text = str(info.value)
    assert (info.value.permanent, info.value.outcome) == (False, "failed"), text
    assert "configuration error: environment variable DP_T_SMTP_PASSWORD (password_env)" in text
    assert "UTF-8" in text and "address" not in text and "contrase" not in text
    assert handler.attempts == 0 and handler.envelopes == []


def test_a_login_smtplib_cannot_encode_is_named_as_configuration_not_as_an_address(login_server, monkeypatch):
    """What production saw: smtplib's own AUTH encodes as ASCII and raised UnicodeEncodeError, which
    the channel reported as "an address is not ASCII", permanent, for every alert of the channel."""
    from deadline_pipeline.deliver.channels import smtp as smtp_module

    monkeypatch.setattr(smtp_module._BoundedSMTP, "auth", smtplib.SMTP.auth)
    handler, port = login_server({"PLAIN"})
    with pytest.raises(DeliveryError) as info:
        _login_channel(port, monkeypatch).send(make_notification())
    text = str(info.value)
    assert not info.value.permanent, text
    assert "configuration error" in text and "password_env DP_T_SMTP_PASSWORD" in text
    assert "address" not in text and "ñ" not in text and "xf1" not in text
    assert handler.envelopes == []


def test_a_sender_that_is_not_ascii_is_still_named_as_the_sender(login_server, monkeypatch):
    handler, port = login_server({"PLAIN"})
    monkeypatch.setenv("DP_T_SMTP_USER", USER)
    monkeypatch.setenv("DP_T_SMTP_PASSWORD", PASSWORD)
    ch = build_channel("mail", SmtpChannel(type="smtp", host="127.0.0.1", port=port, sender="jörg@example.org",
                                           username_env="DP_T_SMTP_USER", password_env="DP_T_SMTP_PASSWORD"))
    with pytest.raises(DeliveryError, match="sender 'jörg@example.org' is not ASCII") as info:
        ch.send(make_notification())
    assert info.value.permanent and handler.mechanisms == ["PLAIN"] and handler.envelopes == []


def _login_config(tmp_path, port: int):
    return load_config(_config(tmp_path, {"type": "smtp", "host": "127.0.0.1", "port": port,
                                          "username_env": "DP_T_SMTP_USER", "password_env": "DP_T_SMTP_PASSWORD"},
                               "id,email,timezone\nana,ana@example.org,UTC\n"))[0]


def test_start_up_refuses_a_login_that_is_not_utf8_naming_the_variable(tmp_path, monkeypatch):
    cfg = _login_config(tmp_path, free_port())
    assert unresolved_env(cfg, environ={"DP_T_SMTP_USER": USER, "DP_T_SMTP_PASSWORD": PASSWORD}) == []
    monkeypatch.setenv("DP_T_SMTP_USER", USER)
    _not_utf8(monkeypatch, "DP_T_SMTP_PASSWORD")
    (problem,) = unresolved_env(cfg)
    assert (problem.channel, problem.key, problem.variable) == ("mail", "password_env", "DP_T_SMTP_PASSWORD")
    with pytest.raises(ConfigError) as info:
        require_env(cfg)
    text = str(info.value)
    assert text.startswith("channels.mail.password_env: environment variable DP_T_SMTP_PASSWORD is not valid UTF-8")
    assert "nothing was sent" in text and "contrase" not in text


def _run(tmp_path, port: int, as_of: str, **env):
    from deadline_pipeline_tests.factories import ics
    from deadline_pipeline_tests.test_startup_and_time_travel import _cli
    from deadline_pipeline_tests.test_watch_checks import EVENT_A

    (tmp_path / "cal.ics").write_text(ics(EVENT_A), newline="")
    path = write_config(tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics"}],
                        subscribers=[{"id": "ana", "email": "ana@example.org", "timezone": "Europe/Berlin"}],
                        subscriptions=[{"name": "all", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["mail"]}],
                        channels={"mail": {"type": "smtp", "host": "127.0.0.1", "port": port,
                                           "username_env": "DP_T_SMTP_USER", "password_env": "DP_T_SMTP_PASSWORD"}})
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    return _cli(["run", "--config", str(path), "--db-url", url, "--as-of", as_of], tmp_path, **env), url


def test_a_run_delivers_through_a_utf8_login_and_refuses_one_that_is_not_utf8(tmp_path, login_server):
    """The pipeline's own path: planned, then due. A password in Latin-1 bytes stops the run before
    anything is sent (exit 2 naming the variable, the alert left pending); in UTF-8 it is delivered."""
    from deadline_pipeline.store.db import make_engine
    from deadline_pipeline_tests.test_startup_and_time_travel import _states

    handler, port = login_server({"PLAIN", "LOGIN"})
    login = {"DP_T_SMTP_USER": USER, "DP_T_SMTP_PASSWORD": PASSWORD}
    planned, url = _run(tmp_path, port, "2027-01-10T00:00:00Z", **login)
    assert planned.exit_code == 0, planned.output
    # CliRunner sets os.environ, which writes a lone surrogate back as the byte it stands for (PEP 383).
    latin1 = "contraseña".encode("latin-1").decode("utf-8", "surrogateescape")
    refused, _ = _run(tmp_path, port, "2027-01-14T12:00:00Z", **{**login, "DP_T_SMTP_PASSWORD": latin1})
    assert refused.exit_code == 2, refused.output
    assert "channels.mail.password_env: environment variable DP_T_SMTP_PASSWORD is not valid UTF-8" in refused.output
    engine = make_engine(url)
    assert _states(engine) == {"pending": 1} and handler.attempts == 0
    sent, _ = _run(tmp_path, port, "2027-01-14T12:00:00Z", **login)
    assert sent.exit_code == 0, sent.output
    assert _states(engine) == {"delivered": 1}, sent.output
    engine.dispose()
    assert handler.mechanisms == ["PLAIN"] and [e["to"] for e in handler.envelopes] == [["ana@example.org"]]
