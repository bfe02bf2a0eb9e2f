"""RFC 5545 recurrence rules: one parser with two postures, UNTIL normalisation, and ICS override folding.

Pure domain logic (no I/O, no database, no Dagster). Expansion itself lives in
:mod:`deadline_pipeline.plan.occurrences`; this module decides what a RECUR value *means*.

Two postures, one parser (RFC 5545 §3.3.10):

* :func:`validate_rrule` is **strict**: it raises :class:`RRuleError` naming the offending rule part.
  For user-facing input (``deadline-pipeline occurrences``, validation of a source before it goes
  live), where a clear refusal is the point.
* :func:`parse_rrule` is **lenient**: it returns a :class:`Lenient` whose ``recur`` is ``None``,
  logs the same message at ERROR with the rule id, and says so in its ``counts``
  (``"rrule_rejected"``) and ``rejected``. For the scheduler: one bad rule stops that rule alone,
  never the loop, and a check can read the count from the result (the expansion's
  ``Expansion.counts`` carries it on).

Both refuse what the expansion library would silently "fix": dateutil keeps the *last* of a
repeated part (``UNTIL=…;UNTIL=…`` → the later bound, ``BYMONTH=2;BYMONTH=3`` → March only) and only
warns on COUNT together with UNTIL, so two readers of one stored string could disagree about which
dates are due (shared case C03).
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta, tzinfo
from functools import lru_cache

from dateutil.rrule import DAILY, HOURLY, MINUTELY, MONTHLY, SECONDLY, WEEKLY, YEARLY, weekdays

from deadline_pipeline.rules import END_OF_DAY, RuleRecord, format_local, parse_local

log = logging.getLogger(__name__)


class RRuleError(ValueError):
    """A RECUR value that is not valid RFC 5545. The message names the offending rule part."""


FREQS = {"YEARLY": YEARLY, "MONTHLY": MONTHLY, "WEEKLY": WEEKLY, "DAILY": DAILY,
         "HOURLY": HOURLY, "MINUTELY": MINUTELY, "SECONDLY": SECONDLY}
#: Frequencies stepped in elapsed (UTC) time, not in wall-clock time (see occurrences' DST policy).
SUB_DAILY = frozenset({"HOURLY", "MINUTELY", "SECONDLY"})
PARTS = ("FREQ", "UNTIL", "COUNT", "INTERVAL", "BYSECOND", "BYMINUTE", "BYHOUR", "BYDAY", "BYMONTHDAY",
         "BYYEARDAY", "BYWEEKNO", "BYMONTH", "BYSETPOS", "WKST")
_WEEKDAY = {name: i for i, name in enumerate(("MO", "TU", "WE", "TH", "FR", "SA", "SU"))}
_BYDAY = re.compile(r"^([+-]?)(\d{1,2})?(MO|TU|WE|TH|FR|SA|SU)$")
_INT = re.compile(r"^[+-]?\d+$")
_UNTIL = re.compile(r"^(\d{8})(?:T(\d{6})(Z?))?$")
# (lowest, highest, may be negative) per numeric list part (RFC 5545 §3.3.10 grammar).
_RANGES = {"BYSECOND": (0, 60, False), "BYMINUTE": (0, 59, False), "BYHOUR": (0, 23, False),
           "BYMONTHDAY": (1, 31, True), "BYYEARDAY": (1, 366, True), "BYWEEKNO": (1, 53, True),
           "BYMONTH": (1, 12, False), "BYSETPOS": (1, 366, True)}
# Which frequencies a part may be used with (RFC 5545 §3.3.10, the table after the grammar).
_NOT_WITH = {"BYMONTHDAY": {"WEEKLY"}, "BYYEARDAY": {"DAILY", "WEEKLY", "MONTHLY"},
             "BYWEEKNO": set(FREQS) - {"YEARLY"}}
_DATEUTIL_NAME = {"BYSECOND": "bysecond", "BYMINUTE": "byminute", "BYHOUR": "byhour",
                  "BYMONTHDAY": "bymonthday", "BYYEARDAY": "byyearday", "BYWEEKNO": "byweekno",
                  "BYMONTH": "bymonth", "BYSETPOS": "bysetpos"}


@dataclass(frozen=True)
class Recur:
    """A validated RECUR value.

    ``parts`` maps upper-case part names to their raw values (each part once); ``kwargs`` are the
    matching keyword arguments of :class:`dateutil.rrule.rrule` *without* ``dtstart``, ``count`` and
    ``until``, which the expansion supplies (it normalises UNTIL first).
    """

    text: str
    freq: str
    parts: dict
    kwargs: dict
    count: int | None
    until: str | None

    @property
    def sub_daily(self) -> bool:
        return self.freq in SUB_DAILY

    @property
    def bounded(self) -> bool:
        """True when the rule carries its own end (COUNT or UNTIL)."""
        return self.count is not None or self.until is not None

    @property
    def has_by_parts(self) -> bool:
        return any(name.startswith("BY") for name in self.parts)


def _int_list(name: str, value: str) -> list[int]:
    low, high, signed = _RANGES[name]
    out: list[int] = []
    for item in value.split(","):
        item = item.strip()
        if not _INT.match(item):
            raise RRuleError(f"RRULE part {name}={value!r}: {item!r} is not an integer (RFC 5545 §3.3.10)")
        n = int(item)
        if not (low <= abs(n) <= high) or (n < 0 and not signed):
            allowed = f"±{low}..{high}" if signed else f"{low}..{high}"
            raise RRuleError(f"RRULE part {name}={value!r}: {n} is outside {allowed} (RFC 5545 §3.3.10)")
        out.append(n)
    return out


def validate_rrule(text: str) -> Recur:
    """Strictly parse an RFC 5545 RECUR value (§3.3.10); an ``RRULE:`` prefix is accepted.

    Returns a :class:`Recur`. Raises :class:`RRuleError` (a ``ValueError``) whose message names the
    offending part for: an empty value; a piece that is not ``NAME=VALUE``; an unknown part; a part
    repeated; a missing FREQ; COUNT together with UNTIL; a malformed value (non-integer, out of range,
    an UNTIL that is not ``YYYYMMDD[THHMMSS[Z]]`` or not a real date, an unknown weekday); and the
    combinations §3.3.10 forbids (an ordinal BYDAY outside MONTHLY/YEARLY, BYWEEKNO outside YEARLY,
    BYYEARDAY with DAILY/WEEKLY/MONTHLY, BYMONTHDAY with WEEKLY, BYSETPOS alone).
    """
    if not isinstance(text, str):
        raise RRuleError(f"RRULE {text!r} is not text")
    # Feeds repeat a handful of rule texts across thousands of rules; parse each text once. A Recur
    # is frozen and its dicts are only read (copied into dateutil's keyword arguments).
    return _validate_cached(text)


@lru_cache(maxsize=4096)
def _validate_cached(text: str) -> Recur:
    """:func:`validate_rrule` without the type check, memoised per text. Same result and errors."""
    parts = _split_parts(text)
    freq = _check_freq(parts)
    kwargs: dict = {}
    count = _positive(parts, "COUNT")
    interval = _positive(parts, "INTERVAL")
    if interval is not None:
        kwargs["interval"] = interval
    if "UNTIL" in parts:
        parse_until(parts["UNTIL"])  # raises naming UNTIL
    if "WKST" in parts:
        if parts["WKST"] not in _WEEKDAY:
            raise RRuleError(f"RRULE part WKST={parts['WKST']!r} is not a weekday (MO..SU)")
        kwargs["wkst"] = _WEEKDAY[parts["WKST"]]
    kwargs.update(_number_lists(parts, freq))
    if "BYDAY" in parts:
        kwargs["byweekday"] = _byday(parts["BYDAY"], freq, "BYWEEKNO" in parts)
    _check_month_days(kwargs.get("bymonth"), kwargs.get("bymonthday"))
    canonical = ";".join(f"{k}={v}" for k, v in parts.items())
    return Recur(canonical, freq, parts, kwargs, count, parts.get("UNTIL"))


def _split_parts(text: str) -> dict[str, str]:
    """A RECUR text (an ``RRULE:`` prefix accepted) → ``{NAME: VALUE}``, both upper-case, in the
    order written; ``X-`` parts left out. Raises :class:`RRuleError` for an empty value, a piece that
    is not ``NAME=VALUE``, an unknown part and a part repeated."""
    if not isinstance(text, str) or not text.strip():
        raise RRuleError("empty RRULE")
    body = text.strip()
    if body[:6].upper() == "RRULE:":
        body = body[6:]
    parts: dict[str, str] = {}
    for piece in body.rstrip(";").split(";"):
        name, sep, value = piece.partition("=")
        name, value = name.strip().upper(), value.strip().upper()
        if not sep or not name or not value:
            raise RRuleError(f"RRULE part {piece!r} is not NAME=VALUE (RFC 5545 §3.3.10)")
        if name not in PARTS:
            if name.startswith("X-"):  # §3.3.10 allows x-name parts; they carry no meaning for us
                continue
            raise RRuleError(f"RRULE part {name} is unknown (RFC 5545 §3.3.10 defines {', '.join(PARTS)})")
        if name in parts:
            # dateutil would keep the last one silently; two readers could then disagree (case C03).
            raise RRuleError(f"RRULE part {name} appears more than once (RFC 5545 §3.3.10 allows it once)")
        parts[name] = value
    return parts


def _check_freq(parts: dict[str, str]) -> str:
    """The FREQ of ``parts`` (:func:`_split_parts`). Raises :class:`RRuleError` when it is missing or
    unknown, and for COUNT together with UNTIL."""
    if "FREQ" not in parts:
        raise RRuleError("RRULE has no FREQ part (required by RFC 5545 §3.3.10)")
    freq = parts["FREQ"]
    if freq not in FREQS:
        raise RRuleError(f"RRULE part FREQ={freq!r} is not one of {', '.join(FREQS)}")
    if "COUNT" in parts and "UNTIL" in parts:
        raise RRuleError("RRULE has both COUNT and UNTIL (RFC 5545 §3.3.10 forbids it)")
    return freq


def _positive(parts: dict[str, str], name: str) -> int | None:
    """The value of part ``name`` (COUNT, INTERVAL) as a positive integer, None when absent. Raises
    :class:`RRuleError` naming the part for anything but digits worth at least 1."""
    if name not in parts:
        return None
    if not parts[name].isdigit() or int(parts[name]) < 1:
        raise RRuleError(f"RRULE part {name}={parts[name]!r} is not a positive integer")
    return int(parts[name])


def _number_lists(parts: dict[str, str], freq: str) -> dict[str, list[int]]:
    """dateutil's keyword arguments for the numeric list parts of ``parts`` (BYSECOND … BYSETPOS).

    Raises :class:`RRuleError` for a part that §3.3.10 forbids with ``freq``, a malformed or
    out-of-range number (:func:`_int_list`) and a BYSETPOS with no other BYxxx part to select from.
    """
    kwargs: dict[str, list[int]] = {}
    for name in _RANGES:
        if name in parts:
            if freq in _NOT_WITH.get(name, ()):
                raise RRuleError(f"RRULE part {name} cannot be used with FREQ={freq} (RFC 5545 §3.3.10)")
            kwargs[_DATEUTIL_NAME[name]] = _int_list(name, parts[name])
    if "BYSETPOS" in parts and not any(n.startswith("BY") and n != "BYSETPOS" for n in parts):
        raise RRuleError("RRULE part BYSETPOS needs another BYxxx part to select from (RFC 5545 §3.3.10)")
    return kwargs


def _byday(value: str, freq: str, weekno: bool) -> list:
    """A BYDAY value (``MO,-1FR,2TU``) → dateutil weekdays, an ordinal kept (``FR(-1)``).

    ``weekno``: the rule also has BYWEEKNO. Raises :class:`RRuleError` naming BYDAY for an item that
    is not ``[±n]MO..SU``, an ordinal outside 1..53, and an ordinal where §3.3.10 forbids one (any
    FREQ but MONTHLY and YEARLY, or YEARLY with BYWEEKNO).
    """
    days = []
    for item in value.split(","):
        m = _BYDAY.match(item.strip())
        if not m:
            raise RRuleError(f"RRULE part BYDAY={value!r}: {item!r} is not [±n]MO..SU")
        sign, number, day = m.groups()
        if number is None:
            days.append(weekdays[_WEEKDAY[day]])
            continue
        n = int(number)
        if not 1 <= n <= 53:
            raise RRuleError(f"RRULE part BYDAY={value!r}: ordinal {n} is outside 1..53")
        if freq not in ("MONTHLY", "YEARLY") or (freq == "YEARLY" and weekno):
            raise RRuleError(f"RRULE part BYDAY={value!r}: an ordinal weekday needs FREQ=MONTHLY or "
                             "YEARLY without BYWEEKNO (RFC 5545 §3.3.10)")
        days.append(weekdays[_WEEKDAY[day]](-n if sign == "-" else n))
    return days


_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February counted in a leap year


def _check_month_days(months: list[int] | None, days: list[int] | None) -> None:
    """Refuse BYMONTH/BYMONTHDAY pairs that never meet (``BYMONTH=2;BYMONTHDAY=30``).

    Such a rule has no occurrence, and dateutil does not notice: it scans every period up to the
    year 9999 looking for one (seconds of CPU per expansion, every planning pass).
    """
    if not days:
        return
    for month in months or range(1, 13):
        if any(abs(d) <= _MONTH_DAYS[month - 1] for d in days):
            return
    raise RRuleError(f"RRULE parts BYMONTH={','.join(map(str, months or []))} and "
                     f"BYMONTHDAY={','.join(map(str, days))} never meet: the rule has no occurrence")


@dataclass(frozen=True, slots=True)
class Lenient:
    """What :func:`parse_rrule` returns: the :class:`Recur`, or ``recur`` None and ``rejected`` the
    ``(rule_id, message)`` of the refusal (the message names the offending part)."""

    recur: Recur | None
    rejected: tuple[str | None, str] | None = None

    @property
    def counts(self) -> Counter[str]:
        """``{"rrule_rejected": 1}`` for a rejected rule, else empty."""
        return Counter({"rrule_rejected": 1}) if self.rejected is not None else Counter()


def parse_rrule(text: str, *, rule_id: str | None = None) -> Lenient:
    """Leniently parse a RECUR value: a :class:`Lenient` holding the :class:`Recur`, or holding None
    after logging.

    Same checks as :func:`validate_rrule`. On failure it logs at ERROR naming ``rule_id`` and the
    offending part, and the result says what was refused (``rejected``, ``counts["rrule_rejected"]``),
    so the scheduler skips this rule alone and a check can still see that something was dropped.
    Raises nothing for an invalid rule.
    """
    try:
        return Lenient(validate_rrule(text))
    except RRuleError as exc:
        log.error("rule %s: RRULE %r rejected, the rule is not expanded: %s", rule_id, text, exc)
        return Lenient(None, (rule_id, str(exc)))


def parse_until(value: str) -> date | datetime:
    """An UNTIL value as written: a ``date``, a naive ``datetime`` (floating) or an aware UTC one (``…Z``).

    Raises :class:`RRuleError` naming UNTIL when the value is not ``YYYYMMDD[THHMMSS[Z]]`` or names a
    date or time that does not exist.
    """
    m = _UNTIL.match(value.strip().upper())
    if not m:
        raise RRuleError(f"RRULE part UNTIL={value!r} is not YYYYMMDD or YYYYMMDDTHHMMSS[Z] (RFC 5545 §3.3.10)")
    day, clock, zulu = m.groups()
    try:
        if clock is None:
            return datetime.strptime(day, "%Y%m%d").date()
        moment = datetime.strptime(day + clock, "%Y%m%d%H%M%S")
    except ValueError:
        raise RRuleError(f"RRULE part UNTIL={value!r} is not a real date or time") from None
    return moment.replace(tzinfo=UTC) if zulu else moment


def to_instant(local: datetime, zone: tzinfo) -> datetime:
    """Local wall-clock time in ``zone`` → aware UTC instant.

    DST policy (RFC 5545 §3.3.5, "DATE-TIME … that does not exist"): ``fold=0`` with ``zoneinfo``
    reads a time inside a spring-forward gap with the offset *before* the transition, which is the
    same as shifting it forward by the gap's length (02:30 → 03:30 on a 02:00→03:00 night), and a
    time repeated by a fall-back as its *first* occurrence.
    """
    return local.replace(tzinfo=zone, fold=0).astimezone(UTC)


def until_bound(value: str, zone: tzinfo, *, all_day: bool) -> tuple[datetime, datetime]:
    """Normalise an UNTIL value into ``(local wall-clock bound, aware UTC instant)`` for a DTSTART in ``zone``.

    Real feeds write UNTIL as RFC 5545 asks (UTC ``…Z`` next to a zoned DTSTART), but also as a bare
    DATE next to a timed DTSTART (Google-generated feeds) or a floating time (an iOS client); dateutil
    refuses those mixes, and reading a floating UNTIL as UTC silently drops the last occurrence west
    of Greenwich (shared case C02). Rules, all inclusive:

    * timed DTSTART: ``…Z`` is that instant; a floating time is read in ``zone``; a DATE means the
      end of that day in ``zone`` (23:59:59);
    * all-day DTSTART: compared by date — the date as written (for ``…Z`` its UTC date, the date the
      producer meant, as in Google birthday feeds), up to the end of that local day.

    An UNTIL outside :data:`~deadline_pipeline.rules.RULE_YEARS` bounds nothing a planning window can
    reach, and is read as the nearest value every zone can convert (:func:`_within_calendar`).

    Raises :class:`RRuleError` for a malformed value.
    """
    parsed = _within_calendar(parse_until(value))
    if all_day:
        day = parsed if not isinstance(parsed, datetime) else parsed.date()
        local = datetime.combine(day, END_OF_DAY)
        return local, to_instant(local, zone)
    if isinstance(parsed, datetime) and parsed.tzinfo is not None:
        return parsed.astimezone(zone).replace(tzinfo=None), parsed
    local = parsed if isinstance(parsed, datetime) else datetime.combine(parsed, END_OF_DAY)
    return local, to_instant(local, zone)


# The UNTIL values every zone can convert, with a day to spare on each side. "UNTIL=99991231" is how
# some producers write "no end"; read in a zone west of UTC it is in year 10000, and the
# OverflowError ended the planning run. Past RULE_YEARS the clamp changes no occurrence.
_UNTIL_FLOOR = datetime(2, 1, 1)
_UNTIL_CEILING = datetime(9998, 12, 31, 23, 59, 59)


def _within_calendar(value: date | datetime) -> date | datetime:
    """``value`` (an UNTIL as :func:`parse_until` gives it) clamped to ``[_UNTIL_FLOOR,
    _UNTIL_CEILING]``, keeping its kind (date, floating or UTC date-time)."""
    low, high = _UNTIL_FLOOR, _UNTIL_CEILING
    if not isinstance(value, datetime):
        return min(max(value, low.date()), high.date())
    if value.tzinfo is not None:
        low, high = low.replace(tzinfo=UTC), high.replace(tzinfo=UTC)
    return min(max(value, low), high)


def merge_until(rrule: str, end: datetime, zone: tzinfo, *, all_day: bool = False) -> str:
    """Apply a caller's end date (aware ``end``) to a RECUR value, keeping at most one UNTIL.

    The rule's own bound is authoritative and the caller's end is only a fallback: a rule with its
    own UNTIL or COUNT is returned unchanged (a caller's date neither truncates a longer series nor
    loosens a shorter one), and an unbounded rule gets ``UNTIL=<end in UTC>``. Never appends a
    second UNTIL — dateutil would silently keep the last one. Raises :class:`RRuleError` for an
    invalid ``rrule``; ``zone`` and ``all_day`` are validated against the rule's UNTIL if present.
    """
    recur = validate_rrule(rrule)
    if recur.until is not None:
        until_bound(recur.until, zone, all_day=all_day)  # still refuse a malformed UNTIL loudly
        return recur.text
    if recur.count is not None:
        return recur.text
    stamp = end.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ") if not all_day else end.strftime("%Y%m%d")
    return f"{recur.text};UNTIL={stamp}"


# --- RECURRENCE-ID overrides (RFC 5545 §3.8.4.4) -----------------------------------------------

#: Keys of ``RuleRecord.extra`` that expansion honours for split series (set by apply_overrides).
SPLIT_FROM = "series_from"        # local ISO: occurrences before it belong to another piece
SPLIT_BEFORE = "series_before"    # local ISO: occurrences at or after it belong to another piece
SHIFT_SECONDS = "shift_seconds"   # wall-clock shift of each occurrence of a THISANDFUTURE piece
#: Key of ``RuleRecord.extra`` (set by apply_overrides on a plain override): the label of the master's
#: occurrence the override replaces, as the master's expansion labels it (by due time), so the override
#: is planned as that occurrence moved, not as a deadline of its own (``planner.occurrence_identity``).
REPLACES = "replaces_occurrence"


def _rid_local(rid: str, zone: tzinfo | None) -> str:
    """A RECURRENCE-ID as the parser stores it (UTC ``…Z``, a date, or local ISO) → local ISO in ``zone``.

    An instant reads as the wall time that exists: one inside a spring-forward gap reads as the time
    after it (:func:`occurrence_named` tells which of the two the series names it by)."""
    if rid.endswith("Z"):
        instant = datetime.strptime(rid, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        if zone is None:
            raise ValueError(f"RECURRENCE-ID {rid} is an instant but its master is floating")
        return format_local(instant.astimezone(zone).replace(tzinfo=None))
    return rid


def gap_alias(local: datetime, zone: tzinfo) -> datetime | None:
    """The other wall time (naive, in ``zone``) that names the same instant as ``local``, or None.

    RFC 5545 §3.3.5 reads a DATE-TIME inside a spring-forward gap "using the UTC offset before the
    gap": on a 02:00 → 03:00 night, 02:30 (which does not exist) is the instant of 03:30 (which does).
    For ``local`` = 02:30 this returns 03:30, for 03:30 it returns 02:30; for any wall time with no
    such twin (the usual case, a fall-back hour included), None. Works with ``zoneinfo`` zones
    (``fold=0``, as :func:`to_instant` reads times).
    """
    instant = to_instant(local, zone)
    existing = instant.astimezone(zone).replace(tzinfo=None)
    if existing != local:
        return existing  # ``local`` is in a gap: its instant reads back as the time after it
    # ``local`` exists: it has a twin when the offset before the last transition (at most a day back:
    # the longest gap, Samoa's skipped day) puts the same instant at a wall time that does not exist.
    try:
        nominal = (instant + (instant - timedelta(days=1)).astimezone(zone).utcoffset()).replace(tzinfo=None)
    except OverflowError:
        return None
    if nominal == local or to_instant(nominal, zone) != instant:
        return None
    return nominal if to_instant(nominal, zone).astimezone(zone).replace(tzinfo=None) != nominal else None


#: Key of ``RuleRecord.extra``: a recurring to-do's DUE − DTSTART in wall-clock seconds (set by the ICS
#: parser, whose record starts at the first due time). Its series steps in DTSTARTs, the due times a fixed
#: span after each (:func:`~deadline_pipeline.plan.occurrences.expansion`).
DUE_OFFSET = "due_offset_seconds"
#: Key of ``RuleRecord.extra``: a recurring to-do's DURATION (ISO 8601, ``P1D``, ``PT2H``; set by the ICS
#: parser), the nominal span each instance is due after its start (RFC 5545 §3.8.5.3). Absent for a to-do
#: with a DUE, whose span is the exact one from its DTSTART to its DUE
#: (:func:`~deadline_pipeline.plan.occurrences.due_span`).
DUE_SPAN = "due_span"


def due_offset(rule: RuleRecord) -> int:
    """``rule``'s :data:`DUE_OFFSET` in seconds when it recurs (RRULE or RDATE), else 0."""
    return int(rule.extra.get(DUE_OFFSET) or 0) if rule.rrule or rule.rdates else 0


def shifted_label(label: str, seconds: int) -> str:
    """An occurrence label moved by ``seconds``: a local ISO date-time by wall-clock time, a date by whole
    days, a UTC label (``…Z``, an elapsed-time series') by elapsed time."""
    if not seconds:
        return label
    if label.endswith("Z"):
        moved = datetime.fromisoformat(label[:-1]) + timedelta(seconds=seconds)
        return moved.isoformat(timespec="seconds") + "Z"
    if "T" in label:
        return format_local(parse_local(label) + timedelta(seconds=seconds))
    return (date.fromisoformat(label) + timedelta(days=seconds // 86400)).isoformat()


def occurrence_named(master: RuleRecord, override: RuleRecord, zone: tzinfo | None) -> str:
    """The occurrence of ``master`` that ``override`` names, labelled as the master's expansion labels
    it: local ISO date-time in ``zone`` (the master's), or a date for an all-day master.

    RFC 5545 §3.8.4.4: a RECURRENCE-ID is the DTSTART of the instance it names. An all-day master's
    occurrence is named by the RECURRENCE-ID's date as written, also when it is a DATE-TIME
    (``extra["recurrence_id_date"]``; Outlook writes one in any zone). For a to-do due a span after its
    DTSTART (:data:`DUE_OFFSET`) the label is the instance's DTSTART, as its master's EXDATEs are: the
    expansion steps in DTSTARTs and names each occurrence by its due time (``occurrences.expansion``).
    A RECURRENCE-ID names its instance by instant, whatever its TZID: an instant that a time inside a
    spring-forward gap and the existing time after it share (02:30 and 03:30, §3.3.5; :func:`gap_alias`)
    is labelled as the series has it — 02:30 for a series that steps to 02:30 (its nominal start), 03:30
    when the series may start at 03:30 (:func:`_starts_at`).
    Raises ``ValueError`` for a RECURRENCE-ID that is an instant when the master is floating.
    """
    rid = str(override.extra["recurrence_id"])
    if master.all_day:
        return str(override.extra.get("recurrence_id_date") or rid[:10])
    local = _rid_local(rid, zone)
    if zone is None or "T" not in local:
        return local
    # A series names an instance inside a spring-forward gap by its nominal start (02:30, due at the
    # instant of 03:30: occurrences' DST policy), and a RECURRENCE-ID arrives as that instant, read
    # back as 03:30: matched by wall time, the override was planned next to the original (two
    # reminders), a cancelled instance stayed planned and a THISANDFUTURE split missed it.
    existing = parse_local(local)
    nominal = gap_alias(existing, zone)
    if nominal is None or _starts_at(master, existing) or not _starts_at(master, nominal):
        return local
    return format_local(nominal)


def _starts_at(master: RuleRecord, local: datetime) -> bool:
    """Whether ``master``'s series may have an instance starting at the wall time ``local`` (naive):
    its DTSTART or an RDATE there, or an RRULE stepped in wall-clock time whose times of day
    (DTSTART's, or BYHOUR/BYMINUTE/BYSECOND, RFC 5545 §3.3.10) and sub-daily INTERVAL reach it.

    Only the time of day is judged, which is what tells a gap instance (02:30) from the existing time
    sharing its instant (03:30): when both may start, the existing one is the series' (a nonexistent
    time on the instant of an existing one is dropped, ``gaps.once_per_instant``). An RRULE
    stepped in elapsed time (sub-daily without BYxxx) never yields a nonexistent wall time, so for it
    every time that exists counts as reached."""
    start = parse_local(shifted_label(master.start, -due_offset(master)))
    if local == start or format_local(local) in master.rdates:
        return True
    if not master.rrule:
        return False
    try:
        recur = validate_rrule(master.rrule)
    except RRuleError:
        return False
    if recur.sub_daily and not recur.has_by_parts:
        return True  # stepped in elapsed time: its instances are at wall times that exist
    kwargs = recur.kwargs
    # dateutil's defaults: a part not given is DTSTART's, except the unit a sub-daily FREQ steps in.
    units = (("byhour", "hour", "HOURLY", 3600), ("byminute", "minute", "MINUTELY", 60),
             ("bysecond", "second", "SECONDLY", 1))
    for part, field, freq, seconds in units:
        allowed = kwargs.get(part)
        value = getattr(local, field)
        if allowed is not None:
            if value not in allowed:
                return False
        elif recur.freq == freq:
            step = int(kwargs.get("interval", 1)) * seconds
            if int((local - start).total_seconds()) // seconds * seconds % step:
                return False
        elif value != getattr(start, field) and not _finer(recur.freq, freq):
            return False
    return True


def _finer(freq: str, unit_freq: str) -> bool:
    """Whether ``freq`` steps in a unit finer than ``unit_freq``'s (MINUTELY than HOURLY…), so that
    every value of the coarser field is reached."""
    order = ("SECONDLY", "MINUTELY", "HOURLY")
    return freq in order and order.index(freq) < order.index(unit_freq)


def range_of(rule: RuleRecord) -> str:
    """An override's RANGE parameter, upper-case (``"THISANDFUTURE"``), or ``""`` when it has none."""
    return str(rule.extra.get("range") or rule.extra.get("recurrence_range") or "").upper()


def master_id_of(override: RuleRecord) -> str | None:
    """The rule id of the master an override (``UID#<RECURRENCE-ID>``) belongs to."""
    rid = str(override.extra["recurrence_id"])
    if override.rule_id.endswith("#" + rid):
        return override.rule_id[: -len(rid) - 1]
    return override.extra.get("uid")


class Folded(list):
    """What :func:`apply_overrides` returns: the folded records (a ``list[RuleRecord]``, in input
    order), and in ``counts`` how many overrides were kept as orphans (``orphan_overrides``), taken
    out as cancelled or completed (``cancelled_occurrences``) and had their RRULE dropped
    (``override_rrule_ignored``)."""

    def __init__(self, rules=(), counts: Counter[str] | None = None) -> None:
        super().__init__(rules)
        self.counts: Counter[str] = counts if counts is not None else Counter()


def apply_overrides(rules: list[RuleRecord], *, zone_of=None) -> Folded:
    """Fold RECURRENCE-ID override components into their master so each occurrence is planned once.

    ``rules``: records of one snapshot as the ICS parser yields them — a master with ``rule_id`` UID,
    and overrides with ``rule_id`` ``UID#<RECURRENCE-ID>`` and ``extra["recurrence_id"]``.
    ``zone_of``: optional callable ``RuleRecord -> tzinfo | None`` for masters whose zone is not in
    ``rule.tz`` (floating masters); by default ``rule.tz`` is resolved.

    * A plain override replaces the occurrence it names (RFC 5545 §3.8.4.4): that occurrence becomes
      an EXDATE of the master, and the override stays a one-off at its own DTSTART. Without this the
      master still yields the original occurrence and the subscriber gets two reminders. A master
      without RRULE or RDATE is folded the same way: its one occurrence, its DTSTART, becomes its EXDATE.
      The override records that occurrence's label (:data:`REPLACES`): it is the same occurrence, moved.
    * ``RANGE=THISANDFUTURE`` (read from ``extra["range"]``) splits the series: the master keeps the
      occurrences before the RECURRENCE-ID (``extra["series_before"]``), and the override becomes the
      tail — the master's rule (COUNT still counted from the master's DTSTART) from the
      RECURRENCE-ID on (``extra["series_from"]``), each occurrence shifted by the override's
      DTSTART − RECURRENCE-ID (``extra["shift_seconds"]``), or the override's own RRULE if it has one.
    * An override whose master is absent is kept as it is, logged and counted (``orphan_overrides``).
      One whose occurrence its master no longer has is the parser's to drop
      (:func:`deadline_pipeline.plan.vanished.vanished_overrides`).
    * A plain override that carries its own RRULE is still one instance: the RRULE is dropped
      (logged, counted in ``override_rrule_ignored``), never expanded as a second series.
    * The occurrence an override names is :func:`occurrence_named`'s: an all-day master's by the
      RECURRENCE-ID's date as written, a to-do's by its DTSTART (its series steps in starts), one inside a
      spring-forward gap by its nominal start (02:30, not the 03:30 its instant reads as), so a
      THISANDFUTURE piece is shifted by DTSTART − 02:30.
    * A cancelled override (``extra["cancelled"]``: STATUS:CANCELLED, or a completed to-do with
      ``extra["completed"]``) removes the occurrence it names (with ``RANGE=THISANDFUTURE``, every
      later one) and is not planned itself; logged and counted (``cancelled_occurrences``, completed
      ones included). A cancelled override without its master is dropped.

    Pure: returns a new :class:`Folded` (the counts on it), the input is not modified. Order is kept
    (a tail replaces its override in place). Raises ``ValueError`` as :func:`occurrence_named` does.
    """
    counts: Counter[str] = Counter()
    masters = {r.rule_id: r for r in rules if "recurrence_id" not in r.extra}
    exdates, splits = _named_occurrences(rules, masters, _zone_reader(zone_of), counts)
    # Two passes: an override may come before its master in the snapshot.
    replaced: dict[str, RuleRecord] = {}
    for master_id in set(exdates) | set(splits):
        labels = [label for label, _override in exdates.get(master_id, ())]
        replaced.update(_fold_master(masters[master_id], labels, splits.get(master_id, ())))
        for label, override in exdates.get(master_id, ()):
            # Keyed as its master's occurrence (by due time, as the expansion labels it): an override
            # keyed on its own id withdrew that occurrence ("Cancelled … no further reminders") and
            # planned the new date as another deadline, when a revision added it after a reminder.
            due_label = shifted_label(label, due_offset(masters[master_id]))
            replaced[override.rule_id] = replace(override, extra={**override.extra, REPLACES: due_label})
    out = Folded(counts=counts)
    for r in rules:
        kept = _in_force(r, replaced.get(r.rule_id, r), counts)
        if kept is not None:
            out.append(kept)
    return out


def _zone_reader(zone_of):
    """``zone_of`` as given to :func:`apply_overrides`, or by default a callable that resolves
    ``rule.tz`` (None for a floating rule)."""
    if zone_of is not None:
        return zone_of
    from deadline_pipeline.timezones import resolve_zone

    def zone(rule: RuleRecord) -> tzinfo | None:
        return resolve_zone(rule.tz) if rule.tz else None

    return zone


def _named_occurrences(rules: list[RuleRecord], masters: dict[str, RuleRecord], zone_of,
                       counts: Counter[str]) -> tuple[dict[str, list[tuple[str, RuleRecord]]],
                                                      dict[str, list[tuple[str, RuleRecord]]]]:
    """First pass of :func:`apply_overrides`: per master id, the ``(local label, override)`` of its
    plain overrides (the labels become EXDATEs) and of its THISANDFUTURE ones. An override without
    its master is left alone (counted in ``counts["orphan_overrides"]`` unless cancelled)."""
    exdates: dict[str, list[tuple[str, RuleRecord]]] = {}
    splits: dict[str, list[tuple[str, RuleRecord]]] = {}
    for r in rules:
        rid = r.extra.get("recurrence_id")
        if rid is None:
            continue
        master_id = master_id_of(r)
        master = masters.get(master_id)
        if master is None and r.extra.get("cancelled"):
            continue  # nothing in this snapshot to cancel; dropped below
        if master is None:
            counts["orphan_overrides"] += 1
            log.warning("override %s: no master %r in this snapshot; kept as a one-off", r.rule_id, master_id)
            continue
        # The label the master's expansion gives that occurrence (else the original stays as a ghost
        # next to the override: a date-time named in an all-day series, a to-do's DTSTART vs its DUE).
        local = occurrence_named(master, r, zone_of(master))
        if range_of(r) == "THISANDFUTURE":
            splits.setdefault(master.rule_id, []).append((local, r))
        else:
            exdates.setdefault(master.rule_id, []).append((local, r))
    return exdates, splits


def _fold_master(r: RuleRecord, exdates, splits) -> dict[str, RuleRecord]:
    """Second pass of :func:`apply_overrides` for one master ``r``: ``{rule_id: record}`` for the
    master (``exdates``, local labels, added to its EXDATEs; bounded before its first split) and for
    each THISANDFUTURE piece of ``splits`` (``(label, override)``), in time order."""
    master = replace(r, exdates=tuple(dict.fromkeys((*r.exdates, *exdates))), extra=dict(r.extra))
    pieces = sorted(splits, key=lambda p: parse_local(p[0]))
    if pieces:
        master.extra[SPLIT_BEFORE] = pieces[0][0]
    out = {master.rule_id: master}
    for i, (local, override) in enumerate(pieces):
        following = pieces[i + 1][0] if i + 1 < len(pieces) else None
        out[override.rule_id] = _tail(master, override, local, following)
    return out


def _tail(master: RuleRecord, override: RuleRecord, local: str, following: str | None) -> RuleRecord:
    """The piece of ``master``'s series that a THISANDFUTURE ``override`` of the occurrence ``local``
    (local ISO) states: from ``local`` on, up to the next piece's ``following`` label if any."""
    extra = {**master.extra, **override.extra, SPLIT_FROM: local}
    extra.pop(SPLIT_BEFORE, None)
    if following is not None:
        extra[SPLIT_BEFORE] = following
    if override.rrule:
        # The override states its own series: it starts at its DTSTART, no shift.
        return replace(override, exdates=tuple(dict.fromkeys((*override.exdates, *master.exdates))), extra=extra)
    # Due time to due time: ``local`` names the instance's DTSTART, the override's record its due time.
    shift = override.start_local() - parse_local(shifted_label(local, due_offset(master)))
    extra[SHIFT_SECONDS] = int(shift.total_seconds())
    return replace(master, rule_id=override.rule_id, title=override.title, url=override.url or master.url,
                   note=override.note or master.note, kind=override.kind, extra=extra)


def _in_force(given: RuleRecord, r: RuleRecord, counts: Counter[str]) -> RuleRecord | None:
    """Last pass of :func:`apply_overrides` for one record as ``given`` and as folded (``r``): None
    when ``given`` is a cancelled override (counted in ``cancelled_occurrences``), ``r`` without its
    RRULE for a plain override that carries one (``override_rrule_ignored``), else ``r``."""
    if "recurrence_id" in given.extra and given.extra.get("cancelled"):
        # Its occurrence (or tail) is already taken out of the master above.
        counts["cancelled_occurrences"] += 1
        log.info("override %s is closed by its publisher (%s): its occurrence is not planned", given.rule_id,
                 given.extra.get("completed") or "STATUS:CANCELLED")
        return None
    if "recurrence_id" in r.extra and range_of(r) != "THISANDFUTURE" and r.rrule and SPLIT_FROM not in r.extra:
        # An override is one instance (§3.8.4.4); an RRULE copied onto it by the producer is not a
        # second series (expanding it planned every later date twice).
        counts["override_rrule_ignored"] += 1
        log.warning("override %s: its RRULE %r is ignored; an override replaces one occurrence",
                    r.rule_id, r.rrule)
        return replace(r, rrule=None, rdates=())
    return r


def shift_local(local: datetime, seconds: int) -> datetime:
    """Wall-clock shift of a THISANDFUTURE tail occurrence (whole days stay on the same local time)."""
    return local + timedelta(seconds=seconds)


__all__ = [
    "DUE_OFFSET", "DUE_SPAN", "REPLACES", "Folded", "Lenient", "RRuleError", "Recur", "SUB_DAILY", "apply_overrides",
    "due_offset",
    "gap_alias", "master_id_of", "merge_until", "occurrence_named", "parse_rrule", "parse_until", "range_of",
    "shifted_label", "to_instant", "until_bound", "validate_rrule",
]
