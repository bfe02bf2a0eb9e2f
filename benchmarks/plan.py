"""Planning at scale on PostgreSQL: first plan, no-op re-plan, a revision of one rule re-planned in
full and scoped to the changed rule, peak memory, and the ``COPY`` floor of the same rows in the
same run.

Shape: N subscribers × R monthly recurring rules × 12 monthly periods × 2 offsets × 2 channels
(N = 2,000, R = 10 → 240,000 obligations, 960,000 alerts; N = 200, R = 100 is the same size).
A revision moves every occurrence of one rule to a new time of day (1/R of the obligations move:
their open reminders are superseded and new ones planned).

    python benchmarks/plan.py [--quick] [--n 2000] [--rules 10] [--rounds 3] [--skip-revision] [--pg URL]

Each round plans a fresh database from scratch (first plan), re-plans it unchanged (no-op), applies
one revision and re-plans every rule (full), applies another and re-plans only the rules the new
rule versions changed (scoped, as the ``replan_on_revision`` sensor's runs do), and COPYs the same
number of alert rows into a table with the alerts' indexes (the floor): contenders interleaved per
round (``benchmarks/rounds.py``), each reported as the median and min-max of alerts/s (the first
plan's alert count over the seconds taken). Goals as same-run ratios of time: first plan <= 2.5x
the COPY floor, no-op re-plan <= 1.0x; a scoped re-plan of 1% of the rules (``--rules 100``)
<= 5% of the full re-plan's; peak RSS < 512 MiB, the same within 20% at every N (the plan is
written in chunks: memory follows the chunk, not the plan). A summary line, then one line of JSON.
``--quick`` runs N = 200 (96,000 alerts; under a minute), the same shape.
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import statistics
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
from deadline_pipeline.plan.service import changed_rules, max_version_id, plan_all  # noqa: E402
from deadline_pipeline.store.db import make_engine, normalise_url, upgrade  # noqa: E402

NOW = datetime(2026, 12, 20, tzinfo=UTC)


def calendar(rules: int, rule0_hour: int = 12) -> str:
    """``rules`` monthly rules of 12 occurrences each, on days 1-28 of the month at 12:00 Berlin time;
    the first rule at ``rule0_hour`` (a revision moves it)."""
    lines = ["BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//deadline-pipeline benchmark//EN"]
    for i in range(rules):
        hour = rule0_hour if i == 0 else 12
        lines += ["BEGIN:VEVENT", f"UID:rule-{i}@bench", "DTSTAMP:20260101T000000Z",
                  f"DTSTART;TZID=Europe/Berlin:202701{i % 28 + 1:02d}T{hour:02d}{i // 28:02d}00",
                  f"SUMMARY:Monthly filing {i}", "RRULE:FREQ=MONTHLY;COUNT=12", "END:VEVENT"]
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
    """The process's peak RSS since it started, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (``VmHWM``) to the current RSS (Linux >= 4.0: ``5`` written to
    ``/proc/self/clear_refs``), so the next :func:`hwm_mib` is one contender's own peak, not one left by
    an earlier contender or by the benchmark's set-up. False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def status_mib(field: str) -> float:
    """A memory field of ``/proc/self/status`` (``VmHWM``: peak RSS since the last
    :func:`reset_peak_rss`; ``VmRSS``: RSS now), MiB; nan where there is no ``/proc``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def with_peak_rss(name: str, fn, peaks: dict[str, list[tuple[float, float]]]):
    """``fn`` wrapped so each call records ``(RSS before, own peak RSS)`` (MiB) in ``peaks[name]``."""
    def run() -> float:
        before = status_mib("VmRSS")
        reset_peak_rss()
        try:
            return fn()
        finally:
            peaks.setdefault(name, []).append((before, status_mib("VmHWM")))
    return run


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
            # Small writes: a 50,000-row buffer (and its encoded copy) left the process 20 MiB larger
            # for the next contender, whose own peak RSS then read as the copy floor's.
            if i % 2_000 == 1_999:
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

    def __init__(self, admin_url: str, n: int, rules: int) -> None:
        self.admin_url, self.n, self.rules = admin_url, n, rules
        self.revisions = 0
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
        (self.folder / "bench.ics").write_text(calendar(self.rules), newline="")
        self.revisions = 0
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

    def revise(self):
        """Ingest a revision that moves every occurrence of the first rule by one more hour; returns
        the :class:`RuleScope` of the rule versions it stored."""
        self.revisions += 1
        since = max_version_id(self.engine)
        (self.folder / "bench.ics").write_text(calendar(self.rules, 12 + self.revisions), newline="")
        self.ingest()
        return changed_rules(self.engine, since, max_version_id(self.engine))

    def _revision(self, name: str, scoped: bool) -> float:
        scope = self.revise()
        t0 = time.perf_counter()
        rev = plan_all(self.engine, self.cfg, NOW, scope=scope if scoped else None)
        took = time.perf_counter() - t0
        moved = self.n * 12  # the first rule's 12 occurrences, for every subscriber
        if rev.obligations_moved != moved or rev.obligations_inserted or rev.obligations_withdrawn:
            raise AssertionError(f"{name}: expected {moved} obligations moved and nothing else, got {rev}")
        self.extra.setdefault(f"{name}_s", []).append(took)
        return self.alerts / took

    def revision_full(self) -> float:
        """A revision of one rule, every rule re-planned."""
        return self._revision("revision_full", scoped=False)

    def revision_scoped(self) -> float:
        """A revision of one rule, only the changed rule re-planned."""
        return self._revision("revision_scoped", scoped=True)

    def copy_floor(self) -> float:
        return self.alerts / copy_floor(self.url, self.alerts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N = 200 (96,000 alerts), under a minute; same shape")
    ap.add_argument("--n", type=int, default=2000, help="subscribers (default 2,000 = 960,000 alerts)")
    ap.add_argument("--rules", type=int, default=10,
                    help="monthly rules (default 10; 100 with --n 200 is the 1%% revision at 960,000 alerts)")
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS, help=f"rounds (at least {MIN_ROUNDS})")
    ap.add_argument("--skip-revision", action="store_true",
                    help="leave out the revisions (for the 10x linearity run, whose rounds take 25 minutes)")
    ap.add_argument("--pg", default=os.environ.get("DEADLINE_TEST_PG_URL",
                                                  "postgresql://postgres@127.0.0.1:5432/postgres"))
    args = ap.parse_args(argv)
    n = 200 if args.quick else args.n
    store = Store(normalise_url(args.pg), n, args.rules)
    try:
        contenders = {"first_plan": store.first_plan, "noop_replan": store.noop_replan,
                      "revision_full": store.revision_full, "revision_scoped": store.revision_scoped,
                      "copy_floor": store.copy_floor}
        if args.skip_revision:
            del contenders["revision_full"], contenders["revision_scoped"]
        peaks: dict[str, list[tuple[float, float]]] = {}
        set_up_peak = peak_rss_mib()  # before the first reset: reset_peak_rss lowers ru_maxrss too
        figs = run_rounds({name: with_peak_rss(name, fn, peaks) for name, fn in contenders.items()},
                          rounds=args.rounds)
    finally:
        store.drop()
        store.admin.dispose()
        store.tmp.cleanup()
    peak_of = {name: max(hwm for _, hwm in v) for name, v in peaks.items()}
    rss = max([set_up_peak, status_mib("VmHWM"), *peak_of.values()])
    rows_per_s = statistics.median(store.extra.get("rows_per_s") or [float("nan")])
    print(f"\nN = {n:,} subscribers, R = {args.rules} rules: {store.extra.get('obligations', 0):,} obligations, "
          f"{store.alerts:,} alerts; {args.rounds} rounds, interleaved; figures in alerts/s (the first plan's "
          "alert count / seconds)")
    share = f"1 rule in {args.rules}"
    print(table(figs, labels={"first_plan": "first plan (empty store)", "noop_replan": "no-op re-plan",
                              "revision_full": f"revision of {share}, every rule re-planned",
                              "revision_scoped": f"revision of {share}, scoped to the changed rule",
                              "copy_floor": "COPY floor (same rows, alerts' indexes)"}))
    # Goals in time: plan seconds / COPY seconds = COPY rate / plan rate.
    first_x = ratio(figs, "copy_floor", "first_plan")
    noop_x = ratio(figs, "copy_floor", "noop_replan")
    print(goal_line("first plan / COPY floor (time)", first_x, "<=", 2.5))
    print(goal_line("no-op re-plan / COPY floor (time)", noop_x, "<=", 1.0))
    scoped_x = float("nan")
    if not args.skip_revision:
        scoped_x = ratio(figs, "revision_full", "revision_scoped")
        line = goal_line(f"scoped / full re-plan of {share} (time)", scoped_x, "<=", 0.05)
        print(line if args.rules >= 100 else f"{line} (the goal is for 1% of the rules: --rules 100)")
    # The goal is the planning runs' memory: each contender's own peak (the COPY floor's generator
    # and the set-up are not planning), and the process's peak beside it for comparison.
    print("peak RSS per contender, MiB (max over rounds; in brackets the RSS it started from, min-max): "
          + ", ".join(f"{name} {peak_of[name]:,.0f} ({min(b for b, _ in v):,.0f}-{max(b for b, _ in v):,.0f})"
                      for name, v in peaks.items()))
    plan_rss = max((p for name, p in peak_of.items() if name != "copy_floor"), default=float("nan"))
    print(f"planning peak RSS {plan_rss:,.0f} MiB, process peak {rss:,.0f} MiB (goal < 512 MiB, within 20% at "
          f"every N): {'met' if plan_rss < 512 else 'NOT met'}; "
          f"first plan {rows_per_s:,.0f} rows/s (obligations + alerts; median)")
    scoped = "" if args.skip_revision else f", scoped re-plan {scoped_x:.3f}x the full one"
    print(f"SUMMARY N={n} R={args.rules}: {store.alerts:,} alerts, "
          f"first plan {figs['first_plan'].median:,.0f} alerts/s "
          f"= {first_x:.2f}x the COPY floor's time, no-op re-plan {noop_x:.2f}x{scoped}, {rows_per_s:,.0f} rows/s, "
          f"planning peak RSS {plan_rss:,.0f} MiB")
    print(json_line(figs, extra={"first_plan_vs_copy_x": round(first_x, 3), "noop_vs_copy_x": round(noop_x, 3),
                                 "scoped_vs_full_x": round(scoped_x, 4), "rows_per_s": round(rows_per_s),
                                 "peak_rss_mib": round(rss),
                                 "planning_peak_rss_mib": round(plan_rss),
                                 "peak_rss_mib_by_contender": {k: round(v) for k, v in peak_of.items()},
                                 "alerts": store.alerts, "rules": args.rules,
                                 "rounds": args.rounds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
