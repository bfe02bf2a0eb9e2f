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


def _dtstart_after_until(content: bytes, outcome) -> bool:
    """True when the only difference is DTSTART itself, after its RRULE's UNTIL: we plan it (RFC 5545
    §3.8.5.3: DTSTART is always an instance), the reference applies UNTIL to it (listed for
    ``calendars/dtstart_after_until.ics``). A generated DTSTART late on 2026-12-31 west of UTC is
    after ``UNTIL=20261231T235959Z``."""
    from deadline_pipeline.plan.recurrence import to_instant
    from deadline_pipeline.timezones import resolve_zone

    lines = content.decode().split("\r\n")
    rule = next(line for line in lines if line.startswith("RRULE"))
    until = next((p[len("UNTIL="):] for p in rule[len("RRULE:"):].split(";") if p.startswith("UNTIL=")), None)
    if until is None or outcome.only_reference:
        return False
    head, value = next(line for line in lines if line.startswith("DTSTART")).rsplit(":", 1)
    start = to_instant(datetime.strptime(value, "%Y%m%dT%H%M%S"), resolve_zone(head.split("TZID=", 1)[1]))
    bound = datetime.strptime(until, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    return start > bound and outcome.only_ours == [("gen", start.strftime("%Y-%m-%dT%H:%M:%SZ"))]


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
    if outcome.identical or _weekly_setpos_first_week(content, outcome) or _dtstart_after_until(content, outcome):
        return
    # The one reading that differs on purpose (RFC 5545 §3.8.5.3, listed for b01): a DTSTART outside
    # its RRULE counts toward COUNT here, so the reference has exactly one more instance (its last
    # RRULE instance) and nothing we lack.
    assert "COUNT=" in content.decode() and _dtstart_outside_rule(content), (
        sorted(outcome.only_ours)[:5], sorted(outcome.only_reference)[:5], content.decode())
    assert not outcome.only_ours and len(outcome.only_reference) == 1


# --- a gap that maps two local occurrences onto one instant -------------------------------------
# (zone, first nonexistent wall time, first existing one after it), in years where the machine's zone
# data and the tzdata package agree: a whole skipped day, one-hour gaps (at 02:00 and at midnight) and
# Lord Howe's half hour.
GAPS = [("Pacific/Apia", datetime(2011, 12, 30), datetime(2011, 12, 31)),
        ("America/New_York", datetime(2025, 3, 9, 2), datetime(2025, 3, 9, 3)),
        ("Europe/Berlin", datetime(2026, 3, 29, 2), datetime(2026, 3, 29, 3)),
        ("America/Santiago", datetime(2025, 9, 7, 0), datetime(2025, 9, 7, 1)),
        ("Australia/Lord_Howe", datetime(2025, 10, 5, 2), datetime(2025, 10, 5, 2, 30))]


@st.composite
def gap_calendars(draw, gap):
    """A rule whose wall-clock series can hold a time inside ``gap`` (one of :data:`GAPS`) and the time
    its instant reads as (that time plus the gap's length), with a DTSTART that matches the rule a
    few days before."""
    zone, start, end = gap
    inside = start + timedelta(minutes=draw(st.integers(0, int((end - start).total_seconds()) // 60 - 1)))
    partner = inside + (end - start)
    days = draw(st.integers(1, 3))
    first = inside - timedelta(days=days)
    count = draw(st.integers(days + 1, days + 3)) * (1 if partner.time() == inside.time() else 4)
    hours = ",".join(str(h) for h in sorted({inside.hour, partner.hour}))
    minutes = ",".join(str(m) for m in sorted({inside.minute, partner.minute}))
    rule = draw(st.sampled_from([
        f"FREQ=DAILY;COUNT={count}",
        f"FREQ=DAILY;BYHOUR={hours};BYMINUTE={minutes};COUNT={count}",
        f"FREQ=HOURLY;BYHOUR={hours};BYMINUTE={minutes};COUNT={count}",
    ]))
    lines = [f"DTSTART;TZID={zone}:{first:%Y%m%dT%H%M%S}", f"RRULE:{rule}"]
    body = ["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//t//EN", "BEGIN:VEVENT", "UID:gap", "DTSTAMP:20260101T000000Z",
            "SUMMARY:s", *lines, "END:VEVENT", "END:VCALENDAR"]
    return ("\r\n".join(body) + "\r\n").encode()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(data=st.data())
def test_across_a_gap_the_only_difference_is_the_reference_repeating_an_instant(data):
    """RFC 5545 §3.3.5 reads a nonexistent local time with the offset before the gap, so it can name
    the instant of an occurrence that exists; §3.8.5.3 ignores duplicate instances. The reference
    yields such an instant twice (listed for ``repo/deadline_pipeline_tests/calendars/zone_gaps.ics``
    in the justified differences); ours yields every instant once and otherwise agrees. Each example
    crosses every gap of :data:`GAPS` (drawn by chance, a zone could go untested)."""
    for gap in GAPS:
        content = data.draw(gap_calendars(gap))
        outcome = compare(content, (datetime(2000, 1, 1, tzinfo=UTC), datetime(2031, 1, 1, tzinfo=UTC)))
        assert outcome.ours_error is None and outcome.reference_error is None, (outcome.ours_error,
                                                                                outcome.reference_error)
        assert max(outcome.ours.values()) == 1, (sorted(outcome.ours.elements()), content.decode())
        assert not outcome.only_ours, (outcome.only_ours, content.decode())
        for pair in outcome.only_reference:
            assert (outcome.reference[pair], outcome.ours[pair]) == (2, 1), (pair, content.decode())


def test_the_reference_repeats_the_instant_of_the_skipped_samoan_day_that_ours_keeps_once():
    """DAILY at 09:00 from 2011-12-28, COUNT=5, in Pacific/Apia: recurring-ical-events yields five
    instances, 28, 29, 30 (09:00 read at UTC-10), 31 December (at UTC+14) and 1 January, the middle
    two both 2011-12-30T19:00Z; ours yields the four instants once each."""
    body = ["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//t//EN", "BEGIN:VEVENT", "UID:gap", "DTSTAMP:20260101T000000Z",
            "SUMMARY:s", "DTSTART;TZID=Pacific/Apia:20111228T090000", "RRULE:FREQ=DAILY;COUNT=5", "END:VEVENT",
            "END:VCALENDAR"]
    outcome = compare(("\r\n".join(body) + "\r\n").encode())
    assert outcome.only_reference == [("gap", "2011-12-30T19:00:00Z")] and not outcome.only_ours
    assert outcome.ours.total() == 4


def test_window_is_fixed():
    from deadline_pipeline_tests.differential import WINDOW

    assert WINDOW == (datetime(2000, 1, 1, tzinfo=UTC), datetime(2031, 1, 1, tzinfo=UTC))
