"""The fetch log: every fetch of a source is recorded (not only changed content), and it is pruned
with the snapshots, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from deadline_pipeline.store import sources as ssql
from deadline_pipeline.store.schema import fetch_log, snapshots
from deadline_pipeline_tests.factories import ai_deadlines
from deadline_pipeline_tests.test_ingest_revisions import GOOD_YAML, _edition, _ingest, _source_config

T0 = datetime(2027, 1, 10, tzinfo=UTC)


def _log(engine) -> list:
    with engine.connect() as conn:
        return conn.execute(select(fetch_log.c.fetched_at, fetch_log.c.outcome, fetch_log.c.http_status,
                                   fetch_log.c.sha256, fetch_log.c.snapshot_id, fetch_log.c.error)
                            .order_by(fetch_log.c.id)).all()


def test_every_fetch_is_logged_with_the_snapshot_it_used(engine, tmp_path):
    """New bytes, the same bytes, a missing file, bytes served before (A → B → A): four outcomes,
    one row each, the unchanged ones naming the existing snapshot with that sha256."""
    cfg, target = _source_config(tmp_path, "ai-deadlines")
    src = cfg.sources[0]
    target.write_text(GOOD_YAML)
    first, _ = _ingest(engine, src, T0)
    same, _ = _ingest(engine, src, T0 + timedelta(hours=1))
    target.unlink()
    failed, _ = _ingest(engine, src, T0 + timedelta(hours=2))
    target.write_text(ai_deadlines(_edition(1), _edition(2)))
    second, _ = _ingest(engine, src, T0 + timedelta(hours=3))
    target.write_text(GOOD_YAML)
    back, _ = _ingest(engine, src, T0 + timedelta(hours=4))
    rows = _log(engine)
    assert [(r.fetched_at, r.outcome) for r in rows] == [
        (T0, "new_snapshot"), (T0 + timedelta(hours=1), "unchanged"), (T0 + timedelta(hours=2), "failed"),
        (T0 + timedelta(hours=3), "new_snapshot"), (T0 + timedelta(hours=4), "unchanged")]
    assert [r.snapshot_id for r in rows] == [first.snapshot_id, first.snapshot_id, None, second.snapshot_id,
                                            first.snapshot_id]
    assert rows[0].sha256 == rows[1].sha256 == rows[4].sha256 == first.sha256 and rows[3].sha256 == second.sha256
    assert rows[2].error and "source.dat" in rows[2].error and rows[2].sha256 is None
    assert all(r.http_status is None for r in rows)  # a local file has no HTTP status
    with engine.connect() as conn:
        listed = ssql.fetches(conn, 1)
    assert [r.parse_status for r in listed] == ["parsed", "parsed", None, "quarantined", "parsed"]
    assert back.snapshot_id == first.snapshot_id


def test_fetch_log_is_pruned_with_the_snapshots_keeping_each_sources_latest(engine, tmp_path):
    """Rows older than the retention go, except the source's latest (when it was last looked at);
    a snapshot re-fetched within the retention is kept by its log rows."""
    cfg, target = _source_config(tmp_path, "ai-deadlines")
    src = cfg.sources[0]
    target.write_text(ai_deadlines(*[_edition(i) for i in range(1, 5)]))
    _ingest(engine, src, T0)
    target.write_text(ai_deadlines(*[_edition(i) for i in range(4, 0, -1)]))  # applied, no new version
    reordered, _ = _ingest(engine, src, T0 + timedelta(days=1))
    target.write_text("<html><body>down</body></html>")
    broken, _ = _ingest(engine, src, T0 + timedelta(days=2))
    target.write_text(ai_deadlines(*[_edition(i) for i in range(4, 0, -1)]))
    for day in (3, 20, 40):  # the reordered bytes again: an unchanged fetch each time
        _ingest(engine, src, T0 + timedelta(days=day))
    before = T0 + timedelta(days=10)
    with engine.connect() as conn:
        assert ssql.count_prunable_fetches(conn, before) == 4
        prunable = [r.id for r in ssql.prunable_snapshots(conn, before)]
    # The broken snapshot goes; the reordered one was fetched on days 20 and 40: kept.
    assert prunable == [broken.snapshot_id]
    with engine.begin() as conn:
        assert ssql.prune_fetch_log(conn, before) == 4
        assert ssql.prune_snapshots(conn, prunable, before) == [broken.snapshot_id]
    assert [r.fetched_at for r in _log(engine)] == [T0 + timedelta(days=20), T0 + timedelta(days=40)]
    with engine.connect() as conn:
        assert reordered.snapshot_id in set(conn.execute(select(snapshots.c.id)).scalars())
    # Far later, the source's latest row stays: it says when the source was last looked at.
    with engine.begin() as conn:
        assert ssql.prune_fetch_log(conn, T0 + timedelta(days=400)) == 1
    assert [r.fetched_at for r in _log(engine)] == [T0 + timedelta(days=40)]
