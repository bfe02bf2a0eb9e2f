"""A configuration whose sections have the wrong shape, whose switches are quoted, or whose paths name
unset variables is refused at load with the file, the key and what was wrong.

Each case once got through: `channels:` written as a list failed with ``AttributeError: 'list'
object has no attribute 'values'`` (exit 1, in every command); ``allow_private: 'yes'`` (quoted)
opened the outbound guard; ``path: "${MAIL_DIR}/maildir"`` with ``MAIL_DIR`` empty wrote the mail to
``/maildir`` at the file-system root, and with it unset to a folder literally named ``${MAIL_DIR}``.
"""

from __future__ import annotations

import pytest

from deadline_pipeline.config import ConfigError, load_config

SOURCE = "sources:\n  - {name: conf, format: ics, location: a.ics, tenant: demo}\n"
SUBSCRIBER = "subscribers:\n  - {id: a, tenant: demo, email: a@example.org}\n"


def _error(tmp_path, text: str) -> tuple[str, object]:
    config = (tmp_path / "deadlines.yaml").resolve()
    config.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(config)
    return str(err.value), config


@pytest.mark.parametrize(("section", "value", "message"), [
    ("channels", "[{name: mail, type: maildir}]", "expected a mapping of channel names to their settings, got a list"),
    ("channels", "5", "expected a mapping of channel names to their settings, got 5"),
    ("sources", "5", "expected a list of sources, got 5"),
    ("subscribers", "abc", "expected a list of subscribers, got 'abc'"),
    ("subscriptions", "{a: 1}", "expected a list of subscriptions, got a mapping"),
])
def test_a_section_of_the_wrong_shape_is_named(tmp_path, section, value, message):
    text = f"{section}: {value}\n" + (SOURCE if section != "sources" else "")
    got, config = _error(tmp_path, text)
    assert got == f"{config}: {section}: {message}"


@pytest.mark.parametrize(("value", "message"), [
    ("'yes'", "must be true or false, written without quotes (got 'yes')"),
    ("1", "must be true or false (got 1)"),
])
def test_a_switch_is_true_or_false_only(tmp_path, value, message):
    got, config = _error(tmp_path, SOURCE + SUBSCRIBER + f"network: {{allow_private: {value}}}\n")
    assert got == f"{config}: network.allow_private: {message}"


def test_an_smtp_switch_is_strict_too(tmp_path):
    got, config = _error(tmp_path, SOURCE + SUBSCRIBER + "channels:\n  mail: {type: smtp, host: mail.example.org, "
                                                         "sender: r@example.org, starttls: 'false'}\n")
    assert got == f"{config}: channels.mail.starttls: must be true or false, written without quotes (got 'false')"


def test_a_channel_type_is_named_in_the_file_s_words(tmp_path):
    got, config = _error(tmp_path, SOURCE + SUBSCRIBER + "channels:\n  a: {type: telegram}\n  b: {path: x}\n"
                                                         "  c: maildir\n")
    assert got.splitlines() == [
        f"{config}: channels.a: unknown type 'telegram'; one of: 'maildir', 'smtp', 'webhook', 'slack', 'caldav', "
        "'apprise'",
        f"{config}: channels.b: needs a type (one of: apprise, caldav, maildir, slack, smtp, webhook)",
        f"{config}: channels.c: expected a mapping of settings (got 'maildir')",
    ]


@pytest.mark.parametrize(("env", "state"), [(None, "not set"), ("", "empty")])
def test_an_unset_or_empty_variable_in_a_path_is_refused(tmp_path, monkeypatch, env, state):
    if env is None:
        monkeypatch.delenv("DP_TEST_MAIL_DIR", raising=False)
    else:
        monkeypatch.setenv("DP_TEST_MAIL_DIR", env)
    got, config = _error(tmp_path, SOURCE.replace("a.ics", "\"${DP_TEST_MAIL_DIR}/a.ics\"") + SUBSCRIBER
                         + 'channels:\n  mail: {type: maildir, path: "${DP_TEST_MAIL_DIR}/maildir"}\n'
                         + "subscribers_csv: $DP_TEST_MAIL_DIR/subs.csv\n")
    assert got.splitlines() == [
        f"{config}: {key}: environment variable DP_TEST_MAIL_DIR is {state} (in {written!r}); set it, or write "
        "the value itself"
        for key, written in (("sources[0].location", "${DP_TEST_MAIL_DIR}/a.ics"),
                             ("channels.mail.path", "${DP_TEST_MAIL_DIR}/maildir"),
                             ("subscribers_csv", "$DP_TEST_MAIL_DIR/subs.csv"))
    ]


def test_a_set_variable_and_deadline_home_are_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("DP_TEST_MAIL_DIR", str(tmp_path / "mail"))
    monkeypatch.setenv("DEADLINE_HOME", str(tmp_path / "home"))
    config = tmp_path / "deadlines.yaml"
    config.write_text(SOURCE.replace("a.ics", "\"${DEADLINE_HOME}/a.ics\"") + SUBSCRIBER
                      + 'channels:\n  mail: {type: maildir, path: "${DP_TEST_MAIL_DIR}/maildir"}\n')
    cfg, _ = load_config(config)
    assert cfg.channels["mail"].path == str(tmp_path / "mail" / "maildir")
    assert cfg.sources[0].location == str(tmp_path / "home" / "a.ics")
