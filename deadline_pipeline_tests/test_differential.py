"""Differential test: our expansion against ``recurring-ical-events``, file by file and rule by rule.

See :mod:`deadline_pipeline_tests.differential` for the shared conventions. Every difference must be
listed, with its exact counts and the RFC section that makes ours right, in
``differential_justified.yaml``; an unlisted or changed difference fails, and so does a listed one
that no longer differs (the list stays true).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from deadline_pipeline.ingest.parsers.base import check_recur
from deadline_pipeline_tests.differential import compare, corpus

REPO = Path(__file__).resolve().parents[1]
JUSTIFIED = Path(__file__).with_name("differential_justified.yaml")


def _justified() -> dict[tuple[str, str], tuple[int, int]]:
    entries = yaml.safe_load(JUSTIFIED.read_text())
    out = {}
    for e in entries:
        assert {"file", "uid", "only_ours", "only_reference", "difference", "rfc"} <= set(e), e
        assert "RFC 5545" in e["rfc"], e
        out[(e["file"], str(e["uid"]))] = (e["only_ours"], e["only_reference"])
    return out


def test_every_calendar_agrees_with_the_reference_or_is_justified(shared_dir):
    justified = _justified()
    files = corpus(shared_dir, REPO)
    assert len(files) > 190
    found: dict[tuple[str, str], tuple[int, int]] = {}
    identical = 0
    for name, path in files:
        outcome = compare(path.read_bytes())
        if outcome.identical:
            identical += 1
            continue
        ours, ref = Counter(u for u, _ in outcome.only_ours), Counter(u for u, _ in outcome.only_reference)
        for uid in set(ours) | set(ref):
            found[(name, uid)] = (ours[uid], ref[uid])
    unlisted = {k: v for k, v in found.items() if justified.get(k) != v}
    stale = sorted(k for k in justified if k not in found)
    assert not unlisted, f"differences not justified (or with other counts): {unlisted}"
    assert not stale, f"justified differences that no longer occur: {stale}"
    assert identical >= len(files) - len({f for f, _u in justified})


# --- generated rules against the reference ----------------------------------------------------

ZONES = ["Europe/Berlin", "America/New_York", "Australia/Sydney", "UTC", "America/Santiago", "Asia/Kolkata"]
DAYS = ["MO", "TU", "WE", "TH", "FR", "SA", "SU"]


@st.composite
def rules(draw):
    freq = draw(st.sampled_from(["YEARLY", "MONTHLY", "WEEKLY", "DAILY", "HOURLY"]))
    parts = [f"FREQ={freq}"]
    if draw(st.booleans()):
        parts.append(f"INTERVAL={draw(st.integers(1, 4))}")
    if freq in ("YEARLY", "MONTHLY") and draw(st.booleans()):
        n = draw(st.sampled_from([1, 2, 3, -1, -2]))
        parts.append(f"BYDAY={n}{draw(st.sampled_from(DAYS))}")
    elif draw(st.booleans()):
        parts.append("BYDAY=" + ",".join(draw(st.lists(st.sampled_from(DAYS), min_size=1, max_size=3,
                                                           unique=True))))
    if freq in ("YEARLY", "MONTHLY", "DAILY") and draw(st.booleans()):
        parts.append(f"BYMONTHDAY={draw(st.sampled_from([1, 15, 28, 29, 31, -1]))}")
    if freq == "YEARLY" and draw(st.booleans()):
        parts.append(f"BYMONTH={draw(st.sampled_from([1, 2, 3, 10, 12]))}")
    if freq == "YEARLY" and not any(p.startswith("BYDAY=") and p[6:7] in "-123" for p in parts) \
            and draw(st.booleans()):
        parts.append(f"BYWEEKNO={draw(st.sampled_from([1, 2, 52, 53, -1]))}")
    if any(p.startswith("BY") for p in parts[1:]) and draw(st.booleans()):
        parts.append(f"BYSETPOS={draw(st.sampled_from([1, 2, -1]))}")
    if draw(st.booleans()):
        parts.append(f"WKST={draw(st.sampled_from(DAYS))}")
    if freq == "HOURLY" or draw(st.booleans()):  # an HOURLY series to UNTIL is ~10^4 instants: slow, not harder
        parts.append(f"COUNT={draw(st.integers(1, 15))}")
    else:
        parts.append(f"UNTIL={draw(st.sampled_from(['20270301T000000Z', '20280229T120000Z', '20261231T235959Z']))}")
    return ";".join(parts)


@st.composite
def calendars(draw):
    zone = draw(st.sampled_from(ZONES))
    day = draw(st.dates(date(2024, 1, 1), date(2026, 12, 31)))
    hour = draw(st.sampled_from([0, 2, 9, 23]))
    start = datetime(day.year, day.month, day.day, hour, 30)
    rule = draw(rules())
    # A rule our strict parser refuses (BYMONTH=2;BYMONTHDAY=31 never meets) is reported at ingest,
    # not expanded: a loud refusal, not a difference of instants.
    assume(check_recur(rule) is None)
    lines = [f"DTSTART;TZID={zone}:{start:%Y%m%dT%H%M%S}", f"RRULE:{rule}"]
    for _ in range(draw(st.integers(0, 2))):
        moved = start + timedelta(days=draw(st.integers(1, 200)))
        lines.append(f"EXDATE;TZID={zone}:{moved:%Y%m%dT%H%M%S}")
    for _ in range(draw(st.integers(0, 2))):
        # Whole days from DTSTART: the reference matches an EXDATE's wall time against an RDATE's UTC
        # time (an EXDATE at 00:30 Berlin removed an RDATE at 01:30 Berlin = 00:30Z); ours compares
        # instants (RFC 5545 §3.8.5.1). Off-hour RDATEs would only rediscover that quirk.
        extra = start + timedelta(days=draw(st.integers(1, 900)))
        lines.append(f"RDATE;TZID={zone}:{extra:%Y%m%dT%H%M%S}")
    body = ["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//t//EN", "BEGIN:VEVENT", "UID:gen", "DTSTAMP:20260101T000000Z",
            "SUMMARY:s", *lines, "END:VEVENT", "END:VCALENDAR"]
    return ("\r\n".join(body) + "\r\n").encode()


def _dtstart_outside_rule(content: bytes) -> bool:
    """True when DTSTART is not an instance of its own RRULE (then COUNT readings differ, see b01)."""
    from dateutil.rrule import rrulestr

    text = content.decode()
    start = next(line for line in text.split("\r\n") if line.startswith("DTSTART"))
    rule = next(line for line in text.split("\r\n") if line.startswith("RRULE"))
    dt = datetime.strptime(start.rsplit(":", 1)[1], "%Y%m%dT%H%M%S")
    body = ";".join(p for p in rule[6:].split(";") if not p.startswith(("UNTIL", "COUNT")))
    first = next(iter(rrulestr(body + ";COUNT=1", dtstart=dt)), None)
    return first != dt


GENERATED_WINDOW = (datetime(2023, 1, 1, tzinfo=UTC), datetime(2030, 1, 1, tzinfo=UTC))


def _weekly_setpos_first_week(content: bytes, outcome) -> bool:
    """True when the only difference is the reference's pick in DTSTART's own week of a
    ``FREQ=WEEKLY`` rule with BYSETPOS and no COUNT. RFC 5545 §3.3.10 applies BYSETPOS to the set of
    the whole week (starting at WKST, default MO); dateutil, and so the reference, starts that first
    set at DTSTART and picks a later day of the week (see ``series`` in plan/occurrences.py)."""
    text = content.decode()
    rule = next(line for line in text.split("\r\n") if line.startswith("RRULE"))
    if "FREQ=WEEKLY" not in rule or "BYSETPOS=" not in rule or "COUNT=" in rule or outcome.only_ours:
        return False
    start = datetime.strptime(next(line for line in text.split("\r\n") if line.startswith("DTSTART"))
                              .rsplit(":", 1)[1], "%Y%m%dT%H%M%S")
    wkst = {"MO": 0, "TU": 1, "WE": 2, "TH": 3, "FR": 4, "SA": 5, "SU": 6}[
        next((p[5:] for p in rule[6:].split(";") if p.startswith("WKST=")), "MO")]
    week_start = (start - timedelta(days=(start.weekday() - wkst) % 7)).date()
    # Compared by date with a day's slack either side: the pairs are UTC instants of local times.
    return all(week_start - timedelta(days=1) <= datetime.fromisoformat(t.replace("Z", "+00:00")).date()
               <= week_start + timedelta(days=7) for _uid, t in outcome.only_reference)


# Derandomized so CI runs the same 100 examples every time: a new difference found while exploring
# (``--hypothesis-seed=N``) is fixed or justified here, never left to fail one run in three.
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(content=calendars())
def test_generated_rules_agree_with_the_reference(content):
    outcome = compare(content, GENERATED_WINDOW)
    assert outcome.ours_error is None and outcome.reference_error is None, (outcome.ours_error,
                                                                            outcome.reference_error)
    if outcome.identical or _weekly_setpos_first_week(content, outcome):
        return
    # The one reading that differs on purpose (RFC 5545 §3.8.5.3, listed for b01): a DTSTART outside
    # its RRULE counts toward COUNT here, so the reference has exactly one more instance (its last
    # RRULE instance) and nothing we lack.
    assert "COUNT=" in content.decode() and _dtstart_outside_rule(content), (
        sorted(outcome.only_ours)[:5], sorted(outcome.only_reference)[:5], content.decode())
    assert not outcome.only_ours and len(outcome.only_reference) == 1


def test_window_is_fixed():
    from deadline_pipeline_tests.differential import WINDOW

    assert WINDOW == (datetime(2000, 1, 1, tzinfo=UTC), datetime(2031, 1, 1, tzinfo=UTC))
