"""Delivery throughput on PostgreSQL with a webhook receiver on loopback, contenders in rounds.

    python benchmarks/deliver.py [--pg URL] [--n 20000] [--rounds 3] [--quick] [--profile FILE]

``--pg`` defaults to ``$DEADLINE_TEST_PG_URL`` or ``postgresql://postgres@127.0.0.1:5432/postgres``;
every measurement gets a throwaway database, dropped at the end. The receiver is a bare asyncio
HTTP/1.1 server in a separate process (it answers ``200 {}`` and counts requests, and each contender
is checked to have made exactly one request per job), so the client side is what is measured.

Contenders, interleaved in rounds (A, B, C, D, E, A, B, ...; see ``benchmarks/rounds.py``), each on
``n`` jobs per round:

* ``aiohttp_ceiling``: the raw aiohttp client, concurrency 64, no database, on uvloop (the sweep's
  event loop) - the most any aiohttp-based sender can reach on this machine at that minute;
* ``sweep``: :func:`deadline_pipeline.deliver.sweep.sweep` with full bookkeeping: claim -> attempt
  rows committed before the send and lease-checked -> render + sign -> send (aiohttp, 64) -> record;
* ``pgqueuer``: asyncpg driver, one bulk ``enqueue``, drain mode, ``batch_size=32``,
  ``max_concurrent_tasks=64``, the same aiohttp client and receiver, on uvloop as its own runner
  ``pgq run`` does (its documented setup);
* ``procrastinate``: ``run_worker_async(concurrency=64, wait=False)`` after one ``batch_defer_async``;
* ``db_only``: claim 500 with ``FOR UPDATE SKIP LOCKED`` + mark delivered, no send (a floor of the
  database side).

Printed: the Markdown table of medians and min-max per contender, the sweep's lateness
(sent - send_at, whose ``send_at`` is the moment the backlog was seeded), each goal as a ratio of
same-run medians (sweep >= 1.5x pgqueuer, >= 10x Procrastinate, >= 0.75x the aiohttp ceiling), a
one-line summary, and as the very last line one line of JSON with each contender's median rate.
``--quick``: 1,000 jobs per contender and 3 rounds (under a minute), the same shape.
``--profile FILE``: cProfile of the sweep rounds (``python -m pstats FILE``).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvloop  # noqa: E402
from rounds import MIN_ROUNDS, goal_line, json_line, ratio, run_rounds, table  # noqa: E402
from sqlalchemy import create_engine, insert, select, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from deadline_pipeline.config import DeadlinesConfig, WebhookChannel  # noqa: E402
from deadline_pipeline.deliver.sweep import sweep, utcnow  # noqa: E402
from deadline_pipeline.store import delivery as dsql  # noqa: E402
from deadline_pipeline.store.db import make_engine, normalise_url, upgrade  # noqa: E402
from deadline_pipeline.store.schema import alerts, obligations, sources, subscribers  # noqa: E402

CONCURRENCY = 64
BODY = json.dumps({"id": "x" * 64, "kind": "reminder", "title": "A deadline", "due_at": "2027-01-01T00:00:00Z"})


# --------------------------------------------------------------------------- receiver (own process)


def _receiver_main(port_queue, counter) -> None:
    """The webhook receiver every contender sends to: answers each request ``200 {}`` and counts it.

    It shares this machine's two cores with every contender but the ceiling (whose one process leaves
    the other core to the receiver), so it is written to take as little CPU as it can, as a receiver
    elsewhere would take none: an :class:`asyncio.Protocol` on uvloop, counting into a lock-free
    shared integer (this process is its only writer). The asyncio-streams receiver it replaces took
    about 40 us of CPU per request here; this one about 15 us (see benchmarks/README.md).
    """
    import uvloop

    class Receiver(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            self.transport = transport
            self.buf = b""

        def data_received(self, data: bytes) -> None:
            buf = self.buf + data if self.buf else data
            answered = 0
            while True:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    break
                length = 0
                at = buf[:end].lower().find(b"\r\ncontent-length:")
                if at >= 0:
                    stop = buf.find(b"\r\n", at + 2, end + 2)
                    length = int(buf[at + 17:stop])
                if len(buf) < end + 4 + length:
                    break  # the body is still arriving
                buf = buf[end + 4 + length:]
                answered += 1
            self.buf = buf
            if answered:
                counter.value += answered
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
                                     * answered)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Receiver, "127.0.0.1", 0, backlog=1024)
        port_queue.put(server.sockets[0].getsockname()[1])
        async with server:
            await server.serve_forever()

    uvloop.run(main())


# --------------------------------------------------------------------------- databases


@contextmanager
def throwaway_db(admin_url: str, tag: str):
    admin = create_engine(normalise_url(admin_url), isolation_level="AUTOCOMMIT")
    name = f"bench_{tag}_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = make_url(normalise_url(admin_url)).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def seed(engine, n: int, hook: str, send_at: datetime) -> None:
    """``n`` due alerts for one subscriber on one obligation (distinct offsets keep them unique)."""
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE delivery_attempts, alerts, obligations, subscribers, sources RESTART IDENTITY "
                          "CASCADE"))
        src = conn.execute(insert(sources).values(name="bench", tenant="t", format="ics", location="x",
                                                  freshness_seconds=86400)).inserted_primary_key[0]
        sub = conn.execute(insert(subscribers).values(external_id="s", tenant="t", webhook_url=hook,
                                                      timezone="UTC")).inserted_primary_key[0]
        obl = conn.execute(insert(obligations).values(
            obligation_key="k", tenant="t", subscriber_id=sub, source_id=src, rule_id="r", rule_version=1,
            period="p", title="A deadline", due_at=send_at, status="active", planned_at=send_at,
        )).inserted_primary_key[0]
        conn.execute(insert(alerts), [
            {"obligation_id": obl, "offset_seconds": -i, "channel": "hook", "kind": "reminder",
             "dedup_key": uuid.uuid4().hex, "send_at": send_at, "status": "pending", "attempts": 0,
             "created_at": send_at, "updated_at": send_at} for i in range(n)])


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


# --------------------------------------------------------------------------- measurements


async def _aiohttp_posts(url: str, n: int) -> float:
    import aiohttp

    sem = asyncio.Semaphore(CONCURRENCY)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY)) as session:
        async def one():
            async with sem, session.post(url, data=BODY, headers={"Content-Type": "application/json"}) as r:
                await r.read()

        t = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return time.perf_counter() - t


def db_only(url: str, n: int, hook: str) -> float:
    engine = make_engine(url)
    now = datetime.now(UTC)
    seed(engine, n, hook, now)
    t = time.perf_counter()
    done = 0
    while True:
        with engine.begin() as conn:
            ids = dsql.claim_batch(conn, owner="bench#1#db", now=now, lease_seconds=300, limit=500)
            if not ids:
                break
            conn.execute(text("UPDATE alerts SET status = 'delivered', delivered_at = :now, lease_owner = NULL, "
                              "lease_expires_at = NULL, attempts = attempts + 1 WHERE id = ANY(:ids) "
                              "AND lease_owner = 'bench#1#db'"), {"now": now, "ids": ids})
            done += len(ids)
    elapsed = time.perf_counter() - t
    assert done == n, (done, n)
    engine.dispose()
    return elapsed


def sweep_config(processes: int) -> DeadlinesConfig:
    """The benchmarked sweep's configuration: one webhook channel at concurrency 64 to the receiver
    on loopback, batches of 500, ``processes`` processes (left at its default when 1)."""
    return DeadlinesConfig(network={"allow": ["127.0.0.1/32"]},  # the receiver is on loopback
                           channels={"hook": WebhookChannel(type="webhook", max_concurrency=CONCURRENCY)},
                           delivery={"batch_size": 500, **({"processes": processes} if processes != 1 else {})})


def sweep_run(url: str, n: int, hook: str, box: dict | None = None, profiler=None, processes: int = 1) -> float:
    """Seconds for :func:`sweep` to deliver ``n`` due alerts with full bookkeeping; the lateness of
    each alert (sent - send_at, seconds) goes to ``box["late"]``."""
    engine = make_engine(url)
    cfg = sweep_config(processes)
    send_at = datetime.now(UTC)
    seed(engine, n, hook, send_at)
    # send_at = the moment the backlog is due; (sent - send_at) then includes the wait in the backlog.
    if profiler is not None:
        profiler.enable()
    t = time.perf_counter()
    out = sweep(engine, cfg, datetime.now(UTC), clock=utcnow)
    elapsed = time.perf_counter() - t
    if profiler is not None:
        profiler.disable()
    with engine.connect() as conn:
        delivered = conn.execute(select(text("count(*)")).select_from(alerts).where(alerts.c.status == "delivered")
                                 ).scalar_one()
    assert delivered == n == out.delivered, (delivered, n, out)
    assert getattr(out, "processes", 1) == processes, out
    engine.dispose()
    if box is not None:
        box["late"] = out.lateness_seconds
    return elapsed


def procrastinate_run(url: str, n: int, hook: str) -> float:
    """Procrastinate's recommended worker: ``run_worker_async`` with ``concurrency`` coroutines on one
    connector, draining (``wait=False``); jobs deferred in one ``batch_defer_async`` before timing."""
    import aiohttp
    import procrastinate

    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))
    state: dict = {}

    @app.task(name="post")
    async def post(i: int) -> None:
        async with state["session"].post(hook, data=BODY, headers={"Content-Type": "application/json"}) as r:
            await r.read()

    async def main() -> float:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            await post.batch_defer_async(*({"i": i} for i in range(n)))
            state["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY))
            t = time.perf_counter()
            await app.run_worker_async(concurrency=CONCURRENCY, wait=False, install_signal_handlers=False,
                                       listen_notify=False, delete_jobs="never")
            elapsed = time.perf_counter() - t
            await state["session"].close()
            return elapsed

    return asyncio.run(main())


def pgqueuer_run(url: str, n: int, hook: str) -> float:
    """pgqueuer as its documentation recommends: the asyncpg driver, one bulk ``enqueue``, then
    ``QueueManager.run`` in drain mode with ``batch_size=32`` and ``max_concurrent_tasks=64``; each
    job POSTs the same body with the same aiohttp client (connector limit 64) as the sweep."""
    import aiohttp
    import asyncpg
    from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver
    from pgqueuer.adapters.persistence.queries import Queries
    from pgqueuer.core.qm import QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)

    async def main() -> float:
        conn = await asyncpg.connect(dsn)
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        await queries.enqueue(["post"] * n, [BODY.encode()] * n, [0] * n)  # one bulk enqueue
        qm = QueueManager(queries)
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY))

        @qm.entrypoint("post")
        async def post(job) -> None:
            async with session.post(hook, data=job.payload, headers={"Content-Type": "application/json"}) as r:
                await r.read()

        t = time.perf_counter()
        await qm.run(mode=QueueExecutionMode.drain, batch_size=32, max_concurrent_tasks=CONCURRENCY,
                     dequeue_timeout=timedelta(seconds=0.2))
        elapsed = time.perf_counter() - t
        await session.close()
        await conn.close()
        return elapsed

    # pgqueuer's own runner (`pgq run`) runs its queue manager on uvloop when it is installed.
    return uvloop.run(main())


# --------------------------------------------------------------------------- where the time goes


PHASES = (("claim", "claim + load + close a dead holder's attempts (thread)"),
          ("attempt_rows", "attempt rows committed before the send (gate thread)"),
          ("render", "render + sign (notification_from_row, webhook body, HMAC)"),
          ("send", "send: aiohttp request/response and the event loop"),
          ("record", "record results (thread)"))


def phase_profile(url: str, n: int, hook: str) -> dict[str, float]:
    """CPU seconds per alert of each phase of a one-process sweep of ``n`` alerts, in microseconds.

    Measured with ``time.thread_time()`` around the sweep's own steps (claim, attempt rows and record
    run in threads; render on the event loop); ``send`` is the rest of the process's CPU time during
    the sweep (``getrusage``): the aiohttp client and the event loop that runs it. Database server
    time is not in these figures; ``pg_backend`` is the CPU of this database's server processes
    (:class:`_PgBackendCpu`; its sampling thread's own CPU is taken out of the process's).
    """
    import resource
    import threading

    from deadline_pipeline.deliver import sweep as sweep_mod
    from deadline_pipeline.deliver.channels import webhook

    acc = dict.fromkeys(("claim", "attempt_rows", "record", "render"), 0.0)
    lock = threading.Lock()
    patched = [(sweep_mod._Sweep, "_claim", "claim"), (sweep_mod._Sweep, "_start_attempts", "attempt_rows"),
               (sweep_mod._Sweep, "_record", "record"), (webhook.WebhookSender, "_prepare", "render"),
               (sweep_mod, "notification_from_row", "render")]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]

    def timed(fn, key):
        def wrapper(*a, **k):
            t = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                with lock:
                    acc[key] += time.thread_time() - t
        return wrapper

    for (owner, name, key), (_, _, fn) in zip(patched, originals, strict=True):
        setattr(owner, name, timed(fn, key))
    engine = make_engine(url)
    cfg = sweep_config(1)
    try:
        seed(engine, n, hook, datetime.now(UTC))
        pg = _PgBackendCpu(url)
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        out = sweep(engine, cfg, datetime.now(UTC), clock=utcnow)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        pg_seconds = pg.seconds
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
        engine.dispose()
    assert out.delivered == n, out
    total = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime) - pg.own_cpu
    us = {k: v / n * 1e6 for k, v in acc.items()}
    us["send"] = total / n * 1e6 - sum(us.values())
    us["total"] = total / n * 1e6
    us["pg_backend"] = pg_seconds / n * 1e6
    return us


class _PgBackendCpu:
    """CPU seconds of the PostgreSQL server processes serving one database (their process title names
    it), sampled from ``/proc`` every 20 ms in a thread, so that backends which end during the run
    are counted too (a backend first seen during the run counts from 0). Linux only: elsewhere
    :attr:`seconds` is ``nan``."""

    def __init__(self, url: str) -> None:
        import threading

        self.tag = f" {make_url(url).database} ".encode()
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.before = self._read()
        self.last: dict[str, float] = dict(self.before)
        self.stop = threading.Event()
        self.own_cpu = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _read(self) -> dict[str, float]:
        out = {}
        try:
            pids = [p for p in os.listdir("/proc") if p.isdigit()]
        except OSError:
            return out
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
                if not cmd.startswith(b"postgres: ") or self.tag not in cmd:
                    continue
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[pid] = (int(fields[11]) + int(fields[12])) / self.tick
            except (OSError, ValueError, IndexError):
                continue
        return out

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            self.last.update(self._read())
        self.own_cpu = time.thread_time()  # this thread's CPU, taken out of the sweep's figures

    @property
    def seconds(self) -> float:
        self.stop.set()
        self.thread.join()
        self.last.update(self._read())
        if not self.last:
            return float("nan")
        return sum(v - self.before.get(pid, 0.0) for pid, v in self.last.items())


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, int]:
    """The command line's options, checked, and ``n`` (jobs per contender per round)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pg", default=os.environ.get("DEADLINE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--n", type=int, default=20_000, help="jobs per contender per round (default 20,000)")
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS, help=f"rounds (at least {MIN_ROUNDS})")
    ap.add_argument("--quick", action="store_true", help="1,000 jobs, 3 rounds, under a minute; same shape")
    ap.add_argument("--skip-queues", action="store_true", help="skip Procrastinate and pgqueuer")
    ap.add_argument("--profile", metavar="FILE", help="cProfile the sweep's rounds into FILE (pstats)")
    ap.add_argument("--phases", action="store_true",
                    help="also profile a one-process sweep by phase (CPU per alert; one run per round)")
    ap.add_argument("--processes", type=int, default=os.cpu_count() or 1,
                    help="delivery.processes of the sweep (default: this machine's cores, %(default)s)")
    args = ap.parse_args(argv)
    if args.rounds < MIN_ROUNDS:
        ap.error(f"--rounds must be at least {MIN_ROUNDS}: a median needs three samples")
    if args.processes < 1 or args.n < 1:
        ap.error("--processes and --n must be at least 1")
    if args.quick and "--n" in (argv if argv is not None else sys.argv[1:]):
        ap.error("--quick sets n = 1,000; give either --quick or --n")
    return args, 1_000 if args.quick else args.n


def counted_run(pg: str, n: int, hook: str, counter, fn, *a) -> float:
    """Run one contender on a throwaway database; its rate, after checking the receiver saw n."""
    before = counter.value
    with throwaway_db(pg, fn.__name__[:12]) as url:
        if fn in (db_only, sweep_run):
            upgrade(make_engine(url))
        secs = fn(url, n, hook, *a)
    if fn is not db_only:
        seen = counter.value - before
        if seen != n:
            raise AssertionError(f"the receiver saw {seen} requests for {n} jobs")
    return n / secs


def contenders_for(args: argparse.Namespace, n: int, hook: str, counter, profiler,
                   lateness: tuple[list[float], list[float]]) -> dict:
    """The contenders of the rounds, by name, each a function returning its rate; the sweep's adds its
    lateness p50 and p99 to ``lateness``."""
    def counted(fn, *a) -> float:
        return counted_run(args.pg, n, hook, counter, fn, *a)

    def aiohttp_ceiling() -> float:
        before = counter.value
        secs = uvloop.run(_aiohttp_posts(hook, n))  # the sweep's loop (delivery.event_loop default)
        assert counter.value - before == n
        return n / secs

    def the_sweep() -> float:
        box: dict = {}
        rate = counted(sweep_run, box, profiler, args.processes)
        lateness[0].append(statistics.median(box["late"]))
        lateness[1].append(pct(box["late"], 0.99))
        return rate

    contenders = {"aiohttp_ceiling": aiohttp_ceiling, "sweep": the_sweep}
    if args.processes > 1:
        # The same sweep in one process, for comparison: what the extra processes add.
        contenders["sweep_one_process"] = lambda: counted(sweep_run, None, None, 1)
    if not args.skip_queues:
        contenders["pgqueuer"] = lambda: counted(pgqueuer_run)
        contenders["procrastinate"] = lambda: counted(procrastinate_run)
    contenders["db_only"] = lambda: counted(db_only)
    return contenders


def phase_figures(pg: str, n: int, hook: str, rounds: int) -> dict[str, float]:
    """Median over ``rounds`` runs of a one-process sweep's CPU per alert by phase."""
    samples = []
    for _ in range(rounds):
        with throwaway_db(pg, "phases") as url:
            upgrade(make_engine(url))
            samples.append(phase_profile(url, n, hook))
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def print_phases(phases: dict[str, float], rounds: int) -> None:
    print(f"\nWhere a one-process sweep's CPU goes (microseconds per alert, median of {rounds} runs):")
    print("| phase | CPU per alert | share |\n| --- | ---: | ---: |")
    for key, label in PHASES:
        print(f"| {label} | {phases[key]:.0f} us | {phases[key] / phases['total']:.0%} |")
    print(f"| all of the sweep process | {phases['total']:.0f} us | 100% |")
    print(f"| PostgreSQL server processes of this database | {phases['pg_backend']:.0f} us | |")


def report(args: argparse.Namespace, n: int, figs: dict, phases: dict[str, float],
           lateness: tuple[list[float], list[float]]) -> int:
    """Print the table, the lateness, the phases, the goals, the summary line and the JSON line; the
    exit status (1 when a contender has no sample)."""
    lateness_p50, lateness_p99 = lateness
    labels = {"aiohttp_ceiling": "raw aiohttp client ceiling, conc 64 (no database)",
              "sweep": f"sweep: claim -> attempt rows -> render/sign -> send -> record, {args.processes} process(es)",
              "sweep_one_process": "the same sweep in one process (delivery.processes: 1)",
              "pgqueuer": "pgqueuer (asyncpg, batch 32, 64 tasks, drain)",
              "procrastinate": "Procrastinate worker (concurrency 64, drain)",
              "db_only": "database only: claim 500 + mark delivered, no send"}
    print(f"\nn = {n:,} jobs per contender per round, {args.rounds} rounds, interleaved")
    print(table(figs, labels=labels))
    p99 = statistics.median(lateness_p99) if lateness_p99 else float("nan")
    p50 = statistics.median(lateness_p50) if lateness_p50 else float("nan")
    lo, hi = min(lateness_p99, default=float("nan")), max(lateness_p99, default=float("nan"))
    print(f"sweep lateness (sent - send_at): p50 median {p50:.2f} s, p99 median {p99:.2f} s (p99 min-max "
          f"{lo:.2f}-{hi:.2f} s)")
    if phases:
        print_phases(phases, args.rounds)
    goals = [("sweep / pgqueuer", ratio(figs, "sweep", "pgqueuer"), ">=", 1.5),
             ("sweep / procrastinate", ratio(figs, "sweep", "procrastinate"), ">=", 10),
             ("sweep / aiohttp ceiling", ratio(figs, "sweep", "aiohttp_ceiling"), ">=", 0.75)]
    for g in goals:
        print(goal_line(*g))
    measured = [g for g in goals if g[1] == g[1]]
    met = sum(1 for _, v, op, tgt in measured if v >= tgt)
    print(f"SUMMARY n={n}: sweep {figs['sweep'].median:,.0f}/s median = {goals[2][1]:.0%} of the same-run aiohttp "
          f"ceiling, {goals[0][1]:.2f}x pgqueuer, {goals[1][1]:.1f}x Procrastinate "
          f"({met} of {len(measured)} measured goals met); lateness p99 {p99:.2f} s")
    extra = {"sweep_lateness_p99_s": round(p99, 3), "n": n, "rounds": args.rounds, "processes": args.processes}
    if phases:
        extra["phases_us_per_alert"] = {k: round(v, 1) for k, v in phases.items()}
    print(json_line(figs, extra=extra))
    missing = [name for name, f in figs.items() if not f.samples]
    if missing:
        # A contender that failed every round leaves its goal unmeasured: that is a failed run.
        print(f"FAILED: no sample for {', '.join(missing)} (see the errors above)", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args, n = parse_args(argv)
    ctx = multiprocessing.get_context("spawn")
    port_queue, counter = ctx.Queue(), ctx.Value("q", 0, lock=False)
    receiver = ctx.Process(target=_receiver_main, args=(port_queue, counter), daemon=True)
    receiver.start()
    hook = f"http://127.0.0.1:{port_queue.get(timeout=30)}/hook"
    lateness: tuple[list[float], list[float]] = ([], [])  # the sweep's p50 and p99 per round
    profiler = cProfile.Profile() if args.profile else None
    contenders = contenders_for(args, n, hook, counter, profiler, lateness)
    try:
        figs = run_rounds(contenders, rounds=args.rounds)
        phases = phase_figures(args.pg, n, hook, args.rounds) if args.phases else {}
    finally:
        receiver.terminate()
        receiver.join(5)
    if profiler is not None:
        profiler.dump_stats(args.profile)
    return report(args, n, figs, phases, lateness)


if __name__ == "__main__":
    sys.exit(main())
