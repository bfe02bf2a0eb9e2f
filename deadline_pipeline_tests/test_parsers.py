"""The source parsers on real public files (../shared/data) and on small hand-written payloads.

Instants are checked the way planning will compute them: the local wall time in the rule's zone,
converted to UTC. Expected values were worked out by hand from the zone's offset on that date.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from deadline_pipeline.ingest.parsers import PARSERS, ParseError, ParseResult, parse_payload
from deadline_pipeline.rules import RuleRecord, parse_local
from deadline_pipeline.timezones import resolve_zone


def instant(rule: RuleRecord) -> datetime:
    return parse_local(rule.start).replace(tzinfo=resolve_zone(rule.tz)).astimezone(UTC)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text)  # Python 3.11+ reads the "Z" suffix


def by_id(result: ParseResult) -> dict[str, RuleRecord]:
    return {r.rule_id: r for r in result.rules}


def ics(*lines: str, calendar_lines: tuple[str, ...] = ()) -> bytes:
    body = ["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//test//EN", *calendar_lines,
            "BEGIN:VEVENT", *lines, "END:VEVENT", "END:VCALENDAR"]
    return ("\r\n".join(body) + "\r\n").encode()


@pytest.fixture(scope="module")
def data(shared_dir: Path) -> Path:
    return shared_dir / "data"


@pytest.fixture(scope="module")
def pwc(data: Path) -> ParseResult:
    path = data / "ai-deadlines-pwc" / "conferences.yml"
    return parse_payload("ai-deadlines", path.read_bytes(), source="pwc")


@pytest.fixture(scope="module")
def hf(data: Path) -> dict[str, ParseResult]:
    return {
        p.stem: parse_payload("ai-deadlines", p.read_bytes(), source=f"hf/{p.name}")
        for p in sorted((data / "ai-deadlines-hf" / "conferences").glob("*.yml"))
    }


# --- registry --------------------------------------------------------------------------------------

def test_registry_names_every_format():
    assert set(PARSERS) == {"ai-deadlines", "ics", "csv", "govuk-bank-holidays"}


def test_unknown_format_and_bad_default_tz_are_configuration_errors():
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        parse_payload("xml", b"<x/>", source="s")
    with pytest.raises(ValueError, match="Mars/Olympus"):
        parse_payload("csv", b"title,due,timezone\n", source="s", default_tz="Mars/Olympus")


# --- ai-deadlines: the real files ----------------------------------------------------------------

def test_an_ambiguous_zone_abbreviation_is_read_as_documented_and_said():
    """"CST" is read as US Central (UTC-6); a publisher in China means UTC+8, 14 hours earlier. Before,
    the reading was silent; now one note per abbreviation names the rules and what else it means."""
    csv = (b"id,title,due,timezone\nq1,Filing,2027-03-01 23:59,CST\nq2,Filing,2027-06-01 23:59,cst\n"
           b"q3,Filing,2027-09-01 23:59,Asia/Shanghai\n")
    result = parse_payload("csv", csv, source="s")
    assert [r.tz for r in result.rules] == ["CST", "cst", "Asia/Shanghai"]  # the reading is unchanged
    notes = [p for p in result.problems if "ambiguous" in p.message]  # q2 is also out of season (June)
    assert [(p.skipped, p.position) for p in notes] == [(False, "1 rule(s), first 'q1'"),
                                                        (False, "1 rule(s), first 'q2'")]
    assert "read as UTC-6, but it also names China Standard Time (UTC+8" in notes[0].message
    # A source whose default zone is the abbreviation: said for its rules without a zone too.
    floating = parse_payload("csv", b"id,title,due,timezone\nq1,Filing,2027-03-01 23:59,\n", source="s",
                             default_tz="IST")
    assert any("'IST' is ambiguous" in p.message for p in floating.problems), floating.problems


def test_an_etc_gmt_zone_is_read_with_its_posix_sign_and_said():
    """IANA's ``Etc/GMT+8`` is eight hours behind UTC, ``GMT+8`` eight hours ahead: a publisher who meant
    Beijing by the first has every deadline sixteen hours late. The reading stays IANA's (which was meant
    cannot be told), and it was silent; now one note per such zone says it. A zone a calendar's own
    VTIMEZONE was matched to (a fixed UTC-12 read as ``Etc/GMT+12``) is no spelling of the publisher's: no
    note."""
    csv = b"id,title,due,timezone\nb1,Filing,2027-03-01 23:59,Etc/GMT+8\nb2,Filing,2027-03-01 23:59,Etc/GMT+0\n"
    result = parse_payload("csv", csv, source="s")
    assert instant(result.rules[0]) == utc("2027-03-02T07:59:00Z")  # the reading is unchanged
    assert [(p.skipped, p.position) for p in result.problems] == [(False, "1 rule(s), first 'b1'")]
    assert ("'Etc/GMT+8' is read as IANA defines it, UTC-8 (8 hour(s) behind UTC)" in result.problems[0].message
            and "if UTC+8 was meant, write UTC+8" in result.problems[0].message), result.problems
    calendar = ("BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//t//t//EN\r\nBEGIN:VTIMEZONE\r\nTZID:Office\r\n"
                "BEGIN:STANDARD\r\nDTSTART:19700101T000000\r\nTZOFFSETFROM:-1200\r\nTZOFFSETTO:-1200\r\n"
                "END:STANDARD\r\nEND:VTIMEZONE\r\nBEGIN:VEVENT\r\nUID:o@t\r\nDTSTAMP:20260101T000000Z\r\n"
                "DTSTART;TZID=Office:20270301T170000\r\nRRULE:FREQ=WEEKLY;COUNT=2\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n")
    matched = parse_payload("ics", calendar.encode(), source="s")
    assert [(r.tz, r.extra["tzid"]) for r in matched.rules] == [("Etc/GMT+12", "Office")]
    assert matched.problems == []


def test_every_pwc_file_parses_without_problems(data: Path):
    files = [data / "ai-deadlines-pwc" / "conferences.yml",
             *sorted((data / "ai-deadlines-pwc" / "revisions").glob("*.yml"))]
    assert len(files) == 4
    for path in files:
        result = parse_payload("ai-deadlines", path.read_bytes(), source=path.name)
        assert result.rules, path
        assert result.problems == [], (path, result.problems)
        assert len({r.rule_id for r in result.rules}) == len(result.rules)
        for rule in result.rules:
            instant(rule)  # every zone resolves and every start is a valid local time


def test_every_hf_file_parses(hf: dict[str, ParseResult]):
    assert len(hf) == 12
    for name, result in hf.items():
        assert result.rules, name
        for rule in result.rules:
            instant(rule)
    # The only problems in the HF files: editions announced without any deadline yet, flat (cvpr27,
    # beside its conference days start/end) and typed (aaai27, `deadlines: []`); neither is skipped.
    problems = sorted((name, str(p)) for name, r in hf.items() for p in r.problems)
    assert [(n, "id=aaai27" in t or "id=cvpr27" in t) for n, t in problems] == [("aaai", True), ("cvpr", True)]
    assert all(p.unannounced for r in hf.values() for p in r.problems)


@pytest.mark.parametrize(
    ("rule_id", "tz", "expected"),
    [
        ("emnlp24/submission/deadline", "UTC-12", "2024-06-16T11:59:00Z"),
        ("icdm22/submission/deadline", "PDT", "2022-06-11T06:59:00Z"),  # PDT = UTC-7
        ("icdm23/submission/deadline", "GMT+8", "2023-07-01T15:59:00Z"),  # eight hours ahead
        ("eccv22/submission/deadline", "CET", "2022-03-07T20:59:00Z"),  # CET = UTC+1
        ("iros24/submission/deadline", "America/Los_Angeles", "2024-03-02T07:59:59Z"),  # PST
        ("wacv24/submission/deadline", "America/Los_Angeles", "2023-08-30T18:59:59Z"),  # PDT
        ("CIKM24/abstract/abstract_deadline", "UTC-12", "2024-05-14T11:59:59Z"),
    ],
)
def test_pwc_instants_by_hand(pwc: ParseResult, rule_id: str, tz: str, expected: str):
    rule = by_id(pwc)[rule_id]
    assert rule.tz == tz
    assert instant(rule) == utc(expected)


def test_pwc_fields_are_kept_as_written(pwc: ParseResult):
    rules = by_id(pwc)
    emnlp = rules["emnlp24/submission/deadline"]
    assert emnlp.start == "2024-06-15T23:59:00"
    assert emnlp.title == "EMNLP 2024 — Paper Submission"
    assert emnlp.url == "https://2024.emnlp.org/"
    assert "<a href='https://2024.emnlp.org/calls/main_conference_papers/'>" in emnlp.note  # raw HTML
    assert emnlp.extra == {"edition_id": "emnlp24", "conference": "EMNLP", "year": 2024,
                           "deadline_type": "submission", "label": "Paper Submission"}
    assert emnlp.kind == "deadline" and emnlp.rrule is None
    # Written without seconds, and with a one-digit month: normalised, not rejected.
    assert rules["starsem23/submission/deadline"].start == "2023-03-24T23:59:00"
    assert rules["ismir22/abstract/abstract_deadline"].start == "2022-05-13T23:59:59"


def test_pwc_typo_key_does_not_break_the_entry(pwc: ParseResult):
    # CIKM24 writes `data:` for `date:`; its two deadlines must still be read.
    rules = by_id(pwc)
    assert rules["CIKM24/submission/deadline"].start == "2024-05-20T23:59:59"
    assert rules["CIKM24/abstract/abstract_deadline"].start == "2024-05-13T23:59:59"


def test_pwc_revision_moves_a_deadline_and_its_zone(data: Path):
    revisions = sorted((data / "ai-deadlines-pwc" / "revisions").glob("*.yml"))
    early = by_id(parse_payload("ai-deadlines", revisions[2].read_bytes(), source="pwc"))  # 2020-01-28
    late = by_id(parse_payload("ai-deadlines", revisions[1].read_bytes(), source="pwc"))  # 2020-04-17
    before, after = early["eccv20/submission/deadline"], late["eccv20/submission/deadline"]
    assert (before.start, before.tz) == ("2020-03-05T07:00:00", "Europe/London")
    assert (after.start, after.tz) == ("2020-03-05T23:59:00", "UTC")
    assert before.content_hash() != after.content_hash()  # a new rule version, same identity


@pytest.mark.parametrize(
    ("file", "rule_id", "tz", "expected"),
    [
        ("iclr", "iclr25/abstract/Abstract Submission", "AoE", "2024-09-28T11:59:59Z"),
        ("iclr", "iclr25/submission/Paper Submission", "AoE", "2024-10-02T11:59:59Z"),
        ("mathai", "mathai25/abstract/Abstract submission deadline", "Europe/London", "2025-02-14T23:59:59Z"),
        ("wacv", "wacv25/submission/Paper Submission Deadline", "UTC-7", "2024-07-16T06:59:59Z"),
        ("iccv", "iccv25/abstract/Abstract submission", "UTC+0", "2025-03-04T09:59:59Z"),
        ("cvpr", "cvpr25/submission/deadline", "UTC-8", "2024-11-15T07:59:00Z"),  # a flat HF entry
    ],
)
def test_hf_instants_by_hand(hf: dict[str, ParseResult], file: str, rule_id: str, tz: str, expected: str):
    rule = by_id(hf[file])[rule_id]
    assert rule.tz == tz
    assert instant(rule) == utc(expected)


def test_hf_title_and_extra(hf: dict[str, ParseResult]):
    rule = by_id(hf["iclr"])["iclr25/submission/Paper Submission"]
    assert rule.title == "ICLR 2025 — Paper Submission"
    assert rule.url == "https://iclr.cc/Conferences/2025"
    assert rule.extra["edition_id"] == "iclr25" and rule.extra["year"] == 2025


def test_hf_same_type_twice_gets_two_ids(hf: dict[str, ParseResult]):
    notifications = [r for r in hf["aaai"].rules if r.rule_id.startswith("aaai26/notification/")]
    assert {r.rule_id for r in notifications} == {
        "aaai26/notification/Phase 1 rejection notifications",
        "aaai26/notification/Final acceptance/rejection notices",
    }
    # wacv27 lists two notifications on the same day: still two rules.
    wacv27 = [r for r in hf["wacv"].rules if r.rule_id.startswith("wacv27/notification/")]
    assert len(wacv27) == 2 and len({r.start for r in wacv27}) == 1


def test_hf_typed_entry_ignores_its_legacy_flat_keys(hf: dict[str, ParseResult]):
    # cvpr26 has both `deadlines:` and zone-less flat `deadline:` / `abstract_deadline:` copying its
    # paper and abstract items; only the typed items count, and no flat key of a real file is read
    # as a rule of its own.
    ids = {r.rule_id for r in hf["cvpr"].rules if r.rule_id.startswith("cvpr26/")}
    assert "cvpr26/submission/deadline" not in ids and "cvpr26/abstract/abstract_deadline" not in ids
    assert "cvpr26/paper/Paper Submission" in ids and len(ids) == 7
    assert not [p for r in hf.values() for p in r.problems if "copies no item" in p.message]


def test_a_flat_deadline_beside_typed_items_it_copies_not_is_read_as_its_own_rule():
    """A flat ``deadline`` beside a ``deadlines`` list holding only a supplementary item was taken for a
    legacy copy and dropped: the paper deadline never planned, validate OK. It is its own rule now,
    with a note naming the key; a flat key that copies an item (cvpr26's form, or with the entry's
    zone at the same instant) still adds nothing, and one at another instant is read too."""
    def entry(flat: str, zone: str = "  timezone: AoE\n", item_zone: str = "") -> ParseResult:
        return parse_payload("ai-deadlines", (
            "- title: CONF\n  year: 2027\n  id: conf27\n" + flat + zone +
            "  deadlines:\n  - type: supplementary\n    label: Supplementary\n    date: '2027-03-08 23:59:59'\n"
            + item_zone + "  - type: paper\n    label: Paper Submission\n    date: '2027-02-01 23:59:59'\n" + item_zone
        ).encode(), source="s")

    result = entry("  deadline: '2027-03-01 23:59:59'\n")
    paper = {r.rule_id: r for r in result.rules}["conf27/submission/deadline"]
    assert (paper.start, paper.tz, paper.extra["deadline_type"]) == ("2027-03-01T23:59:59", "AoE", "submission")
    assert len(result.rules) == 3, [r.rule_id for r in result.rules]
    (note,) = result.problems
    assert not note.skipped and note.record_id == "conf27" and "'deadline'" in note.message, note
    # Copies: the same wall time and instant; and zone-less, the wall time alone (cvpr26).
    assert len(entry("  deadline: '2027-02-01 23:59:59'\n").rules) == 2
    assert len(entry("  deadline: '2027-2-1 23:59:59'\n", zone="", item_zone="    timezone: AoE\n").rules) == 2
    # Same wall time in another zone, or an abstract_deadline no abstract item copies: their own rules.
    other = entry("  deadline: '2027-02-01 23:59:59'\n", item_zone="    timezone: UTC\n")
    assert "conf27/submission/deadline" in {r.rule_id for r in other.rules}
    abstract = entry("  deadline: '2027-02-01 23:59:59'\n  abstract_deadline: '2027-02-01 23:59:59'\n")
    assert {r.rule_id for r in abstract.rules} == {
        "conf27/supplementary/Supplementary", "conf27/paper/Paper Submission", "conf27/abstract/abstract_deadline"}
    # Zone-less and uncopied with no default_tz: a skipped record naming the key, never a silent drop.
    nozone = entry("  deadline: '2027-03-01 23:59:59'\n", zone="", item_zone="    timezone: AoE\n")
    assert any(p.skipped and p.position.endswith(" deadline") for p in nozone.problems), nozone.problems


# --- ai-deadlines: leniency and broken payloads ------------------------------------------------

GOOD_ENTRY = """
- title: GOOD
  year: 2030
  id: good30
  deadline: '2030-01-15 23:59'
  timezone: AoE
"""


def test_bad_entries_are_skipped_and_counted_good_ones_kept():
    payload = GOOD_ENTRY + """
- title: NOID
  year: 2030
  deadline: '2030-01-15 23:59'
  timezone: UTC
- title: TBA
  year: 2030
  id: tba30
  deadline: TBA
  timezone: UTC
- title: BADZONE
  year: 2030
  id: zone30
  deadline: '2030-01-15 23:59'
  timezone: Mars/Olympus
- title: NOZONE
  year: 2030
  id: nozone30
  deadline: '2030-02-30 23:59'
- title: TYPED
  year: 2030
  id: typed30
  deadlines:
  - {type: abstract, label: Abstract, date: '2030-01-01 12:00', timezone: Nowhere}
  - {type: paper, label: Paper, date: '2030-01-08', timezone: GMT+8}
"""
    result = parse_payload("ai-deadlines", payload.encode(), source="mixed")
    assert sorted(r.rule_id for r in result.rules) == ["good30/submission/deadline", "typed30/paper/Paper"]
    assert by_id(result)["typed30/paper/Paper"].start == "2030-01-08"  # date-only stays a date
    positions = [p.position for p in result.problems]
    assert len(positions) == 5
    assert positions[0].startswith("entry 2 (line ")
    assert any("id=tba30" in p for p in positions)
    assert any("id=zone30" in p for p in positions)
    assert any("id=nozone30" in p for p in positions)
    assert any("id=typed30" in p and "deadline 1" in p for p in positions)
    messages = " ".join(p.message for p in result.problems)
    assert "'TBA'" in messages and "Mars/Olympus" in messages and "does not exist" in messages


def test_missing_timezone_uses_default_tz_never_utc():
    payload = b"- {title: X, year: 2030, id: x30, deadline: '2030-01-15 23:59:59'}\n"
    without = parse_payload("ai-deadlines", payload, source="s")
    assert without.rules == [] and "no timezone" in without.problems[0].message
    with_default = parse_payload("ai-deadlines", payload, source="s", default_tz="Europe/Berlin")
    assert with_default.rules[0].tz == "Europe/Berlin"
    assert instant(with_default.rules[0]) == utc("2030-01-15T22:59:59Z")


def test_invalid_yaml_names_source_line_and_column():
    payload = GOOD_ENTRY + "- title: [unclosed\n  id: x\n"
    with pytest.raises(ParseError, match=r"^source 'pwc': line \d+, column \d+: invalid YAML"):
        parse_payload("ai-deadlines", payload.encode(), source="pwc")


@pytest.mark.parametrize(
    ("fmt", "payload"),
    [("ai-deadlines", "yaml"), ("ics", "ics"), ("csv", "csv")],
)
def test_html_page_empty_and_latin1_payloads_raise(fmt: str, payload: str):
    html = b"<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body></body></html>"
    with pytest.raises(ParseError, match=r"^source 'x': line 1: payload looks like an HTML page, not "):
        parse_payload(fmt, html, source="x")
    for empty in (b"", b"  \n\n"):
        with pytest.raises(ParseError, match=r"^source 'x': line 1: empty payload"):
            parse_payload(fmt, empty, source="x")
    latin1 = {
        "yaml": "- id: c1\n  title: Caf\u00e9\n",
        "ics": "BEGIN:VCALENDAR\r\nSUMMARY:Caf\u00e9\r\nEND:VCALENDAR\r\n",
        "csv": "title,due,timezone\nCaf\u00e9,2030-01-01,UTC\n",
    }[payload].encode("latin-1")
    with pytest.raises(ParseError, match=r"^source 'x': line 2, column \d+: payload is not valid UTF-8"):
        parse_payload(fmt, latin1, source="x")


@pytest.mark.parametrize("fmt", ["ai-deadlines", "ics", "csv", "govuk-bank-holidays"])
@pytest.mark.parametrize(("encoding", "why"), [
    ("utf-16", "UTF-16 \\(it starts with a UTF-16 byte order mark"),
    ("utf-32", "UTF-32 \\(it starts with a UTF-32 byte order mark"),
    # No mark: ASCII in UTF-16 is valid UTF-8, NULs and all.
    ("utf-16-le", "UTF-16-LE \\(no byte order mark, a NUL byte beside every character"),
    ("utf-16-be", "UTF-16-BE \\(no byte order mark, a NUL byte beside every character"),
])
def test_a_utf16_or_utf32_payload_is_refused_naming_its_encoding(fmt: str, encoding: str, why: str):
    """With a mark it read "not valid UTF-8 (byte 0xff)"; without one, a CSV header of NUL-strewn names."""
    text = {
        "ai-deadlines": "- id: c1\n  title: x\n",
        "ics": "BEGIN:VCALENDAR\r\nVERSION:2.0\r\nEND:VCALENDAR\r\n",
        "csv": "title,due,timezone\nx,2030-01-01,UTC\n",
        "govuk-bank-holidays": '{"england-and-wales": {"events": []}}',
    }[fmt]
    with pytest.raises(ParseError, match=rf"^source 'x': line 1: payload looks like {why}\), not UTF-8; .* "
                                         r"must be UTF-8: save the file as UTF-8$"):
        parse_payload(fmt, text.encode(encoding), source="x")


def test_yaml_that_is_not_a_list_raises():
    with pytest.raises(ParseError, match="source 's': line 1: expected a YAML list"):
        parse_payload("ai-deadlines", b"title: not a list\n", source="s")


# --- ICS -------------------------------------------------------------------------------------------

def test_every_icalendar_test_file_parses_or_raises_parse_error(data: Path):
    files = sorted((data / "icalendar-tests").rglob("*.ics"))
    assert len(files) > 150
    parsed = refused = 0
    for path in files:
        try:
            result = parse_payload("ics", path.read_bytes(), source=path.name)
        except ParseError as exc:
            assert str(exc).startswith(f"source {path.name!r}: "), exc
            refused += 1
            continue
        parsed += 1
        for rule in result.rules:
            assert isinstance(rule, RuleRecord)
            parse_local(rule.start)
            if rule.tz is not None:
                resolve_zone(rule.tz)
    assert parsed > 150 and refused > 0


def test_real_calendar_with_exdates_on_several_lines(data: Path):
    path = data / "icalendar-tests" / "tests" / "events" / "event_with_recurrence_exdates_on_different_lines.ics"
    (rule,) = parse_payload("ics", path.read_bytes(), source="t").rules
    assert (rule.start, rule.tz) == ("2012-03-27T10:00:00", "Europe/Vienna")
    assert rule.rrule == "FREQ=WEEKLY;UNTIL=20120703T080000Z;BYDAY=TU"
    assert sorted(rule.exdates) == ["2012-04-03T10:00:00", "2012-04-10T10:00:00", "2012-04-17T10:00:00",
                                    "2012-05-01T10:00:00", "2012-05-29T10:00:00"]
    assert rule.extra.get("unstable_id") is True  # no UID: identity hashed from DTSTART+SUMMARY


def test_real_calendar_with_windows_zone_name(data: Path):
    path = data / "icalendar-tests" / "tests" / "calendars" / "timezone_same_start.ics"
    (rule,) = parse_payload("ics", path.read_bytes(), source="t").rules
    assert rule.tz == "Pacific Standard Time"  # kept as spelled, mapped by resolve_zone
    assert instant(rule) == utc("2017-02-24T20:00:00Z")


def test_real_vtodo_uses_due(data: Path):
    path = data / "icalendar-tests" / "tests" / "todos" / "example.ics"
    result = parse_payload("ics", path.read_bytes(), source="t")
    (rule,) = result.rules
    assert rule.kind == "todo" and rule.start == "2007-05-01" and rule.all_day
    assert rule.tz is None  # an all-day date without calendar zone stays floating


def test_real_truncated_calendar_raises_with_line(data: Path):
    path = data / "icalendar-tests" / "tests" / "calendars" / "small_bad_calendar.ics"
    with pytest.raises(ParseError, match=r"source 'cal': line 3: .*truncated"):
        parse_payload("ics", path.read_bytes(), source="cal")


def test_truncated_download_raises():
    full = ics("UID:a", "DTSTART:20300101T100000Z", "SUMMARY:Pay")
    with pytest.raises(ParseError, match=r"^source 'feed': line \d+: payload ends inside BEGIN:"):
        parse_payload("ics", full[: len(full) // 2], source="feed")


def test_not_a_calendar_raises():
    with pytest.raises(ParseError, match=r"^source 'f': line 1: not an iCalendar"):
        parse_payload("ics", b"hello, world\n", source="f")
    with pytest.raises(ParseError, match=r"^source 'f': line 3: not a usable iCalendar payload"):
        parse_payload("ics", b"BEGIN:VCALENDAR\r\nVERSION:2.0\r\ngarbage\r\nEND:VCALENDAR\r\n", source="f")


def test_component_without_dtstart_is_a_problem_not_a_crash():
    payload = ics("UID:a", "SUMMARY:no start").replace(
        b"END:VCALENDAR", b"BEGIN:VEVENT\r\nUID:b\r\nDTSTART:20300101T100000Z\r\nEND:VEVENT\r\nEND:VCALENDAR")
    result = parse_payload("ics", payload, source="s")
    assert [r.rule_id for r in result.rules] == ["b"]
    assert result.problems[0].position == "VEVENT UID=a (line 4)"
    assert result.problems[0].message == "no DTSTART"


@pytest.mark.parametrize(("component", "key"), [("VEVENT", "DTSTART"), ("VTODO", "DUE")])
def test_doubled_start_is_named_as_doubled_not_missing(component, key):
    """RFC 5545 allows DTSTART (and DUE) once; a component with two was reported as "no DTSTART",
    sending the publisher looking for a property that is there twice."""
    payload = ics("UID:a", f"{key}:20300101T100000Z", f"{key}:20300102T100000Z", "SUMMARY:Pay")
    if component == "VTODO":
        payload = payload.replace(b"VEVENT", b"VTODO")
    result = parse_payload("ics", payload, source="s")
    assert result.rules == []
    assert result.problems[0].message == (f"{key} appears 2 times (RFC 5545 allows it once); the due instant "
                                          "is ambiguous")


def around(*bad: str) -> bytes:
    """A calendar of a good event (lines 4-7), the component ``bad`` (from line 8) and a good to-do after it."""
    body = ["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//test//EN",
            "BEGIN:VEVENT", "UID:before", "DTSTART:20300101T100000Z", "END:VEVENT",
            *bad,
            "BEGIN:VTODO", "UID:after", "DUE:20300103T100000Z", "END:VTODO", "END:VCALENDAR"]
    return ("\r\n".join(body) + "\r\n").encode()


@pytest.mark.parametrize(("component", "lines", "named"), [
    # A VTODO's values: the library reads a to-do strictly, and one bad value refused the whole payload
    # with "position unknown".
    ("VTODO", ("DTSTART:20300102T100000Z", "DURATION:P1Y"), "DURATION (line 11) 'P1Y'"),  # years: not a dur-value
    ("VTODO", ("DTSTART:20300102T100000Z", "DURATION:soon"), "DURATION (line 11) 'soon'"),
    ("VTODO", ("DUE:2030XX01",), "DUE (line 10) '2030XX01'"),
    ("VTODO", ("DUE;VALUE=DATE:20301301",), "DUE (line 10) '20301301'"),
    ("VTODO", ("DTSTART:2030XX01T100000Z", "DUE:20300105T100000Z"), "DTSTART (line 10) '2030XX01T100000Z'"),
    ("VTODO", ("DUE:20300105T100000Z", "RRULE:FREQ=DAILY;UNTIL=2030XX01"),
     "RRULE (line 11) 'FREQ=DAILY;UNTIL=2030XX01'"),
    ("VTODO", ("DUE:20300105T100000Z", "RRULE:FREQ=DAILY;COUNT=3", "EXDATE:2030XX06T100000Z"),
     "EXDATE (line 12) '2030XX06T100000Z'"),
    ("VTODO", ("DUE:20300105T100000Z", "RDATE:20300106T100000Z,soon"), "RDATE (line 11) '20300106T100000Z,soon'"),
    ("VTODO", ("DUE:20300105T100000Z", "RECURRENCE-ID:2030XX05T100000Z"), "RECURRENCE-ID (line 11) '2030XX05T100000Z'"),
    ("VTODO", ("DUE:20300105T100000Z", "COMPLETED:yesterday"), "COMPLETED (line 11) 'yesterday'"),
    ("VTODO", ("DUE:20300105T100000Z", "PERCENT-COMPLETE:most"), "PERCENT-COMPLETE (line 11) 'most'"),
    # A line the library cannot split, in a to-do's date: refused the payload (naming the line) instead of
    # skipping the to-do as it does an event's.
    ("VTODO", ('DUE;TZID="Europe/Berlin:20300105T100000',), "DUE;TZID=\"Europe/Berlin:20300105T100000"),
    # An event's values were already skipped alone; the record now names the line and the value too.
    ("VEVENT", ("DTSTART:2030XX02T100000Z",), "DTSTART (line 10) '2030XX02T100000Z'"),
    ("VEVENT", ("DTSTART:20300102T100000Z", "RRULE:FREQ=DAILY;UNTIL=2030XX01"),
     "RRULE (line 11) 'FREQ=DAILY;UNTIL=2030XX01'"),
    ("VEVENT", ("DTSTART:20300102T100000Z", "RRULE:FREQ=DAILY;COUNT=3", "EXDATE:2030XX03T100000Z"),
     "EXDATE (line 12) '2030XX03T100000Z'"),
    ("VEVENT", ("DTSTART:20300102T100000Z", "RECURRENCE-ID:2030XX02T100000Z"),
     "RECURRENCE-ID (line 11) '2030XX02T100000Z'"),
    # A line that cannot be split, whatever it is: here an RDATE list folded without the leading space
    # (RFC 5545 §3.1). It was a note beside a series planned without the 6 January occurrence: validate
    # failed, rules_complete stayed green.
    ("VEVENT", ("DTSTART:20300102T100000Z", "RRULE:FREQ=MONTHLY;COUNT=2", "RDATE:20300104T100000Z",
                ",20300106T100000Z"), "line 13: Content line could not be parsed into parts: ',20300106T100000Z'"),
    ("VTODO", ("DUE:20300102T100000Z", "RDATE:20300104T100000Z", "20300106T100000Z"),
     "line 12: Content line could not be parsed into parts: '20300106T100000Z'"),
    ("VEVENT", ("DTSTART:20300102T100000Z", "not-a-date"), "line 11: Content line could not be parsed into parts: "
                                                            "'not-a-date'"),
])
def test_a_bad_value_skips_its_component_alone_naming_line_and_value(component, lines, named):
    payload = around(f"BEGIN:{component}", "UID:bad", *lines, f"END:{component}")
    result = parse_payload("ics", payload, source="s")
    assert sorted(r.rule_id for r in result.rules) == ["after", "before"]
    (problem,) = result.problems
    assert (problem.position, problem.record_id, problem.skipped) == (f"{component} UID=bad (line 8)", "bad", True)
    assert problem.message.startswith("component skipped: ") and named in problem.message


@pytest.mark.parametrize(("lines", "position", "named"), [
    # An alarm is not read (reminders come from the deadline itself): its bad TRIGGER refused the payload.
    (("BEGIN:VTODO", "UID:bad", "DUE:20300105T100000Z", "BEGIN:VALARM", "ACTION:DISPLAY", "DESCRIPTION:s",
      "TRIGGER:P1Y", "END:VALARM", "END:VTODO"), "VTODO UID=bad (line 8)", "VALARM TRIGGER (line 14) 'P1Y'"),
    (("BEGIN:VEVENT", "UID:bad", "DTSTART:20300105T100000Z", "BEGIN:VALARM", "ACTION:DISPLAY", "DESCRIPTION:s",
      "TRIGGER;VALUE=DATE-TIME:2030XX05T090000Z", "END:VALARM", "END:VEVENT"), "VEVENT UID=bad (line 8)",
     "VALARM TRIGGER (line 14) '2030XX05T090000Z'"),
    # Components the pipeline does not read.
    (("BEGIN:VJOURNAL", "UID:j", "DTSTART:2030XX05", "END:VJOURNAL"), "line 10", "VJOURNAL DTSTART '2030XX05'"),
])
def test_a_bad_value_in_a_part_not_read_is_a_note(lines, position, named):
    payload = around(*lines)
    result = parse_payload("ics", payload, source="s")
    expected = ["after", "bad", "before"] if "UID=bad" in position else ["after", "before"]
    assert sorted(r.rule_id for r in result.rules) == expected
    (problem,) = result.problems
    assert (problem.position, problem.skipped) == (position, False)
    assert named in problem.message and "ignored" in problem.message


def test_a_bad_value_of_the_calendar_itself_is_a_note():
    payload = around().replace(b"PRODID:-//test//EN", b"PRODID:-//test//EN\r\nREFRESH-INTERVAL;VALUE=DURATION:P1Y")
    result = parse_payload("ics", payload, source="s")
    assert sorted(r.rule_id for r in result.rules) == ["after", "before"]
    (problem,) = result.problems
    assert (problem.position, problem.skipped) == ("line 4", False)
    assert "VCALENDAR REFRESH-INTERVAL 'P1Y'" in problem.message


def test_a_bad_value_in_a_time_zone_definition_refuses_the_payload_naming_its_line():
    """A zone the calendar defines decides every instant written in it: read without the bad line it
    would give wrong instants, so the payload is refused, with the line (before: "position unknown")."""
    vtz = ["BEGIN:VTIMEZONE", "TZID:Odd", "BEGIN:STANDARD", "DTSTART:16010101T030000", "TZOFFSETFROM:+0100",
           "TZOFFSETTO:+01x0", "END:STANDARD", "END:VTIMEZONE"]
    with pytest.raises(ParseError, match=r"^source 's': line 13: not a usable iCalendar payload: .*\+01x0"):
        parse_payload("ics", around(*vtz), source="s")


def test_a_week_duration_with_days_is_read_with_a_note():
    """RFC 5545 §3.3.6 writes weeks alone (dur-week); P1W2D still says 9 calendar days without doubt, and
    reminder offsets read it so (plan.offsets.Offset.parse): planned at that, the line noted."""
    payload = around("BEGIN:VTODO", "UID:w", "DTSTART:20300102T100000Z", "DURATION:P1W2D", "END:VTODO")
    result = parse_payload("ics", payload, source="s")
    assert by_id(result)["w"].start == "2030-01-11T10:00:00"
    (problem,) = result.problems
    assert (problem.position, problem.record_id, problem.skipped) == ("VTODO UID=w (line 8)", "w", False)
    assert "DURATION (line 11) 'P1W2D'" in problem.message and "9 days" in problem.message


def test_utc_and_tzid_times():
    utc_rule = parse_payload("ics", ics("UID:u", "DTSTART:20300101T100000Z"), source="s").rules[0]
    assert (utc_rule.start, utc_rule.tz) == ("2030-01-01T10:00:00", "UTC")
    zoned = parse_payload("ics", ics("UID:z", "DTSTART;TZID=Asia/Tokyo:20300101T100000"), source="s").rules[0]
    assert (zoned.start, zoned.tz) == ("2030-01-01T10:00:00", "Asia/Tokyo")
    assert instant(zoned) == utc("2030-01-01T01:00:00Z")


def test_windows_zone_name_in_tzid_and_exdate():
    payload = ics(
        "UID:w",
        "DTSTART;TZID=W. Europe Standard Time:20300107T090000",
        "RRULE:FREQ=WEEKLY;COUNT=4",
        "EXDATE;TZID=GMT Standard Time:20300114T080000",
    )
    (rule,) = parse_payload("ics", payload, source="s").rules
    assert rule.tz == "W. Europe Standard Time"
    assert instant(rule) == utc("2030-01-07T08:00:00Z")
    assert rule.exdates == ("2030-01-14T09:00:00",)  # 08:00 London = 09:00 Berlin


def test_unknown_tzid_is_a_problem():
    result = parse_payload("ics", ics("UID:q", "DTSTART;TZID=Mars/Olympus:20300101T100000"), source="s")
    assert result.rules == []
    assert "Mars/Olympus" in result.problems[0].message


def test_c12_exdates_each_with_its_own_tzid_land_on_the_occurrences(cases: dict):
    """Case C12: EXDATE wall times must be read in their TZID, not as UTC."""
    case = cases["C12"]
    payload = ics("UID:c12", *case["input"]["ics"])
    (rule,) = parse_payload("ics", payload, source="s").rules
    assert rule.tz == "Europe/Amsterdam"
    assert rule.rrule == "FREQ=WEEKLY;UNTIL=20230101T225959Z;BYDAY=FR,MO,TH,TU,WE"
    zone = resolve_zone(rule.tz)
    excluded = {parse_local(x).replace(tzinfo=zone).isoformat() for x in rule.exdates}
    assert excluded == set(case["expected"]["must_not_contain"])


def test_exdate_in_another_zone_is_converted_to_the_rule_zone():
    payload = ics(
        "UID:x",
        "DTSTART;TZID=America/New_York:20300107T090000",
        "RRULE:FREQ=DAILY;COUNT=5",
        "EXDATE;TZID=Europe/London:20300108T140000",
        "EXDATE:20300109T140000Z,20300110T140000Z",
        "EXDATE:20300111T090000",  # floating: already the rule's wall time
        "RDATE;VALUE=DATE:20300201",
    )
    (rule,) = parse_payload("ics", payload, source="s").rules
    assert rule.exdates == ("2030-01-08T09:00:00", "2030-01-09T09:00:00", "2030-01-10T09:00:00",
                            "2030-01-11T09:00:00")
    assert rule.rdates == ("2030-02-01",)


def test_c14_floating_time_takes_x_wr_timezone(cases: dict):
    """Case C14: a floating time is not UTC; the calendar's X-WR-TIMEZONE gives its zone."""
    case = cases["C14"]
    lines = case["input"]["ics"]
    payload = ics("UID:c14", *lines[1:], calendar_lines=(lines[0],))
    (rule,) = parse_payload("ics", payload, source="s").rules
    assert (rule.start, rule.tz) == ("2015-03-14T10:00:00", "Australia/Brisbane")
    assert instant(rule) == datetime.fromisoformat(case["expected"][0])


def test_floating_time_without_calendar_zone():
    payload = ics("UID:f", "DTSTART:20150314T100000")
    assert parse_payload("ics", payload, source="s").rules[0].tz is None  # read per subscriber
    assert parse_payload("ics", payload, source="s", default_tz="Europe/Paris").rules[0].tz == "Europe/Paris"
    # X-WR-TIMEZONE wins over default_tz; a zoned DTSTART ignores both.
    declared = ics("UID:f", "DTSTART:20150314T100000", calendar_lines=("X-WR-TIMEZONE:Asia/Tokyo",))
    assert parse_payload("ics", declared, source="s", default_tz="Europe/Paris").rules[0].tz == "Asia/Tokyo"
    zoned = ics("UID:f", "DTSTART:20150314T100000Z", calendar_lines=("X-WR-TIMEZONE:Asia/Tokyo",))
    assert parse_payload("ics", zoned, source="s").rules[0].tz == "UTC"


def test_unknown_x_wr_timezone_skips_the_floating_components():
    """An X-WR-TIMEZONE that names no zone was a note, and the floating time was read in each subscriber's
    zone (hours off, every check green): the component with it is skipped, naming the line, the value and
    the nearest zone name; one with a TZID of its own or a UTC time is read as before."""
    payload = ics("UID:f", "DTSTART:20150314T100000", calendar_lines=("X-WR-TIMEZONE:Europe/Berln",))
    result = parse_payload("ics", payload, source="s", default_tz="America/New_York")
    assert result.rules == []
    (problem,) = result.problems
    assert problem.skipped and problem.record_id == "f"
    assert "X-WR-TIMEZONE (line 4) 'Europe/Berln', which names no zone (did you mean Europe/Berlin?)" in \
        problem.message, problem.message
    unknown = ics("UID:f", "DTSTART;VALUE=DATE:20150314", calendar_lines=("X-WR-TIMEZONE:Nowhere/City",))
    (problem,) = parse_payload("ics", unknown, source="s").problems
    assert "unknown time zone 'Nowhere/City'" in problem.message, problem.message
    for own, tz in (("DTSTART;TZID=Asia/Tokyo:20150314T100000", "Asia/Tokyo"), ("DTSTART:20150314T100000Z", "UTC")):
        zoned = parse_payload("ics", ics("UID:f", own, calendar_lines=("X-WR-TIMEZONE:Europe/Berln",)), source="s")
        assert [r.tz for r in zoned.rules] == [tz]
        assert zoned.problems == []


def test_all_day_event():
    (rule,) = parse_payload("ics", ics("UID:d", "DTSTART;VALUE=DATE:20300415"), source="s").rules
    assert rule.start == "2030-04-15" and rule.all_day and rule.kind == "event"


def test_override_gets_uid_and_utc_recurrence_id():
    payload = ics(
        "UID:series", "DTSTART;TZID=Europe/Berlin:20300107T090000",
        "RRULE:FREQ=WEEKLY;COUNT=3", "SUMMARY:Standup",
    ).replace(b"END:VCALENDAR", b"BEGIN:VEVENT\r\nUID:series\r\n"
              b"RECURRENCE-ID;TZID=Europe/Berlin:20300114T090000\r\n"
              b"DTSTART;TZID=Europe/Berlin:20300114T110000\r\nSUMMARY:Standup (moved)\r\n"
              b"END:VEVENT\r\nEND:VCALENDAR")
    rules = by_id(parse_payload("ics", payload, source="s"))
    assert set(rules) == {"series", "series#2030-01-14T08:00:00Z"}
    assert rules["series#2030-01-14T08:00:00Z"].start == "2030-01-14T11:00:00"


def test_component_without_uid_gets_a_hash_id():
    payload = ics("DTSTART:20300101T100000Z", "SUMMARY:Pay rent")
    first = parse_payload("ics", payload, source="s").rules[0]
    again = parse_payload("ics", payload, source="s").rules[0]
    assert len(first.rule_id) == 64 and first.rule_id == again.rule_id
    renamed = parse_payload("ics", payload.replace(b"Pay rent", b"Pay the rent"), source="s").rules[0]
    assert renamed.rule_id != first.rule_id  # documented: unstable when the title changes


def test_c02_until_is_kept_verbatim_for_the_expansion_engine(cases: dict):
    """Case C02: a DATE or floating UNTIL is normalised at expansion; parsing must not alter it."""
    variant = cases["C02"]["input"]["variant_b"]
    payload = ics("UID:c02", variant["DTSTART"], "RRULE:" + variant["RRULE"])
    (rule,) = parse_payload("ics", payload, source="s").rules
    assert (rule.start, rule.tz, rule.rrule) == ("2026-01-05T09:00:00", "America/New_York", variant["RRULE"])


def test_c03_malformed_rrules_are_rejected_per_component(cases: dict):
    """Case C03: repeated rule parts and COUNT with UNTIL are refused, naming the part."""
    case = cases["C03"]
    named = ["both COUNT and UNTIL", "part UNTIL appears more than once", "part FREQ appears more than once",
             "part BYMONTH appears more than once"]
    for recur, expected in zip(case["input"]["rules"], named, strict=True):
        payload = ics("UID:c03", "DTSTART:" + case["input"]["DTSTART"], "RRULE:" + recur)
        result = parse_payload("ics", payload, source="s")
        assert result.rules == [], recur
        (problem,) = result.problems
        assert problem.position == "VEVENT UID=c03 (line 4)"
        assert expected in problem.message, problem
    csv_payload = f"title,due,timezone,rrule\nx,2024-01-01,UTC,{case['input']['rules'][1]}\n".encode()
    assert "UNTIL appears more than once" in parse_payload("csv", csv_payload, source="s").problems[0].message


def test_c28_summary_newlines_are_kept_raw_for_later_sanitising():
    # Escaping and header sanitising happen at render time; the parser keeps the text as sent.
    payload = ics("UID:c28", "DTSTART:20300101T100000Z", "SUMMARY:Pay rent\\nBcc: attacker@example.org")
    assert parse_payload("ics", payload, source="s").rules[0].title == "Pay rent\nBcc: attacker@example.org"


# --- CSV -------------------------------------------------------------------------------------------

def test_csv_good_and_bad_rows():
    payload = (
        b"title,due,timezone,id,rrule,url,note\n"
        b"Tax return,2030-04-15,America/New_York,us-tax,,https://irs.example,<b>federal</b>\n"
        b"Rent,2030-01-01T09:00,Europe/Berlin,,FREQ=MONTHLY;BYMONTHDAY=1,,\n"
        b"Bad date,12.07.2022,UTC,bad1,,,\n"  # case C30: day-first is refused, not guessed
        b"Bad zone,2030-01-01,Mars/Olympus,bad2,,,\n"
        b"\n"
        b"Bad rule,2030-01-01,UTC,bad3,FREQ=DAILY;COUNT=3;UNTIL=20300105T000000,,\n"
        b"No zone,2030-01-01 17:30:00,,nz,,,\n"
    )
    result = parse_payload("csv", payload, source="sheet")
    rules = by_id(result)
    assert set(rules) == {"us-tax", "Rent"}  # no id cell: the title is the identity
    tax = rules["us-tax"]
    assert (tax.start, tax.tz, tax.url, tax.note, tax.kind) == (
        "2030-04-15", "America/New_York", "https://irs.example", "<b>federal</b>", "deadline")
    rent = rules["Rent"]
    assert (rent.start, rent.rrule) == ("2030-01-01T09:00:00", "FREQ=MONTHLY;BYMONTHDAY=1")
    assert [p.position for p in result.problems] == ["line 4", "line 5", "line 7", "line 8"]
    assert "12.07.2022" in result.problems[0].message
    with_default = parse_payload("csv", payload, source="sheet", default_tz="Europe/London")
    assert by_id(with_default)["nz"].start == "2030-01-01T17:30:00"


def test_csv_c30_day_first_dates_are_refused(cases: dict):
    values = cases["C30"]["input"]["csv_column_from_dd_mm_yyyy_source"]
    payload = ("title,due,timezone\n" + "".join(f"r{i},{v},UTC\n" for i, v in enumerate(values))).encode()
    result = parse_payload("csv", payload, source="s")
    assert result.rules == [] and len(result.problems) == len(values)


def test_csv_missing_required_columns_raises():
    with pytest.raises(ParseError, match=r"^source 'sheet': line 1: CSV header lacks required column\(s\) timezone"):
        parse_payload("csv", b"title,due\nx,2030-01-01\n", source="sheet")


@pytest.mark.parametrize(("payload", "line", "name"), [
    (b"id;title;due;timezone\nq1;VAT;2026-08-07;Europe/London\n", 1, "semicolon"),
    # A cell with commas made pandas refuse the rows as "malformed CSV" before the header was read.
    (b"id;title;due;timezone\nq1;VAT, Q1, UK, late;2026-08-07;Europe/London\n", 1, "semicolon"),
    (b"\nid\ttitle\tdue\ttimezone\nq1\tVAT\t2026-08-07\tEurope/London\n", 2, "tab"),
])
def test_csv_with_another_delimiter_is_refused_naming_it(payload, line, name):
    """A semicolon-separated sheet was refused as lacking title, due and timezone while listing them."""
    with pytest.raises(ParseError, match=rf"^source 'sheet': line {line}: CSV header .* looks {name}-separated; "
                                         r"this reader expects commas"):
        parse_payload("csv", payload, source="sheet")


def test_csv_malformed_raises_with_line():
    with pytest.raises(ParseError, match=r"^source 'sheet': line 3: malformed CSV"):
        parse_payload("csv", b"title,due,timezone\na,2030-01-01,UTC\nb,2030-01-01,UTC,extra,more\n",
                      source="sheet")


# --- cases file --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cases(shared_dir: Path) -> dict:
    items = json.loads((shared_dir / "cases" / "recurrence_and_delivery_cases.json").read_text())
    return {c["id"]: c for c in items}


# --- a misspelt name that would lose deadlines without a word -------------------------------------

def test_a_csv_header_with_a_misspelt_rrule_column_is_refused():
    """``rrul``: ignored as an unknown column, each yearly row was planned once and validate said OK."""
    payload = b"id,title,due,timezone,rrul\nq1,Q1,2027-04-15T23:59,America/New_York,FREQ=YEARLY\n"
    with pytest.raises(ParseError, match="column 'rrul' is not one this reader knows; did you mean 'rrule'"):
        parse_payload("csv", payload, source="s")
    assert len(parse_payload("csv", payload.replace(b",rrul\n", b",rrule\n"), source="s").rules) == 1


@pytest.mark.parametrize(("entry", "shown"), [
    ("{title: X, year: 2027, id: x27, deadline: '2027-03-01 23:59:59', abstract_deadlin: '2027-02-20 23:59:59', "
     "timezone: UTC}", "'abstract_deadlin' (did you mean 'abstract_deadline'?)"),
    ("{title: X, year: 2027, id: x27, deadline: '2027-03-01 23:59:59', timezone: UTC, "
     "deadlnes: [{type: supplementary, label: S, date: '2027-03-08 23:59:59'}]}",
     "'deadlnes' (did you mean 'deadlines'?)"),
])
def test_an_ai_deadlines_entry_with_a_misspelt_deadline_key_is_skipped(entry, shown):
    """Ignored as unknown keys, the abstract or supplementary deadline was never planned and validate
    said OK; skipped, the entry keeps its last good version and rules_complete names the key."""
    payload = f"- {entry}\n- {{title: Y, year: 2027, id: y27, deadline: '2027-03-01 23:59:59', timezone: UTC}}\n"
    result = parse_payload("ai-deadlines", payload.encode(), source="s")
    assert [r.rule_id for r in result.rules] == ["y27/submission/deadline"]
    (problem,) = result.problems
    assert problem.skipped and problem.record_id == "x27" and shown in problem.message, problem


@pytest.mark.parametrize(("item", "shown"), [
    ("{type: paper, date: '2027-03-08 23:59', timezon: UTC+8}", "'timezon' (did you mean 'timezone'?)"),
    ("{type: paper, date: '2027-03-08 23:59', time_zone: Asia/Shanghai}", "'time_zone' (did you mean 'timezone'?)"),
    ("{type: paper, dat: '2027-03-08 23:59', timezone: UTC+8}", "'dat' (did you mean 'date'?)"),
])
def test_an_ai_deadlines_item_with_a_misspelt_date_or_zone_key_is_skipped(item, shown):
    """Under an entry's own ``timezone: UTC-12``, an item's ``timezon: UTC+8`` was ignored and the entry's
    zone read instead: the paper deadline was due 20 hours late (2027-03-09 11:59Z for 15:59Z the day
    before) while validate and every check said OK. Skipped, it keeps its last good version and
    rules_complete names the key; the entry's other item is read."""
    payload = ("- {title: P, year: 2027, id: p27, timezone: UTC-12, deadlines: ["
               f"{{type: abstract, date: '2027-03-01 23:59'}}, {item}]}}\n")
    result = parse_payload("ai-deadlines", payload.encode(), source="s")
    assert [r.rule_id for r in result.rules] == ["p27/abstract/abstract"]
    (problem,) = result.problems
    assert problem.skipped and problem.record_id == "p27" and shown in problem.message, problem
    assert problem.position == "entry 1 (id=p27, line 1) deadline 2 (line 1)", problem


@pytest.mark.parametrize("empty", ["timezone:", "timezone: ''", "timezone: '  '", "timezone: null"])
def test_an_ai_deadlines_item_with_an_empty_zone_takes_its_entrys_zone(empty):
    """An item's empty ``timezone:`` (a template's blank left in) is no zone, like an absent key. It went
    to the source's ``default_tz`` instead of the entry's ``UTC+8``: the paper deadline was due at 23:59Z,
    eight hours late, while validate and every check said OK."""
    payload = ("- title: P\n  year: 2027\n  id: p27\n  timezone: UTC+8\n  deadlines:\n"
               "    - {type: abstract, date: '2027-02-20 23:59'}\n"
               f"    - type: paper\n      date: '2027-03-01 23:59'\n      {empty}\n")
    for default_tz in ("UTC", None):
        result = parse_payload("ai-deadlines", payload.encode(), source="s", default_tz=default_tz)
        assert result.problems == [], result.problems
        assert {r.rule_id: (r.tz, instant(r)) for r in result.rules} == {
            "p27/abstract/abstract": ("UTC+8", utc("2027-02-20T15:59:00Z")),
            "p27/paper/paper": ("UTC+8", utc("2027-03-01T15:59:00Z")),
        }


@pytest.mark.parametrize(("item", "shown"), [
    ("{type: paper, deadline: '2027-03-08 23:59'}",
     "deadline has no 'date' key (its keys: type, deadline); did you mean 'date' for 'deadline'?"),
    ("{type: paper, label: Paper}", "deadline has no 'date' key (its keys: type, label)"),
    ("{type: paper, date: }", "deadline's 'date' is empty"),
])
def test_an_ai_deadlines_item_without_a_date_names_the_missing_key(item, shown):
    """``deadline:`` (the flat entries' key) in place of ``date:`` was reported as "date None is not
    'YYYY-MM-DD…'": a value nobody wrote, not the key to rename."""
    payload = ("- {title: P, year: 2027, id: p27, timezone: UTC-12, deadlines: ["
               f"{{type: abstract, date: '2027-03-01 23:59'}}, {item}]}}\n")
    result = parse_payload("ai-deadlines", payload.encode(), source="s")
    assert [r.rule_id for r in result.rules] == ["p27/abstract/abstract"]
    (problem,) = result.problems
    assert (problem.skipped, problem.record_id, problem.message) == (True, "p27", shown), problem
    assert problem.position == "entry 1 (id=p27, line 1) deadline 2 (line 1)", problem


@pytest.mark.parametrize("key", ["paper_deadline", "submission_deadline", "deadline_date", "full_paper_deadline",
                                 "paper_due", "submission"])
def test_an_ai_deadlines_entry_with_its_date_under_an_unread_key_is_skipped(key):
    """Taken for "not announced yet", the date was never planned while every check was green;
    skipped, rules_complete is red and names the entry, the key, its value and the keys read."""
    from deadline_pipeline.ingest.parsers.base import counted_problems

    payload = (f"- {{title: G, year: 2027, id: g27, {key}: '2027-06-01 23:59:59', timezone: AoE}}\n"
               "- {title: Y, year: 2027, id: y27, deadline: '2027-03-01 23:59:59', timezone: UTC}\n")
    result = parse_payload("ai-deadlines", payload.encode(), source="s")
    assert [r.rule_id for r in result.rules] == ["y27/submission/deadline"]
    (problem,) = result.problems
    assert problem.skipped and not problem.unannounced and problem.record_id == "g27", problem
    assert f"{key!r} ('2027-06-01 23:59:59')" in problem.message, problem
    assert "'deadline', 'abstract_deadline', or 'deadlines'" in problem.message, problem
    assert counted_problems(result.problems, ()) == [problem]


@pytest.mark.parametrize(("entry", "said"), [
    ("start: '2027-02-16', end: '2027-02-23', date: 'February 16 - 23, 2027'", "no 'deadline'"),
    ("deadlines: [], start: '2027-02-16', end: '2027-02-23'", "empty 'deadlines' list"),
    ("deadlines: []", "empty 'deadlines' list"),
])
def test_an_ai_deadlines_entry_with_no_date_but_the_conference_days_is_not_announced_yet(entry, said):
    """The published files' convention (aaai27, cvpr27): listed, not skipped; `deadlines: []` said too."""
    result = parse_payload("ai-deadlines", f"- {{title: A, year: 2027, id: a27, {entry}}}\n".encode(), source="s")
    (problem,) = result.problems
    assert problem.unannounced and problem.record_id == "a27" and said in problem.message, problem


@pytest.mark.parametrize(("line", "shown"), [
    ("RDATE;VALUE=DATE 20270301", "RDATE (line 8) could not be read"),  # a space for the colon: dropped
    ("RRLUE:FREQ=YEARLY", "RRLUE (line 8) is no iCalendar property; did you mean RRULE?"),  # a one-off
])
def test_an_ics_rule_line_the_library_drops_or_a_misspelt_one_skips_its_component(line, shown):
    """The library dropped the RDATE line and kept ``RRLUE`` as an unknown property: the rule was
    planned without them, validate said OK and every check stayed green."""
    payload = ics("UID:a@x", "DTSTAMP:20260101T000000Z", "DTSTART;VALUE=DATE:20270115", line, "SUMMARY:a")
    result = parse_payload("ics", payload, source="s")
    assert result.rules == []
    (problem,) = result.problems
    assert problem.skipped and shown in problem.message, problem


@pytest.mark.parametrize(("lines", "shown"), [
    (("DTSTART;TZDI=Europe/Berlin:20270115T090000",),
     "DTSTART (line 7) has parameter TZDI, which is no iCalendar parameter; did you mean TZID?"),
    (("DTSTART;TZID=Europe/Berlin:20270115T090000", "RRULE:FREQ=WEEKLY",
      "EXDATE;TIZD=Europe/Berlin:20270122T090000"), "EXDATE (line 9) has parameter TIZD"),
    (("DTSTART;VALUE=DATE:20270115", "RDATE;VALEU=PERIOD:20270201T090000Z/PT1H"), "did you mean VALUE?"),
])
def test_an_ics_date_line_with_a_misspelt_parameter_skips_its_component(lines, shown):
    """The library ignores an unknown parameter: ``DTSTART;TZDI=Europe/Berlin`` was a floating time, due
    at 09:00 in each subscriber's zone (14:00Z for New York, not 08:00Z), and validate said OK. X- and
    RFC 5545's other parameters are read as before."""
    payload = ics("UID:a@x", "DTSTAMP:20260101T000000Z", *lines, "SUMMARY:a")
    result = parse_payload("ics", payload, source="s")
    assert result.rules == []
    (problem,) = result.problems
    assert problem.skipped and shown in problem.message, problem
    kept = ics("UID:a@x", "DTSTAMP:20260101T000000Z", "DTSTART;X-TZDI=x;LANGUAGE=en:20270115T090000Z", "SUMMARY:a")
    assert [(r.start, r.tz) for r in parse_payload("ics", kept, source="s").rules] == [("2027-01-15T09:00:00", "UTC")]


def test_a_csv_with_cr_line_ends_is_read():
    """Excel's "CSV (Macintosh)" ends lines with CR alone. The header check read it with csv's default
    newline handling, which raised "new-line character seen in unquoted field", and the whole payload
    failed as "position unknown: parser failed unexpectedly" while pandas reads it well."""
    payload = b"id,title,due,timezone\ra,A,2030-01-01,UTC\rb,B,2030-01-02T17:00,Europe/Paris\r"
    result = parse_payload("csv", payload, source="s")
    assert result.problems == []
    assert [(r.rule_id, r.start, r.tz) for r in result.rules] == [
        ("a", "2030-01-01", "UTC"), ("b", "2030-01-02T17:00:00", "Europe/Paris")]
    with pytest.raises(ParseError, match=r"line 1: CSV header names a column twice: 'due'"):
        parse_payload("csv", b"id,title,due,timezone, Due\ra,A,2030-01-01,UTC,x\r", source="s")


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_csv_problems_name_the_line_a_row_starts_on_after_a_multi_line_cell(newline):
    """A quoted note spanning three lines (one of them blank) and blank or whitespace-only lines between
    rows: each problem names the physical line its row starts on. Counting lines alone named the line
    two above the bad row after the note (its neighbour's, or a line inside the note)."""
    lines = ["id,title,due,timezone,note", "a,A,2030-01-01,UTC,\"first", "", "third\"", "   ",
             "b,B,2030-02-30,UTC,", "", "c,C,2030-01-03,Mars/Olympus,", ",,,,", "d,D,2030-01-04,UTC,\"x\"\"y\""]
    result = parse_payload("csv", newline.join(lines).encode(), source="s")
    assert [p.position for p in result.problems] == ["line 6", "line 8", "line 9"], result.problems
    assert {r.rule_id for r in result.rules} == {"a", "d"}


def test_csv_rows_csv_cannot_count_are_numbered_by_lines_with_a_note():
    """A cell over csv's field size limit (pandas reads it): the rows are numbered by lines, and a note
    says so instead of naming lines that may be off without a word."""
    payload = f"id,title,due,timezone,note\na,A,2030-01-01,UTC,{'x' * 200_000}\nb,B,2030-02-30,UTC,\n".encode()
    result = parse_payload("csv", payload, source="s")
    note, bad = result.problems
    assert not note.skipped and "rows are numbered by lines, not as read (line 2: field larger than" in note.message
    assert (bad.position, bad.skipped) == ("line 3", True)
