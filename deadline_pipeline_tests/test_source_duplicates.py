"""One identity, two records: duplicate rule ids and keys written twice in source data, through real
ingest and planning runs (SQLite and PostgreSQL).

Each of these once lost a deadline while the run exited 0 and ``rules_complete`` stayed green: the
parser kept the first record of a repeated id (in file order), YAML kept the last of two equal keys,
and pandas renamed a second ``due`` column to ``due.1`` and ignored it. Now a duplicate id whose
records differ keeps the one due first and counts the other as a skipped record (red, logged with
the source, the record and both lines); a key written twice skips its record; a CSV header naming
a column twice refuses the payload while the last good snapshot stays in force.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from deadline_pipeline.config import load_config
from deadline_pipeline.ingest.parsers import parse_payload
from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.plan.service import plan_all
from deadline_pipeline.store.schema import alerts, obligations
from deadline_pipeline.watch.sources import rules_complete, source_fresh
from deadline_pipeline_tests.factories import write_config

NOW = datetime(2026, 12, 1, tzinfo=UTC)
SERVICE_LOG = "deadline_pipeline.ingest.service"


def _world(tmp_path: Path, fmt: str, file: str, content: str | bytes):
    """A configuration with one source ``src`` (the file ``file`` holding ``content``), one subscriber
    and one subscription reminding 7 days and 1 day before every deadline."""
    target = tmp_path / file
    target.write_bytes(content.encode() if isinstance(content, str) else content)
    path = write_config(
        tmp_path,
        sources=[{"name": "src", "format": fmt, "location": file, "tenant": "t1", "freshness": "P1D"}],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "Europe/London"}],
        subscriptions=[{"name": "all", "sources": ["src"], "offsets": ["-P7D", "-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    )
    cfg, _ = load_config(path)
    return cfg, target


def _ingest_and_plan(engine, cfg, now):
    src = cfg.sources[0]
    fetch_snapshot(engine, src, now)
    applied = apply_latest_snapshot(engine, src, now)
    plan_all(engine, cfg, now)
    return applied


def _due(engine) -> dict[str, list[str]]:
    """rule id → the due instants (ISO UTC) of its active obligations."""
    with engine.connect() as conn:
        rows = conn.execute(select(obligations.c.rule_id, obligations.c.due_at)
                            .where(obligations.c.status == "active")).all()
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r.rule_id, []).append(r.due_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return {k: sorted(v) for k, v in out.items()}


def _open_alerts(engine) -> list[tuple[str, str]]:
    """(send instant, status) of the reminders still to send."""
    with engine.connect() as conn:
        rows = conn.execute(select(alerts.c.send_at, alerts.c.status)
                            .where(alerts.c.kind == "reminder", alerts.c.status == "pending")).all()
    return sorted((r.send_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), r.status) for r in rows)


# --- A1: a repeated rule id ---------------------------------------------------------------------------

TAX = ("title,due,timezone,url\n"
       "Estimated tax payment,{first},America/New_York,https://www.irs.gov/\n"
       "Estimated tax payment,{second},America/New_York,https://www.irs.gov/\n")


@pytest.mark.parametrize(("first", "second"), [("2027-01-15", "2027-04-15"), ("2027-04-15", "2027-01-15")])
def test_csv_rows_sharing_a_title_id_keep_the_one_due_first_and_turn_red(engine, tmp_path, caplog, first, second):
    """A CSV without ``id`` takes the title as id: two "Estimated tax payment" rows were one rule
    (the first in the file), logged as "note, nothing skipped", and rules_complete read "none
    skipped". Whatever the order, January is planned and the April row is a counted skipped record."""
    cfg, _ = _world(tmp_path, "csv", "tax.csv", TAX.format(first=first, second=second))
    with caplog.at_level(logging.WARNING, logger=SERVICE_LOG):
        applied = _ingest_and_plan(engine, cfg, NOW)
    assert applied.status == "applied" and applied.skipped == 1, applied
    # 2027-01-15 is the end of that day in New York (EST, -5).
    assert _due(engine) == {"Estimated tax payment": ["2027-01-16T04:59:59Z"]}
    april_line = 2 if first == "2027-04-15" else 3
    january_line = 5 - april_line
    check = rules_complete(engine, "src")
    assert not check.passed, check.summary
    assert f"line {april_line}: rule id 'Estimated tax payment' is also used by line {january_line}" in check.summary
    logged = [r.getMessage() for r in caplog.records if "Estimated tax payment" in r.getMessage()]
    assert any(m.startswith(f"source src: snapshot {applied.snapshot_id}: skipped record: line {april_line}: ")
               for m in logged), logged


VAT_V1 = "id,title,due,timezone\nvat,VAT return Q4 2026,2027-01-10T17:00,Europe/London\n"
VAT_V2 = ("id,title,due,timezone\nvat,VAT return Q1 2027,2027-04-10T17:00,Europe/London\n"
          "vat,VAT return Q4 2026,2027-01-10T17:00,Europe/London\n")


def test_a_row_inserted_above_under_the_same_id_does_not_supersede_the_january_reminders(engine, tmp_path):
    """v2 inserts the Q1 row above the Q4 one under the same id: the rule was read as moved to April
    and the January reminders were superseded while the January row was still in the file."""
    cfg, target = _world(tmp_path, "csv", "vat.csv", VAT_V1)
    _ingest_and_plan(engine, cfg, NOW)
    before = _open_alerts(engine)
    assert _due(engine) == {"vat": ["2027-01-10T17:00:00Z"]} and len(before) == 2

    target.write_text(VAT_V2)
    applied = _ingest_and_plan(engine, cfg, NOW + timedelta(hours=1))
    assert applied.status == "applied" and (applied.changed, applied.skipped) == (0, 1), applied
    assert _due(engine) == {"vat": ["2027-01-10T17:00:00Z"]}
    assert _open_alerts(engine) == before, "the January reminders stay owed"
    check = rules_complete(engine, "src")
    assert not check.passed and "line 2: rule id 'vat' is also used by line 3" in check.summary, check.summary


TYPED_TWICE = """
- title: CONF
  year: 2027
  id: conf27
  deadlines:
  - {type: paper, label: Paper, date: '2027-03-05 23:59:59', timezone: AoE}
  - {type: paper, label: Paper, date: '2027-03-01 23:59:59', timezone: AoE}
  - {type: abstract, date: '2027-02-20 23:59:59', timezone: AoE}
  - {type: abstract, date: '2027-02-15 23:59:59', timezone: AoE}
- {title: OTHER, year: 2027, id: other27, deadline: '2027-05-01 23:59', timezone: AoE}
- {title: OTHER, year: 2027, id: other27, deadline: '2027-04-01 23:59', timezone: AoE}
"""


def test_ai_deadlines_repeated_type_label_and_entry_id_keep_the_one_due_first(engine, tmp_path):
    """The same type and label twice (or the same type without label), or two entries with one id:
    the first in the file was kept as a note. Now each keeps the deadline due first, red."""
    cfg, _ = _world(tmp_path, "ai-deadlines", "conf.yml", TYPED_TWICE)
    applied = _ingest_and_plan(engine, cfg, NOW)
    assert applied.status == "applied" and applied.skipped == 3, applied.problems
    # AoE = UTC-12: 23:59:59 AoE is 11:59:59Z the next day.
    assert _due(engine) == {"conf27/paper/Paper": ["2027-03-02T11:59:59Z"],
                            "conf27/abstract/abstract": ["2027-02-16T11:59:59Z"],
                            "other27/submission/deadline": ["2027-04-02T11:59:00Z"]}
    check = rules_complete(engine, "src")
    assert not check.passed and check.metadata["skipped_count"] == 3
    assert "entry 1 (id=conf27, line 2) deadline 1 (line 6): rule id 'conf27/paper/Paper' is also used by " \
           "entry 1 (id=conf27, line 2) deadline 2 (line 7)" in check.summary, check.summary


def test_an_exact_copy_under_one_id_stays_a_note(engine, tmp_path):
    row = "Estimated tax payment,2027-01-15,America/New_York,https://www.irs.gov/\n"
    cfg, _ = _world(tmp_path, "csv", "tax.csv", "title,due,timezone,url\n" + row + row)
    applied = _ingest_and_plan(engine, cfg, NOW)
    assert applied.skipped == 0 and any("same content; one copy kept" in p for p in applied.problems)
    assert rules_complete(engine, "src").passed


def _calendar(*events: tuple[str, ...]) -> bytes:
    lines = ["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//t//EN"]
    for ev in events:
        lines += ["BEGIN:VEVENT", *ev, "END:VEVENT"]
    return ("\r\n".join([*lines, "END:VCALENDAR"]) + "\r\n").encode()


def test_ics_one_uid_on_two_different_events_of_equal_revision_keeps_the_one_due_first(engine, tmp_path):
    """RFC 5546 orders revisions of a UID by SEQUENCE then DTSTAMP, and that stays: a superseded
    revision is a note. Two components that tie (same SEQUENCE and DTSTAMP, as in two merged exports)
    are not revisions of one event: the first in the file was kept as a note, silently dropping the
    other deadline."""
    stamp = "DTSTAMP:20261101T000000Z"
    content = _calendar(("UID:filing", stamp, "DTSTART:20270301T120000Z", "SUMMARY:Filing B"),
                        ("UID:filing", stamp, "DTSTART:20270201T120000Z", "SUMMARY:Filing A"),
                        ("UID:moved", "SEQUENCE:1", stamp, "DTSTART:20270110T090000Z", "SUMMARY:Old"),
                        ("UID:moved", "SEQUENCE:2", stamp, "DTSTART:20270120T090000Z", "SUMMARY:New"))
    cfg, _ = _world(tmp_path, "ics", "feed.ics", content)
    applied = _ingest_and_plan(engine, cfg, NOW)
    assert applied.skipped == 1, applied.problems
    assert _due(engine) == {"filing": ["2027-02-01T12:00:00Z"], "moved": ["2027-01-20T09:00:00Z"]}
    check = rules_complete(engine, "src")
    assert not check.passed and "VEVENT UID=filing (line 4): rule id 'filing' is also used by " \
                                "VEVENT UID=filing (line 10)" in check.summary, check.summary
    assert any("superseded" in p for p in applied.problems), "the RFC 5546 revision order still applies"


# --- A2: keys written twice ---------------------------------------------------------------------------

DATE_TWICE = """
- title: CONF
  year: 2027
  id: conf27
  deadlines:
  - {type: paper, label: Paper, date: '2027-03-01 23:59:59', date: '2027-03-05 23:59:59', timezone: AoE}
  - {type: abstract, label: Abstract, date: '2027-02-20 23:59:59', timezone: AoE}
- title: FLAT
  year: 2027
  id: flat27
  deadline: '2027-04-01 23:59'
  deadline: '2027-04-08 23:59'
  timezone: AoE
- {title: GOOD, year: 2027, id: good27, deadline: '2027-05-01 23:59', timezone: AoE}
"""


def test_a_key_written_twice_in_a_source_entry_skips_that_record_red(engine, tmp_path, caplog):
    """`date:` twice in a typed item was planned for the last one (03-05) and `deadline:` twice in a
    flat entry likewise, with no problem at all. Now each is a skipped record naming both lines; the
    other deadlines of the entry and of the source are planned."""
    cfg, _ = _world(tmp_path, "ai-deadlines", "conf.yml", DATE_TWICE)
    with caplog.at_level(logging.WARNING, logger=SERVICE_LOG):
        applied = _ingest_and_plan(engine, cfg, NOW)
    assert applied.status == "applied" and applied.skipped == 2, applied.problems
    assert _due(engine) == {"conf27/abstract/Abstract": ["2027-02-21T11:59:59Z"],
                            "good27/submission/deadline": ["2027-05-02T11:59:00Z"]}
    check = rules_complete(engine, "src")
    assert not check.passed and check.metadata["skipped_count"] == 2
    messages = [f"{p['position']}: {p['message']}" for p in check.metadata["skipped"]]
    assert messages[0].startswith("entry 1 (id=conf27, line 2) deadline 1 (line 6): key written twice in one "
                                  "mapping: 'date' at line 6 (first at line 6)"), messages
    assert messages[1].startswith("entry 2 (id=flat27, line 8): key written twice in one mapping: 'deadline' "
                                  "at line 12 (first at line 11)"), messages
    assert any("source src" in r.getMessage() and "skipped record" in r.getMessage()
               and "'deadline' at line 12" in r.getMessage() for r in caplog.records)


def test_a_key_written_twice_in_a_revision_keeps_the_last_good_deadline(engine, tmp_path):
    """v2 writes the paper date twice: the rule is held at v1's date (its reminders stay owed), not
    moved to whichever date YAML happened to keep."""
    v1 = ("- {title: C, year: 2027, id: c27, deadlines: [{type: paper, date: '2027-03-01 23:59:59', timezone: AoE}]}\n"
          "- {title: D, year: 2027, id: d27, deadline: '2027-05-01 23:59', timezone: AoE}\n")
    cfg, target = _world(tmp_path, "ai-deadlines", "conf.yml", v1)
    _ingest_and_plan(engine, cfg, NOW)
    before = _open_alerts(engine)
    target.write_text(v1.replace("date: '2027-03-01 23:59:59'",
                                 "date: '2027-03-01 23:59:59', date: '2027-03-05 23:59:59'"))
    applied = _ingest_and_plan(engine, cfg, NOW + timedelta(hours=1))
    assert applied.status == "applied" and applied.held == ["c27/paper/paper"], applied
    assert _due(engine)["c27/paper/paper"] == ["2027-03-02T11:59:59Z"] and _open_alerts(engine) == before
    assert not rules_complete(engine, "src").passed


def test_a_merge_override_in_a_source_is_accepted():
    payload = (b"- &base {title: A, year: 2027, id: a27, deadline: '2027-03-01 23:59', timezone: AoE}\n"
               b"- {<<: *base, id: b27, deadline: '2027-04-01 23:59'}\n")
    result = parse_payload("ai-deadlines", payload, source="s")
    assert not result.problems
    assert {r.rule_id: r.start for r in result.rules} == {"a27/submission/deadline": "2027-03-01T23:59:00",
                                                          "b27/submission/deadline": "2027-04-01T23:59:00"}


@pytest.mark.parametrize("header", ["title,due,timezone,due", "title,due,timezone, Due "])
def test_a_csv_header_naming_a_column_twice_refuses_the_snapshot_last_good_in_force(engine, tmp_path, header):
    """pandas renamed the second `due` to `due.1` and the parser used the first without a word. The
    header governs every row, so the payload is refused: the last good snapshot stays in force and
    `source_fresh` turns red naming the column."""
    cfg, target = _world(tmp_path, "csv", "tax.csv", "title,due,timezone\nTax,2027-01-15,America/New_York\n")
    _ingest_and_plan(engine, cfg, NOW)
    before = (_due(engine), _open_alerts(engine))
    target.write_text(f"{header}\nTax,2027-01-15,America/New_York,2027-04-15\n")
    later = NOW + timedelta(hours=1)
    applied = _ingest_and_plan(engine, cfg, later)
    assert applied.status == "parse_failed"
    assert applied.error.endswith(
        "source 'src': line 1: CSV header names a column twice: 'due' (columns 2 and 4) (names are compared "
        "ignoring case and surrounding spaces); which one holds the data cannot be told, so the payload is refused")
    assert (_due(engine), _open_alerts(engine)) == before, "the last good snapshot stays in force"
    fresh = source_fresh(engine, "src", later)
    assert not fresh.passed and "names a column twice: 'due'" in fresh.summary, fresh.summary


def test_rules_complete_stays_red_for_the_snapshot_in_force_when_a_newer_payload_fails(engine, tmp_path):
    """A snapshot in force skipped a record (the April row); the next fetch is an HTML error page
    and fails to parse. Before, rules_complete judged that failed snapshot, which has no report,
    and turned green while the April record was still missing."""
    cfg, target = _world(tmp_path, "csv", "tax.csv", TAX.format(first="2027-01-15", second="2027-04-15"))
    _ingest_and_plan(engine, cfg, NOW)
    assert not rules_complete(engine, "src").passed
    target.write_text("<!DOCTYPE html><html><body>502 Bad Gateway</body></html>")
    failed = _ingest_and_plan(engine, cfg, NOW + timedelta(hours=1))
    assert failed.status == "parse_failed", failed
    check = rules_complete(engine, "src")
    assert not check.passed, check.summary
    assert "skipped 1 record(s)" in check.summary, check.summary
