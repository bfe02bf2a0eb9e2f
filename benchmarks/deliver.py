"""Delivery throughput on PostgreSQL with a webhook receiver on loopback.

    python benchmarks/deliver.py [--pg URL] [--n 20000] [--quick]

``--pg`` defaults to ``$DEADLINE_TEST_PG_URL`` or ``postgresql://postgres@127.0.0.1:5432/postgres``;
every measurement gets a throwaway database, dropped at the end. The receiver is a bare asyncio
HTTP/1.1 server in a separate process (it answers ``200 {}`` and counts requests), so the client
side is what is measured. In one run:

1. the raw HTTP client ceilings (aiohttp and one httpx client, concurrency 64, no database);
2. the database-only ceiling: claim 500 with ``FOR UPDATE SKIP LOCKED`` + mark delivered, no send;
3. the sweep (``deadline_pipeline.deliver.sweep.sweep``): claim → attempt rows → send (aiohttp,
   concurrency 64) → record; alerts/s and p50/p99 of (sent − send_at) in seconds;
4. the same jobs through Procrastinate and through pgqueuer, each task POSTing the same body with
   the same aiohttp client at the same concurrency.

``--quick`` runs the same figures at 3,000 jobs (1,000 for the two job-queue workers; under a
minute). The last line is a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime

from sqlalchemy import create_engine, insert, select, text
from sqlalchemy.engine import make_url

from deadline_pipeline.config import DeadlinesConfig, WebhookChannel
from deadline_pipeline.deliver.sweep import sweep
from deadline_pipeline.store import delivery as dsql
from deadline_pipeline.store.db import make_engine, normalise_url, upgrade
from deadline_pipeline.store.schema import alerts, obligations, sources, subscribers

CONCURRENCY = 64
BODY = json.dumps({"id": "x" * 64, "kind": "reminder", "title": "A deadline", "due_at": "2027-01-01T00:00:00Z"})


# --------------------------------------------------------------------------- receiver (own process)


def _receiver_main(port_queue, counter) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                if length:
                    await reader.readexactly(length)
                with counter.get_lock():
                    counter.value += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        port_queue.put(server.sockets[0].getsockname()[1])
        async with server:
            await server.serve_forever()

    asyncio.run(main())


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


async def _httpx_posts(url: str, n: int) -> float:
    import httpx

    sem = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=CONCURRENCY)) as client:
        async def one():
            async with sem:
                (await client.post(url, content=BODY, headers={"Content-Type": "application/json"})).read()

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


def sweep_run(url: str, n: int, hook: str) -> tuple[float, list[float], int]:
    engine = make_engine(url)
    cfg = DeadlinesConfig(network={"allow": ["127.0.0.1/32"]},  # the receiver is on loopback
                          channels={"hook": WebhookChannel(type="webhook", max_concurrency=CONCURRENCY)},
                          delivery={"batch_size": 500})
    send_at = datetime.now(UTC)
    seed(engine, n, hook, send_at)
    # send_at = the moment the backlog is due; (sent - send_at) then includes the wait in the backlog.
    t = time.perf_counter()
    out = sweep(engine, cfg, datetime.now(UTC), clock=lambda: datetime.now(UTC))
    elapsed = time.perf_counter() - t
    with engine.connect() as conn:
        delivered = conn.execute(select(text("count(*)")).select_from(alerts).where(alerts.c.status == "delivered")
                                 ).scalar_one()
    assert delivered == n == out.delivered, (delivered, n, out)
    engine.dispose()
    return elapsed, out.lateness_seconds, out.batches


def procrastinate_run(url: str, n: int, hook: str) -> float:
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
            for start in range(0, n, 5000):
                await post.batch_defer_async(*({"i": i} for i in range(start, min(n, start + 5000))))
            state["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY))
            t = time.perf_counter()
            await app.run_worker_async(concurrency=CONCURRENCY, wait=False, install_signal_handlers=False,
                                       listen_notify=False, delete_jobs="never")
            elapsed = time.perf_counter() - t
            await state["session"].close()
            return elapsed

    return asyncio.run(main())


def pgqueuer_run(url: str, n: int, hook: str) -> float:
    import aiohttp
    import psycopg
    from pgqueuer.adapters.drivers.psycopg import PsycopgDriver
    from pgqueuer.adapters.persistence.queries import Queries
    from pgqueuer.core.qm import QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)

    async def main() -> float:
        conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        queries = Queries(PsycopgDriver(conn))
        await queries.install()
        for start in range(0, n, 5000):
            m = min(n, start + 5000) - start
            await queries.enqueue(["post"] * m, [BODY.encode()] * m, [0] * m, [None] * m, [None] * m, [None] * m)
        qm = QueueManager(queries)
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY))

        @qm.entrypoint("post")
        async def post(job) -> None:
            async with session.post(hook, data=job.payload, headers={"Content-Type": "application/json"}) as r:
                await r.read()

        t = time.perf_counter()
        # Concurrency is bounded by the shared aiohttp connector (64), as in the sweep.
        await qm.run(mode=QueueExecutionMode.drain, batch_size=CONCURRENCY,
                     dequeue_timeout=__import__("datetime").timedelta(seconds=0.2))
        elapsed = time.perf_counter() - t
        await session.close()
        await conn.close()
        return elapsed

    return asyncio.run(main())


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pg", default=os.environ.get("DEADLINE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--quick", action="store_true", help="3,000 jobs, under a minute")
    ap.add_argument("--skip-queues", action="store_true", help="skip Procrastinate and pgqueuer")
    args = ap.parse_args(argv)
    n = 3_000 if args.quick else args.n
    # The job-queue workers run at ~100 jobs/s here: --quick gives them fewer jobs to stay under a minute.
    n_queue = 1_000 if args.quick else n

    ctx = multiprocessing.get_context("spawn")
    port_queue, counter = ctx.Queue(), ctx.Value("q", 0)
    receiver = ctx.Process(target=_receiver_main, args=(port_queue, counter), daemon=True)
    receiver.start()
    hook = f"http://127.0.0.1:{port_queue.get(timeout=30)}/hook"
    rows: list[tuple[str, str]] = []

    def rate(label: str, count: int, seconds: float, extra: str = "") -> float:
        r = count / seconds
        rows.append((label, f"{r:8.0f} /s  ({count} in {seconds:.2f} s){extra}"))
        print(f"{label:<44} {rows[-1][1]}", flush=True)
        return r

    try:
        raw_aiohttp = rate("raw client ceiling: aiohttp, conc 64", n, asyncio.run(_aiohttp_posts(hook, n)))
        m = min(n, 2_000)
        rate("raw client ceiling: httpx (1 client), conc 64", m, asyncio.run(_httpx_posts(hook, m)))
        with throwaway_db(args.pg, "db") as url:
            upgrade(make_engine(url))
            db_rate = rate("database only: claim 500 + mark delivered", n, db_only(url, n, hook))
        with throwaway_db(args.pg, "sweep") as url:
            upgrade(make_engine(url))
            before = counter.value
            elapsed, late, batches = sweep_run(url, n, hook)
            assert counter.value - before == n, "the receiver saw exactly one request per alert"
            sweep_rate = rate("sweep: claimed -> sent -> recorded", n, elapsed,
                              f"; sent - send_at p50 {statistics.median(late):.2f} s, p99 {pct(late, 0.99):.2f} s,"
                              f" {batches} batches")
        queue_rates: dict[str, float | str] = {}
        if not args.skip_queues:
            for name, fn in (("procrastinate", procrastinate_run), ("pgqueuer", pgqueuer_run)):
                try:
                    with throwaway_db(args.pg, name) as url:
                        before = counter.value
                        secs = fn(url, n_queue, hook)
                        seen = counter.value - before
                        queue_rates[name] = rate(f"{name} worker, aiohttp task, conc 64", n_queue, secs,
                                                 f"; receiver saw {seen}")
                except Exception as exc:  # report honestly, keep the other figures
                    queue_rates[name] = f"failed: {type(exc).__name__}: {exc}"
                    print(f"{name}: FAILED: {type(exc).__name__}: {exc}", flush=True)
    finally:
        receiver.terminate()
        receiver.join(5)

    def vs(name: str) -> str:
        v = queue_rates.get(name)
        return f"{sweep_rate / v:.1f}x {name}" if isinstance(v, float) else f"{name} n/a"

    print(f"SUMMARY n={n}: sweep {sweep_rate:.0f} alerts/s with full bookkeeping (goal 2000; db-only ceiling "
          f"{db_rate:.0f}/s, aiohttp ceiling {raw_aiohttp:.0f}/s; {vs('procrastinate')}, {vs('pgqueuer')}); "
          f"p50/p99 sent-send_at {statistics.median(late):.2f}/{pct(late, 0.99):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
