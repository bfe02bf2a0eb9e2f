"""A source's parse settings (``format``, ``timezone``: the zone of times written without one) decide
its rules as much as its bytes do. Changing ``timezone:`` in the configuration alone, the file
untouched, re-parses the latest snapshot at the next ingest: the rules move, planning moves the
obligations and corrects delivered reminders, and ``run``, ``preview`` and ``rules diff`` agree
with the store. Before, an unchanged file was never parsed again: the old zone stayed in force,
every reminder went out hours off, and every check passed. Real stores (SQLite, PostgreSQL) and, for
the checks, real Dagster runs through the CLI."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import select, update

from deadline_pipeline.cli import main
from deadline_pipeline.config import load_config
from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.plan.service import plan_all
from deadline_pipeline.store.schema import alerts, obligations, snapshots, sources
from deadline_pipeline_tests.factories import write_config

CSV = "id,title,due,timezone\nx1,Tax thing,2027-01-20T12:00,\n"
AI = '- {title: Conf, year: 2027, id: conf27, deadline: "2027-01-20 12:00:00"}\n'
# 2027-01-20 12:00 on the clock of each zone, in UTC.
BERLIN, NEW_YORK = datetime(2027, 1, 20, 11, tzinfo=UTC), datetime(2027, 1, 20, 17, tzinfo=UTC)
T0 = datetime(2026, 12, 6, 12, tzinfo=UTC)


def _config(tmp_path, fmt: str, location: str, timezone: str | None):
    source = {"name": "sheet", "format": fmt, "location": location, "tenant": "t"}
    if timezone:
        source["timezone"] = timezone
    return load_config(write_config(
        tmp_path, sources=[source],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": ["sheet"], "offsets": ["-P30D", "PT0S"], "channels": ["box"]}],
        channels={"box": {"type": "maildir", "path": str(tmp_path / "maildir")}},
    ))[0]


def _ingest_and_plan(engine, cfg, now):
    (src,) = cfg.sources
    fetch_snapshot(engine, src, now)
    out = apply_latest_snapshot(engine, src, now)
    plan_all(engine, cfg, now)
    return out


def _due(engine) -> list[tuple[str, datetime]]:
    with engine.connect() as conn:
        return list(conn.execute(select(obligations.c.rule_id, obligations.c.due_at)).all())


@pytest.mark.parametrize("fmt, name, content, rule_id", [
    ("csv", "d.csv", CSV, "x1"),
    ("ai-deadlines", "conf.yml", AI, "conf27/submission/deadline"),
])
def test_a_timezone_edit_alone_moves_the_deadline_and_corrects_delivered_reminders(
        engine, tmp_path, fmt, name, content, rule_id):
    (tmp_path / name).write_text(content)
    berlin = _config(tmp_path, fmt, name, "Europe/Berlin")
    assert _ingest_and_plan(engine, berlin, T0).status == "applied"
    assert _due(engine) == [(rule_id, BERLIN)]
    # The 30-day reminder (2026-12-21 11:00Z) goes out.
    later = datetime(2026, 12, 22, tzinfo=UTC)
    with engine.begin() as conn:
        conn.execute(update(alerts).where(alerts.c.send_at <= later).values(status="delivered", delivered_at=later))

    new_york = _config(tmp_path, fmt, name, "America/New_York")
    out = _ingest_and_plan(engine, new_york, later + timedelta(hours=1))
    assert (out.status, out.changed, out.added, out.withdrawn) == ("applied", 1, 0, 0)
    assert out.reparsed == "source settings changed: timezone Europe/Berlin → America/New_York"
    assert _due(engine) == [(rule_id, NEW_YORK)]
    with engine.connect() as conn:
        kinds = sorted(conn.execute(select(alerts.c.kind, alerts.c.status, alerts.c.due_at)).all())
    # One correction for the delivered reminder; the old instant's open reminder is superseded and
    # the new instant's is pending.
    assert kinds == [("correction", "pending", NEW_YORK), ("reminder", "delivered", BERLIN),
                     ("reminder", "pending", NEW_YORK), ("reminder", "pending", NEW_YORK),
                     ("reminder", "superseded", BERLIN)]

    # Parsed with these settings now: the next ingest is unchanged again.
    again = _ingest_and_plan(engine, new_york, later + timedelta(hours=2))
    assert (again.status, again.reparsed) == ("unchanged", None)


def test_a_reparse_after_a_failed_fetch_keeps_the_source_stale(engine, tmp_path):
    """Bytes read again prove nothing about the source answering now: the fetch's error stays."""
    (tmp_path / "d.csv").write_text(CSV)
    _ingest_and_plan(engine, _config(tmp_path, "csv", "d.csv", "Europe/Berlin"), T0)
    (tmp_path / "d.csv").unlink()
    out = _ingest_and_plan(engine, _config(tmp_path, "csv", "d.csv", "America/New_York"), T0 + timedelta(hours=1))
    assert (out.status, out.changed) == ("applied", 1)
    assert _due(engine) == [("x1", NEW_YORK)]
    with engine.connect() as conn:
        row = conn.execute(select(sources.c.status, sources.c.last_fresh_at, sources.c.last_error)).one()
    assert (row.status, row.last_fresh_at) == ("stale", T0)
    assert "d.csv" in row.last_error


def _cli(tmp_path, *args):
    env = {"DEADLINE_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def test_an_empty_timezone_cell_recovers_when_the_source_gets_a_timezone(db_url, tmp_path):
    """The row without a zone fails the source, asking for a ``timezone:``; once given (the file
    untouched) the next run parses the snapshot again: ``source_fresh`` passes, the deadline is
    planned in that zone, and ``preview`` and ``rules diff`` say what the store holds."""
    (tmp_path / "dagster_home").mkdir()
    (tmp_path / "d.csv").write_text(CSV)
    _config(tmp_path, "csv", "d.csv", None)
    path = tmp_path / "deadlines.yaml"
    first = _cli(tmp_path, "run", "--config", path, "--db-url", db_url, "--as-of", "2026-12-06T12:00:00Z")
    assert first.exit_code == 1, first.output
    assert "source_fresh[sheet]                    FAIL" in first.output
    assert "empty timezone, and the source sets no `timezone` for times written without one" in first.output

    _config(tmp_path, "csv", "d.csv", "America/New_York")
    window = ["--subscriber", "ann", "--from", "2027-01-20T00:00:00Z", "--to", "2027-01-21T00:00:00Z"]
    # Before the next run, preview says that the store's reading is the old one.
    waiting = _cli(tmp_path, "preview", "--config", path, "--db-url", db_url, *window,
                   "--as-of", "2026-12-06T12:30:00Z")
    assert waiting.exit_code == 0, waiting.output
    assert ("note: source sheet: snapshot 1 is read differently now (source settings changed: timezone "
            "(unset) → America/New_York)") in waiting.stderr
    res = _cli(tmp_path, "run", "--config", path, "--db-url", db_url, "--as-of", "2026-12-06T13:00:00Z")
    assert res.exit_code == 0, res.output
    assert "re-parsed: source settings changed: timezone (unset) → America/New_York" in res.output
    assert "source_fresh[sheet]                    PASS" in res.output
    assert "rules_complete[sheet]                  PASS" in res.output

    diff = _cli(tmp_path, "rules", "diff", "sheet", "--config", path, "--db-url", db_url, "--json")
    assert diff.exit_code == 0, diff.output
    assert [(r["rule_id"], r["new_instant"]) for r in json.loads(diff.stdout)["added"]] == [
        ("x1", "2027-01-20T17:00:00Z")]
    preview = _cli(tmp_path, "preview", "--config", path, "--db-url", db_url, *window,
                   "--as-of", "2026-12-06T13:00:00Z", "--json")
    assert preview.exit_code == 0, preview.output
    assert not preview.stderr and "note:" not in diff.stderr
    rows = json.loads(preview.stdout)
    assert [(r["status"], r["due_at"]["utc"], r["replan"]) for r in rows] == [
        ("pending", "2027-01-20T17:00:00+00:00", "no change")]


def test_a_snapshot_parsed_before_settings_were_recorded_is_parsed_once_more(engine, tmp_path):
    """After the upgrade (``snapshots.parse_settings`` NULL) which zone the rules were read in is not
    known: the latest snapshot is parsed once more, said in the outcome; identical rules write nothing."""
    (tmp_path / "d.csv").write_text(CSV)
    cfg = _config(tmp_path, "csv", "d.csv", "Europe/Berlin")
    _ingest_and_plan(engine, cfg, T0)
    with engine.begin() as conn:
        conn.execute(update(snapshots).values(parse_settings=None))
    out = _ingest_and_plan(engine, cfg, T0 + timedelta(hours=1))
    assert (out.status, out.changed, out.unchanged) == ("applied", 0, 1)
    assert out.reparsed == "the source settings of its last parse were not recorded (parsed before this release)"
    assert _ingest_and_plan(engine, cfg, T0 + timedelta(hours=2)).status == "unchanged"
    assert _due(engine) == [("x1", BERLIN)]


def test_a_new_reader_reads_an_unchanged_file_again(engine, tmp_path, monkeypatch, caplog):
    """The reader (the parsers' code and libraries, :func:`~deadline_pipeline.ingest.reader.reader_version`)
    is a setting of the parse too: a release that reads a format differently re-reads an unchanged
    file once, so a parser fix reaches it. Here the first ingest runs an older reader that read the
    due time an hour late; the next one, this reader, moves the rule and planning moves the
    obligation. Before, the old reading stayed in force for as long as the file's bytes did."""
    from deadline_pipeline.ingest import parsers, service
    from deadline_pipeline.rules import RuleRecord

    (tmp_path / "d.csv").write_text(CSV)
    cfg = _config(tmp_path, "csv", "d.csv", "Europe/Berlin")
    real_parse = parsers.parse_payload

    def older_reader(*args, **kwargs):
        parsed = real_parse(*args, **kwargs)
        late = [RuleRecord.from_payload({**r.to_payload(), "start": "2027-01-20T13:00:00"}) for r in parsed.rules]
        return type(parsed)(rules=late, problems=parsed.problems)

    with monkeypatch.context() as old:
        old.setattr(service, "parse_payload", older_reader)
        old.setattr(service, "reader_version", lambda: "0123456789ab")
        _ingest_and_plan(engine, cfg, T0)
    assert _due(engine) == [("x1", BERLIN + timedelta(hours=1))]

    with caplog.at_level("INFO", logger="deadline_pipeline.ingest.service"):
        out = _ingest_and_plan(engine, cfg, T0 + timedelta(hours=1))
    assert (out.status, out.changed) == ("applied", 1)
    assert out.reparsed.startswith(f"its reader changed (0123456789ab → {service.reader_version()})"), out.reparsed
    assert _due(engine) == [("x1", BERLIN)]
    # Expected after each release that changes the reader: said, but not a warning.
    (line,) = [r for r in caplog.records if "re-parsed" in r.getMessage()]
    assert line.levelname == "INFO"
    # Read by this reader now: the next ingest is unchanged.
    assert _ingest_and_plan(engine, cfg, T0 + timedelta(hours=2)).status == "unchanged"


def test_the_reader_version_follows_the_readers_code_and_nothing_else(tmp_path, monkeypatch):
    """:func:`reader_version` digests every module a parse can run (the parsers and what they import
    of this package, transitively) and the libraries' versions: editing a parser or a module it
    imports changes it; editing a module no parser reaches (delivery) does not."""
    import shutil

    from deadline_pipeline.ingest import reader

    modules = reader.reader_modules()
    assert {"deadline_pipeline.ingest.parsers.ics", "deadline_pipeline.ingest.parsers.csv_format",
            "deadline_pipeline.rules", "deadline_pipeline.timezones"} <= set(modules)
    assert "deadline_pipeline.deliver.sweep" not in modules

    copy = tmp_path / "deadline_pipeline"
    shutil.copytree(reader.PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(reader, "PACKAGE_DIR", copy)

    def version() -> str:
        reader.reader_version.cache_clear()
        return reader.reader_version()

    try:
        first = version()
        (copy / "deliver" / "sweep.py").write_text((copy / "deliver" / "sweep.py").read_text() + "\n# edited\n")
        assert version() == first
        (copy / "timezones.py").write_text((copy / "timezones.py").read_text() + "\n# edited\n")
        second = version()
        assert second != first
        monkeypatch.setattr(reader, "LIBRARIES", (*reader.LIBRARIES, "jinja2"))
        assert version() != second
    finally:
        reader.reader_version.cache_clear()
