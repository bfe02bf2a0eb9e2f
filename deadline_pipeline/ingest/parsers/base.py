"""What every source parser returns, and the helpers they share.

Parsing is *lenient per record, strict per payload*:

* a record that cannot be used (an entry without id, an unknown zone, a date written "TBA") is
  skipped and reported as a :class:`ParseProblem`; the good records of the same payload are kept,
  so one typo in a 200-entry feed does not hide the other 199 deadlines;
* a payload that cannot be used at all (not decodable, not the expected format, an HTML error page,
  a truncated calendar, an empty body) raises :class:`ParseError`. Raising — instead of returning an
  empty result — matters: an empty result would read as "every rule of this source was deleted".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

# ParseError (the whole payload is unusable) is defined in the leaf module deadline_pipeline.limits,
# whose bounded loaders raise it for the configuration as well; every parser takes it from here.
from deadline_pipeline.limits import ParseError
from deadline_pipeline.rules import RuleRecord, dates_problem, id_problem
from deadline_pipeline.unicode_forms import other_unicode

_HTML_START = re.compile(r"^\s*(?:<!doctype\s+html|<html[\s>]|<head[\s>]|<body[\s>])", re.IGNORECASE)


@dataclass
class ParseProblem:
    """One skipped record (or one ignored part of a record).

    ``position``: where it is, e.g. ``"line 12"``, ``"entry 3 (id=cvpr24)"``, ``"VEVENT UID=abc"``.
    ``message``: what is wrong, in words a source maintainer can act on.
    ``record_id``: the identity of the skipped record when it could be read — a rule id, or the
    prefix of the rule ids it yields (``cvpr24`` for ``cvpr24/submission/deadline``, a UID for its
    ``UID#RECURRENCE-ID`` overrides); ``None`` when the id itself is unreadable.
    ``skipped``: False for a note that skips nothing (a part ignored, an exact copy of a record). A
    skipped record is not a withdrawal: ingest keeps the last good version of every rule it may have
    yielded (all the missing ones when ``record_id`` is ``None``), and a check turns red.
    ``unannounced``: the record is readable but announces no instant yet (an ai-deadlines entry
    without ``deadline``: "not announced yet" in a real feed). It counts as skipped — rules held in
    force, ``rules_complete`` red, the source's ``last_error`` — only when it may be a rule in force
    that the snapshot lacks (:func:`counted_problems`); otherwise it is listed as information.
    ``closed``: a note (``skipped`` False) that the publisher closed the record (an iCalendar
    STATUS:CANCELLED, a completed to-do): read, and taken out of force on purpose. Counted apart from
    skipped records and other notes: ``rules diff`` said "1 record(s) … skipped" for a cancellation.
    """

    position: str
    message: str
    record_id: str | None = None
    skipped: bool = True
    unannounced: bool = False
    closed: bool = False

    def may_be(self, rule_id: str, known: Iterable[str] = ()) -> bool:
        """Whether ``rule_id`` may be one of the rules this skipped record would have yielded.

        ``known``: the rule ids the source had before this snapshot. A skipped record whose id names
        none of them may be any rule: the edit that broke the record may also have changed its id
        (an ICS UID given a ``-v2`` suffix, a conference renamed), and matched by id alone the rule it
        was would be withdrawn and its reminders cancelled, with a "withdrawn" notice to the
        subscriber, while the source only failed to parse.
        """
        if not self.skipped:
            return False
        if self.record_id is None:
            return True  # the id is unreadable: any missing rule may be this record
        if self._names(rule_id):
            return True
        known = list(known)
        return bool(known) and not any(self._names(k) for k in known)

    def _names(self, rule_id: str) -> bool:
        rid = self.record_id
        return rule_id == rid or rule_id.startswith((rid + "/", rid + "#"))

    def __str__(self) -> str:
        return f"{self.position}: {self.message}"


def counted_problems(problems, missing) -> list[ParseProblem]:
    """The skipped records of ``problems`` that count (see :class:`ParseProblem`): every skipped
    record, except an ``unannounced`` one that may be none of the rule ids in ``missing`` (rules in
    force the snapshot lacks). Pure."""
    missing = list(missing)
    return [p for p in problems if p.skipped and (not p.unannounced or any(p.may_be(r) for r in missing))]


@dataclass
class ParseResult:
    """The rules read from one payload, and the problems met on the way."""

    rules: list[RuleRecord] = field(default_factory=list)
    problems: list[ParseProblem] = field(default_factory=list)
    #: Where each rule was read (``"line 12"``), parallel to ``rules`` when every rule went through
    #: :meth:`add`; used to name both records of a repeated id (:func:`drop_duplicate_ids`).
    positions: list[str | None] = field(default_factory=list)

    def add(self, rule: RuleRecord, position: str | None) -> None:
        """Append ``rule`` read at ``position`` (kept parallel in ``positions``), or, when one of its
        dates is outside :data:`~deadline_pipeline.rules.RULE_YEARS` or its id is longer than the store
        keeps (:data:`~deadline_pipeline.rules.RULE_ID_MAX`), a skipped record naming it.

        Checked here, where every parser's rules pass: an ai-deadlines entry due in 9999 in UTC-12
        made the parser fail with "OverflowError: date value out of range", and a 600-character UID
        failed the source's ingest on PostgreSQL, each with every other rule of the feed."""
        problem = id_problem(rule.rule_id) or dates_problem(rule)
        if problem:
            self.problems.append(ParseProblem(position or f"rule {rule.rule_id!r}", problem, rule.rule_id))
            return
        self.rules.append(rule)
        self.positions.append(position)


def refuse_other_unicode(content: bytes, *, source: str, what: str) -> None:
    """Raise :class:`ParseError` naming ``source`` when ``content`` is UTF-16 or UTF-32 text
    (:func:`~deadline_pipeline.unicode_forms.other_unicode`: a byte order mark, or a NUL byte beside
    every character of the first line) and ask for UTF-8; ``what`` names the expected format.

    A spreadsheet's "Unicode text" and Windows tools write UTF-16: with a mark it was reported as
    "not valid UTF-8 (byte 0xff)", which does not say what the file is; without one, ASCII in UTF-16
    is valid UTF-8 and a CSV header of NUL-strewn names "lacked" every column."""
    found = other_unicode(content)
    if found is None:
        return
    name, has_mark = found
    why = (f"it starts with a {name} byte order mark" if has_mark
           else "no byte order mark, a NUL byte beside every character")
    raise ParseError(f"source {source!r}: line 1: payload looks like {name} ({why}), not UTF-8; {what} must be "
                     "UTF-8: save the file as UTF-8")


def decode_text(content: bytes, *, source: str, what: str) -> str:
    """Decode a payload as UTF-8 (a leading byte-order mark is dropped) and refuse unusable ones.

    ``what`` names the expected format in messages (``"ai-deadlines YAML"``). Raises
    :class:`ParseError` naming the source and the line/column of the first undecodable byte, when the
    payload is empty or blank, or when it is an HTML page (a web server's error page served in place
    of the data, the most common way a fetched feed goes wrong).
    """
    if not isinstance(content, (bytes, bytearray)):
        raise ParseError(f"source {source!r}: expected bytes, got {type(content).__name__}")
    refuse_other_unicode(bytes(content), source=source, what=what)
    try:
        text = bytes(content).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        before = bytes(content[: exc.start])
        line = before.count(b"\n") + 1
        column = exc.start - (before.rfind(b"\n") + 1) + 1
        raise ParseError(
            f"source {source!r}: line {line}, column {column}: payload is not valid UTF-8 "
            f"(byte 0x{content[exc.start]:02x} at offset {exc.start}); {what} must be UTF-8"
        ) from None
    if not text.strip():
        raise ParseError(f"source {source!r}: line 1: empty payload, expected {what}")
    if _HTML_START.match(text[:1024]):
        raise ParseError(f"source {source!r}: line 1: payload looks like an HTML page, not {what}")
    return text


def drop_duplicate_ids(result: ParseResult) -> ParseResult:
    """Keep one rule per ``rule_id``; report every other record that carried the same id.

    Two rules with one identity in a snapshot cannot both be stored, so one is kept:

    * copies with the same content (:meth:`RuleRecord.content_hash`): the first is kept and each copy
      is a note (``skipped=False``) — nothing is lost;
    * records that differ (due time, title, recurrence, link, note…): the one **due first** is kept
      (:func:`first_due`; on a tie the first in the file) and each other one is a *skipped* record
      (counted: ``rules_complete`` red, the source's ``last_error``), its message naming both
      positions. Its deadline is not planned until the source gives it an id of its own.

    Why the one due first, and not the first in the file: a CSV without ``id`` column takes the title
    as id, so two "Estimated tax payment" rows (January and April) share one; a revision that
    inserted the April row *above* the January one made the rule look moved to April and superseded
    the January reminders while that row was still in the file. Keeping the earliest due time never
    drops the more urgent deadline, and it is a function of the records alone — not of file order
    nor of the time the snapshot is applied — so re-reading the same bytes keeps the same rule and a
    reordered file is no change.

    ``result.positions`` (parallel to ``result.rules``, see :meth:`ParseResult.add`) names the
    records in messages; a rule without a position is named by its id. Returns ``result``, changed.
    """
    positions = result.positions if len(result.positions) == len(result.rules) else [None] * len(result.rules)
    groups: dict[str, list[int]] = {}
    for i, rule in enumerate(result.rules):
        groups.setdefault(rule.rule_id, []).append(i)
    keep: set[int] = set()
    for rule_id, indices in groups.items():
        chosen = min(indices, key=lambda i: (first_due(result.rules[i]), i))
        keep.add(chosen)
        kept_rule, kept_at = result.rules[chosen], positions[chosen] or f"rule {rule_id!r}"
        for i in indices:
            if i == chosen:
                continue
            rule, at = result.rules[i], positions[i] or f"rule {rule_id!r}"
            if rule.content_hash() == kept_rule.content_hash():
                result.problems.append(ParseProblem(
                    at, f"rule id {rule_id!r} repeats {kept_at} with the same content; one copy kept",
                    rule_id, skipped=False))
                continue
            fields = ", ".join(f for f in ("start", "tz", "rrule", "exdates", "rdates", "title", "kind", "url",
                                           "note", "extra") if getattr(rule, f) != getattr(kept_rule, f))
            result.problems.append(ParseProblem(at, (
                f"rule id {rule_id!r} is also used by {kept_at} for a different record (differs in {fields}); "
                f"this one (due {rule.start}) is skipped and the one due first ({kept_at}, due {kept_rule.start}) "
                "is kept: give each deadline its own id"), rule_id))
    result.rules = [r for i, r in enumerate(result.rules) if i in keep]
    result.positions = [p for i, p in enumerate(positions) if i in keep]
    return result


def first_due(rule: RuleRecord) -> datetime:
    """When ``rule`` is first due, as an aware UTC instant, to order records that share an id.

    The start (a recurring rule's first instance too) in its zone; a floating time or an unknown zone
    is read as UTC (at most 14 hours off, enough to order records of one id); an unreadable start
    sorts last. Pure; never raises.
    """
    from deadline_pipeline.plan.recurrence import to_instant
    from deadline_pipeline.timezones import UnknownTimeZone, resolve_zone

    try:
        local = rule.start_local()
    except (TypeError, ValueError):
        return datetime.max.replace(tzinfo=UTC)
    zone = UTC
    if rule.tz is not None:
        try:
            zone = resolve_zone(rule.tz)
        except UnknownTimeZone:
            zone = UTC
    try:
        return to_instant(local, zone)
    except OverflowError:  # no UTC form (9999-12-31T23:59:59 in AoE): sorts last, like an unreadable start
        return datetime.max.replace(tzinfo=UTC)


def check_recur(text: str) -> str | None:
    """Validate an RFC 5545 RECUR value (§3.3.10); return the strict parser's message, or ``None``.

    The same parser as planning's (``plan.recurrence.validate_rrule``), in its strict posture, so the
    ingest and the scheduler can never disagree on a stored rule: a part repeated (``UNTIL`` twice
    would otherwise become "last one wins"), a missing ``FREQ``, ``COUNT`` with ``UNTIL``, an unknown
    part or a malformed value are refused here, per record.
    """
    from deadline_pipeline.plan.recurrence import RRuleError, validate_rrule

    if not text or not text.strip():
        return "empty RRULE"
    try:
        validate_rrule(text.strip())
    except RRuleError as exc:
        return str(exc)
    return None
