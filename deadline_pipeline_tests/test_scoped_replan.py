"""A revision re-plan scoped to the rules the revision changed (plan.scope) leaves the store exactly as
a re-plan of every rule does, while planning only the changed rules' obligations; the revision
sensor's runs carry the scope, and a scoped run's heartbeat cannot hide a full run's problems."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
from sqlalchemy import select

from deadline_pipeline.config import load_config
from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.orchestration.build import INGEST_JOB, build_definitions
from deadline_pipeline.orchestration.partitions import REVISION_TAG, revision_range, revision_tags
from deadline_pipeline.orchestration.planning import PLAN_JOB, horizon_range, range_tags
from deadline_pipeline.orchestration.resources import parse_instant
from deadline_pipeline.plan.scope import RuleScope, series_of
from deadline_pipeline.plan.service import changed_rules, max_version_id, plan_all
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.store.db import make_engine, upgrade
from deadline_pipeline.store.schema import alerts, heartbeats, obligations
from deadline_pipeline_tests.factories import rolled_filings_config, write_config
from deadline_pipeline_tests.test_planning import GOVUK_AFTER_MOVE, GOVUK_BEFORE_MOVE, govuk_rolled_config
from deadline_pipeline_tests.test_replan_sensor import _tick

T0 = datetime(2027, 1, 10, tzinfo=UTC)
AS_OF = "2027-01-10T00:00:00Z"


def _event(uid: str, dtstart: str, summary: str, *extra: str) -> list[str]:
    return ["BEGIN:VEVENT", f"UID:{uid}", "DTSTAMP:20270101T000000Z", f"DTSTART;TZID=Europe/Berlin:{dtstart}",
            f"SUMMARY:{summary}", *extra, "END:VEVENT"]


# Monthly series A and B, one-off C (renamed below), D (withdrawn below) and fillers that keep a
# withdrawal under the ingest's mass-withdrawal quarantine.
BASE = {
    "a": _event("a@test", "20270115T120000", "Monthly A", "RRULE:FREQ=MONTHLY;COUNT=6"),
    "b": _event("b@test", "20270120T120000", "Monthly B", "RRULE:FREQ=MONTHLY;COUNT=6"),
    "c": _event("c@test", "20270301T090000", "Once C"),
    "d": _event("d@test", "20270302T090000", "Once D"),
    **{f"f{i}": _event(f"f{i}@test", f"2027040{i}T090000", f"Filler {i}") for i in range(1, 7)},
}
# Each revision as the whole calendar after it, and the rule ids its versions must name.
REVISIONS = [
    ("A moves to 13:00", {**BASE, "a": _event("a@test", "20270115T130000", "Monthly A",
                                               "RRULE:FREQ=MONTHLY;COUNT=6")}),
    # An override of B's February occurrence: only 'b@test#…' gets a version, yet the master's
    # February occurrence must go (an EXDATE folded into it), so the series is planned together.
    ("B's February occurrence overridden", {"b#": _event("b@test", "20270222T150000", "Monthly B moved",
                                                         "RECURRENCE-ID;TZID=Europe/Berlin:20270220T120000")}),
    ("C renamed", {"c": _event("c2@test", "20270301T090000", "Once C")}),
    ("D withdrawn", {"d": None}),
    # C's old id comes back as another deadline: it takes the obligations' key back, and the renamed
    # C2 (whose versions did not change) must be planned under its own key, not left with none.
    ("C's old id back", {"c_back": _event("c@test", "20270310T090000", "Another C")}),
]


def _calendar(events: dict) -> str:
    lines = ["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//deadline-pipeline tests//EN"]
    for body in events.values():
        if body:
            lines += body
    return "\r\n".join([*lines, "END:VCALENDAR"]) + "\r\n"


def _config(tmp_path):
    return load_config(write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": f"u{i}", "tenant": "t", "email": f"u{i}@example.org",
                      "timezone": ["Europe/Berlin", "America/New_York", "Asia/Tokyo"][i % 3]} for i in range(3)],
        subscriptions=[{"name": "all", "sources": ["cal"], "offsets": ["-P7D", "-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "m")}},
    ))[0]


def _ingest(engine, cfg, tmp_path, events) -> None:
    (tmp_path / "cal.ics").write_text(_calendar(events), newline="")
    for s in cfg.sources:
        fetch_snapshot(engine, s, T0)
        outcome = apply_latest_snapshot(engine, s, T0)
        assert outcome.status in ("applied", "unchanged"), outcome


def _state(engine):
    with engine.connect() as conn:
        obs = sorted(conn.execute(select(obligations.c.obligation_key, obligations.c.rule_id, obligations.c.status,
                                         obligations.c.due_at, obligations.c.revision)).all())
        als = sorted(conn.execute(
            select(obligations.c.obligation_key, alerts.c.dedup_key, alerts.c.kind, alerts.c.channel,
                   alerts.c.send_at, alerts.c.status, alerts.c.due_at)
            .join(obligations, obligations.c.id == alerts.c.obligation_id)).all())
    return obs, als


def test_scoped_replan_leaves_the_store_as_a_full_replan(engine, tmp_path):
    """After each revision (a move, an override of one occurrence, a rename, a withdrawal) a re-plan
    of only the changed rules leaves the same obligations and alerts as a re-plan of every rule —
    and plans fewer obligations. Without the scope's withdrawal filter the scoped run would withdraw
    every unchanged rule's obligations. The override moves the master's February obligation (it is
    keyed as the occurrence it replaces); the series' widening is what a cancelled override needs
    (:func:`test_taking_back_a_cancelled_override_replans_the_restored_occurrence`)."""
    cfg = _config(tmp_path)
    full = make_engine(f"sqlite:///{tmp_path / 'full.sqlite3'}")
    upgrade(full)
    events = dict(BASE)
    for store in (full, engine):
        _ingest(store, cfg, tmp_path, events)
        plan_all(store, cfg, T0)
    assert _state(full) == _state(engine)
    for label, change in REVISIONS:
        events = {**events, **change}
        _ingest(full, cfg, tmp_path, events)
        full_out = plan_all(full, cfg, T0)
        since = max_version_id(engine)
        _ingest(engine, cfg, tmp_path, events)
        scope = changed_rules(engine, since, max_version_id(engine))
        assert scope is not None, label
        scoped_out = plan_all(engine, cfg, T0, scope=scope)
        assert _state(engine) == _state(full), label
        assert scoped_out.obligations_planned < full_out.obligations_planned, label
        assert scoped_out.scope.startswith(f"{len(scope.changed)} rule(s) of 1 source(s)"), label
        assert (scoped_out.obligations_moved, scoped_out.obligations_withdrawn) == \
            (full_out.obligations_moved, full_out.obligations_withdrawn), label
    # The override revision really took the master's February occurrence: it moved it (20 → 22
    # February), the same obligation of each subscriber now planned by the override, none withdrawn.
    with engine.connect() as conn:
        moved = conn.execute(select(obligations.c.rule_id, obligations.c.status, obligations.c.previous_due_at)
                             .where(obligations.c.rule_id.like("b@test#%"))).all()
        statuses = {(r, s) for r, s in conn.execute(select(obligations.c.rule_id, obligations.c.status))}
    assert [tuple(m) for m in moved] == [("b@test#2027-02-20T11:00:00Z", "active",
                                          datetime(2027, 2, 20, 11, tzinfo=UTC))] * 3, moved
    assert ("b@test", "withdrawn") not in statuses


def test_rule_scope_widens_to_series_and_lineage():
    """An override and its master are one series; a renamed rule and its lineage plan together; a
    source the revision did not touch has no rule in scope."""
    master = RuleRecord(rule_id="b@test", title="B", start="2027-01-20T12:00:00", tz="Europe/Berlin")
    override = RuleRecord(rule_id="b@test#20270220T120000", title="B", start="2027-02-22T15:00:00",
                          tz="Europe/Berlin")
    other = RuleRecord(rule_id="a@test", title="A", start="2027-01-15T12:00:00", tz="Europe/Berlin")
    renamed = RuleRecord(rule_id="c2@test", title="C", start="2027-03-01T09:00:00", tz="Europe/Berlin")
    active = [(1, master), (1, override), (1, other), (1, renamed)]
    scope = RuleScope(frozenset({(7, "b@test#20270220T120000")}), 5, 5)
    assert scope.rule_ids(7, active, [], {}) == {"b@test", "b@test#20270220T120000"}
    assert scope.rule_ids(8, active, [], {}) == frozenset()
    rename = RuleScope(frozenset({(7, "c2@test")}), 6, 6)
    assert rename.rule_ids(7, active, ["c@test"], {"c2@test": "c@test"}) == {"c2@test", "c@test"}
    # C's old id back beside the rule renamed from it: both planned, whichever of them changed.
    back = RuleScope(frozenset({(7, "c@test")}), 7, 7)
    assert back.rule_ids(7, [*active, (1, renamed)], [], {"c2@test": "c@test"}) == {"c2@test", "c@test"}
    # Every rule in scope (a cursor reset) or a source planned whole: no id list at all (None).
    everything = RuleScope(frozenset((7, r.rule_id) for _, r in active), 1, 9)
    assert everything.rule_ids(7, active, [], {}) is None
    assert scope.with_whole_sources([8]).rule_ids(8, active, [], {}) is None
    assert series_of("b@test#20270220T120000") == "b@test" and series_of("a@test") == "a@test"
    assert scope.describe() == "1 rule(s) of 1 source(s) changed by rule versions 5..5"


def test_revision_tag_round_trips_and_refuses_a_hand_edited_value():
    assert revision_range(revision_tags(3, 9)) == (3, 9)
    assert revision_range({}) is None
    assert revision_range(revision_tags(1, 2**63 - 1)) == (1, 2**63 - 1)
    for bad in ("9-3", "0-2", "3", "a-b", "3-4-5", "-1-2", "", " 1-2", "+1-+2", "\u00b2-\u00b2", "\u0661-\u0662",
                "99999999999999999999-99999999999999999999", f"1-{2**63}"):
        with pytest.raises(ValueError, match=f"run tag {REVISION_TAG}="):
            revision_range({REVISION_TAG: bad})


def _ics_config(tmp_path, events):
    (tmp_path / "cal.ics").write_text(_calendar(events), newline="")
    return write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    )


def test_sensor_runs_plan_only_the_changed_rules(tmp_path, db_url):
    """The revision sensor tags its runs with the rule versions they handle; such a run plans only
    the rules those versions changed (its metadata says so), records the ``plan:revision`` heartbeat
    (not ``plan``, which only a run of every rule over the horizon may record), and a run whose tag
    was edited into nonsense fails naming the tag."""
    with dg.instance_for_test() as instance:
        defs = build_definitions(_ics_config(tmp_path, BASE), db_url=db_url, as_of=AS_OF)
        assert defs.resolve_job_def(INGEST_JOB).execute_in_process(instance=instance).success
        tags = range_tags(*horizon_range(parse_instant(AS_OF)))
        assert defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, tags=tags).success
        first = _tick(defs, instance)

        defs = build_definitions(_ics_config(tmp_path, {**BASE, **REVISIONS[0][1]}), db_url=db_url, as_of=AS_OF)
        assert defs.resolve_job_def(INGEST_JOB).execute_in_process(instance=instance).success
        tick = _tick(defs, instance, first.cursor)
        assert tick.run_requests
        for request in tick.run_requests:
            assert revision_range(request.tags) is not None, request.tags
        request = tick.run_requests[0]
        result = defs.resolve_job_def(PLAN_JOB).execute_in_process(
            instance=instance, partition_key=request.partition_key, tags=request.tags)
        assert result.success
        ob = next(e.materialization for e in result.get_asset_materialization_events()
                  if e.materialization.asset_key == dg.AssetKey("obligations"))
        first_id, last_id = revision_range(request.tags)
        assert ob.metadata["scope"].value == f"1 rule(s) of 1 source(s) changed by rule versions {first_id}..{last_id}"
        # Only A's obligations in that month were planned: one per month for the one subscriber.
        assert ob.metadata["planned"].value == 1
        engine = make_engine(db_url)
        with engine.connect() as conn:
            components = set(conn.execute(select(heartbeats.c.component)).scalars())
        engine.dispose()
        assert "plan:revision" in components

        bad = defs.resolve_job_def(PLAN_JOB).execute_in_process(
            instance=instance, partition_key=request.partition_key, tags={REVISION_TAG: "latest"},
            raise_on_error=False)
        assert not bad.success
        failure = next(e for e in bad.all_events if e.event_type_value == "STEP_FAILURE")
        error = failure.event_specific_data.error
        assert f"run tag {REVISION_TAG}='latest'" in (error.cause or error).message


def test_revised_holiday_source_rolls_the_sources_built_on_it(engine, tmp_path):
    """A filing rolled over the holidays of another source (``business_days.calendar: source:hols``):
    a new holiday on its due date moves it to the next business day in a scoped re-plan too, although
    the revision changed only the holiday source, which nobody subscribes to."""
    def configure(holidays: list[str]):
        return load_config(rolled_filings_config(tmp_path, holidays, [
            ("vat", "VAT return", "2027-03-01T12:00:00"), ("ct", "Corporation tax", "2027-04-01T12:00:00")]))[0]

    def ingest(store, cfg):
        for src in cfg.sources:
            fetch_snapshot(store, src, T0)
            assert apply_latest_snapshot(store, src, T0).status in ("applied", "unchanged")

    full = make_engine(f"sqlite:///{tmp_path / 'full.sqlite3'}")
    upgrade(full)
    cfg = configure(["2027-05-03", "2027-08-30"])
    for store in (full, engine):
        ingest(store, cfg)
        plan_all(store, cfg, T0)
    cfg = configure(["2027-05-03", "2027-08-30", "2027-03-01"])
    ingest(full, cfg)
    plan_all(full, cfg, T0)
    since = max_version_id(engine)
    ingest(engine, cfg)
    scoped = plan_all(engine, cfg, T0, scope=changed_rules(engine, since, max_version_id(engine)))
    assert scoped.obligations_moved == 1
    assert "every rule of 1 source(s) rolled over a changed holiday source" in scoped.scope
    assert _state(engine) == _state(full)
    with engine.connect() as conn:
        due = conn.execute(select(obligations.c.due_at).where(obligations.c.rule_id == "vat")).scalar_one()
    assert due == datetime(2027, 3, 2, 12, tzinfo=UTC)


def test_scoped_replan_of_a_revised_govuk_calendar_equals_a_full_replan(shared_dir, engine, tmp_path):
    """Real data: GOV.UK's bank holidays at two commits of 2018–2019, between which the Early May 2020
    bank holiday moved from Monday 4 to Friday 8 May (England & Wales). The revision changes only the
    holiday source, which nobody subscribes to; a re-plan scoped to it plans the filings rolled over
    it whole, leaves the same obligations and alerts as a full re-plan, and moves the VAT return due
    Friday 8 May to Monday 11 May."""
    full = make_engine(f"sqlite:///{tmp_path / 'full.sqlite3'}")
    upgrade(full)

    def ingest(store, cfg, now):
        for src in cfg.sources:
            fetch_snapshot(store, src, now)
            assert apply_latest_snapshot(store, src, now).status in ("applied", "unchanged")

    now = datetime(2019, 6, 10, tzinfo=UTC)
    cfg = govuk_rolled_config(tmp_path, shared_dir, GOVUK_BEFORE_MOVE)
    for store in (full, engine):
        ingest(store, cfg, now)
        plan_all(store, cfg, now)
    assert _state(engine) == _state(full)
    with engine.connect() as conn:
        due = conn.execute(select(obligations.c.due_at).where(obligations.c.rule_id == "vat")).scalar_one()
    assert due == datetime(2020, 5, 8, 11, tzinfo=UTC)

    later = now + timedelta(hours=1)
    cfg = govuk_rolled_config(tmp_path, shared_dir, GOVUK_AFTER_MOVE)
    ingest(full, cfg, later)
    full_out = plan_all(full, cfg, later)
    since = max_version_id(engine)
    ingest(engine, cfg, later)
    scope = changed_rules(engine, since, max_version_id(engine))
    assert scope is not None
    scoped = plan_all(engine, cfg, later, scope=scope)
    assert _state(engine) == _state(full)
    assert (scoped.obligations_moved, scoped.problems) == (full_out.obligations_moved, full_out.problems) == (1, [])
    with engine.connect() as conn:
        due = conn.execute(select(obligations.c.due_at).where(obligations.c.rule_id == "vat")).scalar_one()
    assert due == datetime(2020, 5, 11, 11, tzinfo=UTC)
    assert "every rule of 1 source(s) rolled over a changed holiday source" in scoped.scope
    full.dispose()


def test_taking_back_a_cancelled_override_replans_the_restored_occurrence(tmp_path, db_url):
    """A cancelled override (STATUS:CANCELLED) of A's March occurrence had no obligation of its own;
    when the feed takes it back, its only new version is a withdrawal. The sensor still requests
    March (the master's occurrences count), and the scoped run there restores A's March obligation."""
    cancelled = _event("a@test", "20270315T120000", "Monthly A", "STATUS:CANCELLED",
                       "RECURRENCE-ID;TZID=Europe/Berlin:20270315T120000")
    with dg.instance_for_test() as instance:
        defs = build_definitions(_ics_config(tmp_path, {**BASE, "a#": cancelled}), db_url=db_url, as_of=AS_OF)
        assert defs.resolve_job_def(INGEST_JOB).execute_in_process(instance=instance).success
        tags = range_tags(*horizon_range(parse_instant(AS_OF)))
        assert defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, tags=tags).success
        first = _tick(defs, instance)
        engine = make_engine(db_url)

        def march_a():
            with engine.connect() as conn:
                return conn.execute(select(obligations.c.status).where(
                    obligations.c.rule_id == "a@test", obligations.c.period == "2027-03-15")).scalars().all()

        assert march_a() == []
        defs = build_definitions(_ics_config(tmp_path, BASE), db_url=db_url, as_of=AS_OF)
        assert defs.resolve_job_def(INGEST_JOB).execute_in_process(instance=instance).success
        tick = _tick(defs, instance, first.cursor)
        march = [r for r in tick.run_requests if r.partition_key == "2027-03-01"]
        assert march, [r.partition_key for r in tick.run_requests]
        assert defs.resolve_job_def(PLAN_JOB).execute_in_process(
            instance=instance, partition_key="2027-03-01", tags=march[0].tags).success
        assert march_a() == ["active"]
        engine.dispose()
