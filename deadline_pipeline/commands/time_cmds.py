"""``deadline-pipeline occurrences``: preview the due instants of a rule before it goes live.

It runs the scheduler's own code path (strict RRULE parsing, UNTIL normalisation, DST policy,
business-day conventions, ICS override folding), so what it prints is what planning will produce.
Exit codes: 0 printed; 2 bad input (the strict error names the offending part).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, tzinfo
from pathlib import Path

import click

EXIT_RED, EXIT_BAD_INPUT = 1, 2  # the CLI's documented codes (see deadline_pipeline.cli)

_BASIC = re.compile(r"^(\d{8})(?:T(\d{6})(Z)?)?$", re.IGNORECASE)


class InputError(ValueError):
    """Bad command-line input; the message names the option and the value."""


@dataclass(frozen=True)
class _Value:
    """A date or date-time as written: naive ``value`` plus the zone name it carries (``None`` = floating)."""

    value: date | datetime
    tz: str | None


def _unreadable(what: str, text: str, otherwise: str) -> InputError:
    """The error for the value ``text`` of option ``what`` that does not parse: the field that names
    no moment when it is a date in form (``2026-02-30``: "no such date: 2026-02 has 28 days", not
    "neither … nor ISO 8601"), else ``otherwise``."""
    from deadline_pipeline.instants import impossible_part

    impossible = impossible_part(text)
    return InputError(f"{what}: {text!r}: {impossible}" if impossible else f"{what}: {text!r} {otherwise}")


def _parse_one(text: str, tz: str | None, value_type: str | None, what: str) -> _Value:
    raw = text.strip()
    m = _BASIC.match(raw)
    if m:
        day, clock, zulu = m.groups()
        try:
            if clock is None or value_type == "DATE":
                return _Value(datetime.strptime(day, "%Y%m%d").date(), None)
            moment = datetime.strptime(day + clock, "%Y%m%d%H%M%S")
        except ValueError:
            raise _unreadable(what, text, "is not a real date or time") from None
        return _Value(moment, "UTC" if zulu else tz)
    try:
        if len(raw) == 10:
            return _Value(date.fromisoformat(raw), None)
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise _unreadable(what, text, "is neither an ICS value (20250307T023000[Z]) nor ISO 8601") from None
    if moment.tzinfo is not None:
        if tz is not None:
            raise InputError(f"{what}: {text!r} carries an offset and a TZID; give one")
        offset = moment.utcoffset() or timedelta(0)
        # A bare offset is a fixed zone: explicit, but it knows no DST — say so by its name.
        name = "UTC" if not offset else _offset_name(offset)
        return _Value(moment.replace(tzinfo=None), name)
    return _Value(moment, tz)


def _offset_name(offset: timedelta) -> str:
    minutes = int(offset.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"UTC{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def parse_values(text: str, what: str) -> list[_Value]:
    """Parse ``NAME;TZID=…:v1,v2`` (ICS content line), ``NAME:v`` or a bare value / ISO 8601 string.

    Raises :class:`InputError` naming ``what`` for anything else.
    """
    raw = text.strip()
    tz = value_type = None
    if raw[:1].isalpha():  # an ICS property line: DTSTART;TZID=…:…  (ISO values start with a digit)
        head, sep, raw = raw.partition(":")
        if not sep:
            # "garbage" is read as a property name: say what a value may be, not only what is missing.
            raise InputError(f"{what}: {text!r} is neither a date or date-time (2026-01-05T09:00:00Z, "
                             "20260105T090000Z) nor a property line with ':' and a value "
                             "(DTSTART;TZID=Europe/Berlin:20260105T090000)")
        for param in head.split(";")[1:]:
            key, _, val = param.partition("=")
            key = key.strip().upper()
            if key == "TZID":
                tz = val.strip().strip('"')
            elif key == "VALUE":
                value_type = val.strip().upper()
    if not raw.strip():
        raise InputError(f"{what}: {text!r} has no value")
    return [_parse_one(part, tz, value_type, what) for part in raw.split(",")]


def _instant(text: str, what: str) -> datetime:
    values = parse_values(text, what)
    if len(values) != 1 or not isinstance(values[0].value, datetime) or values[0].tz is None:
        raise InputError(f"{what}: {text!r} must be one instant with Z or an offset (e.g. 2026-01-01T00:00:00Z)")
    from deadline_pipeline.instants import in_years
    from deadline_pipeline.plan.recurrence import to_instant
    from deadline_pipeline.timezones import resolve_zone

    try:
        zone = resolve_zone(values[0].tz)
        try:
            instant = to_instant(values[0].value, zone)
        except OverflowError:  # 0001-01-01T00:00+01:00 has no UTC form: a year out of range like any other
            instant = datetime.min.replace(tzinfo=UTC)
        # The window's other end is this plus a year or more: 9999-12-31 ended in "OverflowError:
        # date value out of range", naming neither the option nor the value.
        return in_years(instant)
    except ValueError as exc:
        raise InputError(f"{what}: {text!r}: {exc}") from None


def _rule_values(text: str, what: str) -> list[_Value]:
    """:func:`parse_values` for a date of the rule (``--dtstart``, ``--exdate``, ``--rdate``), refusing
    with :class:`InputError` a value outside :data:`~deadline_pipeline.rules.RULE_YEARS`, before any zone
    arithmetic: ``--dtstart 99991231T235959 --tz AoE`` ended in a bare ``OverflowError: date value
    out of range``."""
    from deadline_pipeline.rules import year_problem

    values = parse_values(text, what)
    for v in values:
        problem = year_problem(v.value)
        if problem:
            raise InputError(f"{what}: {text!r}: {problem}")
    return values


def _in_zone(v: _Value, zone: tzinfo, rule_tz: str) -> str:
    """A value as local wall-clock ISO in the rule's zone: each EXDATE/RDATE keeps its own TZID (case C12)."""
    from deadline_pipeline.plan.recurrence import to_instant
    from deadline_pipeline.rules import format_local
    from deadline_pipeline.timezones import resolve_zone

    if isinstance(v.value, datetime) and v.tz is not None and v.tz != rule_tz:
        local = to_instant(v.value, resolve_zone(v.tz)).astimezone(zone).replace(tzinfo=None)
        return format_local(local)
    return format_local(v.value)


def build_rule(dtstart: str, rrule: str | None, exdates: tuple[str, ...], rdates: tuple[str, ...],
               tz: str | None):
    """The :class:`~deadline_pipeline.rules.RuleRecord` and zone the options describe.

    Raises :class:`InputError`, ``RRuleError`` or ``UnknownTimeZone`` (all ``ValueError``) naming the
    option at fault. A floating DTSTART needs ``--tz``: it is never read as UTC.
    """
    from deadline_pipeline.plan.recurrence import to_instant, validate_rrule
    from deadline_pipeline.rules import RuleRecord, format_local
    from deadline_pipeline.timezones import resolve_zone

    values = _rule_values(dtstart, "--dtstart")
    if len(values) != 1:
        raise InputError(f"--dtstart: {dtstart!r} holds {len(values)} values; give one")
    start = values[0]
    if tz is not None:
        zone = resolve_zone(tz)
        if start.tz is not None and start.tz != tz and isinstance(start.value, datetime):
            if start.tz.startswith("UTC"):
                # An instant given with Z/offset: keep the instant, read it in --tz's wall clock.
                start = _Value(to_instant(start.value, resolve_zone(start.tz)).astimezone(zone).replace(tzinfo=None),
                               tz)
            else:
                raise InputError(f"--dtstart has TZID {start.tz!r} but --tz is {tz!r}; give one zone")
        rule_tz = tz
    elif start.tz is not None:
        rule_tz = start.tz
    elif not isinstance(start.value, datetime):
        # Not "floating (no TZID …)": the value may carry one, which a date does not take (§3.2.19).
        raise InputError(f"--dtstart {dtstart!r} is a date, which has no zone (a TZID does not apply to a date, "
                         "RFC 5545 §3.2.19): give --tz, the zone whose end of that day it is due at")
    else:
        raise InputError(f"--dtstart {dtstart!r} is floating (no TZID, Z or offset): give --tz; "
                         "a floating time is never read as UTC")
    zone = resolve_zone(rule_tz)
    text = None
    if rrule:
        text = rrule.strip()
        if text[:6].upper() == "RRULE:":
            text = text[6:]
        validate_rrule(text)  # strict: raise naming the part
    ex = tuple(_in_zone(v, zone, rule_tz) for x in exdates for v in _rule_values(x, "--exdate"))
    rd = tuple(_in_zone(v, zone, rule_tz) for x in rdates for v in _rule_values(x, "--rdate"))
    return RuleRecord("cli", "(preview)", format_local(start.value), rule_tz, text, ex, rd), zone


def _fmt(instant: datetime) -> str:
    return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def register(main: click.Group) -> None:
    """Add the ``occurrences`` command to the ``deadline-pipeline`` group."""

    @main.command("occurrences")
    @click.option("--dtstart", help="DTSTART;TZID=Europe/Berlin:20260105T090000, 20260105T090000Z, "
                  "DTSTART;VALUE=DATE:20260105 or ISO 8601 (2026-01-05T09:00:00, with --tz).")
    @click.option("--rrule", help="RFC 5545 RECUR value, e.g. FREQ=MONTHLY;BYMONTHDAY=15 (RRULE: prefix optional).")
    @click.option("--exdate", multiple=True, help="Excluded date(s), same forms as --dtstart, each with its own TZID.")
    @click.option("--rdate", multiple=True, help="Extra date(s), same forms as --dtstart.")
    @click.option("--tz", help="Zone of a floating DTSTART (IANA, AoE, UTC+2, PDT, Windows name); for --ics, "
                  "the zone of floating times when the calendar declares no X-WR-TIMEZONE.")
    @click.option("--business-days", "calendar_spec", help="Holiday calendar: US, US-DC, GB-ENG, NYSE, US-IRS…")
    @click.option("--convention", help="none | following (default with --business-days) | modified-following | "
                  "preceding.")
    @click.option("--after", help="Window start, an instant with Z or offset (default: now - 15 min).")
    @click.option("--before", help="Window end (default: --after + 366 days).")
    @click.option("--count", type=int, help="Print at most this many occurrences from --after on.")
    @click.option("--ics", "ics_file", type=click.Path(dir_okay=False),
                  help="Expand every VEVENT/VTODO of this iCalendar file instead (lines: instant TAB rule id).")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON list instead of lines.")
    def occurrences(dtstart, rrule, exdate, rdate, tz, calendar_spec, convention, after, before, count, ics_file,
                    as_json) -> None:
        """Print a rule's due instants, one ISO 8601 UTC instant (…Z) per line. Exits 1 when a rule has
        more occurrences in the window than the expansion cap, saying how many were left out, and when
        an ``--ics`` component was skipped (the list is then incomplete)."""
        _occurrences(_Options(dtstart, rrule, exdate, rdate, tz, calendar_spec, convention, after, before, count,
                              ics_file, as_json))

    return None


@dataclass(frozen=True)
class _Options:
    """The options of ``deadline-pipeline occurrences`` as click gives them (None: not given)."""

    dtstart: str | None
    rrule: str | None
    exdate: tuple[str, ...]
    rdate: tuple[str, ...]
    tz: str | None
    calendar_spec: str | None
    convention: str | None
    after: str | None
    before: str | None
    count: int | None
    ics_file: str | None
    as_json: bool


@dataclass
class _Found:
    """What the command expanded: ``found`` as ``(rule_id, Occurrence)`` in print order;
    ``truncated`` as ``(rule_id, occurrences left out, exact)`` for each rule cut at the cap;
    ``skipped`` the messages of the components (and rules over the work budget) left out."""

    found: list = field(default_factory=list)
    truncated: list[tuple[str, int, bool]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _occurrences(opts: _Options) -> None:
    """The ``occurrences`` command: expand, print, and exit 2 for bad input, 1 when the list printed
    is incomplete (a rule cut at the cap, a component skipped)."""
    from deadline_pipeline.plan.business_days import UnknownCalendar
    from deadline_pipeline.plan.recurrence import RRuleError
    from deadline_pipeline.timezones import UnknownTimeZone

    try:
        got = _expand_options(opts)
    except (InputError, RRuleError, UnknownTimeZone, UnknownCalendar, ValueError) as exc:
        _fail(str(exc))
        return
    _print_found(got.found, opts.ics_file, opts.as_json)
    _report_incomplete(got, opts.ics_file)
    if got.truncated or got.skipped:
        sys.exit(EXIT_RED)


def _business_option(calendar_spec: str | None, convention: str | None):
    """``(calendar, convention)`` for ``--business-days``/``--convention``, None without a calendar.
    Raises :class:`InputError` for a convention other than ``none`` without a calendar, and
    ``ValueError``/``UnknownCalendar`` for an unknown convention or calendar."""
    from deadline_pipeline.plan.business_days import calendar, check_convention

    if calendar_spec:
        name = check_convention(convention or "following")
        return calendar(calendar_spec), name
    if convention and check_convention(convention) != "none":
        raise InputError("--convention needs --business-days CALENDAR")
    return None


def _window_option(after: str | None, before: str | None, count: int | None) -> tuple[datetime, datetime]:
    """The window ``(lo, hi)`` (aware) of ``--after``/``--before``: from now - GRACE by default, to a
    horizon later (a century with ``--count``, which bounds the output). Raises :class:`InputError`
    for an unreadable bound or ``--before`` earlier than ``--after``."""
    from deadline_pipeline.plan.occurrences import GRACE, HORIZON

    lo = _instant(after, "--after") if after else datetime.now(UTC) - GRACE
    if before:
        hi = _instant(before, "--before")
    elif count is not None:
        hi = lo + timedelta(days=366 * 100)  # --count bounds the output; the window must not
    else:
        hi = lo + HORIZON
    if hi < lo:
        raise InputError("--before is earlier than --after")
    return lo, hi


def _expand_options(opts: _Options) -> _Found:
    """Check the options and expand the rule they describe, or every rule of ``--ics``. Raises
    :class:`InputError` (and the ``ValueError`` kinds of :func:`build_rule`) for bad input."""
    from deadline_pipeline.plan.occurrences import expansion

    if (opts.dtstart is None) == (opts.ics_file is None):
        raise InputError("give either --dtstart (with --rrule/--rdate) or --ics FILE")
    if opts.count is not None and opts.count < 1:
        raise InputError(f"--count {opts.count}: must be at least 1")
    business = _business_option(opts.calendar_spec, opts.convention)
    lo, hi = _window_option(opts.after, opts.before, opts.count)
    got = _Found()
    if opts.ics_file is not None:
        if opts.rrule or opts.exdate or opts.rdate:
            raise InputError("--rrule/--exdate/--rdate describe one rule; they cannot be combined with --ics")
        got.found = _expand_file(Path(opts.ics_file), opts.tz, lo, hi, business, opts.count, got.truncated,
                                 got.skipped)
        return got
    rule, zone = build_rule(opts.dtstart, opts.rrule, opts.exdate, opts.rdate, opts.tz)
    expanded = expansion(rule, zone, after=lo, before=hi, business_days=business, limit=opts.count)
    got.found = [(rule.rule_id, o) for o in expanded.occurrences]
    if expanded.counts["occurrence_cap"]:
        got.truncated.append((rule.rule_id, *_count_rest(rule, zone, got.found[-1][1].due_at, hi, business)))
    return got


def _print_found(found: list, ics_file: str | None, as_json: bool) -> None:
    """Print ``found`` (``(rule_id, Occurrence)``): instants only for one rule, with rule ids (and
    periods in JSON) for ``--ics``."""
    if ics_file is None:
        lines = [_fmt(o.due_at) for _rid, o in found]
        click.echo(json.dumps(lines) if as_json else "\n".join(lines))
    elif as_json:
        click.echo(json.dumps([{"due_at": _fmt(o.due_at), "rule_id": rid, "period": o.period}
                               for rid, o in found], indent=1))
    else:
        click.echo("\n".join(f"{_fmt(o.due_at)}\t{rid}" for rid, o in found))


def _report_incomplete(got: _Found, ics_file: str | None) -> None:
    """Say on stderr why the list printed is incomplete: each rule cut at the cap, and the skipped
    components of ``ics_file``."""
    if got.truncated:
        from deadline_pipeline.plan.occurrences import MAX_OCCURRENCES

        # DESIGN: truncation is an error, never a silent cap — the list above is incomplete.
        for rid, rest, exact in got.truncated:
            click.echo(f"error: rule {rid}: stopped at {MAX_OCCURRENCES} occurrences; "
                       f"{rest if exact else f'more than {rest}'} more in the window were not printed "
                       "(narrow --after/--before, or use --count)", err=True)
    if got.skipped:
        # As in ingest, where a skipped record turns rules_complete red: a file whose every event
        # was skipped (an unknown TZID, say) printed nothing and exited 0, like an empty window.
        click.echo(f"error: {len(got.skipped)} component(s) of {ics_file} were skipped (see the warnings above); "
                   "their occurrences are not in the list", err=True)


#: How many occurrences past the cap are counted before the message says "more than".
COUNT_REST_LIMIT = 100 * 5000


def _count_rest(rule, zone: tzinfo, last: datetime, hi: datetime, business) -> tuple[int, bool]:
    """How many occurrences of ``rule`` fall after ``last`` (aware) up to ``hi``: ``(n, exact)``;
    counting stops past :data:`COUNT_REST_LIMIT` (``exact`` False) so a MINUTELY-like series over
    decades cannot keep the command busy."""
    from deadline_pipeline.plan.occurrences import MAX_OCCURRENCES, expand

    # Each batch below hits the cap on purpose, and expand() logs every cap at ERROR: a MINUTELY rule
    # printed ~100 identical lines before the one message that says what happened. The first
    # expansion's line (already printed) and the summary error after the list are what the user needs.
    expand_log = logging.getLogger("deadline_pipeline.plan.occurrences")
    repeat = _DropRecords()
    expand_log.addFilter(repeat)
    rest = 0
    try:
        while rest < COUNT_REST_LIMIT:
            batch = expand(rule, zone, after=last + timedelta(microseconds=1), before=hi, business_days=business)
            rest += len(batch)
            if len(batch) < MAX_OCCURRENCES:
                return rest, True
            last = batch[-1].due_at
        return rest, False
    finally:
        expand_log.removeFilter(repeat)


class _DropRecords(logging.Filter):
    """Drops every record: while counting, they repeat a message already logged once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return False


def _expand_file(path: Path, tz: str | None, lo: datetime, hi: datetime, business, count: int | None,
                 truncated: list | None = None, skipped: list | None = None):
    """Parse an iCalendar file as ingest does, fold its overrides, and expand every rule.

    Parse problems are printed to stderr as warnings (the good components still count, as in
    ingest); the skipped components and rules over the expansion budget are appended to ``skipped``
    (their messages). Raises :class:`InputError` for an unreadable file or a floating rule without a
    zone.
    """
    from deadline_pipeline.ingest.parsers.base import ParseError
    from deadline_pipeline.ingest.parsers.ics import parse_ics
    from deadline_pipeline.plan.occurrences import ExpansionBudgetExceeded, expansion
    from deadline_pipeline.plan.recurrence import apply_overrides
    from deadline_pipeline.timezones import resolve_zone

    try:
        content = path.read_bytes()
    except OSError as exc:
        raise InputError(f"--ics {path}: {exc.strerror or exc}") from None
    try:
        result = parse_ics(content, source=str(path), default_tz=tz)
    except ParseError as exc:
        raise InputError(str(exc)) from None
    for problem in result.problems:
        click.echo(f"warning: {path}: {problem}", err=True)
        if problem.skipped and skipped is not None:
            skipped.append(str(problem))
    found = []
    for rule in apply_overrides(result.rules):
        if rule.tz is None:
            # "Declares no X-WR-TIMEZONE" was wrong for an empty one, read as absent (its note is printed above).
            raise InputError(f"--ics {path}: rule {rule.rule_id!r} has floating times and the calendar names no zone "
                             "for them (no X-WR-TIMEZONE, or an empty one); give --tz")
        zone = resolve_zone(rule.tz)
        try:
            expanded = expansion(rule, zone, after=lo, before=hi, business_days=business, limit=count)
        except ExpansionBudgetExceeded as exc:  # that rule alone is skipped, as in planning
            click.echo(f"warning: {path}: {exc}", err=True)
            if skipped is not None:
                skipped.append(str(exc))
            continue
        mine = expanded.occurrences
        found.extend((rule.rule_id, o) for o in mine)
        if truncated is not None and expanded.counts["occurrence_cap"]:
            truncated.append((rule.rule_id, *_count_rest(rule, zone, mine[-1].due_at, hi, business)))
    found.sort(key=lambda pair: (pair[1].due_at, pair[0]))
    return found[:count] if count is not None else found
