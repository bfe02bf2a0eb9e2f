"""A rule first seen after its deadline had passed: published late by the source (a note, no page),
or passed while the source was not fetched (escalated as missed, naming the gap), or past when the
source was first watched (history). Judged from the fetch log; SQLite and PostgreSQL."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from sqlalchemy import event, select

from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.plan.first_seen import (
    LATE_PUBLISHED,
    MISSED_UNWATCHED,
    NOT_WATCHED,
    FirstSeenPassed,
    passed_instant,
    verdict,
)
from deadline_pipeline.plan.notices import PASSED_UNWATCHED
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.store.schema import alerts
from deadline_pipeline.watch import checks as w
from deadline_pipeline_tests.factories import ai_deadlines
from deadline_pipeline_tests.test_revisions_rearm import at, entry, kinds, mails, setup
from deadline_pipeline_tests.test_watch_checks import cycle, deliver, plan

DAY = timedelta(days=1)

# --- pure ---------------------------------------------------------------------------------------------


def test_verdict_boundaries():
    instant = at("2026-03-06T12:00:00")
    assert verdict(instant, None, DAY) == NOT_WATCHED
    assert verdict(instant, instant - DAY, DAY) == LATE_PUBLISHED  # exactly the window: watched
    assert verdict(instant, instant - timedelta(seconds=1), DAY) == LATE_PUBLISHED
    assert verdict(instant, instant - DAY - timedelta(seconds=1), DAY) == MISSED_UNWATCHED


def test_passed_instant_is_only_for_one_off_rules_already_past():
    rule = RuleRecord(rule_id="c/d", title="C", start="2026-03-05T23:59:59", tz="UTC-12")
    due = at("2026-03-06T11:59:59")
    assert passed_instant(rule, due + timedelta(seconds=1)) == due
    assert passed_instant(rule, due) is None  # not past yet
    weekly = RuleRecord(rule_id="c/w", title="C", start="2026-03-05T23:59:59", tz="UTC", rrule="FREQ=WEEKLY;COUNT=2")
    assert passed_instant(weekly, at("2027-01-01T00:00:00")) is None


def test_describe_names_the_gap():
    j = FirstSeenPassed("conf", "x/d", 1, at("2026-03-06T12:00:00"), at("2026-03-08T12:00:00"), MISSED_UNWATCHED,
                        at("2026-03-01T12:00:00"), at("2026-03-08T12:00:00"))
    assert j.describe() == ("no successful fetch of source conf between 2026-03-01T12:00:00+00:00 and "
                            "2026-03-08T12:00:00+00:00; deadline x/d at 2026-03-06T12:00:00+00:00 passed in that gap")


# --- synthetic, through ingest, planning and the sweep --------------------------------------------------

FAR = entry("2026-06-18 23:59:59", id="far")
PASSED = entry("2026-03-05 23:59:59", id="passed", title="P")  # AoE: due 2026-03-06T11:59:59Z


# The read of who was planned for per source (store/plan_history.planned_pairs): it scans every stored
# obligation of its sources, so planning makes it only where a deadline may have passed unwatched.
PAIRS_READ = "SELECT DISTINCT obligations.subscriber_id, obligations.source_id"


@contextmanager
def statements(engine):
    """The SQL statements run on ``engine`` inside the block, whitespace collapsed."""
    seen: list[str] = []

    def listen(conn, cursor, statement, *args):
        seen.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", listen)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", listen)


def _ingest(engine, cfg, now):
    src = cfg.sources[0]
    fetch_snapshot(engine, src, now)
    return apply_latest_snapshot(engine, src, now)


def test_deadline_published_after_it_passed_is_a_note_not_a_page(engine, tmp_path, caplog):
    """Fetched every day from 1 March; the source adds a deadline due 6 March only on 8 March. The
    fetch of 5 March 12:00 (within the 1-day window before the deadline) did not have it: the source
    published it late. Noted (WARNING, counted on the apply outcome), nothing escalated."""
    cfg = setup(tmp_path, FAR, offsets=("-P7D", "-P1D"), oncall=True)
    for day in range(1, 8):
        cycle(engine, cfg, at(f"2026-03-0{day}T12:00:00"))
    (tmp_path / "conf.yml").write_text(ai_deadlines(FAR, PASSED))
    now = at("2026-03-08T12:00:00")
    out = _ingest(engine, cfg, now)
    assert (out.added, out.first_seen_late, out.first_seen_missed) == (1, 1, 0), out
    assert "published deadline passed/" in out.first_seen_notes[0], out.first_seen_notes
    assert "its fetch at 2026-03-05T12:00:00+00:00 did not have it" in out.first_seen_notes[0]
    with statements(engine) as ran:
        assert plan(engine, cfg, now).missed_while_unwatched == 0
    assert not [s for s in ran if PAIRS_READ in s]  # nothing passed unwatched: the store is not scanned
    swept = deliver(engine, cfg, now)
    assert swept.escalated == 0 and mails(tmp_path, "oncall") == []
    assert [due for _k, due, _o, _s in kinds(engine)] == [at("2026-06-19T11:59:59")] * 2
    assert w.escalations_acknowledged(engine, now).passed


def test_deadline_that_passed_while_the_source_was_not_fetched_is_escalated(engine, tmp_path):
    """Fetched on 1 March; the pipeline is down until 8 March, and the deadline due 6 March appears
    meanwhile. The last fetch before it is 5 days old (window 1 day): escalated as missed through the
    sweep (on-call notice, escalations_acknowledged red), the reason naming the gap; nothing more on
    later runs."""
    cfg = setup(tmp_path, FAR, offsets=("-P7D", "-P1D"), oncall=True)
    cycle(engine, cfg, at("2026-03-01T12:00:00"))
    (tmp_path / "conf.yml").write_text(ai_deadlines(FAR, PASSED))
    now = at("2026-03-08T12:00:00")
    out = _ingest(engine, cfg, now)
    assert (out.first_seen_late, out.first_seen_missed) == (0, 1), out
    with statements(engine) as ran:
        assert plan(engine, cfg, now).missed_while_unwatched == 1
    assert [s for s in ran if PAIRS_READ in s]
    due = at("2026-03-06T11:59:59")
    with engine.connect() as conn:
        [(offset, reason)] = conn.execute(select(alerts.c.offset_seconds, alerts.c.status_reason)
                                          .where(alerts.c.due_at == due)).all()
    assert offset == -86400  # the reminder nearest the deadline, keyed as planning keys it
    gap = ("no successful fetch of source conf between 2026-03-01T12:00:00+00:00 and 2026-03-08T12:00:00+00:00; "
           "deadline passed/submission/deadline at 2026-03-06T11:59:59+00:00 passed in that gap")
    assert PASSED_UNWATCHED in reason and gap in reason, reason
    swept = deliver(engine, cfg, now)
    assert (swept.delivered, swept.escalated, swept.escalation_notices) == (0, 1, 1), swept
    with engine.connect() as conn:
        [reason] = conn.execute(select(alerts.c.status_reason).where(alerts.c.status == "escalated")).scalars()
    assert reason.startswith("missed: the deadline 2026-03-06T11:59:59+00:00 passed") and gap in reason, reason
    assert mails(tmp_path) == [] and len(mails(tmp_path, "oncall")) == 1
    assert not w.escalations_acknowledged(engine, now).passed
    before = kinds(engine)
    assert plan(engine, cfg, now).missed_while_unwatched == 0
    cycle(engine, cfg, at("2026-03-09T12:00:00"))
    assert kinds(engine) == before and len(mails(tmp_path, "oncall")) == 1


def test_past_deadline_in_a_sources_first_fetch_is_history(engine, tmp_path):
    """A brand-new store: the source's first fetch has no earlier look to have missed anything in."""
    cfg = setup(tmp_path, FAR, PASSED, offsets=("-P1D",), oncall=True)
    now = at("2026-03-08T12:00:00")
    out = _ingest(engine, cfg, now)
    assert (out.first_seen_history, out.first_seen_late, out.first_seen_missed) == (1, 0, 0), out
    assert plan(engine, cfg, now).missed_while_unwatched == 0
    assert deliver(engine, cfg, now).escalated == 0 and mails(tmp_path, "oncall") == []


# --- real data: PWC ai-deadlines revisions of 2020 ----------------------------------------------------

ISMIR_ABSTRACT_DUE = datetime(2020, 4, 11, 11, 59, 59, tzinfo=UTC)  # '2020-04-10 23:59:59' UTC-12


def _pwc(shared_dir, date: str) -> bytes:
    [path] = (shared_dir / "data" / "ai-deadlines-pwc" / "revisions").glob(f"conferences.*.{date}.yml")
    return path.read_bytes()


def _replay(engine, tmp_path, shared_dir, served: list[tuple[datetime, str]], fetched: list[datetime]):
    """Run the pipeline (fetch and apply, plan, sweep) at each instant of ``fetched`` (chronological),
    the file serving the revision of ``served`` ((from, revision date)) in force at that instant.
    Returns the apply outcomes that judged a rule first seen after its deadline, and the last run's
    plan and sweep outcomes."""
    cfg = setup(tmp_path, FAR, offsets=("-P7D", "-P1D"), oncall=True)
    judged = []
    for now in fetched:
        revision = [rev for since, rev in served if since <= now][-1]
        (tmp_path / "conf.yml").write_bytes(_pwc(shared_dir, revision))
        out = _ingest(engine, cfg, now)
        if out.first_seen_late or out.first_seen_missed:
            judged.append(out)
        planned = plan(engine, cfg, now)
        swept = deliver(engine, cfg, now)
    return cfg, judged, planned, swept


def test_ismir20_published_after_its_abstract_deadline_does_not_page(shared_dir, engine, tmp_path):
    """The real history: fetched every day from 19 February 2020; ismir20 (abstract deadline due
    2020-04-11T11:59:59Z) appears only in the revision of 17 April. The fetch of 11 April 00:00 did not
    have it: a late publication, noted, and no page for it or for anything else."""
    served = [(datetime(2020, 2, 19, tzinfo=UTC), "2020-02-19"), (datetime(2020, 4, 17, tzinfo=UTC), "2020-04-17")]
    fetched = [datetime(2020, 2, 19, tzinfo=UTC) + n * DAY for n in range(59)]  # through 17 April
    _cfg, judged, planned, swept = _replay(engine, tmp_path, shared_dir, served, fetched)
    [out] = judged
    ismir = [n for n in out.first_seen_notes if "ismir20" in n]
    assert out.first_seen_missed == 0 and out.first_seen_late >= 1 and len(ismir) == 1, out.first_seen_notes
    assert "published deadline ismir20" in ismir[0] and ISMIR_ABSTRACT_DUE.isoformat() in ismir[0], ismir
    assert "its fetch at 2020-04-11T00:00:00+00:00 did not have it" in ismir[0], ismir
    assert planned.missed_while_unwatched == 0 and swept.escalated == 0, (planned, swept)
    with engine.connect() as conn:
        assert conn.execute(select(alerts.c.id).where(alerts.c.status == "escalated")).all() == []
    assert mails(tmp_path, "oncall") == []


def test_ismir20_published_before_its_deadline_and_missed_while_down_pages(shared_dir, engine, tmp_path):
    """The same files with the pipeline down across the deadline: fetched daily from 19 February to
    1 April; the revision with ismir20 is served from 5 April (before its abstract deadline,
    2020-04-11T11:59:59Z); the next fetch is on 13 April. The gap 1 April → 13 April is named, and the
    sweep right after that fetch escalates it: the on-call notice goes out, escalations_acknowledged
    turns red."""
    served = [(datetime(2020, 2, 19, tzinfo=UTC), "2020-02-19"), (datetime(2020, 4, 5, tzinfo=UTC), "2020-04-17")]
    fetched = [datetime(2020, 2, 19, tzinfo=UTC) + n * DAY for n in range(43)]  # through 1 April
    resumed = datetime(2020, 4, 13, tzinfo=UTC)
    _cfg, judged, planned, swept = _replay(engine, tmp_path, shared_dir, served, [*fetched, resumed])
    [out] = judged
    gap = (f"no successful fetch of source conf between 2020-04-01T00:00:00+00:00 and {resumed.isoformat()}; "
           f"deadline ismir20")
    assert any(gap in n and ISMIR_ABSTRACT_DUE.isoformat() in n for n in out.first_seen_notes), out.first_seen_notes
    assert planned.missed_while_unwatched >= 1 and swept.escalated == planned.missed_while_unwatched, (planned, swept)
    with engine.connect() as conn:
        reasons = conn.execute(select(alerts.c.status_reason).where(
            alerts.c.status == "escalated", alerts.c.due_at == ISMIR_ABSTRACT_DUE)).scalars().all()
    assert len(reasons) == 1 and gap in reasons[0], reasons
    assert len(mails(tmp_path, "oncall")) >= 1
    assert not w.escalations_acknowledged(engine, resumed).passed


def test_reminders_owed_and_the_watchdog_count_a_deadline_that_passed_unwatched(engine, tmp_path):
    """Ingest alone after the gap (planning has not run, or failed to leave the escalation): both the
    reconciliation and the watchdog's passed_unwatched row are red, naming the gap. Once planning
    left the reminder the sweep escalates, both count it and pass (escalations_acknowledged stays
    red until a human acknowledges it)."""
    from deadline_pipeline.watch.reconcile import reminders_owed
    from deadline_pipeline.watch.watchdog import evaluate

    cfg = setup(tmp_path, FAR, offsets=("-P7D", "-P1D"), oncall=True)
    cycle(engine, cfg, at("2026-03-01T12:00:00"))
    (tmp_path / "conf.yml").write_text(ai_deadlines(FAR, PASSED))
    now = at("2026-03-08T12:00:00")
    _ingest(engine, cfg, now)
    gap = "no successful fetch of source conf between 2026-03-01T12:00:00+00:00 and 2026-03-08T12:00:00+00:00"
    owed = reminders_owed(engine, cfg, now)
    assert not owed.passed and owed.count == 1 and gap in owed.summary, owed.summary
    assert owed.offenders[0]["reason"].startswith("never escalated: " + gap), owed.offenders
    [row] = [r for r in evaluate(engine, now, cfg).rows if r.check == "passed_unwatched"]
    assert not row.ok and "1 deadline(s) passed while their source was not fetched, 1 never escalated" \
        in row.detail and gap in row.detail, row.detail
    plan(engine, cfg, now)
    deliver(engine, cfg, now)
    owed = reminders_owed(engine, cfg, now)
    assert owed.passed and "1 deadline(s) passed while their source was not fetched" in owed.summary, owed.summary
    [row] = [r for r in evaluate(engine, now, cfg).rows if r.check == "passed_unwatched"]
    assert row.ok and "0 never escalated" in row.detail, row.detail
    assert not w.escalations_acknowledged(engine, now).passed
