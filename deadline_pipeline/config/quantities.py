"""The numbers of a configuration as pydantic types: each setting's unit and allowed range.

A value can parse and still break delivery: ``timeout_seconds: -5`` or ``.nan`` (every send fails or
never times out), ``backoff_cap_seconds: .inf`` (a retry scheduled for never), ``rate_per_second:
1e-300`` (one send per 10^300 seconds), ``offsets: [-P99999999999D]`` (an instant before year 1).
Each type here refuses such a value while the file is validated, so the error names the key path,
``deadlines.yaml: channels.mail.timeout_seconds: must be between 0 (exclusive) and 600 (got -5)``,
instead of a stall or a traceback much later (:mod:`deadline_pipeline.config.messages` words
pydantic's bound errors that way). Infinity and NaN are refused by every section
(``allow_inf_nan=False`` in :class:`~deadline_pipeline.config.sections.Section`).

Bounds are generous: they exclude nonsense, not unusual choices. The same name means the same
quantity wherever it appears (a channel's ``timeout_seconds`` is one type for every channel).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

from deadline_pipeline.durations import parse_duration


def not_a_boolean(value):
    """``value`` unchanged unless it is a ``bool``; then raises ``ValueError`` ("expected a number,
    got the boolean true"). Runs before pydantic's own number parsing."""
    # YAML's `true` is a number to pydantic (1): `batch_size: true` was read as batches of one alert
    # and `timeout_seconds: true` as a one-second timeout, without a word. (Floats are not strict:
    # PyYAML reads `1e-3` as a string, which must still be taken as a number.)
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got the boolean {str(value).lower()}")
    return value


NOT_A_BOOLEAN = BeforeValidator(not_a_boolean)

#: A switch: YAML's ``true`` or ``false`` only. Pydantic's lax booleans took the strings "yes", "on",
#: "1" and the number 1, so a quoted ``allow_private: 'yes'`` opened the outbound guard to private
#: addresses as surely as ``true``, and ``starttls: 'false'`` read as a string nobody checked.
Switch = Annotated[bool, Field(strict=True)]

DAY = 86_400
WEEK_MINUTES = 7 * 1440


def _seconds(lo: float, hi: float, *, lo_open: bool = False):
    """A float number of seconds (or a rate) in ``lo`` .. ``hi``; ``lo_open`` excludes ``lo``."""
    # Float bounds: an error shows the rejected value as the float it was read as (-5.0, not -5).
    low = Field(gt=float(lo)) if lo_open else Field(ge=float(lo))
    return Annotated[float, NOT_A_BOOLEAN, low, Field(le=float(hi))]


def _count(lo: int, hi: int):
    """A whole number in ``lo`` .. ``hi``. Strict: ``true``, ``1.5`` and the string ``"3"`` are refused,
    never read as a count (the boolean with its own message, :func:`not_a_boolean`)."""
    return Annotated[int, NOT_A_BOOLEAN, Field(ge=lo, le=hi, strict=True)]


# --- channels -------------------------------------------------------------------------------------
#: Seconds a send may take; longer than 10 minutes is a hung send.
TimeoutSeconds = _seconds(0, 600, lo_open=True)
#: Seconds of lease kept free after a send's timeout.
LeaseMarginSeconds = _seconds(0, 3600)
#: Sends started per second: at least one per ~17 minutes.
RatePerSecond = _seconds(0.001, 100_000)
#: Sends in flight at once, per sweep process.
MaxConcurrency = _count(1, 1024)
Port = _count(1, 65535)

# --- delivery -------------------------------------------------------------------------------------
BatchSize = _count(1, 10_000)
LeaseSeconds = _count(1, DAY)
MaxAttempts = _count(1, 100)
BackoffBaseSeconds = _seconds(0, DAY, lo_open=True)
BackoffCapSeconds = _seconds(0, 7 * DAY, lo_open=True)
RetryAfterCapSeconds = _seconds(0, 30 * DAY, lo_open=True)
TimeBudgetSeconds = _seconds(0, DAY, lo_open=True)
#: Processes one sweep runs in.
Processes = _count(1, 32)

# --- escalation and watch (minutes) ---------------------------------------------------------------
ReminderMinutes = _count(1, WEEK_MINUTES)
GraceMinutes = _count(0, WEEK_MINUTES)
SweepIntervalMinutes = _count(1, 1440)
PlanIntervalMinutes = _count(1, WEEK_MINUTES)
HeartbeatGraceMinutes = _count(0, WEEK_MINUTES)

# --- planning -------------------------------------------------------------------------------------
HorizonDays = _count(1, 3660)
#: A share (0.30 = 30 %) of what a run may withdraw at once: more is far more often a broken input
#: than an intent. The default is the sources' quarantine share and the subscribers' hold share
#: (``plan.max_subscriber_withdraw_share``), one number for both.
WithdrawShare = Annotated[float, NOT_A_BOOLEAN, Field(ge=0.0, le=1.0)]
MAX_WITHDRAW_SHARE = 0.30

# ISO 8601 durations: an offset or freshness window longer than the longest planning horizon is a
# typo (and ``due + offset`` could leave the representable years: OverflowError in planning).
MAX_DURATION = timedelta(days=3660)


def within_max_duration(text: str) -> str:
    """``text`` (an ISO 8601 duration, either sign) unchanged when at most :data:`MAX_DURATION` long;
    raises ``ValueError`` (``'-P99999D' is longer than 3660 days``) otherwise. Text that does not
    parse is passed on unchanged: the field's own validator refuses it with the grammar's message,
    at the field's key path."""
    try:
        length = abs(parse_duration(text))
    except ValueError:
        return text
    if length > MAX_DURATION:
        raise ValueError(f"{text!r} is longer than {MAX_DURATION.days} days")
    return text


#: An ISO 8601 duration (a reminder offset, a freshness window) of at most :data:`MAX_DURATION`.
BoundedDuration = Annotated[str, AfterValidator(within_max_duration)]
