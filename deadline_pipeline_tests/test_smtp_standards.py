"""The SMTP channel by the standards, against a real aiosmtpd server on loopback: every reply class
of RFC 5321 / RFC 3463 in every phase, IDNA domains and SMTPUTF8 local parts (RFC 6531/6532), and the
configuration refusing addresses a channel cannot carry."""

from __future__ import annotations

import email.parser
import email.policy

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult

from deadline_pipeline.config import ConfigError, SmtpChannel, load_config
from deadline_pipeline.deliver.addresses import AddressError, wire_address
from deadline_pipeline.deliver.channels.base import build_channel
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
