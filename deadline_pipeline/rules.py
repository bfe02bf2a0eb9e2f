"""The rule record: what every parser yields and what planning expands. Pure domain, no I/O.

A rule is either one due instant or a recurring series. Times are kept as the source wrote them —
a local wall-clock time plus the zone name — so that expansion happens in local time (a "15 April"
rule stays on 15 April across DST) and the instant is computed only at the end.

Conventions (documented because a wrong one is a silent miss):

* ``start`` is ISO 8601 local wall-clock time without offset (``2024-06-15T23:59:00``) or a date
  (``2024-04-15``). A date means the deadline is the *end* of that local day (23:59:59), because
  "due 15 April" means it may still be done on 15 April.
* ``tz`` is the zone as the source spelled it (see :mod:`deadline_pipeline.timezones`), or ``None``
  for a floating time, which planning reads in the subscriber's zone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, time

END_OF_DAY = time(23, 59, 59)

# The years a rule's dates (its start, RDATE and EXDATE values) may lie in. Planning reads each one
# in its zone (up to a day from UTC), rolls it to a business day (up to a month) and counts reminders
# from it (up to ten years), all inside Python's calendar of years 1 to 9999: 9999-12-31T23:59:59 in
# AoE is in year 10000 in UTC and ended in "OverflowError: date value out of range" for every rule of
# the feed. Nothing plannable is refused above 9000: no planning window reaches further than 9000
# plus its horizon (instants.INSTANT_YEARS). Old starts of yearly rules (1776, 1604) still fit.
RULE_YEARS = (1000, 9000)

# The longest rule id the store keeps (``rule_versions.rule_id`` and ``lineage``,
# ``obligations.rule_id``). RFC 5545 sets no bound on a UID (§3.8.4.7), and PostgreSQL refuses a longer
# value: one such VEVENT failed the whole source's ingest with StringDataRightTruncation, its other
# rules with it (SQLite kept it, so the two stores disagreed).
RULE_ID_MAX = 500


@dataclass(frozen=True)
class RuleRecord:
    """One rule parsed from a snapshot.

    ``rule_id``: identity stable across revisions of the source (see each parser).
    ``rrule``: an RFC 5545 RECUR value without the ``RRULE:`` prefix, or ``None`` for a one-off.
    ``exdates`` / ``rdates``: local wall-clock ISO strings in the rule's zone.
    """

    rule_id: str
    title: str
    start: str
    tz: str | None
    rrule: str | None = None
    exdates: tuple[str, ...] = ()
    rdates: tuple[str, ...] = ()
    kind: str = "deadline"  # deadline | event | todo
    url: str | None = None
    note: str | None = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def to_payload(self) -> dict:
        """A JSON-safe dict (stored in ``rule_versions.payload``)."""
        d = asdict(self)
        d["exdates"] = list(self.exdates)
        d["rdates"] = list(self.rdates)
        return d

    @classmethod
    def from_payload(cls, payload: dict) -> RuleRecord:
        data = dict(payload)
        data["exdates"] = tuple(data.get("exdates") or ())
        data["rdates"] = tuple(data.get("rdates") or ())
        data["extra"] = dict(data.get("extra") or {})
        return cls(**data)

    def content_hash(self) -> str:
        """sha256 of the canonical JSON payload: equal hashes mean no new rule version."""
        blob = json.dumps(self.to_payload(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    @property
    def all_day(self) -> bool:
        return "T" not in self.start

    def start_local(self) -> datetime:
        """The naive local wall-clock start; a date becomes the end of that day (23:59:59)."""
        return parse_local(self.start)


def rule_kinds(rule: RuleRecord | dict) -> set[str]:
    """The kinds a subscription's ``kinds`` / ``exclude_kinds`` match for a rule (a record or its stored
    payload): its ``kind`` (``deadline``, ``event``, ``todo``, ``holiday``) and, when the source types
    its deadlines, that type (ai-deadlines ``type``: ``abstract``, ``paper``, ``submission``,
    ``notification``, …), lower case."""
    kind = rule.kind if isinstance(rule, RuleRecord) else rule.get("kind")
    extra = (rule.extra if isinstance(rule, RuleRecord) else rule.get("extra")) or {}
    return {str(k).strip().lower() for k in (kind, extra.get("deadline_type")) if k}


def kinds_allow(kinds: list[str] | tuple[str, ...] | None, exclude: list[str] | tuple[str, ...] | None,
                rule: RuleRecord | dict) -> bool:
    """Whether a subscription with ``kinds`` (None = every kind) and ``exclude_kinds`` wants ``rule``."""
    return kinds_admit(kinds, exclude, rule_kinds(rule))


#: Deadline types that name one deadline: the paper deadline is typed ``paper`` by most editions of
#: the ai-deadlines files, ``submission`` by others (WACV, ICLR) and by this reader for a flat
#: ``deadline:`` key. ``kinds: [abstract, paper]``, the documented example, planned no flat entry's
#: paper deadline and no WACV deadline at all, every check green while another edition of the
#: source had a ``paper`` one.
KIND_ALIASES: tuple[frozenset[str], ...] = (frozenset({"paper", "submission"}),)


def selected_kinds(kinds: Collection[str]) -> set[str]:
    """The kinds a ``kinds`` list selects, lower case: each entry and its :data:`KIND_ALIASES`
    (``["Paper"]`` -> ``{"paper", "submission"}``). Only ``kinds`` is widened so: an
    ``exclude_kinds`` entry excludes the type it names and no more, so neither list can drop a
    deadline it does not name."""
    chosen = {k.strip().lower() for k in kinds}
    return chosen.union(*(group for group in KIND_ALIASES if group & chosen))


def kinds_admit(kinds: Collection[str] | None, exclude: Collection[str] | None, have: Collection[str]) -> bool:
    """:func:`kinds_allow` for a rule whose kinds are ``have`` (lower case, as :func:`rule_kinds`
    gives them), e.g. the kinds a withdrawn rule last had. ``kinds`` select their aliases too
    (:func:`selected_kinds`); ``exclude`` matches as written, ignoring case."""
    have = set(have)
    if kinds and not have & selected_kinds(kinds):
        return False
    return not (exclude and have & {k.lower() for k in exclude})


def parse_local(text: str) -> datetime:
    """Parse an ISO local date or date-time (no offset) into a naive datetime.

    A bare date means the end of that day. Raises ``ValueError`` naming the text, including when it
    carries an offset (the zone belongs in ``tz``, not in the string).
    """
    if "T" not in text and " " not in text:
        return datetime.combine(date.fromisoformat(text), END_OF_DAY)
    value = datetime.fromisoformat(text)
    if value.tzinfo is not None:
        raise ValueError(f"local time {text!r} carries an offset; rules keep the zone in 'tz'")
    return value


def year_problem(value: date | datetime, years: tuple[int, int] = RULE_YEARS) -> str | None:
    """``"year 9999 is outside the supported range (years 1000 to 9000)"`` when the year of ``value``
    is outside ``years``, else None. Callers prefix the input that holds the value."""
    low, high = years
    if low <= value.year <= high:
        return None
    return f"year {value.year} is outside the supported range (years {low} to {high})"


def id_problem(rule_id: str) -> str | None:
    """``"rule id is 612 characters long; the store keeps at most 500"`` when ``rule_id`` is longer
    than :data:`RULE_ID_MAX`, else None. Callers prefix the record that holds it."""
    if len(rule_id) <= RULE_ID_MAX:
        return None
    return f"rule id is {len(rule_id)} characters long; the store keeps at most {RULE_ID_MAX}"


def dates_problem(rule: RuleRecord) -> str | None:
    """Why a date of ``rule`` is outside :data:`RULE_YEARS`, naming the field and its value
    (``"start 9999-12-31T23:59:59: year 9999 is outside the supported range (years 1000 to 9000)"``,
    likewise ``RDATE`` and ``EXDATE``), or None. A value that does not parse is not judged here:
    expansion names it."""
    named = [("start", rule.start), *(("RDATE", x) for x in rule.rdates), *(("EXDATE", x) for x in rule.exdates)]
    for what, text in named:
        try:
            problem = year_problem(parse_local(text))
        except (TypeError, ValueError):
            continue
        if problem:
            return f"{what} {text}: {problem}"
    return None


def format_local(value: datetime | date) -> str:
    """The inverse of :func:`parse_local` for naive values (dates stay dates)."""
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            raise ValueError(f"{value!r} is aware; expected local wall-clock time")
        return value.isoformat(timespec="seconds")
    return value.isoformat()


def utc(value: datetime) -> datetime:
    """Convert an aware datetime to UTC; refuses naive values (``ValueError``)."""
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value!r}: an instant needs a zone")
    return value.astimezone(UTC)
