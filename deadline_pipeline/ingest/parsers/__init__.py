"""Source parsers: bytes of one fetched payload in, :class:`ParseResult` out.

``PARSERS`` maps a source format (as named in the configuration) to its parser; every parser has
the signature ``(content: bytes, *, source: str, default_tz: str | None = None) -> ParseResult``
and raises :class:`ParseError` only when the whole payload is unusable (see :mod:`.base`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime, timedelta

from deadline_pipeline.ingest.parsers.aideadlines import parse_ai_deadlines
from deadline_pipeline.ingest.parsers.base import ParseError, ParseProblem, ParseResult
from deadline_pipeline.ingest.parsers.csv_format import parse_csv
from deadline_pipeline.ingest.parsers.govuk import parse_govuk_bank_holidays
from deadline_pipeline.ingest.parsers.ics import parse_ics
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.timezones import (
    UnknownTimeZone,
    ambiguous_abbreviation,
    inverted_sign,
    offset_disagreements,
    resolve_zone,
    seasonal_abbreviation,
    utc_offset_text,
)
from deadline_pipeline.wording import duration_words

__all__ = ["PARSERS", "ParseError", "ParseProblem", "ParseResult", "parse_payload"]

PARSERS: dict[str, Callable[..., ParseResult]] = {
    "ai-deadlines": parse_ai_deadlines,
    "ics": parse_ics,
    "csv": parse_csv,
    "govuk-bank-holidays": parse_govuk_bank_holidays,
}


def parse_payload(fmt: str, content: bytes, *, source: str, default_tz: str | None = None) -> ParseResult:
    """Parse one payload of source ``source`` in format ``fmt`` (a key of :data:`PARSERS`).

    ``default_tz``: the source's configured zone for times written without one (None: such times
    are problems, or floating for ICS). Returns the parser's :class:`ParseResult`. Raises
    :class:`ParseError` when the payload is unusable, and ``ValueError`` (not ParseError: the
    configuration is at fault, not the payload) for an unknown format or an unknown ``default_tz``.
    """
    parser = PARSERS.get(fmt)
    if parser is None:
        raise ValueError(f"source {source!r}: unknown format {fmt!r}; expected one of {', '.join(PARSERS)}")
    if default_tz is not None:
        try:
            resolve_zone(default_tz)
        except UnknownTimeZone as exc:
            raise ValueError(f"source {source!r}: timezone (the zone of times written without one): {exc}") from None
    result = parser(content, source=source, default_tz=default_tz)
    _note_ambiguous_zones(result, default_tz)
    _note_out_of_season(result, default_tz)
    return result


def _note_ambiguous_zones(result: ParseResult, default_tz: str | None) -> None:
    """One note (nothing skipped) per ambiguous zone the rules use — an abbreviation (``CST`` read as US
    Central, say; :func:`~deadline_pipeline.timezones.ambiguous_abbreviation`) or an ``Etc/GMT±N`` read
    with its POSIX sign (:func:`~deadline_pipeline.timezones.inverted_sign`) — with how many rules and
    the first: which reading was meant is a guess, so it is said where the source's records are
    reported, not applied silently. A zone a calendar's VTIMEZONE was matched to (``extra["tzid"]``
    names what was written) is no spelling of the publisher's and has no note."""
    by_zone: dict[str, list[str]] = {}
    for rule in result.rules:
        zone = rule.tz if rule.tz is not None else default_tz
        written = (rule.extra or {}).get("tzid")
        if written is not None and written != rule.tz:
            continue
        if ambiguous_abbreviation(zone) or inverted_sign(zone):
            by_zone.setdefault(zone.strip(), []).append(rule.rule_id)
    for zone, ids in by_zone.items():
        result.problems.append(ParseProblem(
            f"{len(ids)} rule(s), first {ids[0]!r}", ambiguous_abbreviation(zone) or inverted_sign(zone), None,
            skipped=False))


def _note_out_of_season(result: ParseResult, default_tz: str | None) -> None:
    """One note (nothing skipped) per rule written in a seasonal abbreviation read as its fixed offset
    (``PST``: UTC-08:00 all year, :func:`~deadline_pipeline.timezones.seasonal_abbreviation`) at a time
    when the zone it names a season of is on its other time (Los Angeles on PDT in July), at the rule's
    position (its line), naming the abbreviation, the date and the season (:func:`out_of_season`).
    ``default_tz``: the zone of the rules without one (the source's ``timezone``).

    The reading stays the offset as written (``docs/source-formats.md``): which one the publisher meant
    cannot be told, and a different instant is never guessed. But "17:00 PST" on a July date is most
    likely the local clock time written with the wrong abbreviation, due an hour after the deadline meant:
    said where the source's records are reported (``validate``, the ingest log, ``rules_complete``'s
    metadata), not applied silently."""
    positions = result.positions if len(result.positions) == len(result.rules) else [None] * len(result.rules)
    for rule, position in zip(result.rules, positions, strict=True):
        message = out_of_season(rule, default_tz)
        if message:
            result.problems.append(ParseProblem(position or f"rule {rule.rule_id!r}", message, rule.rule_id,
                                                skipped=False))


def out_of_season(rule: RuleRecord, default_tz: str | None = None) -> str | None:
    """For a rule whose ``tz`` (else ``default_tz``) is a seasonal abbreviation read as a fixed offset, a
    sentence on its first
    time out of season: its start, RDATE or EXDATE (a date: due at 23:59:59 of it), else, for an RRULE,
    its first occurrence in :data:`~deadline_pipeline.timezones.EQUIVALENCE_YEARS` at which the
    abbreviation's zone is on its other time. ``None`` when every such time is in season."""
    name = rule.tz if rule.tz is not None else default_tz
    pair = seasonal_abbreviation(name)
    if pair is None:
        return None
    fixed, region = pair
    for what, text in (("start", rule.start), *(("RDATE", t) for t in rule.rdates),
                       *(("EXDATE", t) for t in rule.exdates)):
        wall = _wall(text)
        message = wall and _season_words(name, what, wall.replace(tzinfo=fixed), region)
        if message:
            return message
    if rule.rrule is None:
        return None
    from deadline_pipeline.plan.occurrences import expand

    for start, end, _ours, _theirs in offset_disagreements(fixed, region):
        found = expand(rule, fixed, after=start.replace(tzinfo=fixed), before=end.replace(tzinfo=fixed)
                       - timedelta(seconds=1), limit=1, strict=False)
        if found:
            return _season_words(name, "the RRULE's occurrence", found[0].due_at.astimezone(fixed), region)
    return None


def _wall(text: str) -> datetime | None:
    """A rule's local time (``2027-07-15T12:00:00``), or a date's end (``2027-07-15`` → 23:59:59)."""
    try:
        return (datetime.fromisoformat(text) if "T" in text
                else datetime.combine(date.fromisoformat(text), datetime.max.time()).replace(microsecond=0))
    except ValueError:
        return None


def _season_words(name: str, what: str, instant: datetime, region) -> str | None:
    """``"start 2027-07-15T12:00:00 PST: PST is the standard (winter) time of America/Los_Angeles, …"``
    when ``region`` is on another offset than the abbreviation ``name`` at ``instant`` (aware, in its
    fixed offset), else ``None``."""
    written, local = instant.utcoffset(), instant.astimezone(region)
    if local.utcoffset() == written:
        return None
    abbr = name.strip().upper()
    behind = written < local.utcoffset()
    season = "standard (winter)" if behind else "daylight saving (summer)"
    return (f"{what} {instant.replace(tzinfo=None).isoformat()} {abbr}: {abbr} is the {season} time of "
            f"{region.key}, which is on {local.tzname()} (UTC{utc_offset_text(local.utcoffset())}) on "
            f"{local:%Y-%m-%d}; read as written (UTC{utc_offset_text(written)}), the deadline is "
            f"{duration_words(int(abs(local.utcoffset() - written).total_seconds()))} "
            f"{'later' if behind else 'earlier'} than at that clock time in {region.key}. Write the zone's IANA "
            f"name ({region.key}) if its clock was meant, or {abbr}'s offset (UTC{utc_offset_text(written)}) if "
            "that was")
