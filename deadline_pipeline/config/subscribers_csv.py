"""Reading the subscriber file (``subscribers_csv``): rows with the line each starts on."""

from __future__ import annotations

import logging
from pathlib import Path

from deadline_pipeline.config.encoding import first_non_utf8, not_utf8
from deadline_pipeline.config.errors import ConfigError
from deadline_pipeline.config.messages import did_you_mean
from deadline_pipeline.config.sections import SubscriberConfig

log = logging.getLogger(__name__)


#: Largest subscriber file read (bytes); it is read up to this and refused beyond (``/dev/zero``
#: once grew the process to 4 GB before failing). Rows: ``deadline_pipeline.limits.MAX_CSV_ROWS``.
MAX_SUBSCRIBERS_BYTES = 64 * 1024 * 1024


def _csv_layout(data: bytes, path: Path) -> tuple[int, list[str], list[int]]:
    """``(header line, header names as written, first line of each record)`` of a subscriber file,
    lines counted from 1 in the file as a text editor shows it. Blank and whitespace-only lines are
    skipped as pandas skips them; a quoted value may span lines, so a record is numbered by the line
    it starts on. Counting pandas records instead put every message after a blank line or a
    multi-line value on the wrong line.

    Raises :class:`ConfigError` for a row with more or fewer fields than the header
    (``line 7: 6 fields, the header has 5``). With more, pandas takes the surplus first field as the
    row's index and shifts every other value one column left, so the error named the wrong column (an
    id read as a tenant, an address as a zone), or none at all. With fewer, pandas left the missing
    cells empty and the subscriber silently got their defaults (timezone UTC for a row cut short); a
    cell present but empty (``a,demo,,,UTC``) still stands for "not given" (not for ``timezone``:
    :func:`_refuse_empty_zones`).
    ``data`` is UTF-8 (:func:`_refuse_undecodable` has refused any other file)."""
    import csv
    import io

    header_line, header, starts, problems = 0, [], [], []
    try:
        reader = csv.reader(io.StringIO(data.decode("utf-8-sig"), newline=""))
        end = 0
        for row in reader:
            start, end = end + 1, reader.line_num
            # pandas skips an empty or whitespace-only line, not a quoted empty value ("").
            if not row or (len(row) == 1 and row[0] != "" and not row[0].strip()):
                continue
            if not header_line:
                header_line, header = start, row
                continue
            starts.append(start)
            if len(row) != len(header):
                problems.append(f"{path}: line {start}: {len(row)} fields, the header has {len(header)}")
    except csv.Error as exc:  # a field over the reader's limit (131,072 characters), which pandas reads
        raise ConfigError(f"{path}: line {reader.line_num}: not a readable CSV row: {exc}") from None
    if problems:
        raise ConfigError("\n".join(problems[:20]) + (f"\n… and {len(problems) - 20} more row(s)" if len(problems) > 20
                                                       else ""))
    return header_line, header, starts


def _refuse_undecodable(data: bytes, path: Path) -> None:
    """Return when the subscriber file ``data`` is UTF-8 (a byte order mark allowed); else raise
    :class:`ConfigError` naming ``path``, the line, the column (number and header name) and the byte
    that is not UTF-8, e.g. ``subs.csv: line 4, column 2 (tenant): byte 0xff is not UTF-8 (invalid
    start byte); save the file as UTF-8`` (:func:`first_non_utf8`).

    pandas' own message gave a byte offset from the start of the file ("position 4711"), which no
    editor shows, so the one bad row of a thousand could not be found."""
    import csv
    import io

    found = first_non_utf8(data, path)
    if found is None:
        return
    bad, line, start = found
    # The fields before the bad byte on its line, read as CSV (the bytes before it decode), give its column.
    before = data[start:bad.start].decode("utf-8-sig", "replace")
    field = len(next(csv.reader(io.StringIO(before)), [""])) if before else 1
    header = next(csv.reader(io.StringIO(data[:data.find(b"\n")].decode("utf-8-sig", "replace"))), [])
    name = f" ({header[field - 1].strip()})" if line > 1 and field <= len(header) else ""
    raise not_utf8(path, data, bad, f"line {line}, column {field}{name}") from None


def _subscriber_columns(header: list[str], header_line: int, path: Path) -> list[str]:
    """The header's names without surrounding spaces (a removal is logged), one per column.

    Raises :class:`ConfigError` naming the file, line and column for a name that is not a
    subscriber field, a nameless column or a name given twice. An unknown column was once skipped
    without a word: ``tenant `` or ``tenat`` left every subscriber in tenant ``default``, never
    planned for its sources' tenant while every check stayed green."""
    known = list(SubscriberConfig.model_fields)
    names, problems = [], []
    for n, raw in enumerate(header, start=1):
        name = raw.strip()
        if name != raw:
            log.warning("%s: line %d: column name %r: spaces around it removed", path, header_line, raw)
        if not name:
            problems.append(f"column {n} has no name")
        elif name in names:
            problems.append(f"column {n}: {name!r} repeats column {names.index(name) + 1}")
        elif name not in SubscriberConfig.model_fields:
            problems.append(f"column {n}: unknown column {name!r}"
                            + did_you_mean(name, ("subscribers", 0, name)))
        names.append(name)
    if problems:
        raise ConfigError("\n".join(f"{path}: line {header_line}: {p}" for p in problems)
                          + f"\n{path}: the columns a subscriber file may have are {', '.join(known)}")
    return names


def read_subscribers_csv(path: Path, config_path: Path) -> list[tuple[int, dict]]:
    """``(line, row)`` per subscriber of the CSV file ``path``: the line the record starts on and its
    non-empty values by column, spaces around them removed (logged). Raises :class:`ConfigError`
    naming ``path`` (and the line) for an unreadable or oversized file, a header that is not made of
    subscriber fields, no rows, a row with too many or too few fields, or a repeated id."""
    data = _read_bytes(path, config_path)
    _refuse_undecodable(data, path)
    header_line, header, lines = _csv_layout(data, path)
    _refuse_no_rows(header_line, lines, path, config_path)
    records = _read_records(data, path, config_path, header, lines)
    columns = _subscriber_columns(header, header_line, path)
    missing = {"id", "timezone"} - set(columns)
    if missing:
        raise ConfigError(f"{path}: line {header_line}: missing column(s) {sorted(missing)}; "
                          f"the columns are {', '.join(SubscriberConfig.model_fields)}")
    rows = [(line, clean_row(dict(zip(columns, values, strict=True)), line, path))
            for line, values in zip(lines, records, strict=True)]
    _refuse_empty_zones(rows, path)
    repeats = repeated_ids(rows, path)
    if repeats:
        # Named here, with lines: checked after merging, a repeat was reported against the
        # configuration file, which does not hold it.
        raise ConfigError("\n".join(repeats[:20]) + (f"\n… and {len(repeats) - 20} more" if len(repeats) > 20
                                                     else ""))
    return rows


def _refuse_empty_zones(rows: list[tuple[int, dict]], path: Path) -> None:
    """Raise :class:`ConfigError` naming ``path``, the line and the id of every row (``(line, row)``)
    whose ``timezone`` cell is empty. The column is required, but an empty cell stood for "not given"
    and the subscriber silently got UTC: a subscriber in Auckland had a date-only deadline fall due at
    23:59 UTC, 12:59 the next day in Auckland, so its reminders came half a day late."""
    empty = [f"{path}: line {line} (id {row.get('id')!r}), column timezone: empty; write the subscriber's IANA "
             "zone (UTC if that is meant): date-only and floating deadlines fall due in it"
             for line, row in rows if "timezone" not in row]
    if empty:
        raise ConfigError("\n".join(empty[:20]) + (f"\n… and {len(empty) - 20} more row(s)" if len(empty) > 20
                                                   else ""))


def _refuse_no_rows(header_line: int, lines: list[int], path: Path, config_path: Path) -> None:
    """Raise :class:`ConfigError` naming ``path`` when the subscriber file has no header (it is empty
    or blank) or a header and no row (``lines``, the first line of each record, is empty).

    Such a file was accepted, and planning later failed inside a Dagster step with a traceback
    (``NothingToPlan: subscribers: none configured``), or, for an empty file, the loader showed
    pandas' ``No columns to parse from file``."""
    remove = f"or remove subscribers_csv from {config_path}"
    if not header_line:
        raise ConfigError(f"{path}: is empty; add a header line and subscriber rows, {remove}")
    if not lines:
        raise ConfigError(f"{path}: holds no subscriber rows, only its header; add rows, {remove}")


class SubscriberFileUnreadable(ConfigError):
    """The subscriber file cannot be read at all (missing, unreadable, larger than the limit).

    ``reason`` says what is wrong with the file, naming its path (``file /x/subs.csv does not exist``);
    the message prefixes the configuration file and its ``subscribers_csv`` key. The loader reports it
    with the key's line, together with the configuration's other errors: raised first, it hid them."""

    def __init__(self, config_path: Path, reason: str) -> None:
        super().__init__(f"{config_path}: subscribers_csv: {reason}")
        self.reason = reason


def _read_bytes(path: Path, config_path: Path) -> bytes:
    """The subscriber file's bytes, at most :data:`MAX_SUBSCRIBERS_BYTES`. Raises
    :class:`SubscriberFileUnreadable` for a missing, unreadable or larger file."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_SUBSCRIBERS_BYTES + 1)
    except FileNotFoundError:
        raise SubscriberFileUnreadable(config_path, f"file {path} does not exist") from None
    except OSError as exc:
        raise SubscriberFileUnreadable(config_path, f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_SUBSCRIBERS_BYTES:
        raise SubscriberFileUnreadable(config_path, f"{path} is larger than {MAX_SUBSCRIBERS_BYTES:,} bytes "
                                                    "(limit of the subscriber file)")
    return data


def _read_records(data: bytes, path: Path, config_path: Path, header: list[str], lines: list[int]) -> list[list[str]]:
    """The data records of the UTF-8 CSV ``data`` as read by pandas (every value text, none missing),
    one list of values per record in column order. Raises :class:`ConfigError` for a file pandas cannot
    read, more than ``MAX_CSV_ROWS`` rows, or records and columns that differ from the line count of
    :func:`_csv_layout` (``header``, ``lines``)."""
    import io

    import pandas as pd

    from deadline_pipeline.limits import MAX_CSV_ROWS

    try:
        frame = pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False)
    except Exception as exc:  # pandas raises several parser error types
        raise ConfigError(f"{config_path}: subscribers_csv: {path} is not a readable CSV file: {exc}") from None
    if len(frame) > MAX_CSV_ROWS:
        raise ConfigError(f"{config_path}: subscribers_csv: {path} has more than {MAX_CSV_ROWS:,} rows "
                          "(limit of the subscriber file)")
    if len(lines) != len(frame) or len(header) != len(frame.columns):
        # Never print a line number that may be wrong: refuse what the two readers see differently.
        raise ConfigError(f"{path}: cannot tell which line each record is on ({len(frame)} record(s) read, "
                          f"{len(lines)} counted); a line holding only a quoted blank value (\" \") is one "
                          "cause: remove it")
    return frame.values.tolist()


def clean_row(record: dict[str, str], line: int, path: Path) -> dict[str, str]:
    """``record`` (column → text) without its empty values, spaces around each value removed; each
    removal is logged with ``path``, ``line`` and the column."""
    row = {}
    for k, v in record.items():
        if v != v.strip():
            # "carl ," stored the id "carl " that `subscribers: [carl]` then did not find; a
            # spreadsheet's padding is never meant as part of an id, zone, address or URL.
            log.warning("%s: line %d: column %s: spaces around %r removed", path, line, k, v)
            v = v.strip()
        if v != "":
            row[k] = v
    return row


def repeated_ids(rows: list[tuple[int, dict]], path: Path) -> list[str]:
    """``FILE: line N: id 'x' repeats line M`` for every row of ``rows`` (``(line, row)``) whose id an
    earlier row has, in order; rows without an id are not compared. Empty when none repeats."""
    first_line: dict[str, int] = {}
    repeats = []
    for line, row in rows:
        ident = row.get("id")
        if ident is None:
            continue
        if ident in first_line:
            repeats.append(f"{path}: line {line}: id {ident!r} repeats line {first_line[ident]}")
        else:
            first_line[ident] = line
    return repeats
