"""Unit tests of the steps of the RRULE validator and of override folding in
:mod:`deadline_pipeline.plan.recurrence`, and of the counts returned in place of module counters."""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC

import pytest
from dateutil.rrule import FR, MO, TU

from deadline_pipeline.plan import recurrence as rec
from deadline_pipeline.plan.recurrence import RRuleError
from deadline_pipeline.plan.vanished import Vanished, vanished_overrides
from deadline_pipeline.rules import RuleRecord


def test_split_parts_keeps_the_order_upper_cases_and_drops_x_parts():
    assert rec._split_parts(" RRULE:freq=weekly;X-FOO=bar;byday=mo; ") == {"FREQ": "WEEKLY", "BYDAY": "MO"}


@pytest.mark.parametrize(("text", "words"), [
    ("", "empty RRULE"),
    ("FREQ=DAILY;COUNT", "'COUNT' is not NAME=VALUE"),
    ("FREQ=DAILY;FOO=1", "FOO is unknown"),
    # dateutil would keep the last one silently (case C03).
    ("FREQ=DAILY;BYMONTH=2;BYMONTH=3", "BYMONTH appears more than once"),
])
def test_split_parts_refuses_naming_the_part(text, words):
    with pytest.raises(RRuleError, match=words):
        rec._split_parts(text)


def test_check_freq_refuses_a_missing_or_unknown_freq_and_count_with_until():
    assert rec._check_freq({"FREQ": "MONTHLY"}) == "MONTHLY"
    with pytest.raises(RRuleError, match="no FREQ"):
        rec._check_freq({"COUNT": "3"})
    with pytest.raises(RRuleError, match="FREQ='FORTNIGHTLY'"):
        rec._check_freq({"FREQ": "FORTNIGHTLY"})
    with pytest.raises(RRuleError, match="both COUNT and UNTIL"):
        rec._check_freq({"FREQ": "DAILY", "COUNT": "2", "UNTIL": "20260101"})


def test_positive_reads_digits_worth_at_least_one():
    assert rec._positive({"COUNT": "7"}, "COUNT") == 7
    assert rec._positive({}, "COUNT") is None
    for bad in ("0", "-1", "2x", "+3"):
        with pytest.raises(RRuleError, match=re.escape(f"INTERVAL={bad!r} is not a positive integer")):
            rec._positive({"INTERVAL": bad}, "INTERVAL")


def test_number_lists_map_to_dateutil_names_and_check_ranges_and_frequencies():
    parts = {"FREQ": "YEARLY", "BYMONTH": "1,12", "BYMONTHDAY": "-1", "BYSETPOS": "-1"}
    assert rec._number_lists(parts, "YEARLY") == {"bymonthday": [-1], "bymonth": [1, 12], "bysetpos": [-1]}
    with pytest.raises(RRuleError, match="BYMONTH='-1'.*outside 1..12"):
        rec._number_lists({"BYMONTH": "-1"}, "YEARLY")
    with pytest.raises(RRuleError, match="BYMONTHDAY cannot be used with FREQ=WEEKLY"):
        rec._number_lists({"BYMONTHDAY": "1"}, "WEEKLY")
    with pytest.raises(RRuleError, match="BYWEEKNO cannot be used with FREQ=MONTHLY"):
        rec._number_lists({"BYWEEKNO": "1"}, "MONTHLY")
    with pytest.raises(RRuleError, match="BYSETPOS needs another BYxxx"):
        rec._number_lists({"FREQ": "MONTHLY", "BYSETPOS": "1"}, "MONTHLY")


def test_byday_reads_ordinals_and_refuses_them_where_rfc_5545_does():
    assert rec._byday("MO,-1FR,+2TU", "MONTHLY", False) == [MO, FR(-1), TU(2)]
    assert rec._byday("MO", "WEEKLY", False) == [MO]
    with pytest.raises(RRuleError, match="ordinal weekday needs FREQ=MONTHLY"):
        rec._byday("1MO", "WEEKLY", False)
    with pytest.raises(RRuleError, match="YEARLY without BYWEEKNO"):
        rec._byday("1MO", "YEARLY", True)
    with pytest.raises(RRuleError, match="ordinal 54 is outside 1..53"):
        rec._byday("54MO", "YEARLY", False)
    with pytest.raises(RRuleError, match="'XX' is not"):
        rec._byday("MO,XX", "WEEKLY", False)


def test_the_validator_keeps_dateutils_keyword_order_and_the_canonical_text():
    recur = rec.validate_rrule("FREQ=MONTHLY;BYDAY=MO;WKST=SU;INTERVAL=2;BYMONTH=3;COUNT=4")
    assert list(recur.kwargs) == ["interval", "wkst", "bymonth", "byweekday"]
    assert (recur.count, recur.until) == (4, None)
    assert recur.text == "FREQ=MONTHLY;BYDAY=MO;WKST=SU;INTERVAL=2;BYMONTH=3;COUNT=4"


def test_lenient_parse_returns_its_count_and_rejection():
    got = rec.parse_rrule("FREQ=DAILY;BYHOUR=25", rule_id="r1")
    assert got.recur is None and got.counts == Counter({"rrule_rejected": 1})
    assert got.rejected[0] == "r1" and "BYHOUR" in got.rejected[1]
    fine = rec.parse_rrule("FREQ=DAILY")
    assert fine.recur is not None and fine.rejected is None and not fine.counts


MASTER = RuleRecord("u", "t", "2026-01-05T09:00:00", "UTC", "FREQ=WEEKLY", ("2026-01-05T09:00:00",))


def override(rid: str, start: str, **extra) -> RuleRecord:
    return RuleRecord(f"u#{rid}", "moved", start, "UTC", None, extra={"recurrence_id": rid, **extra})


def test_named_occurrences_sorts_plain_overrides_from_splits_and_counts_orphans():
    plain = override("2026-01-12T09:00:00Z", "2026-01-12T10:00:00")
    tail = override("2026-01-26T09:00:00Z", "2026-01-26T08:00:00", range="THISANDFUTURE")
    orphan = RuleRecord("x#1", "t", "2026-01-12T10:00:00", "UTC", None, extra={"recurrence_id": "1", "uid": "x"})
    cancelled_orphan = RuleRecord("y#1", "t", "2026-01-12T10:00:00", "UTC", None,
                                  extra={"recurrence_id": "1", "uid": "y", "cancelled": True})
    counts: Counter = Counter()
    exdates, splits = rec._named_occurrences([MASTER, plain, tail, orphan, cancelled_orphan], {"u": MASTER},
                                             lambda r: UTC, counts)
    assert exdates == {"u": [("2026-01-12T09:00:00", plain)]}
    assert splits == {"u": [("2026-01-26T09:00:00", tail)]}
    assert counts == Counter({"orphan_overrides": 1})


def test_fold_master_adds_exdates_once_and_chains_the_pieces_in_time_order():
    late = override("2026-02-09T09:00:00Z", "2026-02-09T09:00:00", range="THISANDFUTURE")
    early = override("2026-01-26T09:00:00Z", "2026-01-26T11:00:00", range="THISANDFUTURE")
    got = rec._fold_master(MASTER, ["2026-01-12T09:00:00", "2026-01-05T09:00:00"],
                           [("2026-02-09T09:00:00", late), ("2026-01-26T09:00:00", early)])
    master = got["u"]
    assert master.exdates == ("2026-01-05T09:00:00", "2026-01-12T09:00:00")
    assert master.extra[rec.SPLIT_BEFORE] == "2026-01-26T09:00:00"
    first, second = got[early.rule_id], got[late.rule_id]
    assert (first.extra[rec.SPLIT_FROM], first.extra[rec.SPLIT_BEFORE]) == ("2026-01-26T09:00:00",
                                                                          "2026-02-09T09:00:00")
    assert rec.SPLIT_BEFORE not in second.extra and second.extra[rec.SPLIT_FROM] == "2026-02-09T09:00:00"
    assert MASTER.exdates == ("2026-01-05T09:00:00",) and rec.SPLIT_BEFORE not in MASTER.extra  # input untouched


def test_a_tail_without_rrule_is_the_masters_series_shifted_and_with_one_is_its_own():
    moved = override("2026-01-26T09:00:00Z", "2026-01-26T11:30:00", range="THISANDFUTURE")
    tail = rec._tail(MASTER, moved, "2026-01-26T09:00:00", None)
    assert (tail.rule_id, tail.rrule, tail.start, tail.title) == ("u#2026-01-26T09:00:00Z", "FREQ=WEEKLY",
                                                                 MASTER.start, "moved")
    assert tail.extra[rec.SHIFT_SECONDS] == 9000
    own = RuleRecord("u#r", "own", "2026-01-26T11:00:00", "UTC", "FREQ=DAILY", ("2026-01-27T11:00:00",),
                     extra={"recurrence_id": "2026-01-26T09:00:00Z", "range": "THISANDFUTURE"})
    tail = rec._tail(MASTER, own, "2026-01-26T09:00:00", "2026-02-01T09:00:00")
    assert (tail.rrule, tail.start) == ("FREQ=DAILY", "2026-01-26T11:00:00")
    assert rec.SHIFT_SECONDS not in tail.extra and tail.extra[rec.SPLIT_BEFORE] == "2026-02-01T09:00:00"
    assert tail.exdates == ("2026-01-27T11:00:00", "2026-01-05T09:00:00")


def test_in_force_drops_cancelled_overrides_and_the_rrule_copied_onto_a_plain_one():
    counts: Counter = Counter()
    cancelled = override("2026-01-12T09:00:00Z", "2026-01-12T09:00:00", cancelled=True)
    assert rec._in_force(cancelled, cancelled, counts) is None
    copied = RuleRecord("u#2", "t", "2026-01-19T10:00:00", "UTC", "FREQ=WEEKLY", rdates=("2026-01-20T10:00:00",),
                        extra={"recurrence_id": "2026-01-19T09:00:00Z"})
    kept = rec._in_force(copied, copied, counts)
    assert (kept.rrule, kept.rdates) == (None, ())
    assert counts == Counter({"cancelled_occurrences": 1, "override_rrule_ignored": 1})
    assert rec._in_force(MASTER, MASTER, counts) is MASTER


def test_apply_overrides_returns_its_counts_on_the_list():
    cancelled = override("2026-01-12T09:00:00Z", "2026-01-12T09:00:00", cancelled=True)
    got = rec.apply_overrides([cancelled, MASTER])
    assert isinstance(got, list) and [r.rule_id for r in got] == ["u"]
    assert got[0].exdates == ("2026-01-05T09:00:00", "2026-01-12T09:00:00")
    assert got.counts == Counter({"cancelled_occurrences": 1})


def test_vanished_overrides_returns_its_counts_on_the_dict():
    master = RuleRecord("w", "t", "2026-01-05T09:00:00", "UTC", "FREQ=WEEKLY;COUNT=2")
    gone = RuleRecord("w#2026-01-19T09:00:00Z", "t", "2026-01-19T09:00:00", "UTC", None,
                      extra={"recurrence_id": "2026-01-19T09:00:00Z"})
    here = RuleRecord("w#2026-01-12T09:00:00Z", "t", "2026-01-12T10:00:00", "UTC", None,
                      extra={"recurrence_id": "2026-01-12T09:00:00Z"})
    got = vanished_overrides([master, gone, here])
    assert isinstance(got, Vanished) and list(got) == [gone.rule_id]
    assert "no longer has" in got[gone.rule_id]
    assert got.counts == Counter({"vanished_overrides": 1})
