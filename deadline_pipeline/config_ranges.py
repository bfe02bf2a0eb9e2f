"""Range checks for every number in the configuration, and the delivery settings that must agree.

A value can parse and still break delivery: ``timeout_seconds: -5`` or ``.nan`` (every send fails or
never times out), ``backoff_cap_seconds: .inf`` (a retry scheduled for never), ``rate_per_second:
1e-300`` (one send per 10^300 seconds), ``offsets: [-P99999999999D]`` (an instant before year 1).
:func:`check` refuses each at load time, naming the key path, so that the error reads
``deadlines.yaml: channels.mail.timeout_seconds: must be between 0 (exclusive) and 600 (got -5.0)``
instead of a stall or a traceback much later.

Two settings must also agree with each other, or the sweep stalls silently:

* ``delivery.time_budget_seconds`` < ``delivery.lease_seconds``: a sweep that outlives its own lease
  may find its own batch claimable again while it still holds unfinished attempts of it;
* ``delivery.lease_seconds`` > ``timeout_seconds + lease_margin_seconds`` of every channel: a send
  starts only while its whole timeout plus the channel's margin fits in the lease (a second sweep
  must never claim an alert whose send may still be in flight). With ``lease_seconds: 30`` and an
  SMTP channel (timeout 30 s) no send could ever start: every batch would be claimed and given back,
  sweep after sweep.

:func:`check` is called by :class:`~deadline_pipeline.config.DeadlinesConfig` after its own field
validation and raises a pydantic ``ValidationError`` whose locations are the key paths, so
``load_config`` reports them like any other invalid value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from deadline_pipeline.durations import parse_duration


@dataclass(frozen=True)
class Range:
    """Allowed values of one numeric setting: ``lo`` .. ``hi``; ``lo_open`` excludes ``lo``."""

    lo: float
    hi: float
    lo_open: bool = False

    def admits(self, value: float) -> bool:
        return (value > self.lo if self.lo_open else value >= self.lo) and value <= self.hi

    def describe(self) -> str:
        low = f"{self.lo:g} (exclusive)" if self.lo_open else f"{self.lo:g}"
        return f"must be between {low} and {self.hi:g}"


DAY = 86400.0

# Every numeric field of the configuration models, by field name (the same name means the same
# quantity wherever it appears). A numeric field missing here is refused by a test, so a new setting
# cannot arrive unchecked. Bounds are generous: they exclude nonsense, not unusual choices.
RANGES: dict[str, Range] = {
    # channels
    "timeout_seconds": Range(0, 600, lo_open=True),  # a send that may take longer than 10 min is hung
    "lease_margin_seconds": Range(0, 3600),
    "rate_per_second": Range(0.001, 100_000),  # at least one send per ~17 minutes
    "max_concurrency": Range(1, 1024),
    "port": Range(1, 65535),
    # delivery
    "batch_size": Range(1, 10_000),
    "lease_seconds": Range(1, DAY),
    "max_attempts": Range(1, 100),
    "backoff_base_seconds": Range(0, DAY, lo_open=True),
    "backoff_cap_seconds": Range(0, 7 * DAY, lo_open=True),
    "retry_after_cap_seconds": Range(0, 30 * DAY, lo_open=True),
    "time_budget_seconds": Range(0, DAY, lo_open=True),
    "processes": Range(1, 32),
    # escalation and watch (minutes)
    "reminder_minutes": Range(1, 7 * 1440),
    "grace_minutes": Range(0, 7 * 1440),
    "sweep_interval_minutes": Range(1, 1440),
    "plan_interval_minutes": Range(1, 7 * 1440),
    "heartbeat_grace_minutes": Range(0, 7 * 1440),
    # planning
    "horizon_days": Range(1, 3660),
}

# ISO 8601 durations: an offset or freshness window longer than the longest planning horizon is a
# typo (and ``due + offset`` could leave the representable years: OverflowError in planning).
MAX_DURATION = timedelta(days=3660)
DURATION_FIELDS = ("offsets", "freshness")


def _problem(loc: tuple, value, message: str) -> InitErrorDetails:
    # PydanticCustomError keeps the message as written; "{message}" avoids brace interpretation.
    return InitErrorDetails(type=PydanticCustomError("config_range", "{message}", {"message": message}),
                            loc=loc, input=value)


def _walk(obj, loc: tuple, out: list[InitErrorDetails]) -> None:
    if isinstance(obj, BaseModel):
        for name in type(obj).model_fields:
            value = getattr(obj, name)
            here = (*loc, name)
            if isinstance(value, bool) or value is None:
                continue
            if isinstance(value, int | float):
                if isinstance(value, float) and not math.isfinite(value):
                    out.append(_problem(here, value, f"must be a finite number, not {value}"))
                    continue
                rng = RANGES.get(name)
                if rng is not None and not rng.admits(value):
                    out.append(_problem(here, value, rng.describe()))
                continue
            if name in DURATION_FIELDS:
                items = value if isinstance(value, list) else [value]
                for i, text in enumerate(items):
                    where = (*here, i) if isinstance(value, list) else here
                    try:
                        if abs(parse_duration(text)) > MAX_DURATION:
                            out.append(_problem(where, text, f"{text!r} is longer than {MAX_DURATION.days} days"))
                    except ValueError as exc:  # already refused by the field's own validator
                        out.append(_problem(where, text, str(exc)))
                continue
            _walk(value, here, out)
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            _walk(item, (*loc, i), out)
    elif isinstance(obj, dict):
        for key, item in obj.items():
            _walk(item, (*loc, key), out)


def channel_send_window(ch_cfg) -> float:
    """Seconds of lease a send on this channel needs: its timeout (0 for channels without one,
    e.g. maildir) plus its ``lease_margin_seconds``."""
    return float(getattr(ch_cfg, "timeout_seconds", 0.0) or 0.0) + float(getattr(ch_cfg, "lease_margin_seconds", 0.0))


def _agreement(cfg, out: list[InitErrorDetails]) -> None:
    d = cfg.delivery
    if d.time_budget_seconds >= d.lease_seconds:
        out.append(_problem(("delivery", "time_budget_seconds"), d.time_budget_seconds,
                            f"must be less than delivery.lease_seconds ({d.lease_seconds}): a sweep that "
                            "outlives its own lease can meet its own unfinished batch again"))
    if d.backoff_base_seconds > d.backoff_cap_seconds:
        out.append(_problem(("delivery", "backoff_base_seconds"), d.backoff_base_seconds,
                            f"must not exceed delivery.backoff_cap_seconds ({d.backoff_cap_seconds})"))
    horizon = timedelta(days=cfg.plan.horizon_days)
    for i, sub in enumerate(cfg.subscriptions):
        for j, item in enumerate(sub.offsets):
            if -parse_duration(item) > horizon:
                # Planning sees a deadline only plan.horizon_days ahead: a reminder further ahead than
                # that is already past when its deadline is first planned, so it went out late for
                # every deadline, and under late_policy: skip never, with no word at load.
                out.append(_problem(("subscriptions", i, "offsets", j), item,
                                    f"is longer than plan.horizon_days ({cfg.plan.horizon_days} days): planning "
                                    "sees a deadline only that far ahead, so this reminder would be planned after "
                                    "its time for every deadline (sent late, or never with late_policy: skip); "
                                    "shorten the offset or raise plan.horizon_days"))
    for name, ch in cfg.channels.items():
        need = channel_send_window(ch)
        if d.lease_seconds <= need:
            timeout = getattr(ch, "timeout_seconds", None)
            parts = (f"channels.{name}.timeout_seconds ({timeout:g}) + " if timeout is not None else "") + \
                f"channels.{name}.lease_margin_seconds ({ch.lease_margin_seconds:g})"
            out.append(_problem(("delivery", "lease_seconds"), d.lease_seconds,
                                f"must exceed {parts} = {need:g}: no send on channel {name!r} could start "
                                "and finish within its lease, so its alerts would never be sent"))


def check(cfg) -> None:
    """Raise a pydantic ``ValidationError`` listing every out-of-range number, non-finite float,
    overlong duration and disagreeing delivery setting of ``cfg`` (a validated ``DeadlinesConfig``),
    each at its key path (``delivery.lease_seconds``, ``subscriptions.0.offsets.1``)."""
    problems: list[InitErrorDetails] = []
    _walk(cfg, (), problems)
    if not problems:
        _agreement(cfg, problems)
    if problems:
        raise ValidationError.from_exception_data("DeadlinesConfig", problems)
