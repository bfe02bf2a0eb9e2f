"""A plain CSV of deadlines, for sources kept by hand in a spreadsheet.

Header (names are matched case-insensitively, surrounding spaces ignored; a name given twice refuses
the payload)::

    title,due,timezone[,id][,rrule][,url][,note]

* ``due``: ISO 8601 local date (``2024-04-15``, the end of that day) or date-time
  (``2024-04-15T17:00`` / ``2024-04-15 17:00:00``), without offset. Nothing else is accepted — a
  ``12.07.2022`` is refused rather than guessed, because day-first and month-first readings of the
  same column silently disagree.
* ``timezone``: as :func:`~deadline_pipeline.timezones.resolve_zone` accepts; an empty cell takes
  ``default_tz``, and without one the row is a problem (never UTC).
* ``rule_id``: the ``id`` cell when the column exists and the cell is filled, else the ``title``.
  Title-based identity is documented as fragile: renaming a row makes it a new rule.
* ``rrule``: an RFC 5545 RECUR value (``FREQ=YEARLY;BYMONTH=4;BYMONTHDAY=15``), ``RRULE:`` prefix
  optional, checked for shape only.
"""

from __future__ import annotations

import csv
import io
import re
from datetime import date, datetime

import pandas as pd

from deadline_pipeline.ingest.parsers.base import (
    ParseError,
    ParseProblem,
    ParseResult,
    check_recur,
    decode_text,
    drop_duplicate_ids,
)
from deadline_pipeline.ingest.parsers.limits import MAX_CSV_ROWS
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.timezones import UnknownTimeZone, resolve_zone
from deadline_pipeline.wording import near_name

WHAT = "CSV with a 'title,due,timezone' header"
REQUIRED = ("title", "due", "timezone")
OPTIONAL = ("id", "rrule", "url", "note")
_ISO_LOCAL = re.compile(r"^\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?)?$")


def parse_due(text: str) -> str:
    """Normalise an ISO local date or date-time to the rule's ``start`` form.

    Returns ``YYYY-MM-DD`` or ``YYYY-MM-DDTHH:MM:SS``. Raises ``ValueError`` naming the value for
    any other spelling, an offset, or a date that does not exist.
    """
    value = text.strip()
    if not _ISO_LOCAL.match(value):
        raise ValueError(f"due {text!r} is not an ISO local date or date-time (YYYY-MM-DD[THH:MM[:SS]])")
    try:
        if len(value) == 10:
            return date.fromisoformat(value).isoformat()
        return datetime.fromisoformat(value.replace(" ", "T")).isoformat(timespec="seconds")
    except ValueError as exc:
        raise ValueError(f"due {text!r} does not exist: {exc}") from None


def parse_csv(content: bytes, *, source: str, default_tz: str | None = None) -> ParseResult:
    """Parse a deadlines CSV (see the module docstring) into ``kind="deadline"`` rules.

    ``content``: UTF-8 bytes. ``source``: the source name, used in messages. ``default_tz``: zone
    for rows with an empty ``timezone`` cell.

    Bad rows are problems positioned ``"line N"`` (the physical line a row starts on, header = line 1;
    a quoted cell may span lines). Two rows with one id keep
    the one due first (:func:`~.base.drop_duplicate_ids`). Raises :class:`ParseError` for
    undecodable, empty or HTML payloads, a header missing a required column or naming one twice, and
    malformed CSV (e.g. a row with more cells than the header).
    """
    text = decode_text(content, source=source, what=WHAT)
    _refuse_other_delimiter(text, source)
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, skip_blank_lines=True)
    except pd.errors.EmptyDataError:
        raise ParseError(f"source {source!r}: line 1: empty payload, expected {WHAT}") from None
    except Exception as exc:  # noqa: BLE001 — pandas raises ParserError, ValueError, csv.Error…
        line = re.search(r"line (\d+)", str(exc))
        row = re.search(r"row (\d+)", str(exc))
        where = f"line {line.group(1)}" if line else f"data row {row.group(1)}" if row else "position unknown"
        raise ParseError(f"source {source!r}: {where}: malformed CSV: {exc}") from None
    if len(frame) > MAX_CSV_ROWS:
        raise ParseError(f"source {source!r}: line {MAX_CSV_ROWS + 2}: more than {MAX_CSV_ROWS:,} data rows "
                         "(limit of this reader)")
    _refuse_repeated_columns(text, source)
    frame.columns = [column_name(c) for c in frame.columns]
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise ParseError(
            f"source {source!r}: line 1: CSV header lacks required column(s) {', '.join(missing)}; "
            f"found {', '.join(frame.columns)}"
        )
    _refuse_misspelt_rrule(frame.columns, source)
    result = ParseResult()
    line_of = _row_lines(text, result.problems)
    for index, row in enumerate(frame.to_dict("records")):
        line = line_of[index] if index < len(line_of) else index + 2
        cell = {k: (str(v).strip() if v is not None else "") for k, v in row.items()}
        position = f"line {line}"
        title = cell["title"]
        rid = cell.get("id") or title or None  # the rule id this row would have had, if readable
        if not title:
            result.problems.append(ParseProblem(position, "empty title", rid))
            continue
        try:
            start = parse_due(cell["due"])
        except ValueError as exc:
            result.problems.append(ParseProblem(position, str(exc), rid))
            continue
        tz = cell["timezone"] or default_tz
        if tz is None:
            result.problems.append(ParseProblem(
                position, "empty timezone, and the source sets no `timezone` for times written without one", rid))
            continue
        try:
            resolve_zone(tz)
        except UnknownTimeZone as exc:
            result.problems.append(ParseProblem(position, str(exc), rid))
            continue
        rrule = cell.get("rrule") or None
        if rrule:
            rrule = re.sub(r"^RRULE:", "", rrule, flags=re.IGNORECASE)
            message = check_recur(rrule)
            if message:
                result.problems.append(ParseProblem(position, message, rid))
                continue
        result.add(RuleRecord(
            rule_id=cell.get("id") or title,
            title=title,
            start=start,
            tz=tz,
            rrule=rrule,
            kind="deadline",
            url=cell.get("url") or None,
            note=cell.get("note") or None,
            # No line number in extra: it is part of the content hash, and moving a row is no change.
            extra={},
        ), position)
    return drop_duplicate_ids(result)


def column_name(raw: object) -> str:
    """A header name as the parser matches it: surrounding spaces removed, lower case."""
    return str(raw).strip().lower()


def _refuse_repeated_columns(text: str, source: str) -> None:
    """Raise :class:`ParseError` when the header names one column twice (after :func:`column_name`).

    The header is read as written (pandas renames a repeated ``due`` to ``due.1`` and the parser then
    used the first one without a word, so a sheet whose second ``due`` column held the real dates
    was planned on the other's). Which of the two the publisher meant cannot be told, and the header
    governs every row, so the whole payload is refused.
    """
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not lines:
        return
    number = lines[0][0]
    # Universal newlines: a sheet saved with CR line ends (Excel's "CSV (Macintosh)") made csv raise
    # "new-line character seen in unquoted field" here, and the whole payload failed unexplained.
    header = next(csv.reader(io.StringIO(text[text.index(lines[0][1]):], newline=None)), [])
    seen: dict[str, int] = {}
    repeats = []
    for column, raw in enumerate(header, start=1):
        name = column_name(raw)
        if not name:
            continue
        if name in seen:
            repeats.append(f"{name!r} (columns {seen[name]} and {column})")
        else:
            seen[name] = column
    if repeats:
        raise ParseError(f"source {source!r}: line {number}: CSV header names a column twice: {', '.join(repeats)} "
                         "(names are compared ignoring case and surrounding spaces); which one holds the data "
                         "cannot be told, so the payload is refused")


_OTHER_DELIMITERS = {";": "semicolon", "\t": "tab"}


def _refuse_other_delimiter(text: str, source: str) -> None:
    """Raise :class:`ParseError` when the header is not comma-separated but semicolon- or tab-separated.

    A spreadsheet saved in a locale whose decimal mark is the comma writes ``id;title;due;timezone``
    (and some exports use tabs). Read with commas the header is one column and the payload was
    refused as lacking ``title``, ``due`` and ``timezone`` while listing them all — or, when a cell
    held commas, as "malformed CSV" — never saying the separator was the fault. This reader has no
    delimiter setting (a parse depends on the payload alone), so the message asks for commas.
    """
    first = next((line for line in text.splitlines() if line.strip()), "")
    header = {column_name(c) for c in next(csv.reader([first]), [])}
    if all(c in header for c in REQUIRED):
        return
    for delimiter, name in _OTHER_DELIMITERS.items():
        cells = {column_name(c) for c in first.split(delimiter)}
        if delimiter in first and any(c in cells for c in REQUIRED):
            number = text.splitlines().index(first) + 1
            raise ParseError(f"source {source!r}: line {number}: CSV header {first.strip()!r} looks {name}-separated; "
                             f"this reader expects commas ({','.join(REQUIRED)}); save the file as comma-separated "
                             "CSV (in a spreadsheet: 'CSV UTF-8 (Comma delimited)')")


def _refuse_misspelt_rrule(columns, source: str) -> None:
    """Raise :class:`ParseError` for a header without ``rrule`` but with a column close to it (``rrul``,
    ``rule``, ``rrules``). Columns this reader does not know are ignored, so with ``rrul`` every
    recurring row was planned once, at its first date, and ``validate`` and every check said OK: the
    later occurrences were never reminded. The header governs every row, so the payload is refused."""
    if "rrule" in columns:
        return
    close = [c for c in columns if c not in REQUIRED + OPTIONAL
             and near_name(c, ["rrule"])]
    if close:
        raise ParseError(f"source {source!r}: line 1: CSV header column {close[0]!r} is not one this reader knows; did "
                         "you mean 'rrule'? Its cells would be ignored and each row planned once, so the payload is "
                         "refused (rename the column)")


def _row_lines(text: str, problems: list[ParseProblem]) -> list[int]:
    """The physical line each data row starts on (header = line 1), in the order pandas reads the rows.

    Counted with :mod:`csv` over the text's lines (ended by LF, CR LF or CR): a quoted cell
    spanning lines counts each of them, and a blank or whitespace-only line is no row (pandas'
    ``skip_blank_lines``). Counting physical lines alone put every message after a multi-line note a
    line too early, naming a neighbouring row. :mod:`csv` refuses some texts pandas reads (a cell
    over its field size limit, 128 KiB): their rows are numbered by non-blank lines, and a note
    appended to ``problems`` says so."""
    reader = csv.reader(io.StringIO(text, newline=None))
    starts: list[int] = []
    start = 1
    try:
        for row in reader:
            if len(row) > 1 or any(cell.strip() for cell in row):
                starts.append(start)
            start = reader.line_num + 1
    except csv.Error as exc:
        problems.append(ParseProblem("line 1", (
            f"rows are numbered by lines, not as read (line {reader.line_num}: {exc}): after a quoted cell "
            "spanning lines, the line named for a row is too early"), skipped=False))
        return [n for n, line in enumerate(text.splitlines(), start=1) if line.strip()][1:]
    return starts[1:]
