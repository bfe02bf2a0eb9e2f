"""The GOV.UK bank-holidays JSON: one ``kind="holiday"`` rule per holiday per division.

Two schemas are read:

* **current** (``https://www.gov.uk/bank-holidays.json``): ``{"england-and-wales": {"division":
  "england-and-wales", "events": [{"title", "date": "YYYY-MM-DD", "notes", "bunting"}]}, ...}``;
* **older** (alphagov/calendars ``lib/data/bank-holidays.json``): ``{"title", ..., "divisions":
  {"england-and-wales": {"2020": [{"title": "bank_holidays.early_may", "date": "DD/MM/YYYY", ...}],
  "slug": "...", "title": "..."}}}`` — titles are translation keys, dates day-first, and each
  division also holds ``slug``/``title`` strings, which are metadata and skipped.

Identity. A holiday's date is exactly what a revision may change (the 2020 Early May bank holiday
moved from 4 to 8 May for VE day), so the date cannot be part of the identity. The rule id is
``{division}/{year}/{name}``: the year (of the date) keeps each year's Christmas apart, and
``name`` is the title normalised to a slug — lower case, a ``bank_holidays.`` key prefix removed,
parenthesised qualifiers dropped (``Early May bank holiday (VE day)`` → ``early_may``), the words
``bank holiday`` dropped, apostrophes removed, other runs of non-alphanumerics turned into ``_`` —
and then mapped through :data:`NAME_ALIASES`, which lists the qualifier *keys* of the older schema
(``early_may_ve``) that mean the same holiday. Hence the 2020 move is one rule whose date changed
(a *moved* rule), not a withdrawal plus an addition. A second holiday with the same name in one
division and year (none exists in the published data) gets ``#2``, ``#3``… in document order,
reported as a problem so that a maintainer can check it.

The two schemas spell names differently (``new_year`` vs ``New Year’s Day`` → ``new_years_day``), so
switching a source from one schema to the other changes most identities; the quarantine then stops
the mass withdrawal until a human accepts it.

``start`` is the ISO date (a date-only rule: the whole local day), ``tz`` is ``None`` (a bank holiday
is a local calendar day wherever the subscriber is), ``kind`` ``"holiday"``; ``extra`` keeps the
division, the title as written, ``notes`` and ``bunting``.
"""

from __future__ import annotations

import json
import re
from datetime import date

from deadline_pipeline.ingest.parsers.base import (
    ParseError,
    ParseProblem,
    ParseResult,
    decode_text,
)
from deadline_pipeline.ingest.parsers.limits import check_json_depth
from deadline_pipeline.rules import RuleRecord

WHAT = "GOV.UK bank-holidays JSON"

#: Older-schema translation keys of a one-year variant of a regular holiday → the regular name.
NAME_ALIASES: dict[str, str] = {
    "early_may_ve": "early_may",  # 2020: moved to Friday 8 May for the 75th anniversary of VE day
}

_KEY_PREFIX = "bank_holidays."
_PARENTHESISED = re.compile(r"\([^)]*\)")
_APOSTROPHES = re.compile(r"['’‘`]")
_NON_ALNUM = re.compile(r"[^a-z0-9]+")
_YEAR_KEY = re.compile(r"^\d{4}$")
_ISO_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$")
_DMY_DATE = re.compile(r"^(\d{2})/(\d{2})/(\d{4})$")


def holiday_name(title: str) -> str:
    """The date-independent name of a holiday title (see the module docstring), e.g.
    ``"Early May bank holiday (VE day)"`` → ``"early_may"``, ``"bank_holidays.early_may_ve"`` →
    ``"early_may"``. Returns ``""`` for a title with no letters or digits."""
    text = title.strip()
    if text.startswith(_KEY_PREFIX):
        text = text[len(_KEY_PREFIX):]
    text = _PARENTHESISED.sub(" ", text).lower()
    text = _APOSTROPHES.sub("", text)
    text = re.sub(r"\bbank[\s_]+holiday\b", " ", text)
    slug = _NON_ALNUM.sub("_", text).strip("_")
    return NAME_ALIASES.get(slug, slug)


def _date(raw: object) -> date:
    """A holiday date in either schema's spelling; raises ValueError naming the value."""
    text = str(raw).strip() if raw is not None else ""
    m = _ISO_DATE.match(text)
    if m:
        y, mo, d = (int(g) for g in m.groups())
    else:
        m = _DMY_DATE.match(text)
        if not m:
            raise ValueError(f"date {raw!r} is neither 'YYYY-MM-DD' nor 'DD/MM/YYYY'")
        d, mo, y = (int(g) for g in m.groups())
    try:
        return date(y, mo, d)
    except ValueError as exc:
        raise ValueError(f"date {raw!r} does not exist: {exc}") from None


def _events(data: dict, source: str, problems: list[ParseProblem]) -> list[tuple[str, str, object]]:
    """(division, position, event) of every event, in document order, for either schema."""
    out: list[tuple[str, str, object]] = []
    if "divisions" in data:  # the older schema
        divisions = data["divisions"]
        if not isinstance(divisions, dict):
            raise ParseError(f"source {source!r}: key 'divisions': expected an object of divisions, "
                             f"got {type(divisions).__name__}")
        for division, years in divisions.items():
            if not isinstance(years, dict):
                problems.append(ParseProblem(f"divisions.{division}", "expected an object of years; skipped",
                                             str(division)))
                continue
            for year, events in years.items():
                if not _YEAR_KEY.match(str(year)):
                    continue  # "slug" and "title": the division's own labels, not holidays
                if not isinstance(events, list):
                    problems.append(ParseProblem(f"divisions.{division}.{year}", "expected a list of holidays",
                                                 f"{division}/{year}"))
                    continue
                out.extend((division, f"divisions.{division}.{year}[{i}]", e) for i, e in enumerate(events))
        return out
    for key, body in data.items():  # the current schema
        if not isinstance(body, dict) or not isinstance(body.get("events"), list):
            problems.append(ParseProblem(key, "expected an object with an 'events' list; skipped"))
            continue
        division = str(body.get("division") or key)
        out.extend((division, f"{key}.events[{i}]", e) for i, e in enumerate(body["events"]))
    return out


def parse_govuk_bank_holidays(content: bytes, *, source: str, default_tz: str | None = None) -> ParseResult:
    """Parse a GOV.UK bank-holidays JSON payload (either schema, see the module docstring).

    ``content``: the payload's bytes (UTF-8). ``source``: the source name, used in messages.
    ``default_tz`` is accepted for the common parser signature and ignored: holidays are calendar
    days, read in each subscriber's zone.

    Returns one :class:`RuleRecord` per holiday; an event without title or with an unreadable date is
    a problem (position ``"england-and-wales.events[3]"``). Raises :class:`ParseError` naming the
    source and the line/column for a payload that is not UTF-8, empty, an HTML page, invalid JSON, or
    not an object of divisions, and when no division holds any event.
    """
    text = decode_text(content, source=source, what=WHAT)
    check_json_depth(text, source=source)  # before json.loads recurses into a RecursionError
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(f"source {source!r}: line {exc.lineno}, column {exc.colno}: invalid JSON: {exc.msg}") \
            from None
    if not isinstance(data, dict):
        raise ParseError(f"source {source!r}: line 1: expected a JSON object of divisions, got {type(data).__name__}")
    result = ParseResult()
    events = _events(data, source, result.problems)
    if not events:
        raise ParseError(f"source {source!r}: line 1: no division holds any holiday; not {WHAT}")
    seen: dict[str, int] = {}
    for division, position, event in events:
        if not isinstance(event, dict):
            result.problems.append(ParseProblem(position, f"expected an object, got {type(event).__name__}",
                                                division))
            continue
        title = str(event.get("title") or "").strip()
        name = holiday_name(title)
        if not name:
            result.problems.append(ParseProblem(position, "holiday has no title; it cannot be identified",
                                                division))
            continue
        try:
            day = _date(event.get("date"))
        except ValueError as exc:
            result.problems.append(ParseProblem(position, str(exc), division))
            continue
        base = f"{division}/{day.year}/{name}"
        seen[base] = seen.get(base, 0) + 1
        rule_id = base if seen[base] == 1 else f"{base}#{seen[base]}"
        if seen[base] > 1:
            result.problems.append(ParseProblem(
                position, f"a second holiday named {name!r} in {division} {day.year}; kept as {rule_id!r}",
                rule_id, skipped=False))
        shown = title[len(_KEY_PREFIX):] if title.startswith(_KEY_PREFIX) else title
        result.add(RuleRecord(
            rule_id=rule_id,
            title=f"{shown} ({division})",
            start=day.isoformat(),
            tz=None,
            kind="holiday",
            note=str(event.get("notes")) if event.get("notes") else None,
            extra={"division": division, "title": title, "notes": event.get("notes"),
                   "bunting": event.get("bunting")},
        ), position)
    return result
