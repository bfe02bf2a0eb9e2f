"""Rule identity and versions across real revisions of real sources, on SQLite and PostgreSQL.

The expected moves below were computed by the diff and then checked by hand against the files:
e.g. eccv20 was '2020-03-05 07:00:00' Europe/London (GMT in March, so 07:00Z) and became
'2020-03-05 23:59:00' UTC; miccai2020 moved from 3 March 23:59:59 in Los Angeles (PST, -8) to 17 March
23:59:59 (PDT since 8 March, -7); icml20 went from 03:59 PST to 23:59 UTC-12 the day before, the same
instant 11:59Z — a re-expression, hence *reworded*, not moved.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from deadline_pipeline.config import load_config
from deadline_pipeline.ingest.diff import diff_snapshots
from deadline_pipeline.ingest.parsers import parse_payload
from deadline_pipeline.ingest.service import apply_latest_snapshot, apply_snapshot, fetch_snapshot
from deadline_pipeline.plan.rule_instant import instant_of
from deadline_pipeline.plan.service import plan_all
from deadline_pipeline.rules import RuleRecord
from deadline_pipeline.store import sources as ssql
from deadline_pipeline.store.schema import alerts, obligations, rule_versions, snapshots, sources
from deadline_pipeline.watch.sources import (
    evaluate_fresh,
    read_source_state,
    source_fresh,
    source_not_quarantined,
)
from deadline_pipeline_tests.factories import ai_deadlines, write_config

T0 = datetime(2027, 1, 10, tzinfo=UTC)


def _revisions(folder: Path, pattern: str) -> list[Path]:
    """Revision files in the order of the date in their name (not the commit hash)."""
    files = list(folder.glob(pattern))
    return sorted(files, key=lambda p: re.search(r"\d{4}-\d{2}-\d{2}", p.name).group(0))


def _source_config(tmp_path: Path, fmt: str, name: str = "src", file: str = "source.dat", **extra):
    path = write_config(
        tmp_path, sources=[{"name": name, "format": fmt, "location": file, "tenant": "t1", "freshness": "P1D",
                            **extra}],
        subscribers=[], subscriptions=[], channels={},
    )
    cfg, _ = load_config(path)
    return cfg, tmp_path / file


def _ingest(engine, src, now):
    fetched = fetch_snapshot(engine, src, now)
    return fetched, apply_latest_snapshot(engine, src, now)


def _versions_of_snapshot(engine, snapshot_id: int) -> dict[str, tuple[int, bool, dict]]:
    with engine.connect() as conn:
        rows = conn.execute(select(rule_versions.c.rule_id, rule_versions.c.version, rule_versions.c.withdrawn,
                                   rule_versions.c.payload).where(rule_versions.c.snapshot_id == snapshot_id)).all()
    return {r.rule_id: (r.version, r.withdrawn, r.payload) for r in rows}


def _count(engine, table, *where) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one()


def _z(rule: RuleRecord) -> str:
    return instant_of(rule).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the pure diff ----------------------------------------------------------------------------------

def _rule(rule_id="c/submission/deadline", start="2027-03-01T23:59:00", tz="UTC-12", title="C — Paper", **kw):
    return RuleRecord(rule_id=rule_id, title=title, start=start, tz=tz, **kw)


def test_diff_zone_respelling_and_reexpression_are_reworded_not_moved():
    old = [_rule(tz="UTC-12")]
    assert diff_snapshots(old, [_rule(tz="AoE")]).reworded[0].fields == ("tz",)
    # The same instant written in UTC: start and zone both differ, the instant does not.
    same = diff_snapshots(old, [_rule(start="2027-03-02T11:59:00", tz="UTC")])
    assert not same.moved and [c.fields for c in same.reworded] == [("start", "tz")]
    moved = diff_snapshots(old, [_rule(start="2027-03-02T11:59:00", tz="UTC+1")])
    assert [(c.old_when, c.new_when) for c in moved.moved] == [("2027-03-02T11:59:00Z", "2027-03-02T10:59:00Z")]


def test_diff_reorder_title_rename_and_series():
    a, b = _rule("a/x/y"), _rule("b/x/y", title="B")
    assert diff_snapshots([a, b], [b, a]).unchanged == 2 and diff_snapshots([a, b], [b, a]).is_empty
    reworded = diff_snapshots([a], [_rule("a/x/y", title="C — Paper (extended title)")])
    assert [c.fields for c in reworded.reworded] == [("title",)]
    # Same due time, same kind, same title: one rule whose id changed.
    renamed = diff_snapshots([a], [_rule("a2/x/y")])
    assert [(c.old.rule_id, c.rule_id) for c in renamed.renamed] == [("a/x/y", "a2/x/y")]
    assert not renamed.withdrawn and not renamed.added
    # A different title as well: nothing says it is the same thing, so withdrawal plus addition.
    other = diff_snapshots([a], [_rule("a2/x/y", title="Another conference")])
    assert [c.rule_id for c in other.withdrawn] == ["a/x/y"] and [c.rule_id for c in other.added] == ["a2/x/y"]
    series = _rule("s", start="2027-01-15T09:00:00", tz="Europe/Berlin", rrule="FREQ=MONTHLY")
    assert diff_snapshots([series], [_rule("s", start="2027-01-15T09:00:00", tz="Europe/Berlin",
                                           rrule="FREQ=MONTHLY;COUNT=3")]).moved
    # Two spellings of one fixed offset are one zone for a series too.
    fixed = _rule("s", start="2027-01-15T09:00:00", tz="UTC-12", rrule="FREQ=MONTHLY")
    assert diff_snapshots([fixed], [_rule("s", start="2027-01-15T09:00:00", tz="AoE", rrule="FREQ=MONTHLY")]).reworded
    floating = diff_snapshots([_rule("f", start="2027-01-15", tz=None)], [_rule("f", start="2027-01-16", tz=None)])
    assert [(c.old_when, c.new_when) for c in floating.moved] == [("2027-01-15 (floating)", "2027-01-16 (floating)")]


# --- the real ai-deadlines revisions ----------------------------------------------------------------

PWC_MOVED = {
    # 2020-01-28 -> 2020-02-19
    1: {
        "eccv20/submission/deadline": ("2020-03-05T07:00:00Z", "2020-03-05T23:59:00Z"),
        "miccai2020/submission/deadline": ("2020-03-04T07:59:59Z", "2020-03-18T06:59:59Z"),
        "uai20/submission/deadline": ("2020-02-21T04:59:59Z", "2020-02-20T22:59:59Z"),
    },
    # 2020-02-19 -> 2020-04-17 (the 2020 extensions)
    2: {
        "coling20/submission/deadline": ("2020-04-09T11:59:59Z", "2020-07-02T11:59:59Z"),
        "ecmlpkdd2020/submission/deadline": ("2020-03-27T11:59:59Z", "2020-04-03T11:59:59Z"),
        "emnlp20/submission/deadline": ("2020-05-12T11:59:00Z", "2020-06-02T11:59:00Z"),
        "iccc20/submission/deadline": ("2020-03-01T23:59:59Z", "2020-03-09T11:59:59Z"),
        "icpr20/submission/deadline": ("2020-03-02T22:59:59Z", "2020-03-18T22:59:59Z"),
        "interspeech20/submission/deadline": ("2020-03-30T11:59:59Z", "2020-05-09T11:59:59Z"),
        "mm20/submission/deadline": ("2020-03-29T11:59:00Z", "2020-04-26T11:59:00Z"),
        "neurips20/abstract/abstract_deadline": ("2020-05-05T20:00:00Z", "2020-05-27T20:00:00Z"),
        "neurips20/submission/deadline": ("2020-05-12T20:00:00Z", "2020-06-03T20:00:00Z"),
    },
}
PWC_REWORDED = {1: {"icml20/abstract/abstract_deadline", "icml20/submission/deadline"}, 2: set()}
PWC_ADDED = {
    1: {"ecmlpkdd2020/abstract/abstract_deadline", "ecmlpkdd2020/submission/deadline", "icdm20/submission/deadline",
        "mm20/abstract/abstract_deadline", "mm20/submission/deadline", "neurips20/abstract/abstract_deadline",
        "neurips20/submission/deadline"},
    2: {"bmvc20/abstract/abstract_deadline", "bmvc20/submission/deadline", "cikm20/abstract/abstract_deadline",
        "cikm20/submission/deadline", "conll2020/submission/deadline", "corl20/submission/deadline",
        "ismir20/abstract/abstract_deadline", "ismir20/submission/deadline", "recsys20/abstract/abstract_deadline",
        "recsys20/submission/deadline", "threedv20/submission/deadline"},
}
PWC_WITHDRAWN = {
    # ACMMultimedia -> mm20 is a renamed edition id: withdrawn here, added above.
    1: {"ACMMultimedia/abstract/abstract_deadline", "ACMMultimedia/submission/deadline",
        "icdm19/submission/deadline", "neurips19/abstract/abstract_deadline", "neurips19/submission/deadline"},
    2: {"conll2019/submission/deadline", "corl2019/submission/deadline", "ismir19/submission/deadline",
        "mm20/abstract/abstract_deadline", "threedv19/submission/deadline"},
}


def test_pwc_revisions_in_order_give_exact_versions(engine, tmp_path, shared_dir):
    files = _revisions(shared_dir / "data" / "ai-deadlines-pwc" / "revisions", "conferences.*.yml")
    assert [f.name[-14:-4] for f in files] == ["2020-01-28", "2020-02-19", "2020-04-17"]
    cfg, target = _source_config(tmp_path, "ai-deadlines", name="pwc")
    src = cfg.sources[0]
    snaps = []
    for n, f in enumerate(files):
        target.write_bytes(f.read_bytes())
        fetched, applied = _ingest(engine, src, T0 + timedelta(days=n))
        assert fetched.status == "new_snapshot" and applied.status == "applied", applied.error
        snaps.append(applied.snapshot_id)
    assert _versions_of_snapshot(engine, snaps[0]) and len(_versions_of_snapshot(engine, snaps[0])) == 55

    with engine.connect() as conn:
        for k in (1, 2):
            written = _versions_of_snapshot(engine, snaps[k])
            withdrawn = {rid for rid, (_v, w, _p) in written.items() if w}
            added = {rid for rid, (v, w, _p) in written.items() if not w and v == 1}
            changed = {rid for rid, (v, w, _p) in written.items() if not w and v > 1}
            assert withdrawn == PWC_WITHDRAWN[k]
            assert added == PWC_ADDED[k]
            assert changed == set(PWC_MOVED[k]) | PWC_REWORDED[k]
            # Old and new instants, from the stored payloads of the two versions.
            moved = {}
            for rid in changed:
                version = written[rid][0]
                old_payload = conn.execute(select(rule_versions.c.payload).where(
                    rule_versions.c.rule_id == rid, rule_versions.c.version == version - 1)).scalar_one()
                old, new = RuleRecord.from_payload(old_payload), RuleRecord.from_payload(written[rid][2])
                if _z(old) != _z(new):
                    moved[rid] = (_z(old), _z(new))
            assert moved == PWC_MOVED[k]

    # The same through the pure diff of the two files (what `rules diff` shows).
    parsed = [parse_payload("ai-deadlines", f.read_bytes(), source="pwc").rules for f in files]
    for k in (1, 2):
        d = diff_snapshots(parsed[k - 1], parsed[k])
        assert {c.rule_id: (c.old_when, c.new_when) for c in d.moved} == PWC_MOVED[k]
        assert {c.rule_id for c in d.reworded} == PWC_REWORDED[k]
        assert {c.rule_id for c in d.added} == PWC_ADDED[k]
        assert {c.rule_id for c in d.withdrawn} == PWC_WITHDRAWN[k]

    # Replaying the last revision changes nothing: no snapshot, no version; the source is fresh again.
    before = (_count(engine, snapshots), _count(engine, rule_versions))
    fetched, applied = _ingest(engine, src, T0 + timedelta(days=9))
    assert (fetched.status, applied.status) == ("unchanged", "unchanged")
    assert (_count(engine, snapshots), _count(engine, rule_versions)) == before
    assert read_source_state(engine, "pwc").last_fresh_at == T0 + timedelta(days=9)


def test_hf_files_one_source_each(engine, tmp_path, shared_dir):
    files = sorted((shared_dir / "data" / "ai-deadlines-hf" / "conferences").glob("*.yml"))
    assert len(files) >= 10
    srcs = [{"name": f"hf-{f.stem}", "format": "ai-deadlines", "location": str(f), "tenant": "t1"} for f in files]
    cfg, _ = load_config(write_config(tmp_path, sources=srcs, subscribers=[], subscriptions=[], channels={}))
    total = 0
    for s in cfg.sources:
        _f, out = _ingest(engine, s, T0)
        assert out.status == "applied" and out.rules > 0, (s.name, out.error)
        total += out.rules
    assert _count(engine, rule_versions) == total
    for s in cfg.sources:
        f, out = _ingest(engine, s, T0 + timedelta(hours=1))
        assert (f.status, out.status) == ("unchanged", "unchanged")
    assert _count(engine, rule_versions) == total


def test_govuk_revision_moves_early_may_2020_only(engine, tmp_path, shared_dir):
    folder = shared_dir / "data" / "govuk-bank-holidays"
    files = _revisions(folder / "revisions", "bank-holidays.*.json")
    cfg, target = _source_config(tmp_path, "govuk-bank-holidays", name="uk-holidays")
    src = cfg.sources[0]
    snaps = []
    for n, f in enumerate(files):
        target.write_bytes(f.read_bytes())
        _f, out = _ingest(engine, src, T0 + timedelta(days=n))
        assert out.status == "applied", out.error
        snaps.append(out.snapshot_id)
    assert _count(engine, rule_versions, rule_versions.c.snapshot_id == snaps[0]) == 246
    written = _versions_of_snapshot(engine, snaps[1])
    assert {rid: (v, w, p["start"]) for rid, (v, w, p) in written.items()} == {
        "england-and-wales/2020/early_may": (2, False, "2020-05-08"),
        "northern-ireland/2020/early_may": (2, False, "2020-05-08"),
    }
    # The current schema of the same publisher parses into the same kind of rules.
    current = parse_payload("govuk-bank-holidays", (folder / "bank-holidays.json").read_bytes(), source="uk")
    assert not current.problems and len(current.rules) == 108
    assert {r.kind for r in current.rules} == {"holiday"}
    assert "scotland/2024/st_andrews_day" in {r.rule_id for r in current.rules}


def test_icalendar_corpus_through_the_service_never_crashes(engine, tmp_path, shared_dir):
    files = sorted((shared_dir / "data" / "icalendar-tests").rglob("*.ics"))
    assert len(files) > 150
    srcs = [{"name": f"ics{n}", "format": "ics", "location": str(f)} for n, f in enumerate(files)]
    cfg, _ = load_config(write_config(tmp_path, sources=srcs, subscribers=[], subscriptions=[], channels={}))
    statuses: dict[str, int] = {}
    for s, f in zip(cfg.sources, files, strict=True):
        fetched, out = _ingest(engine, s, T0)
        assert fetched.status == "new_snapshot", (f, fetched.error)
        assert out.status in ("applied", "parse_failed"), (f, out.status, out.error)
        if out.status == "parse_failed":
            assert f"snapshot {out.snapshot_id}: source {s.name!r}" in out.error, out.error
            assert re.search(r"line \d+|position unknown", out.error), out.error
        statuses[out.status] = statuses.get(out.status, 0) + 1
    # A calendar whose every component is unusable (or that has none) yields 0 rules: a parse failure.
    assert statuses.get("applied", 0) > 90 and statuses.get("parse_failed", 0) > 5, statuses
    assert _count(engine, snapshots) == len(files), "every payload is stored, broken or not"


# --- broken payloads --------------------------------------------------------------------------------

GOOD_YAML = ai_deadlines(*[
    {"title": f"C{i}", "year": 2027, "id": f"c{i}27", "deadline": f"2027-03-0{i} 23:59", "timezone": "UTC-12"}
    for i in range(1, 5)
])
BROKEN = {
    "invalid_yaml": ("ai-deadlines", b"- title: X\n  id: x\n  deadline: '2027-01-01\n- [unclosed\n",
                     r"line \d+, column \d+: invalid YAML"),
    "truncated_ics": ("ics", b"BEGIN:VCALENDAR\r\nVERSION:2.0\r\nBEGIN:VEVENT\r\nUID:a\r\nDTSTART:20270101T0000",
                      r"line 5: payload ends inside BEGIN:VEVENT"),
    "wrong_encoding": ("ai-deadlines", "- title: Zürich\n  id: z\n".encode("latin-1"),
                       r"line 1, column 11: payload is not valid UTF-8 \(byte 0xfc"),
    "html_page": ("ai-deadlines", b"<!DOCTYPE html><html><body>Service Unavailable</body></html>",
                  r"line 1: payload looks like an HTML page"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_payload_keeps_last_good_and_the_loop_goes_on(engine, tmp_path, case):
    fmt, payload, where = BROKEN[case]
    good_ics = ("BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//t//EN\r\nBEGIN:VEVENT\r\nUID:a\r\n"
                "DTSTART:20270201T090000Z\r\nSUMMARY:A\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n")
    (tmp_path / "broken.dat").write_text(good_ics if fmt == "ics" else GOOD_YAML)
    (tmp_path / "other.yml").write_text(GOOD_YAML)
    cfg, _ = load_config(write_config(tmp_path, sources=[
        {"name": "broken", "format": fmt, "location": "broken.dat"},
        {"name": "other", "format": "ai-deadlines", "location": "other.yml"},
    ], subscribers=[], subscriptions=[], channels={}))
    for s in cfg.sources:
        assert _ingest(engine, s, T0)[1].status == "applied"
    good_versions = _count(engine, rule_versions)

    (tmp_path / "broken.dat").write_bytes(payload)
    (tmp_path / "other.yml").write_text(GOOD_YAML.replace("2027-03-01 23:59", "2027-03-08 23:59"))
    outcomes = {s.name: _ingest(engine, s, T0 + timedelta(hours=1))[1] for s in cfg.sources}
    bad = outcomes["broken"]
    assert bad.status == "parse_failed"
    assert bad.error.startswith(f"snapshot {bad.snapshot_id}: source 'broken': "), bad.error
    assert re.search(where, bad.error), bad.error
    assert outcomes["other"].status == "applied" and outcomes["other"].changed == 1, "the loop went on"
    assert _count(engine, rule_versions) == good_versions + 1, "the broken source's versions stay in force"
    with engine.connect() as conn:
        row = ssql.get_source(conn, "broken")
        stored = conn.execute(select(snapshots.c.content, snapshots.c.parse_status)
                              .where(snapshots.c.id == bad.snapshot_id)).one()
    assert row.status == "stale" and row.last_error == bad.error
    assert stored == (payload, "failed"), "the broken bytes are kept for a human to read"
    check = source_fresh(engine, "broken", T0 + timedelta(hours=1))
    assert not check.passed and "stale" in check.summary and check.metadata["snapshot_id"] == bad.snapshot_id


def test_parser_crash_is_recorded_not_raised(engine, tmp_path, monkeypatch):
    from deadline_pipeline.ingest import service

    cfg, target = _source_config(tmp_path, "ai-deadlines")
    target.write_text(GOOD_YAML)

    def boom(*_a, **_k):
        raise RuntimeError("bug in a parser")

    monkeypatch.setattr(service, "parse_payload", boom)
    _f, out = _ingest(engine, cfg.sources[0], T0)
    assert out.status == "parse_failed" and "parser failed unexpectedly: RuntimeError: bug in a parser" in out.error


# --- no-op revisions downstream ---------------------------------------------------------------------

def _planned_world(tmp_path, yaml_text: str):
    (tmp_path / "conf.yml").write_text(yaml_text)
    path = write_config(
        tmp_path,
        sources=[{"name": "conf", "format": "ai-deadlines", "location": "conf.yml", "tenant": "t1"}],
        subscribers=[{"id": "ann", "tenant": "t1", "email": "ann@example.org", "timezone": "Europe/Berlin"}],
        subscriptions=[{"name": "all", "sources": ["conf"], "offsets": ["-P7D", "-P1D", "PT0S"],
                        "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    )
    return load_config(path)[0]


def _alerts(engine) -> dict:
    with engine.connect() as conn:
        rows = conn.execute(select(alerts.c.id, alerts.c.dedup_key, alerts.c.send_at, alerts.c.status,
                                   alerts.c.kind)).all()
    return {r.id: (r.dedup_key, r.send_at, r.status, r.kind) for r in rows}


def _edition(i: int, **over) -> dict:
    e = {"title": f"C{i}", "year": 2027, "id": f"c{i}27", "deadline": f"2027-03-0{i} 23:59", "timezone": "UTC-12"}
    e.update(over)
    return e


def test_noop_revisions_change_no_alert(engine, tmp_path):
    editions = [_edition(i) for i in range(1, 5)]
    cfg = _planned_world(tmp_path, ai_deadlines(*editions))
    src = cfg.sources[0]
    _ingest(engine, src, T0)
    plan_all(engine, cfg, T0)
    before = _alerts(engine)
    assert len(before) == 4 * 3

    same_instant = [_edition(1, deadline="2027-03-02 11:59", timezone="UTC")] + editions[1:]
    revisions = {
        "title only": [_edition(1, title="C1 (renamed conference)")] + editions[1:],
        "UTC-12 -> AoE": [_edition(i, timezone="AoE") for i in range(1, 5)],
        "same instant in UTC": same_instant,
        "reordered": list(reversed(same_instant)),
    }
    for n, (what, revision) in enumerate(revisions.items(), start=1):
        now = T0 + timedelta(minutes=n)
        (tmp_path / "conf.yml").write_text(ai_deadlines(*revision))
        versions = _count(engine, rule_versions)
        _f, applied = _ingest(engine, src, now)
        assert applied.status == "applied", (what, applied.error)
        plan_all(engine, cfg, now)
        assert _alerts(engine) == before, f"{what}: an alert changed"
        with engine.connect() as conn:
            dues = conn.execute(select(func.count(func.distinct(obligations.c.due_at)))).scalar_one()
        assert dues == 4, f"{what}: a new due instant appeared"
    # Reordering alone does not even create a version.
    assert applied.changed == 0 and _count(engine, rule_versions) == versions


def test_a_title_that_is_not_text_is_repaired_and_every_deadline_planned(engine, tmp_path, caplog):
    """A lone UTF-16 surrogate ("\\ud800" in a YAML title: not a character, no UTF-8 encoder takes
    it) was stored on SQLite and then failed planning for every source with UnicodeEncodeError;
    on PostgreSQL it failed the whole snapshot. Now it is stored as the text ``\\ud800`` (an
    escaped surrogate pair becomes its character), the repair is reported, and every deadline of
    both editions is planned."""
    editions = [_edition(1, title="C1 \ud800 lone"), _edition(2, title="C2 \ud83d\ude00 pair"), _edition(3)]
    cfg = _planned_world(tmp_path, ai_deadlines(*editions))
    assert "\\uD800" in (tmp_path / "conf.yml").read_text(), "the YAML itself carries the escape"
    with caplog.at_level(logging.WARNING, logger="deadline_pipeline.ingest.service"):
        _f, applied = _ingest(engine, cfg.sources[0], T0)
    assert applied.status == "applied", applied.error
    assert any("c127" in p and "unpaired UTF-16 surrogate" in p for p in applied.problems), applied.problems
    # The log says the record was kept: "skipped record" sent an operator looking for a lost reminder.
    lines = [r.getMessage() for r in caplog.records if "c127" in r.getMessage()]
    assert lines and all("record kept, its text repaired" in m and "skipped" not in m for m in lines), lines
    assert any("c227" in p and "joined" in p for p in applied.problems), applied.problems
    plan = plan_all(engine, cfg, T0)
    assert not plan.problems, plan.problems
    with engine.connect() as conn:
        titles = sorted(t.split(" 2027")[0] for t in conn.execute(select(obligations.c.title)).scalars())
    assert titles == ["C1 \\ud800 lone", "C2 \U0001F600 pair", "C3"]
    assert len(_alerts(engine)) == 3 * 3

def test_renamed_edition_is_a_rename(engine, tmp_path):
    editions = [_edition(i) for i in range(1, 5)]
    cfg = _planned_world(tmp_path, ai_deadlines(*editions))
    src = cfg.sources[0]
    _ingest(engine, src, T0)
    plan_all(engine, cfg, T0)
    (tmp_path / "conf.yml").write_text(ai_deadlines(_edition(1, id="conf1-2027"), *editions[1:]))
    _f, out = _ingest(engine, src, T0 + timedelta(minutes=1))
    assert (out.added, out.changed, out.withdrawn, out.renamed) == (0, 0, 0, 1)
    plan = plan_all(engine, cfg, T0 + timedelta(minutes=1))
    assert plan.obligations_withdrawn == 0 and plan.alerts_cancelled == 0 and plan.obligations_inserted == 0


# --- quarantine, accept and prune --------------------------------------------------------------------

def test_quarantined_snapshot_is_accepted_by_force(engine, tmp_path):
    editions = [_edition(i) for i in range(1, 5)]
    cfg, target = _source_config(tmp_path, "ai-deadlines")
    src = cfg.sources[0]
    target.write_text(ai_deadlines(*editions))
    _ingest(engine, src, T0)
    target.write_text(ai_deadlines(editions[0]))
    _f, out = _ingest(engine, src, T0 + timedelta(hours=1))
    assert out.status == "quarantined" and "withdraw 3 of 4" in out.error
    check = source_not_quarantined(engine, "src")
    assert not check.passed and check.metadata["quarantined_snapshot_id"] == out.snapshot_id
    assert f"snapshot {out.snapshot_id}" in check.summary
    # Said once: the row read "snapshot 2 is quarantined: snapshot 2 quarantined: would withdraw …".
    assert check.summary.startswith(f"source 'src': snapshot {out.snapshot_id} is quarantined: would withdraw 3 "
                                    "of 4"), check.summary

    accepted = apply_snapshot(engine, src, out.snapshot_id, T0 + timedelta(hours=2), force=True)
    assert accepted.status == "applied" and accepted.withdrawn == 3 and "withdraw 3 of 4" in accepted.forced_over
    assert source_not_quarantined(engine, "src").passed
    state = read_source_state(engine, "src")
    assert state.status == "fresh" and state.last_fresh_at == T0 + timedelta(hours=2)
    assert _count(engine, rule_versions, rule_versions.c.withdrawn.is_(True)) == 3


def test_prune_keeps_referenced_latest_and_current_snapshots(engine, tmp_path):
    editions = [_edition(i) for i in range(1, 5)]
    cfg, target = _source_config(tmp_path, "ai-deadlines")
    src = cfg.sources[0]
    ids = {}
    steps = [
        ("v1", ai_deadlines(*editions)),              # applied: referenced by versions
        ("broken", "<html><body>oops</body></html>"),  # failed: prunable once old
        ("v1-reordered", ai_deadlines(*reversed(editions))),  # applied, no new version: current
    ]
    for n, (name, text) in enumerate(steps):
        target.write_text(text)
        ids[name] = _ingest(engine, src, T0 + timedelta(days=n))[1].snapshot_id
    now = T0 + timedelta(days=30)
    with engine.connect() as conn:
        prunable = [r.id for r in ssql.prunable_snapshots(conn, now)]
    assert prunable == [ids["broken"]]
    with engine.begin() as conn:
        assert ssql.prune_snapshots(conn, prunable, now) == [ids["broken"]]
    with engine.connect() as conn:
        left = {r.id for r in conn.execute(select(snapshots.c.id)).all()}
        current = conn.execute(select(sources.c.current_snapshot_id)).scalar_one()
    assert left == {ids["v1"], ids["v1-reordered"]} and current == ids["v1-reordered"]
    # Within the keep window nothing goes.
    with engine.connect() as conn:
        assert ssql.prunable_snapshots(conn, T0) == []


# --- freshness, pure ----------------------------------------------------------------------------------

def test_freshness_window_is_judged_at_now(engine, tmp_path):
    cfg, target = _source_config(tmp_path, "ai-deadlines")
    target.write_text(GOOD_YAML)
    assert not source_fresh(engine, "src", T0).passed  # never ingested
    _ingest(engine, cfg.sources[0], T0)
    state = read_source_state(engine, "src")
    window = timedelta(days=1)
    assert evaluate_fresh("src", state, T0 + timedelta(hours=23), window).passed
    late = evaluate_fresh("src", state, T0 + timedelta(days=3), window)
    assert not late.passed and "longer than its window" in late.summary
    assert late.metadata["last_fresh_at"] == T0.isoformat() and late.metadata["window_seconds"] == 86400


def test_a_source_fresh_after_now_is_not_fresh(engine, tmp_path):
    """A replay (--as-of) ahead of the real clock, or a host clock ahead, recorded the source fresh in
    the future: "fresh -13 d 6 h ago" passed, so a source nobody fetched any more looked fresh until
    the real clock got there. Now red, naming the instant; a minute of skew is still fresh."""
    cfg, target = _source_config(tmp_path, "ai-deadlines")
    target.write_text(GOOD_YAML)
    _ingest(engine, cfg.sources[0], T0)
    state = read_source_state(engine, "src")
    window = timedelta(days=1)
    ahead = evaluate_fresh("src", state, T0 - timedelta(days=13), window)
    assert not ahead.passed and "after now: a replay (--as-of) wrote into this store" in ahead.summary, ahead.summary
    assert evaluate_fresh("src", state, T0 - timedelta(minutes=1), window).passed


# --- entries that announce no deadline ----------------------------------------------------------------

def _five_planned(engine, tmp_path):
    """Five editions ingested and planned at T0 (one of five is under the quarantine's share):
    ``(editions, config, source, pending alerts)``."""
    editions = [_edition(i) for i in range(1, 6)]
    cfg = _planned_world(tmp_path, ai_deadlines(*editions))
    src = cfg.sources[0]
    _ingest(engine, src, T0)
    plan_all(engine, cfg, T0)
    return editions, cfg, src, {k: v for k, v in _alerts(engine).items() if v[2] == "pending"}


def test_entry_losing_its_deadline_keeps_the_rule_in_force(engine, tmp_path):
    """An entry still present with its id but without ``deadline``: the rule in force is held (not
    withdrawn, its reminders not cancelled), rules_complete is red, and the source stays fresh."""
    from deadline_pipeline.watch.sources import rules_complete

    editions, cfg, src, before = _five_planned(engine, tmp_path)
    assert before
    lost = {k: v for k, v in editions[1].items() if k != "deadline"}
    (tmp_path / "conf.yml").write_text(ai_deadlines(editions[0], lost, *editions[2:]))
    _, out = _ingest(engine, src, T0 + timedelta(hours=1))
    assert out.status == "applied" and out.withdrawn == 0 and out.held == ["c227/submission/deadline"], out
    with engine.connect() as conn:
        withdrawn = conn.execute(select(rule_versions.c.rule_id).where(rule_versions.c.withdrawn.is_(True))).all()
        row = ssql.get_source(conn, "conf")
    assert withdrawn == []
    plan_all(engine, cfg, T0 + timedelta(hours=1))
    assert {k for k, v in _alerts(engine).items() if v[2] == "pending"} == set(before)
    complete = rules_complete(engine, "conf")
    assert not complete.passed and "c227" in complete.summary, complete.summary
    assert row.status == "fresh" and row.last_error and "no 'deadline'" in row.last_error


def test_rules_complete_judges_the_snapshot_in_force_while_a_newer_one_is_quarantined(engine, tmp_path):
    """The snapshot in force holds a rule back (red). A newer snapshot that parses cleanly but drops
    most rules is quarantined: rules_complete stays red, on the snapshot in force, and names the
    quarantined one. Judged on the latest snapshot alone it turned green ("yielded 1 rule(s), none
    skipped": the count of a snapshot never applied) while the rule was still held back."""
    from deadline_pipeline.watch.sources import rules_complete

    editions, cfg, src, _before = _five_planned(engine, tmp_path)
    lost = {k: v for k, v in editions[1].items() if k != "deadline"}
    (tmp_path / "conf.yml").write_text(ai_deadlines(editions[0], lost, *editions[2:]))
    _, in_force = _ingest(engine, src, T0 + timedelta(hours=1))
    assert in_force.status == "applied" and in_force.held == ["c227/submission/deadline"], in_force
    assert not rules_complete(engine, "conf").passed
    (tmp_path / "conf.yml").write_text(ai_deadlines(editions[0]))
    _, newer = _ingest(engine, src, T0 + timedelta(hours=2))
    assert newer.status == "quarantined", newer
    complete = rules_complete(engine, "conf")
    assert not complete.passed, complete.summary
    assert complete.metadata["snapshot_id"] == in_force.snapshot_id and "c227" in complete.summary
    assert complete.metadata["quarantined_snapshot_id"] == newer.snapshot_id
    assert f"the newer snapshot {newer.snapshot_id} is quarantined, not applied" in complete.summary
    assert not source_not_quarantined(engine, "conf").passed
    # Accepted, the clean snapshot is in force: nothing is held back any more.
    assert apply_snapshot(engine, src, newer.snapshot_id, T0 + timedelta(hours=3), force=True).status == "applied"
    complete = rules_complete(engine, "conf")
    assert complete.passed and complete.metadata["snapshot_id"] == newer.snapshot_id, complete.summary
    assert "quarantined_snapshot_id" not in complete.metadata


def test_entry_broken_under_a_new_id_keeps_the_rule_in_force(engine, tmp_path):
    """One edit both renames an entry's id and breaks its deadline: the unparseable entry names no
    rule the source had, so it may be the rule that went missing. That rule is held (not withdrawn,
    its reminders not cancelled, no "withdrawn" notice), rules_complete is red and names it, and the
    diff shows it unparsed. Matched by id alone, it was withdrawn and its subscriber told so."""
    from deadline_pipeline.watch.reconcile import reminders_owed
    from deadline_pipeline.watch.sources import rules_complete

    editions, cfg, src, before = _five_planned(engine, tmp_path)
    broken = _edition(2, id="c227-v2", deadline="2027-03-45 23:59")
    (tmp_path / "conf.yml").write_text(ai_deadlines(editions[0], broken, *editions[2:]))
    _, out = _ingest(engine, src, T0 + timedelta(hours=1))
    assert out.status == "applied" and out.withdrawn == 0 and out.held == ["c227/submission/deadline"], out
    plan = plan_all(engine, cfg, T0 + timedelta(hours=1))
    assert plan.obligations_withdrawn == 0 and plan.alerts_cancelled == 0
    assert {k for k, v in _alerts(engine).items() if v[2] == "pending"} == set(before)
    assert not any(v[3] == "cancellation" for v in _alerts(engine).values())
    complete = rules_complete(engine, "conf")
    assert not complete.passed and "c227" in complete.summary, complete.summary
    assert reminders_owed(engine, cfg, T0 + timedelta(hours=1)).passed

    old = parse_payload("ai-deadlines", ai_deadlines(*editions).encode(), source="conf")
    new = parse_payload("ai-deadlines", ai_deadlines(editions[0], broken, *editions[2:]).encode(), source="conf")
    diff = diff_snapshots(old.rules, new.rules, new.problems)
    assert [c.rule_id for c in diff.unparsed] == ["c227/submission/deadline"] and not diff.withdrawn


def test_ics_event_broken_under_a_new_uid_is_held_not_withdrawn():
    """The same in ICS: a VEVENT whose UID gained a suffix in the edit that broke its RRULE."""
    from deadline_pipeline.ingest.versions import held_back

    def cal(uid: str, rrule: str) -> bytes:
        return ("BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//t//EN\r\n"
                "BEGIN:VEVENT\r\nUID:keep@t\r\nDTSTAMP:20260101T000000Z\r\nDTSTART:20270110T120000Z\r\n"
                "SUMMARY:Kept\r\nEND:VEVENT\r\n"
                f"BEGIN:VEVENT\r\nUID:{uid}\r\nDTSTAMP:20260101T000000Z\r\nDTSTART:20270115T120000Z\r\n"
                f"SUMMARY:Quarterly\r\n{rrule}\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n").encode()

    old = parse_payload("ics", cal("q4@t", "RRULE:FREQ=MONTHLY;INTERVAL=3;COUNT=4"), source="tax")
    new = parse_payload("ics", cal("q4-v2@t", "RRULE:FREQ=MONTHLY;UNTIL=2031-01-01"), source="tax")
    assert [p.record_id for p in new.problems if p.skipped] == ["q4-v2@t"], new.problems
    known = [r.rule_id for r in old.rules]
    missing = sorted(set(known) - {r.rule_id for r in new.rules})
    assert missing and held_back(missing, new.problems, known=known) == missing
    # A skipped record that names a rule the source has stands for that rule only.
    named = parse_payload("ics", cal("keep@t", "RRULE:FREQ=MONTHLY;UNTIL=2031-01-01"), source="tax")
    assert held_back(missing, [p for p in named.problems if p.skipped], known=known) == []
    diff = diff_snapshots(old.rules, new.rules, new.problems)
    assert sorted(c.rule_id for c in diff.unparsed) == missing and not diff.withdrawn


def test_not_yet_announced_entry_is_information_only(engine, tmp_path, shared_dir, caplog):
    """The real feed's cvpr27 (no deadline announced yet) matches no rule in force: nothing red, no
    source error, and the snapshot asset is confirmed (the Dagster freshness agrees with source_fresh).
    The ingest log says so: it said "skipped record" while rules_complete said "none skipped"."""
    import logging

    from deadline_pipeline.orchestration.assets import snapshot_confirmed
    from deadline_pipeline.watch.sources import rules_complete

    cfg, dest = _source_config(tmp_path, "ai-deadlines")
    dest.write_bytes((shared_dir / "data" / "ai-deadlines-hf" / "conferences" / "cvpr.yml").read_bytes())
    src = cfg.sources[0]
    with caplog.at_level(logging.WARNING, logger="deadline_pipeline.ingest.service"):
        _, out = _ingest(engine, src, T0)
    said = [r.getMessage() for r in caplog.records if "cvpr27" in r.getMessage()]
    assert said and all(": not announced yet, nothing to plan: " in m for m in said), said
    assert out.status == "applied" and out.skipped == 0 and out.held == [], out
    assert any("cvpr27" in p and "no 'deadline'" in p for p in out.problems), out.problems
    with engine.connect() as conn:
        row = ssql.get_source(conn, "src")
        report = ssql.snapshot_meta(conn, row.current_snapshot_id).parse_report
    assert row.last_error is None and row.status == "fresh"
    assert [p["record_id"] for p in report["informational"]] == ["cvpr27"] and report["skipped_count"] == 0
    assert rules_complete(engine, "src").passed
    assert source_fresh(engine, "src", T0).passed
    assert snapshot_confirmed(row.last_fresh_at, row.status, None)


def test_overrides_taken_back_out_of_a_feed_are_not_a_mass_withdrawal(engine, tmp_path):
    """A weekly series and a one-off, each given a RECURRENCE-ID override in a revision, then the
    original file again: the two overrides are gone, their occurrences back at the series' times.
    Counted as withdrawn rules, that was 2 of 4 (over the 30% share) and the routine edit was
    quarantined (source_not_quarantined red, 'source accept' needed). Their masters stay: nothing is
    cancelled, so the snapshot is applied and the occurrences move back."""
    from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
    from deadline_pipeline_tests.factories import cal_ics_config, ics

    weekly = dict(uid="weekly@x", tzid="Europe/Berlin", dtstart="20270111T090000", summary="Weekly",
                  rrule="FREQ=WEEKLY;COUNT=8")
    once = dict(uid="once@x", tzid="Europe/Berlin", dtstart="20270301T090000", summary="Once")
    moved = [dict(weekly, rrule=None, dtstart="20270113T150000", recurrence_id="20270111T090000"),
             dict(once, dtstart="20270302T090000", recurrence_id="20270301T090000")]
    cfg = cal_ics_config(tmp_path)
    (src,) = cfg.sources
    statuses = []
    for i, events in enumerate(((weekly, once), (weekly, once, *moved), (weekly, once))):
        (tmp_path / "cal.ics").write_text(ics(*events))
        now = datetime(2027, 1, 1, i, tzinfo=UTC)
        fetch_snapshot(engine, src, now)
        statuses.append(apply_latest_snapshot(engine, src, now).status)
    assert statuses == ["applied", "applied", "applied"], statuses
