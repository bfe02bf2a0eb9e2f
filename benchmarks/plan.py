"""Planning at scale on PostgreSQL: first plan, no-op re-plan, a 5% revision, peak memory, and the
``COPY`` floor of the same rows in the same run.

Shape: N subscribers × 10 monthly recurring rules × 12 monthly periods × 2 offsets × 2 channels
(N = 2,000 → 240,000 obligations, 960,000 alerts).
The 5% revision adds an EXDATE list that drops 6 of the 12 dates of one rule (5% of obligations).

    python benchmarks/plan.py [--quick] [--n 2000] [--rounds 3] [--skip-revision] [--pg URL]

Each round plans a fresh database from scratch (first plan), re-plans it unchanged (no-op), applies
the 5% revision, and COPYs the same number of alert rows into a table with the alerts' indexes (the
floor): four contenders interleaved per round (``benchmarks/rounds.py``), each reported as the
median and min-max of alerts/s. Goals as same-run ratios of time: first plan <= 2.5x the COPY floor,
no-op re-plan <= 1.0x; peak RSS < 1 GiB. A summary line, then one line of JSON.
``--quick`` runs N = 200 (96,000 alerts; under a minute), the same shape.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rounds import MIN_ROUNDS, goal_line, json_line, ratio, run_rounds, table  # noqa: E402

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
    """Seconds to COPY ``rows`` alert-shaped rows into an empty table with the alerts table's indexes.

    The rows are generated into a temporary file first (untimed) and streamed from it in 1 MiB blocks
    (timed), so the floor's own memory stays flat at any size (9.6M rows are about 2 GB of text)."""
    import psycopg

    cols = ("id, obligation_id, offset_seconds, channel, kind, dedup_key, send_at, status, status_reason, "
            "attempts, next_attempt_at, lease_owner, lease_expires_at, provider_message_id, last_error, "
            "delivered_at, created_at, updated_at, revision, previous_due_at")
    t = "2027-01-10 12:00:00+00"
    with tempfile.TemporaryFile("w+b") as data, \
            psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        buf = io.StringIO()
        for i in range(rows):
            buf.write(f"{i + 1}\t{i // 4 + 1}\t{-86400 * (1 + i % 2)}\tch{(i // 2) % 2}\treminder\t{uuid.uuid4().hex}"
                      f"{uuid.uuid4().hex}\t{t}\tpending\t\\N\t0\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t{t}\t{t}\t0\t\\N\n")
            if i % 50_000 == 49_999:
                data.write(buf.getvalue().encode())
                buf = io.StringIO()
        data.write(buf.getvalue().encode())
        data.flush()
        conn.execute("CREATE TABLE copy_floor (LIKE alerts INCLUDING DEFAULTS INCLUDING INDEXES)")
        data.seek(0)
        start = time.perf_counter()
        with conn.cursor() as cur, cur.copy(f"COPY copy_floor ({cols}) FROM STDIN") as cp:
            while block := data.read(1 << 20):
                cp.write(block)
        conn.commit()
        took = time.perf_counter() - start
        conn.execute("DROP TABLE copy_floor")
        conn.commit()
    return took


class Store:
    """One throwaway database per round, planned from scratch: the state the contenders share."""

    def __init__(self, admin_url: str, n: int) -> None:
        self.admin_url, self.n = admin_url, n
        self.admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        self.name: str | None = None
        self.tmp = tempfile.TemporaryDirectory()
        self.folder = Path(self.tmp.name)
        self.cfg = config(self.folder, n)
        self.alerts = 0
        self.rows = 0
        self.extra: dict = {}

    def fresh(self) -> None:
        """Drop the previous round's database, create an empty one and ingest the calendar."""
        self.drop()
        self.name = f"dp_bench_{uuid.uuid4().hex[:10]}"
        with self.admin.connect() as c:
            c.exec_driver_sql(f'CREATE DATABASE "{self.name}"')
        self.url = make_url(self.admin_url).set(database=self.name).render_as_string(hide_password=False)
        self.engine = make_engine(self.url)
        upgrade(self.engine)
        (self.folder / "bench.ics").write_text(calendar(), newline="")
        self.ingest()

    def ingest(self) -> None:
        src = self.cfg.sources[0]
        fetch_snapshot(self.engine, src, NOW)
        apply_latest_snapshot(self.engine, src, NOW)

    def drop(self) -> None:
        if self.name is None:
            return
        self.engine.dispose()
        with self.admin.connect() as c:
            c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        self.name = None

    # Contenders: each returns alerts per second (the first plan's alert count over its seconds).

    def first_plan(self) -> float:
        self.fresh()
        t0 = time.perf_counter()
        first = plan_all(self.engine, self.cfg, NOW)
        took = time.perf_counter() - t0
        self.alerts, self.rows = first.alerts_planned, first.alerts_planned + first.obligations_planned
        self.extra["obligations"] = first.obligations_planned
        self.extra.setdefault("rows_per_s", []).append(self.rows / took)
        return self.alerts / took

    def noop_replan(self) -> float:
        t0 = time.perf_counter()
        noop = plan_all(self.engine, self.cfg, NOW)
        took = time.perf_counter() - t0
        if noop.alerts_written or noop.obligations_inserted:
            raise AssertionError(f"the re-plan of an unchanged store wrote: {noop}")
        return self.alerts / took

    def revision(self) -> float:
        """A 5% revision: an EXDATE list drops 6 of the 12 dates of one rule."""
        months = [f"2027{m:02d}10T120000" for m in range(7, 13)]
        (self.folder / "bench.ics").write_text(calendar(months), newline="")
        self.ingest()
        t0 = time.perf_counter()
        rev = plan_all(self.engine, self.cfg, NOW)
        took = time.perf_counter() - t0
        self.extra["rev_withdrawn"], self.extra["rev_cancelled"] = rev.obligations_withdrawn, rev.alerts_cancelled
        return self.alerts / took

    def copy_floor(self) -> float:
        return self.alerts / copy_floor(self.url, self.alerts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N = 200 (96,000 alerts), under a minute; same shape")
    ap.add_argument("--n", type=int, default=2000, help="subscribers (default 2,000 = 960,000 alerts)")
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS, help=f"rounds (at least {MIN_ROUNDS})")
    ap.add_argument("--skip-revision", action="store_true",
                    help="leave out the 5%% revision (for the 10x linearity run, whose rounds take 25 minutes)")
    ap.add_argument("--pg", default=os.environ.get("DEADLINE_TEST_PG_URL",
                                                  "postgresql://postgres@127.0.0.1:5432/postgres"))
    args = ap.parse_args(argv)
    n = 200 if args.quick else args.n
    store = Store(normalise_url(args.pg), n)
    try:
        contenders = {"first_plan": store.first_plan, "noop_replan": store.noop_replan,
                      "revision_5pct": store.revision, "copy_floor": store.copy_floor}
        if args.skip_revision:
            del contenders["revision_5pct"]
        figs = run_rounds(contenders, rounds=args.rounds)
    finally:
        store.drop()
        store.admin.dispose()
        store.tmp.cleanup()
    rss = peak_rss_mib()
    print(f"\nN = {n:,} subscribers: {store.extra.get('obligations', 0):,} obligations, {store.alerts:,} alerts; "
          f"{args.rounds} rounds, interleaved; figures in alerts/s (the first plan's alert count / seconds)")
    print(table(figs, labels={"first_plan": "first plan (empty store)", "noop_replan": "no-op re-plan",
                              "revision_5pct": "5% revision (EXDATEs on one rule)",
                              "copy_floor": "COPY floor (same rows, alerts' indexes)"}))
    # Goals in time: plan seconds / COPY seconds = COPY rate / plan rate.
    first_x = ratio(figs, "copy_floor", "first_plan")
    noop_x = ratio(figs, "copy_floor", "noop_replan")
    print(goal_line("first plan / COPY floor (time)", first_x, "<=", 2.5))
    print(goal_line("no-op re-plan / COPY floor (time)", noop_x, "<=", 1.0))
    revision = ("" if args.skip_revision else f"; 5% revision withdrew {store.extra.get('rev_withdrawn')} obligations "
                f"and cancelled {store.extra.get('rev_cancelled')} alerts")
    print(f"peak RSS {rss:,.0f} MiB (goal < 1024 MiB): {'met' if rss < 1024 else 'NOT met'}{revision}")
    print(f"SUMMARY N={n}: {store.alerts:,} alerts, first plan {figs['first_plan'].median:,.0f} alerts/s = "
          f"{first_x:.2f}x the COPY floor's time, no-op re-plan {noop_x:.2f}x, peak RSS {rss:,.0f} MiB")
    print(json_line(figs, extra={"first_plan_vs_copy_x": round(first_x, 3), "noop_vs_copy_x": round(noop_x, 3),
                                 "peak_rss_mib": round(rss), "alerts": store.alerts, "rounds": args.rounds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
