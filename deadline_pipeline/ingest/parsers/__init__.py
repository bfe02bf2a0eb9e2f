"""Source parsers: bytes of one fetched payload in, :class:`ParseResult` out.

``PARSERS`` maps a source format (as named in the configuration) to its parser; every parser has
the signature ``(content: bytes, *, source: str, default_tz: str | None = None) -> ParseResult``
and raises :class:`ParseError` only when the whole payload is unusable (see :mod:`.base`).
"""

from __future__ import annotations

from collections.abc import Callable

from deadline_pipeline.ingest.parsers.aideadlines import parse_ai_deadlines
from deadline_pipeline.ingest.parsers.base import ParseError, ParseProblem, ParseResult
from deadline_pipeline.ingest.parsers.csv_format import parse_csv
from deadline_pipeline.ingest.parsers.govuk import parse_govuk_bank_holidays
from deadline_pipeline.ingest.parsers.ics import parse_ics
from deadline_pipeline.timezones import UnknownTimeZone, ambiguous_abbreviation, resolve_zone

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
            raise ValueError(f"source {source!r}: default_tz: {exc}") from None
    result = parser(content, source=source, default_tz=default_tz)
    _note_ambiguous_zones(result, default_tz)
    return result


def _note_ambiguous_zones(result: ParseResult, default_tz: str | None) -> None:
    """One note (nothing skipped) per ambiguous zone abbreviation the rules use (``CST`` read as US
    Central, say), with how many rules and the first: the reading is a guess, so it is said where the
    source's records are reported, not applied silently."""
    by_zone: dict[str, list[str]] = {}
    for rule in result.rules:
        zone = rule.tz if rule.tz is not None else default_tz
        if ambiguous_abbreviation(zone):
            by_zone.setdefault(zone.strip(), []).append(rule.rule_id)
    for zone, ids in by_zone.items():
        result.problems.append(ParseProblem(
            f"{len(ids)} rule(s), first {ids[0]!r}", ambiguous_abbreviation(zone), None, skipped=False))
