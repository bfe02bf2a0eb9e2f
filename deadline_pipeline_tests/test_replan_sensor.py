"""A rule revision re-plans exactly the due months it touches, through Dagster: the sensor requests
the partitions that every rule version stored since its cursor touches, not the horizon, however many
ingest runs wrote them and whether or not their run recorded a rule_versions materialization."""

from __future__ import annotations

import dagster as dg

from deadline_pipeline.orchestration.assets import RULE_VERSIONS
from deadline_pipeline.orchestration.build import INGEST_JOB, build_definitions
from deadline_pipeline.orchestration.planning import PLAN_JOB, horizon_range, range_tags
from deadline_pipeline.orchestration.resources import parse_instant
from deadline_pipeline_tests.factories import ics, write_config

AS_OF = "2027-01-10T00:00:00Z"
EVENTS = [
    {"uid": "a@test", "tzid": "Europe/Berlin", "dtstart": "20270315T120000", "summary": "A"},
    {"uid": "b@test", "tzid": "UTC", "dtstart": "20270601T090000", "summary": "B"},
    {"uid": "c@test", "tzid": "UTC", "dtstart": "20270602T090000", "summary": "C"},
    {"uid": "d@test", "tzid": "UTC", "dtstart": "20270603T090000", "summary": "D"},
]


def _config(tmp_path, events):
    (tmp_path / "cal.ics").write_text(ics(*events), newline="")
    return write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    )


def _sensor(defs, name):
    return next(s for s in defs.sensors if s.name == name)


def _tick(defs, instance, cursor=None):
    """One real evaluation of ``replan_on_revision`` with the definitions' resources (the daemon
    supplies them; ``build_sensor_context`` does not take them from ``definitions``)."""
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs,
                                  resources={k: defs.resources[k] for k in ("store", "settings", "clock")})
    return _sensor(defs, "replan_on_revision").evaluate_tick(ctx)


def _months(tick):
    return sorted(r.partition_key for r in tick.run_requests)


def _ingest(defs, instance, **kwargs):
    return defs.resolve_job_def(INGEST_JOB).execute_in_process(instance=instance, **kwargs)


def test_revision_requests_only_the_months_it_touches(tmp_path, db_url):
    with dg.instance_for_test() as instance:
        defs = build_definitions(_config(tmp_path, EVENTS), db_url=db_url, as_of=AS_OF)
        assert defs.resolve_job_def(INGEST_JOB).execute_in_process(instance=instance).success
        tags = range_tags(*horizon_range(parse_instant(AS_OF)))
        assert defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, tags=tags).success
        first = _tick(defs, instance)
        # The first ingest added every rule: their months.
        assert _months(first) == ["2027-03-01", "2027-06-01"]

        # A moves from March to April; B, C, D are unchanged.
        moved = [dict(EVENTS[0], dtstart="20270410T120000"), *EVENTS[1:]]
        defs = build_definitions(_config(tmp_path, moved), db_url=db_url, as_of=AS_OF)
        assert defs.resolve_job_def(INGEST_JOB).execute_in_process(instance=instance).success
        tick = _tick(defs, instance, first.cursor)
        assert _months(tick) == ["2027-03-01", "2027-04-01"]

        # Re-planning just those two partitions moves A; a second run of them changes nothing.
        for key in ("2027-03-01", "2027-04-01"):
            assert defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, partition_key=key).success
        again = defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, partition_key="2027-04-01")
        mats = [e.materialization for e in again.get_asset_materialization_events()]
        ob = next(m for m in mats if m.asset_key == dg.AssetKey("obligations"))
        assert (ob.metadata["inserted"].value, ob.metadata["moved"].value, ob.metadata["updated"].value) == (0, 0, 0)
        assert ob.metadata["unchanged"].value == 1


OCTOBER = {"uid": "oct@test", "tzid": "UTC", "dtstart": "20271015T090000", "summary": "October"}
DECEMBER = {"uid": "dec@test", "tzid": "UTC", "dtstart": "20271215T090000", "summary": "December"}


def test_two_ingests_between_ticks_request_both_months(tmp_path, db_url):
    with dg.instance_for_test() as instance:
        defs = build_definitions(_config(tmp_path, EVENTS), db_url=db_url, as_of=AS_OF)
        assert _ingest(defs, instance).success
        first = _tick(defs, instance)
        assert _months(first) == ["2027-03-01", "2027-06-01"]

        # Two ingest runs, the source changed between them, and no tick in between: October, then December.
        _config(tmp_path, [*EVENTS, OCTOBER])
        assert _ingest(defs, instance).success
        _config(tmp_path, [*EVENTS, OCTOBER, DECEMBER])
        assert _ingest(defs, instance).success
        assert len(instance.fetch_materializations(RULE_VERSIONS, limit=10).records) == 3

        tick = _tick(defs, instance, first.cursor)
        assert _months(tick) == ["2027-10-01", "2027-12-01"]
        # The same tick evaluated again (its cursor update lost) asks for the same run keys, which
        # the daemon does not launch twice.
        again = _tick(defs, instance, first.cursor)
        assert [r.run_key for r in again.run_requests] == [r.run_key for r in tick.run_requests]
        assert len({r.run_key for r in tick.run_requests}) == 2

        after = _tick(defs, instance, tick.cursor)
        assert after.run_requests == []
        assert after.skip_message and after.cursor == tick.cursor


def test_versions_of_a_failed_ingest_run_are_replanned(tmp_path, db_url, monkeypatch):
    from deadline_pipeline.orchestration import assets
    from deadline_pipeline.plan.service import max_version_id
    from deadline_pipeline.store.db import get_engine

    with dg.instance_for_test() as instance:
        defs = build_definitions(_config(tmp_path, EVENTS), db_url=db_url, as_of=AS_OF)
        assert _ingest(defs, instance).success
        first = _tick(defs, instance)
        before = max_version_id(get_engine(db_url))

        # The run dies after the new versions were committed, before rule_versions is materialized
        # (here: reading the affected months back fails, as on a dropped connection).
        def lost_connection(*args, **kwargs):
            raise ConnectionError("server closed the connection unexpectedly")

        _config(tmp_path, [*EVENTS, OCTOBER])
        with monkeypatch.context() as patch:
            patch.setattr(assets, "affected_partitions", lost_connection)
            failed = _ingest(defs, instance, raise_on_error=False)
        assert not failed.success
        assert RULE_VERSIONS not in {e.materialization.asset_key for e in failed.get_asset_materialization_events()}
        assert max_version_id(get_engine(db_url)) == before + 1  # the October rule is in the store

        tick = _tick(defs, instance, first.cursor)
        assert _months(tick) == ["2027-10-01"]
        assert _tick(defs, instance, tick.cursor).run_requests == []


def test_cursor_of_the_former_asset_sensor_replans_every_stored_revision(tmp_path, db_url, capsys):
    with dg.instance_for_test() as instance:
        defs = build_definitions(_config(tmp_path, EVENTS), db_url=db_url, as_of=AS_OF)
        assert _ingest(defs, instance).success
        # What the asset_sensor kept after handling that ingest: its materialization's storage id.
        legacy = str(instance.fetch_materializations(RULE_VERSIONS, limit=1).records[0].storage_id)
        _config(tmp_path, [*EVENTS, OCTOBER])
        assert _ingest(defs, instance).success
        _config(tmp_path, [*EVENTS, OCTOBER, DECEMBER])
        assert _ingest(defs, instance).success

        # Which versions that cursor covered is unknown: all of them are handled again (planning
        # is idempotent), said as a warning, rather than October lost.
        tick = _tick(defs, instance, legacy)
        assert _months(tick) == ["2027-03-01", "2027-06-01", "2027-10-01", "2027-12-01"]
        assert "is not a rule version cursor" in capsys.readouterr().err
        assert _tick(defs, instance, tick.cursor).run_requests == []


def test_rule_version_ids_become_visible_in_id_order(tmp_path, pg_url):
    """The sensor's cursor is the highest rule version id handled: a version committed after a
    higher one (two ingests at once) would be below the cursor already, and never re-planned."""
    import threading

    from deadline_pipeline.config import load_config
    from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
    from deadline_pipeline.plan.service import max_version_id
    from deadline_pipeline.store.db import make_engine, upgrade
    from deadline_pipeline.store.sources import find_source, insert_versions, latest_versions

    engine = make_engine(pg_url)
    upgrade(engine)
    src = load_config(_config(tmp_path, EVENTS))[0].sources[0]
    now = parse_instant(AS_OF)
    fetch_snapshot(engine, src, now)
    assert apply_latest_snapshot(engine, src, now).status == "applied"
    with engine.connect() as conn:
        source_id = find_source(conn, "cal").id
        latest = latest_versions(conn, source_id)
    before = max_version_id(engine)

    def next_version(rule_id):
        v = latest[rule_id]
        return dict(source_id=source_id, rule_id=rule_id, version=v["version"] + 1, snapshot_id=v["snapshot_id"],
                    valid_from=now, withdrawn=False, content_hash=v["content_hash"], payload=v["payload"],
                    lineage=v["lineage"])

    first_rule, second_rule = sorted(latest)[:2]
    earlier = engine.connect()
    tx = earlier.begin()
    insert_versions(earlier, [next_version(first_rule)])  # its id is taken, not yet committed
    committed = threading.Event()

    def later_writer():
        with engine.begin() as conn:
            insert_versions(conn, [next_version(second_rule)])
        committed.set()

    writer = threading.Thread(target=later_writer)
    writer.start()
    try:
        # The later writer waits for the earlier transaction instead of committing a higher id first.
        assert not committed.wait(1.5)
        assert max_version_id(engine) == before
    finally:
        tx.commit()
        earlier.close()
        writer.join(30)
    assert committed.is_set()
    with engine.connect() as conn:
        now_latest = latest_versions(conn, source_id)
    assert max_version_id(engine) == before + 2
    engine.dispose()
    assert {now_latest[first_rule]["version"], now_latest[second_rule]["version"]} == {
        latest[first_rule]["version"] + 1, latest[second_rule]["version"] + 1}
