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
    ("'true'", "must be true or false, written without quotes (got 'true') [line 5]"),
    ("'yes'", "must be true or false; 'yes' is text in this file (YAML 1.2), not a boolean: write true "
              "(got 'yes') [line 5]"),
    # Unquoted: YAML 1.1's boolean, which opened the outbound guard to private addresses without a word.
    ("yes", "must be true or false; 'yes' is text in this file (YAML 1.2), not a boolean: write true "
            "(got 'yes') [line 5]"),
    ("Off", "must be true or false; 'Off' is text in this file (YAML 1.2), not a boolean: write false "
            "(got 'Off') [line 5]"),
    ("1", "must be true or false (got 1) [line 5]"),
])
def test_a_switch_is_true_or_false_only(tmp_path, value, message):
    got, config = _error(tmp_path, SOURCE + SUBSCRIBER + f"network: {{allow_private: {value}}}\n")
    assert got == f"{config}: network.allow_private: {message}"


# Every boolean setting of the file, as (key path, the YAML that sets it to VALUE).
SWITCHES = [
    ("network.allow_private", "network: {allow_private: VALUE}\n"),
    *[(f"channels.mail.{key}", "channels:\n  mail: {type: smtp, host: mail.example.org, sender: r@example.org, "
                               f"{key}: VALUE}}\n") for key in ("starttls", "ssl", "smtputf8")],
]


@pytest.mark.parametrize(("key", "text"), SWITCHES)
@pytest.mark.parametrize("value", ["yes", "no", "on", "off", "Y"])
def test_every_switch_refuses_yaml_1_1_booleans(tmp_path, key, text, value):
    """``yes``/``no``/``on``/``off`` loaded as YAML 1.1 booleans into every switch; the documented
    values are ``true`` and ``false`` only. Each is refused naming the file, key, line and value."""
    written = SOURCE + SUBSCRIBER + text
    line = written[:written.index("VALUE")].count("\n") + 1
    got, config = _error(tmp_path, written.replace("VALUE", value))
    assert got.startswith(f"{config}: {key}: must be true or false"), got
    assert got.endswith(f"(got {value!r}) [line {line}]"), got


@pytest.mark.parametrize(("key", "text"), SWITCHES)
@pytest.mark.parametrize(("value", "meant"), [("true", True), ("false", False), ("True", True), ("FALSE", False)])
def test_every_switch_takes_true_and_false(tmp_path, key, text, value, meant):
    config = tmp_path / "deadlines.yaml"
    config.write_text(SOURCE + SUBSCRIBER + text.replace("VALUE", value))
    cfg, _ = load_config(config)
    section, *rest = key.split(".")
    got = cfg.network.allow_private if section == "network" else getattr(cfg.channels["mail"], rest[-1])
    assert got is meant


def test_yaml_1_1_boolean_words_are_text(tmp_path):
    """A subscriber id or tenant ``no`` (Norway's country code) was the boolean false, refused as
    "expected text"; read as YAML 1.2 it is the text written."""
    config = tmp_path / "deadlines.yaml"
    config.write_text(SOURCE + "subscribers:\n  - {id: no, tenant: demo, email: a@example.org}\n")
    cfg, _ = load_config(config)
    assert cfg.subscribers[0].id == "no"


def test_an_smtp_switch_is_strict_too(tmp_path):
    got, config = _error(tmp_path, SOURCE + SUBSCRIBER + "channels:\n  mail: {type: smtp, host: mail.example.org, "
                                                         "sender: r@example.org, starttls: 'false'}\n")
    assert got == (f"{config}: channels.mail.starttls: must be true or false, written without quotes (got 'false') "
                   "[line 6]")


def test_a_channel_type_is_named_in_the_file_s_words(tmp_path):
    got, config = _error(tmp_path, SOURCE + SUBSCRIBER + "channels:\n  a: {type: telegram}\n  b: {path: x}\n"
                                                         "  c: maildir\n")
    assert got.splitlines() == [
        f"{config}: channels.a: unknown type 'telegram'; one of: 'maildir', 'smtp', 'webhook', 'slack', 'caldav', "
        "'apprise' [line 6]",
        f"{config}: channels.b: needs a type (one of: apprise, caldav, maildir, slack, smtp, webhook) [line 7]",
        f"{config}: channels.c: expected a mapping of settings (got 'maildir') [line 8]",
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


def test_a_value_error_names_the_line_the_value_is_written_on(tmp_path):
    """Only syntax errors had a line; a value several screens into a long file was found by its key
    path alone. A value a ``<<:`` merge brought in is named where the anchor wrote it."""
    got, config = _error(tmp_path, SOURCE + SUBSCRIBER + (
        "defaults: &d {type: maildir, path: [box]}\n"  # line 5
        "channels:\n"
        "  mail:\n"
        "    <<: *d\n"
        "delivery:\n"
        "  batch_size: 0\n"                           # line 10
        "subscriptions:\n"
        "  - name: s\n"
        "    sources: [conf]\n"
        "    channels: [mail]\n"))
    assert got.splitlines() == [
        f"{config}: channels.mail.path: expected text [line 5]",
        f"{config}: delivery.batch_size: must be between 1 and 10000 (got 0) [line 10]",
        f"{config}: defaults: unknown key [line 5]",
    ]


def test_line_of_steps_over_what_the_file_does_not_write():
    import yaml

    from deadline_pipeline.config.document import line_of

    root = yaml.compose("channels:\n  hook:\n    type: webhook\n    url: x\nsubscribers:\n  - {id: a}\n")
    # pydantic puts the channel's type into the location; the file has no such key.
    assert line_of(root, ("channels", "hook", "webhook", "url")) == 4
    # A key the file lacks: the line of the mapping that should hold it.
    assert line_of(root, ("channels", "hook", "timeout_seconds")) == 3
    # A subscriber appended from the CSV is not in the file: no line rather than a wrong one.
    assert line_of(root, ("subscribers", 3, "email")) is None
    assert line_of(None, ("channels",)) is None


def test_a_reference_to_nothing_names_the_line_it_is_written_on(tmp_path):
    """A subscription naming a source, subscriber or channel the file does not have, an escalation
    channel that does not exist, a holiday calendar naming no source and a source name written twice
    were raised by the whole configuration: the message said ``configuration: … [line 1]``, the top
    of the file, and only the first was named. Each is named at its key and line, all at once."""
    got, config = _error(tmp_path, (
        "sources:\n"
        "  - {name: conf, format: ics, location: a.ics, tenant: demo}\n"
        "  - name: cal\n"
        "    format: ics\n"
        "    location: b.ics\n"
        "    business_days: {calendar: 'source:hols'}\n"          # line 6
        "  - {name: conf, format: ics, location: c.ics}\n"          # line 7
        + SUBSCRIBER +                                               # lines 8-9
        "channels:\n"
        "  box: {type: maildir, path: box}\n"
        "subscriptions:\n"
        "  - name: papers\n"
        "    sources: [conf, cnf]\n"                                # line 14
        "    subscribers:\n"
        "      - a\n"
        "      - b\n"                                               # line 17
        "    channels: [box,\n"
        "               bx]\n"                                      # line 19
        "escalation:\n"
        "  email: ops@example.org\n"
        "  channels: [box, bocks]\n"))                              # line 22
    assert got.splitlines() == [
        f"{config}: sources[1].business_days.calendar: source 'cal': refers to unknown source 'hols'; known: "
        "['cal', 'conf'] (got 'source:hols') [line 6]",
        f"{config}: sources[2].name: source name 'conf' repeats sources[0].name; subscriptions name a source by it, "
        "so it must be unique (got 'conf') [line 7]",
        f"{config}: subscriptions[0].sources[1]: subscription 'papers': unknown source 'cnf'; known: ['cal', 'conf'] "
        "(got 'cnf') [line 14]",
        f"{config}: subscriptions[0].subscribers[1]: subscription 'papers': unknown subscriber 'b' (got 'b') "
        "[line 17]",
        f"{config}: subscriptions[0].channels[1]: subscription 'papers': unknown channel 'bx'; known: ['box'] "
        "(got 'bx') [line 19]",
        f"{config}: escalation.channels[1]: unknown channel 'bocks'; known: ['box'] (got 'bocks') [line 22]",
    ]
