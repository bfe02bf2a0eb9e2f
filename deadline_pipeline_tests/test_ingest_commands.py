"""The ingest commands (rules diff, source accept, snapshots list/prune, validate) and the Dagster
source checks, run the way an operator runs them."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
from click.testing import CliRunner

from deadline_pipeline.cli import main
from deadline_pipeline.config import load_config
from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot
from deadline_pipeline.orchestration.assets import build_assets
from deadline_pipeline.orchestration.resources import ClockResource, SettingsResource, StoreResource
from deadline_pipeline.orchestration.source_checks import SOURCE_CHECKS_FACTORY
from deadline_pipeline.store.db import get_engine
from deadline_pipeline_tests.factories import ai_deadlines, ics, write_config

T0 = datetime(2027, 1, 10, tzinfo=UTC)


def _edition(i: int, **over) -> dict:
    e = {"title": f"C{i}", "year": 2027, "id": f"c{i}27", "deadline": f"2027-03-0{i} 23:59", "timezone": "UTC-12"}
    e.update(over)
    return e


@pytest.fixture
def world(tmp_path):
    """A configuration with one ai-deadlines source ``conf`` and one GOV.UK source, and a SQLite store."""
    (tmp_path / "conf.yml").write_text(ai_deadlines(*[_edition(i) for i in range(1, 5)]))
    path = write_config(tmp_path, sources=[
        {"name": "conf", "format": "ai-deadlines", "location": "conf.yml", "freshness": "PT6H"},
        {"name": "uk", "format": "govuk-bank-holidays", "location": "uk.json"},
    ], subscribers=[], subscriptions=[], channels={})
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    cfg, _ = load_config(path)
    return {"path": path, "url": url, "cfg": cfg, "engine": get_engine(url), "dir": tmp_path}


def _ingest(world, name: str, now: datetime):
    src = world["cfg"].source(name)
    fetch_snapshot(world["engine"], src, now)
    return apply_latest_snapshot(world["engine"], src, now)


def _run(world, *args: str):
    result = CliRunner().invoke(main, list(args), env={"DEADLINE_DB_URL": world["url"],
                                                       "DEADLINE_CONFIG": str(world["path"])})
    assert "Traceback" not in result.output
    return result


def test_rules_diff_defaults_to_last_two_applied_snapshots(world):
    _ingest(world, "conf", T0)
    revised = [_edition(1, deadline="2027-03-08 23:59"), _edition(2, title="C2 renamed"),
               _edition(3, timezone="AoE"), _edition(5)]  # c427 gone, c527 new
    (world["dir"] / "conf.yml").write_text(ai_deadlines(*revised))
    _ingest(world, "conf", T0 + timedelta(hours=1))
    text = _run(world, "rules", "diff", "conf")
    assert text.exit_code == 0, text.output
    assert "added 1, moved 1, withdrawn 1, reworded 2, unchanged 0" in text.output
    assert "moved      c127/submission/deadline  2027-03-02T11:59:00Z -> 2027-03-09T11:59:00Z" in text.output
    assert "withdrawn  c427/submission/deadline" in text.output and "added      c527/submission/deadline" in text.output
    assert "tz: 'UTC-12' -> 'AoE'" in text.output

    out = _run(world, "rules", "diff", "conf", "--json")
    data = json.loads(out.output)
    assert [(m["rule_id"], m["old_instant"], m["new_instant"]) for m in data["moved"]] == [
        ("c127/submission/deadline", "2027-03-02T11:59:00Z", "2027-03-09T11:59:00Z")]
    assert {r["rule_id"] for r in data["reworded"]} == {"c227/submission/deadline", "c327/submission/deadline"}
    assert (data["from"], data["to"]) == (1, 2)

    explicit = json.loads(_run(world, "rules", "diff", "conf", "--from", "2", "--to", "1", "--json").output)
    assert [m["rule_id"] for m in explicit["added"]] == ["c427/submission/deadline"]


def test_rules_diff_govuk_revisions_report_exactly_the_early_may_move(world, shared_dir):
    folder = shared_dir / "data" / "govuk-bank-holidays" / "revisions"
    for n, name in enumerate(["bank-holidays.e57b5ce.2018-12-06.json", "bank-holidays.85e1167.2019-06-10.json"]):
        (world["dir"] / "uk.json").write_bytes((folder / name).read_bytes())
        assert _ingest(world, "uk", T0 + timedelta(days=n)).status == "applied"
    data = json.loads(_run(world, "rules", "diff", "uk", "--json").output)
    assert not data["added"] and not data["withdrawn"] and not data["reworded"]
    assert [(m["rule_id"], m["old_when"], m["new_when"]) for m in data["moved"]] == [
        ("england-and-wales/2020/early_may", "2020-05-04 (floating)", "2020-05-08 (floating)"),
        ("northern-ireland/2020/early_may", "2020-05-04 (floating)", "2020-05-08 (floating)"),
    ]
    assert data["unchanged"] == 244


def test_rules_diff_says_a_cancelled_event_is_cancelled_not_skipped(tmp_path):
    """The STATUS:CANCELLED event's note counted as "1 record(s) of the 'to' snapshot were skipped
    while parsing": a skipped record is a fault of the feed held in force, a cancellation the
    publisher's intent, withdrawn. Said as cancelled, and counted apart in --json."""
    events = [dict(uid=f"e{i}@test", tzid="Europe/Berlin", dtstart=f"2027060{i}T120000", summary=f"E{i}")
              for i in range(1, 5)]  # one withdrawn of four: under the quarantine's share
    (tmp_path / "cal.ics").write_text(ics(*events))
    path = write_config(tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics"}],
                        subscribers=[], subscriptions=[], channels={})
    world = {"path": path, "url": f"sqlite:///{tmp_path / 'store.sqlite3'}", "cfg": load_config(path)[0]}
    world["engine"] = get_engine(world["url"])
    _ingest(world, "cal", T0)
    (tmp_path / "cal.ics").write_text(ics({**events[0], "status": "CANCELLED"}, *events[1:]))
    assert _ingest(world, "cal", T0 + timedelta(hours=1)).status == "applied"
    text = _run(world, "rules", "diff", "cal")
    assert text.exit_code == 0, text.output
    assert "withdrawn  e1@test" in text.output and "skipped" not in text.output, text.output
    assert ("note: 1 record(s) of the 'to' snapshot were cancelled or completed by their publisher "
            "(STATUS:CANCELLED, a completed to-do): not in force, their reminders withdrawn") in text.output
    data = json.loads(_run(world, "rules", "diff", "cal", "--json").stdout)
    assert (data["skipped_records"], data["closed_records"]) == ({"from": 0, "to": 0}, {"from": 0, "to": 1})


def test_rules_diff_bad_input_exits_2(world):
    _ingest(world, "conf", T0)
    unknown = _run(world, "rules", "diff", "nope")
    assert unknown.exit_code == 2 and "unknown source 'nope'; sources in the store: conf" in unknown.output
    half = _run(world, "rules", "diff", "conf", "--from", "1")
    assert half.exit_code == 2 and "give both --from and --to" in half.output
    missing = _run(world, "rules", "diff", "conf", "--from", "1", "--to", "99")
    assert missing.exit_code == 2 and "snapshot 99 does not exist" in missing.output


@pytest.mark.parametrize("args", [("rules", "diff", "conf"), ("snapshots", "list", "conf")])
def test_read_only_commands_on_a_missing_store_create_nothing(tmp_path, args):
    """``rules diff`` and ``snapshots list`` only read: pointed at a folder with no store (a mistyped
    DEADLINE_HOME), they created and migrated an empty store there, then said the source was unknown.
    Now they exit 2 naming the store and how to create it, and leave nothing behind."""
    home = tmp_path / "typo"
    home.mkdir()
    result = CliRunner().invoke(main, list(args), env={"DEADLINE_HOME": str(home), "DEADLINE_DB_URL": None,
                                                      "DEADLINE_CONFIG": None})
    assert result.exit_code == 2, result.output
    assert "has no schema yet" in result.output, result.output
    assert list(home.iterdir()) == []


def test_source_accept_applies_a_quarantined_snapshot(world):
    _ingest(world, "conf", T0)
    (world["dir"] / "conf.yml").write_text(ai_deadlines(_edition(1)))
    out = _ingest(world, "conf", T0 + timedelta(hours=1))
    assert out.status == "quarantined"

    # Before accepting: rules diff shows what the quarantined snapshot would change (it said "only one
    # applied snapshot (1); every rule shows as added").
    preview = _run(world, "rules", "diff", "conf")
    assert preview.exit_code == 0, preview.output
    assert (f"source conf: snapshot 1 (in force) -> {out.snapshot_id} (quarantined, not applied; "
            f"'deadline-pipeline source accept {out.snapshot_id}' applies it)") in preview.output
    assert "withdrawn 3" in preview.output and "only one applied snapshot" not in preview.output
    data = json.loads(_run(world, "rules", "diff", "conf", "--json").output)
    assert (data["from"], data["to"], data["to_quarantined"]) == (1, out.snapshot_id, True)
    assert len(data["withdrawn"]) == 3

    not_q = _run(world, "source", "accept", "1")
    assert not_q.exit_code == 2 and "is not quarantined (status parsed)" in not_q.output
    assert _run(world, "source", "accept", "42").exit_code == 2

    accepted = _run(world, "source", "accept", str(out.snapshot_id), "--as-of", "2027-01-10T03:00:00Z")
    assert accepted.exit_code == 0, accepted.output
    assert f"accepted snapshot {out.snapshot_id} of source 'conf': 1 rule(s); added 0, changed 0, withdrawn 3" \
        in accepted.output
    assert "quarantine overridden: would withdraw 3 of 4 active future rules" in accepted.output
    assert re.findall(r"withdrawn\s+(\S+)", accepted.output.split("quarantine overridden")[1]) == [
        "c227/submission/deadline", "c327/submission/deadline", "c427/submission/deadline"]
    listing = _run(world, "snapshots", "list", "conf")
    assert "status fresh" in listing.output and f"current snapshot {out.snapshot_id}" in listing.output
    again = _run(world, "source", "accept", str(out.snapshot_id))
    assert again.exit_code == 2 and "not quarantined" in again.output


def test_source_accept_refuses_to_roll_back(world):
    _ingest(world, "conf", T0)
    (world["dir"] / "conf.yml").write_text(ai_deadlines(_edition(1)))
    quarantined = _ingest(world, "conf", T0 + timedelta(hours=1)).snapshot_id
    (world["dir"] / "conf.yml").write_text(ai_deadlines(*[_edition(i) for i in range(1, 6)]))
    assert _ingest(world, "conf", T0 + timedelta(hours=2)).status == "applied"
    refused = _run(world, "source", "accept", str(quarantined))
    assert refused.exit_code == 2 and "no longer the latest" in refused.output


def test_snapshots_prune_dry_run_then_prune(world):
    _ingest(world, "conf", T0)  # 1: referenced by versions
    (world["dir"] / "conf.yml").write_text("<html><body>down</body></html>")
    _ingest(world, "conf", T0 + timedelta(days=1))  # 2: failed, prunable
    (world["dir"] / "conf.yml").write_text(ai_deadlines(*[_edition(i) for i in range(4, 0, -1)]))
    _ingest(world, "conf", T0 + timedelta(days=2))  # 3: current and latest
    dry = _run(world, "snapshots", "prune", "--keep-days", "7", "--dry-run", "--as-of", "2027-02-01T00:00:00Z")
    assert dry.exit_code == 0 and "would prune snapshot 2 of source conf" in dry.output
    assert "would prune 1 snapshot(s)" in dry.output
    real = _run(world, "snapshots", "prune", "--keep-days", "7", "--as-of", "2027-02-01T00:00:00Z")
    assert "pruned snapshot 2 of source conf" in real.output and "pruned 1 snapshot(s)" in real.output
    assert "pruned 0 snapshot(s)" in _run(world, "snapshots", "prune", "--keep-days", "7",
                                          "--as-of", "2027-02-01T00:00:00Z").output
    assert _run(world, "snapshots", "prune", "--keep-days", "-1").exit_code == 2


def test_validate_is_strict(world, tmp_path):
    good = tmp_path / "good.yml"
    good.write_text(ai_deadlines(_edition(1)))
    ok = _run(world, "validate", "--format", "ai-deadlines", str(good))
    assert ok.exit_code == 0 and "OK, 1 rule(s)" in ok.output

    lenient = tmp_path / "some-bad.yml"
    lenient.write_text(ai_deadlines(_edition(1), _edition(2, deadline="TBA"), _edition(3, timezone="Mars/Olympus")))
    bad = _run(world, "validate", "--format", "ai-deadlines", str(lenient))
    assert bad.exit_code == 1
    assert "entry 2 (id=c227, line 6) deadline: date 'TBA' is not" in bad.output
    assert "entry 3 (id=c327, line 11) deadline: unknown time zone 'Mars/Olympus'" in bad.output
    assert "INVALID: 2 problem(s), 1 rule(s) readable" in bad.output

    # A file without rules: said as the reason (it read "INVALID: 0 problem(s), 0 rule(s) readable").
    empty = tmp_path / "empty.ics"
    empty.write_text("BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//t//t//EN\r\nEND:VCALENDAR\r\n")
    none = _run(world, "validate", "--format", "ics", str(empty))
    assert none.exit_code == 1, none.output
    assert none.output.strip().splitlines() == [f"{empty}: INVALID: no rules found (no VEVENT, VTODO, entry or row "
                                                "with a due date)"]

    broken = tmp_path / "broken.yml"
    broken.write_text("- id: x\n  deadline: [unclosed\n")
    unusable = _run(world, "validate", "--format", "ai-deadlines", str(broken))
    assert unusable.exit_code == 1 and re.search(r"line \d+, column \d+: invalid YAML", unusable.output)

    assert _run(world, "validate", "--format", "ics", str(tmp_path / "missing.ics")).exit_code == 2
    assert _run(world, "validate", "--format", "nope", str(good)).exit_code == 2


def test_source_checks_in_dagster(world):
    _ingest(world, "conf", T0)
    (world["dir"] / "conf.yml").write_text(ai_deadlines(_edition(1)))
    quarantined = _ingest(world, "conf", T0 + timedelta(hours=1)).snapshot_id
    cfg = world["cfg"]
    checks = SOURCE_CHECKS_FACTORY(cfg)
    assert len(checks) == 3 * len(cfg.sources)
    defs = dg.Definitions(
        assets=build_assets(cfg), asset_checks=checks,
        jobs=[dg.define_asset_job("checks", selection=dg.AssetSelection.all_asset_checks())],
        resources={"store": StoreResource(db_url=world["url"]),
                   "settings": SettingsResource(config_path=str(world["path"])),
                   "clock": ClockResource(as_of="2027-01-10T12:00:00Z")},
    )
    result = defs.resolve_job_def("checks").execute_in_process(instance=dg.DagsterInstance.ephemeral())
    evals = {(e.asset_key.to_user_string(), e.check_name): e for e in result.get_asset_check_evaluations()}
    assert {k: e.passed for k, e in evals.items()} == {
        ("snapshot/conf", "source_fresh"): False,  # last fresh 12 h ago, window 6 h
        ("snapshot/conf", "source_not_quarantined"): False,
        ("snapshot/uk", "source_fresh"): False,  # never ingested
        ("snapshot/uk", "source_not_quarantined"): True,
        ("snapshot/conf", "rules_complete"): True,
        ("snapshot/uk", "rules_complete"): True,
    }
    assert all(e.severity == dg.AssetCheckSeverity.ERROR for e in evals.values())
    q = evals[("snapshot/conf", "source_not_quarantined")]
    assert q.metadata["quarantined_snapshot_id"].value == quarantined
    assert f"snapshot {quarantined} is quarantined" in q.description
    fresh = evals[("snapshot/conf", "source_fresh")].metadata
    assert fresh["last_fresh_at"].value == T0.isoformat() and fresh["window"].value == "6:00:00"


def test_a_record_that_stops_parsing_is_unparsed_not_withdrawn_until_accepted(world):
    from deadline_pipeline.watch.sources import rules_complete

    _ingest(world, "conf", T0)
    broken = [_edition(1, timezone="Russia/Moscow"), *[_edition(i) for i in range(2, 5)]]
    (world["dir"] / "conf.yml").write_text(ai_deadlines(*broken))
    out = _ingest(world, "conf", T0 + timedelta(hours=1))
    assert (out.status, out.withdrawn, out.held) == ("applied", 0, ["c127/submission/deadline"])
    text = _run(world, "rules", "diff", "conf")
    assert "withdrawn 0" in text.output and "unparsed 1 (kept in force)" in text.output, text.output
    assert "unparsed   c127/submission/deadline" in text.output
    assert not rules_complete(world["engine"], "conf").passed
    accepted = _run(world, "source", "accept", str(out.snapshot_id), "--as-of", "2027-01-10T02:00:00Z")
    assert accepted.exit_code == 0, accepted.output
    assert "withdrawn 1" in accepted.output
    assert rules_complete(world["engine"], "conf").passed
    # Accepted once: a second accept of the same snapshot is refused as bad input.
    assert _run(world, "source", "accept", str(out.snapshot_id)).exit_code == 2


def test_an_entry_whose_id_cannot_be_read_holds_every_missing_rule(world):
    _ingest(world, "conf", T0)
    no_id = {k: v for k, v in _edition(1).items() if k != "id"}
    (world["dir"] / "conf.yml").write_text(ai_deadlines(no_id, *[_edition(i) for i in range(2, 5)]))
    out = _ingest(world, "conf", T0 + timedelta(hours=1))
    assert (out.withdrawn, out.held, out.skipped) == (0, ["c127/submission/deadline"], 1)
