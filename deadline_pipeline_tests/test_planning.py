"""Planning that is safe to recompute, on SQLite and PostgreSQL: moves, corrections, withdrawals,
late reminders, quiet hours, subscriber changes, partitions and backfills."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update

from deadline_pipeline.config import load_config
from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.plan.planner import Target, apply_quiet_hours, fold_late, plan_target
from deadline_pipeline.plan.service import plan_all
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.store.schema import alerts, obligations, subscribers
from deadline_pipeline.timezones import resolve_zone
from deadline_pipeline_tests.factories import ics, ingest_and_plan, write_config

UTC = UTC
T0 = datetime(2027, 1, 10, tzinfo=UTC)
A = {"uid": "a@test", "tzid": "Europe/Berlin", "dtstart": "20270115T120000", "summary": "Report A"}
B = {"uid": "b@test", "tzid": "UTC", "dtstart": "20270301T090000", "summary": "Report B"}
C = {"uid": "c@test", "tzid": "UTC", "dtstart": "20270302T090000", "summary": "Report C"}
D = {"uid": "d@test", "tzid": "UTC", "dtstart": "20270303T090000", "summary": "Report D"}


def _configure(tmp_path, events, subscribers_=None, **subscription):
    (tmp_path / "cal.ics").write_text(ics(*events), newline="")
    path = write_config(
        tmp_path,
        sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=subscribers_ or [
            {"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "Europe/Berlin"}],
        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["-P7D", "-P1D"], "channels": ["mail"],
                        **subscription}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    )
    return load_config(path)[0]


_ingest_plan = ingest_and_plan


def _alerts(engine, rule_id=None):
    q = (select(alerts.c.kind, alerts.c.offset_seconds, alerts.c.status, alerts.c.send_at, alerts.c.previous_due_at,
                alerts.c.status_reason, alerts.c.due_at, obligations.c.rule_id)
         .join(obligations, obligations.c.id == alerts.c.obligation_id).order_by(alerts.c.id))
    if rule_id:
        q = q.where(obligations.c.rule_id == rule_id)
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(q).mappings().all()]


def _deliver_all(engine, now):
    """Mark every due pending alert delivered (the sweep itself is tested elsewhere)."""
    with engine.begin() as conn:
        conn.execute(update(alerts).where(alerts.c.status == "pending", alerts.c.send_at <= now)
                     .values(status="delivered", delivered_at=now))


def test_moved_deadline_moves_pending_and_corrects_delivered(engine, tmp_path):
    cfg = _configure(tmp_path, [A, B, C, D])
    _ingest_plan(engine, cfg, T0)
    _deliver_all(engine, T0)  # A's -P7D reminder (8 Jan, folded late) went out
    moved = dict(A, dtstart="20270122T120000")  # A moves one week later
    cfg = _configure(tmp_path, [moved, B, C, D])
    out = _ingest_plan(engine, cfg, T0 + timedelta(hours=1))
    assert (out.obligations_moved, out.obligations_inserted, out.corrections) == (1, 0, 1)
    rows = _alerts(engine, "a@test")
    old_due, new_due = datetime(2027, 1, 15, 11, tzinfo=UTC), datetime(2027, 1, 22, 11, tzinfo=UTC)
    reminders = {(r["due_at"], r["offset_seconds"]): r for r in rows if r["kind"] == "reminder"}
    # The delivered reminder is history: unchanged, still owed to the old instant.
    assert reminders[old_due, -7 * 86400]["status"] == "delivered"
    assert reminders[old_due, -7 * 86400]["send_at"] == datetime(2027, 1, 8, 11, tzinfo=UTC)
    # The old instant's pending reminder is superseded; the new instant has its own reminders.
    assert reminders[old_due, -86400]["status"] == "superseded"
    assert reminders[new_due, -7 * 86400]["status"] == "pending"
    assert reminders[new_due, -7 * 86400]["send_at"] == datetime(2027, 1, 15, 11, tzinfo=UTC)
    assert reminders[new_due, -86400]["status"] == "pending"
    assert reminders[new_due, -86400]["send_at"] == datetime(2027, 1, 21, 11, tzinfo=UTC)
    (corr,) = [r for r in rows if r["kind"] == "correction"]
    assert corr["previous_due_at"] == datetime(2027, 1, 15, 11, tzinfo=UTC)
    assert corr["status"] == "pending" and corr["send_at"] == T0 + timedelta(hours=1)
    # Re-planning the same revision sends no second correction and changes nothing.
    again = plan_all(engine, cfg, T0 + timedelta(hours=2))
    assert (again.obligations_moved, again.corrections, again.alerts_written) == (0, 0, 0)
    assert len(_alerts(engine, "a@test")) == 5


def test_moved_deadline_with_reminder_time_past_sends_now_with_reason(engine, tmp_path):
    cfg = _configure(tmp_path, [A, B, C, D])
    _ingest_plan(engine, cfg, T0)
    # A moves earlier, to 12 Jan: its -P1D reminder (11 Jan 11:00Z) is still ahead, -P7D (5 Jan) past.
    now = T0 + timedelta(hours=1)
    cfg = _configure(tmp_path, [dict(A, dtstart="20270112T120000"), B, C, D])
    _ingest_plan(engine, cfg, now)
    rem = {r["offset_seconds"]: r for r in _alerts(engine, "a@test") if r["status"] != "superseded"}
    assert rem[-7 * 86400]["status"] == "pending" and rem[-7 * 86400]["send_at"] < now
    assert "deadline moved from" in rem[-7 * 86400]["status_reason"]
    assert "sent at once" in rem[-7 * 86400]["status_reason"]
    assert rem[-86400]["status"] == "pending" and rem[-86400]["send_at"] > now


def test_withdrawn_rule_cancels_and_notifies_once(engine, tmp_path):
    cfg = _configure(tmp_path, [A, B, C, D])
    _ingest_plan(engine, cfg, T0)
    _deliver_all(engine, T0)
    cfg = _configure(tmp_path, [B, C, D])  # A withdrawn (1 of 4 = 25% < 30%)
    out = _ingest_plan(engine, cfg, T0 + timedelta(hours=1))
    assert (out.obligations_withdrawn, out.alerts_cancelled, out.cancellation_notices) == (1, 1, 1)
    kinds = sorted((r["kind"], r["status"]) for r in _alerts(engine, "a@test"))
    assert kinds == [("cancellation", "pending"), ("reminder", "cancelled"), ("reminder", "delivered")]
    again = plan_all(engine, cfg, T0 + timedelta(hours=2))
    assert (again.obligations_withdrawn, again.cancellation_notices) == (0, 0)


@pytest.mark.parametrize("names", [("m-only", "b-only"), ("b-only", "m-only")])
def test_rule_wanted_by_one_of_two_subscriptions_is_not_filtered_out(engine, tmp_path, names):
    """Ann subscribes to one source twice, once for the monthly rule M and once for rule B (in either
    order). When an occurrence of M moves to another day, the reminder she already got for the old
    day is followed by a cancellation notice: her other subscription, which does not select M, does
    not make M "filtered out by her own filter" (which cancels silently)."""
    monthly = {"uid": "m@test", "tzid": "UTC", "dtstart": "20270115T120000", "summary": "Monthly",
               "rrule": "FREQ=MONTHLY;COUNT=2"}
    rules = {"m-only": "m@test", "b-only": "b@test"}

    def configure(*events):
        (tmp_path / "cal.ics").write_text(ics(*events), newline="")
        return load_config(write_config(
            tmp_path,
            sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
            subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "Europe/Berlin"}],
            subscriptions=[{"name": name, "sources": ["cal"], "rules": [rules[name]], "offsets": ["-P7D"],
                            "channels": ["mail"]} for name in names],
            channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
        ))[0]

    _ingest_plan(engine, configure(monthly, B, C, D), T0)
    _deliver_all(engine, T0)  # the -P7D reminder of 15 Jan, late at planning, went out
    out = _ingest_plan(engine, configure(dict(monthly, dtstart="20270120T120000"), B, C, D), T0 + timedelta(hours=1))
    assert out.cancellation_notices == 1, out


def test_offset_taken_out_cancels_its_open_reminder_and_putting_it_back_restores_it(engine, tmp_path):
    """A subscription's offsets go from -P7D, -P1D to -P1D: the -P7D reminders nobody asks for any
    more are cancelled (they stayed pending and were sent, and fanout_complete stayed red); the
    delivered one stays delivered. Put back, the open ones are pending again."""
    _ingest_plan(engine, _configure(tmp_path, [A, B, C, D]), T0)
    _deliver_all(engine, T0)  # A's -P7D reminder (8 Jan, folded late) went out

    def week_before():
        return sorted((r["rule_id"], r["status"]) for r in _alerts(engine) if r["offset_seconds"] == -7 * 86400)

    out = _ingest_plan(engine, _configure(tmp_path, [A, B, C, D], offsets=["-P1D"]), T0 + timedelta(hours=1))
    assert (out.alerts_cancelled, out.alerts_written, out.obligations_withdrawn) == (3, 0, 0)
    assert week_before() == [("a@test", "delivered"), ("b@test", "cancelled"), ("c@test", "cancelled"),
                             ("d@test", "cancelled")]
    assert {r["status"] for r in _alerts(engine) if r["offset_seconds"] == -86400} == {"pending"}
    again = plan_all(engine, _configure(tmp_path, [A, B, C, D], offsets=["-P1D"]), T0 + timedelta(hours=2))
    assert (again.alerts_cancelled, again.alerts_written) == (0, 0)
    _ingest_plan(engine, _configure(tmp_path, [A, B, C, D]), T0 + timedelta(hours=3))
    assert week_before() == [("a@test", "delivered"), ("b@test", "pending"), ("c@test", "pending"),
                             ("d@test", "pending")]


def test_removed_subscriber_is_cancelled_silently(engine, tmp_path):
    two = [{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "Europe/Berlin"},
           {"id": "bob", "tenant": "t", "email": "bob@example.org", "timezone": "Asia/Tokyo"}]
    cfg = _configure(tmp_path, [A, B], subscribers_=two)
    _ingest_plan(engine, cfg, T0)
    _deliver_all(engine, T0)
    cfg = _configure(tmp_path, [A, B], subscribers_=two[:1])
    out = plan_all(engine, cfg, T0 + timedelta(hours=1))
    assert out.obligations_withdrawn == 2 and out.cancellation_notices == 0
    with engine.connect() as conn:
        assert conn.execute(select(subscribers.c.active).where(subscribers.c.external_id == "bob")).scalar_one() \
            is False


FLOATING_ICS = (
    "BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//t//EN\r\nBEGIN:VEVENT\r\nUID:rent@test\r\n"
    "DTSTAMP:20260101T000000Z\r\nDTSTART:20270201T090000\r\nSUMMARY:Pay rent\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n"
)


def _floating_config(tmp_path, zone):
    (tmp_path / "rent.ics").write_text(FLOATING_ICS, newline="")
    path = write_config(
        tmp_path, sources=[{"name": "rent", "format": "ics", "location": "rent.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": zone}],
        subscriptions=[{"name": "s", "sources": ["rent"], "offsets": ["-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "m")}},
    )
    return load_config(path)[0]


def test_time_zone_change_replans_floating_rules(engine, tmp_path):
    """A floating time (no TZID, no X-WR-TIMEZONE) is read in the subscriber's zone."""
    _ingest_plan(engine, _floating_config(tmp_path, "Europe/Berlin"), T0)
    with engine.connect() as conn:
        assert conn.execute(select(obligations.c.due_at)).scalar_one() == datetime(2027, 2, 1, 8, tzinfo=UTC)
    out = plan_all(engine, _floating_config(tmp_path, "America/New_York"), T0)
    assert out.obligations_moved == 1
    with engine.connect() as conn:
        assert conn.execute(select(obligations.c.due_at)).scalar_one() == datetime(2027, 2, 1, 14, tzinfo=UTC)
        assert conn.execute(select(alerts.c.send_at).where(alerts.c.status == "pending")).scalar_one() \
            == datetime(2027, 1, 31, 14, tzinfo=UTC)


def test_skip_policy_skips_every_late_reminder(engine, tmp_path):
    cfg = _configure(tmp_path, [A, B], late_policy="skip")
    _ingest_plan(engine, cfg, datetime(2027, 1, 15, 8, tzinfo=UTC))
    rem = {r["offset_seconds"]: r["status"] for r in _alerts(engine, "a@test")}
    assert rem == {-7 * 86400: "skipped", -86400: "skipped"}


def _mails(folder) -> list[tuple[str, str]]:
    """(subject, plain-text body) of every mail the maildir channel wrote into ``folder``."""
    import email.parser
    import email.policy
    import mailbox

    if not folder.exists():
        return []
    box = mailbox.Maildir(folder, create=False)
    parsed = [email.parser.BytesParser(policy=email.policy.default).parsebytes(box.get_bytes(k))
              for k in box.iterkeys()]
    return [(str(m["Subject"]).strip(), m.get_body(("plain",)).get_content()) for m in parsed]


def test_moved_deadline_under_skip_sends_its_latest_late_reminder(engine, tmp_path):
    """``late_policy: skip`` spares a first plan the reminders already past; it must not hide a
    deadline a revision moved close: its subscriber knows only the old date."""
    from deadline_pipeline.deliver.sweep import sweep
    from deadline_pipeline.plan.planner import MOVED_DESPITE_SKIP

    moving = {"uid": "m@test", "tzid": "UTC", "dtstart": "20270220T120000", "summary": "Moved report"}
    cfg = _configure(tmp_path, [moving, B, C, D], late_policy="skip")
    first = _ingest_plan(engine, cfg, datetime(2027, 1, 5, tzinfo=UTC))
    assert first.moved_sent_despite_skip == 0
    # The revision moves the deadline from 20 Feb to 10 Jan 12:00Z, 23 hours after this run: both
    # of its new reminders (3 Jan, 9 Jan 12:00Z) are past. A deadline new to this revision, due as
    # soon, is planned for the first time: its past reminders stay skipped.
    now = datetime(2027, 1, 9, 13, tzinfo=UTC)
    new = {"uid": "n@test", "tzid": "UTC", "dtstart": "20270110T120000", "summary": "New report"}
    cfg = _configure(tmp_path, [dict(moving, dtstart="20270110T120000"), new, B, C, D], late_policy="skip")
    out = _ingest_plan(engine, cfg, now)
    assert (out.obligations_moved, out.obligations_inserted, out.corrections) == (1, 1, 0)
    assert out.moved_sent_despite_skip == 1
    new_due = datetime(2027, 1, 10, 12, tzinfo=UTC)
    moved = {r["offset_seconds"]: r for r in _alerts(engine, "m@test") if r["due_at"] == new_due}
    assert moved[-7 * 86400]["status"] == "skipped"
    latest = moved[-86400]
    assert latest["status"] == "pending" and latest["send_at"] == datetime(2027, 1, 9, 12, tzinfo=UTC)
    assert latest["status_reason"].startswith("deadline moved from 2027-02-20T12:00:00+00:00: reminder time ")
    assert "sent at once because the deadline is still ahead" in latest["status_reason"]
    assert latest["status_reason"].endswith(MOVED_DESPITE_SKIP)
    assert {r["offset_seconds"]: r["status"] for r in _alerts(engine, "n@test")} == \
        {-7 * 86400: "skipped", -86400: "skipped"}
    # Delivered: one mail, the moved deadline's, saying why it is late.
    sweep(engine, cfg, now)
    [(subject, body)] = _mails(tmp_path / "maildir")
    assert subject.startswith("Reminder: Moved report due 2027-01-10 13:00 CET (23 hours left, sent late)")
    assert "deadline moved from 2027-02-20" in body and MOVED_DESPITE_SKIP in body
    # Re-planning the same revision neither counts nor sends it again.
    again = plan_all(engine, cfg, now + timedelta(hours=1))
    assert (again.obligations_moved, again.moved_sent_despite_skip, again.alerts_written) == (0, 0, 0)


def test_late_reminder_sent_just_after_its_deadline_says_it_has_passed(engine, tmp_path):
    """A deadline moved to 11:59:59Z and re-planned at 12:00:00Z: its latest reminder still goes
    out (within the delivery grace), and neither its reason nor the mail claims the deadline is
    still ahead of a mail that says "It is due now"."""
    from deadline_pipeline.deliver.sweep import sweep

    moving = {"uid": "m@test", "tzid": "UTC", "dtstart": "20270220T120000", "summary": "Moved report"}
    cfg = _configure(tmp_path, [moving, B, C, D])
    _ingest_plan(engine, cfg, datetime(2027, 1, 5, tzinfo=UTC))
    now = datetime(2027, 1, 10, 12, tzinfo=UTC)
    cfg = _configure(tmp_path, [dict(moving, dtstart="20270110T115959"), B, C, D])
    _ingest_plan(engine, cfg, now)
    due = datetime(2027, 1, 10, 11, 59, 59, tzinfo=UTC)
    [latest] = [r for r in _alerts(engine, "m@test") if r["due_at"] == due and r["status"] == "pending"]
    assert latest["offset_seconds"] == -86400
    assert "sent at once although the deadline has just passed (2027-01-10T11:59:59+00:00)" \
        in latest["status_reason"]
    assert "still ahead" not in latest["status_reason"]
    sweep(engine, cfg, now)
    [(_subject, body)] = _mails(tmp_path / "maildir")
    assert "It is due now." in body and "the deadline has just passed" in body and "still ahead" not in body


def test_partitions_backfill_is_idempotent(engine, tmp_path):
    cfg = _configure(tmp_path, [A, B, C, D])
    now = T0
    # Month by month, then the whole range: the second pass reports nothing inserted or updated.
    jan = plan_all(engine, cfg, now, after=datetime(2027, 1, 1, tzinfo=UTC), before=datetime(2027, 2, 1, tzinfo=UTC))
    assert jan.obligations_planned == 0  # nothing ingested yet
    for s in cfg.sources:
        fetch_snapshot(engine, s, now)
        apply_latest_snapshot(engine, s, now)
    jan = plan_all(engine, cfg, now, after=datetime(2027, 1, 1, tzinfo=UTC), before=datetime(2027, 2, 1, tzinfo=UTC))
    mar = plan_all(engine, cfg, now, after=datetime(2027, 3, 1, tzinfo=UTC), before=datetime(2027, 4, 1, tzinfo=UTC))
    assert (jan.obligations_inserted, mar.obligations_inserted) == (1, 3)
    # Planning January alone must not withdraw March's obligations.
    assert jan.obligations_withdrawn == 0
    full = plan_all(engine, cfg, now)
    assert (full.obligations_inserted, full.obligations_updated, full.obligations_moved, full.alerts_written) == \
        (0, 0, 0, 0)
    assert full.obligations_unchanged == 4


# --------------------------------------------------------------------------- pure rules


def test_quiet_hours_defer_to_window_end_unless_after_deadline():
    berlin = resolve_zone("Europe/Berlin")
    due = datetime(2027, 1, 15, 11, tzinfo=UTC)
    # 23:30 Berlin is inside 22:00-07:00: deferred to 07:00 Berlin (06:00Z).
    send, why = apply_quiet_hours(datetime(2027, 1, 13, 22, 30, tzinfo=UTC), due, "22:00-07:00", berlin)
    assert send == datetime(2027, 1, 14, 6, tzinfo=UTC) and "deferred" in why
    # Outside the window: untouched.
    assert apply_quiet_hours(datetime(2027, 1, 13, 12, tzinfo=UTC), due, "22:00-07:00", berlin)[1] is None
    # Deferring past the deadline is refused: it goes out inside the quiet hours.
    late_due = datetime(2027, 1, 14, 3, tzinfo=UTC)
    send, why = apply_quiet_hours(datetime(2027, 1, 13, 22, 30, tzinfo=UTC), late_due, "22:00-07:00", berlin)
    assert send == datetime(2027, 1, 13, 22, 30, tzinfo=UTC) and "not deferred" in why


NY = resolve_zone("America/New_York")
FAR = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("quiet, send_at, expected", [
    # New York falls back on 1 November 2026: 01:00-02:00 is shown twice (EDT, then EST). The window
    # 22:00-01:30 ends at the second 01:30 (06:30Z); the first (05:30Z) is followed by 01:00-01:30 EST.
    ("22:00-01:30", "2026-11-01T03:00Z", "2026-11-01T06:30Z"),  # 23:00 EDT
    ("22:00-01:30", "2026-11-01T05:45Z", "2026-11-01T06:30Z"),  # 01:45 EDT: the night is not over
    ("22:00-01:30", "2026-11-01T06:15Z", "2026-11-01T06:30Z"),  # 01:15 EST: was moved back to 05:30Z
    ("22:00-01:30", "2026-11-01T06:30Z", None),  # 01:30 EST: over
    # A window starting in the repeated hour starts at the first 01:30 and runs to its end.
    ("01:30-07:00", "2026-11-01T06:10Z", "2026-11-01T12:00Z"),  # 01:10 EST, after 01:30 EDT
    ("01:30-07:00", "2026-11-01T05:10Z", None),  # 01:10 EDT: not yet
    # New York springs forward on 8 March 2026: 02:00-03:00 is skipped. A window ending at 02:30 ends
    # when the clock shows 03:00 (07:00Z), a window starting at 02:30 starts then.
    ("22:00-02:30", "2026-03-08T06:45Z", "2026-03-08T07:00Z"),  # 01:45 EST
    ("22:00-02:30", "2026-03-08T07:00Z", None),  # 03:00 EDT
    ("02:30-07:00", "2026-03-08T07:00Z", "2026-03-08T11:00Z"),  # 03:00 EDT: quiet until 07:00 EDT
    ("02:30-07:00", "2026-03-08T06:59Z", None),  # 01:59 EST
])
def test_quiet_hours_across_a_daylight_saving_change(quiet, send_at, expected):
    at = datetime.fromisoformat(send_at.replace("Z", "+00:00"))
    send, why = apply_quiet_hours(at, FAR, quiet, NY)
    if expected is None:
        assert (send, why) == (at, None)
    else:
        assert send == datetime.fromisoformat(expected.replace("Z", "+00:00")) and "deferred" in why


def test_quiet_hours_over_a_skipped_day_run_on_to_the_next_windows_end():
    """Samoa skipped 2011-12-30: from 23:00 on the 29th (UTC-10) the 22:00-07:00 window runs through the
    missing day into the night of the 30th, which the clock enters at 00:00 on the 31st (UTC+14)."""
    send, _ = apply_quiet_hours(datetime(2011, 12, 30, 9, tzinfo=UTC), FAR, "22:00-07:00",
                                resolve_zone("Pacific/Apia"))
    assert send == datetime(2011, 12, 30, 17, tzinfo=UTC)  # 07:00 on the 31st, UTC+14


def test_planning_run_defers_by_quiet_hours_ending_in_a_repeated_hour_to_their_real_end(engine, tmp_path):
    """A subscriber with quiet hours 22:00-01:30 in New York, a deadline at 08:00 on 1 November 2026 and
    -PT10H (23:00 EDT on 31 October): the reminder waits for the second 01:30 (06:30Z), not the first."""
    event = {"uid": "fb@test", "tzid": "America/New_York", "dtstart": "20261101T080000", "summary": "Fall back"}
    cfg = _configure(tmp_path, [event], offsets=["-PT10H"], subscribers_=[
        {"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "America/New_York",
         "quiet_hours": "22:00-01:30"}])
    now = datetime(2026, 10, 1, tzinfo=UTC)
    for s in cfg.sources:
        fetch_snapshot(engine, s, now)
        apply_latest_snapshot(engine, s, now)
    plan_all(engine, cfg, now)
    with engine.connect() as conn:
        (row,) = conn.execute(select(alerts.c.send_at, alerts.c.status_reason).where(alerts.c.kind == "reminder"))
    assert row.send_at == datetime(2026, 11, 1, 6, 30, tzinfo=UTC), row
    assert "deferred from 2026-11-01T03:00" in row.status_reason


def test_planner_applies_quiet_hours_and_folds():
    target = Target(1, "ann", "t", "Europe/Berlin", 1, "cal", None, ("*",), (-7 * 86400, -86400, 0), ("mail",),
                    quiet_hours="00:00-08:00")
    rule = RuleRecord("r", "R", "2027-01-15T06:00:00", "Europe/Berlin")
    (ob,), problems = plan_target(target, [(1, rule)], datetime(2027, 1, 14, 12, tzinfo=UTC))
    assert not problems
    by = {a.offset_seconds: a for a in ob.alerts}
    assert by[-7 * 86400].status == "skipped"  # past, and a later reminder is also past
    assert by[-86400].status == "pending"  # 14 Jan 06:00 Berlin: inside quiet hours, deferred to 08:00 (past)
    assert by[-86400].send_at == datetime(2027, 1, 14, 7, tzinfo=UTC)
    # The due-time reminder at 06:00 would defer to 08:00, after the deadline: not deferred.
    assert by[0].send_at == datetime(2027, 1, 15, 5, tzinfo=UTC) and "not deferred" in by[0].status_reason


@pytest.mark.parametrize("policy", ["send_latest", "skip"])
def test_fold_late_policies(policy):
    from deadline_pipeline.plan.planner import PlannedAlert

    now = datetime(2027, 1, 10, tzinfo=UTC)
    alerts_ = [PlannedAlert(o, "mail", "reminder", "", now + timedelta(days=d))
               for o, d in ((-90, -80), (-7, -3), (-1, 3))]
    fold_late(alerts_, now, policy)
    assert [a.status for a in alerts_] == (["skipped", "pending", "pending"] if policy == "send_latest"
                                           else ["skipped", "skipped", "pending"])


def test_fold_late_keeps_the_latest_of_a_moved_deadline_under_skip_and_says_when_it_passed():
    from deadline_pipeline.plan.planner import MOVED_DESPITE_SKIP, PlannedAlert

    now = datetime(2027, 1, 10, 12, tzinfo=UTC)

    def late(due):
        return [PlannedAlert(o, "mail", "reminder", "", due + timedelta(days=o), due_at=due) for o in (-7, -1)]

    ahead = late(now + timedelta(hours=1))
    fold_late(ahead, now, "skip", moved=True)
    assert [a.status for a in ahead] == ["skipped", "pending"]
    assert ahead[1].status_reason.endswith("still ahead; " + MOVED_DESPITE_SKIP)
    first = late(now + timedelta(hours=1))
    fold_late(first, now, "skip")
    assert [a.status for a in first] == ["skipped", "skipped"]
    passed = late(now - timedelta(seconds=1))
    fold_late(passed, now)
    assert passed[1].status_reason.endswith(
        "sent at once although the deadline has just passed (2027-01-10T11:59:59+00:00)")


def test_revised_time_of_a_recurring_rule_moves_instead_of_replacing(engine, tmp_path):
    monthly = {"uid": "m@test", "tzid": "UTC", "dtstart": "20270105T090000", "summary": "Monthly",
               "rrule": "FREQ=MONTHLY;COUNT=3"}
    cfg = _configure(tmp_path, [monthly, B, C, D])
    first = _ingest_plan(engine, cfg, T0)
    cfg = _configure(tmp_path, [dict(monthly, dtstart="20270105T170000"), B, C, D])
    out = _ingest_plan(engine, cfg, T0 + timedelta(hours=1))
    # Feb and Mar occurrences (Jan 5 is past) keep their keys and move by eight hours.
    assert first.obligations_inserted == 5
    assert (out.obligations_moved, out.obligations_inserted, out.obligations_withdrawn) == (2, 0, 0)


def test_preview_shows_what_fires_and_why_without_writing(tmp_path):
    from click.testing import CliRunner
    from sqlalchemy import func

    from deadline_pipeline.cli import main
    from deadline_pipeline.store.db import make_engine, upgrade

    db = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    engine = make_engine(db)
    upgrade(engine)
    cfg = _configure(tmp_path, [A, B], subscribers_=[
        {"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "Europe/Berlin",
         "quiet_hours": "11:00-13:00"}])
    for s in cfg.sources:
        fetch_snapshot(engine, s, T0)
        apply_latest_snapshot(engine, s, T0)
    res = CliRunner().invoke(main, ["preview", "--subscriber", "ann", "--from", "2027-01-10T00:00:00Z",
                                    "--to", "2027-01-20T00:00:00Z", "--as-of", "2027-01-10T00:00:00Z",
                                    "--config", str(tmp_path / "deadlines.yaml"), "--db-url", db, "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    # Nothing planned yet: a re-plan would add A's -P7D (8 Jan, past at --as-of: sent at once) and
    # -P1D (14 Jan 12:00 Berlin, inside quiet hours 11-13: deferred to 13:00 Berlin = 12:00Z).
    assert [(r["rule"], r["offset_seconds"], r["send_at"]["utc"], r["status"]) for r in rows] == [
        ("a@test", -604800, "2027-01-10T00:00:00+00:00", "not in the store"),
        ("a@test", -86400, "2027-01-14T12:00:00+00:00", "not in the store")]
    assert {r["replan"] for r in rows} == {"a re-plan would add it"}
    assert rows[1]["send_at"]["local"] == "2027-01-14T13:00:00+01:00" and rows[1]["offset"] == "-P1D, 1 day before"
    assert "already past" in rows[0]["why"] and "quiet hours" in rows[1]["why"]
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(obligations)).scalar_one() == 0, "preview wrote"
    bad = CliRunner().invoke(main, ["preview", "--subscriber", "zed", "--from", "2027-01-10T00:00:00Z",
                                    "--to", "2027-01-20T00:00:00Z", "--config", str(tmp_path / "deadlines.yaml"),
                                    "--db-url", db])
    assert bad.exit_code == 2 and "no subscriber 'zed'" in bad.output


def test_withdrawn_then_restored_rule_gets_its_reminders_back(engine, tmp_path):
    cfg = _configure(tmp_path, [A, B, C, D])
    _ingest_plan(engine, cfg, T0)
    _ingest_plan(engine, _configure(tmp_path, [A, C, D]), T0 + timedelta(hours=1))
    assert {r["status"] for r in _alerts(engine, "b@test")} == {"cancelled"}
    out = _ingest_plan(engine, _configure(tmp_path, [A, B, C, D]), T0 + timedelta(hours=2))
    assert out.obligations_updated == 1
    assert {r["status"] for r in _alerts(engine, "b@test")} == {"pending"}
    # The revived reminders are neither new rows nor moved ones: the merge's counts tell them apart
    # (PostgreSQL counts from the upsert's RETURNING and the rows' state before it).
    assert (out.alerts_inserted, out.alerts_moved) == (0, 0)


def test_sub_hourly_recurrence_is_refused_loudly(engine, tmp_path):
    flood = {"uid": "f@test", "tzid": "UTC", "dtstart": "20270111T000000", "summary": "Flood",
             "rrule": "FREQ=SECONDLY"}
    out = _ingest_plan(engine, _configure(tmp_path, [flood, A]), T0)
    assert [p.rule_id for p in out.problems] == ["f@test"] and "FREQ=SECONDLY is refused" in out.problems[0].message
    assert out.obligations_planned == 1


# GOV.UK bank holidays (alphagov/calendars) before and after the Early May 2020 bank holiday moved
# from Monday 4 to Friday 8 May, files of ``shared/data/govuk-bank-holidays/revisions``.
GOVUK_BEFORE_MOVE = "bank-holidays.e57b5ce.2018-12-06.json"
GOVUK_AFTER_MOVE = "bank-holidays.85e1167.2019-06-10.json"


def govuk_rolled_config(tmp_path, shared_dir, revision: str):
    """A VAT return due Friday 8 May 2020 12:00 Europe/London, rolled to the next business day of
    England & Wales as the GOV.UK bank holidays of ``revision`` (a file name of
    ``shared_dir/data/govuk-bank-holidays/revisions``, copied into ``tmp_path``) have them."""
    import shutil

    shutil.copy(shared_dir / "data" / "govuk-bank-holidays" / "revisions" / revision, tmp_path / "holidays.json")
    (tmp_path / "filings.csv").write_text("id,title,due,timezone\nvat,VAT return,2020-05-08T12:00:00,Europe/London\n")
    return load_config(write_config(
        tmp_path,
        sources=[{"name": "uk-holidays", "format": "govuk-bank-holidays", "location": "holidays.json"},
                 {"name": "filings", "format": "csv", "location": "filings.csv",
                  "business_days": {"calendar": "source:uk-holidays/england-and-wales",
                                    "convention": "following"}}],
        subscribers=[{"id": "ann", "email": "ann@example.org", "timezone": "Europe/London"}],
        subscriptions=[{"name": "s", "sources": ["filings"], "offsets": ["-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    ))[0]


def test_moved_bank_holiday_moves_a_rolled_obligation(shared_dir, engine, tmp_path):
    """GOV.UK moved the Early May 2020 bank holiday from Monday 4 to Friday 8 May (England & Wales):
    a filing due on Friday 8 May, rolled to the next business day, moves to Monday 11 May."""
    now = datetime(2019, 6, 10, tzinfo=UTC)
    _ingest_plan(engine, govuk_rolled_config(tmp_path, shared_dir, GOVUK_BEFORE_MOVE), now)
    with engine.connect() as conn:
        assert conn.execute(select(obligations.c.due_at)).scalar_one() == datetime(2020, 5, 8, 11, tzinfo=UTC)
    out = _ingest_plan(engine, govuk_rolled_config(tmp_path, shared_dir, GOVUK_AFTER_MOVE), now + timedelta(hours=1))
    assert out.obligations_moved == 1 and not out.problems
    with engine.connect() as conn:
        assert conn.execute(select(obligations.c.due_at)).scalar_one() == datetime(2020, 5, 11, 11, tzinfo=UTC)


def test_us_tax_due_date_rolls_over_emancipation_day(engine, tmp_path):
    """IRC §7503: 15 April 2028 is a Saturday and DC Emancipation Day is observed Monday 17 April,
    so the return is due Tuesday 18 April 2028."""
    (tmp_path / "tax.csv").write_text("id,title,due,timezone\n1040,Form 1040,2028-04-15,America/New_York\n")
    cfg = load_config(write_config(
        tmp_path,
        sources=[{"name": "tax", "format": "csv", "location": "tax.csv",
                  "business_days": {"calendar": "US-IRS", "convention": "following"}}],
        subscribers=[{"id": "ann", "email": "ann@example.org", "timezone": "America/New_York"}],
        subscriptions=[{"name": "s", "sources": ["tax"], "offsets": ["-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    ))[0]
    _ingest_plan(engine, cfg, datetime(2027, 6, 1, tzinfo=UTC))
    with engine.connect() as conn:
        due = conn.execute(select(obligations.c.due_at)).scalar_one()
    assert due.astimezone(resolve_zone("America/New_York")).date().isoformat() == "2028-04-18"


def test_titles_with_copy_special_characters_round_trip(engine, tmp_path):
    """Tabs, newlines and backslashes in source text survive the COPY path unchanged."""
    title = 'Pay\\tax\tnow\nplease \\N'
    (tmp_path / "s.csv").write_text('id,title,due,timezone\nx,"' + title + '",2027-02-01T09:00:00,UTC\n')
    cfg = load_config(write_config(
        tmp_path, sources=[{"name": "s", "format": "csv", "location": "s.csv"}],
        subscribers=[{"id": "ann", "email": "ann@example.org"}],
        subscriptions=[{"name": "s", "sources": ["s"], "offsets": ["-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "m")}},
    ))[0]
    _ingest_plan(engine, cfg, T0)
    with engine.connect() as conn:
        assert conn.execute(select(obligations.c.title)).scalar_one() == title
        assert conn.execute(select(alerts.c.send_at)).scalar_one() == datetime(2027, 1, 31, 9, tzinfo=UTC)


def test_two_subscriptions_of_one_subscriber_to_one_source_both_plan(engine, tmp_path):
    (tmp_path / "cal.ics").write_text(ics(A), newline="")
    cfg = load_config(write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "webhook_url": "http://127.0.0.1:9/h"}],
        subscriptions=[{"name": "mail", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["mail"]},
                       {"name": "hook", "sources": ["cal"], "offsets": ["-P2D"], "channels": ["hook"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "m")}, "hook": {"type": "webhook"}},
    ))[0]
    out = _ingest_plan(engine, cfg, T0)
    assert out.obligations_planned == 1 and out.alerts_planned == 2
    assert sorted((r["offset_seconds"], r["status"]) for r in _alerts(engine)) == [(-172800, "pending"),
                                                                                  (-86400, "pending")]
    again = plan_all(engine, cfg, T0 + timedelta(minutes=5))
    assert (again.obligations_updated, again.alerts_written) == (0, 0)


@pytest.mark.parametrize("order", ["skip first", "send_latest first"])
def test_a_late_reminder_one_subscription_sends_is_not_skipped_by_another(engine, tmp_path, order):
    """ann is in "quiet" (everyone, late_policy skip) and "urgent" (ann, send_latest), both -P1D by
    mail. Report A is due 5 days after planning with its -P1D reminder ahead, and E 12 hours after,
    its -P1D reminder past: E's reminder goes out at once whichever subscription is written first.
    It was skipped when "quiet" came first: ann got nothing, by the order of two YAML entries."""
    soon = {"uid": "e@test", "tzid": "UTC", "dtstart": "20270110T120000", "summary": "Report E"}
    (tmp_path / "cal.ics").write_text(ics(A, soon), newline="")
    quiet = {"name": "quiet", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["mail"], "late_policy": "skip"}
    urgent = {"name": "urgent", "subscribers": ["ann"], "sources": ["cal"], "offsets": ["-P1D"],
              "channels": ["mail"], "late_policy": "send_latest"}
    cfg = load_config(write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org"}],
        subscriptions=[quiet, urgent] if order == "skip first" else [urgent, quiet],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "m")}},
    ))[0]
    out = _ingest_plan(engine, cfg, T0)
    assert out.obligations_planned == 2 and out.alerts_planned == 2, out
    (late,) = _alerts(engine, "e@test")
    # Pending at its past instant: the next sweep sends it at once.
    assert (late["status"], late["send_at"]) == ("pending", datetime(2027, 1, 9, 12, tzinfo=UTC)), late
    (ahead,) = _alerts(engine, "a@test")
    assert ahead["status"] == "pending" and ahead["send_at"] == datetime(2027, 1, 14, 11, tzinfo=UTC), ahead


def test_a_reminder_a_day_inside_the_horizon_is_planned_ahead_of_its_time(engine, tmp_path):
    """``horizon_days: 7`` and ``-P6D`` under ``late_policy: skip`` (``-P7D`` is refused at load): a
    deadline 7 days and 30 minutes ahead is outside the horizon; an hour later it enters it, and its
    reminder, a day ahead, is planned pending, not skipped as late."""
    (tmp_path / "cal.ics").write_text(ics({"uid": "h@test", "tzid": "UTC", "dtstart": "20270117T003000",
                                           "summary": "Horizon"}), newline="")
    cfg = load_config(write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org"}],
        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["-P6D"], "channels": ["mail"],
                        "late_policy": "skip"}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "m")}}, plan={"horizon_days": 7},
    ))[0]
    assert _ingest_plan(engine, cfg, T0).obligations_planned == 0
    assert plan_all(engine, cfg, T0 + timedelta(hours=1)).obligations_planned == 1
    (alert,) = _alerts(engine)
    assert (alert["status"], alert["send_at"]) == ("pending", datetime(2027, 1, 11, 0, 30, tzinfo=UTC)), alert


def test_recurring_occurrence_moved_to_another_day_sends_a_cancellation_notice(engine, tmp_path):
    """BYMONTHDAY 15 → 20: the delivered reminder of the 15th gets one cancellation notice; the 20th
    gets its own reminders."""
    monthly = {"uid": "m@test", "tzid": "UTC", "dtstart": "20270115T120000", "summary": "Monthly",
               "rrule": "FREQ=MONTHLY;COUNT=2"}
    cfg = _configure(tmp_path, [monthly, B, C, D])
    _ingest_plan(engine, cfg, T0)
    _deliver_all(engine, T0)  # the -P7D reminder of 15 Jan, late at planning, went out
    out = _ingest_plan(engine, _configure(tmp_path, [dict(monthly, dtstart="20270120T120000"), B, C, D]),
                       T0 + timedelta(hours=1))
    assert out.cancellation_notices == 1 and out.obligations_inserted == 2
    assert ("cancellation", "pending") in {(r["kind"], r["status"]) for r in _alerts(engine, "m@test")}
    assert plan_all(engine, _configure(tmp_path, [dict(monthly, dtstart="20270120T120000"), B, C, D]),
                    T0 + timedelta(hours=2)).cancellation_notices == 0


def test_an_occurrence_a_revision_moved_to_another_day_is_not_skipped_as_new(engine, tmp_path):
    """``late_policy: skip``, ``-P7D``: a monthly filing due on the 15th is revised to the 10th on 5
    March. Occurrences are identified by their day, so the 10 March one is a new obligation, and its
    reminder (3 March) was skipped as late while the 15 March one was withdrawn: ann, who knew of the
    filing, got nothing. It now goes out at once, as for a moved deadline. bob, a new subscriber
    in the same run, keeps ``skip``: the filing is new to him."""
    from deadline_pipeline.plan.planner import MOVED_DESPITE_SKIP

    monthly = {"uid": "m@test", "tzid": "UTC", "dtstart": "20270115T120000", "summary": "Monthly filing",
               "rrule": "FREQ=MONTHLY;COUNT=6"}
    ann = {"id": "ann", "tenant": "t", "email": "ann@example.org"}
    bob = {"id": "bob", "tenant": "t", "email": "bob@example.org"}
    first = datetime(2027, 3, 1, tzinfo=UTC)
    _ingest_plan(engine, _configure(tmp_path, [monthly, B, C, D], [ann], offsets=["-P7D"], late_policy="skip"),
                 first)
    later = datetime(2027, 3, 5, tzinfo=UTC)
    moved = dict(monthly, dtstart="20270110T120000")
    out = _ingest_plan(engine, _configure(tmp_path, [moved, B, C, D], [ann, bob], offsets=["-P7D"],
                                          late_policy="skip"), later)
    assert out.moved_sent_despite_skip == 1, out
    q = (select(subscribers.c.external_id, alerts.c.status, alerts.c.status_reason)
         .join(obligations, obligations.c.id == alerts.c.obligation_id)
         .join(subscribers, subscribers.c.id == obligations.c.subscriber_id)
         .where(obligations.c.rule_id == "m@test", alerts.c.due_at == datetime(2027, 3, 10, 12, tzinfo=UTC)))
    with engine.connect() as conn:
        rows = {sid: (status, reason) for sid, status, reason in conn.execute(q)}
    assert rows["ann"][0] == "pending" and rows["ann"][1].endswith(MOVED_DESPITE_SKIP), rows
    assert rows["bob"][0] == "skipped", rows


def test_an_occurrence_moved_by_a_recurrence_id_override_is_not_skipped_as_new(engine, tmp_path):
    """``late_policy: skip``, ``-P7D``: ann is planned for a weekly series on 1 May; on 3 May the
    source adds a RECURRENCE-ID override moving the 18 May occurrence to 8 May. The override is a
    rule of its own (``UID#<RECURRENCE-ID>``), new at version 1, so its reminder (1 May, late) was
    skipped as a new deadline's while the 18 May one was withdrawn: ann, who knew of that occurrence,
    got nothing. It now goes out at once, as for a moved deadline. bob, new in the same run, keeps
    ``skip``: the series is new to him."""
    from deadline_pipeline.plan.planner import MOVED_DESPITE_SKIP

    weekly = {"uid": "weekly@test", "tzid": "America/New_York", "dtstart": "20270511T170000",
              "summary": "Weekly filing", "rrule": "FREQ=WEEKLY;COUNT=6"}
    ann = {"id": "ann", "tenant": "t", "email": "ann@example.org"}
    bob = {"id": "bob", "tenant": "t", "email": "bob@example.org"}
    _ingest_plan(engine, _configure(tmp_path, [weekly, B, C, D], [ann], offsets=["-P7D"], late_policy="skip"),
                 datetime(2027, 5, 1, 12, tzinfo=UTC))
    override = dict(weekly, dtstart="20270508T170000", recurrence_id="20270518T170000", rrule=None)
    out = _ingest_plan(engine, _configure(tmp_path, [weekly, override, B, C, D], [ann, bob], offsets=["-P7D"],
                                          late_policy="skip"), datetime(2027, 5, 3, 12, tzinfo=UTC))
    assert out.moved_sent_despite_skip == 1, out
    q = (select(subscribers.c.external_id, obligations.c.rule_id, alerts.c.status, alerts.c.status_reason)
         .join(obligations, obligations.c.id == alerts.c.obligation_id)
         .join(subscribers, subscribers.c.id == obligations.c.subscriber_id)
         .where(alerts.c.due_at == datetime(2027, 5, 8, 21, tzinfo=UTC)))
    with engine.connect() as conn:
        rows = {sid: (rid, status, reason) for sid, rid, status, reason in conn.execute(q)}
    assert rows["ann"][0].startswith("weekly@test#"), rows
    assert rows["ann"][1] == "pending" and rows["ann"][2].endswith(MOVED_DESPITE_SKIP), rows
    assert rows["bob"][1] == "skipped", rows


def test_a_deadline_withdrawn_and_restored_by_its_source_is_not_skipped_as_new(engine, tmp_path):
    """``late_policy: skip``, ``-P1D``: A's reminder (14 Jan 11:00Z) is pending; the source drops A,
    then restores it after the reminder's time. The reminder was skipped as late, as for a deadline
    new to ann, though she was planned for it: it now goes out at once. A subscriber removed and
    added back (the rule unchanged) is new to it and keeps ``skip``."""
    ann = {"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "Europe/Berlin"}
    bob = {"id": "bob", "tenant": "t", "email": "bob@example.org"}
    f = {"uid": "f@test", "tzid": "UTC", "dtstart": "20270114T180000", "summary": "Report F"}  # -P1D: 13 Jan

    def plan(evs, subs, now):
        return _ingest_plan(engine, _configure(tmp_path, evs, subs, offsets=["-P1D"], late_policy="skip"), now)

    plan([A, B, C, D, f], [ann, bob], T0)
    plan([B, C, D, f], [ann], datetime(2027, 1, 14, tzinfo=UTC))  # A withdrawn; bob removed
    back = plan([A, B, C, D, f], [ann, bob], datetime(2027, 1, 14, 12, tzinfo=UTC))  # A back; bob back
    # Counted in the plan's metadata, not only in the reasons: ann's A, and bob's (he was planned for A too).
    assert back.moved_sent_despite_skip == 2, back
    q = (select(subscribers.c.external_id, obligations.c.rule_id, alerts.c.status)
         .join(obligations, obligations.c.id == alerts.c.obligation_id)
         .join(subscribers, subscribers.c.id == obligations.c.subscriber_id)
         .where(obligations.c.rule_id.in_(["a@test", "f@test"])))
    with engine.connect() as conn:
        status = {(sid, rid): st for sid, rid, st in conn.execute(q)}
    assert status[("ann", "a@test")] == status[("bob", "a@test")] == "pending", status
    assert status[("bob", "f@test")] == "skipped", status  # f@test unchanged: bob is back as a new subscriber


@pytest.mark.parametrize("edit", ["offset", "channel"])
def test_a_reminder_owed_before_a_configuration_edit_is_not_skipped_as_late_after_it(engine, tmp_path, edit):
    """``late_policy: skip``: B's -P3D reminder (26 Feb 09:00Z) is pending at 08:50. At 08:55 its
    offset is replaced and at 09:05 put back, or at 09:05, before a sweep sent it, its channel is
    renamed: it came back ``skipped`` as late (or the renamed channel's was), as if the deadline were
    new to ann, and nothing was sent, every check green (``skip`` spares only the reminders already past when
    a deadline is first planned for a subscriber). It now goes out at once."""
    from deadline_pipeline.plan.planner import OWED_DESPITE_SKIP

    def cfg(offset, channel):
        (tmp_path / "cal.ics").write_text(ics(B), newline="")
        return load_config(write_config(
            tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
            subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org"}],
            subscriptions=[{"name": "s", "sources": ["cal"], "offsets": [offset], "channels": [channel],
                            "late_policy": "skip"}],
            channels={name: {"type": "maildir", "path": str(tmp_path / name)} for name in ("mail", "mail2")}))[0]

    at = datetime(2027, 2, 26, 8, 50, tzinfo=UTC)
    _ingest_plan(engine, cfg("-P3D", "mail"), at)
    if edit == "offset":
        plan_all(engine, cfg("-P1D", "mail"), at + timedelta(minutes=5))
        plan_all(engine, cfg("-P3D", "mail"), at + timedelta(minutes=15))
    else:  # renamed while the reminder was due but not yet swept
        plan_all(engine, cfg("-P3D", "mail2"), at + timedelta(minutes=15))
    rows = [r for r in _alerts(engine) if r["offset_seconds"] == -3 * 86400 and r["status"] != "cancelled"]
    assert [r["status"] for r in rows] == ["pending"], rows
    assert rows[0]["send_at"] == datetime(2027, 2, 26, 9, tzinfo=UTC)
    assert rows[0]["status_reason"].endswith(OWED_DESPITE_SKIP), rows


def test_a_deadline_moved_into_another_partition_keeps_its_move_when_the_old_month_is_planned_first(
        engine, tmp_path):
    """``late_policy: skip``, ``-P7D``: a deadline due 20 May moves to 12 March, and the revision's two
    partition runs (the sensor requests both months) plan May first. That run moves the obligation to
    12 March (outside its window) and supersedes the May reminders; the March run then saw the
    obligation already at 12 March, folded its late reminder (5 March) as a new deadline's and
    skipped it: nobody was told. It now goes out at once, saying the deadline moved from 20 May."""
    from deadline_pipeline.plan.planner import MOVED_DESPITE_SKIP

    now = datetime(2027, 3, 10, tzinfo=UTC)
    may = {"uid": "m@test", "tzid": "UTC", "dtstart": "20270520T120000", "summary": "Filing"}

    def cfg(event):
        return _configure(tmp_path, [event, B, C, D], offsets=["-P7D"], late_policy="skip")

    _ingest_plan(engine, cfg(may), now)
    moved = cfg(dict(may, dtstart="20270312T120000"))
    for s in moved.sources:
        fetch_snapshot(engine, s, now + timedelta(hours=1))
        apply_latest_snapshot(engine, s, now + timedelta(hours=1))
    runs = [plan_all(engine, moved, now + timedelta(hours=1), after=first, before=last)
            for first, last in ((datetime(2027, 5, 1, tzinfo=UTC), datetime(2027, 6, 1, tzinfo=UTC)),
                                (datetime(2027, 3, 1, tzinfo=UTC), datetime(2027, 4, 1, tzinfo=UTC)))]
    assert [r.moved_sent_despite_skip for r in runs] == [0, 1], runs
    rows = {(r["due_at"], r["status"]): r["status_reason"] for r in _alerts(engine, "m@test")}
    assert set(rows) == {(datetime(2027, 5, 20, 12, tzinfo=UTC), "superseded"),
                         (datetime(2027, 3, 12, 12, tzinfo=UTC), "pending")}, rows
    reason = rows[(datetime(2027, 3, 12, 12, tzinfo=UTC), "pending")]
    assert reason.startswith("deadline moved from 2027-05-20") and reason.endswith(MOVED_DESPITE_SKIP), reason


def test_late_reminder_waits_for_the_end_of_quiet_hours():
    target = Target(1, "ann", "t", "America/New_York", 1, "cal", None, ("*",), (-7 * 86400,), ("mail",),
                    quiet_hours="20:00-08:00")
    rule = RuleRecord("r", "R", "2027-01-15T12:00:00", "America/New_York")
    now = datetime(2027, 1, 10, 4, tzinfo=UTC)  # 23:00 in New York: inside the quiet hours
    (ob,), _ = plan_target(target, [(1, rule)], now)
    (a,) = ob.alerts
    assert a.status == "pending" and a.send_at == datetime(2027, 1, 10, 13, tzinfo=UTC)  # 08:00 local
    assert "quiet hours" in a.status_reason


def test_a_skipped_local_day_plans_and_sends_one_reminder_per_instant(engine, tmp_path):
    """Samoa skipped 2011-12-30: a daily 09:00 deadline's nonexistent 30 December 09:00 is the instant
    of 31 December 09:00 (2011-12-30T19:00Z). Planned once, for the 31st; one mail, not two."""
    from deadline_pipeline.deliver.sweep import sweep

    daily = {"uid": "apia@test", "tzid": "Pacific/Apia", "dtstart": "20111228T090000", "summary": "Daily return",
             "rrule": "FREQ=DAILY;COUNT=5"}
    cfg = _configure(tmp_path, [daily], subscribers_=[
        {"id": "sina", "tenant": "t", "email": "sina@example.org", "timezone": "Pacific/Apia"}], offsets=["-PT1H"])
    now = datetime(2011, 12, 30, 17, tzinfo=UTC)  # the 28th and 29th are past
    out = _ingest_plan(engine, cfg, now)
    assert out.problems == []
    with engine.connect() as conn:
        planned = conn.execute(select(obligations.c.period, obligations.c.due_at)
                               .where(obligations.c.rule_id == "apia@test").order_by(obligations.c.due_at)).all()
    assert [tuple(row) for row in planned] == [
        ("2011-12-31", datetime(2011, 12, 30, 19, tzinfo=UTC)), ("2012-01-01", datetime(2011, 12, 31, 19, tzinfo=UTC))]
    assert [(r["send_at"], r["status"]) for r in _alerts(engine, "apia@test")] == [
        (datetime(2011, 12, 30, 18, tzinfo=UTC), "pending"), (datetime(2011, 12, 31, 18, tzinfo=UTC), "pending")]
    sweep(engine, cfg, datetime(2011, 12, 30, 18, 0, 30, tzinfo=UTC))
    [(subject, _body)] = _mails(tmp_path / "maildir")
    assert subject.startswith("Reminder: Daily return due 2011-12-31 09:00 +14")


def _subscriber_file_config(tmp_path, ids, **extra):
    """The configuration of ``_configure`` (events A and B) whose subscribers are the rows ``ids`` of
    ``subs.csv`` (written anew); returns ``(config, its path, the CSV's path)``."""
    (tmp_path / "cal.ics").write_text(ics(A, B), newline="")
    csv_path = tmp_path / "subs.csv"
    csv_path.write_text("id,tenant,email,timezone\n" + "".join(f"{i},t,{i}@example.org,UTC\n" for i in ids))
    path = write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[], subscribers_csv="subs.csv",
        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}}, **extra)
    return load_config(path)[0], path, csv_path


def _open_reminders_by_subscriber(engine) -> dict[str, int]:
    q = (select(subscribers.c.external_id, alerts.c.id)
         .join(obligations, obligations.c.subscriber_id == subscribers.c.id)
         .join(alerts, alerts.c.obligation_id == obligations.c.id)
         .where(alerts.c.status == "pending", obligations.c.status == "active"))
    out: dict[str, int] = {}
    with engine.connect() as conn:
        for ext, _ in conn.execute(q):
            out[ext] = out.get(ext, 0) + 1
    return out


def _plan_and_check(engine, cfg, now):
    """Plan at ``now``, record the run's heartbeat as the plan asset does, and return ``(outcome,
    plan_complete, the watchdog's plan_complete row)``."""
    from deadline_pipeline.plan.service import record_plan_run
    from deadline_pipeline.watch import checks as w
    from deadline_pipeline.watch.watchdog import evaluate

    out = plan_all(engine, cfg, now)
    record_plan_run(engine, "plan", started_at=now, completed_at=now, label="test", problems=out.problems)
    row = {r.check: r for r in evaluate(engine, now, cfg).rows}["plan_complete"]
    return out, w.plan_complete(engine, now), row


def test_a_subscriber_file_cut_short_keeps_the_missing_subscribers_until_accepted(engine, tmp_path):
    """A subscriber file that lost 7 of its 10 rows at a line boundary (a truncated copy) withdrew the
    7 and cancelled their reminders without a word, every check green. Now planning keeps them with
    their reminders, plan_complete (and the watchdog) is red naming the file, the counts and the
    command; after ``subscribers accept`` the next run withdraws them, quietly as for one removal."""
    from click.testing import CliRunner

    from deadline_pipeline.cli import main

    ids = [f"s{n:02d}" for n in range(10)]
    cfg, path, csv_path = _subscriber_file_config(tmp_path, ids)
    _ingest_plan(engine, cfg, T0)
    assert _open_reminders_by_subscriber(engine) == {i: 2 for i in ids}

    cfg, _, _ = _subscriber_file_config(tmp_path, ids[:3])
    out, check, row = _plan_and_check(engine, cfg, T0 + timedelta(hours=1))
    assert _open_reminders_by_subscriber(engine) == {i: 2 for i in ids}
    assert out.subscribers_held == 7 and out.obligations_withdrawn == 0 and out.alerts_cancelled == 0
    assert not check.passed and not row.ok
    for text in (check.summary, row.detail):
        assert str(csv_path) in text and "would withdraw 7 of 10 subscribers" in text, text
        assert "deadline-pipeline subscribers accept" in text, text

    url = engine.url.render_as_string(hide_password=False)
    res = CliRunner().invoke(main, ["subscribers", "accept", "--config", str(path), "--db-url", url])
    assert res.exit_code == 0, res.output
    assert "7 subscriber(s) missing from it withdrawn" in res.output and "withdrawn  s09" in res.output

    out, check, row = _plan_and_check(engine, cfg, T0 + timedelta(hours=2))
    assert out.subscribers_held == 0 and out.obligations_withdrawn == 14 and out.cancellation_notices == 0
    assert _open_reminders_by_subscriber(engine) == {i: 2 for i in ids[:3]}
    assert check.passed and row.ok, check.summary


@pytest.mark.parametrize("kept", [9, 7])
def test_removing_at_most_the_share_of_subscribers_is_quiet(engine, tmp_path, kept):
    """One subscriber of 10 removed, or 3 (30 %, not more than plan.max_subscriber_withdraw_share):
    withdrawn and their reminders cancelled quietly, as before; planning reports nothing."""
    ids = [f"s{n:02d}" for n in range(10)]
    cfg, _, _ = _subscriber_file_config(tmp_path, ids)
    _ingest_plan(engine, cfg, T0)
    cfg, _, _ = _subscriber_file_config(tmp_path, ids[:kept])
    out, check, row = _plan_and_check(engine, cfg, T0 + timedelta(hours=1))
    assert out.subscribers_held == 0 and out.obligations_withdrawn == 2 * (10 - kept)
    assert out.cancellation_notices == 0
    assert _open_reminders_by_subscriber(engine) == {i: 2 for i in ids[:kept]}
    assert check.passed and row.ok, check.summary


def test_the_subscriber_withdraw_share_is_configurable(engine, tmp_path):
    """``plan.max_subscriber_withdraw_share: 0.8`` lets 7 of 10 go at once."""
    ids = [f"s{n:02d}" for n in range(10)]
    cfg, _, _ = _subscriber_file_config(tmp_path, ids)
    _ingest_plan(engine, cfg, T0)
    cfg, _, _ = _subscriber_file_config(tmp_path, ids[:3], plan={"max_subscriber_withdraw_share": 0.8})
    out = plan_all(engine, cfg, T0 + timedelta(hours=1))
    assert out.subscribers_held == 0 and out.obligations_withdrawn == 14


def test_a_subscriber_file_cut_short_turns_plan_complete_red_in_a_pipeline_run(tmp_path):
    """The same through ``deadline-pipeline run`` (Dagster: ingest, plan, deliver, checks): the run
    with the file cut from 10 rows to 3 keeps the 7 subscribers' reminders and exits red, its
    plan_complete check naming the file."""
    from click.testing import CliRunner

    from deadline_pipeline.cli import main
    from deadline_pipeline.store.db import get_engine

    ids = [f"s{n:02d}" for n in range(10)]
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    env = {"DEADLINE_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster_home")}

    def run(as_of):
        return CliRunner().invoke(main, ["run", "--config", str(path), "--db-url", url, "--as-of", as_of], env=env)

    _, path, csv_path = _subscriber_file_config(tmp_path, ids)
    first = run("2027-01-10T00:00:00Z")
    assert first.exit_code == 0, first.output
    _subscriber_file_config(tmp_path, ids[:3])
    cut = run("2027-01-10T01:00:00Z")
    assert _open_reminders_by_subscriber(get_engine(url)) == {i: 2 for i in ids}
    assert cut.exit_code != 0, cut.output
    red = [line for line in cut.output.splitlines() if "plan_complete" in line]
    assert red and str(csv_path) in cut.output and "would withdraw 7 of 10" in cut.output, cut.output
