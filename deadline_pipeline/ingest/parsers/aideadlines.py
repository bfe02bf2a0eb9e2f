"""The ai-deadlines conference YAML: a list of conference editions, each with its deadlines.

Two forms of entry are read, and may be mixed in one file:

* **flat**: ``{title, year, id, deadline, abstract_deadline?, timezone, link?, note?, ...}``;
  ``deadline`` gives the rule ``{id}/submission/deadline`` and ``abstract_deadline`` the rule
  ``{id}/abstract/abstract_deadline``;
* **typed**: ``{title, year, id, deadlines: [{type, label, date, timezone}], ...}``; each item gives
  the rule ``{id}/{type}/{label}``. The label is part of the identity because one edition may list
  the same type twice (two submission rounds). When an entry has ``deadlines``, a flat
  ``deadline``/``abstract_deadline`` key that copies one of its items (a ``paper`` or ``submission``
  item, an ``abstract`` one, at the same wall time and, when the entry has a zone, instant) is a
  legacy copy and read no further: such files keep them without a time zone. One that copies no
  item is read as in a flat entry, with a note naming the key.

Times are kept as written: ``start`` is the local wall-clock time (``2024-06-15T23:59:00``; a
date-only value stays a date, meaning the end of that day) and ``tz`` the zone as the source spelled
it (``AoE``, ``UTC-12``, ``GMT+8``, ``PDT``, ``America/Los_Angeles``), checked with
:func:`~deadline_pipeline.timezones.resolve_zone`. A deadline without a zone takes ``default_tz``
when given and is otherwise a problem: a time without zone is never read as UTC.

A key written twice in one mapping (``date:`` twice in an item, ``deadline:`` twice in a flat entry)
is found on the composed YAML (:func:`~.limits.repeated_keys`, as for the configuration) and skips
its record — the item, or the whole entry when the key is at the entry's level — naming both lines:
the loader alone keeps the last value and drops the first without a word. Two deadlines with one
rule id keep the one due first (:func:`~.base.drop_duplicate_ids`).

An entry without any deadline (no ``deadline``, ``deadlines: []``) is "not announced yet", the
published files' convention (:attr:`~.base.ParseProblem.unannounced`); one that holds a date under a key
this reader does not read (``paper_deadline:``) is skipped, as is one with a key close to a deadline
key (``abstract_deadlin``): ignored, the deadline under it would never be planned.
"""

from __future__ import annotations

import re
from datetime import datetime

import yaml

from deadline_pipeline.ingest.parsers.base import (
    ParseError,
    ParseProblem,
    ParseResult,
    decode_text,
    drop_duplicate_ids,
)
from deadline_pipeline.ingest.parsers.limits import RepeatedKey, SafeLoader, load_yaml, repeated_keys
from deadline_pipeline.rules import RuleRecord, parse_local, selected_kinds
from deadline_pipeline.timezones import UnknownTimeZone, resolve_zone
from deadline_pipeline.wording import near_name

WHAT = "ai-deadlines YAML"

# Labels of the two flat keys, worded like the typed items of the same files.
FLAT_KEYS: tuple[tuple[str, str, str], ...] = (
    ("deadline", "submission", "Paper Submission"),
    ("abstract_deadline", "abstract", "Abstract Submission"),
)

# Lenient on digit counts ('2022-5-13 23:59:59' occurs in the data) and on missing seconds
# ('2023-03-24 23:59'), strict on everything else: no offsets, no month names, no day-first orders.
_LOCAL = re.compile(
    r"^(?P<y>\d{4})-(?P<mo>\d{1,2})-(?P<d>\d{1,2})"
    r"(?:[ T](?P<h>\d{1,2}):(?P<mi>\d{2})(?::(?P<s>\d{2}))?)?$"
)


class _Loader(SafeLoader):
    """Safe YAML with YAML 1.2 scalars and the nesting limit (:class:`~.limits.SafeLoader`).

    Without implicit timestamps dates and times reach us exactly as written (the YAML 1.1 resolver
    turns ``2024-06-15 23:59:59`` into a ``datetime`` but leaves ``2024-06-15 23:59`` a string), and
    without sexagesimal numbers an unquoted ``timezone: -12:00`` stays ``"-12:00"`` (YAML 1.1 read it
    as -720, then UTC-07:20).
    """


def normalise_local(value: object) -> str:
    """Normalise a written local time to ``YYYY-MM-DDTHH:MM:SS``, or a date to ``YYYY-MM-DD``.

    Accepts ``'2024-06-15 23:59'``, ``'2024-06-15 23:59:59'``, ``'2024-6-5T23:59:59'`` and
    ``'2024-06-15'``. Raises ``ValueError`` naming the value for anything else (``TBA``, offsets,
    impossible dates such as 2024-02-30).
    """
    text = str(value).strip() if value is not None else ""
    m = _LOCAL.match(text)
    if not m:
        raise ValueError(f"date {value!r} is not 'YYYY-MM-DD[ HH:MM[:SS]]'")
    parts = {k: int(v) for k, v in m.groupdict().items() if v is not None}
    try:
        moment = datetime(parts["y"], parts["mo"], parts["d"], parts.get("h", 0), parts.get("mi", 0),
                          parts.get("s", 0))
    except ValueError as exc:
        raise ValueError(f"date {value!r} does not exist: {exc}") from None
    if m.group("h") is None:
        return moment.date().isoformat()
    return moment.isoformat(timespec="seconds")


def _load(text: str, source: str) -> tuple[list, list]:
    """Load the YAML list and the composed node of each entry; raise ParseError if unusable."""
    try:
        data, node = load_yaml(text, source=source, loader=_Loader)
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text, source) from None
    if not isinstance(data, list):
        raise ParseError(
            f"source {source!r}: line 1: expected a YAML list of conference entries, "
            f"got {type(data).__name__}"
        )
    return data, list(node.value)


def _reader_error(exc: yaml.reader.ReaderError, text: str, source: str) -> ParseError:
    """A ParseError for a character YAML forbids (NUL and other control characters)."""
    before = text[: exc.position]
    line = before.count("\n") + 1
    column = exc.position - (before.rfind("\n") + 1) + 1
    char = f"U+{exc.character:04X}" if isinstance(exc.character, int) else repr(exc.character)
    return ParseError(f"source {source!r}: line {line}, column {column}: invalid YAML: "
                      f"character {char} is not allowed")


def _zone(raw: object, fallback: str | None) -> str:
    """The zone as spelled, checked; raises ValueError (UnknownTimeZone) with the reason."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        if fallback is None:
            raise UnknownTimeZone("no timezone given, and the source sets no `timezone` for times written without one")
        return fallback
    name = str(raw).strip()
    resolve_zone(name)
    return name


def parse_ai_deadlines(content: bytes, *, source: str, default_tz: str | None = None) -> ParseResult:
    """Parse one ai-deadlines YAML file (flat or typed entries, see the module docstring).

    ``content``: the file's bytes (UTF-8). ``source``: the source name, used in messages.
    ``default_tz``: zone for deadlines written without one; without it they are problems.

    Returns a :class:`ParseResult` with one ``kind="deadline"`` :class:`RuleRecord` per deadline,
    ``title`` ``"ICLR 2025 — Paper Submission"``, ``url`` from ``link``, ``note`` the raw ``note``
    (may hold HTML; escaped when rendered) and ``extra`` = ``{edition_id, conference, year,
    deadline_type, label}``. Entries without ``id``, unknown zones and unreadable dates are problems
    (position ``"entry 3 (id=cvpr24, line 40)"``). Raises :class:`ParseError` when the payload is not
    UTF-8, empty, an HTML page, invalid YAML (message with line and column) or not a list.
    """
    text = decode_text(content, source=source, what=WHAT)
    entries, nodes = _load(text, source)
    result = ParseResult()
    for index, (entry, node) in enumerate(zip(entries, nodes, strict=True), start=1):
        line = node.start_mark.line + 1
        if not isinstance(entry, dict):
            result.problems.append(ParseProblem(
                f"entry {index} (line {line})", f"expected a mapping, got {type(entry).__name__}"))
            continue
        edition = entry.get("id")
        if edition is None or not str(edition).strip():
            result.problems.append(ParseProblem(
                f"entry {index} (line {line})", "entry has no 'id'; its deadlines cannot be identified"))
            continue
        edition = str(edition).strip()
        position = f"entry {index} (id={edition}, line {line})"
        before = len(result.problems)
        repeats = repeated_keys(node)
        # A key written twice at the entry's level (``deadline``, ``timezone``, ``id``…) touches every
        # deadline of the entry; one written twice inside a deadlines item touches that item alone.
        in_items: dict[int, list[RepeatedKey]] = {}
        for r in repeats:
            if len(r.path) > 2 and r.path[0] == "deadlines" and isinstance(r.path[1], int):
                in_items.setdefault(r.path[1] + 1, []).append(r)
        at_entry = [r for r in repeats if r.path[0] != "deadlines" or len(r.path) <= 2]
        misspelt = _misspelt_keys(entry) or _date_under_unread_key(entry)
        if at_entry:
            result.problems.append(ParseProblem(position, _repeated_message(at_entry, "entry")))
        elif misspelt:
            result.problems.append(ParseProblem(position, misspelt))
        else:
            _read_entry(entry, node, edition, position, default_tz, result, in_items)
        for p in result.problems[before:]:
            # Every rule of the entry is named "{edition}/…"; with ``id`` itself written twice, which
            # edition it is cannot be told, so it may be any rule the snapshot lacks.
            p.record_id = None if any(r.path == ("id",) for r in at_entry) else edition
    return drop_duplicate_ids(result)


#: The keys whose values are deadlines or their zone: one misspelt is a deadline lost.
_DEADLINE_KEYS = ("deadline", "abstract_deadline", "deadlines", "timezone")
#: The keys of a ``deadlines`` item that hold its date and its zone. A misspelt ``timezone`` in an
#: item was worse than lost: the entry's zone stood in, so ``timezon: UTC+8`` under ``timezone: UTC-12``
#: was due 20 hours late with every check green.
_ITEM_KEYS = ("date", "timezone")


def _misspelt_keys(mapping: dict, keys: tuple[str, ...] = _DEADLINE_KEYS, what: str = "entry") -> str | None:
    """Why a ``mapping`` (``what``: an ``"entry"``, or a ``"deadline"`` item with ``keys`` =
    :data:`_ITEM_KEYS`) with a key close to one of ``keys`` it lacks (``abstract_deadlin``,
    ``deadlnes``, ``timezon``) is skipped, else None. Keys this reader does not know are ignored, so
    the deadline under such a key was never planned (or, for an item's zone, was read in the entry's)
    while ``validate`` and every check said OK; skipped, the rules keep their last good version and
    ``rules_complete`` names the key. No key of the published ai-deadlines files is that close to one
    of them."""
    found = []
    for key in mapping:
        if not isinstance(key, str) or key in keys:
            continue
        # 0.8, not the usual 0.75: the published files' own extra keys stay below it.
        close = near_name(key, [k for k in keys if k not in mapping], cutoff=0.8)
        if close:
            found.append(f"{key!r} (did you mean {close!r}?)")
    if not found:
        return None
    return (f"unknown key {', '.join(found)}: what it holds would be ignored, so the {what} is skipped "
            "- correct the key")


#: Keys of the published files that hold a date but no deadline: the conference's own days
#: (``start``, ``end``) and the review calendar some editions list (CVPR's).
NOT_DEADLINE_DATES = ("start", "end", "review_release_date", "rebuttal_period_end", "final_decision_date")


def _date_under_unread_key(entry: dict) -> str | None:
    """Why an entry that announces no deadline this reader reads (no ``deadline``, no
    ``abstract_deadline``, ``deadlines`` absent, null or empty) but holds a date under another key
    is skipped, else None.

    A key is suspect when its name contains ``deadline`` or ``due`` or its value reads as a date or
    date-time (:func:`normalise_local`), except the keys of :data:`_DEADLINE_KEYS` and
    :data:`NOT_DEADLINE_DATES`. Such an entry (``paper_deadline: '2027-06-01 23:59:59'``) was taken for
    "not announced yet": nothing planned, every check green. Skipped, the edition's rules keep their
    last good version and ``rules_complete`` turns red naming the key and its value. An entry with no
    date at all stays "not announced yet", the format's convention."""
    if entry.get("deadline") is not None or entry.get("abstract_deadline") is not None or entry.get("deadlines"):
        return None
    found = []
    for key, value in entry.items():
        if not isinstance(key, str) or key in _DEADLINE_KEYS or key in NOT_DEADLINE_DATES:
            continue
        named = "deadline" in key.lower() or "due" in key.lower()
        if named or _reads_as_date(value):
            found.append(f"{key!r} ({value!r})")
    if not found:
        return None
    return (f"no deadline under the keys this reader reads ('deadline', 'abstract_deadline', or 'deadlines' "
            f"items with 'date'), but {', '.join(found)} looks like one: it would never be planned, so the "
            "entry is skipped - move the date under one of those keys")


def _repeated_message(repeats: list[RepeatedKey], what: str) -> str:
    """Why a record (``what``: ``"entry"`` or ``"deadline"``, an item of ``deadlines``) with keys
    written twice is skipped, naming each key, from the record, and both of its lines."""
    skip = 2 if what == "deadline" else 0  # ("deadlines", n, ...) leads to the item's own keys
    keys = "; ".join(f"'{'.'.join(str(k) for k in r.path[skip:])}' at line {r.line} (first at line {r.first_line})"
                     for r in repeats)
    return (f"key written twice in one mapping: {keys}; YAML would keep only the last and drop the first "
            f"without a word, so which value the publisher meant cannot be told and the {what} is skipped "
            "- merge them into one")


def _read_entry(entry: dict, node, edition: str, position: str, default_tz: str | None,
                result: ParseResult, repeated_in_items: dict[int, list[RepeatedKey]]) -> None:
    """Append the rules of one entry (its composed YAML ``node`` gives lines) and its problems.
    ``repeated_in_items``: keys written twice, by 1-based index of the ``deadlines`` item holding them
    (such an item is skipped)."""
    conference = str(entry.get("title") or edition).strip()
    year = entry.get("year")
    heading = f"{conference} {year}" if year is not None and str(year) not in conference else conference
    url = str(entry["link"]).strip() if entry.get("link") else None
    note = str(entry["note"]) if entry.get("note") is not None else None
    # The edition's own zone is the fallback for typed items that omit theirs.
    entry_tz_raw = entry.get("timezone")

    if "deadlines" in entry:
        specs = _typed_specs(entry, node, position, entry_tz_raw, result, repeated_in_items)
        if specs is None:
            return
        specs += _uncopied_flat_specs(entry, edition, position, specs, result)
    else:
        specs = _flat_specs(entry, position, entry_tz_raw, result)

    for where, kind, id_label, shown, raw_date, raw_tz in specs:
        rule_fields = _date_and_zone(raw_date, raw_tz, default_tz)
        if isinstance(rule_fields, str):
            result.problems.append(ParseProblem(where, rule_fields))
            continue
        start, tz = rule_fields
        result.add(RuleRecord(
            rule_id=f"{edition}/{kind}/{id_label}",
            title=f"{heading} — {shown}",
            start=start,
            tz=tz,
            kind="deadline",
            url=url,
            note=note,
            extra={"edition_id": edition, "conference": conference, "year": year,
                   "deadline_type": kind, "label": shown},
        ), where)


#: One deadline to read: (where, kind, id_label, shown label, raw date, raw zone) — ``where`` is the
#: problem position, ``id_label`` the part of the rule id after the kind, the raw values as written.
_Spec = tuple[str, str, str, str, object, object]


def _typed_specs(entry: dict, node, position: str, entry_tz_raw, result: ParseResult,
                 repeated_in_items: dict[int, list[RepeatedKey]]) -> list[_Spec] | None:
    """The specs of a typed entry's ``deadlines`` items, in order; each unusable item (a key written
    twice, not a mapping, no ``type``) is a problem instead. ``None`` (with a problem) when
    ``deadlines`` is not a list. An item without ``timezone``, or with an empty one, takes ``entry_tz_raw``."""
    items = entry.get("deadlines") or []
    if not isinstance(items, list):
        result.problems.append(ParseProblem(position, "'deadlines' is not a list"))
        return None
    if not items:
        # The published files list an edition before its call for papers as ``deadlines: []`` (with a
        # note "not yet announced"): the typed form of a flat entry without ``deadline``. Said like it,
        # so it is logged and held the same way instead of passing without a word.
        result.problems.append(ParseProblem(position, "entry has an empty 'deadlines' list (none announced yet?)",
                                            unannounced=True))
        return []
    specs: list[_Spec] = []
    item_nodes = next((v.value for k, v in node.value if isinstance(k, yaml.ScalarNode)
                       and k.value == "deadlines" and isinstance(v, yaml.SequenceNode)), [])
    for n, item in enumerate(items, start=1):
        where = f"{position} deadline {n}"
        if n <= len(item_nodes):
            where += f" (line {item_nodes[n - 1].start_mark.line + 1})"
        if n in repeated_in_items:
            result.problems.append(ParseProblem(where, _repeated_message(repeated_in_items[n], "deadline")))
            continue
        if not isinstance(item, dict):
            result.problems.append(ParseProblem(where, f"expected a mapping, got {type(item).__name__}"))
            continue
        kind = str(item.get("type") or "").strip()
        label = str(item.get("label") or "").strip() or kind
        misspelt = _misspelt_keys(item, _ITEM_KEYS, "deadline")
        if misspelt:
            result.problems.append(ParseProblem(where, misspelt))
            continue
        if not kind:
            result.problems.append(ParseProblem(where, "deadline has no 'type'; it cannot be identified"))
            continue
        no_date = _no_date(item)
        if no_date:
            result.problems.append(ParseProblem(where, no_date))
            continue
        raw_tz = item.get("timezone")
        if raw_tz is None or (isinstance(raw_tz, str) and not raw_tz.strip()):
            # An empty ``timezone:`` is no zone, as an absent one: the entry's zone. Read as absent only
            # when the key was missing, the item fell through to the source's ``default_tz`` (23:59 under
            # an entry in UTC+8 read in UTC, eight hours late with every check green).
            raw_tz = entry_tz_raw
        specs.append((where, kind, label, label, item.get("date"), raw_tz))
    return specs


def _no_date(item: dict) -> str | None:
    """Why a ``deadlines`` item without a ``date`` (no such key, or an empty one) is skipped, else None.

    Names the keys it has and the one that seems to hold the date (close to ``date``, or a value that
    reads as one: ``deadline: '2027-03-08 23:59'``, the flat entries' key). It was reported as "date
    None is not 'YYYY-MM-DD…'", which named a value nobody wrote and not the key to rename."""
    if item.get("date") is not None:
        return None
    if "date" in item:
        return "deadline's 'date' is empty"
    keys = [str(k) for k in item]
    held = [k for k in keys if k not in ("type", "label", "timezone")
            and (near_name(k, ["date"]) or _reads_as_date(item[k]))]
    hint = f"; did you mean 'date' for {held[0]!r}?" if held else ""
    return f"deadline has no 'date' key (its keys: {', '.join(keys)}){hint}"


def _reads_as_date(value: object) -> bool:
    """Whether ``value`` reads as a local date or date-time (:func:`normalise_local`)."""
    try:
        normalise_local(value)
    except ValueError:
        return False
    return True


def _flat_specs(entry: dict, position: str, entry_tz_raw, result: ParseResult) -> list[_Spec]:
    """The specs of a flat entry, one per key of :data:`FLAT_KEYS` it sets; a missing ``deadline`` is
    an ``unannounced`` problem, a missing optional key nothing."""
    if entry.get("deadline") is None:
        # A readable entry that announces no deadline. Not announced yet, it is information;
        # but an entry whose deadline in force lost its key must not withdraw that rule
        # (ingest holds it and turns rules_complete red: ParseProblem.unannounced).
        result.problems.append(ParseProblem(position, "entry has no 'deadline' (none announced yet?)",
                                            unannounced=True))
    return _flat_key_specs(entry, position, entry_tz_raw)


def _flat_key_specs(entry: dict, position: str, entry_tz_raw) -> list[_Spec]:
    """One spec per key of :data:`FLAT_KEYS` that ``entry`` sets (``null`` means "none")."""
    # Flat rules read "Paper Submission" in titles but keep the key in their identity.
    return [(f"{position} {key}", kind, key, label, entry.get(key), entry_tz_raw)
            for key, kind, label in FLAT_KEYS if entry.get(key) is not None]


def _uncopied_flat_specs(entry: dict, edition: str, position: str, typed: list[_Spec],
                         result: ParseResult) -> list[_Spec]:
    """The specs of a typed entry's flat keys (:data:`FLAT_KEYS`) that copy none of its ``typed``
    items, each with a note (``skipped=False``) naming the key; a key that copies one gives nothing.

    The published files keep ``deadline``/``abstract_deadline`` beside ``deadlines`` as legacy copies
    of the paper and abstract items (cvpr26, without a zone). A flat ``deadline`` beside a list that
    holds only a supplementary item copies nothing: ignored, the paper deadline was never planned
    while ``validate`` and every check said OK. Planned on its own, a copy this test misses is at
    worst a second reminder of the same date (:func:`_copies`)."""
    specs = []
    for spec in _flat_key_specs(entry, position, entry.get("timezone")):
        if any(_copies(spec, item, has_zone=bool(str(entry.get("timezone") or "").strip())) for item in typed):
            continue
        where, kind, key, _, raw_date, _ = spec
        specs.append(spec)
        result.problems.append(ParseProblem(
            where, f"flat {key!r} ({raw_date!r}) copies no item of 'deadlines' (none of type "
            f"{sorted(selected_kinds([kind]))} at that time), so it is read as its own rule "
            f"'{edition}/{kind}/{key}'", edition, skipped=False))
    return specs


def _copies(flat: _Spec, item: _Spec, *, has_zone: bool) -> bool:
    """Whether the ``flat`` key's spec is a copy of the typed ``item``: a type the flat kind selects
    (:func:`~deadline_pipeline.rules.selected_kinds`: ``deadline`` copies a ``paper`` or
    ``submission`` item, ``abstract_deadline`` an ``abstract`` one) and the same wall time, and,
    when the entry has a zone (``has_zone``), the same instant. A flat key of an entry without a zone
    has none of its own (the legacy copies are written so), so its wall time alone is compared.
    Unreadable dates or zones copy nothing (the flat key is then read, and its problem named)."""
    if item[1].strip().lower() not in selected_kinds([flat[1]]):
        return False
    try:
        wall = normalise_local(flat[4])
        if wall != normalise_local(item[4]):
            return False
        if not has_zone:
            return True
        moment = parse_local(wall)
        return (moment.replace(tzinfo=resolve_zone(str(flat[5]).strip()))
                == moment.replace(tzinfo=resolve_zone(str(item[5]).strip())))
    except ValueError:  # UnknownTimeZone is one
        return False


def _date_and_zone(raw_date, raw_tz, default_tz: str | None) -> tuple[str, str] | str:
    """(normalised local start, zone as spelled) of one deadline, or the problem's message when
    the date cannot be read or the zone is unknown (the date is judged first)."""
    try:
        start = normalise_local(raw_date)
    except ValueError as exc:
        return str(exc)
    try:
        return start, _zone(raw_tz, default_tz)
    except UnknownTimeZone as exc:
        return str(exc)
