"""A rule id longer than the store keeps (``rules.RULE_ID_MAX``, 500 characters) skips its record alone,
naming the limit, in every format: RFC 5545 sets no bound on a UID (§3.8.4.7), and PostgreSQL refused
the longer value, so one such VEVENT failed the source's ingest with ``StringDataRightTruncation`` and
a traceback, every other rule of the feed with it (SQLite stored it, so the two stores disagreed)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from deadline_pipeline.ingest.parsers import parse_payload
from deadline_pipeline.rules import RULE_ID_MAX
from deadline_pipeline_tests.factories import ai_deadlines, ics, ingest_and_plan_feed

T0 = datetime(2027, 1, 10, tzinfo=UTC)
LONG = "u" * (RULE_ID_MAX + 1)
LIMIT = f"characters long; the store keeps at most {RULE_ID_MAX}"
NEAR_ICS = {"uid": "near", "tzid": "America/New_York", "dtstart": "20270301T090000", "summary": "Near"}
NEAR_AI = {"id": "near27", "title": "Near", "year": 2027, "deadline": "2027-03-01 23:59:59", "timezone": "UTC-12"}

PAYLOADS = {
    "ics": ics({"uid": LONG, "tzid": "America/New_York", "dtstart": "20270302T090000", "summary": "Long"},
               NEAR_ICS),
    "ai-deadlines": ai_deadlines({"id": LONG, "title": "Long", "year": 2027, "deadline": "2027-03-02 23:59:59",
                                  "timezone": "UTC-12"}, NEAR_AI),
    "csv": f"id,title,due,timezone\n{LONG},Long,2027-03-02,UTC\nnear,Near,2027-03-01,UTC\n",
}


@pytest.mark.parametrize("fmt", sorted(PAYLOADS))
def test_a_rule_id_longer_than_the_store_keeps_skips_its_record_alone(fmt):
    result = parse_payload(fmt, PAYLOADS[fmt].encode(), source="s")
    (problem,) = result.problems
    assert problem.skipped and LIMIT in problem.message, problem
    assert [len(r.rule_id) <= RULE_ID_MAX for r in result.rules] == [True]


def test_an_override_whose_uid_and_recurrence_id_exceed_the_limit_is_skipped():
    """The id of an override is UID#RECURRENCE-ID: a UID under the limit may yield one over it."""
    uid = "o" * (RULE_ID_MAX - 5)
    payload = ics({"uid": uid, "tzid": "UTC", "dtstart": "20270301T090000", "summary": "S", "rrule": "FREQ=DAILY"},
                  {"uid": uid, "tzid": "UTC", "dtstart": "20270302T120000", "summary": "S moved",
                   "recurrence_id": "20270302T090000"})
    result = parse_payload("ics", payload.encode(), source="s")
    assert [r.rule_id for r in result.rules] == [uid]
    (problem,) = result.problems
    assert problem.skipped and LIMIT in problem.message, problem


@pytest.mark.parametrize("fmt", ["ics", "csv"])
def test_a_feed_with_a_long_rule_id_is_ingested_and_its_other_rules_planned(engine, tmp_path, fmt):
    """On PostgreSQL the ingest failed whole before; now the long record is skipped (``rules_complete``
    red, naming the limit) and the other rule is stored and planned, on both stores alike."""
    applied, planned, check = ingest_and_plan_feed(engine, tmp_path, fmt, PAYLOADS[fmt], T0)
    assert applied.status == "applied" and applied.skipped == 1, applied
    assert planned == {"near"}
    assert not check.passed and LIMIT in check.summary, check.summary
