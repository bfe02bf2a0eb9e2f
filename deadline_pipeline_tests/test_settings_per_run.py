"""The configuration file is read and validated once per run, not once per asset, check or call.

Real ``execute_in_process`` runs of the pipeline's own jobs; an audit hook counts every ``open`` for
reading of the configuration file while a run executes (reads by any means: ``load_config``, a copy of it, or a
stray ``open``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import dagster as dg
import pytest

from deadline_pipeline.orchestration.build import CHECKS_JOB, INGEST_JOB, build_definitions
from deadline_pipeline.orchestration.planning import PLAN_JOB, horizon_range, range_tags
from deadline_pipeline.orchestration.resources import SettingsResource, parse_instant
from deadline_pipeline_tests.factories import ics, write_config

AS_OF = "2027-01-10T00:00:00Z"

# Audit hooks cannot be removed: one hook for the session, counting only while a test arms it.
_watched: dict[str, list] = {}


def _hook(event: str, args: tuple) -> None:
    if event != "open" or not _watched:
        return
    target, mode = args[0], args[1]
    # Reads only: the tests themselves rewrite the file between runs.
    if not isinstance(mode, str) or "r" not in mode or any(c in mode for c in "wax+"):
        return
    if isinstance(target, (str, bytes, os.PathLike)):
        try:
            name = os.path.realpath(os.fsdecode(target))
        except (TypeError, ValueError):
            return
        if name in _watched:
            _watched[name].append(mode)


sys.addaudithook(_hook)


@pytest.fixture
def config_reads():
    """Arm the hook for one path; yields a function that returns (and resets) the reads counted."""
    armed: list[str] = []

    def count(path: Path | None = None) -> int:
        if path is not None:
            key = os.path.realpath(path)
            _watched[key] = []
            armed.append(key)
            return 0
        n = sum(len(_watched[k]) for k in armed)
        for k in armed:
            _watched[k] = []
        return n

    yield count
    for k in armed:
        _watched.pop(k, None)


def _config(tmp_path: Path, horizon_days: int = 400) -> Path:
    (tmp_path / "cal.ics").write_text(
        ics({"uid": "a@test", "tzid": "UTC", "dtstart": "20270315T120000", "summary": "A"},
            {"uid": "b@test", "tzid": "Europe/Berlin", "dtstart": "20270601T090000", "summary": "B"}),
        newline="")
    return write_config(
        tmp_path, sources=[{"name": "cal", "format": "ics", "location": "cal.ics", "tenant": "t"}],
        subscribers=[{"id": "ann", "tenant": "t", "email": "ann@example.org", "timezone": "UTC"}],
        subscriptions=[{"name": "s", "sources": ["cal"], "offsets": ["-P1D"], "channels": ["mail"]}],
        channels={"mail": {"type": "maildir", "path": str(tmp_path / "maildir")}},
        plan={"horizon_days": horizon_days},
    )


def test_each_run_reads_the_configuration_once(tmp_path, config_reads):
    path = _config(tmp_path)
    defs = build_definitions(path, db_url=f"sqlite:///{tmp_path / 'store.sqlite3'}", as_of=AS_OF)
    tags = range_tags(*horizon_range(parse_instant(AS_OF)))
    config_reads(path)
    with dg.instance_for_test() as instance:
        assert defs.resolve_job_def(INGEST_JOB).execute_in_process(instance=instance).success
        assert config_reads() == 1
        # The planning asset used to read it twice (plan_all, then the horizon it covers).
        plan = defs.resolve_job_def(PLAN_JOB).execute_in_process(instance=instance, tags=tags)
        assert plan.success
        assert config_reads() == 1
        # Six checks ask for the settings; one run, one read.
        checks = defs.resolve_job_def(CHECKS_JOB).execute_in_process(instance=instance)
        assert len(checks.get_asset_check_evaluations()) >= 6
        assert config_reads() == 1


def test_a_change_to_the_file_takes_effect_at_the_next_run(tmp_path, config_reads):
    path = _config(tmp_path, horizon_days=400)
    defs = build_definitions(path, db_url=f"sqlite:///{tmp_path / 'store.sqlite3'}", as_of=AS_OF)
    seen: list[int] = []

    @dg.op
    def read_twice(settings: SettingsResource):
        seen.append(settings.load().plan.horizon_days)
        # Changed during the run: this run keeps the configuration it started with.
        _config(tmp_path, horizon_days=200)
        seen.append(settings.load().plan.horizon_days)

    @dg.job
    def probe():
        read_twice()

    config_reads(path)
    resources = {"settings": defs.resources["settings"]}
    assert probe.execute_in_process(resources=resources).success
    assert seen == [400, 400]
    assert config_reads() == 1
    seen.clear()
    assert probe.execute_in_process(resources=resources).success
    assert seen[0] == 200
    assert config_reads() == 1


def test_outside_a_run_every_load_reads_the_file(tmp_path, config_reads):
    path = _config(tmp_path)
    settings = SettingsResource(config_path=str(path))
    config_reads(path)
    assert settings.load().plan.horizon_days == 400
    _config(tmp_path, horizon_days=200)
    assert settings.load().plan.horizon_days == 200
    assert config_reads() >= 2
