"""Reminder offsets as written, and the one function that turns a due instant and an offset into a send instant.

An offset is an ISO 8601 duration (``-P7D``, ``-PT36H``, ``-P1DT12H``). RFC 5545 §3.3.6 and ISO 8601
give its two parts different meanings:

* **days and weeks are nominal**: calendar days. ``-P7D`` before a deadline at 09:00 is 09:00 seven
  calendar days earlier, whatever daylight-saving change lies in between — 167 or 169 elapsed
  hours across a transition, not 168;
* **hours, minutes and seconds are exact**: elapsed time. ``-PT168H`` is always 168 hours.

The calendar is the **deadline's own zone**: the zone its wall time is read in (the rule's ``tz``,
else its source's declared zone, else the subscriber's — the zone the planner expands the rule in).
A New York deadline is reminded at the same New York wall time, wherever the subscriber lives; a
fixed zone such as AoE (UTC-12) has no transitions, so there nominal and exact agree.

The store identifies a reminder by ``offset_seconds``, the offset's *nominal length* (``-P7D`` →
``-604800``, a day counted as 86,400 s). That number names which reminder it is and never changes
with the calendar; the send instant is computed from the offset as written by :func:`send_instant`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo

from deadline_pipeline.durations import DURATION_PATTERN
from deadline_pipeline.plan.recurrence import to_instant
from deadline_pipeline.wording import duration_words

DAY_SECONDS = 86400


@dataclass(frozen=True, order=True, slots=True)
class Offset:
    """A reminder offset: ``days`` calendar days (weeks × 7) and ``seconds`` exact seconds, both
    signed alike (negative: before the deadline). Build it with :meth:`parse` or :meth:`exact`."""

    days: int
    seconds: int
    # The text as the configuration wrote it ("-P2W"), for showing; not part of the value.
    written: str = field(default="", compare=False, repr=False)

    @classmethod
    def parse(cls, text: str) -> Offset:
        """An ISO 8601 duration of weeks/days/hours/minutes/seconds → its nominal and exact parts:
        ``-P1W`` → ``Offset(-7, 0)``, ``-P1DT12H`` → ``Offset(-1, -43200)``, ``-PT36H`` →
        ``Offset(0, -129600)``. Years and months are refused (their length depends on the date).
        Raises ``ValueError`` naming the text."""
        m = DURATION_PATTERN.match(text.strip()) if isinstance(text, str) else None
        if not m:
            raise ValueError(f"{text!r} is not an ISO 8601 duration such as '-P7D', 'PT0S' or 'P1DT12H' "
                             "(years and months are not allowed)")
        part = {k: int(v or 0) for k, v in m.groupdict().items() if k != "sign"}
        sign = -1 if m.group("sign") == "-" else 1
        days = part["weeks"] * 7 + part["days"]
        seconds = part["hours"] * 3600 + part["minutes"] * 60 + part["seconds"]
        return cls(sign * days, sign * seconds, text.strip())

    @classmethod
    def exact(cls, seconds: int) -> Offset:
        """An offset of exact seconds only (``PT…S``): how a bare number of seconds is read."""
        return cls(0, int(seconds))

    @property
    def nominal_seconds(self) -> int:
        """The offset's nominal length in seconds, a day counted as 86,400 s (``-P7D`` → ``-604800``):
        the ``offset_seconds`` that identifies the reminder in the store and in its dedup key."""
        return self.days * DAY_SECONDS + self.seconds

    def iso(self) -> str:
        """The offset as an ISO 8601 duration with its parts kept apart: as written when parsed
        (``-P2W``), else ``Offset(-7, 0)`` → ``-P7D``, ``Offset(0, -604800)`` → ``-PT168H``,
        ``Offset(-1, -43200)`` → ``-P1DT12H``, zero → ``PT0S``."""
        if self.written:
            return self.written
        sign = "-" if self.days < 0 or self.seconds < 0 else ""
        hours, rest = divmod(abs(self.seconds), 3600)
        minutes, secs = divmod(rest, 60)
        text = "P" + (f"{abs(self.days)}D" if self.days else "")
        clock = "".join(f"{v}{u}" for v, u in ((hours, "H"), (minutes, "M"), (secs, "S")) if v)
        if clock:
            text += "T" + clock
        return "PT0S" if text == "P" else sign + text

    def words(self) -> str:
        """Which reminder this is, in words: ``-P7D`` → ``"7 days before"``, ``-PT168H`` →
        ``"168 hours before"`` (exact hours stay hours, so the two read apart), ``-P1DT12H`` →
        ``"1 day 12 hours before"``, ``-PT1H30M`` → ``"1 hour 30 minutes before"``, zero →
        ``"at the deadline"``."""
        if not self.days and not self.seconds:
            return "at the deadline"
        parts = []
        if self.days:
            n = abs(self.days)
            parts.append(f"{n} day{'s' if n != 1 else ''}")
        if self.seconds:
            left = abs(self.seconds)
            if left % 3600 == 0:
                n = left // 3600
                parts.append(f"{n} hour{'s' if n != 1 else ''}")
            else:
                parts.append(duration_words(left))
        return " ".join(parts) + (" before" if self.days < 0 or self.seconds < 0 else " after")

    def text(self) -> str:
        """ISO 8601 and words: ``"-P7D, 7 days before"``."""
        return f"{self.iso()}, {self.words()}"


def send_instant(due_at: datetime, offset: Offset, zone: tzinfo, wall: datetime | None = None) -> datetime:
    """The instant a reminder ``offset`` before/after ``due_at`` is sent, as aware UTC.

    ``due_at``: the deadline's instant (aware). ``zone``: the deadline's own zone (the one its wall
    time was read in). ``wall``: the deadline's nominal wall time (naive, in ``zone``) when it is one a
    spring-forward gap skips (02:30 on a 02:00→03:00 night, due at the instant of 03:30); None: the
    wall time ``due_at`` shows in ``zone``. RFC 5545 §3.3.6: "The duration of a week or a day depends
    on its position in the calendar … When computing an exact duration, the greatest order time
    components MUST be added first, that is, the number of days MUST be added first, followed by the
    number of hours, number of minutes, and number of seconds." So:

    1. the nominal days move the deadline's *wall time* in ``zone`` by that many calendar days,
       keeping the clock (09:00 stays 09:00 across a DST change; a deadline at 02:30 in a gap is
       reminded at 02:30 the day before, not at 03:30, the time its instant shows);
    2. that wall time is read back as an instant with the planner's DST policy
       (:func:`~deadline_pipeline.plan.recurrence.to_instant`, RFC 5545 §3.3.5): a time inside a
       spring-forward gap is shifted forward by the gap's length (02:30 → 03:30), a time repeated by
       a fall-back is its first occurrence;
    3. the exact part is added as elapsed seconds.

    Example: due 2026-03-09 09:00 America/New_York (13:00Z), ``-P7D`` → 2026-03-02 09:00 EST =
    14:00Z; ``-PT168H`` → 13:00Z. Due 2026-03-08 02:30 New York (07:30Z, a time the gap skips),
    ``-P1D`` → 2026-03-07 02:30 EST = 07:30Z. Raises ``OverflowError`` only for an instant outside years 1–9999
    (the configuration bounds offsets well inside that).
    """
    # In UTC: Python adds a timedelta to an aware datetime in *wall* time when the zone is attached,
    # which would make the exact part nominal too (-PT168H landing 169 h early across a DST change).
    instant = due_at.astimezone(UTC)
    if offset.days:
        # From the nominal wall time: the instant of a skipped 02:30 shows 03:30, and a day counted from
        # 03:30 sent the reminder an hour after 02:30 the day before (too late for a short offset).
        local = (wall if wall is not None else due_at.astimezone(zone).replace(tzinfo=None)) \
            + timedelta(days=offset.days)
        instant = to_instant(local, zone)
    return (instant + timedelta(seconds=offset.seconds)).astimezone(UTC)
