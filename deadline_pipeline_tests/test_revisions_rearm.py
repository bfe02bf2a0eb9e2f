"""Revisions never cost a reminder: a moved deadline re-arms its reminders for the new instant (the
ones delivered for the old instant stay in history), one correction per subscriber per move, and a
flapping source costs corrections, never repeats. Run through ingest, planning and a real maildir
sweep, on SQLite and PostgreSQL."""

from __future__ import annotations

import mailbox
from datetime import UTC, datetime

from sqlalchemy import select

from deadline_pipeline.config import load_config
from deadline_pipeline.store.schema import alerts, obligations
from deadline_pipeline_tests.factories import ai_deadlines, write_config
from deadline_pipeline_tests.test_watch_checks import cycle


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def entry(deadline: str, **extra) -> dict:
    return {"title": "X", "year": 2026, "id": "x26", "deadline": deadline, "timezone": "AoE", **extra}


def setup(tmp_path, *entries, offsets=("-P7D", "-P1D", "PT0S"), oncall=False):
    """ann subscribed to ``conf`` on the maildir channel ``mail``; with ``oncall``, escalations are
    announced on the maildir channel ``ops`` (folder ``oncall``)."""
    (tmp_path / "conf.yml").write_text(ai_deadlines(*entries))
    channels = {"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}}
    extra = {}
    if oncall:
        channels["ops"] = {"type": "maildir", "path": str(tmp_path / "oncall")}
        extra["escalation"] = {"channels": ["ops"], "email": "ops@example.org"}
    path = write_config(
        tmp_path,
        sources=[{"name": "conf", "format": "ai-deadlines", "location": "conf.yml", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": ["conf"], "offsets": list(offsets), "channels": ["mail"]}],
        channels=channels, **extra,
    )
    return load_config(path)[0]


def mails(tmp_path, folder="maildir") -> list[str]:
    """Subjects of every message in the maildir ``folder``, oldest first."""
    if not (tmp_path / folder).exists():
        return []
    box = mailbox.Maildir(tmp_path / folder, create=False)
    return [str(box[k]["Subject"]) for k in sorted(box.keys(), key=lambda k: box[k].get_date())]


def kinds(engine) -> list[tuple]:
    with engine.connect() as conn:
        return sorted(conn.execute(
            select(alerts.c.kind, alerts.c.due_at, alerts.c.offset_seconds, alerts.c.status)
            .join(obligations, obligations.c.id == alerts.c.obligation_id)).all())


def test_extended_deadline_gets_its_reminders_at_the_new_date(engine, tmp_path):
    cfg = setup(tmp_path, entry("2026-02-18 23:59:59"))
    for day in ("2026-02-12", "2026-02-18", "2026-02-19"):
        cycle(engine, cfg, at(f"{day}T12:00:00"))
    assert len(mails(tmp_path)) == 3
    (tmp_path / "conf.yml").write_text(ai_deadlines(entry("2026-03-18 23:59:59")))
    for day in ("2026-02-20", "2026-03-12", "2026-03-18", "2026-03-19"):
        cycle(engine, cfg, at(f"{day}T12:00:00"))
    sent = mails(tmp_path)
    assert len(sent) == 7, sent  # 3 for the old date, 1 correction, 3 for the new date
    new_due = at("2026-03-19T11:59:59")
    rows = kinds(engine)
    assert sum(1 for k, due, _o, st in rows if k == "reminder" and due == new_due and st == "delivered") == 3
    assert sum(1 for k, due, _o, st in rows if k == "reminder" and due != new_due and st == "delivered") == 3
    assert sum(1 for k, *_ in rows if k == "correction") == 1


def test_moving_back_sends_no_reminder_twice(engine, tmp_path):
    """A flapping source (A → B → A) costs one correction per move, never a second reminder."""
    cfg = setup(tmp_path, entry("2026-03-18 23:59:59"), offsets=("-P7D",))
    cycle(engine, cfg, at("2026-03-12T12:00:00"))  # the -P7D reminder for 03-18 goes out
    (tmp_path / "conf.yml").write_text(ai_deadlines(entry("2026-03-25 23:59:59")))
    cycle(engine, cfg, at("2026-03-13T12:00:00"))  # correction
    (tmp_path / "conf.yml").write_text(ai_deadlines(entry("2026-03-18 23:59:59")))
    cycle(engine, cfg, at("2026-03-14T12:00:00"))  # correction; 03-18's reminder was already delivered
    for day in ("2026-03-18", "2026-03-19", "2026-03-26"):
        cycle(engine, cfg, at(f"{day}T12:00:00"))
    rows = kinds(engine)
    delivered = [(k, due) for k, due, _o, st in rows if st == "delivered"]
    assert sorted(delivered) == sorted([("reminder", at("2026-03-19T11:59:59")),
                                        ("correction", at("2026-03-26T11:59:59")),
                                        ("correction", at("2026-03-19T11:59:59"))]), rows
    assert len(mails(tmp_path)) == 3


# --------------------------------------------------------------------------- a record that stops parsing

from datetime import timedelta  # noqa: E402

from sqlalchemy import delete  # noqa: E402

from deadline_pipeline.ingest import service as ingest_service  # noqa: E402
from deadline_pipeline.ingest.service import apply_snapshot  # noqa: E402
from deadline_pipeline.plan.service import plan_all  # noqa: E402
from deadline_pipeline.watch.reconcile import reminders_owed  # noqa: E402
from deadline_pipeline.watch.sources import rules_complete  # noqa: E402
from deadline_pipeline.watch.watchdog import evaluate  # noqa: E402
from deadline_pipeline_tests.test_watch_checks import ingest  # noqa: E402

FOUR = [{"title": f"C{i}", "year": 2026, "id": f"c{i}", "deadline": f"2026-04-1{i} 23:59:59", "timezone": "UTC"}
        for i in range(4)]


def _ob_status(engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(select(obligations.c.rule_id, obligations.c.status)).all())


def test_record_that_stops_parsing_keeps_its_last_good_version(engine, tmp_path):
    cfg = setup(tmp_path, *FOUR)
    now = at("2026-03-01T12:00:00")
    cycle(engine, cfg, now)
    assert rules_complete(engine, "conf").passed
    broken = [dict(FOUR[0], timezone="Russia/Moscow"), *FOUR[1:]]  # unknown zone, same id
    (tmp_path / "conf.yml").write_text(ai_deadlines(*broken))
    ingest(engine, cfg, now + timedelta(hours=1))
    out = plan_all(engine, cfg, now + timedelta(hours=1))
    assert out.obligations_withdrawn == 0 and out.alerts_cancelled == 0
    assert _ob_status(engine)["c0/submission/deadline"] == "active"
    check = rules_complete(engine, "conf")
    assert not check.passed
    assert check.metadata["held"] == ["c0/submission/deadline"]
    (skipped,) = check.metadata["skipped"]
    assert skipped["record_id"] == "c0" and "entry 1 (id=c0, line 1)" in skipped["position"]
    assert "Russia/Moscow" in skipped["message"]
    assert f"snapshot {check.metadata['snapshot_id']}" in check.summary
    report = evaluate(engine, now + timedelta(hours=1), cfg)
    assert any(r.check == "rules_complete" and not r.ok for r in report.rows)
    # A human accepts the loss: now, and only now, the rule is withdrawn and the check is green.
    accepted = apply_snapshot(engine, cfg.sources[0], check.metadata["snapshot_id"], now + timedelta(hours=2),
                              force=True)
    assert accepted.withdrawn == 1
    plan_all(engine, cfg, now + timedelta(hours=2))
    assert _ob_status(engine)["c0/submission/deadline"] == "withdrawn"
    assert rules_complete(engine, "conf").passed


def test_ics_rrule_typo_keeps_the_series(engine, tmp_path):
    from deadline_pipeline_tests.factories import ics

    events = [dict(uid=f"e{i}@t", tzid="UTC", dtstart=f"2026040{i + 1}T120000", summary=f"E{i}",
                   rrule="FREQ=YEARLY") for i in range(4)]
    (tmp_path / "cal.ics").write_text(ics(*events), newline="")
    path = write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["-P7D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}})
    cfg = load_config(path)[0]
    now = at("2026-03-01T12:00:00")
    cycle(engine, cfg, now)
    (tmp_path / "cal.ics").write_text(ics(dict(events[0], rrule="FREQ=YEARLYY"), *events[1:]), newline="")
    ingest(engine, cfg, now + timedelta(hours=1))
    out = plan_all(engine, cfg, now + timedelta(hours=1))
    assert out.obligations_withdrawn == 0
    check = rules_complete(engine, "cal")
    assert not check.passed and check.metadata["held"] == ["e0@t"]


def test_non_empty_file_with_zero_rules_is_a_parse_failure(engine, tmp_path):
    # Every zone misspelt: the bytes are there, nothing usable comes out.
    cfg = setup(tmp_path, *[dict(e, timezone="Mars/Olympus") for e in FOUR])
    now = at("2026-03-01T12:00:00")
    for s in cfg.sources:
        ingest_service.fetch_snapshot(engine, s, now)
        out = ingest_service.apply_latest_snapshot(engine, s, now)
    assert out.status == "parse_failed" and "yield 0 rules" in out.error
    report = evaluate(engine, now, cfg)
    assert not next(r for r in report.rows if r.check == "source_fresh").ok


# --------------------------------------------------------------------------- the reconciliation


def test_reconciliation_sees_a_reminder_never_planned_for_the_new_instant(engine, tmp_path):
    cfg = setup(tmp_path, entry("2026-02-18 23:59:59"))
    for day in ("2026-02-12", "2026-02-18", "2026-02-19"):
        cycle(engine, cfg, at(f"{day}T12:00:00"))
    (tmp_path / "conf.yml").write_text(ai_deadlines(entry("2026-03-18 23:59:59")))
    cycle(engine, cfg, at("2026-02-20T12:00:00"))
    assert reminders_owed(engine, cfg, at("2026-02-20T12:00:00")).passed
    # The fault: the reminders owed for the new instant were never written (what a planner keyed on
    # (obligation, offset, channel) did, because the old instant's reminder was already delivered).
    with engine.begin() as conn:
        conn.execute(delete(alerts).where(alerts.c.due_at == at("2026-03-19T11:59:59"),
                                          alerts.c.kind == "reminder"))
    late = at("2026-03-12T12:31:00")  # the -P7D send instant (03-12 11:59:59) + the 30 min grace
    out = reminders_owed(engine, cfg, late)
    assert not out.passed and out.count == 1
    assert out.offenders[0]["due_at"] == "2026-03-19T11:59:59+00:00"
    assert out.offenders[0]["reason"].startswith("never planned")
    assert reminders_owed(engine, cfg, at("2026-03-12T12:00:00")).passed  # inside the grace: not yet


def test_reconciliation_sees_a_record_withdrawn_because_it_stopped_parsing(engine, tmp_path, monkeypatch):
    cfg = setup(tmp_path, *FOUR, offsets=("-P1D",))
    cycle(engine, cfg, at("2026-04-01T12:00:00"))
    (tmp_path / "conf.yml").write_text(ai_deadlines(dict(FOUR[0], timezone="Russia/Moscow"), *FOUR[1:]))
    # The fault: ingest withdraws what it could not parse (no rule held back).
    monkeypatch.setattr(ingest_service, "held_back", lambda withdrawn, problems, known=(): [])
    cycle(engine, cfg, at("2026-04-02T12:00:00"))
    assert _ob_status(engine)["c0/submission/deadline"] == "withdrawn"
    out = reminders_owed(engine, cfg, at("2026-04-09T13:00:00"))  # c0's -P1D was 04-09 23:59:59 … not yet
    assert out.passed
    out = reminders_owed(engine, cfg, at("2026-04-10T01:00:00"))
    assert not out.passed and out.offenders[0]["rule_id"] == "c0/submission/deadline"
    assert "cancelled as withdrawn" in out.offenders[0]["reason"]
    report = evaluate(engine, at("2026-04-10T01:00:00"), cfg)
    assert not next(r for r in report.rows if r.check == "reminders_owed").ok


def test_reconciliation_sees_a_withdrawal_by_a_record_broken_under_a_new_id(engine, tmp_path, monkeypatch):
    """The same fault when the broken record's id changed too (c0 -> c0-v2): the skipped record names
    no rule the source had, so it may have been c0, and the withdrawal is not justified."""
    cfg = setup(tmp_path, *FOUR, offsets=("-P1D",))
    cycle(engine, cfg, at("2026-04-01T12:00:00"))
    (tmp_path / "conf.yml").write_text(ai_deadlines(dict(FOUR[0], id="c0-v2", timezone="Russia/Moscow"), *FOUR[1:]))
    monkeypatch.setattr(ingest_service, "held_back", lambda withdrawn, problems, known=(): [])
    cycle(engine, cfg, at("2026-04-02T12:00:00"))
    assert _ob_status(engine)["c0/submission/deadline"] == "withdrawn"
    out = reminders_owed(engine, cfg, at("2026-04-10T01:00:00"))
    assert not out.passed and out.offenders[0]["rule_id"] == "c0/submission/deadline", out


# --------------------------------------------------------------------------- re-plan months after rolling


def test_replan_covers_the_month_a_rolled_due_date_lands_in(engine, tmp_path):
    """Due Saturday 2026-10-31 12:00 America/New_York, rolled to the following business day under the
    US calendar: due 2026-11-02T17:00Z, so November's partition must be re-planned too."""
    from deadline_pipeline.plan.service import affected_partitions, max_version_id
    from deadline_pipeline_tests.factories import ics

    (tmp_path / "cal.ics").write_text(ics(dict(uid="a@t", tzid="America/New_York", dtstart="20260915T120000",
                                               summary="A")), newline="")
    path = write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t",
                            "business_days": {"calendar": "US", "convention": "following"}}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}})
    cfg = load_config(path)[0]
    now = at("2026-09-01T12:00:00")
    cycle(engine, cfg, now)
    since = max_version_id(engine)
    (tmp_path / "cal.ics").write_text(ics(dict(uid="a@t", tzid="America/New_York", dtstart="20261031T120000",
                                               summary="A")), newline="")
    ingest(engine, cfg, now)
    assert affected_partitions(engine, cfg, since, now) == ["2026-09-01", "2026-11-01"]
    plan_all(engine, cfg, now, after=at("2026-11-01T00:00:00"), before=at("2026-12-01T00:00:00"))
    with engine.connect() as conn:
        assert conn.execute(select(obligations.c.due_at)).scalar_one() == at("2026-11-02T17:00:00")


# --------------------------------------------------------------------------- a move into the past


def test_deadline_moved_into_the_past_is_a_move(engine, tmp_path):
    cfg = setup(tmp_path, entry("2026-03-18 23:59:59"), offsets=("-P7D", "-P1D"))
    cycle(engine, cfg, at("2026-03-12T12:00:00"))  # the -P7D reminder goes out
    assert len(mails(tmp_path)) == 1
    (tmp_path / "conf.yml").write_text(ai_deadlines(entry("2026-03-12 23:59:59")))  # moved earlier: now past
    cycle(engine, cfg, at("2026-03-14T12:00:00"))
    sent = [" ".join(s.split()) for s in mails(tmp_path)]
    assert len(sent) == 2 and sent[1].startswith("Correction:"), sent
    assert "(already passed)" in sent[1] and "moved from" in sent[1]
    rows = kinds(engine)
    assert not [r for r in rows if r[0] == "cancellation"]
    # The channel had a reminder delivered: the correction tells the subscriber, no miss is escalated.
    assert not [r for r in rows if r[3] in ("pending", "escalated")], rows
    assert ("reminder", at("2026-03-19T11:59:59"), -86400, "superseded") in rows
    with engine.connect() as conn:
        ob = conn.execute(select(obligations.c.status, obligations.c.due_at, obligations.c.revision)).one()
    assert tuple(ob) == ("active", at("2026-03-13T11:59:59"), 1)
    cycle(engine, cfg, at("2026-03-15T12:00:00"))  # nothing more: no second correction, no cancellation
    assert len(mails(tmp_path)) == 2


def test_deadline_moved_into_the_past_before_any_reminder_is_escalated_as_missed(engine, tmp_path):
    """A deadline 10 days ahead with a -P1D reminder, nothing delivered yet, revised to 2 days ago:
    no reminder for it can be useful any more, and no correction was owed (none delivered). The
    subscriber must not simply hear nothing: its reminder is escalated as missed by the sweep (ERROR
    log, the on-call notice, escalations_acknowledged red), counted by planning, and nothing more on
    later runs."""
    from deadline_pipeline.plan.notices import MOVED_INTO_PAST
    from deadline_pipeline.watch import checks as w
    from deadline_pipeline_tests.test_watch_checks import deliver, plan

    cfg = setup(tmp_path, entry("2026-03-18 23:59:59"), offsets=("-P1D",), oncall=True)
    cycle(engine, cfg, at("2026-03-08T12:00:00"))
    assert mails(tmp_path) == []
    old_due, new_due = at("2026-03-19T11:59:59"), at("2026-03-07T11:59:59")
    assert kinds(engine) == [("reminder", old_due, -86400, "pending")]
    now = at("2026-03-09T12:00:00")  # 10 days before the old date; the new one passed 2 days ago
    (tmp_path / "conf.yml").write_text(ai_deadlines(entry("2026-03-06 23:59:59")))
    ingest(engine, cfg, now)
    out = plan(engine, cfg, now)
    assert (out.obligations_moved, out.corrections, out.moved_into_past_missed) == (1, 0, 1), out
    with engine.connect() as conn:
        [reason] = conn.execute(select(alerts.c.status_reason).where(alerts.c.due_at == new_due)).scalars()
    assert MOVED_INTO_PAST in reason and "2026-03-19T11:59:59" in reason, reason
    swept = deliver(engine, cfg, now)
    assert (swept.delivered, swept.escalated, swept.escalation_notices) == (0, 1, 1), swept
    assert sorted(kinds(engine)) == [("reminder", new_due, -86400, "escalated"),
                                     ("reminder", old_due, -86400, "superseded")]
    with engine.connect() as conn:
        [reason] = conn.execute(select(alerts.c.status_reason).where(alerts.c.status == "escalated")).scalars()
    assert reason.startswith("missed: the deadline 2026-03-07T11:59:59+00:00 passed"), reason
    assert reason.endswith("a revision moved it there from 2026-03-19T11:59:59+00:00"), reason
    assert mails(tmp_path) == [] and len(mails(tmp_path, "oncall")) == 1
    check = w.escalations_acknowledged(engine, now)
    assert not check.passed and check.count == 1, check.summary
    # Later runs leave it at that: no second reminder, escalation or notice.
    cycle(engine, cfg, at("2026-03-10T12:00:00"))
    assert len(kinds(engine)) == 2 and len(mails(tmp_path, "oncall")) == 1 and mails(tmp_path) == []


def test_recurring_occurrence_moved_into_the_past_on_another_day_is_escalated_as_missed(engine, tmp_path):
    """A weekly filing due on Wednesdays (-P1D) is revised on Tuesday 11 May to Mondays: the Monday
    of that week (10 May) passed before anyone knew of it. The Wednesday ahead is withdrawn and the
    Mondays ahead get their reminders; the 10 May one was never planned and nobody was told, every
    check green. It is now escalated as missed, naming the Wednesday it replaced; the Mondays before
    the last Wednesday ann knew (3 May) are history, and bob, subscribed in the same run, is owed
    nothing that passed before. Later runs add nothing."""
    from deadline_pipeline.plan.notices import MOVED_INTO_PAST
    from deadline_pipeline.watch import checks as w
    from deadline_pipeline_tests.factories import ics
    from deadline_pipeline_tests.test_watch_checks import deliver, plan

    weekly = {"uid": "w@test", "tzid": "UTC", "dtstart": "20270505T120000", "summary": "Weekly filing",
              "rrule": "FREQ=WEEKLY;COUNT=8"}

    def configure(event, subscribers):
        (tmp_path / "cal.ics").write_text(ics(event), newline="")
        return load_config(write_config(
            tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
            subscribers=[{"id": sid, "tenant": "t", "email": f"{sid}@example.org", "timezone": "UTC"}
                         for sid in subscribers],
            subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["mail"]}],
            channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")},
                      "ops": {"type": "maildir", "path": str(tmp_path / "oncall")}},
            escalation={"channels": ["ops"], "email": "ops@example.org"},
        ))[0]

    for day in ("2027-05-03", "2027-05-04", "2027-05-06"):
        cycle(engine, configure(weekly, ["ann"]), at(f"{day}T13:00:00"))
    assert len(mails(tmp_path)) == 1  # the reminder of Wednesday 5 May
    now = at("2027-05-11T12:00:00")
    revised = configure(dict(weekly, dtstart="20270503T120000"), ["ann", "bob"])
    ingest(engine, revised, now)
    out = plan(engine, revised, now)
    assert out.moved_into_past_missed == 1, out
    monday = at("2027-05-10T12:00:00")
    with engine.connect() as conn:
        missed = conn.execute(select(alerts.c.status, alerts.c.status_reason, alerts.c.previous_due_at)
                              .where(alerts.c.due_at < now, alerts.c.due_at > at("2027-05-06T00:00:00"))).all()
    assert [(status, prev) for status, _, prev in missed] == [("pending", at("2027-05-12T12:00:00"))], missed
    assert MOVED_INTO_PAST in missed[0][1], missed
    with engine.connect() as conn:
        assert conn.execute(select(obligations.c.due_at).where(obligations.c.due_at == monday)).all() == [(monday,)]
    swept = deliver(engine, revised, now)
    assert swept.escalated == 1, swept
    assert len(mails(tmp_path, "oncall")) == 1
    assert not w.escalations_acknowledged(engine, now).passed
    again = plan(engine, revised, now + timedelta(hours=1))
    assert (again.moved_into_past_missed, again.alerts_inserted) == (0, 0), again


def test_a_deadline_withdrawn_with_a_notice_and_restored_gets_a_correction(engine, tmp_path):
    """x26 (-P3D) is reminded, then withdrawn by its source (one of six editions: applied, not held
    back), and ann gets "Cancelled: … no further reminders will be sent". The source restores it at
    the same instant: with its only reminder already delivered nothing more was sent, and
    "Cancelled" stayed the last word on a deadline that stands, every check green. A correction now
    says it is due as before; later runs send nothing more."""
    editions = [entry("2026-03-18 23:59:59")] + [entry(f"2026-04-{d:02d} 23:59:59", id=f"y{d}") for d in range(1, 6)]
    cfg = setup(tmp_path, *editions, offsets=("-P3D",))
    cycle(engine, cfg, at("2026-03-16T12:00:00"))
    assert len(mails(tmp_path)) == 1
    (tmp_path / "conf.yml").write_text(ai_deadlines(*editions[1:]))
    cycle(engine, cfg, at("2026-03-16T14:00:00"))
    assert mails(tmp_path)[-1].startswith("Cancelled:"), mails(tmp_path)
    (tmp_path / "conf.yml").write_text(ai_deadlines(*editions))
    cycle(engine, cfg, at("2026-03-16T16:00:00"))
    sent = mails(tmp_path)
    assert len(sent) == 3 and sent[-1].startswith("Correction:") and "now due" in sent[-1], sent
    cycle(engine, cfg, at("2026-03-17T12:00:00"))
    assert len(mails(tmp_path)) == 3


def test_a_cancellation_notice_not_yet_sent_when_its_deadline_is_restored_is_not_sent(engine, tmp_path):
    """Withdrawn and restored between two sweeps: the cancellation notice, still pending, is cancelled
    (it would have been the last word), and no correction is owed (none went out)."""
    from deadline_pipeline_tests.test_watch_checks import plan

    editions = [entry("2026-03-18 23:59:59")] + [entry(f"2026-04-{d:02d} 23:59:59", id=f"y{d}") for d in range(1, 6)]
    cfg = setup(tmp_path, *editions, offsets=("-P3D",))
    cycle(engine, cfg, at("2026-03-16T12:00:00"))
    (tmp_path / "conf.yml").write_text(ai_deadlines(*editions[1:]))
    ingest(engine, cfg, at("2026-03-16T14:00:00"))
    assert plan(engine, cfg, at("2026-03-16T14:00:00")).cancellation_notices == 1
    (tmp_path / "conf.yml").write_text(ai_deadlines(*editions))
    cycle(engine, cfg, at("2026-03-16T16:00:00"))
    assert len(mails(tmp_path)) == 1
    assert ("cancellation", "cancelled") in {(k, st) for k, _d, _o, st in kinds(engine)}


def test_deadline_moved_before_a_partition_but_still_ahead_is_not_a_miss(engine, tmp_path):
    """Planning April alone sees an April deadline moved to 21 March as moved before its window; the
    deadline is still ahead, so nothing is left to escalate: March's planning gives it its reminder."""
    cfg = setup(tmp_path, entry("2026-04-15 23:59:59"), offsets=("-P1D",))
    now = at("2026-03-01T12:00:00")
    cycle(engine, cfg, now)
    (tmp_path / "conf.yml").write_text(ai_deadlines(entry("2026-03-20 23:59:59")))
    ingest(engine, cfg, now)
    april = plan_all(engine, cfg, now, after=at("2026-04-01T00:00:00"), before=at("2026-05-01T00:00:00"))
    assert (april.obligations_moved, april.moved_into_past_missed) == (1, 0), april
    plan_all(engine, cfg, now, after=at("2026-03-01T00:00:00"), before=at("2026-04-01T00:00:00"))
    with engine.connect() as conn:
        rows = conn.execute(select(alerts.c.due_at, alerts.c.send_at, alerts.c.status)).all()
    assert sorted(rows) == [(at("2026-03-21T11:59:59"), at("2026-03-20T11:59:59"), "pending"),
                            (at("2026-04-16T11:59:59"), at("2026-04-15T11:59:59"), "superseded")], rows


# --------------------------------------------------------------------------- renames


def _typed(label: str, edition: str = "x26") -> dict:
    return {"title": "X", "year": 2026, "id": edition,
            "deadlines": [{"type": "submission", "label": label, "date": "2026-03-18 23:59:59", "timezone": "AoE"}]}


def test_renamed_edition_keeps_its_history(engine, tmp_path):
    """An edition's id changes, nothing else: no cancellation, no reminder again; the rest go out."""
    cfg = setup(tmp_path, entry("2026-03-18 23:59:59"), *FOUR)
    cycle(engine, cfg, at("2026-03-12T12:00:00"))  # -P7D delivered
    (tmp_path / "conf.yml").write_text(ai_deadlines(entry("2026-03-18 23:59:59", id="x26-main"), *FOUR))
    for day in ("2026-03-13", "2026-03-18", "2026-03-19"):
        cycle(engine, cfg, at(f"{day}T12:00:00"))
    rows = kinds(engine)
    assert not [r for r in rows if r[0] in ("cancellation", "correction")], rows
    sent = [" ".join(s.split()) for s in mails(tmp_path)]
    assert len([s for s in sent if s.startswith("Reminder: X")]) == 3, sent  # -P7D, -P1D, PT0S: once each
    with engine.connect() as conn:
        assert conn.execute(select(obligations.c.rule_id).where(obligations.c.title.like("X%"))).scalar_one() \
            == "x26-main/submission/deadline"


def test_relabelled_deadline_keeps_its_history_and_diff_says_renamed(engine, tmp_path):
    from deadline_pipeline.ingest.diff import diff_snapshots
    from deadline_pipeline.ingest.parsers import parse_payload

    cfg = setup(tmp_path, _typed("Paper"), *FOUR)
    cycle(engine, cfg, at("2026-03-12T12:00:00"))
    (tmp_path / "conf.yml").write_text(ai_deadlines(_typed("Full paper"), *FOUR))
    ingest(engine, cfg, at("2026-03-13T12:00:00"))
    out = plan_all(engine, cfg, at("2026-03-13T12:00:00"))
    assert (out.obligations_withdrawn, out.obligations_inserted, out.cancellation_notices) == (0, 0, 0)
    old = parse_payload("ai-deadlines", ai_deadlines(_typed("Paper"), *FOUR).encode(), source="c").rules
    new = parse_payload("ai-deadlines", ai_deadlines(_typed("Full paper"), *FOUR).encode(), source="c").rules
    diff = diff_snapshots(old, new)
    assert [(c.old.rule_id, c.rule_id) for c in diff.renamed] == [("x26/submission/Paper",
                                                                  "x26/submission/Full paper")]
    assert not diff.withdrawn and not diff.added


def test_two_unrelated_deadlines_sharing_an_instant_are_not_a_rename():
    from deadline_pipeline.ingest.diff import pair_renames
    from deadline_pipeline.rules import RuleRecord

    a = RuleRecord("a/submission/deadline", "A 2026 — Paper", "2026-03-18T23:59:59", "AoE",
                   extra={"edition_id": "a", "deadline_type": "submission"})
    b = RuleRecord("b/submission/deadline", "B 2026 — Paper", "2026-03-18T23:59:59", "AoE",
                   extra={"edition_id": "b", "deadline_type": "submission"})
    assert pair_renames([a], [b]) == []
    assert pair_renames([a], [RuleRecord("a2/submission/deadline", a.title, a.start, "UTC-12",
                                         extra={"edition_id": "a2", "deadline_type": "submission"})])


# --------------------------------------------------------------------------- quarantine judges the future


def test_rolling_window_of_past_rules_is_not_quarantined():
    """A holiday file dropping its oldest years withdraws only past rules: not counted."""
    from deadline_pipeline.ingest.versions import RuleDiff, quarantine_reason

    def version(start):
        return {"withdrawn": False, "payload": {"rule_id": start, "start": start}}

    latest = {f"h{y}": version(f"{y}-12-25") for y in range(2018, 2028)}  # 10 rules, 2018..2027
    now = at("2026-01-10T00:00:00")
    dropped = RuleDiff(withdrawn=[f"h{y}" for y in range(2018, 2024)])  # 6 of 10, all past
    assert quarantine_reason(dropped, 10, 4, latest=latest, now=now) is None
    # Without the future filter the same snapshot would be quarantined (6 of 10 > 30 %).
    assert "would withdraw 6 of 10" in quarantine_reason(dropped, 10, 4)
    # Dropping future rules still trips it: both future ones (2026, 2027).
    future = RuleDiff(withdrawn=["h2026", "h2027"])
    assert "would withdraw 2 of 2 active future rules" in quarantine_reason(future, 10, 8, latest=latest, now=now)
