"""Every number of the configuration is range-checked at load, with file and key path; the lease
must agree with the time budget and with every channel's timeout plus its margin."""

from __future__ import annotations

import typing

import pytest
import yaml
from pydantic import BaseModel

from deadline_pipeline import config as config_module
from deadline_pipeline.config import ConfigError, load_config
from deadline_pipeline.config.messages import constraints_of

BASE = {
    "sources": [{"name": "cal", "format": "ics", "location": "cal.ics"}],
    "subscribers": [{"id": "s1", "email": "s1@example.org"}],
    "subscriptions": [{"name": "all", "sources": ["cal"], "channels": ["mail"]}],
    "channels": {"mail": {"type": "smtp"}, "box": {"type": "maildir", "path": "box"}},
}


def _load(tmp_path, patch: dict | None = None, text: str | None = None):
    path = tmp_path / "deadlines.yaml"
    if text is None:
        cfg = yaml.safe_load(yaml.safe_dump(BASE))
        for dotted, value in (patch or {}).items():
            *parents, last = dotted.split(".")
            node = cfg
            for p in parents:
                node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
            node[last] = value
        text = yaml.safe_dump(cfg)
    path.write_text(text)
    return load_config(path)


@pytest.mark.parametrize(("yaml_value", "key"), [
    ("channels: {mail: {type: smtp, timeout_seconds: -5}}", "channels.mail.timeout_seconds"),
    ("channels: {mail: {type: smtp, timeout_seconds: .nan}}", "channels.mail.timeout_seconds"),
    ("delivery: {backoff_cap_seconds: .inf}", "delivery.backoff_cap_seconds"),
    ("delivery: {backoff_base_seconds: .inf}", "delivery.backoff_base_seconds"),
    ("channels: {mail: {type: smtp, rate_per_second: 1e-300}}", "channels.mail.rate_per_second"),
    ("subscriptions: [{name: all, sources: [cal], channels: [mail], offsets: [-P99999999999D]}]",
     "subscriptions[0].offsets"),
    ("subscriptions: [{name: all, sources: [cal], channels: [mail], offsets: [-P99999D]}]",
     "subscriptions[0].offsets[0]"),
    ("channels: {mail: {type: smtp, port: 70000}}", "channels.mail.port"),
    ("watch: {grace_minutes: 99999999}", "watch.grace_minutes"),
    # YAML booleans are numbers to pydantic: true was read as 1 (batches of one alert) without a word.
    ("delivery: {batch_size: true}", "delivery.batch_size"),
    ("delivery: {time_budget_seconds: false}", "delivery.time_budget_seconds"),
    ("delivery: {retry_after_cap_seconds: true}", "delivery.retry_after_cap_seconds"),
    ("channels: {mail: {type: smtp, timeout_seconds: true}}", "channels.mail.timeout_seconds"),
    # The channel's type is not part of the key path (it was channels.mail.smtp.timeout_seconds).
    ("channels: {mail: {type: smtp, timeout_seconds: fast}}", "channels.mail.timeout_seconds"),
])
def test_values_that_parse_but_break_delivery_are_refused_with_their_key_path(tmp_path, yaml_value, key):
    base = {k: v for k, v in BASE.items()}
    base.update(yaml.safe_load(yaml_value))
    if "channels" in yaml.safe_load(yaml_value):
        base["channels"] = {**BASE["channels"], **base["channels"]}
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text=yaml.safe_dump(base))
    msg = str(info.value)
    assert str(tmp_path / "deadlines.yaml") in msg and f": {key}: " in msg, msg
    assert "Traceback" not in msg


def test_time_budget_must_be_shorter_than_the_lease(tmp_path):
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, {"delivery.time_budget_seconds": 300, "delivery.lease_seconds": 300})
    msg = str(info.value)
    assert "delivery.time_budget_seconds: must be less than delivery.lease_seconds (300)" in msg


def test_a_lease_too_short_for_a_channel_timeout_is_refused_naming_both_keys(tmp_path):
    """``lease_seconds: 30`` with an SMTP channel (timeout 30 s) used to be accepted and then no send
    ever started, maildir included: every batch claimed and given back, sweep after sweep."""
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, {"delivery.lease_seconds": 30, "delivery.time_budget_seconds": 20})
    msg = str(info.value)
    assert ("delivery.lease_seconds: must exceed channels.mail.timeout_seconds (30) + "
            "channels.mail.lease_margin_seconds (5) = 35") in msg
    # The margin is per channel: a smaller one on the SMTP channel makes the same lease valid.
    cfg, _ = _load(tmp_path, {"delivery.lease_seconds": 30, "delivery.time_budget_seconds": 20,
                              "channels.mail.timeout_seconds": 20, "channels.mail.lease_margin_seconds": 2})
    assert cfg.delivery.lease_seconds == 30


def test_an_offset_longer_than_the_planning_horizon_is_refused(tmp_path):
    """With ``plan.horizon_days: 30``, ``-P90D`` loaded without a word: every deadline was first planned
    60 days after that reminder's time, so it went out late each time, and never under
    ``late_policy: skip``."""
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, {"plan.horizon_days": 30, "subscriptions.0.offsets": ["-P90D", "-P7D"]})
    msg = str(info.value)
    assert "subscriptions[0].offsets[0]: is longer than plan.horizon_days (30 days) less one day (29 days)" in msg
    assert "offsets[1]" not in msg
    cfg, _ = _load(tmp_path, {"plan.horizon_days": 91, "subscriptions.0.offsets": ["-P90D", "-P7D"]})
    assert cfg.plan.horizon_days == 91


@pytest.mark.parametrize(("offset", "refused"), [("-P7D", True), ("-P1W", True), ("-PT145H", True),
                                                 ("-PT144H", False), ("-P6D", False)])
def test_an_offset_as_long_as_the_planning_horizon_is_refused(tmp_path, offset, refused):
    """``horizon_days: 7`` with ``-P7D``: a deadline enters the plan at the first hourly run after it
    comes 7 days near, when that reminder's time has just passed, so every one was late at planning
    and, under ``late_policy: skip``, skipped, while every check stayed green. An offset must be a day
    shorter than the horizon (``-P6D``, ``-PT144H``)."""
    changes = {"plan.horizon_days": 7, "subscriptions.0.offsets": [offset]}
    if not refused:
        assert _load(tmp_path, changes)[0].subscriptions[0].offsets == [offset]
        return
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, changes)
    assert "offsets[0]: is longer than plan.horizon_days (7 days) less one day (6 days)" in str(info.value)
    assert "shorten the offset to at most 6 days" in str(info.value)


def test_the_defaults_pass(tmp_path):
    cfg, _ = _load(tmp_path)
    assert cfg.delivery.retry_after_cap == cfg.delivery.backoff_cap_seconds


def _numeric_fields(model: type[BaseModel], seen: set) -> dict[str, dict]:
    """Numeric field name → its declared bounds, over ``model`` and the models it holds."""
    names = {}
    if model in seen:
        return names
    seen.add(model)
    for name, field in model.model_fields.items():
        for t in [field.annotation, *typing.get_args(field.annotation)]:
            for inner in [t, *typing.get_args(t)]:
                if inner in (int, float):
                    names[name] = constraints_of(field.annotation, field)
                elif isinstance(inner, type) and issubclass(inner, BaseModel):
                    names |= _numeric_fields(inner, seen)
    return names


def test_every_numeric_setting_has_a_range():
    models = [m for m in vars(config_module).values()
              if isinstance(m, type) and issubclass(m, BaseModel)
              and m.__module__.startswith(config_module.__name__)]
    numeric = {name: bounds for m in models for name, bounds in _numeric_fields(m, set()).items()}
    assert {"timeout_seconds", "lease_seconds", "rate_per_second", "backoff_cap_seconds"} <= set(numeric)
    unbounded = {name for name, b in numeric.items() if "le" not in b or not {"ge", "gt"} & set(b)}
    assert unbounded == set(), "a numeric setting without a range"
