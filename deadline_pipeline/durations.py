"""ISO 8601 durations as the configuration writes them (reminder offsets, freshness windows).

A leaf module of its own: the configuration's sections, its duration bounds
(:mod:`~deadline_pipeline.config.quantities`) and its cross-checks
(:mod:`~deadline_pipeline.config.agreement`) all parse with it, as does the planner, which takes no
import of ``config`` for it.
"""

from __future__ import annotations

import re
from datetime import timedelta

#: ISO 8601 duration of weeks/days/hours/minutes/seconds (groups sign, weeks, days, hours, minutes, seconds).
DURATION_PATTERN = re.compile(
    r"^(?P<sign>[+-])?P(?!$)(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+)S)?)?$"
)


def parse_duration(text: str, examples: str = "'-P7D', 'PT0S' or 'P1DT12H'") -> timedelta:
    """Parse an ISO 8601 duration of weeks/days/hours/minutes/seconds (``-P7D``, ``PT0S``, ``P1DT2H``).

    Years and months are refused: their length depends on the date, so "a month before" a deadline
    would be ambiguous. Raises ``ValueError`` naming the text, with ``examples`` of the setting's own
    kind (a reminder offset's by default; a freshness window is never negative).
    """
    m = DURATION_PATTERN.match(text.strip()) if isinstance(text, str) else None
    if not m:
        raise ValueError(
            f"{text!r} is not an ISO 8601 duration such as {examples} "
            "(years and months are not allowed)"
        )
    parts = {k: int(v) for k, v in m.groupdict().items() if k != "sign" and v}
    try:
        delta = timedelta(**parts)
    except OverflowError:  # "-P99999999999D": beyond any representable instant, not a traceback
        raise ValueError(f"{text!r} is too long a duration (more than 999,999,999 days)") from None
    return -delta if m.group("sign") == "-" else delta
