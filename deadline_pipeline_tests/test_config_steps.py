"""The named steps of loading a configuration, one by one: the constrained number types, the wording
of pydantic's errors, did-you-mean, the subscriber file's reading steps, the address rules and the
secret walk. Each is checked on its own, without a whole configuration file where none is needed."""

from __future__ import annotations

import math

import pytest
from pydantic import TypeAdapter, ValidationError

from deadline_pipeline.addresses import (
    address_problems,
    escalation_address_problems,
    routed_channels,
    subscriber_address_problems,
)
from deadline_pipeline.config import ConfigError, DeadlinesConfig, DeliveryConfig, load_config
from deadline_pipeline.config.agreement import lease_problems
from deadline_pipeline.config.messages import (
    bounds_at,
    describe_range,
    did_you_mean,
    format_loc,
    shown_input,
    wording,
)
from deadline_pipeline.config.quantities import (
    BatchSize,
    GraceMinutes,
    TimeoutSeconds,
    within_max_duration,
)
from deadline_pipeline.config.subscribers_csv import clean_row, read_subscribers_csv, repeated_ids
from deadline_pipeline.security.redact import secret_variables


def _errors(adapter_type, value) -> list[dict]:
    with pytest.raises(ValidationError) as info:
        TypeAdapter(adapter_type).validate_python(value)
    return info.value.errors()


# --- constrained number types ---------------------------------------------------------------------

@pytest.mark.parametrize("value", [True, False, 1.5, "3", 2.0])
def test_a_count_takes_a_whole_number_only(value):
    """YAML's `true` once became a batch of one alert; a count is strict, so neither a boolean, a
    fraction, a text nor a float that happens to be whole is read as one."""
    errors = _errors(BatchSize, value)
    assert len(errors) == 1
    if isinstance(value, bool):
        assert "expected a number, got the boolean" in errors[0]["msg"]


def test_a_count_keeps_its_bounds():
    adapter = TypeAdapter(BatchSize)
    assert adapter.validate_python(1) == 1 and adapter.validate_python(10_000) == 10_000
    for outside in (0, 10_001):
        with pytest.raises(ValidationError):
            adapter.validate_python(outside)
    assert TypeAdapter(GraceMinutes).validate_python(0) == 0  # zero grace is a choice, not nonsense


def test_an_open_lower_bound_excludes_itself_and_text_numbers_are_read():
    adapter = TypeAdapter(TimeoutSeconds)
    assert adapter.validate_python("1e-3") == 0.001  # PyYAML reads 1e-3 as text: still a number
    assert adapter.validate_python(600) == 600.0
    for outside in (0, -5, 600.5):
        with pytest.raises(ValidationError):
            adapter.validate_python(outside)
    assert "boolean" in _errors(TimeoutSeconds, True)[0]["msg"]


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, "inf", "nan"])
def test_every_section_refuses_infinity_and_nan(value):
    """`backoff_cap_seconds: .inf` scheduled a retry for never; the sections' model_config refuses it."""
    with pytest.raises(ValidationError) as info:
        DeliveryConfig(backoff_cap_seconds=value)
    assert [e["type"] for e in info.value.errors()] == ["finite_number"]


def test_an_overlong_duration_is_refused_and_an_unparseable_one_left_to_its_field():
    assert within_max_duration("-P3660D") == "-P3660D"
    with pytest.raises(ValueError, match="'-P3661D' is longer than 3660 days"):
        within_max_duration("-P3661D")
    with pytest.raises(ValueError, match="longer than 3660 days"):
        within_max_duration("P99999D")  # either sign
    # The field's own validator words a grammar error, at the list's key path, not the item's.
    assert within_max_duration("soon") == "soon"


# --- wording of pydantic's errors -----------------------------------------------------------------

def test_the_range_is_described_from_both_bounds():
    assert describe_range({"gt": 0.0, "le": 600.0}) == "must be between 0 (exclusive) and 600"
    assert describe_range({"ge": 1, "le": 32}) == "must be between 1 and 32"
    assert describe_range({"ge": 1}) == "must be at least 1"
    assert describe_range({"le": 5}) is None


def test_bounds_are_read_from_the_field_at_a_key_path_through_a_channel_tag_and_an_optional():
    assert bounds_at(("channels", "mail", "smtp", "timeout_seconds")) == {"gt": 0.0, "le": 600.0}
    assert bounds_at(("channels", "s", "slack", "rate_per_second")) == {"ge": 0.001, "le": 100_000.0}
    assert bounds_at(("delivery", "retry_after_cap_seconds")) == {"gt": 0.0, "le": 30 * 86400.0}
    assert bounds_at(("delivery", "no_such_key")) == {}


def test_pydantic_errors_are_worded_as_the_loader_shows_them():
    with pytest.raises(ValidationError) as info:
        DeadlinesConfig.model_validate({"delivery": {"lease_seconds": 0, "backoff_cap_seconds": math.inf,
                                                     "batch_size": 2.5, "time_budget_seconds": -5}})
    by_key = {format_loc(e["loc"]): (wording(e), shown_input(e)) for e in info.value.errors()}
    assert by_key == {
        "delivery.lease_seconds": ("must be between 1 and 86400", 0),
        "delivery.backoff_cap_seconds": ("must be a finite number", math.inf),
        "delivery.batch_size": ("must be a whole number, not a fraction", 2.5),
        # A float setting shows the value as the float it was read as.
        "delivery.time_budget_seconds": ("must be between 0 (exclusive) and 86400", -5.0),
    }


@pytest.mark.parametrize(("value", "message"), [
    (math.inf, "must be a finite whole number"),
    (3.0, "must be a whole number"),
    ("3", "must be a whole number in plain digits, without quotes"),
    ("1e3", "must be a whole number in plain digits, without quotes"),
])
def test_a_count_setting_says_why_a_value_is_not_a_whole_number(value, message):
    with pytest.raises(ValidationError) as info:
        DeadlinesConfig.model_validate({"delivery": {"batch_size": value}})
    assert [wording(e) for e in info.value.errors()] == [message]


def test_the_channel_type_is_not_part_of_a_key_path():
    assert format_loc(("channels", "hook", "webhook", "timeout_seconds")) == "channels.hook.timeout_seconds"
    assert format_loc(("subscriptions", 0, "offsets", 1)) == "subscriptions[0].offsets[1]"
    assert format_loc(()) == "(top level)"


# --- did you mean ---------------------------------------------------------------------------------

def test_did_you_mean_looks_among_the_keys_of_the_mapping_at_that_path():
    assert did_you_mean("ofsets", ("subscriptions", 0, "ofsets")) == "; did you mean `offsets`?"
    # Narrowed by the channel's type: smtputf8 is a key of smtp channels only.
    assert did_you_mean("smtputf", ("channels", "mail", "smtp", "smtputf")) == "; did you mean `smtputf8`?"
    assert did_you_mean("smtputf", ("channels", "hook", "webhook", "smtputf")) == ""
    assert did_you_mean("zzzz", ("delivery", "zzzz")) == ""


def test_an_unknown_key_is_reported_with_its_suggestion(tmp_path):
    path = tmp_path / "deadlines.yaml"
    path.write_text("sources: [{name: cal, format: ics, location: cal.ics}]\ndelivery: {batch_sise: 3}\n")
    with pytest.raises(ConfigError, match=r"delivery\.batch_sise: unknown key; did you mean `batch_size`\? "
                                          r"\(got 3\)"):
        load_config(path)


# --- subscriber file steps ------------------------------------------------------------------------

def test_clean_row_strips_values_and_drops_empty_ones(caplog):
    assert clean_row({"id": " carl ", "email": "", "tenant": "t"}, 4, "subs.csv") == {"id": "carl", "tenant": "t"}
    assert "line 4: column id: spaces around ' carl ' removed" in caplog.text


def test_repeated_ids_name_both_lines_and_skip_rows_without_an_id():
    rows = [(2, {"id": "a"}), (3, {}), (5, {"id": "b"}), (7, {"id": "a"}), (8, {})]
    assert repeated_ids(rows, "s.csv") == ["s.csv: line 7: id 'a' repeats line 2"]
    assert repeated_ids(rows[:3], "s.csv") == []


def test_each_record_is_numbered_by_the_line_it_starts_on(tmp_path):
    """A blank line and a quoted value spanning two lines: counting pandas records put every later
    message on the wrong line."""
    path = tmp_path / "subs.csv"
    path.write_text('id,timezone,tenant\n\nann,UTC,"a\nb"\nbob ,UTC,\n')
    assert read_subscribers_csv(path, tmp_path / "deadlines.yaml") == [
        (3, {"id": "ann", "timezone": "UTC", "tenant": "a\nb"}),
        (5, {"id": "bob", "timezone": "UTC"}),
    ]


def test_a_subscriber_file_without_the_needed_columns_is_refused(tmp_path):
    path = tmp_path / "subs.csv"
    path.write_text("id,email\nann,a@example.org\n")
    with pytest.raises(ConfigError, match=r"subs\.csv: line 1: missing column\(s\) \['timezone'\]"):
        read_subscribers_csv(path, tmp_path / "deadlines.yaml")


# --- address rules --------------------------------------------------------------------------------

def _cfg(email: str, channel: dict, subscribers=("*",), esc_email: str | None = None) -> DeadlinesConfig:
    return DeadlinesConfig.model_validate({
        "sources": [{"name": "cal", "format": "ics", "location": "/x/cal.ics", "tenant": "t"}],
        "subscribers": [{"id": "jo", "tenant": "t", "email": email}],
        "subscriptions": [{"name": "all", "sources": ["cal"], "subscribers": list(subscribers),
                           "channels": ["out"]}],
        "channels": {"out": channel},
        "escalation": {"channels": ["out"] if esc_email else [], "email": esc_email},
    })


def test_a_non_ascii_local_part_needs_an_smtputf8_channel():
    smtp = {"type": "smtp"}
    cfg = _cfg("jörg@example.org", smtp)
    assert routed_channels(cfg, cfg.subscribers[0]) == [("all", "out")]  # by "*" and the source's tenant
    (problem,) = subscriber_address_problems(cfg, cfg.subscribers[0], "subs.csv: line 3")
    assert problem.startswith("subs.csv: line 3: email 'jörg@example.org' has a non-ASCII local part")
    assert subscriber_address_problems(_cfg("jörg@example.org", {**smtp, "smtputf8": True}),
                                       cfg.subscribers[0], "x") == []
    assert subscriber_address_problems(_cfg("jörg@example.org", {"type": "maildir", "path": "/m"}),
                                       cfg.subscribers[0], "x") == []
    # An IDNA domain alone needs nothing of the channel.
    assert address_problems(_cfg("ana@bücher.example", smtp), {}) == []


def test_an_address_problem_names_where_the_subscriber_was_written():
    cfg = _cfg("ana@-bücher.example", {"type": "smtp"})
    problems = address_problems(cfg, {"jo": "deadlines.yaml: subscribers[0]"})
    assert len(problems) == 1 and problems[0].startswith("deadlines.yaml: subscribers[0]: email: ")
    assert address_problems(cfg, {})[0].startswith("subscribers (jo): email: ")


def test_the_escalation_address_is_checked_against_the_escalation_channels():
    cfg = _cfg("ann@example.org", {"type": "smtp"}, esc_email="jörg@example.org")
    assert escalation_address_problems(cfg) == [
        "escalation.email: 'jörg@example.org' has a non-ASCII local part, which channel 'out' (smtp without "
        "smtputf8: true) cannot carry"]
    assert escalation_address_problems(_cfg("ann@example.org", {"type": "smtp"})) == []


# --- secrets and agreement ------------------------------------------------------------------------

def test_secret_variables_are_every_env_key_but_the_user_name():
    cfg = DeadlinesConfig.model_validate({
        "sources": [{"name": "cal", "format": "ics", "location": "https://h/c.ics", "username_env": "USER_V",
                     "password_env": "PASS_V", "headers_env": {"X-Api-Key": "KEY_V"}}],
        "channels": {"hook": {"type": "webhook", "secret_env": "SIGN_V"},
                     "s": {"type": "slack", "url_env": "SLACK_V"}},
    })
    assert secret_variables(cfg) == ["PASS_V", "KEY_V", "SIGN_V", "SLACK_V"]


def test_a_lease_problem_names_the_channel_timeout_and_margin():
    cfg = DeadlinesConfig.model_construct(
        delivery=DeliveryConfig.model_construct(lease_seconds=30),
        channels={"mail": DeadlinesConfig.model_validate(
            {"channels": {"mail": {"type": "smtp"}}}).channels["mail"]})
    (problem,) = lease_problems(cfg)
    assert problem["loc"] == ("delivery", "lease_seconds")
    assert ("must exceed channels.mail.timeout_seconds (30) + channels.mail.lease_margin_seconds (5) = 35"
            in problem["type"].message_template.format(**problem["type"].context))
