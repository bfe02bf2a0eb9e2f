"""Settings that must agree with each other, or the sweep stalls silently (or reminders go out late).

* ``delivery.time_budget_seconds`` < ``delivery.lease_seconds``: a sweep that outlives its own lease
  may find its own batch claimable again while it still holds unfinished attempts of it;
* ``delivery.backoff_base_seconds`` ≤ ``delivery.backoff_cap_seconds``;
* every reminder offset at least :data:`HORIZON_MARGIN` shorter than ``plan.horizon_days``:
  planning sees a deadline only that far ahead;
* ``delivery.lease_seconds`` > ``timeout_seconds + lease_margin_seconds`` of every channel: a send
  starts only while its whole timeout plus the channel's margin fits in the lease (a second sweep
  must never claim an alert whose send may still be in flight). With ``lease_seconds: 30`` and an
  SMTP channel (timeout 30 s) no send could ever start: every batch would be claimed and given back,
  sweep after sweep.

Each setting's own range is its type's (:mod:`deadline_pipeline.config.quantities`); these checks
run on a configuration whose every value is already valid.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from deadline_pipeline.durations import parse_duration


def channel_send_window(ch_cfg) -> float:
    """Seconds of lease a send on this channel needs: its timeout (0 for channels without one,
    e.g. maildir) plus its ``lease_margin_seconds``."""
    return float(getattr(ch_cfg, "timeout_seconds", 0.0) or 0.0) + float(getattr(ch_cfg, "lease_margin_seconds", 0.0))


def problem_at(loc: tuple, value, message: str) -> InitErrorDetails:
    """A validation problem of the value ``value`` at pydantic location ``loc`` (e.g.
    ``("subscriptions", 0, "channels", 1)``), worded ``message``: raised together in a
    ``ValidationError`` (:func:`raise_problems`), the loader reports it at that key path and the line
    the value is written on, as it does a field's own error."""
    # PydanticCustomError keeps the message as written; "{message}" avoids brace interpretation.
    return InitErrorDetails(type=PydanticCustomError("config_agreement", "{message}", {"message": message}),
                            loc=loc, input=value)


def delivery_problems(d) -> list[InitErrorDetails]:
    """The disagreements within the delivery section ``d`` (a ``DeliveryConfig``): the time budget
    against the lease, the backoff base against its cap."""
    out = []
    if d.time_budget_seconds >= d.lease_seconds:
        out.append(problem_at(("delivery", "time_budget_seconds"), d.time_budget_seconds,
                            f"must be less than delivery.lease_seconds ({d.lease_seconds}): a sweep that "
                            "outlives its own lease can meet its own unfinished batch again"))
    if d.backoff_base_seconds > d.backoff_cap_seconds:
        out.append(problem_at(("delivery", "backoff_base_seconds"), d.backoff_base_seconds,
                            f"must not exceed delivery.backoff_cap_seconds ({d.backoff_cap_seconds})"))
    return out


#: How much shorter than ``plan.horizon_days`` an offset must be. A deadline enters the plan at the
#: first planning run after it comes within the horizon: up to an hour later (the hourly schedule),
#: and a reminder counted in calendar days is up to an hour longer across a DST change. With
#: ``horizon_days: 7`` and ``-P7D`` every reminder was therefore already past when first planned:
#: sent late, and under ``late_policy: skip`` never, while every check stayed green. A day also
#: covers a planning run that starts late.
HORIZON_MARGIN = timedelta(days=1)


def offset_problems(cfg) -> list[InitErrorDetails]:
    """Every subscription offset of ``cfg`` longer than ``plan.horizon_days`` less
    :data:`HORIZON_MARGIN`, at its key path (``subscriptions.0.offsets.1``)."""
    longest = timedelta(days=cfg.plan.horizon_days) - HORIZON_MARGIN
    days = longest.days
    return [problem_at(("subscriptions", i, "offsets", j), item,
                     f"is longer than plan.horizon_days ({cfg.plan.horizon_days} days) less one day ({days} days): "
                     "planning sees a deadline only plan.horizon_days ahead and runs hourly, so this reminder "
                     "would be planned after its time for deadlines entering the horizon (sent late, or never "
                     f"with late_policy: skip); shorten the offset to at most {days} days or raise "
                     "plan.horizon_days")
            for i, sub in enumerate(cfg.subscriptions) for j, item in enumerate(sub.offsets)
            if -parse_duration(item) > longest]


def lease_problems(cfg) -> list[InitErrorDetails]:
    """One problem at ``delivery.lease_seconds`` per channel of ``cfg`` whose send window
    (:func:`channel_send_window`) does not fit in the lease, naming the channel's keys and values."""
    lease = cfg.delivery.lease_seconds
    out = []
    for name, ch in cfg.channels.items():
        need = channel_send_window(ch)
        if lease > need:
            continue
        timeout = getattr(ch, "timeout_seconds", None)
        parts = (f"channels.{name}.timeout_seconds ({timeout:g}) + " if timeout is not None else "") + \
            f"channels.{name}.lease_margin_seconds ({ch.lease_margin_seconds:g})"
        out.append(problem_at(("delivery", "lease_seconds"), lease,
                            f"must exceed {parts} = {need:g}: no send on channel {name!r} could start "
                            "and finish within its lease, so its alerts would never be sent"))
    return out


def disagreements(cfg) -> None:
    """Raise a pydantic ``ValidationError`` listing every disagreement of ``cfg`` (a
    ``DeadlinesConfig`` whose values have passed their own checks), each at its key path, so the
    loader reports them like any other invalid value; return when there is none."""
    raise_problems(delivery_problems(cfg.delivery) + offset_problems(cfg) + lease_problems(cfg))


def raise_problems(problems: list[InitErrorDetails]) -> None:
    """Raise a pydantic ``ValidationError`` of the configuration holding ``problems`` (each from
    :func:`problem_at`, at its own key path); return when the list is empty."""
    if problems:
        raise ValidationError.from_exception_data("DeadlinesConfig", problems)
