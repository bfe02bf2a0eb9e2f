"""A revision that moves a deadline from one due month to another, re-planned month by month as
Dagster runs them (the revision sensor's runs, or a backfill of some months), in whichever order
they run: the month the deadline left must move it, never withdraw it."""

from __future__ import annotations

import dagster as dg
import pytest
from sqlalchemy import select

from deadline_pipeline.config import load_config
from deadline_pipeline.orchestration.build import INGEST_JOB, build_definitions
from deadline_pipeline.orchestration.planning import PLAN_JOB, horizon_range, range_tags
from deadline_pipeline.orchestration.resources import parse_instant
from deadline_pipeline.store.db import make_engine
from deadline_pipeline.store.schema import alerts, obligations
from deadline_pipeline_tests.factories import ics, rolled_filings_config, write_config
from deadline_pipeline_tests.test_replan_sensor import _months, _tick
from deadline_pipeline_tests.test_revisions_rearm import mails
from deadline_pipeline_tests.test_watch_checks import deliver

A = {"uid": "a@test", "tzid": "UTC", "dtstart": "20270315T090000", "summary": "A"}


def _config(tmp_path, event):
    (tmp_path / "cal.ics").write_text(ics(event), newline="")
    return write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["-P7D", "-P1D"], "channels": ["mail"],
                        "late_policy": "skip"}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    )


def _state(engine):
    with engine.connect() as conn:
        ob = conn.execute(select(obligations.c.status, obligations.c.due_at)).one()
        rows = sorted(conn.execute(select(alerts.c.kind, alerts.c.due_at, alerts.c.offset_seconds,
                                          alerts.c.status)).all())
    return tuple(ob), rows


def _planned(instance, tmp_path, db_url, event, as_of):
    """``event`` ingested and the horizon planned at ``as_of``: the revision sensor's first tick."""
    defs = build_definitions(_config(tmp_path, event), db_url=db_url, as_of=as_of)
    assert defs.resolve_job_def(INGEST_JOB).execute_in_process(instance=instance).success
    _plan(defs, instance, as_of=as_of)
    return _tick(defs, instance)


def _revised(instance, tmp_path, db_url, event, as_of, cursor):
    """The source revised to ``event`` and ingested at ``as_of``: (configuration path, definitions,
    the revision sensor's tick from ``cursor``)."""
    path = _config(tmp_path, event)
    defs = build_definitions(path, db_url=db_url, as_of=as_of)
    assert defs.resolve_job_def(INGEST_JOB).execute_in_process(instance=instance).success
    return path, defs, _tick(defs, instance, cursor)


def _plan(defs, instance, request=None, as_of=None):
    """One successful plan_job run: the sensor's ``request`` (one month), else the horizon at ``as_of``."""
    if request is not None:
        run = dict(partition_key=request.partition_key, tags=request.tags)
    else:
        run = dict(tags=range_tags(*horizon_range(parse_instant(as_of))))
    assert defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, **run).success


@pytest.mark.parametrize("then", ["april", "horizon"])
def test_deadline_moved_to_a_later_month_planned_old_month_first(tmp_path, db_url, then):
    """A moves from 15 March to 10 April after its -P7D reminder was delivered. The sensor requests
    March and April; March runs first. March's run moved A out of its month: it must not withdraw it
    (a cancellation notice "no further reminders will be sent" for a deadline that stands, its
    reminders cancelled until April is planned), but move it, as April's run would have, and tell the
    subscriber once where the deadline went. The next run of April arms the new instant's reminders:
    the sensor's April run, or (a backfill of March alone) the hourly run of the horizon."""
    t0, t1 = "2027-03-01T00:00:00Z", "2027-03-09T00:00:00Z"
    with dg.instance_for_test() as instance:
        first = _planned(instance, tmp_path, db_url, A, t0)
        engine = make_engine(db_url)
        swept = deliver(engine, load_config(tmp_path / "deadlines.yaml")[0], parse_instant(t1))
        assert swept.delivered == 1  # -P7D, 8 March

        path, defs, tick = _revised(instance, tmp_path, db_url, dict(A, dtstart="20270410T090000"), t1, first.cursor)
        assert _months(tick) == ["2027-03-01", "2027-04-01"]
        march, april = sorted(tick.run_requests, key=lambda r: r.partition_key)
        _plan(defs, instance, march)
        ob, rows = _state(engine)
        assert ob == ("active", parse_instant("2027-04-10T09:00:00Z"))
        assert not [r for r in rows if r[0] == "cancellation"], rows

        _plan(defs, instance, april if then == "april" else None, as_of=t1)
        ob, rows = _state(engine)
        new_due = parse_instant("2027-04-10T09:00:00Z")
        assert ob == ("active", new_due)
        assert [(k, o, s) for k, due, o, s in rows if due == new_due] == [
            ("correction", 0, "pending"), ("reminder", -7 * 86400, "pending"), ("reminder", -86400, "pending")]
        swept = deliver(engine, load_config(path)[0], parse_instant(t1))
        subjects = mails(tmp_path)
        assert len(subjects) == 2 and not any("ancel" in s for s in subjects), subjects
        engine.dispose()


def _rolled_config(tmp_path, holidays):
    return rolled_filings_config(tmp_path, holidays, [("vat", "VAT return", "2027-04-30T12:00:00")])


def test_revised_holiday_replans_the_months_its_rolled_deadlines_move_between(tmp_path, db_url):
    """The VAT return is due Friday 30 April, rolled over the holidays of source ``hols``, which
    nobody subscribes to. A holiday added on 30 April rolls it to Monday 3 May: the sensor must
    request May too, not only April (the holiday's month), or nothing arms the reminder of 3 May
    until the next run of the whole horizon. Taking the holiday back moves it back: both months again
    (the withdrawn holiday has no month of its own, so nothing at all was requested)."""
    instants = iter(["2027-04-01T00:00:00Z", "2027-04-02T00:00:00Z", "2027-04-03T00:00:00Z"])
    with dg.instance_for_test() as instance:
        def revise(holidays, cursor=None):
            defs = build_definitions(_rolled_config(tmp_path, holidays), db_url=db_url, as_of=next(instants))
            assert defs.resolve_job_def(INGEST_JOB).execute_in_process(instance=instance).success
            tick = _tick(defs, instance, cursor)
            for request in sorted(tick.run_requests, key=lambda r: r.partition_key):
                assert defs.resolve_job_def(PLAN_JOB).execute_in_process(
                    instance=instance, partition_key=request.partition_key, tags=request.tags).success
            return tick

        def vat():
            with engine.connect() as conn:
                ob = conn.execute(select(obligations.c.status, obligations.c.due_at)).one()
                pending = conn.execute(select(alerts.c.due_at).where(alerts.c.status == "pending")).scalars().all()
            return tuple(ob), pending

        engine = make_engine(db_url)
        # Holidays enough that taking one back stays under the ingest's mass-withdrawal quarantine.
        others = ["2027-05-31", "2027-08-30", "2027-12-27", "2027-12-28"]
        first = revise(others)
        assert vat() == (("active", parse_instant("2027-04-30T11:00:00Z")), [parse_instant("2027-04-30T11:00:00Z")])
        added = revise([*others, "2027-04-30"], first.cursor)
        assert _months(added) == ["2027-04-01", "2027-05-01"]
        may = parse_instant("2027-05-03T11:00:00Z")
        assert vat() == (("active", may), [may])
        removed = revise(others, added.cursor)
        assert _months(removed) == ["2027-04-01", "2027-05-01"]
        assert vat() == (("active", parse_instant("2027-04-30T11:00:00Z")), [parse_instant("2027-04-30T11:00:00Z")])
        engine.dispose()


WEEKLY = {"uid": "w@test", "tzid": "America/Los_Angeles", "dtstart": "20270131T150000", "summary": "Weekly",
          "rrule": "FREQ=WEEKLY;COUNT=2"}


@pytest.mark.parametrize("then", ["february", "horizon"])
def test_series_occurrence_moved_across_a_utc_month_end_planned_old_month_first(tmp_path, db_url, then):
    """A weekly series in Los Angeles: Sunday 31 January at 15:00 (23:00Z, January's partition). Its
    source moves the series to 23:30, and that occurrence keeps its key but is now due 07:30Z on
    1 February, in February's partition, after its -P7D reminder was delivered. January's run (the
    revision sensor's, or a backfill of January alone) must move it, as for a one-off: withdrawn, it
    sent "Cancelled ... no further reminders will be sent" for a deadline that stands and cancelled
    its reminders until February was planned."""
    t0, t1 = "2027-01-20T00:00:00Z", "2027-01-25T00:00:00Z"
    old_due, new_due = parse_instant("2027-01-31T23:00:00Z"), parse_instant("2027-02-01T07:30:00Z")
    engine = make_engine(db_url)

    def sunday():
        with engine.connect() as conn:
            ob = conn.execute(select(obligations.c.status, obligations.c.due_at)
                              .where(obligations.c.period == "2027-01-31")).one()
            rows = sorted(conn.execute(select(alerts.c.kind, alerts.c.due_at, alerts.c.offset_seconds,
                                              alerts.c.status).where(alerts.c.obligation_id == select(
                                                  obligations.c.id).where(obligations.c.period == "2027-01-31")
                                                  .scalar_subquery())).all())
        return tuple(ob), rows

    with dg.instance_for_test() as instance:
        first = _planned(instance, tmp_path, db_url, WEEKLY, t0)
        assert sunday()[0] == ("active", old_due)
        assert deliver(engine, load_config(tmp_path / "deadlines.yaml")[0], parse_instant(t1)).delivered == 1

        path, defs, tick = _revised(instance, tmp_path, db_url, dict(WEEKLY, dtstart="20270131T233000"), t1,
                                    first.cursor)
        assert _months(tick) == ["2027-01-01", "2027-02-01"]
        january, february = sorted(tick.run_requests, key=lambda r: r.partition_key)
        _plan(defs, instance, january)
        ob, rows = sunday()
        assert ob == ("active", new_due)
        assert not [r for r in rows if r[0] == "cancellation" or r[3] == "cancelled"], rows
        assert ("correction", new_due, 0, "pending") in rows

        _plan(defs, instance, february if then == "february" else None, as_of=t1)
        ob, rows = sunday()
        assert ob == ("active", new_due)
        assert [(k, o, s) for k, due, o, s in rows if due == new_due] == [
            ("correction", 0, "pending"), ("reminder", -7 * 86400, "pending"), ("reminder", -86400, "pending")]
        deliver(engine, load_config(path)[0], parse_instant(t1))
        subjects = mails(tmp_path)
        assert len(subjects) == 2 and not any("ancel" in s for s in subjects), subjects
    engine.dispose()
