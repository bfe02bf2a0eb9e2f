"""Benchmark of the ingest stage: fetch → snapshot → parse → rule versions, cold and unchanged.

Ingests every file of ``../shared/data/ai-deadlines-hf/conferences/`` and every ``.ics`` file of
``../shared/data/icalendar-tests/`` as one source per file into a fresh store (a SQLite file in a
temporary folder; with ``--pg URL`` also a throwaway PostgreSQL database created on that server), then
ingests everything again unchanged. Reports files/s and rules/s of the cold run, the time of the
unchanged re-ingest, and the time of hashing the same bytes alone (the floor an unchanged re-ingest
is compared with). The last line is a one-line summary.

Usage::

    python benchmarks/ingest.py [--quick] [--rounds N] [--pg postgresql://postgres@127.0.0.1/postgres]

``--quick`` runs one round on SQLite (well under a minute). Exit code 2 when the data folder is missing.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DEADLINE_SHARED_DIR", REPO.parent / "shared"))


def _sources(data: Path):
    from deadline_pipeline.config import SourceConfig

    hf = sorted((data / "ai-deadlines-hf" / "conferences").glob("*.yml"))
    ics = sorted((data / "icalendar-tests").rglob("*.ics"))
    srcs = [SourceConfig(name=f"hf-{p.stem}", format="ai-deadlines", location=str(p)) for p in hf]
    srcs += [SourceConfig(name=f"ics-{n}", format="ics", location=str(p)) for n, p in enumerate(ics)]
    return srcs, hf + ics


def _ingest_all(engine, srcs, now) -> tuple[float, int, dict[str, int]]:
    from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot

    statuses: dict[str, int] = {}
    rules = 0
    started = time.perf_counter()
    for s in srcs:
        fetch_snapshot(engine, s, now)
        out = apply_latest_snapshot(engine, s, now)
        statuses[out.status] = statuses.get(out.status, 0) + 1
        if out.status == "applied":
            rules += out.rules
    return time.perf_counter() - started, rules, statuses


def _hash_only(files: list[Path]) -> float:
    started = time.perf_counter()
    for p in files:
        hashlib.sha256(p.read_bytes()).hexdigest()
    return time.perf_counter() - started


def _round(url: str, srcs, files) -> dict:
    from deadline_pipeline.store.db import make_engine, upgrade

    engine = make_engine(url)
    upgrade(engine)
    try:
        now = datetime(2027, 1, 10, tzinfo=UTC)
        cold, rules, statuses = _ingest_all(engine, srcs, now)
        warm, _r, warm_statuses = _ingest_all(engine, srcs, now + timedelta(hours=1))
    finally:
        engine.dispose()
    assert set(warm_statuses) <= {"unchanged", "parse_failed"}, warm_statuses
    return {"cold": cold, "rules": rules, "statuses": statuses, "unchanged": warm, "hash": _hash_only(files)}


def _report(engine_name: str, results: list[dict], files: list[Path]) -> str:
    cold = statistics.median(r["cold"] for r in results)
    warm = statistics.median(r["unchanged"] for r in results)
    hashing = statistics.median(r["hash"] for r in results)
    rules = results[0]["rules"]
    size = sum(p.stat().st_size for p in files)
    print(f"[{engine_name}] {len(files)} files ({size / 1e6:.2f} MB), statuses {results[0]['statuses']}, "
          f"{rules} rules applied; median of {len(results)} round(s)")
    print(f"[{engine_name}]   cold:      {cold:7.2f} s  {len(files) / cold:8.1f} files/s  {rules / cold:9.1f} rules/s")
    print(f"[{engine_name}]   unchanged: {warm:7.2f} s  {len(files) / warm:8.1f} files/s  "
          f"({warm / len(files) * 1000:.2f} ms per source)")
    print(f"[{engine_name}]   hashing the same bytes alone: {hashing * 1000:.1f} ms")
    return (f"{engine_name}: cold {len(files) / cold:.0f} files/s {rules / cold:.0f} rules/s, "
            f"unchanged re-ingest {warm:.2f} s ({warm / len(files) * 1000:.1f} ms/source, hashing alone "
            f"{hashing * 1000:.0f} ms)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round, SQLite only unless --pg is given")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per engine (median reported); default 3")
    parser.add_argument("--pg", help="PostgreSQL server URL; a throwaway database is created and dropped")
    args = parser.parse_args(argv)
    # Parse problems of the hostile ICS corpus are expected; their log lines would drown the figures.
    logging.basicConfig(level=logging.CRITICAL)
    data = SHARED / "data"
    if not data.is_dir():
        print(f"error: data folder {data} is missing (set DEADLINE_SHARED_DIR)", file=sys.stderr)
        return 2
    srcs, files = _sources(data)
    rounds = 1 if args.quick else max(1, args.rounds)
    summaries = []
    with tempfile.TemporaryDirectory() as tmp:
        results = [_round(f"sqlite:///{tmp}/bench{n}.sqlite3", srcs, files) for n in range(rounds)]
        summaries.append(_report("sqlite", results, files))
    if args.pg:
        from sqlalchemy import create_engine
        from sqlalchemy.engine import make_url

        from deadline_pipeline.store.db import normalise_url

        admin = create_engine(normalise_url(args.pg), isolation_level="AUTOCOMMIT")
        results = []
        for _n in range(rounds):
            name = f"dp_bench_{uuid.uuid4().hex[:10]}"
            with admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
            try:
                url = make_url(normalise_url(args.pg)).set(database=name).render_as_string(hide_password=False)
                results.append(_round(url, srcs, files))
            finally:
                with admin.connect() as conn:
                    conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
        summaries.append(_report("postgresql", results, files))
    print("SUMMARY " + " | ".join(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
