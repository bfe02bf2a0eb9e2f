"""Delivery throughput on PostgreSQL with a webhook receiver on loopback, contenders in rounds.

    python benchmarks/deliver.py [--pg URL] [--n 20000] [--rounds 3] [--quick] [--processes N | 1,2,4]
                                 [--phases] [--profile FILE]

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
(sent - send_at, whose ``send_at`` is the moment the backlog was seeded), the CPU table (CPU
seconds per 1,000 delivered alerts of each contender's processes plus the PostgreSQL backends of
its database, the receiver shown apart; :class:`Meter`, ``benchmarks/cpu_cost.py``) with the
irreducible cost (the raw client's CPU per request + db_only's per alert), the sweep by process
count (``--processes 1,2,4``), each goal as a ratio of same-run medians (sweep CPU per alert <=
1.25x the irreducible and <= 0.67x pgqueuer's; throughput >= 1.5x pgqueuer, >= 10x Procrastinate,
>= 0.75x the aiohttp ceiling), a one-line summary, and as the very last line one line of JSON with
each contender's median rate and CPU.
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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cpu_cost  # noqa: E402
import uvloop  # noqa: E402
from rounds import MIN_ROUNDS, Figure, goal_line, json_line, ratio, run_rounds, table  # noqa: E402
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


# --------------------------------------------------------------------------- CPU cost (benchmarks/cpu_cost.py)


@dataclass(frozen=True)
class Cost:
    """One contender's timed window: wall seconds and CPU seconds, split by who spent them.

    ``client``: the benchmark process and its descendants (the sweep's forkserver and worker
    processes), the receiver's subtree and the backend sampler's thread taken out; ``pg``: the
    PostgreSQL backends of the contender's database; ``receiver``: the webhook receiver (not part of
    any contender's cost; shown to see where the machine's CPU went); ``busy``: the share of all
    cores busy during the window, whoever used them (other users of this machine included)."""

    seconds: float
    client: float
    pg: float
    receiver: float
    lock_share: float
    busy: float
    ended: int = 0  # backends that ended inside the window (each may lose up to 25 ms of its CPU)

    @property
    def total(self) -> float:
        return self.client + self.pg


class Meter:
    """Measures the CPU of the timed part of each contender (:func:`timed`), kept in :attr:`last`."""

    def __init__(self, admin_url: str, receiver_pid: int) -> None:
        self.conninfo = make_url(normalise_url(admin_url)).set(drivername="postgresql").render_as_string(
            hide_password=False)
        self.receiver_pid = receiver_pid
        self.last: Cost | None = None

    def _backends(self, database: str):
        import psycopg

        conn = psycopg.connect(self.conninfo, autocommit=True)  # on the admin database: not counted

        def list_backends() -> list[tuple[int, bool, bool]]:
            return conn.execute("SELECT pid, state = 'active', coalesce(wait_event_type IN ('Lock', 'LWLock'), false) "
                                "FROM pg_stat_activity WHERE datname = %s", (database,)).fetchall()
        return conn, list_backends

    @contextmanager
    def window(self, url: str | None):
        conn, backends = self._backends(make_url(url).database) if url else (None, None)
        exclude = (self.receiver_pid,)
        busy0, all0 = cpu_cost.machine_busy()
        recv0 = cpu_cost.process_seconds(self.receiver_pid)
        pg = cpu_cost.BackendCpu(backends) if backends else None
        client0 = cpu_cost.tree_seconds(exclude=exclude)
        t = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - t
            client1 = cpu_cost.tree_seconds(exclude=exclude)
            if pg is not None:
                pg.stop()
            busy1, all1 = cpu_cost.machine_busy()
            self.last = Cost(seconds=elapsed, client=client1 - client0 - (pg.own_cpu if pg else 0.0),
                             pg=pg.seconds if pg else 0.0,
                             receiver=cpu_cost.process_seconds(self.receiver_pid) - recv0,
                             lock_share=pg.lock_share if pg else float("nan"),
                             busy=(busy1 - busy0) / max(1, all1 - all0), ended=pg.ended if pg else 0)
            if conn is not None:
                conn.close()


_METER: Meter | None = None


@contextmanager
def timed(url: str | None, box: list):
    """Appends the block's wall seconds to ``box`` and,, when a :class:`Meter` is set, measures its CPU."""
    if _METER is None:
        t = time.perf_counter()
        yield
        box.append(time.perf_counter() - t)
    else:
        with _METER.window(url):
            yield
        box.append(_METER.last.seconds)


# --------------------------------------------------------------------------- measurements


async def _aiohttp_posts(url: str, n: int) -> float:
    import aiohttp

    sem = asyncio.Semaphore(CONCURRENCY)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY)) as session:
        async def one():
            async with sem, session.post(url, data=BODY, headers={"Content-Type": "application/json"}) as r:
                await r.read()

        box: list[float] = []
        with timed(None, box):
            await asyncio.gather(*(one() for _ in range(n)))
        return box[0]


def db_only(url: str, n: int, hook: str) -> float:
    engine = make_engine(url)
    now = datetime.now(UTC)
    seed(engine, n, hook, now)
    done, box = 0, []
    with timed(url, box):
        while True:
            with engine.begin() as conn:
                ids = dsql.claim_batch(conn, owner="bench#1#db", now=now, lease_seconds=300, limit=500)
                if not ids:
                    break
                conn.execute(text("UPDATE alerts SET status = 'delivered', delivered_at = :now, lease_owner = NULL, "
                                  "lease_expires_at = NULL, attempts = attempts + 1 WHERE id = ANY(:ids) "
                                  "AND lease_owner = 'bench#1#db'"), {"now": now, "ids": ids})
                done += len(ids)
    assert done == n, (done, n)
    engine.dispose()
    return box[0]


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
    secs: list[float] = []
    with timed(url, secs):
        out = sweep(engine, cfg, datetime.now(UTC), clock=utcnow)
    elapsed = secs[0]
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
            box: list[float] = []
            with timed(url, box):
                await app.run_worker_async(concurrency=CONCURRENCY, wait=False, install_signal_handlers=False,
                                           listen_notify=False, delete_jobs="never")
            await state["session"].close()
            return box[0]

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

        box: list[float] = []
        with timed(url, box):
            await qm.run(mode=QueueExecutionMode.drain, batch_size=32, max_concurrent_tasks=CONCURRENCY,
                         dequeue_timeout=timedelta(seconds=0.2))
        await session.close()
        await conn.close()
        return box[0]

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
    the sweep (:class:`Meter`, from ``/proc``): the aiohttp client and the event loop that runs it.
    Database server time is not in these figures; ``pg_backend`` is the CPU of this database's
    backends (:class:`cpu_cost.BackendCpu`; its sampling thread's own CPU is taken out of the
    process's). Needs the :class:`Meter` that :func:`main` sets.
    """
    import threading

    from deadline_pipeline.deliver import sweep as sweep_mod
    from deadline_pipeline.deliver.channels import webhook

    acc = dict.fromkeys(("claim", "attempt_rows", "record", "render"), 0.0)
    lock = threading.Lock()
    patched = [(sweep_mod.Sweep, "_claim", "claim"), (sweep_mod.Sweep, "start_attempts", "attempt_rows"),
               (sweep_mod.Sweep, "_record", "record"), (webhook.WebhookSender, "_prepare", "render"),
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
        with _METER.window(url):
            out = sweep(engine, cfg, datetime.now(UTC), clock=utcnow)
        cost = _METER.last
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
        engine.dispose()
    assert out.delivered == n, out
    us = {k: v / n * 1e6 for k, v in acc.items()}
    us["send"] = cost.client / n * 1e6 - sum(us.values())
    us["total"] = cost.client / n * 1e6
    us["pg_backend"] = cost.pg / n * 1e6
    return us


# --------------------------------------------------------------------------- main


def parse_processes(value: str) -> list[int]:
    """``--processes``: one count (``2``) or a series (``1,2,4``), each at least 1, no repeats."""
    try:
        counts = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count or a list of counts: {value!r}") from None
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"counts must be at least 1 and distinct: {value!r}")
    return counts


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, int]:
    """The command line's options, checked, and ``n`` (jobs per contender per round).

    ``args.processes`` is the sweep's process count the goals use (the machine's cores when the
    series names them, else the series' first); ``args.series`` every count of ``--processes``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pg", default=os.environ.get("DEADLINE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--n", type=int, default=20_000, help="jobs per contender per round (default 20,000)")
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS, help=f"rounds (at least {MIN_ROUNDS})")
    ap.add_argument("--quick", action="store_true", help="1,000 jobs, 3 rounds, under a minute; same shape")
    ap.add_argument("--skip-queues", action="store_true", help="skip Procrastinate and pgqueuer")
    ap.add_argument("--profile", metavar="FILE", help="cProfile the sweep's rounds into FILE (pstats)")
    ap.add_argument("--phases", action="store_true",
                    help="also profile a one-process sweep by phase (CPU per alert; one run per round)")
    cores = os.cpu_count() or 1
    ap.add_argument("--processes", type=parse_processes, default=[cores],
                    help="delivery.processes of the sweep, or a series (1,2,4) swept in the same rounds "
                         f"(default: this machine's cores, {cores})")
    args = ap.parse_args(argv)
    if args.rounds < MIN_ROUNDS:
        ap.error(f"--rounds must be at least {MIN_ROUNDS}: a median needs three samples")
    if args.n < 1:
        ap.error("--n must be at least 1")
    if args.quick and "--n" in (argv if argv is not None else sys.argv[1:]):
        ap.error("--quick sets n = 1,000; give either --quick or --n")
    args.series = args.processes if len(args.processes) > 1 else sorted({1, *args.processes})
    args.processes = cores if cores in args.processes else args.processes[0]
    return args, 1_000 if args.quick else args.n


def sweep_name(processes: int, main_processes: int) -> str:
    """The contender name of the sweep with ``processes`` processes."""
    if processes == main_processes:
        return "sweep"
    return "sweep_one_process" if processes == 1 else f"sweep_{processes}_processes"


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


def with_cost(fn, costs: list):
    """``fn`` (a contender) that also appends its round's :class:`Cost` to ``costs``."""
    def run() -> float:
        if _METER is not None:
            _METER.last = None
        rate = fn()
        if _METER is not None and _METER.last is not None:
            costs.append(_METER.last)
        return rate
    return run


def contenders_for(args: argparse.Namespace, n: int, hook: str, counter, profiler,
                   lateness: tuple[list[float], list[float]], costs: dict[str, list[Cost]]) -> dict:
    """The contenders of the rounds, by name, each a function returning its rate; the sweep's adds its
    lateness p50 and p99 to ``lateness``, every one its CPU cost per round to ``costs[name]``."""
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
    for p in args.series:
        if p != args.processes:  # the same sweep with another process count: what processes add
            contenders[sweep_name(p, args.processes)] = lambda p=p: counted(sweep_run, None, None, p)
    if not args.skip_queues:
        contenders["pgqueuer"] = lambda: counted(pgqueuer_run)
        contenders["procrastinate"] = lambda: counted(procrastinate_run)
    contenders["db_only"] = lambda: counted(db_only)
    return {name: with_cost(fn, costs.setdefault(name, [])) for name, fn in contenders.items()}


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


def per_1000(costs: list[Cost], n: int, part: str = "total") -> Figure:
    """CPU seconds per 1,000 alerts of one part of a contender's :class:`Cost` over its rounds."""
    return Figure(part, tuple(getattr(c, part) / n * 1000 for c in costs))


def irreducible(costs: dict[str, list[Cost]], n: int) -> Figure:
    """Per round: the raw client's CPU per request plus db_only's CPU (its process and backends) per
    claimed-and-recorded alert, per 1,000 alerts; rounds where either failed are left out."""
    return Figure("irreducible", tuple((a.total + b.total) / n * 1000 for a, b in
                                       zip(costs.get("aiohttp_ceiling", []), costs.get("db_only", []), strict=False)))


def fig_cell(f: Figure, digits: int = 3) -> str:
    if not f.samples:
        return "-"
    return f"{f.median:.{digits}f} ({f.low:.{digits}f}-{f.high:.{digits}f})"


def share(costs: list[Cost], key) -> str:
    values = [v for v in (key(c) for c in costs) if v == v]
    return f"{statistics.median(values):.0%}" if values else "-"


def print_costs(costs: dict[str, list[Cost]], n: int, labels: dict[str, str]) -> Figure:
    """The CPU table (seconds per 1,000 alerts, median and min-max); returns the irreducible cost."""
    print("\nCPU seconds per 1,000 delivered alerts (= ms per alert), median (min-max) of the rounds; counted: "
          "the contender's processes + the PostgreSQL backends of its database; the receiver is not counted:")
    print("| contender | counted CPU | its processes | PostgreSQL backends | receiver (not counted) "
          "| backends waiting on locks | backends ended in the window (most in a round) | all cores busy |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, cs in costs.items():
        print(f"| {labels.get(name, name)} | {fig_cell(per_1000(cs, n))} | {fig_cell(per_1000(cs, n, 'client'))} "
              f"| {fig_cell(per_1000(cs, n, 'pg'))} | {fig_cell(per_1000(cs, n, 'receiver'))} "
              f"| {share(cs, lambda c: c.lock_share)} | {max((c.ended for c in cs), default=0)} "
              f"| {share(cs, lambda c: c.busy)} |")
    irr = irreducible(costs, n)
    print(f"| irreducible: raw client per request + db_only per alert | {fig_cell(irr)} | | | | | | |")
    return irr


def print_series(args: argparse.Namespace, n: int, figs: dict[str, Figure], costs: dict[str, list[Cost]]) -> dict:
    """The sweep at each process count of the series: throughput, and whose CPU each alert costs."""
    cores = os.cpu_count() or 1
    print(f"\nThe sweep by process count (same rounds; CPU s per 1,000 alerts; {cores} cores on this machine):")
    print("| processes | throughput | per process | sweep processes | PostgreSQL backends | receiver "
          "| backends waiting on locks | cores used by these three | all cores busy |\n"
          "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    out = {}
    for p in args.series:
        name = sweep_name(p, args.processes)
        f, cs = figs.get(name), costs.get(name, [])
        if f is None or not f.samples:
            continue
        used = share(cs, lambda c: (c.client + c.pg + c.receiver) / (c.seconds * cores))
        parts = {k: per_1000(cs, n, k) for k in ("client", "pg", "receiver")}
        print(f"| {p} | {f.median:,.0f}/s ({f.low:,.0f}-{f.high:,.0f}) | {f.median / p:,.0f}/s "
              f"| {fig_cell(parts['client'])} | {fig_cell(parts['pg'])} | {fig_cell(parts['receiver'])} "
              f"| {share(cs, lambda c: c.lock_share)} | {used} | {share(cs, lambda c: c.busy)} |")
        out[str(p)] = {"per_s": round(f.median, 1), **{f"{k}_cpu_s_per_1000": round(v.median, 4)
                                                     for k, v in parts.items()}}
    return out


def print_lateness(lateness: tuple[list[float], list[float]], figs: dict[str, Figure], n: int) -> float:
    """The sweep's lateness, and its p99 against the time the backlog takes to drain; the p99."""
    lateness_p50, lateness_p99 = lateness
    p99 = statistics.median(lateness_p99) if lateness_p99 else float("nan")
    p50 = statistics.median(lateness_p50) if lateness_p50 else float("nan")
    lo, hi = min(lateness_p99, default=float("nan")), max(lateness_p99, default=float("nan"))
    print(f"sweep lateness (sent - send_at): p50 median {p50:.2f} s, p99 median {p99:.2f} s (p99 min-max "
          f"{lo:.2f}-{hi:.2f} s)")
    drain = n / figs["sweep"].median if figs["sweep"].samples else float("nan")
    print(f"sweep lateness p99 / backlog drain time (n / sweep rate, {drain:.2f} s) = {p99 / drain:.2f}x "
          "(no target set: the whole backlog is due at once, so about 1x is its floor)")
    return p99


def cost_ratio(costs: dict[str, list[Cost]], n: int, num: str, den: str | Figure) -> float:
    a = per_1000(costs.get(num, []), n)
    b = den if isinstance(den, Figure) else per_1000(costs.get(den, []), n)
    return ratio({"a": a, "b": b}, "a", "b")


def goals_for(figs: dict[str, Figure], costs: dict[str, list[Cost]], n: int, irr: Figure) -> list[tuple]:
    return [("sweep CPU per alert / irreducible", cost_ratio(costs, n, "sweep", irr), "<=", 1.25),
            ("sweep CPU per alert / pgqueuer's", cost_ratio(costs, n, "sweep", "pgqueuer"), "<=", 0.67),
            ("sweep / pgqueuer", ratio(figs, "sweep", "pgqueuer"), ">=", 1.5),
            ("sweep / procrastinate", ratio(figs, "sweep", "procrastinate"), ">=", 10),
            ("sweep / aiohttp ceiling", ratio(figs, "sweep", "aiohttp_ceiling"), ">=", 0.75)]


def is_met(value: float, op: str, target: float) -> bool:
    return value >= target if op == ">=" else value <= target


LABELS = {"aiohttp_ceiling": "raw aiohttp client ceiling, conc 64 (no database)",
          "sweep_one_process": "the same sweep in one process (delivery.processes: 1)",
          "pgqueuer": "pgqueuer (asyncpg, batch 32, 64 tasks, drain)",
          "procrastinate": "Procrastinate worker (concurrency 64, drain)",
          "db_only": "database only: claim 500 + mark delivered, no send"}


def report(args: argparse.Namespace, n: int, figs: dict, phases: dict[str, float],
           lateness: tuple[list[float], list[float]], costs: dict[str, list[Cost]]) -> int:
    """Print the tables, the lateness, the phases, the goals, the summary line and the JSON line; the
    exit status (1 when a contender has no sample)."""
    labels = {**LABELS, "sweep": f"sweep: claim -> attempt rows -> render/sign -> send -> record, "
                                 f"{args.processes} process(es)"}
    labels.update({sweep_name(p, args.processes): f"the same sweep, {p} processes"
                   for p in args.series if p not in (1, args.processes)})
    print(f"\nn = {n:,} jobs per contender per round, {args.rounds} rounds, interleaved")
    print(table(figs, labels=labels))
    p99 = print_lateness(lateness, figs, n)
    irr = print_costs(costs, n, labels)
    series = print_series(args, n, figs, costs)
    if phases:
        print_phases(phases, args.rounds)
    goals = goals_for(figs, costs, n, irr)
    for g in goals:
        print(goal_line(*g))
    measured = [g for g in goals if g[1] == g[1]]
    met = sum(1 for _, v, op, tgt in measured if is_met(v, op, tgt))
    sweep_cpu = per_1000(costs.get("sweep", []), n).median
    print(f"SUMMARY n={n}: sweep {figs['sweep'].median:,.0f}/s median = {goals[4][1]:.0%} of the same-run aiohttp "
          f"ceiling, {goals[2][1]:.2f}x pgqueuer, {goals[3][1]:.1f}x Procrastinate; CPU {sweep_cpu:.3f} s per "
          f"1,000 alerts = {goals[0][1]:.2f}x irreducible, {goals[1][1]:.2f}x pgqueuer's "
          f"({met} of {len(measured)} measured goals met); lateness p99 {p99:.2f} s")
    extra = {"sweep_lateness_p99_s": round(p99, 3), "n": n, "rounds": args.rounds, "processes": args.processes,
             "cpu_s_per_1000": {k: round(per_1000(c, n).median, 4) for k, c in costs.items() if c},
             "irreducible_cpu_s_per_1000": round(irr.median, 4) if irr.samples else None,
             "goal_ratios": {g[0]: round(g[1], 3) if g[1] == g[1] else None for g in goals},
             "process_series": series}
    if phases:
        extra["phases_us_per_alert"] = {k: round(v, 1) for k, v in phases.items()}
    print(json_line(figs, extra=extra))
    missing = [name for name, f in figs.items() if not f.samples]
    if missing:
        # A contender that failed every round leaves its goal unmeasured: that is a failed run.
        print(f"FAILED: no sample for {', '.join(missing)} (see the errors above)", file=sys.stderr)
        return 1
    return 0


def warm_forkserver(series: list[int], pg: str) -> None:
    """Start the forkserver the sweep's worker processes fork from, with what the sweep preloads in
    it (the sweep and the database driver of ``pg``), before the rounds: its start (about a second
    of CPU importing the sweep) is paid once per host process, not per delivery, and would otherwise
    land in the first multi-process round's cost."""
    if max(series) < 2 or "forkserver" not in multiprocessing.get_all_start_methods():
        return
    from multiprocessing import forkserver

    from deadline_pipeline.deliver import sweep as sweep_mod
    from deadline_pipeline.deliver.workers import forkserver_preload

    engine = make_engine(pg)  # for its dialect and driver; it does not connect
    multiprocessing.get_context("forkserver").set_forkserver_preload(
        forkserver_preload(sweep_mod._sweep_in_worker, engine))
    engine.dispose()
    forkserver.ensure_running()


def main(argv: list[str] | None = None) -> int:
    global _METER
    args, n = parse_args(argv)
    ctx = multiprocessing.get_context("spawn")
    port_queue, counter = ctx.Queue(), ctx.Value("q", 0, lock=False)
    receiver = ctx.Process(target=_receiver_main, args=(port_queue, counter), daemon=True)
    receiver.start()
    hook = f"http://127.0.0.1:{port_queue.get(timeout=30)}/hook"
    _METER = Meter(args.pg, receiver.pid)
    warm_forkserver(args.series, args.pg)
    lateness: tuple[list[float], list[float]] = ([], [])  # the sweep's p50 and p99 per round
    costs: dict[str, list[Cost]] = {}
    profiler = cProfile.Profile() if args.profile else None
    contenders = contenders_for(args, n, hook, counter, profiler, lateness, costs)
    try:
        figs = run_rounds(contenders, rounds=args.rounds)
        phases = phase_figures(args.pg, n, hook, args.rounds) if args.phases else {}
    finally:
        receiver.terminate()
        receiver.join(5)
    if profiler is not None:
        profiler.dump_stats(args.profile)
    return report(args, n, figs, phases, lateness, costs)


if __name__ == "__main__":
    sys.exit(main())
