"""The named steps of ingest's entry parsing and snapshot apply, and of the rule_versions summary.

Each step is a pure function: an ai-deadlines entry's deadline specs (typed and flat), one deadline's
date and zone, the rule-version rows a snapshot writes, the parse report it stores, and the totals
and table rows the ``rule_versions`` materialization shows.
"""

from __future__ import annotations

from datetime import UTC, datetime

import yaml

from deadline_pipeline.ingest.parsers import aideadlines as ai
from deadline_pipeline.ingest.parsers.base import ParseProblem, ParseResult
from deadline_pipeline.ingest.service import ApplyOutcome, _parse_report, _version_rows
from deadline_pipeline.ingest.versions import RuleDiff
from deadline_pipeline.orchestration.assets import _add_to_totals, change_row
from deadline_pipeline.plan.rule_instant import instant_of
from deadline_pipeline.rules import RuleRecord

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def _entry(text: str):
    """(entry as loaded, its composed node) of one YAML mapping."""
    return yaml.safe_load(text), yaml.compose(text)


# --- ai-deadlines entries ----------------------------------------------------------------------------


TYPED = """\
id: conf25
timezone: UTC-12
deadlines:
  - type: abstract
    label: Abstract
    date: 2025-05-01 23:59
  - type: paper
    date: 2025-05-08 23:59
    timezone: Europe/Berlin
  - just text
  - label: no type
    date: 2025-05-09
"""


def test_typed_items_become_specs_with_lines_and_the_entry_zone_as_fallback():
    entry, node = _entry(TYPED)
    result = ParseResult()
    specs = ai._typed_specs(entry, node, "entry 1", entry["timezone"], result, {})
    assert specs == [
        ("entry 1 deadline 1 (line 4)", "abstract", "Abstract", "Abstract", "2025-05-01 23:59", "UTC-12"),
        # No label: the type is the label.
        ("entry 1 deadline 2 (line 7)", "paper", "paper", "paper", "2025-05-08 23:59", "Europe/Berlin"),
    ]
    assert [(p.position, p.message) for p in result.problems] == [
        ("entry 1 deadline 3 (line 10)", "expected a mapping, got str"),
        ("entry 1 deadline 4 (line 11)", "deadline has no 'type'; it cannot be identified"),
    ]


def test_a_typed_item_with_a_repeated_key_is_skipped_alone():
    entry, node = _entry(TYPED)
    result = ParseResult()
    repeated = {1: [ai.RepeatedKey(path=("deadlines", 0, "date"), line=7, column=5, first_line=6, index=0)]}
    specs = ai._typed_specs(entry, node, "entry 1", None, result, repeated)
    assert [s[1] for s in specs] == ["paper"]
    assert result.problems[0].position == "entry 1 deadline 1 (line 4)"
    assert "'date' at line 7 (first at line 6)" in result.problems[0].message


def test_deadlines_that_are_not_a_list_stop_the_entry():
    entry, node = _entry("id: x\ndeadlines: {type: paper}\n")
    result = ParseResult()
    assert ai._typed_specs(entry, node, "entry 2", None, result, {}) is None
    assert [p.message for p in result.problems] == ["'deadlines' is not a list"]
    # Empty (null) deadlines: no specs, and said like a flat entry without 'deadline' (not announced
    # yet) instead of passing without a word.
    entry, node = _entry("id: x\ndeadlines:\n")
    assert ai._typed_specs(entry, node, "entry 2", None, result, {}) == []
    assert len(result.problems) == 2 and result.problems[1].unannounced, result.problems


def test_flat_entries_keep_the_key_in_the_identity_and_the_label_in_titles():
    entry, _ = _entry("id: x\ndeadline: 2025-05-08 23:59\nabstract_deadline: '2025-05-01'\ntimezone: UTC\n")
    result = ParseResult()
    assert ai._flat_specs(entry, "entry 3", "UTC", result) == [
        ("entry 3 deadline", "submission", "deadline", "Paper Submission", "2025-05-08 23:59", "UTC"),
        ("entry 3 abstract_deadline", "abstract", "abstract_deadline", "Abstract Submission", "2025-05-01", "UTC"),
    ]
    assert result.problems == []


def test_a_flat_entry_without_deadline_is_unannounced_and_a_null_abstract_is_nothing():
    entry, _ = _entry("id: x\nabstract_deadline: null\n")
    result = ParseResult()
    assert ai._flat_specs(entry, "entry 4", None, result) == []
    assert len(result.problems) == 1
    problem = result.problems[0]
    assert problem.unannounced and problem.skipped and problem.position == "entry 4"


def test_date_and_zone():
    assert ai._date_and_zone("2025-5-8 23:59", "Europe/Berlin", None) == ("2025-05-08T23:59:00", "Europe/Berlin")
    # No zone of its own: the source's default; none at all is a problem.
    assert ai._date_and_zone("2025-05-08", None, "UTC") == ("2025-05-08", "UTC")
    assert "no timezone given" in ai._date_and_zone("2025-05-08", " ", None)
    assert "Mars/Olympus" in ai._date_and_zone("2025-05-08", "Mars/Olympus", None)
    # The date is judged first.
    assert "TBA" in ai._date_and_zone("TBA", "Mars/Olympus", None)


# --- applying a snapshot -----------------------------------------------------------------------------


def _rule(rule_id: str, start: str = "2025-06-01T12:00:00", title: str = "T") -> RuleRecord:
    return RuleRecord(rule_id=rule_id, title=title, start=start, tz="UTC", kind="deadline")


def _latest(rule: RuleRecord, version: int, lineage: str | None = None) -> dict:
    return {"version": version, "withdrawn": False, "content_hash": rule.content_hash(),
            "payload": rule.to_payload(), "lineage": lineage}


def test_version_rows_number_versions_and_carry_lineage():
    old_changed, old_gone, old_renamed = _rule("c"), _rule("w"), _rule("old-id")
    latest = {"c": _latest(old_changed, 4, lineage="c0"), "w": _latest(old_gone, 2),
              "old-id": _latest(old_renamed, 1)}
    added, changed, renamed = _rule("new"), _rule("c", title="T2"), _rule("new-id")
    diff = RuleDiff(added=[added, renamed], changed=[changed], withdrawn=["w", "old-id"], unchanged=3)
    rows = _version_rows(7, 99, NOW, diff, latest, {"new-id": "old-id"})
    by = {(r["rule_id"], r["withdrawn"]): r for r in rows}
    assert len(rows) == 5
    assert by[("new", False)]["version"] == 1 and by[("new", False)]["lineage"] is None
    assert by[("new-id", False)]["lineage"] == "old-id"
    # A changed rule's next version keeps the lineage it had.
    assert (by[("c", False)]["version"], by[("c", False)]["lineage"]) == (5, "c0")
    assert by[("c", False)]["payload"]["title"] == "T2"
    # A withdrawal repeats the last payload and hash under the next version.
    gone = by[("w", True)]
    assert (gone["version"], gone["payload"], gone["content_hash"]) == (3, old_gone.to_payload(),
                                                                          old_gone.content_hash())
    assert all(r["source_id"] == 7 and r["snapshot_id"] == 99 and r["valid_from"] == NOW for r in rows)
    # Added and changed first, then the withdrawals.
    assert [r["withdrawn"] for r in rows] == [False, False, False, True, True]


def test_the_parse_report_separates_counted_from_informational_records_and_caps_lists():
    counted = [ParseProblem(f"line {i}", "bad date", record_id=f"r{i}") for i in range(60)]
    note = ParseProblem("entry 9", "entry has no 'deadline' (none announced yet?)", unannounced=True)
    report = _parse_report(12, counted, [*counted, note], [f"h{i}" for i in range(250)], True)
    assert report["rules"] == 12 and report["skipped_count"] == 60 and report["accepted"] is True
    assert len(report["skipped"]) == 50 and report["skipped"][0] == {"record_id": "r0", "position": "line 0",
                                                                       "message": "bad date"}
    assert report["informational"] == [{"record_id": None, "position": "entry 9",
                                        "message": "entry has no 'deadline' (none announced yet?)"}]
    assert len(report["held"]) == 200
    notes = [ParseProblem(f"entry {i}", "none announced yet", unannounced=True) for i in range(70)]
    assert len(_parse_report(0, [], notes, [], False)["informational"]) == 50


def test_the_parse_report_makes_text_storable():
    bad = ParseProblem("line\x001", "nul\x00byte")
    report = _parse_report(0, [bad], [bad], [], False)
    assert "\x00" not in report["skipped"][0]["position"] + report["skipped"][0]["message"]


# --- the rule_versions summary -----------------------------------------------------------------------


def test_totals_count_failed_sources_and_first_seen_verdicts():
    totals = dict(rules=0, added=0, changed=0, withdrawn=0, unchanged=0, problems=0, failed_sources=0,
                  first_seen_late=0, first_seen_missed=0, first_seen_history=0)
    _add_to_totals(totals, ApplyOutcome("a", "applied", rules=5, added=2, changed=1, withdrawn=1, unchanged=1,
                                        problems=["p"], first_seen_late=1, first_seen_missed=2))
    for status in ("parse_failed", "quarantined", "no_snapshot", "unchanged"):
        _add_to_totals(totals, ApplyOutcome("b", status, rules=1, first_seen_history=1))
    assert totals == dict(rules=9, added=2, changed=1, withdrawn=1, unchanged=1, problems=1, failed_sources=3,
                          first_seen_late=1, first_seen_missed=2, first_seen_history=4)


def test_a_change_row_escapes_pipes_and_prefers_the_error():
    out = ApplyOutcome("a", "quarantined", rules=3, problems=["first | problem"], error="too many | withdrawn")
    assert change_row("cal", out) == "| cal | quarantined | 3 | 0 | 0 | 0 | too many \\| withdrawn |"
    out = ApplyOutcome("a", "applied", rules=1, added=1, problems=["x" * 300])
    assert change_row("cal", out).endswith("| " + "x" * 200 + " |")


def test_rule_instant():
    assert instant_of(_rule("a", "2025-06-01T12:00:00")) == datetime(2025, 6, 1, 12, tzinfo=UTC)
    floating = RuleRecord(rule_id="f", title="F", start="2025-06-01T12:00:00", tz=None, kind="deadline")
    assert instant_of(floating) is None
    recurring = RuleRecord(rule_id="r", title="R", start="2025-06-01T12:00:00", tz="UTC", kind="deadline",
                           rrule="FREQ=WEEKLY")
    assert instant_of(recurring) is None
