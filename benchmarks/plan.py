"""Planning at scale on PostgreSQL: first plan, no-op re-plan, a 5% revision, peak memory, and the
``COPY`` floor of the same rows in the same run.

Shape: N subscribers × 10 monthly recurring rules × 12 monthly periods × 2 offsets × 2 channels
(N = 2,000 → 240,000 obligations, 960,000 alerts), and the same at a tenth of the size.
The 5% revision adds an EXDATE list that drops 6 of the 12 dates of one rule (5% of obligations).

    python benchmarks/plan.py [--quick] [--pg URL]

``--quick`` runs N = 200 and 20 (under a minute). The last line is a one-line summary.
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deadline_pipeline.config import DeadlinesConfig  # noqa: E402
from deadline_pipeline.ingest.service import apply_latest_snapshot, fetch_snapshot  # noqa: E402
from deadline_pipeline.plan.service import plan_all  # noqa: E402
from deadline_pipeline.store.db import make_engine, normalise_url, upgrade  # noqa: E402

NOW = datetime(2026, 12, 20, tzinfo=UTC)
RULES = 10


def calendar(exdates_for_rule0: list[str] | None = None) -> str:
    lines = ["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//deadline-pipeline benchmark//EN"]
    for i in range(RULES):
        lines += ["BEGIN:VEVENT", f"UID:rule-{i}@bench", "DTSTAMP:20260101T000000Z",
                  f"DTSTART;TZID=Europe/Berlin:202701{i + 10:02d}T120000", f"SUMMARY:Monthly filing {i}",
                  "RRULE:FREQ=MONTHLY;COUNT=12"]
        if i == 0 and exdates_for_rule0:
            lines.append("EXDATE;TZID=Europe/Berlin:" + ",".join(exdates_for_rule0))
        lines.append("END:VEVENT")
    lines.append("END:VCALENDAR")
    return "\r\n".join(lines) + "\r\n"


def config(folder: Path, n_subscribers: int) -> DeadlinesConfig:
    zones = ["Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Sydney"]
    return DeadlinesConfig.model_validate({
        "sources": [{"name": "bench", "format": "ics", "location": str(folder / "bench.ics"), "tenant": "t"}],
        "subscribers": [{"id": f"s{i:05d}", "tenant": "t", "email": f"s{i}@example.org",
                         "webhook_url": f"http://127.0.0.1:9/h/{i}", "timezone": zones[i % len(zones)]}
                        for i in range(n_subscribers)],
        "subscriptions": [{"name": "all", "sources": ["bench"], "offsets": ["-P7D", "-P1D"],
                           "channels": ["mail", "hook"]}],
        "channels": {"mail": {"type": "maildir", "path": str(folder / "maildir")},
                     "hook": {"type": "webhook"}},
    })


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def copy_floor(url: str, rows: int) -> float:
    """Seconds to COPY ``rows`` alert-shaped rows into an empty table with the alerts table's indexes."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        conn.execute("CREATE TABLE copy_floor (LIKE alerts INCLUDING DEFAULTS INCLUDING INDEXES)")
        buf = io.StringIO()
        t = "2027-01-10 12:00:00+00"
        for i in range(rows):
            buf.write(f"{i + 1}\t{i // 4 + 1}\t{-86400 * (1 + i % 2)}\tch{(i // 2) % 2}\treminder\t{uuid.uuid4().hex}"
                      f"{uuid.uuid4().hex}\t{t}\tpending\t\\N\t0\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t{t}\t{t}\t0\t\\N\n")
        data = buf.getvalue()
        cols = ("id, obligation_id, offset_seconds, channel, kind, dedup_key, send_at, status, status_reason, "
                "attempts, next_attempt_at, lease_owner, lease_expires_at, provider_message_id, last_error, "
                "delivered_at, created_at, updated_at, revision, previous_due_at")
        start = time.perf_counter()
        with conn.cursor() as cur, cur.copy(f"COPY copy_floor ({cols}) FROM STDIN") as cp:
            cp.write(data)
        conn.commit()
        took = time.perf_counter() - start
        conn.execute("DROP TABLE copy_floor")
        conn.commit()
    return took


def run_size(admin_url: str, n: int) -> dict:
    name = f"dp_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        engine = make_engine(url)
        upgrade(engine)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "bench.ics").write_text(calendar(), newline="")
            cfg = config(folder, n)
            src = cfg.sources[0]
            fetch_snapshot(engine, src, NOW)
            apply_latest_snapshot(engine, src, NOW)

            t0 = time.perf_counter()
            first = plan_all(engine, cfg, NOW)
            t_first = time.perf_counter() - t0
            t0 = time.perf_counter()
            noop = plan_all(engine, cfg, NOW)
            t_noop = time.perf_counter() - t0
            assert noop.alerts_written == 0 and noop.obligations_inserted == 0, noop

            months = [f"2027{m:02d}10T120000" for m in range(7, 13)]
            (folder / "bench.ics").write_text(calendar(months), newline="")
            fetch_snapshot(engine, src, NOW)
            apply_latest_snapshot(engine, src, NOW)
            t0 = time.perf_counter()
            rev = plan_all(engine, cfg, NOW)
            t_rev = time.perf_counter() - t0
        rows = first.obligations_planned + first.alerts_planned
        floor = copy_floor(url, first.alerts_planned)
        engine.dispose()
        return dict(n=n, obligations=first.obligations_planned, alerts=first.alerts_planned, first_s=t_first,
                    rows_per_s=rows / t_first, noop_s=t_noop, rev_s=t_rev, rev_withdrawn=rev.obligations_withdrawn,
                    rev_cancelled=rev.alerts_cancelled, copy_floor_s=floor, ratio=t_first / floor,
                    rss_mib=peak_rss_mib())
    finally:
        with admin.connect() as c:
            c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N = 200 and 20 instead of 2,000 and 200")
    ap.add_argument("--pg", default=os.environ.get("DEADLINE_TEST_PG_URL",
                                                  "postgresql://postgres@127.0.0.1:5432/postgres"))
    args = ap.parse_args()
    admin_url = normalise_url(args.pg)
    sizes = [200, 20] if args.quick else [2000, 200]
    results = []
    for n in sorted(sizes):
        r = run_size(admin_url, n)
        results.append(r)
        print(f"N={r['n']:>5}: {r['obligations']:>7} obligations, {r['alerts']:>7} alerts | first plan "
              f"{r['first_s']:6.1f} s ({r['rows_per_s']:,.0f} rows/s) | no-op re-plan {r['noop_s']:5.1f} s | "
              f"5% revision {r['rev_s']:5.1f} s ({r['rev_withdrawn']} obligations withdrawn, "
              f"{r['rev_cancelled']} alerts cancelled) | COPY floor {r['copy_floor_s']:5.1f} s "
              f"(first plan = {r['ratio']:.2f}x) | peak RSS {r['rss_mib']:.0f} MiB", flush=True)
    big = results[-1]
    print(f"summary: {big['alerts']:,} alerts planned in {big['first_s']:.1f} s ({big['rows_per_s']:,.0f} rows/s), "
          f"no-op {big['noop_s']:.1f} s, 5% revision {big['rev_s']:.1f} s, {big['ratio']:.2f}x COPY floor, "
          f"peak RSS {big['rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
