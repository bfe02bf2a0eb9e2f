"""A RECURRENCE-ID override (RFC 5545 §3.8.4.4) that arrives as a revision after the occurrence it
names was planned, and after a reminder of it was delivered, moves that occurrence: one correction
"moved from … to …" where a reminder was delivered, the old instant's open reminders superseded, the
new instant's armed, and no cancellation notice. So it must be whether the new date lies in the same
month or in another one, and whether the revision is re-planned whole, scoped to the changed rules,
or month by month in either order (the revision sensor's partition runs)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from deadline_pipeline.config import load_config
from deadline_pipeline.plan.service import changed_rules, max_version_id, plan_all
from deadline_pipeline.store import health
from deadline_pipeline.store.schema import alerts, obligations
from deadline_pipeline.watch import checks as w
from deadline_pipeline.watch.reconcile import reminders_owed
from deadline_pipeline_tests.factories import ics, write_config
from deadline_pipeline_tests.test_revisions_rearm import mails
from deadline_pipeline_tests.test_watch_checks import deliver, ingest, plan

MASTER = {"uid": "m@test", "tzid": "UTC", "dtstart": "20270128T090000", "summary": "Monthly return",
          "rrule": "FREQ=MONTHLY;COUNT=6"}
T0 = datetime(2027, 3, 1, tzinfo=UTC)
T1 = datetime(2027, 3, 22, tzinfo=UTC)  # after the -P7D reminder of 28 March (21 March 09:00) went out
OLD_DUE = datetime(2027, 3, 28, 9, tzinfo=UTC)
MARCH, APRIL, MAY = (datetime(2027, m, 1, tzinfo=UTC) for m in (3, 4, 5))
# The new date of the March occurrence: in April (another due month) or later in March.
NEW_DUE = {"april": datetime(2027, 4, 2, 9, tzinfo=UTC), "march": datetime(2027, 3, 30, 9, tzinfo=UTC)}


def _config(tmp_path, *events):
    (tmp_path / "cal.ics").write_text(ics(*events), newline="")
    return load_config(write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["-P7D", "-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    ))[0]


def _override(new_due: datetime) -> dict:
    return {"uid": "m@test", "tzid": "UTC", "dtstart": f"{new_due:%Y%m%dT%H%M%S}", "summary": "Monthly return",
            "recurrence_id": "20270328T090000"}


def _revised(engine, tmp_path, new_due: datetime):
    """Plan the series at T0, deliver the -P7D reminder of 28 March at T1, then ingest the override
    moving that occurrence to ``new_due``. Returns the configuration and the revision's rule scope."""
    cfg = _config(tmp_path, MASTER)
    ingest(engine, cfg, T0)
    plan(engine, cfg, T0)
    assert deliver(engine, cfg, T1).delivered == 1
    since = max_version_id(engine)
    cfg = _config(tmp_path, MASTER, _override(new_due))
    ingest(engine, cfg, T1)
    scope = changed_rules(engine, since, max_version_id(engine))
    assert scope is not None
    return cfg, scope


def _replan(engine, cfg, how: str, scope) -> None:
    """Re-plan the revision (``scope``) at T1: the whole horizon, the changed rules only, or the
    changed rules month by month (March and April, the months the occurrence leaves and enters) in
    ``how``'s order."""
    if how == "full":
        plan(engine, cfg, T1)
    elif how == "scoped":
        plan_all(engine, cfg, T1, scope=scope)
    else:
        months = [(MARCH, APRIL), (APRIL, MAY)]
        for after, before in months if how == "march_first" else months[::-1]:
            plan_all(engine, cfg, T1, after=after, before=before, scope=scope)


def _march_occurrence(engine) -> tuple[list[tuple], list[tuple]]:
    """The obligations of the March occurrence (by its old or a new due instant: status, due) and their
    alerts (kind, due, offset, status), sorted."""
    with engine.connect() as conn:
        obs = conn.execute(select(obligations.c.id, obligations.c.status, obligations.c.due_at)
                           .where(obligations.c.due_at.in_([OLD_DUE, *NEW_DUE.values()]))
                           .order_by(obligations.c.id)).all()
        rows = sorted(conn.execute(
            select(alerts.c.kind, alerts.c.due_at, alerts.c.offset_seconds, alerts.c.status)
            .where(alerts.c.obligation_id.in_([o.id for o in obs]))).all())
    return [(o.status, o.due_at) for o in obs], [tuple(r) for r in rows]


@pytest.mark.parametrize("how", ["full", "scoped", "march_first", "april_first"])
@pytest.mark.parametrize("month", ["april", "march"])
def test_override_after_a_delivered_reminder_moves_the_occurrence(engine, tmp_path, month, how):
    """The March occurrence (28 March) of a monthly series got its -P7D reminder; then the feed adds an
    override moving it to ``NEW_DUE[month]``. Before, an override was an obligation of its own
    (keyed on ``UID#<RECURRENCE-ID>``), so the master's occurrence was withdrawn: the subscriber read
    "Cancelled … no further reminders will be sent" and then got reminders of the new date. It is
    the same occurrence, moved: one correction, the old -P1D superseded, the new reminders pending."""
    new_due = NEW_DUE[month]
    cfg, scope = _revised(engine, tmp_path, new_due)
    _replan(engine, cfg, how, scope)

    obs, rows = _march_occurrence(engine)
    assert obs == [("active", new_due)], (obs, rows)
    assert rows == sorted([
        ("correction", new_due, 0, "pending"),
        ("reminder", OLD_DUE, -7 * 86400, "delivered"),
        ("reminder", OLD_DUE, -86400, "superseded"),
        ("reminder", new_due, -7 * 86400, "pending"),
        ("reminder", new_due, -86400, "pending"),
    ]), rows

    # A second re-plan of the whole horizon changes nothing; what goes out is the correction and the
    # new reminders, never a cancellation, and every reminder owed has its receipt.
    plan(engine, cfg, T1)
    assert _march_occurrence(engine) == (obs, rows)
    for at in (T1, new_due - timedelta(days=7), new_due - timedelta(days=1)):
        deliver(engine, cfg, at + timedelta(minutes=1))
    after = new_due + timedelta(hours=1)
    subjects = mails(tmp_path)
    assert len(subjects) == 4 and not any("ancel" in s for s in subjects), subjects
    owed = reminders_owed(engine, cfg, after, lookback=timedelta(days=20))
    assert owed.passed, owed.summary
    planned = w.horizon_planned(engine, cfg, after, timedelta(days=30), timedelta(days=cfg.plan.horizon_days))
    assert planned.passed, planned.summary


def test_override_moving_an_occurrence_to_another_month_planned_old_month_alone(engine, tmp_path):
    """Only March is re-planned (a backfill of the month the occurrence leaves): its run moves the
    occurrence to 2 April (one correction, the old -P1D superseded) under the override's rule id, as
    a merge records it, so the checks that recompute obligations per rule find the override planned;
    the next run of the horizon arms the new instant's reminders."""
    new_due = NEW_DUE["april"]
    cfg, scope = _revised(engine, tmp_path, new_due)
    with health.recorded_run(engine, "plan", lambda: T1):
        plan_all(engine, cfg, T1, after=MARCH, before=APRIL, scope=scope)
    obs, rows = _march_occurrence(engine)
    assert obs == [("active", new_due)], (obs, rows)
    assert rows == [("correction", new_due, 0, "pending"), ("reminder", OLD_DUE, -7 * 86400, "delivered"),
                    ("reminder", OLD_DUE, -86400, "superseded")], rows
    planned = w.horizon_planned(engine, cfg, T1, timedelta(days=30), timedelta(days=cfg.plan.horizon_days))
    assert planned.passed, planned.summary
    with engine.connect() as conn:
        rule_id = conn.execute(select(obligations.c.rule_id).where(obligations.c.due_at == new_due)).scalar_one()
    assert rule_id.startswith("m@test#"), rule_id
    plan(engine, cfg, T1)
    assert _march_occurrence(engine)[1] == sorted([*rows, ("reminder", new_due, -7 * 86400, "pending"),
                                                   ("reminder", new_due, -86400, "pending")])


@pytest.mark.parametrize("master_occurrence", ["never planned", "withdrawn"])
def test_an_override_obligation_stored_under_its_own_id_is_rekeyed_not_cancelled(engine, tmp_path, master_occurrence):
    """A store planned when an override was keyed on its own id (``UID#<RECURRENCE-ID>``, period
    ``once``) holds its obligation under that key, and, where the override came as a revision, the
    master's occurrence withdrawn under the key the override now takes. Planned again, the override's
    obligation is re-keyed in place: no cancellation notice for a deadline that stands, no reminder
    written again (its -P7D, delivered, would have been folded late and sent twice), nothing moved."""
    from sqlalchemy import insert, update

    from deadline_pipeline.plan.keys import alert_dedup_key, obligation_key

    new_due = NEW_DUE["april"]
    cfg = _config(tmp_path, MASTER, _override(new_due))
    ingest(engine, cfg, T0)
    plan(engine, cfg, T0)
    later = datetime(2027, 3, 27, tzinfo=UTC)  # after the -P7D reminder of 2 April (26 March 09:00)
    assert deliver(engine, cfg, later).delivered == 1
    with engine.begin() as conn:
        row = conn.execute(select(obligations).where(obligations.c.due_at == new_due)).one()._asdict()
        legacy = obligation_key("t", "ann", "cal", row["rule_id"], "once")
        conn.execute(update(obligations).where(obligations.c.id == row["id"])
                     .values(obligation_key=legacy, period="once"))
        for a in conn.execute(select(alerts).where(alerts.c.obligation_id == row["id"])).all():
            conn.execute(update(alerts).where(alerts.c.id == a.id).values(dedup_key=alert_dedup_key(
                legacy, a.offset_seconds, a.channel, a.kind, a.revision, a.due_at)))
        if master_occurrence == "withdrawn":
            conn.execute(insert(obligations).values({
                **{k: v for k, v in row.items() if k != "id"}, "rule_id": "m@test", "status": "withdrawn",
                "due_at": OLD_DUE}))
    before = _march_occurrence(engine)[1]
    out = plan(engine, cfg, later)
    assert (out.obligations_rekeyed, out.obligations_withdrawn, out.obligations_moved, out.cancellation_notices,
            out.alerts_inserted) == (1, 0, 0, 0, 0), out
    assert _march_occurrence(engine)[1] == before
    with engine.connect() as conn:
        keys = conn.execute(select(obligations.c.obligation_key, obligations.c.status)
                            .where(obligations.c.obligation_key.in_([row["obligation_key"], legacy]))).all()
    assert [tuple(k) for k in keys] == [(row["obligation_key"], "active")], keys
    assert plan(engine, cfg, later).obligations_rekeyed == 0
