"""Planning at scale, on SQLite and PostgreSQL: chunked writes give the same plan as one chunk, a
no-op re-plan neither rewrites nor locks a row, and the COPY text and binary paths keep every value
intact."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import select, text

from deadline_pipeline.config import load_config
from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.plan import chunks, service
from deadline_pipeline.plan.keys import alert_dedup_key, reminder_dedup_keys
from deadline_pipeline.plan.service import plan_all
from deadline_pipeline.store import mirror, new_rows, staging
from deadline_pipeline.store.db import make_engine, upgrade
from deadline_pipeline.store.schema import alerts, obligations
from deadline_pipeline_tests.factories import ics, write_config

T0 = datetime(2027, 1, 10, tzinfo=UTC)
MONTHLY = {"uid": "m@test", "tzid": "Europe/Berlin", "dtstart": "20270115T120000", "summary": "Monthly",
           "rrule": "FREQ=MONTHLY;COUNT=6"}
ONCE = {"uid": "o@test", "tzid": "UTC", "dtstart": "20270301T090000", "summary": "Once"}
# More one-off rules, so that withdrawing ONCE stays under the ingest's mass-withdrawal quarantine.
OTHERS = [{"uid": f"o{i}@test", "tzid": "UTC", "dtstart": f"2027040{i}T090000", "summary": f"Other {i}"}
          for i in range(1, 4)]


def _config(tmp_path, events):
    (tmp_path / "cal.ics").write_text(ics(*events), newline="")
    return load_config(write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": f"u{i}", "tenant": "t", "email": f"u{i}@example.org", "timezone": "Europe/Berlin",
                      "webhook_url": f"http://127.0.0.1:9/h/{i}"} for i in range(4)],
        # u0 has two subscriptions to one source: they merge into one obligation per occurrence, so
        # a chunk must never be cut between them.
        subscriptions=[{"name": "all", "sources": ["cal"], "offsets": ["-P7D", "-P1D"], "channels": ["mail"]},
                       {"name": "hook", "sources": ["cal"], "subscribers": ["u0"], "offsets": ["-P2D"],
                        "channels": ["hook"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "m")}, "hook": {"type": "webhook"}},
    ))[0]


def _ingest_plan(engine, cfg, now):
    for s in cfg.sources:
        fetch_snapshot(engine, s, now)
        apply_latest_snapshot(engine, s, now)
    return plan_all(engine, cfg, now)


def _state(engine):
    with engine.connect() as conn:
        obs = sorted(conn.execute(select(obligations.c.obligation_key, obligations.c.status, obligations.c.due_at,
                                         obligations.c.fingerprint, obligations.c.revision)).all())
        als = sorted(conn.execute(
            select(obligations.c.obligation_key, alerts.c.dedup_key, alerts.c.kind, alerts.c.offset_seconds,
                   alerts.c.channel, alerts.c.send_at, alerts.c.status, alerts.c.status_reason, alerts.c.due_at)
            .join(obligations, obligations.c.id == alerts.c.obligation_id)).all())
    return obs, als


def test_chunked_plan_equals_one_chunk_and_withdraws_across_chunks(engine, tmp_path, monkeypatch):
    """Chunks of one obligation (cut at every subscriber) plan, re-plan and withdraw exactly as one
    chunk does: same rows, same counts, a no-op re-plan writes nothing."""
    cfg = _config(tmp_path, [MONTHLY, ONCE, *OTHERS])
    reference = make_engine(f"sqlite:///{tmp_path / 'reference.sqlite3'}")
    upgrade(reference)
    one = _ingest_plan(reference, cfg, T0)

    monkeypatch.setattr(chunks, "CHUNK_OBLIGATIONS", 1)
    chunked = _ingest_plan(engine, cfg, T0)
    assert (chunked.obligations_planned, chunked.alerts_planned, chunked.obligations_inserted,
            chunked.alerts_inserted) == (one.obligations_planned, one.alerts_planned, one.obligations_inserted,
                                         one.alerts_inserted)
    # 4 subscribers × 10 occurrences; u0 also gets a -P2D webhook reminder on each.
    assert (chunked.obligations_planned, chunked.alerts_planned) == (40, 40 * 2 + 10)
    assert _state(engine) == _state(reference)

    again = plan_all(engine, cfg, T0 + timedelta(minutes=5))
    assert (again.obligations_unchanged, again.alerts_written, again.obligations_withdrawn) == (40, 0, 0)

    cfg = _config(tmp_path, [MONTHLY, *OTHERS])  # one one-off rule is withdrawn: 4 obligations in 4 chunks
    for eng in (engine, reference):
        gone = _ingest_plan(eng, cfg, T0 + timedelta(minutes=10))
        assert (gone.obligations_withdrawn, gone.alerts_cancelled) == (4, 4 * 2 + 1)
    assert _state(engine) == _state(reference)
    reference.dispose()


def test_noop_replan_neither_rewrites_nor_locks_a_row(engine, tmp_path):
    """PostgreSQL marks every row version an upsert touched, even one whose ``WHERE`` said "no
    change" (it is locked): an unchanged re-plan must leave every row's xmin and xmax alone."""
    if engine.dialect.name != "postgresql":
        pytest.skip("row versions (xmin/xmax) are PostgreSQL's")
    cfg = _config(tmp_path, [MONTHLY, ONCE, *OTHERS])
    _ingest_plan(engine, cfg, T0)
    tables = ("obligations", "alerts", "subscribers", "subscriptions")

    def versions():
        with engine.connect() as conn:
            return {t: conn.execute(text(f"SELECT id, xmin::text, xmax::text FROM {t} ORDER BY id")).all()
                    for t in tables}

    before = versions()
    out = plan_all(engine, cfg, T0 + timedelta(minutes=5))
    assert (out.obligations_unchanged, out.alerts_written) == (40, 0)
    assert versions() == before


def test_copy_text_keeps_special_characters_nulls_and_instants(engine):
    """The COPY text the store formats itself: tabs, newlines, carriage returns and backslashes are
    escaped, None is NULL (not the text ``\\N``), instants keep their offset."""
    reason = "a\tb\nc\rd\\e \\N"
    when = datetime(2027, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    with engine.begin() as conn:
        staging.create_stage(conn)
        n = staging.stage_rows(conn, staging.stage_alerts, [
            ("k1", -60, "ch\t1", "reminder", "d1", when, "pending", reason, when),
            ("k2", 0, "ch", "reminder", "d2", when, "pending", None, None),
        ])
        rows = conn.execute(select(staging.stage_alerts).order_by(staging.stage_alerts.c.obligation_key)).all()
        staging.drop_stage(conn)
    assert n == 2
    assert [(r.channel, r.status_reason, r.send_at, r.due_at) for r in rows] == [
        ("ch\t1", reason, when, when), ("ch", None, when, None)]


def test_copy_text_refuses_a_naive_instant():
    with pytest.raises(ValueError, match="naive"):
        list(staging._copy_lines([(1, datetime(2027, 1, 1))]))


def test_copy_binary_keeps_values_and_refuses_what_the_server_would_misread(engine):
    """The binary COPY of new obligations and alerts: text with tabs, newlines and non-ASCII, NULL,
    64-bit ids and instants to the microsecond (before and after 2000, PostgreSQL's epoch) come back
    exactly. A naive instant raises ``ValueError``, and a value of another type than its column
    ``TypeError``: the server checks binary fields only by length, so a 4-character string sent as
    an int4 would be stored as a number."""
    kinds = ("int4", "text", "int8", "timestamptz", "text", "timestamptz")
    rows = [(-86400, "ch\t1\nä\\N", 2**40, datetime(2027, 1, 2, 3, 4, 5, 678901, tzinfo=UTC), None,
             datetime(1999, 12, 31, 23, 59, 59, 1, tzinfo=UTC)),
            (7, "", 1, datetime(2027, 3, 1, 9, tzinfo=timezone(timedelta(hours=2))), "x", None)]
    for bad in [(1, 2, 3, None, None, None), ("1234", "x", 3, None, None, None)]:
        with pytest.raises(TypeError, match="cannot be written"):
            list(new_rows._binary_fields([bad], kinds))
    with pytest.raises(ValueError, match="naive"):
        list(new_rows._binary_fields([(1, "x", 3, datetime(2027, 1, 1), None, None)], kinds))
    if engine.dialect.name != "postgresql":
        return
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TEMPORARY TABLE binary_copy (a int4, b varchar(20), c int8, d timestamptz, "
                             "e text, f timestamptz)")
        n = new_rows.copy_binary(conn, "binary_copy", list("abcdef"),
                            (new_rows._pack_count(len(kinds)) + f for f in new_rows._binary_fields(rows, kinds)))
        got = [tuple(r) for r in conn.exec_driver_sql("SELECT * FROM binary_copy ORDER BY c DESC").all()]
        conn.exec_driver_sql("DROP TABLE binary_copy")
    assert n == 2
    assert got == rows


def test_binary_copy_column_types_are_the_store_columns(engine):
    """The binary COPY sends each value in the form of its column's type; a column whose type a
    migration changed must change the encoder too (the server would refuse the data loudly, but
    only at the first plan that writes new obligations)."""
    if engine.dialect.name != "postgresql":
        pytest.skip("the binary COPY is PostgreSQL's")
    as_sent = {"varchar": "text", "text": "text", "int4": "int4", "int8": "int8", "timestamptz": "timestamptz"}
    with engine.connect() as conn:
        types = {(t, c): as_sent.get(u, u) for t, c, u in conn.exec_driver_sql(
            "SELECT table_name, column_name, udt_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name IN ('obligations', 'alerts')").all()}
    assert [types["alerts", c] for c in new_rows.NEW_ALERT_COLUMNS] == list(new_rows._NEW_ALERT_KINDS)
    assert [types["obligations", c] for c in ["id", *new_rows.NEW_OBLIGATION_COLUMNS]] == [
        "int8", *new_rows._NEW_OBLIGATION_KINDS]


def test_reminder_dedup_keys_are_alert_dedup_keys():
    due = datetime(2027, 3, 1, 9, tzinfo=UTC)
    slots = [(-86400, "mail"), (-604800, "hook"), (0, "chännel")]
    assert reminder_dedup_keys("k" * 64, due, slots) == [
        alert_dedup_key("k" * 64, s, ch, "reminder", due_at=due) for s, ch in slots]


@pytest.mark.parametrize("prepared", [False, True], ids=["built-while-writing", "prepared-ahead"])
def test_a_wrong_all_new_guess_is_merged_not_duplicated(engine, tmp_path, monkeypatch, caplog, prepared):
    """PostgreSQL COPYs a chunk it guesses all new straight in; when the guess is wrong (stored keys
    the sample missed, or a concurrent run) the unique index refuses the COPY, the savepoint undoes
    it, and the chunk is merged: nothing duplicated, nothing lost, the fallback counted and logged —
    also when the chunk's alert rows and COPY fields were prepared ahead because the store looked
    empty."""
    if engine.dialect.name != "postgresql":
        pytest.skip("the direct COPY of new chunks is PostgreSQL's; SQLite always merges")
    cfg = _config(tmp_path, [MONTHLY, ONCE, *OTHERS])
    first = _ingest_plan(engine, cfg, T0)
    assert (first.direct_write_fallbacks, first.obligations_inserted) == (0, 40)
    before = _state(engine)

    monkeypatch.setattr(chunks, "CHUNK_OBLIGATIONS", 10)
    monkeypatch.setattr(new_rows, "none_stored", lambda conn, keys: True)  # every chunk guessed all new
    monkeypatch.setattr(new_rows, "store_has_no_obligations", lambda conn: prepared)
    made = []
    real_prepare = chunks.prepare
    monkeypatch.setattr(chunks, "prepare", lambda *a: made.append(real_prepare(*a)) or made[-1])
    again = plan_all(engine, cfg, T0 + timedelta(minutes=5))
    # Prepared ahead: the first chunk, and the second (planned while the first was written); no
    # more once a chunk turned out not to be new.
    assert [p.alerts is not None for p in made] == [prepared, prepared, False, False]
    assert again.direct_write_fallbacks == 4  # one per subscriber's chunk
    assert (again.obligations_unchanged, again.obligations_inserted, again.alerts_written) == (40, 0, 0)
    assert again.obligations_withdrawn == 0
    assert _state(engine) == before
    assert "merged instead" in caplog.text


def test_a_first_plan_prepares_new_chunks_ahead_and_starts_small(engine, tmp_path, monkeypatch):
    """On PostgreSQL a first plan's chunks grow from an eighth of ``CHUNK_OBLIGATIONS`` (the database
    waits while the first one is planned) and arrive with their alert rows and COPY fields built by
    the planning thread; the result is the same plan as one chunk, and a re-plan (a store with
    obligations) takes full-size chunks and prepares nothing it may not need."""
    cfg = _config(tmp_path, [MONTHLY, ONCE, *OTHERS])
    reference = make_engine(f"sqlite:///{tmp_path / 'reference.sqlite3'}")
    upgrade(reference)
    _ingest_plan(reference, cfg, T0)

    monkeypatch.setattr(chunks, "CHUNK_OBLIGATIONS", 80)
    made = []
    real_prepare = chunks.prepare
    monkeypatch.setattr(chunks, "prepare", lambda *a: made.append(real_prepare(*a)) or made[-1])
    first = _ingest_plan(engine, cfg, T0)
    postgres = engine.dialect.name == "postgresql"
    # 4 subscribers × 10 obligations, cut between subscribers once a chunk holds 10, then 20, then
    # 40 (PostgreSQL, whose first plan writes new chunks directly; SQLite merges one chunk of 80).
    assert [len(p.chunk) for p in made] == ([10, 20, 10] if postgres else [40])
    assert [p.alerts is not None for p in made] == [postgres] * len(made)
    assert (first.obligations_inserted, first.alerts_inserted, first.obligations_withdrawn) == (40, 90, 0)
    assert _state(engine) == _state(reference)

    made.clear()
    again = plan_all(engine, cfg, T0 + timedelta(minutes=5))
    assert [(len(p.chunk), p.alerts is not None) for p in made] == [(40, False)]  # full-size chunks, nothing prepared
    assert (again.obligations_unchanged, again.alerts_written) == (40, 0)
    reference.dispose()


def test_chunk_statements_join_by_key_lookups_on_postgresql(engine):
    """Inside ``key_lookups`` PostgreSQL may not hash or merge-join (a sequential scan of the whole
    store per chunk is quadratic in the plan's size); outside it the session's settings are back."""
    if engine.dialect.name != "postgresql":
        pytest.skip("planner settings are PostgreSQL's")
    with engine.begin() as conn:
        with staging.key_lookups(conn):
            assert (conn.exec_driver_sql("SHOW enable_hashjoin").scalar(),
                    conn.exec_driver_sql("SHOW enable_mergejoin").scalar()) == ("off", "off")
        assert (conn.exec_driver_sql("SHOW enable_hashjoin").scalar(),
                conn.exec_driver_sql("SHOW enable_mergejoin").scalar()) == ("on", "on")


def test_a_bulk_plan_refreshes_the_statistics_of_what_it_wrote(engine, tmp_path, monkeypatch):
    """After a large write the planner must not believe the tables are empty (autovacuum analyses
    them only later): a run that inserted many rows runs ANALYZE itself; a small run does not."""
    if engine.dialect.name != "postgresql":
        pytest.skip("table statistics (pg_class.reltuples) are PostgreSQL's")
    cfg = _config(tmp_path, [MONTHLY, ONCE, *OTHERS])

    def reltuples():
        with engine.connect() as conn:
            return conn.exec_driver_sql("SELECT reltuples FROM pg_class WHERE relname IN ('obligations', 'alerts') "
                                        "ORDER BY relname").scalars().all()

    monkeypatch.setattr(service, "ANALYZE_AFTER_ROWS", 10**9)
    _ingest_plan(engine, cfg, T0)
    assert reltuples() == [-1, -1]  # never analysed
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE alerts, obligations CASCADE")
    monkeypatch.setattr(service, "ANALYZE_AFTER_ROWS", 50)
    plan_all(engine, cfg, T0)
    assert reltuples() == [90, 40]  # alerts, obligations
    with engine.connect() as conn:
        # A small sample (a coarse histogram of the 90 distinct keys), and the session's target back.
        bounds = conn.exec_driver_sql(
            "SELECT cardinality(histogram_bounds::text::text[]) FROM pg_stats "
            "WHERE tablename = 'alerts' AND attname = 'dedup_key'").scalar()
        assert bounds == staging.ANALYZE_WRITTEN_TARGET + 1
        assert conn.exec_driver_sql("SHOW default_statistics_target").scalar() == "100"


def _mirror(engine):
    from deadline_pipeline.store.schema import subscribers, subscriptions

    with engine.connect() as conn:
        subs = sorted(conn.execute(select(subscribers.c.external_id, subscribers.c.email, subscribers.c.active)).all())
        rows = sorted(conn.execute(
            select(subscriptions.c.name, subscribers.c.external_id, subscriptions.c.offsets, subscriptions.c.active)
            .join(subscribers, subscribers.c.id == subscriptions.c.subscriber_id)).all())
    return subs, rows


def _edited(cfg):
    """``cfg`` with u3's address changed, u2 removed and the ``hook`` subscription (u0's second,
    the last row built) removed."""
    subscribers = [s.model_copy(update={"email": "new3@example.org"}) if s.id == "u3" else s
                   for s in cfg.subscribers if s.id != "u2"]
    return cfg.model_copy(update={"subscribers": subscribers,
                                  "subscriptions": [s for s in cfg.subscriptions if s.name != "hook"]})


@pytest.mark.parametrize("page", [1, 2, 3])
def test_the_configuration_mirror_in_pages_equals_one_page(engine, tmp_path, monkeypatch, page):
    """The mirror reads and writes the configuration's rows a page at a time: an edit, a removed
    subscriber and a removed subscription on any page are mirrored as one page mirrors them, and a
    subscriber whose subscriptions fall on two pages keeps both."""
    cfg = _config(tmp_path, [MONTHLY])
    monkeypatch.setattr(mirror, "MIRROR_PAGE", 10**6)
    service.sync_configuration(engine, cfg)
    whole = _mirror(engine)
    assert [r[1:] for r in whole[1] if r[0] == "hook"] == [("u0", [-172800], True)]
    service.sync_configuration(engine, _edited(cfg))
    whole_edited = _mirror(engine)
    assert ("u2", "u2@example.org", False) in whole_edited[0] and ("u3", "new3@example.org", True) in whole_edited[0]
    assert [r[1:] for r in whole_edited[1] if r[0] == "hook" or r[1] == "u2"] == [
        ("u2", [-604800, -86400], False), ("u0", [-172800], False)]

    fresh = make_engine(f"sqlite:///{tmp_path / f'paged{page}.db'}")
    upgrade(fresh)
    monkeypatch.setattr(mirror, "MIRROR_PAGE", page)
    service.sync_configuration(fresh, cfg)
    assert _mirror(fresh) == whole
    service.sync_configuration(fresh, _edited(cfg))
    assert _mirror(fresh) == whole_edited
    service.sync_configuration(fresh, cfg)  # everything back, u2 and the hook subscription active again
    assert _mirror(fresh) == whole
    fresh.dispose()
